//! Gossip and Moshpit pick their peers anew every round; over TCP, every process must pick the
//! same ones, or rounds would stall on round timeouts. Real processes, no timeouts allowed.

mod support;

use std::time::Duration;

use murmur_core::api::TopologyKind;
use support::*;

fn manifest(topology: &str, algorithm: &str) -> String {
    format!(
        "\
apiVersion: murmur.dev/v1alpha1
kind: DecentralizedTrainingJob
metadata: {{name: loopback}}
spec:
  replicas: {{min: 2, target: 4, max: 4}}
  topology: {{kind: {topology}}}
  algorithm: {algorithm}
  training:
    model: mlp
    dataset: {{source: embedded}}
    partition: {{kind: iid}}
    seed: 13
    batchSize: 32
    optimizer: {{kind: sgd, momentum: 0.9}}
    learningRate: 0.05
    steps: 300
"
    )
}

/// Rounds in which a partner may still be starting.
const STARTING_ROUNDS: u64 = 5;

/// One job at a time: eight trainer processes on two cores would test the machine, not us.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn run(kind: TopologyKind, manifest: &str) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let job = LocalJob::new(4, kind, manifest);
    let mut procs = Reaper::default();
    for id in 0..4 {
        procs.0.push(job.spawn(id, 0, &[]));
    }
    procs.all_succeed(Duration::from_secs(180));
    for id in 0..4 {
        let lines = job.log(id, 0);
        // A partner may still be starting in the first rounds (its own neighbours not all up
        // yet, on a loaded machine); after that, no round may wait out a timeout.
        let timeouts: Vec<u64> = lines
            .iter()
            .filter(|l| l["fields"]["reason"] == "timeout")
            .filter_map(|l| l["fields"]["round"].as_u64())
            .filter(|&round| round >= STARTING_ROUNDS)
            .collect();
        assert!(
            timeouts.is_empty(),
            "member {id} waited out round timeouts in rounds {timeouts:?}"
        );
        assert!(
            logged(&lines, "first averaging round with peers").is_some(),
            "member {id} never averaged"
        );
        let done = logged(&lines, "done").expect("did not finish");
        assert!(
            done["accuracy"].as_f64().unwrap() >= 0.85,
            "member {id}: {done}"
        );
        // Where its time went: the waits for peers are a part of the training time.
        let (trained, waited) = (
            done["trained_seconds"].as_f64().unwrap(),
            done["waited_seconds"].as_f64().unwrap(),
        );
        assert!(trained > 0.0 && (0.0..trained).contains(&waited), "{done}");
    }
}

#[test]
fn gossip_partners_agree_across_processes() {
    run(
        TopologyKind::Ring,
        &manifest("ring", "{kind: gossip, roundTimeout: 5s}"),
    );
}

/// Overlapped rounds post before they collect: the posted round waits for no timeout either.
#[test]
fn overlapped_rounds_post_then_collect_without_a_timeout() {
    run(
        TopologyKind::Ring,
        &manifest("ring", "{kind: dpsgd, overlap: true, roundTimeout: 5s}"),
    );
    run(
        TopologyKind::Ring,
        &manifest(
            "ring",
            "{kind: dpsgd, overlap: true, outer: {localSteps: 8, overlapSteps: 4}, roundTimeout: 5s}",
        ),
    );
}

#[test]
fn moshpit_groups_agree_across_processes() {
    run(
        TopologyKind::FullyConnected,
        &manifest(
            "fullyConnected",
            "{kind: moshpit, groupSize: 2, roundTimeout: 5s}",
        ),
    );
}

#[test]
fn asynchronous_gossip_trains_on_past_a_member_killed_mid_run() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let job = LocalJob::new(
        4,
        TopologyKind::Ring,
        // The default bound (8): 4 dropped too many late replies on a loaded machine, and 16
        // let settled replies carry 16 steps of stale difference (one member ended at 0.64).
        &manifest(
            "ring",
            "{kind: asyncGossip, maxStaleness: 8, roundTimeout: 2s}",
        ),
    );
    let mut procs = Reaper::default();
    for id in 0..4 {
        procs.0.push(job.spawn(id, 0, &[]));
    }
    // Member 3 dies (no notice, no leave) once it is gossiping with its neighbours.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while logged(&job.log(3, 0), "first averaging round with peers").is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "member 3 never gossiped"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    procs.0[3].kill().unwrap();
    procs.all_but_succeed(&[3], Duration::from_secs(180));
    let mut abandoned = 0;
    for id in 0..3 {
        let lines = job.log(id, 0);
        // No rounds, so nothing is ever dropped from one: a dead neighbour's requests are
        // given up after maxStaleness steps, it is left alone for longer each time, and the
        // member gossips with the other.
        assert!(
            logged(&lines, "neighbour dropped from the round").is_none(),
            "member {id} waited on a round"
        );
        let last = lines
            .iter()
            .map(|l| &l["fields"])
            .rfind(|f| f["message"] == "progress")
            .expect("progress reported")
            .clone();
        assert!(
            last["settled"].as_u64().unwrap() >= 10,
            "member {id}: {last}"
        );
        assert!(
            last["abandoned"].as_u64().unwrap() < 30,
            "member {id} kept asking a dead member: {last}"
        );
        abandoned += last["abandoned"].as_u64().unwrap();
        // Trained (a member's own model, just after a local step: it scatters more than the
        // averaged ones of the synchronous tests above: 0.833 in one run of a few).
        let done = logged(&lines, "done").expect("did not finish");
        assert!(
            done["accuracy"].as_f64().unwrap() >= 0.75,
            "member {id}: {done}"
        );
    }
    // Members 0 and 2 had member 3 as a neighbour: each gave up on it at least once.
    assert!(abandoned >= 2, "{abandoned} requests given up");
}
