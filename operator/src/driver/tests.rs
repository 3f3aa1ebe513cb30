use super::*;
use murmur_core::api::{Progress, TopologyKind, parse_manifest};
use murmur_core::contract::JoinReport;

use crate::driver::memory::TOPOLOGY_KEY;

const MANIFEST: &str = "\
apiVersion: murmur.dev/v1alpha1
kind: DecentralizedTrainingJob
metadata: {name: drive}
spec:
  replicas: {min: 2, target: 2, max: 2}
  topology: {kind: ring}
  algorithm: {kind: dpsgd}
  training: {model: mlp, steps: 100}
";

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

fn spec() -> DecentralizedTrainingJobSpec {
    parse_manifest(MANIFEST, "drive.yaml").unwrap().spec
}

fn driver() -> (JobDriver, Arc<Hub>) {
    let hub = Arc::new(Hub::default());
    let (d, _inbox) = JobDriver::start(
        hub.clone(),
        "ns",
        "drive",
        b"k".to_vec(),
        Memory::new(at(0)),
    );
    (d, hub)
}

fn address(id: MemberId, _attempt: u32) -> Option<String> {
    Some(format!("10.0.0.{id}:7070"))
}

fn join(id: MemberId) -> Inbound {
    Inbound::Join(JoinReport {
        member_id: id,
        label_histogram: vec![1; 10],
        proxy_vector: None,
    })
}

fn status(id: MemberId, state: TrainerState, step: u64) -> TrainerStatus {
    TrainerStatus {
        progress: Progress {
            step,
            ..Default::default()
        },
        topology_version: 1,
        bytes_out: 10 * step,
        ..TrainerStatus::new(id, state)
    }
}

/// Every created member live, as a runtime would show it.
fn facts(d: &JobDriver) -> BTreeMap<MemberId, ObservedMember> {
    d.state()
        .members
        .iter()
        .map(|(&id, r)| {
            (
                id,
                ObservedMember {
                    attempt: r.attempt,
                    address: address(id, r.attempt),
                    ..Default::default()
                },
            )
        })
        .collect()
}

fn step(d: &mut JobDriver, now: Timestamp) -> Plan {
    let plan = d.plan(&spec(), None, facts(d), &address, now);
    d.commit(&plan, now);
    plan
}

#[test]
fn a_plan_changes_nothing_until_it_is_committed() {
    let (mut d, hub) = driver();
    let before = d.memory().clone();
    let plan = d.plan(&spec(), None, BTreeMap::new(), &address, at(1));
    assert_eq!(plan.actions.len(), 2, "two members to create");
    assert_eq!(d.memory(), &before);
    assert!(hub.job("ns", "drive").unwrap().view().is_none());
    d.commit(&plan, at(1));
    assert_eq!(d.state(), &*plan.memory.state);
    assert!(hub.job("ns", "drive").unwrap().view().is_some());
}

#[test]
fn joins_and_statuses_reach_the_planner_for_the_attempt_that_sent_them() {
    let (mut d, hub) = driver();
    step(&mut d, at(1));
    assert!(d.receive(join(0), at(2)), "a join report plans again");
    assert!(d.receive(join(1), at(2)));
    let plan = step(&mut d, at(2));
    let document = plan.document.expect("both joined: a topology");
    assert_eq!(document.version, 1);
    let reasons: Vec<&str> = plan.events.iter().map(|e| e.reason.as_str()).collect();
    assert!(reasons.contains(&"TopologyChanged"), "{reasons:?}");
    let handle = hub.job("ns", "drive").unwrap();
    assert_eq!(
        handle.topology().borrow().as_ref().map(|t| t.version),
        Some(1)
    );
    assert_eq!(handle.events(0).0.len(), plan.events.len(), "{reasons:?}");

    // Statuses: a sample each, a new plan only when the state changes.
    assert!(d.receive(Inbound::Status(status(0, TrainerState::Training, 5)), at(3)));
    assert!(!d.receive(Inbound::Status(status(0, TrainerState::Training, 6)), at(4)));
    assert!(d.receive(Inbound::Status(status(0, TrainerState::Done, 100)), at(5)));
    assert_eq!(d.last_state(0, 0), Some(TrainerState::Done));
    assert_eq!(d.last_state(0, 1), None, "another attempt said nothing");
    assert_eq!(handle.series(0).0.len(), 3);
    assert_eq!(d.bytes_exchanged(), 1000);
    let observed = d.observation(facts(&d));
    assert!(observed.members[&0].join.is_some());
    assert_eq!(
        observed.members[&0].status.as_ref().map(|s| s.state),
        Some(TrainerState::Done)
    );
}

#[test]
fn a_join_that_arrives_while_a_plan_is_carried_out_is_kept() {
    let (mut d, _hub) = driver();
    step(&mut d, at(1));
    let plan = d.plan(&spec(), None, facts(&d), &address, at(2));
    assert!(d.receive(join(1), at(2)));
    d.commit(&plan, at(2));
    assert!(d.memory().joins.contains_key(&1));
}

#[test]
fn a_first_attempt_that_joins_before_the_plan_creating_it_is_committed_is_kept() {
    // The runtime creates 20 pods; the first one starts and posts its join before the last is
    // created and the plan committed.
    let (mut d, _hub) = driver();
    let plan = d.plan(&spec(), None, BTreeMap::new(), &address, at(1));
    assert!(d.receive(join(0), at(1)));
    d.commit(&plan, at(1));
    assert_eq!(d.memory().joins[&0].attempt, 0);
    d.receive(join(1), at(2));
    let plan = step(&mut d, at(2));
    assert!(
        plan.document.is_some_and(|t| t.members.len() == 2),
        "both members in the first topology"
    );
}

#[test]
fn a_topology_version_is_published_once_and_never_backwards() {
    let (mut d, hub) = driver();
    step(&mut d, at(1));
    d.receive(join(0), at(1));
    d.receive(join(1), at(1));
    let plan = step(&mut d, at(2));
    let handle = hub.job("ns", "drive").unwrap();
    let mut rx = handle.topology();
    rx.mark_unchanged();
    // The same plan committed again publishes nothing new.
    d.commit(&plan, at(3));
    assert!(!rx.has_changed().unwrap());
}

#[test]
fn an_invalid_spec_plans_no_member_and_says_why_once() {
    let (mut d, _hub) = driver();
    let plan = d.plan(
        &spec(),
        Some("spec.replicas: nope"),
        facts(&d),
        &address,
        at(1),
    );
    assert!(plan.actions.is_empty());
    assert_eq!(plan.events.len(), 1);
    assert_eq!(plan.events[0].reason.as_str(), "InvalidSpec");
    d.commit(&plan, at(1));
    let again = d.plan(
        &spec(),
        Some("spec.replicas: nope"),
        facts(&d),
        &address,
        at(2),
    );
    assert!(again.events.is_empty(), "said once");
}

/// The ConfigMap holding the memory of a job of `members` (10 000 is the CRD's most), once
/// every member joined, for a topology of `kind`: its bytes, keys included.
fn memory_bytes_of(kind: TopologyKind, members: u32) -> usize {
    let topology = match kind {
        TopologyKind::Ring => "{kind: ring}",
        TopologyKind::FullyConnected => "{kind: fullyConnected}",
        TopologyKind::Exponential => "{kind: exponential}",
        TopologyKind::ExponentialOnePeer => "{kind: exponentialOnePeer}",
        TopologyKind::DCliques => "{kind: dCliques, cliqueSize: 10}",
        TopologyKind::ProxyClumps => "{kind: proxyClumps}",
    };
    let proxy_clumps = kind == TopologyKind::ProxyClumps;
    let manifest = MANIFEST
        .replace(
            "{min: 2, target: 2, max: 2}",
            &format!(
                "{{min: {}, target: {members}, max: {members}}}",
                members * 9 / 10
            ),
        )
        .replace("{kind: ring}", topology);
    let spec = parse_manifest(&manifest, "big.yaml").unwrap().spec;
    let (mut d, _hub) = driver();
    let address = |id: MemberId, attempt: u32| {
        Some(format!(
            "big-{id}-{attempt}.big-peers.scale.svc.cluster.local:7070"
        ))
    };
    // Created a burst per plan.
    loop {
        let plan = d.plan(&spec, None, facts(&d), &address, at(1));
        d.commit(&plan, at(1));
        let creates = plan
            .actions
            .iter()
            .filter(|a| matches!(a, crate::planner::Action::Create { .. }))
            .count();
        if creates < crate::planner::CREATES_PER_PLAN {
            break;
        }
    }
    for id in 0..members {
        // Ten classes, one of them most of the member's shard; for proxy clumps, the proxy
        // vector its trainer reports (a mean softmax over the ten classes), its digits
        // scattered as measured ones are, so that they pack no better than real ones.
        let histogram = (0..10)
            .map(|c| if c == id % 10 { 400 } else { 10 })
            .collect();
        let noise = |c: u32| (id.wrapping_mul(2_654_435_761) ^ c.wrapping_mul(40_503)) % 9_973;
        let raw: Vec<f32> = (0..10)
            .map(|c| if c == id % 10 { 8.0 } else { 0.2 } + noise(c) as f32 / 9_973.0)
            .collect();
        let sum: f32 = raw.iter().sum();
        let report = JoinReport {
            member_id: id,
            label_histogram: histogram,
            proxy_vector: proxy_clumps.then(|| raw.iter().map(|v| v / sum).collect()),
        };
        d.receive(Inbound::Join(report), at(2));
    }
    let plan = d.plan(&spec, None, facts(&d), &address, at(20));
    assert!(plan.document.is_some(), "{kind:?}: a topology of them all");
    d.commit(&plan, at(20));
    let data = d.memory().data(plan.document.as_deref());
    assert!(
        members < 10_000 || !data.contains_key(TOPOLOGY_KEY),
        "{kind:?}: derived from the state, left out of a large memory"
    );
    let mut job = murmur_core::api::DecentralizedTrainingJob::new("big", spec.clone());
    job.metadata.namespace = Some("scale".into());
    job.metadata.uid = Some("u".into());
    let cm = crate::runtime::kube::resources::config_map(&job, data);
    assert!(members < 10_000 || cm.data.is_none(), "{kind:?}: gzipped");
    let text: usize = cm
        .data
        .iter()
        .flatten()
        .map(|(k, v)| k.len() + v.len())
        .sum();
    let binary: usize = cm
        .binary_data
        .iter()
        .flatten()
        .map(|(k, v)| k.len() + v.0.len())
        .sum();
    text + binary
}

#[test]
fn the_memory_of_ten_thousand_members_fits_a_config_map_for_every_topology_kind() {
    // fullyConnected takes at most 256 members (the CRD's rule): at 10 000, 50 million links
    // and views of 9 999 peers each (this test's process passed 22 GB).
    let bytes = memory_bytes_of(TopologyKind::FullyConnected, 256);
    println!("FullyConnected, 256 members: {bytes} bytes");
    assert!(bytes < 900 * 1024, "FullyConnected: {bytes} bytes");
    for kind in [
        TopologyKind::Ring,
        TopologyKind::Exponential,
        TopologyKind::ExponentialOnePeer,
        TopologyKind::DCliques,
        TopologyKind::ProxyClumps,
    ] {
        let bytes = memory_bytes_of(kind, 10_000);
        println!("{kind:?}: {bytes} bytes");
        assert!(bytes < 900 * 1024, "{kind:?}: {bytes} bytes");
    }
}

#[test]
fn a_document_is_rebuilt_only_when_its_topology_or_an_address_changes() {
    let (mut d, _hub) = driver();
    step(&mut d, at(1));
    d.receive(join(0), at(2));
    d.receive(join(1), at(2));
    let first = step(&mut d, at(2)).document.unwrap();
    // Progress moves the step the hub serves, not the document the plan keeps.
    d.receive(Inbound::Status(status(0, TrainerState::Training, 5)), at(3));
    let again = d.plan(&spec(), None, facts(&d), &address, at(3));
    assert!(Arc::ptr_eq(&first, again.document.as_ref().unwrap()));
    assert_eq!((again.step, first.step), (5, 0));
    // Another address for member 1 (a runtime that learnt a new port): a new document.
    let moved = |id: MemberId, attempt: u32| {
        (id == 1)
            .then(|| "10.0.0.9:7070".to_string())
            .or_else(|| address(id, attempt))
    };
    let plan = d.plan(&spec(), None, facts(&d), &moved, at(3));
    let doc = plan.document.unwrap();
    assert!(!Arc::ptr_eq(&first, &doc));
    assert_eq!(doc.members[1].address.as_deref(), Some("10.0.0.9:7070"));
    assert_eq!(doc.version, first.version);
}

#[test]
fn the_jobs_step_holds_when_the_member_ahead_is_lost() {
    let (mut d, _hub) = driver();
    step(&mut d, at(1));
    d.receive(join(0), at(2));
    d.receive(join(1), at(2));
    step(&mut d, at(2));
    d.receive(
        Inbound::Status(status(0, TrainerState::Training, 25)),
        at(3),
    );
    d.receive(
        Inbound::Status(status(1, TrainerState::Training, 50)),
        at(3),
    );
    let mut f = facts(&d);
    let step_of = |v: &JobView| v.status.progress.as_ref().map(|p| p.step);
    assert_eq!(step_of(&d.view(&spec(), f.clone(), at(4))), Some(50));
    // Member 1's node dies before the others report step 50: the job got that far all the
    // same (its neighbours averaged with it), and `kubectl get` must not show the step going
    // back.
    f.get_mut(&1).unwrap().exit = Some(crate::member::Exit::Preempted {
        reason: "node lost".into(),
    });
    assert_eq!(step_of(&d.view(&spec(), f.clone(), at(5))), Some(50));
    let plan = d.plan(&spec(), None, f, &address, at(5));
    assert_eq!(step_of(&plan.view), Some(50));
}

/// A status of member `id` (attempt from the driver) that has sent `sent` bytes to each peer.
fn sent(id: MemberId, sent: &[(MemberId, u64)]) -> TrainerStatus {
    TrainerStatus {
        bytes_sent_to: sent.iter().copied().collect(),
        bytes_out: sent.iter().map(|(_, b)| b).sum(),
        ..status(id, TrainerState::Training, 1)
    }
}

/// Three members: 0 and 1 in zone a of region r1, 2 in zone c of region r2.
fn placed(d: &JobDriver) -> BTreeMap<MemberId, ObservedMember> {
    let mut members = facts(d);
    for (id, m) in &mut members {
        let (zone, region) = match id {
            0 | 1 => ("a", "r1"),
            _ => ("c", "r2"),
        };
        m.zone = Some(zone.into());
        m.region = Some(region.into());
    }
    members
}

fn three() -> DecentralizedTrainingJobSpec {
    parse_manifest(
        &MANIFEST.replace("{min: 2, target: 2, max: 2}", "{min: 3, target: 3, max: 3}"),
        "drive.yaml",
    )
    .unwrap()
    .spec
}

#[test]
fn each_status_adds_what_it_sent_since_the_last_by_where_both_ends_run() {
    let (mut d, _hub) = driver();
    let plan = d.plan(&three(), None, BTreeMap::new(), &address, at(1));
    d.commit(&plan, at(1));
    let plan = d.plan(&three(), None, placed(&d), &address, at(2));
    d.commit(&plan, at(2));

    d.take_status(0, 0, sent(0, &[(1, 100), (2, 50)]), at(3));
    // Cumulative counts: only what is new since the previous status counts.
    d.take_status(0, 0, sent(0, &[(1, 300), (2, 50)]), at(4));
    d.take_status(2, 0, sent(2, &[(1, 7)]), at(4));
    let t = d.traffic();
    assert_eq!(t.within_zone_bytes, 300);
    assert_eq!(t.cross_region_bytes, 57);
    assert_eq!(t.cross_zone_bytes, 0);
    assert_eq!(t.unplaced_bytes, 0);
    assert!((t.cost_usd - 57.0 * 0.02 / 1e9).abs() < 1e-18);
    let view = hub_view(&d);
    assert_eq!(view.status.traffic.as_ref(), Some(t));
    assert_eq!(view.prices, murmur_core::api::traffic::Prices::LIST);

    // Member 2's next attempt runs in zone b of r1: its bytes to 0 cross zones, counted from
    // zero (a new attempt's count starts again).
    let mut members = placed(&d);
    let m2 = members.get_mut(&2).unwrap();
    m2.attempt = 1;
    m2.zone = Some("b".into());
    m2.region = Some("r1".into());
    let plan = d.plan(&three(), None, members, &address, at(5));
    d.commit(&plan, at(5));
    d.take_status(2, 1, sent(2, &[(0, 40)]), at(6));
    // A late status of the attempt before counts nothing: its bytes were counted.
    d.take_status(2, 0, sent(2, &[(1, 9)]), at(6));
    let t = d.traffic();
    assert_eq!(
        (
            t.within_zone_bytes,
            t.cross_zone_bytes,
            t.cross_region_bytes
        ),
        (300, 40, 57)
    );
}

fn hub_view(d: &JobDriver) -> JobView {
    d.view(&three(), BTreeMap::new(), at(10))
}

#[test]
fn members_with_no_zone_send_unplaced_bytes_that_cost_nothing() {
    let (mut d, _hub) = driver();
    step(&mut d, at(1));
    d.take_status(0, 0, sent(0, &[(1, 1_000_000)]), at(2));
    assert_eq!(d.traffic().unplaced_bytes, 1_000_000);
    assert_eq!(d.traffic().cost_usd, 0.0);
    assert_eq!(d.traffic().total_bytes(), d.bytes_exchanged());
    let plan = step(&mut d, at(3));
    assert_eq!(
        plan.view.status.traffic.as_ref().map(|t| t.unplaced_bytes),
        Some(1_000_000)
    );
}

#[test]
fn a_restarted_driver_carries_the_traffic_on_without_counting_running_attempts_twice() {
    let (mut d, _hub) = driver();
    step(&mut d, at(1));
    d.take_status(0, 0, sent(0, &[(1, 500)]), at(2));
    let before = d.traffic().clone();

    // A new operator: the same memory, the traffic read back from the job's status.
    let hub = Arc::new(Hub::default());
    let (mut again, _inbox) =
        JobDriver::start(hub, "ns", "drive", b"k".to_vec(), d.memory().clone());
    again.resume_traffic(before.clone());
    // Attempt 0 of member 0 posts its cumulative count: already counted up to here.
    again.take_status(0, 0, sent(0, &[(1, 500)]), at(3));
    assert_eq!(again.traffic(), &before);
    again.take_status(0, 0, sent(0, &[(1, 800)]), at(4));
    assert_eq!(again.traffic().unplaced_bytes, 800);
    // Member 1's running attempt first posts after the restart: its count so far was in the
    // status (a gap of what it sent between its last counted status and the restart is lost).
    again.take_status(1, 0, sent(1, &[(0, 60)]), at(5));
    again.take_status(1, 0, sent(1, &[(0, 90)]), at(6));
    assert_eq!(again.traffic().unplaced_bytes, 830);
}
