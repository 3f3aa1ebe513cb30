use super::*;
use murmur_core::api::FailureAction;
use murmur_core::api::conditions::KubeletReason;
use murmur_core::api::parse_manifest;
use murmur_core::contract::{JoinReport, TrainerStatus};
use proptest::prelude::*;

use crate::member::{End, Exit, Lifecycle, NotStarting, ObservedMember};

const MANIFEST: &str = "\
apiVersion: murmur.dev/v1alpha1
kind: DecentralizedTrainingJob
metadata: {name: plan}
spec:
  replicas: {min: 2, target: 4, max: 4}
  topology: {kind: dCliques, cliqueSize: 2}
  algorithm: {kind: cliqueAveraging}
  training: {model: mlp, partition: {kind: classesPerMember, k: 5}, steps: 100}
  recovery: {maxRestarts: 2, backoff: 10s}
";

fn spec() -> DecentralizedTrainingJobSpec {
    parse_manifest(MANIFEST, "plan.yaml").unwrap().spec
}

fn at(secs: f64) -> Timestamp {
    Timestamp::from_millisecond((secs * 1000.0) as i64).unwrap()
}

/// A runtime in miniature: executes Create/Stop on an observation, lets tests end members.
struct World {
    spec: DecentralizedTrainingJobSpec,
    state: JobState,
    observed: Observation,
    now: f64,
    actions: Vec<Action>,
    /// Members told to stop; they end before the next plan.
    stopping: Vec<(u32, u32)>,
    /// New members wait for a node (pods) rather than start at once (processes).
    pending: bool,
}

impl World {
    fn new(spec: DecentralizedTrainingJobSpec) -> Self {
        Self {
            spec,
            state: JobState::new(at(0.0)),
            observed: Observation::default(),
            now: 0.0,
            actions: Vec::new(),
            stopping: Vec::new(),
            pending: false,
        }
    }

    fn plan(&mut self) -> Vec<Action> {
        for (id, attempt) in std::mem::take(&mut self.stopping) {
            let m = self.observed.members.get_mut(&id).unwrap();
            if m.is_live() && m.attempt == attempt {
                m.exit = Some(Exit::Preempted {
                    reason: "stopped".into(),
                });
            }
        }
        let (next, actions) = plan(&self.spec, &self.state, &self.observed, at(self.now));
        self.state = next;
        for a in &actions {
            match a {
                Action::Create {
                    member, attempt, ..
                } => {
                    self.observed.members.insert(
                        *member,
                        ObservedMember {
                            attempt: *attempt,
                            address: Some(format!("10.0.0.{member}:7070")),
                            pending_since: self.pending.then(|| at(self.now)),
                            ..Default::default()
                        },
                    );
                }
                Action::Stop { member, attempt } => self.stopping.push((*member, *attempt)),
                Action::Event(_) => {}
            }
        }
        self.actions.extend(actions.clone());
        actions
    }

    fn join(&mut self, id: u32) {
        // Member i holds classes 5(i mod 2)..5(i mod 2)+5: two kinds of member.
        let mut histogram = vec![0u64; 10];
        for c in 0..5 {
            histogram[(id as usize % 2) * 5 + c] = 40;
        }
        self.join_with(id, histogram);
    }

    fn join_with(&mut self, id: u32, label_histogram: Vec<u64>) {
        self.observed.members.get_mut(&id).unwrap().join = Some(Arc::new(JoinReport {
            member_id: id,
            label_histogram,
            proxy_vector: None,
        }));
    }

    fn schedule(&mut self, id: u32, node: &str) {
        self.observed.members.get_mut(&id).unwrap().node = Some(node.into());
    }

    fn end(&mut self, id: u32, exit: Exit) {
        self.observed.members.get_mut(&id).unwrap().exit = Some(exit);
    }

    fn neighbours(&self, id: u32) -> Vec<u32> {
        let t = self.state.topology.as_ref().unwrap();
        t.graph.neighbours(id).collect()
    }

    fn version(&self) -> u64 {
        self.state.topology.as_ref().map_or(0, |t| t.version)
    }

    fn creates(actions: &[Action]) -> Vec<(u32, u32)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Create {
                    member, attempt, ..
                } => Some((*member, *attempt)),
                _ => None,
            })
            .collect()
    }

    fn stops(actions: &[Action]) -> Vec<(u32, u32)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Stop { member, attempt } => Some((*member, *attempt)),
                _ => None,
            })
            .collect()
    }

    /// Second attempts created (moved members): member, clique and zone asked for.
    fn moved_creates(actions: &[Action]) -> Vec<(u32, Option<u32>, Option<String>)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Create {
                    member,
                    attempt: 1,
                    clique,
                    zone,
                    ..
                } => Some((*member, *clique, zone.clone())),
                _ => None,
            })
            .collect()
    }

    fn reasons(actions: &[Action]) -> Vec<&'static str> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Event(e) => Some(e.reason.as_str()),
                _ => None,
            })
            .collect()
    }

    /// Create every member (pods that wait for a node), place member `id` on a node of
    /// `zone_of(id)` and let it join; the plan that builds the topology is the caller's.
    fn zoned(zone_aware: Option<bool>, zone_of: fn(u32) -> &'static str) -> Self {
        let mut spec = spec();
        spec.scheduling.zone_aware = zone_aware;
        let mut w = World::new(spec);
        w.pending = true;
        w.plan();
        for id in 0..4 {
            w.schedule(id, &format!("node-{id}"));
            w.observed.members.get_mut(&id).unwrap().zone = Some(zone_of(id).into());
            w.join(id);
        }
        w
    }

    /// Start every member and let them all join.
    fn running() -> Self {
        let mut w = World::new(spec());
        w.plan();
        for id in 0..4 {
            w.join(id);
        }
        w.plan();
        w
    }
}

fn preempted() -> Exit {
    Exit::Preempted {
        reason: "spot reclaim".into(),
    }
}

fn crashed() -> Exit {
    crashed_with(101)
}

fn crashed_with(code: i32) -> Exit {
    Exit::Failed {
        reason: format!("exit code {code}"),
        code: Some(code),
        conditions: Vec::new(),
    }
}

#[test]
fn the_first_plan_creates_every_member_and_waits_for_their_reports() {
    let mut w = World::new(spec());
    let actions = w.plan();
    assert_eq!(
        World::creates(&actions),
        vec![(0, 0), (1, 0), (2, 0), (3, 0)]
    );
    assert_eq!(w.state.phase, JobPhase::Pending);
    assert!(w.state.topology.is_none());
    assert!(
        w.state
            .conditions
            .iter()
            .any(|c| c.type_ == "Created" && c.status == "True")
    );
    // Nothing new happened: nothing to do.
    assert!(w.plan().is_empty());
    // Three of four reports: still waiting (inside the grace period).
    for id in 0..3 {
        w.join(id);
    }
    w.now = 5.0;
    assert_eq!(World::reasons(&w.plan()), vec!["Joined"; 3]);
    assert!(w.plan().is_empty());
    assert!(w.state.topology.is_none());
}

#[test]
fn data_aware_cliques_are_built_from_the_join_reports_once_all_are_in() {
    let w = World::running();
    let t = w.state.topology.as_ref().unwrap();
    assert_eq!(t.version, 1);
    assert_eq!(t.kind_name(), "dCliques");
    // Each clique of two pairs a member of each kind: together they hold all ten classes.
    for id in 0..4u32 {
        let clique = t.clique_of(id).unwrap();
        let mates: Vec<u32> = (0..4).filter(|&o| t.clique_of(o) == Some(clique)).collect();
        assert_eq!(mates.len(), 2);
        assert_ne!(mates[0] % 2, mates[1] % 2, "clique {clique}: {mates:?}");
    }
    assert_eq!(w.state.phase, JobPhase::Running);
    assert!(World::reasons(&w.actions).contains(&"TopologyChanged"));
}

#[test]
fn zone_aware_cliques_form_inside_the_zones_of_the_members_nodes() {
    // Even members hold one half of the classes, odd ones the other: a clique needs one of each.
    // `zones(id)` places the members; the cliques built from them, as (member, mate).
    let cliques = |zone_aware: Option<bool>, zones: fn(u32) -> &'static str| {
        let mut w = World::zoned(zone_aware, zones);
        w.plan();
        let t = w.state.topology.as_ref().unwrap();
        (0..4u32)
            .map(|id| {
                assert_eq!(t.profiles[&id].zone.as_deref(), Some(zones(id)));
                let clique = t.clique_of(id).unwrap();
                let mate = (0..4).find(|&o| o != id && t.clique_of(o) == Some(clique));
                (id, mate.unwrap())
            })
            .collect::<Vec<_>>()
    };
    // Zone a holds 0 and 1, zone b 2 and 3: balanced cliques exist inside each zone, and
    // zone-aware (the default) builds those.
    let by_halves = |id: u32| if id < 2 { "a" } else { "b" };
    for (id, mate) in cliques(None, by_halves) {
        assert_eq!(by_halves(id), by_halves(mate), "{id} and {mate} span zones");
        assert_ne!(id % 2, mate % 2, "{id} and {mate} hold the same classes");
    }
    // Each zone holds one kind: a clique of one zone would see half the classes, so cliques
    // cross zones (zone-aware ones too, and then they move members: the test below).
    for (id, mate) in cliques(Some(false), zone_by_kind) {
        assert_ne!(id % 2, mate % 2, "{id} and {mate} hold the same classes");
    }
}

/// Zone a holds the even members (classes 0-4), zone b the odd ones (5-9): each balanced
/// clique of two spans the zones.
fn zone_by_kind(id: u32) -> &'static str {
    if id.is_multiple_of(2) { "a" } else { "b" }
}

/// A zone-aware job over [`zone_by_kind`] after its first plan, which moved one member of each
/// clique: the world, that first topology, and the movers (their stops not yet carried out).
fn after_the_moves() -> (World, Topology, Vec<u32>) {
    let mut w = World::zoned(None, zone_by_kind);
    let actions = w.plan();
    let first = w.state.topology.as_deref().cloned().unwrap();
    let movers: Vec<u32> = World::stops(&actions).iter().map(|&(m, _)| m).collect();
    assert_eq!(movers.len(), 2);
    (w, first, movers)
}

#[test]
fn members_outside_their_cliques_zone_move_there_once_before_anyone_trains() {
    // Zone-aware, the planner moves one member of each clique to its mate's zone, one each way,
    // so the zones keep their sizes.
    let zone_of = zone_by_kind;
    let mut w = World::zoned(None, zone_of);
    let actions = w.plan();
    let t = w.state.topology.clone().unwrap();
    let stops = World::stops(&actions);
    assert_eq!(stops.len(), 2, "{actions:#?}");
    assert_eq!(w.state.relocations, 2);
    assert_eq!(
        World::reasons(&actions)
            .iter()
            .filter(|r| **r == "Relocated")
            .count(),
        2
    );
    // The movers left the first topology: no one waits for them.
    let movers: Vec<u32> = stops.iter().map(|&(m, _)| m).collect();
    assert_eq!(t.graph.member_count(), 2);
    assert!(movers.iter().all(|m| !t.graph.contains(*m)));
    assert_ne!(zone_of(movers[0]), zone_of(movers[1]), "one move each way");
    // They stop; their next attempts ask for the clique they left. Nothing was preempted or
    // restarted.
    let actions = w.plan();
    let creates = World::moved_creates(&actions);
    assert_eq!(creates.len(), 2, "{actions:#?}");
    let stayers: Vec<u32> = (0..4).filter(|m| !movers.contains(m)).collect();
    for (member, clique, zone) in &creates {
        let clique = clique.expect("a moved member asks for its clique");
        let mate = stayers
            .iter()
            .find(|&&s| t.clique_of(s) == Some(clique))
            .unwrap();
        assert_ne!(
            zone_of(*member),
            zone_of(*mate),
            "{member} was already with {mate}"
        );
        assert_eq!(zone.as_deref(), Some(zone_of(*mate)), "asked by name");
    }
    let creates: Vec<(u32, Option<u32>)> = creates.into_iter().map(|(m, c, _)| (m, c)).collect();
    assert_eq!((w.state.preemptions.len(), w.state.restarts), (0, 0));
    // Placed in their cliques' zones, they join and refill their cliques: every clique now
    // trains inside one zone, and still holds both kinds of member.
    for &(member, clique) in &creates {
        let mate = stayers
            .iter()
            .copied()
            .find(|&s| t.clique_of(s) == clique)
            .unwrap();
        w.schedule(member, "node-moved");
        w.observed.members.get_mut(&member).unwrap().zone = Some(zone_of(mate).into());
        w.join(member);
    }
    w.plan();
    let t = w.state.topology.as_ref().unwrap();
    assert_eq!(t.graph.member_count(), 4);
    for (&id, p) in &t.profiles {
        let clique = t.clique_of(id).unwrap();
        for (&other, q) in &t.profiles {
            if other != id && t.clique_of(other) == Some(clique) {
                assert_eq!(p.zone, q.zone, "{id} and {other} span zones");
                assert_ne!(id % 2, other % 2, "{id} and {other} hold the same classes");
            }
        }
    }
    assert_eq!(murmur_core::topology::measure(t).cross_zone_edges, Some(1));
    assert_eq!(w.state.relocations, 2, "moved once");
    // Zone-blind jobs never move anyone.
    let mut w = World::zoned(Some(false), zone_of);
    assert!(!w.plan().iter().any(|a| matches!(a, Action::Stop { .. })));
    assert_eq!(w.state.relocations, 0);
}

#[test]
fn movers_whose_pods_still_run_stay_out_of_the_topology_and_still_ask_for_their_cliques_zone() {
    // The runtime writes behind its plans: the next plan can come before the movers' pods are
    // deleted, their join reports still in hand. They must not rejoin meanwhile: they would
    // join a clique of the zone they are leaving, and their next attempts would ask for it.
    let zone_of = zone_by_kind;
    let (mut w, first, movers) = after_the_moves();
    let deletions = std::mem::take(&mut w.stopping);
    let actions = w.plan();
    let t = w.state.topology.as_ref().unwrap();
    assert!(movers.iter().all(|m| !t.graph.contains(*m)), "{actions:#?}");
    assert_eq!(t.version, first.version, "nothing changed: {actions:#?}");
    w.stopping = deletions;
    let creates = World::moved_creates(&w.plan());
    assert_eq!(creates.len(), 2);
    for (member, clique, zone) in &creates {
        let mate = (0..4)
            .find(|&s| !movers.contains(&s) && first.clique_of(s) == *clique)
            .unwrap_or_else(|| panic!("{member} asks for clique {clique:?}, which has no stayer"));
        assert_eq!(
            zone.as_deref(),
            Some(zone_of(mate)),
            "{member} asks by name"
        );
        assert_ne!(zone_of(*member), zone_of(mate));
    }
}

#[test]
fn a_moved_member_the_scheduler_left_in_its_zone_joins_a_clique_there_not_across() {
    // As above, but both movers land where they ran before: the preference for the clique's
    // zone is only a preference. Each joins the clique of its own zone that has room, not the
    // clique it was moved for across the zones: no clique spans zones.
    let zone_of = zone_by_kind;
    let (mut w, first, _) = after_the_moves();
    let creates = World::moved_creates(&w.plan());
    assert_eq!(creates.len(), 2);
    for &(member, _, _) in &creates {
        w.schedule(member, "node-unmoved");
        w.observed.members.get_mut(&member).unwrap().zone = Some(zone_of(member).into());
        w.join(member);
    }
    w.plan();
    let t = w.state.topology.as_ref().unwrap();
    assert_eq!(t.graph.member_count(), 4);
    for &(member, home, _) in &creates {
        let clique = t.clique_of(member).unwrap();
        assert_ne!(
            Some(clique),
            home,
            "{member} joined the clique across the zones"
        );
        let mates: Vec<u32> = (0..4)
            .filter(|&o| o != member && t.clique_of(o) == Some(clique))
            .collect();
        assert!(
            mates.iter().all(|&o| zone_of(o) == zone_of(member)),
            "{member} in clique {clique} with {mates:?}"
        );
        assert!(first.graph.contains(mates[0]), "with a stayer");
    }
    assert_eq!(w.state.relocations, 2, "moved once: not again");
}

/// The twenty members of a zone-aware whole-job run whose moved members ended in a clique
/// spanning both zones: member `id`'s zone, and its two classes (classesPerMember, k = 2).
fn twenty_over_two_zones() -> World {
    const ZONE_1: [u32; 10] = [1, 2, 4, 5, 7, 8, 9, 14, 17, 19];
    let mut spec = parse_manifest(
        &MANIFEST
            .replace(
                "{min: 2, target: 4, max: 4}",
                "{min: 12, target: 20, max: 24}",
            )
            .replace("cliqueSize: 2", "cliqueSize: 5"),
        "plan.yaml",
    )
    .unwrap()
    .spec;
    spec.training.seed = 42;
    let mut w = World::new(spec);
    w.pending = true;
    w.plan();
    for id in 0..20 {
        w.schedule(id, &format!("node-{id}"));
        let zone = if ZONE_1.contains(&id) {
            "zone-1"
        } else {
            "zone-2"
        };
        w.observed.members.get_mut(&id).unwrap().zone = Some(zone.into());
        w.join_with(id, two_classes(id));
    }
    w
}

/// Member `id`'s labels under classesPerMember with k = 2: classes 2(id mod 5) and the next.
fn two_classes(id: u32) -> Vec<u64> {
    let mut histogram = vec![0u64; 10];
    histogram[2 * (id as usize % 5)] = 120;
    histogram[2 * (id as usize % 5) + 1] = 120;
    histogram
}

/// Each clique's members, and the zones they run in.
fn cliques_and_zones(t: &Topology) -> BTreeMap<u32, Vec<(u32, String)>> {
    let mut out = BTreeMap::<u32, Vec<(u32, String)>>::new();
    for (&id, p) in &t.profiles {
        out.entry(t.clique_of(id).unwrap())
            .or_default()
            .push((id, p.zone.clone().unwrap_or_default()));
    }
    out
}

/// Every clique of `t` trains in one zone.
fn assert_cliques_keep_to_one_zone(t: &Topology, when: &str) {
    for (clique, members) in cliques_and_zones(t) {
        assert!(
            members.iter().all(|(_, z)| *z == members[0].1),
            "clique {clique} spans zones {when}: {members:?}"
        );
    }
}

#[test]
fn moving_members_to_their_cliques_zones_keeps_the_cliques_they_leave() {
    // Zone 1 holds four of the five members with classes 8-9 and zone 2 none: balanced cliques
    // must cross zones, and their outsiders move. Taking them out of the first topology must not
    // dissolve the cliques they leave (a clique left with two of five was spread over the others,
    // across zones), and every mover, landed where it was asked to go, rejoins the clique it left.
    for reversed in [false, true] {
        let mut w = twenty_over_two_zones();
        let actions = w.plan();
        let t = w.state.topology.as_ref().unwrap();
        let movers: Vec<u32> = World::stops(&actions).iter().map(|&(m, _)| m).collect();
        assert!(!movers.is_empty(), "{:?}", cliques_and_zones(t));
        assert_cliques_keep_to_one_zone(t, "before the moves");
        let mut creates = World::moved_creates(&w.plan());
        assert_eq!(creates.len(), movers.len());
        if reversed {
            creates.reverse();
        }
        for (member, clique, zone) in creates {
            let clique = clique.expect("a moved member asks for its clique");
            assert!(
                cliques_and_zones(w.state.topology.as_ref().unwrap()).contains_key(&clique),
                "member {member} asks for clique {clique}, which is gone"
            );
            w.schedule(member, "node-moved");
            w.observed.members.get_mut(&member).unwrap().zone = zone;
            w.join_with(member, two_classes(member));
            w.plan();
            let t = w.state.topology.as_ref().unwrap();
            assert_eq!(
                t.clique_of(member),
                Some(clique),
                "member {member} came back"
            );
        }
        let t = w.state.topology.as_ref().unwrap();
        assert_eq!(t.graph.member_count(), 20);
        let cliques = cliques_and_zones(t);
        assert_eq!(cliques.len(), 4, "{cliques:?}");
        assert_cliques_keep_to_one_zone(t, "once the movers are back");
    }
}

#[test]
fn after_the_grace_period_the_topology_starts_with_the_members_in() {
    let mut w = World::new(spec());
    w.plan();
    w.join(0);
    w.now = JOIN_GRACE_SECONDS + 1.0;
    w.plan();
    assert!(w.state.topology.is_none(), "one member is below min (2)");
    w.join(2);
    w.plan();
    let t = w.state.topology.as_ref().unwrap();
    assert_eq!(t.graph.members().collect::<Vec<_>>(), vec![0, 2]);
    assert_eq!(w.state.phase, JobPhase::Degraded);
    // Late joiners are added by repair. Member 1 holds the classes 0 and 2 lack: added to a
    // clique of its own, it leaves the cliques skewed, so a member is traded into its clique.
    w.join(1);
    let actions = w.plan();
    assert!(w.state.topology.as_ref().unwrap().graph.contains(1));
    assert_eq!(
        World::reasons(&actions),
        vec!["Joined", "CliquesRebalanced", "TopologyChanged"]
    );
    assert_eq!(w.version(), 3);
    assert_eq!(w.neighbours(1).len(), 1, "in a clique of two");
}

#[test]
fn a_preempted_member_is_repaired_out_replaced_at_once_and_never_counted_as_a_restart() {
    let mut w = World::running();
    w.now = 30.0;
    w.end(1, preempted());
    let actions = w.plan();
    assert_eq!(World::creates(&actions), vec![(1, 1)]);
    assert!(World::reasons(&actions).contains(&"Preempted"));
    assert!(World::reasons(&actions).contains(&"Replaced"));
    assert!(World::reasons(&actions).contains(&"Left"));
    assert_eq!(w.state.preemptions.len(), 1);
    assert_eq!(w.state.preemptions[0].member, 1);
    assert_eq!(w.state.preemptions[0].reason, "spot reclaim");
    assert_eq!(w.state.restarts, 0);
    assert_eq!(w.version(), 2);
    assert!(!w.state.topology.as_ref().unwrap().graph.contains(1));
    assert_eq!(w.state.phase, JobPhase::Degraded);
    assert!(
        w.state
            .conditions
            .iter()
            .any(|c| c.type_ == "Degraded" && c.status == "True")
    );
    // The replacement is added back once it reports.
    assert!(w.plan().is_empty());
    assert!(
        w.state.members[&1].lifecycle != Lifecycle::Joined && w.state.members[&1].attempt == 1,
        "a new attempt has not joined yet"
    );
    w.join(1);
    w.plan();
    assert!(w.state.topology.as_ref().unwrap().graph.contains(1));
    assert_eq!(w.version(), 3);
    assert_eq!(w.state.phase, JobPhase::Running);
    // Preempted again and again: never a failure.
    for k in 0..10 {
        w.end(1, preempted());
        w.plan();
        w.join(1);
        w.plan();
        assert_eq!(w.observed.members[&1].attempt, k + 2);
    }
    assert_eq!(w.state.restarts, 0);
    assert_eq!(w.state.preemptions.len(), 11);
    assert_eq!(w.state.phase, JobPhase::Running);
}

#[test]
fn a_crash_counts_a_restart_and_waits_out_a_doubling_backoff() {
    let mut w = World::running();
    w.now = 20.0;
    w.end(2, crashed());
    let actions = w.plan();
    assert!(World::creates(&actions).is_empty(), "backoff: 10 s");
    assert_eq!(w.state.restarts, 1);
    assert!(World::reasons(&actions).contains(&"MemberFailed"));
    w.now = 29.0;
    assert!(World::creates(&w.plan()).is_empty());
    w.now = 30.0;
    assert_eq!(World::creates(&w.plan()), vec![(2, 1)]);
    // Its second crash waits twice as long.
    w.end(2, crashed());
    w.plan();
    w.now = 49.0;
    assert!(World::creates(&w.plan()).is_empty());
    w.now = 50.0;
    assert_eq!(World::creates(&w.plan()), vec![(2, 2)]);
    assert_eq!(w.state.phase, JobPhase::Degraded);
}

#[test]
fn more_crashes_than_max_restarts_fail_the_job_and_stop_its_members() {
    let mut w = World::running();
    for k in 0..3 {
        w.now += 1000.0;
        w.end(3, crashed());
        w.plan();
        if k < 2 {
            w.now += 1000.0;
            w.plan();
        }
    }
    assert_eq!(w.state.phase, JobPhase::Failed);
    let message = w.state.message.clone().unwrap();
    assert!(message.contains("recovery.maxRestarts (2)"), "{message}");
    assert!(message.contains("member 3: exit code 101"), "{message}");
    let stops = w
        .actions
        .iter()
        .filter(|a| matches!(a, Action::Stop { .. }))
        .count();
    assert_eq!(stops, 3, "the three live members are stopped");
    assert!(
        w.state
            .conditions
            .iter()
            .any(|c| c.type_ == "Failed" && c.status == "True")
    );
    // Finished is final.
    w.end(0, preempted());
    assert!(w.plan().is_empty());
}

#[test]
fn once_a_member_completes_losses_are_not_replaced_and_the_job_succeeds_when_all_exit() {
    let mut w = World::running();
    w.end(0, Exit::Completed);
    w.plan();
    assert_eq!(w.state.phase, JobPhase::Running);
    w.end(1, preempted());
    let actions = w.plan();
    assert!(World::creates(&actions).is_empty());
    assert_eq!(w.state.preemptions.len(), 1);
    let version = w.version();
    w.end(2, Exit::Completed);
    w.end(3, Exit::Completed);
    w.now = 99.0;
    let actions = w.plan();
    assert_eq!(w.state.phase, JobPhase::Succeeded);
    assert_eq!(w.state.completed_at, Some(at(99.0)));
    assert!(World::reasons(&actions).contains(&"Succeeded"));
    assert_eq!(w.version(), version, "no churn at the end");
    assert!(
        w.state
            .conditions
            .iter()
            .any(|c| c.type_ == "Succeeded" && c.status == "True")
    );
    assert!(
        w.state
            .conditions
            .iter()
            .any(|c| c.type_ == "Running" && c.status == "False")
    );
}

#[test]
fn a_replacement_outside_the_topology_is_retired_when_the_job_finishes() {
    let mut w = World::running();
    w.end(1, preempted());
    w.plan();
    assert_eq!(w.observed.members[&1].attempt, 1);
    w.end(0, Exit::Completed);
    let actions = w.plan();
    assert!(actions.contains(&Action::Stop {
        member: 1,
        attempt: 1
    }));
    assert!(World::reasons(&actions).contains(&"MemberRetired"));
    // Its end is neither a preemption nor a crash; the job then succeeds.
    for id in 2..4 {
        w.end(id, Exit::Completed);
    }
    w.plan();
    assert_eq!(w.state.preemptions.len(), 1);
    assert_eq!(w.state.restarts, 0);
    assert_eq!(w.state.phase, JobPhase::Succeeded);
}

fn status(id: u32, bytes_in: u64) -> TrainerStatus {
    TrainerStatus {
        topology_version: 1,
        bytes_in,
        bytes_out: 800,
        ..TrainerStatus::new(id, murmur_core::contract::TrainerState::Training)
    }
}

#[test]
fn a_replacement_whose_neighbours_all_finished_before_it_heard_from_them_is_retired() {
    let mut w = World::running();
    w.end(1, preempted());
    w.plan();
    w.join(1);
    w.plan();
    assert!(w.state.topology.as_ref().unwrap().graph.contains(1));
    // Its neighbours complete before sending it anything (no bytes in).
    w.observed.members.get_mut(&1).unwrap().status = Some(Arc::new(status(1, 0)));
    let neighbours = w.neighbours(1);
    for &n in &neighbours {
        w.end(n, Exit::Completed);
    }
    let actions = w.plan();
    assert!(actions.contains(&Action::Stop {
        member: 1,
        attempt: 1
    }));
    assert!(World::reasons(&actions).contains(&"MemberRetired"));
    for id in 0..4 {
        if w.observed.members[&id].is_live() && id != 1 {
            w.end(id, Exit::Completed);
        }
    }
    w.plan();
    w.plan();
    assert_eq!(w.state.phase, JobPhase::Succeeded);
    assert_eq!(w.state.restarts, 0);
}

#[test]
fn a_member_that_averaged_with_its_neighbours_is_left_to_finish_alone() {
    let mut w = World::running();
    w.observed.members.get_mut(&1).unwrap().status = Some(Arc::new(status(1, 4096)));
    let neighbours = w.neighbours(1);
    for &n in &neighbours {
        w.end(n, Exit::Completed);
    }
    let actions = w.plan();
    assert!(
        !actions
            .iter()
            .any(|a| matches!(a, Action::Stop { member: 1, .. }))
    );
}

#[test]
fn losing_every_member_rebuilds_the_topology_with_a_newer_version() {
    let mut w = World::running();
    for id in 0..4 {
        w.end(id, preempted());
    }
    let actions = w.plan();
    assert!(w.state.topology.is_none());
    assert!(World::reasons(&actions).contains(&"AllMembersLost"));
    assert_eq!(World::creates(&actions).len(), 4);
    let lost_at = w.state.last_version;
    assert!(lost_at >= 4);
    for id in 0..4 {
        w.join(id);
    }
    w.plan();
    assert_eq!(w.version(), lost_at + 1);
    assert_eq!(w.state.phase, JobPhase::Running);
}

#[test]
fn an_end_reported_for_an_old_attempt_changes_nothing() {
    let mut w = World::running();
    w.end(1, preempted());
    w.plan();
    let state = w.state.clone();
    // The runtime reports the old attempt again (a replayed watch event).
    let mut stale = w.observed.clone();
    stale.members.get_mut(&1).unwrap().attempt = 0;
    stale.members.get_mut(&1).unwrap().exit = Some(preempted());
    let (next, _) = plan(&w.spec, &state, &stale, at(w.now));
    assert_eq!(next.preemptions.len(), 1);
}

#[test]
fn moshpit_jobs_get_a_grid() {
    let text = MANIFEST
        .replace("{kind: dCliques, cliqueSize: 2}", "{kind: ring}")
        .replace("{kind: cliqueAveraging}", "{kind: moshpit, groupSize: 2}");
    let mut w = World::new(parse_manifest(&text, "m.yaml").unwrap().spec);
    w.plan();
    for id in 0..4 {
        w.join(id);
    }
    w.plan();
    assert_eq!(w.state.topology.as_ref().unwrap().kind_name(), "moshpit");
}

/// A spot job whose members wait for nodes (as pods do): created pending, scheduled later.
fn spot_world(fallback: &str) -> World {
    let text = MANIFEST.replace(
        "  recovery: {maxRestarts: 2, backoff: 10s}\n",
        &format!(
            "  recovery: {{maxRestarts: 2, backoff: 10s, pendingTimeout: 60s}}\n  scheduling: {{capacity: spot{fallback}}}\n"
        ),
    );
    let mut w = World::new(parse_manifest(&text, "spot.yaml").unwrap().spec);
    w.pending = true;
    w
}

#[test]
fn lifecycle_events_name_the_node_and_the_join() {
    let mut w = spot_world("");
    w.plan();
    w.schedule(0, "node-a");
    let actions = w.plan();
    assert_eq!(World::reasons(&actions), vec!["Scheduled"]);
    let Action::Event(Event { message, .. }) = &actions[0] else {
        unreachable!()
    };
    assert!(message.contains("node-a"), "{message}");
    w.join(0);
    assert_eq!(World::reasons(&w.plan()), vec!["Joined"]);
    assert!(w.plan().is_empty(), "each is said once");
}

#[test]
fn members_held_for_admission_are_queued_not_pending_and_never_fall_back() {
    let mut w = spot_world(", fallbackToOnDemandAfter: 120s");
    w.plan();
    // Kueue's webhook gated every pod: they wait for the gang's admission, not for a node.
    for m in w.observed.members.values_mut() {
        m.pending_since = None;
        m.gated_by = Some("kueue.x-k8s.io/admission".into());
    }
    let queued = |w: &World| {
        w.state
            .conditions
            .iter()
            .find(|c| c.type_ == "Queued")
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    };
    w.now = 1000.0;
    let actions = w.plan();
    assert!(
        !World::reasons(&actions)
            .iter()
            .any(|r| ["PendingTooLong", "FellBackToOnDemand"].contains(r)),
        "{actions:?}"
    );
    assert!(World::creates(&actions).is_empty());
    assert_eq!(
        queued(&w),
        Some((
            "True".into(),
            "WaitingForAdmission".into(),
            "4 members wait for admission: held by scheduling gate kueue.x-k8s.io/admission".into()
        ))
    );
    // One left to admit.
    for id in 0..3 {
        w.observed.members.get_mut(&id).unwrap().gated_by = None;
    }
    w.plan();
    assert_eq!(
        queued(&w).map(|q| q.2),
        Some(
            "1 member waits for admission: held by scheduling gate kueue.x-k8s.io/admission".into()
        )
    );
    // Admitted: the gates go, the members are placed, the condition flips.
    for id in 0..4 {
        w.observed.members.get_mut(&id).unwrap().gated_by = None;
        w.schedule(id, "spot-1");
    }
    w.plan();
    assert_eq!(
        queued(&w).map(|q| (q.0, q.1)),
        Some(("False".into(), "Admitted".into()))
    );
}

#[test]
fn a_member_pending_too_long_is_reported_once_and_falls_back_to_on_demand() {
    let mut w = spot_world(", fallbackToOnDemandAfter: 120s");
    w.plan();
    for id in 1..4 {
        w.schedule(id, "spot-1");
    }
    w.plan();
    assert_eq!(
        next_deadline(&w.spec, &w.state, &w.observed, at(w.now)),
        Some(at(JOIN_GRACE_SECONDS)),
        "the join grace ends first"
    );
    w.now = 59.0;
    assert!(w.plan().is_empty());
    assert_eq!(
        next_deadline(&w.spec, &w.state, &w.observed, at(w.now)),
        Some(at(60.0))
    );
    w.now = 60.0;
    assert_eq!(World::reasons(&w.plan()), vec!["PendingTooLong"]);
    assert_eq!(
        next_deadline(&w.spec, &w.state, &w.observed, at(w.now)),
        Some(at(120.0))
    );
    w.now = 120.0;
    let actions = w.plan();
    assert!(actions.contains(&Action::Stop {
        member: 0,
        attempt: 0
    }));
    assert!(actions.contains(&Action::Create {
        member: 0,
        attempt: 1,
        on_demand: true,
        clique: None,
        zone: None
    }));
    assert!(World::reasons(&actions).contains(&"FellBackToOnDemand"));
    assert!(w.state.members[&0].on_demand);
    // Falling back is neither a preemption nor a restart, and the stopped attempt's end is
    // nothing new.
    w.plan();
    assert_eq!(w.state.preemptions.len(), 0);
    assert_eq!(w.state.restarts, 0);
    // The on-demand attempt never falls back again; a later replacement tries spot first.
    w.now = 1000.0;
    assert!(World::creates(&w.plan()).is_empty());
    w.schedule(0, "on-demand-1");
    w.plan();
    w.end(0, preempted());
    let actions = w.plan();
    assert!(actions.contains(&Action::Create {
        member: 0,
        attempt: 2,
        on_demand: false,
        clique: None,
        zone: None
    }));
}

#[test]
fn without_a_fallback_a_pending_member_only_is_reported() {
    let mut w = spot_world("");
    w.plan();
    w.now = 10_000.0;
    let actions = w.plan();
    assert_eq!(World::reasons(&actions), vec!["PendingTooLong"; 4]);
    assert!(World::creates(&actions).is_empty());
}

#[test]
fn suspend_stops_every_member_keeps_the_status_and_resume_starts_new_attempts() {
    let mut w = World::running();
    w.end(1, preempted());
    w.plan();
    w.join(1);
    w.plan();
    let version = w.version();
    w.spec.suspend = true;
    w.now = 50.0;
    let actions = w.plan();
    assert_eq!(
        actions
            .iter()
            .filter(|a| matches!(a, Action::Stop { .. }))
            .count(),
        4
    );
    assert!(World::reasons(&actions).contains(&"Suspended"));
    assert_eq!(w.state.phase, JobPhase::Suspended);
    assert!(w.state.topology.is_none());
    assert!(
        w.state
            .conditions
            .iter()
            .any(|c| c.type_ == "Suspended" && c.status == "True")
    );
    // The members end; their ends count as nothing, nothing is replaced while suspended.
    w.now = 60.0;
    let actions = w.plan();
    assert!(World::creates(&actions).is_empty());
    assert_eq!(w.state.preemptions.len(), 1, "status kept, nothing added");
    assert_eq!(w.state.restarts, 0);
    assert!(w.plan().is_empty());
    // Resume: a new attempt of every member; the topology comes back with a newer version.
    w.spec.suspend = false;
    let actions = w.plan();
    assert!(World::reasons(&actions).contains(&"Resumed"));
    assert_eq!(
        World::creates(&actions),
        vec![(0, 1), (1, 2), (2, 1), (3, 1)]
    );
    for id in 0..4 {
        w.join(id);
    }
    w.plan();
    assert!(w.version() > version);
    assert_eq!(w.state.phase, JobPhase::Running);
    assert!(
        w.state
            .conditions
            .iter()
            .any(|c| c.type_ == "Suspended" && c.status == "False")
    );
}

#[test]
fn a_job_suspended_from_the_start_creates_nothing() {
    let mut s = spec();
    s.suspend = true;
    let mut w = World::new(s);
    let actions = w.plan();
    assert!(World::creates(&actions).is_empty());
    assert_eq!(w.state.phase, JobPhase::Suspended);
}

#[test]
fn an_invalid_spec_is_reported_once_and_cleared_when_fixed() {
    let state = JobState::new(at(0.0));
    let (s, actions) = reject(
        &state,
        "replicas must satisfy min <= target <= max",
        at(1.0),
    );
    assert_eq!(World::reasons(&actions), vec!["InvalidSpec"]);
    assert!(s.conditions.iter().any(|c| c.type_ == "InvalidSpec"
        && c.status == "True"
        && c.message.contains("min <= target")));
    let (again, actions) = reject(&s, "replicas must satisfy min <= target <= max", at(2.0));
    assert!(actions.is_empty());
    assert_eq!(again, s);
    // Fixed: the condition flips and members are planned.
    let (fixed, actions) = plan(&spec(), &s, &Observation::default(), at(3.0));
    assert_eq!(World::creates(&actions).len(), 4);
    assert!(
        fixed
            .conditions
            .iter()
            .any(|c| c.type_ == "InvalidSpec" && c.status == "False")
    );
}

#[test]
fn the_state_survives_a_round_trip_through_json() {
    let w = World::running();
    let text = serde_json::to_string(&w.state).unwrap();
    let back: JobState = serde_json::from_str(&text).unwrap();
    assert_eq!(back, w.state);
    // Planning from the restored state is planning from the original.
    assert_eq!(
        plan(&w.spec, &back, &w.observed, at(1.0)),
        plan(&w.spec, &w.state, &w.observed, at(1.0))
    );
}

#[derive(Clone, Debug)]
enum Step {
    Join(u32),
    Preempt(u32),
    Crash(u32),
    Complete(u32),
    Schedule(u32),
    ToggleSuspend,
    Wait(u16),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..4u32).prop_map(Step::Join),
        2 => (0..4u32).prop_map(Step::Preempt),
        1 => (0..4u32).prop_map(Step::Crash),
        1 => (0..4u32).prop_map(Step::Complete),
        2 => (0..4u32).prop_map(Step::Schedule),
        1 => Just(Step::ToggleSuspend),
        2 => (0..60u16).prop_map(Step::Wait),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    /// Whatever members do, the plan keeps its promises.
    #[test]
    fn invariants_hold_under_any_sequence_of_member_events(steps in prop::collection::vec(step(), 1..60)) {
        let mut w = spot_world(", fallbackToOnDemandAfter: 30s");
        w.plan();
        let mut last_version = 0;
        for s in steps {
            let live = |w: &World, id: u32| w.observed.members.get(&id).is_some_and(|m| m.is_live());
            match s {
                Step::Join(id) if live(&w, id) => w.join(id),
                Step::Preempt(id) if live(&w, id) => w.end(id, preempted()),
                Step::Crash(id) if live(&w, id) => w.end(id, crashed()),
                Step::Complete(id) if live(&w, id) => w.end(id, Exit::Completed),
                Step::Schedule(id) if live(&w, id) => w.schedule(id, "node"),
                Step::ToggleSuspend => w.spec.suspend = !w.spec.suspend,
                Step::Wait(secs) => w.now += f64::from(secs),
                _ => {}
            }
            let preemptions = w.state.preemptions.len();
            let restarts = w.state.restarts;
            let planned = w.plan();
            // Versions only grow.
            prop_assert!(w.state.last_version >= last_version);
            last_version = w.state.last_version;
            // Restarts count crashes only; preemptions count preemptions only.
            prop_assert!(w.state.restarts >= restarts);
            prop_assert!(w.state.preemptions.len() >= preemptions);
            let crashes: u32 = w.state.members.values().map(|r| r.crashes).sum();
            prop_assert_eq!(crashes, w.state.restarts);
            // Only live members that joined are in the topology (unless the job is ending).
            if let Some(t) = &w.state.topology && !w.state.finishing() && !w.state.phase.is_finished() {
                for id in t.graph.members() {
                    let m = &w.observed.members[&id];
                    prop_assert!(m.is_live() && m.join.is_some(), "member {} in the topology", id);
                }
                prop_assert!(t.graph.is_connected());
            }
            // Planning again without news does nothing.
            let (again, actions) = plan(&w.spec, &w.state, &w.observed, at(w.now));
            prop_assert!(actions.is_empty(), "{:?}", actions);
            prop_assert_eq!(again.last_version, w.state.last_version);
            // Suspended: nothing is created, and nothing stays live once stops are carried out.
            if w.state.phase == JobPhase::Suspended {
                prop_assert!(World::creates(&planned).is_empty());
                prop_assert!(w.state.topology.is_none());
            }
            // An attempt without the spot requirement is one that replaced a member left waiting.
            for (&id, r) in &w.state.members {
                if r.on_demand {
                    let fell_back = w.actions.iter().any(|a| matches!(a, Action::Event(Event { reason: Reason::FellBackToOnDemand, member: Some(m), .. }) if *m == id));
                    prop_assert!(fell_back, "member {} on demand without falling back", id);
                }
            }
            if w.state.phase == JobPhase::Failed {
                prop_assert!(i64::from(w.state.restarts) > 2);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    /// Members move only along the lifecycle's edges: every plan takes each record from its
    /// state to one the state machine reaches (and `become_` panics in tests on a single move it
    /// does not allow).
    #[test]
    fn no_sequence_of_observations_moves_a_member_off_its_lifecycle(steps in prop::collection::vec(step(), 1..60)) {
        let mut w = spot_world(", fallbackToOnDemandAfter: 30s");
        w.pending = true;
        w.plan();
        for s in steps {
            let live = |w: &World, id: u32| w.observed.members.get(&id).is_some_and(|m| m.is_live());
            match s {
                Step::Join(id) if live(&w, id) => w.join(id),
                Step::Preempt(id) if live(&w, id) => w.end(id, preempted()),
                Step::Crash(id) if live(&w, id) => w.end(id, crashed()),
                Step::Complete(id) if live(&w, id) => w.end(id, Exit::Completed),
                Step::Schedule(id) if live(&w, id) => w.schedule(id, "node"),
                Step::ToggleSuspend => w.spec.suspend = !w.spec.suspend,
                Step::Wait(secs) => w.now += f64::from(secs),
                _ => {}
            }
            let before: BTreeMap<u32, (u32, Lifecycle)> =
                w.state.members.iter().map(|(&id, r)| (id, (r.attempt, r.lifecycle))).collect();
            let ended: Vec<u32> = w.observed.members.iter().filter(|(_, m)| !m.is_live()).map(|(id, _)| *id).collect();
            let actions = w.plan();
            for (id, r) in &w.state.members {
                let (attempt, from) = before.get(id).copied().unwrap_or_default();
                prop_assert!(from.reaches(r.lifecycle), "member {}: {:?} -> {:?}", id, from, r.lifecycle);
                // A new attempt starts over: only an attempt that ended, or that the planner
                // itself stopped, is replaced.
                if r.attempt != attempt {
                    prop_assert_eq!(r.attempt, attempt + 1);
                    let stopped = actions.iter().any(|a| matches!(a, Action::Stop { member, attempt: a } if member == id && *a == attempt));
                    prop_assert!(
                        matches!(from, Lifecycle::Ended { .. } | Lifecycle::Retiring) || ended.contains(id) || stopped,
                        "member {} replaced while {:?}", id, from
                    );
                }
                // The observation and the record agree on what is live.
                if r.lifecycle.is_live() {
                    prop_assert_eq!(w.observed.members.get(id).map(|m| m.attempt), Some(r.attempt));
                }
            }
        }
    }
}

#[test]
fn a_member_that_cannot_start_is_said_once_per_attempt_and_in_a_condition() {
    let mut w = World::new(spec());
    w.pending = true;
    w.plan();
    for id in 0..4 {
        w.schedule(id, &format!("node-{id}"));
    }
    w.plan();
    let condition = |w: &World| {
        w.state
            .conditions
            .iter()
            .find(|c| c.type_ == "MembersNotStarting")
            .cloned()
    };
    assert_eq!(condition(&w), None, "nothing to say while every pod starts");
    let pull = |reason: &str| NotStarting {
        reason: reason.into(),
        message: "Back-off pulling image \"registry.invalid/trainer:1\"".into(),
    };
    w.observed.members.get_mut(&2).unwrap().not_starting = Some(pull("ErrImagePull"));
    let actions = w.plan();
    assert_eq!(World::reasons(&actions), vec!["MemberNotStarting"]);
    let said = match &actions[0] {
        Action::Event(e) => e.message.clone(),
        other => panic!("{other:?}"),
    };
    assert!(said.contains("member 2 (attempt 0) cannot start: ErrImagePull: Back-off pulling image \"registry.invalid/trainer:1\""), "{said}");
    let c = condition(&w).expect("a condition");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "ErrImagePull")
    );
    assert!(
        c.message.contains("registry.invalid/trainer:1"),
        "{}",
        c.message
    );
    // The kubelet backing off between pulls is the same problem: no second event.
    w.observed.members.get_mut(&2).unwrap().not_starting = Some(pull("ImagePullBackOff"));
    assert!(World::reasons(&w.plan()).is_empty());
    assert_eq!(condition(&w).unwrap().reason, "ImagePullBackOff");
    // A second member: the condition counts it.
    w.observed.members.get_mut(&3).unwrap().not_starting = Some(NotStarting {
        reason: "FailedMount".into(),
        message: "MountVolume.SetUp failed for volume \"data\"".into(),
    });
    assert_eq!(World::reasons(&w.plan()), vec!["MemberNotStarting"]);
    assert!(
        condition(&w)
            .unwrap()
            .message
            .ends_with("; 1 more members cannot start")
    );
    // Both start: the condition turns False, once.
    for id in [2, 3] {
        w.observed.members.get_mut(&id).unwrap().not_starting = None;
    }
    w.plan();
    let c = condition(&w).unwrap();
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "Started"));
    // The next attempt of a member that cannot start is said again.
    w.end(2, preempted());
    w.now = 30.0;
    w.plan();
    assert_eq!(w.state.members[&2].attempt, 1);
    w.schedule(2, "node-9");
    w.observed.members.get_mut(&2).unwrap().not_starting = Some(pull("ImagePullBackOff"));
    let actions = w.plan();
    assert!(
        World::reasons(&actions).contains(&"MemberNotStarting"),
        "{actions:?}"
    );
}

#[test]
fn a_condition_reason_is_one_word() {
    let condition_reason = |r: &str| KubeletReason::new(r).as_str().to_string();
    assert_eq!(condition_reason("ImagePullBackOff"), "ImagePullBackOff");
    assert_eq!(condition_reason("Failed Mount"), "NotStarting");
    assert_eq!(condition_reason("9lives"), "NotStarting");
    assert_eq!(condition_reason(""), "NotStarting");
    assert_eq!(condition_reason("Odd:"), "NotStarting");
}

#[test]
fn refused_pods_back_off_while_the_admitted_members_train_degraded() {
    let mut w = World::new(spec());
    w.plan();
    // A quota admits members 0 and 1; the API server refuses 2, and 3 is not tried after it.
    let refused = vec![
        (2, 0, "plan-2-0: exceeded quota: pods=2".to_string()),
        (
            3,
            0,
            "plan-3-0: not tried after plan-2-0: exceeded quota".to_string(),
        ),
    ];
    let (s, actions) = creates_answered(&w.state, &[(0, 0), (1, 0)], &refused, at(0.0)).unwrap();
    w.state = s;
    for id in [2, 3] {
        w.observed.members.remove(&id);
    }
    assert_eq!(World::reasons(&actions), vec!["PodsRejected"]);
    let r = &w.state.members[&2];
    assert_eq!(r.lifecycle, Lifecycle::Ended { how: End::Refused });
    assert_eq!((r.attempt, r.refusals, r.not_before), (0, 1, Some(at(5.0))));
    let c = w
        .state
        .conditions
        .iter()
        .find(|c| c.type_ == "PodsRejected")
        .unwrap();
    assert_eq!(c.status, "True");
    assert!(
        c.message.contains("2 members' pods refused"),
        "{}",
        c.message
    );
    // Inside the backoff, nothing is tried again; the admitted members join.
    w.join(0);
    w.join(1);
    w.now = 4.0;
    assert!(World::creates(&w.plan()).is_empty());
    // After it, the same attempts again (they never existed): no Replaced event.
    w.now = 5.0;
    let again = w.plan();
    assert_eq!(World::creates(&again), vec![(2, 0), (3, 0)]);
    assert!(!World::reasons(&again).contains(&"Replaced"));
    // Refused a second time: the backoff doubles, and the refusals count up to a cap.
    let (s, actions) = creates_answered(&w.state, &[], &refused, at(5.0)).unwrap();
    w.state = s;
    for id in [2, 3] {
        w.observed.members.remove(&id);
    }
    assert!(actions.is_empty(), "the same message is said once");
    assert_eq!(w.state.members[&2].not_before, Some(at(15.0)));
    let mut capped = w.state.clone();
    capped.members.get_mut(&2).unwrap().refusals = 40;
    capped.members.get_mut(&2).unwrap().lifecycle = Lifecycle::PENDING;
    let (capped, _) = creates_answered(&capped, &[], &refused[..1], at(100.0)).unwrap();
    assert_eq!(capped.members[&2].not_before, Some(at(400.0)));
    // The job goes on with the members it got: after the join grace the topology is built
    // from the two (replicas.min) and it runs Degraded, its refusal still said.
    // The same plan tries the refused ones again (their backoff is over too).
    w.now = 15.0;
    let creates = World::creates(&w.plan());
    assert!(w.state.topology.is_some());
    assert_eq!(w.state.phase, JobPhase::Degraded);
    assert_eq!(creates, vec![(2, 0), (3, 0)]);
    // Admitted at last: they join, the condition clears, the job runs.
    let (s, _) = creates_answered(&w.state, &creates, &[], at(15.0)).unwrap();
    w.state = s;
    assert_eq!(w.state.members[&2].refusals, 0);
    assert!(
        w.state
            .conditions
            .iter()
            .any(|c| c.type_ == "PodsRejected" && c.status == "False")
    );
    // The same answer again changes nothing: the refusals are reset and the condition cleared.
    assert_eq!(creates_answered(&w.state, &creates, &[], at(15.5)), None);
    w.join(2);
    w.join(3);
    w.now = 16.0;
    w.plan();
    assert_eq!(w.state.phase, JobPhase::Running);
}

#[test]
fn a_long_spot_job_remembers_its_newest_preemptions_and_counts_them_all() {
    let preempt = |s: &mut JobState, attempts: std::ops::Range<u32>| {
        for i in attempts {
            s.record_preemption(Preemption {
                member: i % 7,
                attempt: i,
                at: at(f64::from(i)),
                reason: "spot reclaim".into(),
            });
        }
    };
    let mut s = JobState::new(at(0.0));
    preempt(&mut s, 0..250);
    assert_eq!(s.preemption_count(), 250);
    assert_eq!(s.preemptions.len(), PREEMPTIONS_KEPT);
    assert_eq!(s.preemptions[0].attempt, 150, "the oldest kept");
    assert_eq!(s.preemptions.last().unwrap().attempt, 249);
    // What the memory ConfigMap holds stays the same size however many more come.
    let size = serde_json::to_vec(&s).unwrap().len();
    preempt(&mut s, 250..10_250);
    assert_eq!(s.preemption_count(), 10_250);
    let grown = serde_json::to_vec(&s).unwrap().len();
    assert!(grown <= size + 400, "{size} bytes, then {grown}");
    // A memory written before the count existed reads as its list.
    let mut old = serde_json::to_value(JobState::new(at(0.0))).unwrap();
    old.as_object_mut().unwrap().remove("preemptionsDropped");
    let old: JobState = serde_json::from_value(old).unwrap();
    assert_eq!(old.preemption_count(), 0);
}

#[test]
fn lowering_the_target_retires_the_highest_members_and_raising_it_brings_them_back() {
    let mut w = World::running();
    assert_eq!(w.state.phase, JobPhase::Running);
    w.spec.replicas.target = 2;
    w.spec.replicas.min = 2;
    w.now = 1.0;
    let actions = w.plan();
    let stops = World::stops(&actions);
    assert_eq!(stops, vec![(2, 0), (3, 0)]);
    // The topology closes over the two left at once.
    assert_eq!(
        World::reasons(&actions),
        vec![
            "MemberRetired",
            "MemberRetired",
            "Left",
            "Left",
            "TopologyChanged"
        ]
    );
    // They stop, and count as nothing; the job runs at its new target.
    w.now = 2.0;
    w.plan();
    assert_eq!(
        w.state.members[&3].lifecycle,
        Lifecycle::Ended { how: End::Retired }
    );
    let t = w.state.topology.as_ref().unwrap();
    assert!(!t.graph.contains(2) && !t.graph.contains(3));
    assert_eq!(w.state.phase, JobPhase::Running);
    assert_eq!((w.state.restarts, w.state.preemption_count()), (0, 0));
    // Raised again: the ids come back as new attempts.
    w.spec.replicas.target = 4;
    w.now = 3.0;
    assert_eq!(World::creates(&w.plan()), vec![(2, 1), (3, 1)]);
}

#[test]
fn suspend_is_honoured_after_a_member_reached_the_target_and_resuming_ends_the_job() {
    let mut w = World::running();
    // Member 0 reaches the stopping target: the job is finishing; the others still train.
    w.end(0, Exit::Completed);
    w.now = 1.0;
    w.plan();
    assert!(w.state.finishing());
    assert_eq!(w.state.phase, JobPhase::Running);
    w.spec.suspend = true;
    w.now = 2.0;
    let actions = w.plan();
    let stops: Vec<u32> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Stop { member, .. } => Some(*member),
            _ => None,
        })
        .collect();
    assert_eq!(stops, vec![1, 2, 3], "every member still running stops");
    assert!(World::reasons(&actions).contains(&"Suspended"));
    assert_eq!(w.state.phase, JobPhase::Suspended);
    w.now = 3.0;
    w.plan();
    assert_eq!(w.state.phase, JobPhase::Suspended);
    // Resumed: the job had reached its target; nothing restarts and it succeeds.
    w.spec.suspend = false;
    w.now = 4.0;
    let actions = w.plan();
    assert!(World::creates(&actions).is_empty());
    assert_eq!(w.state.phase, JobPhase::Succeeded);
    assert_eq!((w.state.restarts, w.state.preemption_count()), (0, 0));
}

#[test]
fn a_member_past_its_restart_budget_is_left_out_and_the_job_fails_only_below_min() {
    let mut spec = spec();
    spec.recovery.max_restarts = None;
    spec.recovery.max_restarts_per_member = 1;
    let mut w = World::new(spec);
    w.plan();
    for id in 0..4 {
        w.join(id);
    }
    w.plan();
    // Member `id` crashes twice: its second crash is past its budget of one.
    let crash_twice = |w: &mut World, id: u32| {
        for _ in 0..2 {
            w.now += 1000.0;
            w.end(id, crashed());
            w.plan();
            w.now += 1000.0;
            w.plan();
        }
    };
    crash_twice(&mut w, 3);
    assert!(w.state.members[&3].given_up);
    let attempts = w.state.members[&3].attempt;
    w.now += 1000.0;
    assert!(World::creates(&w.plan()).is_empty(), "not started again");
    assert_eq!(w.state.members[&3].attempt, attempts);
    assert_eq!(w.state.phase, JobPhase::Degraded, "three of four run");
    assert!(w.actions.iter().any(|a| matches!(a,
        Action::Event(e) if e.message.contains("past its restart budget (recovery.maxRestartsPerMember 1)"))));
    // Two left out: still replicas.min (2) that may run.
    crash_twice(&mut w, 2);
    assert_ne!(w.state.phase, JobPhase::Failed);
    // A third: fewer than min may run, and the job fails, naming why.
    for _ in 0..2 {
        w.now += 1000.0;
        w.end(1, crashed());
        w.plan();
        w.now += 1000.0;
        w.plan();
    }
    assert_eq!(w.state.phase, JobPhase::Failed);
    let message = w.state.message.clone().unwrap();
    assert!(message.contains("only 1 members may run"), "{message}");
    assert!(
        message.contains("recovery.maxRestartsPerMember (1)"),
        "{message}"
    );
}

#[test]
fn a_failure_policy_ignores_some_crashes_and_fails_the_job_on_others() {
    let mut spec = spec();
    spec.recovery.failure_policy = vec![
        murmur_core::api::FailureRule {
            action: FailureAction::Ignore,
            on_exit_codes: Some(murmur_core::api::ExitCodeMatch {
                operator: murmur_core::api::ExitCodeOperator::In,
                values: vec![137],
            }),
            on_pod_conditions: Vec::new(),
        },
        murmur_core::api::FailureRule {
            action: FailureAction::FailJob,
            on_exit_codes: Some(murmur_core::api::ExitCodeMatch {
                operator: murmur_core::api::ExitCodeOperator::In,
                values: vec![42],
            }),
            on_pod_conditions: Vec::new(),
        },
    ];
    let mut w = World::new(spec);
    w.plan();
    for id in 0..4 {
        w.join(id);
    }
    w.plan();
    // OOM kills, as often as they come: never counted, each member started again.
    for _ in 0..5 {
        w.now += 1000.0;
        w.end(1, crashed_with(137));
        w.plan();
        w.now += 1000.0;
        w.plan();
    }
    assert_eq!(w.state.restarts, 0);
    assert_eq!(w.state.members[&1].attempt, 5);
    assert!(!w.state.members[&1].given_up);
    assert_ne!(w.state.phase, JobPhase::Failed);
    // Exit code 42 fails the job at once.
    w.now += 1000.0;
    w.end(2, crashed_with(42));
    w.plan();
    assert_eq!(w.state.phase, JobPhase::Failed);
    let message = w.state.message.clone().unwrap();
    assert!(
        message.contains("recovery.failurePolicy says fails the job"),
        "{message}"
    );
}

#[test]
fn cliques_a_burst_of_losses_left_skewed_are_rebalanced() {
    burst_of_losses_is_rebalanced(None);
}

#[test]
fn cliques_a_burst_of_losses_left_skewed_are_rebalanced_within_zones() {
    // Even members in zone-1, odd in zone-2: each zone's five hold all ten classes, and make one
    // clique. Losing three of one leaves a clique of seven and, once the replacements are in, one
    // of three missing four classes, unless a member of the first zone moves back.
    burst_of_losses_is_rebalanced(Some(|id| if id % 2 == 0 { "zone-1" } else { "zone-2" }));
}

/// Ten members holding two classes each, in two cliques of five that each hold all ten (in the
/// zones `zone_of` puts them in, if any): a node lost with three of one clique and another
/// member lost, the cliques end as balanced as they began, every clique in one zone.
fn burst_of_losses_is_rebalanced(zone_of: Option<fn(u32) -> &'static str>) {
    let mut spec = spec();
    spec.replicas.target = 10;
    spec.replicas.max = 10;
    spec.topology.clique_size = Some(5);
    let mut w = World::new(spec);
    let place = |w: &mut World, id: u32| {
        if let Some(zone_of) = zone_of {
            w.schedule(id, &format!("node-{id}"));
            w.observed.members.get_mut(&id).unwrap().zone = Some(zone_of(id).into());
        }
    };
    let join = |w: &mut World, id: u32| {
        let classes = [(2 * id) % 10, (2 * id + 1) % 10];
        w.observed.members.get_mut(&id).unwrap().join = Some(Arc::new(JoinReport {
            member_id: id,
            label_histogram: (0..10)
                .map(|c| u64::from(classes.contains(&c)) * 40)
                .collect(),
            proxy_vector: None,
        }));
    };
    w.plan();
    for id in 0..10 {
        place(&mut w, id);
        join(&mut w, id);
    }
    w.plan();
    let t = w.state.topology.clone().unwrap();
    assert_eq!(
        murmur_core::topology::measures::clique_skew(&t)
            .unwrap()
            .max,
        0.0
    );
    assert_cliques_keep_to_one_zone(&t, "at the start");
    let clique = |id| t.clique_of(id).unwrap();
    // A node dies with three members of one clique, and one of the other is evicted: the
    // first clique's remnant of two is dissolved into the second.
    let hit: Vec<u32> = (0..10)
        .filter(|&id| clique(id) == clique(0))
        .take(3)
        .collect();
    let other = (0..10).find(|&id| clique(id) != clique(0)).unwrap();
    w.now = 30.0;
    for &id in hit.iter().chain([&other]) {
        w.end(id, preempted());
    }
    w.plan();
    assert!(!World::reasons(&w.actions).contains(&"CliquesRebalanced"));
    // The replacements join one at a time, and the cliques they fill lack classes.
    let mut rebalanced = Vec::new();
    for &id in hit.iter().chain([&other]) {
        place(&mut w, id);
        join(&mut w, id);
        let actions = w.plan();
        if World::reasons(&actions).contains(&"CliquesRebalanced") {
            rebalanced.push(id);
        }
    }
    assert!(!rebalanced.is_empty(), "the cliques were never rebalanced");
    let t = w.state.topology.as_ref().unwrap();
    assert_eq!(t.graph.member_count(), 10);
    let skew = murmur_core::topology::measures::clique_skew(t).unwrap().max;
    assert!(
        skew < 1e-9,
        "the worst clique's skew is {skew}: {:?}",
        cliques_and_zones(t)
    );
    assert_cliques_keep_to_one_zone(t, "after the losses");
}

#[test]
fn a_large_job_is_created_a_burst_per_plan_and_the_next_plan_is_due_at_once() {
    let mut spec = spec();
    spec.replicas.target = 2 * CREATES_PER_PLAN as u32 + 7;
    spec.replicas.max = spec.replicas.target;
    let mut w = World::new(spec);
    let creates = |actions: &[Action]| -> Vec<u32> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Create { member, .. } => Some(*member),
                _ => None,
            })
            .collect()
    };
    let first = creates(&w.plan());
    assert_eq!(first, (0..CREATES_PER_PLAN as u32).collect::<Vec<_>>());
    let due = next_deadline(&w.spec, &w.state, &w.observed, at(w.now)).unwrap();
    assert!(due <= at(w.now + 0.01), "{due}");
    w.now = 1.0;
    let second = creates(&w.plan());
    assert_eq!(second.len(), CREATES_PER_PLAN);
    assert_eq!(second[0], CREATES_PER_PLAN as u32);
    w.now = 2.0;
    assert_eq!(creates(&w.plan()).len(), 7);
    // All created: the next deadline is the join grace's, not now.
    assert_eq!(
        next_deadline(&w.spec, &w.state, &w.observed, at(w.now)),
        Some(at(JOIN_GRACE_SECONDS))
    );
    w.now = 3.0;
    assert!(creates(&w.plan()).is_empty());
}

/// `spec.suspend` in each phase a job has before it ends: every live member stops, nothing is
/// created while it stays suspended, no stop counts as a restart or a preemption, and resuming
/// creates every member again.
#[test]
fn suspend_is_honoured_in_every_phase_before_the_end_and_resuming_starts_every_member() {
    let before_any_member = || World::new(spec());
    let waiting_for_nodes = || {
        let mut w = World::new(spec());
        w.pending = true;
        w.plan();
        w
    };
    let degraded = || {
        let mut w = World::running();
        w.pending = true;
        w.end(
            3,
            Exit::Preempted {
                reason: "node gone".into(),
            },
        );
        w.now = 1.0;
        w.plan();
        w
    };
    let scenes: [(JobPhase, fn() -> World); 4] = [
        (JobPhase::Pending, before_any_member),
        (JobPhase::Pending, waiting_for_nodes),
        (JobPhase::Running, World::running),
        (JobPhase::Degraded, degraded),
    ];
    for (phase, scene) in scenes {
        let mut w = scene();
        assert_eq!(w.state.phase, phase, "the scene reaches its phase");
        let live: Vec<(u32, u32)> = w
            .observed
            .members
            .iter()
            .filter(|(_, m)| m.is_live())
            .map(|(&id, m)| (id, m.attempt))
            .collect();
        let counted = (w.state.restarts, w.state.preemption_count());
        w.spec.suspend = true;
        w.now += 10.0;
        let actions = w.plan();
        assert_eq!(World::stops(&actions), live, "suspended when {phase:?}");
        assert!(World::creates(&actions).is_empty(), "when {phase:?}");
        assert!(World::reasons(&actions).contains(&"Suspended"));
        assert_eq!(w.state.phase, JobPhase::Suspended);
        // The stopped members end; a suspended job starts none of them again, however long.
        for _ in 0..3 {
            w.now += 1000.0;
            assert!(World::creates(&w.plan()).is_empty(), "when {phase:?}");
            assert_eq!(w.state.phase, JobPhase::Suspended);
        }
        assert!(w.observed.members.values().all(|m| !m.is_live()));
        assert_eq!(
            (w.state.restarts, w.state.preemption_count()),
            counted,
            "a stop on suspend is neither a restart nor a preemption (when {phase:?})"
        );
        w.spec.suspend = false;
        w.now += 1.0;
        let actions = w.plan();
        let mut resumed: Vec<u32> = World::creates(&actions).iter().map(|c| c.0).collect();
        resumed.sort_unstable();
        assert_eq!(resumed, vec![0, 1, 2, 3], "resumed from {phase:?}");
        assert!(World::reasons(&actions).contains(&"Resumed"));
        assert_ne!(w.state.phase, JobPhase::Suspended);
        assert_eq!((w.state.restarts, w.state.preemption_count()), counted);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    /// Walking the sorted maps side by side finds what a lookup per member finds: the record,
    /// and the current attempt when it is observed live, for ids with and without either.
    #[test]
    fn current_members_walked_in_order_are_those_looked_up(
        records in proptest::collection::btree_map(0u32..40, 0u32..3, 0..30),
        observed in proptest::collection::btree_map(0u32..40, (0u32..3, any::<bool>()), 0..30),
        ids in proptest::collection::btree_set(0u32..45, 0..40),
    ) {
        let records: BTreeMap<MemberId, MemberRecord> = records
            .into_iter()
            .map(|(id, attempt)| (id, MemberRecord { attempt, ..Default::default() }))
            .collect();
        let observed = Observation {
            members: observed
                .into_iter()
                .map(|(id, (attempt, live))| {
                    let exit = (!live).then(|| Exit::Preempted { reason: "spot".into() });
                    (id, ObservedMember { attempt, exit, ..Default::default() })
                })
                .collect(),
        };
        let walked: Vec<_> = observed
            .current(ids.iter().copied(), &records)
            .map(|c| (c.id, c.record.map(|r| r.attempt), c.live.map(|m| m.attempt)))
            .collect();
        let looked_up: Vec<_> = ids
            .iter()
            .map(|&id| {
                let record = records.get(&id);
                let attempt = record.map_or(0, |r| r.attempt);
                (id, record.map(|r| r.attempt), observed.live(id, attempt).map(|m| m.attempt))
            })
            .collect();
        prop_assert_eq!(walked, looked_up);
        let recorded: Vec<_> = observed.recorded(&records).map(|c| c.id).collect();
        prop_assert_eq!(recorded, records.keys().copied().collect::<Vec<_>>());
    }
}

#[test]
fn a_plan_shares_the_topology_it_leaves_as_it_was_and_copies_the_one_it_changes() {
    let mut w = World::running();
    let built = w.state.topology.clone().expect("built from the joins");
    w.now += 1.0;
    w.plan();
    let kept = w.state.topology.clone().unwrap();
    assert!(
        Arc::ptr_eq(&built, &kept),
        "nothing changed: the same topology"
    );
    w.end(1, preempted());
    w.now += 1.0;
    w.plan();
    let repaired = w.state.topology.clone().unwrap();
    assert!(!Arc::ptr_eq(&kept, &repaired));
    assert!(!repaired.graph.contains(1), "the lost member left");
    assert!(repaired.version > kept.version);
    assert!(
        kept.graph.contains(1),
        "the earlier state's topology is as it was: a plan changes a copy"
    );
}
