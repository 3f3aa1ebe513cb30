//! Real trainer processes on loopback: training over TCP through a SIGKILL and a restart.

mod support;

use std::time::{Duration, Instant};

use murmur_core::api::TopologyKind;
use support::*;

const MANIFEST: &str = "\
apiVersion: murmur.dev/v1alpha1
kind: DecentralizedTrainingJob
metadata: {name: loopback}
spec:
  replicas: {min: 2, target: 4, max: 4}
  topology: {kind: ring}
  algorithm: {kind: dpsgd, averageEvery: 1, roundTimeout: 2s}
  training:
    model: mlp
    dataset: {source: embedded}
    partition: {kind: iid}
    seed: 7
    batchSize: 32
    optimizer: {kind: sgd, momentum: 0.9}
    learningRate: 0.05
    steps: 600
";

const MEMBERS: u32 = 4;

/// Mean final accuracy of a finished run, from each process's "done" log line.
fn final_accuracy(job: &LocalJob, attempts: &[(u32, u32)]) -> f64 {
    let accs: Vec<f64> = attempts
        .iter()
        .map(|&(id, attempt)| {
            let lines = job.log(id, attempt);
            logged(&lines, "done")
                .unwrap_or_else(|| panic!("member {id} (attempt {attempt}) never logged done"))
                ["accuracy"]
                .as_f64()
                .unwrap()
        })
        .collect();
    accs.iter().sum::<f64>() / accs.len() as f64
}

#[test]
fn a_ring_trains_through_a_sigkill_and_a_restart() {
    // Undisturbed run.
    let calm = LocalJob::new(MEMBERS, TopologyKind::Ring, MANIFEST);
    let mut procs = Reaper::default();
    for id in 0..MEMBERS {
        procs.0.push(calm.spawn(id, 0, &[]));
    }
    for c in &mut procs.0 {
        let status = wait_exit(c, Duration::from_secs(240)).expect("a member hung");
        assert!(status.success(), "{status:?}");
    }
    let calm_accuracy = final_accuracy(&calm, &[(0, 0), (1, 0), (2, 0), (3, 0)]);
    println!("undisturbed: {calm_accuracy:.4}");
    assert!(
        calm_accuracy >= 0.85,
        "undisturbed accuracy {calm_accuracy}"
    );

    // Same seed; member 2 is SIGKILLed mid-run and restarted.
    let job = LocalJob::new(MEMBERS, TopologyKind::Ring, MANIFEST);
    let mut procs = Reaper::default();
    for id in 0..MEMBERS {
        procs.0.push(job.spawn(id, 0, &[]));
    }
    wait_for(Duration::from_secs(120), "step 100", || {
        job.step(0).is_some_and(|s| s >= 100)
    });
    procs.0[2].kill().unwrap();
    procs.0[2].wait().unwrap();
    let killed_at = Instant::now();
    let steps_then: Vec<u64> = [1, 3].iter().map(|&id| job.step(id).unwrap()).collect();
    // The survivors next to it keep training within one round timeout.
    wait_for(Duration::from_secs(2), "survivors to go on", || {
        [1, 3]
            .iter()
            .zip(&steps_then)
            .all(|(&id, &then)| job.step(id).is_some_and(|s| s > then + 1))
    });
    println!(
        "survivors stepped on {:?} after the kill",
        killed_at.elapsed()
    );

    // Replaced at once, as the control plane would: it must catch up mid-run.
    let replacement = job.spawn(2, 1, &[]);
    procs.0.push(replacement);
    for (i, c) in procs.0.iter_mut().enumerate() {
        if i == 2 {
            continue; // the killed one
        }
        let status = wait_exit(c, Duration::from_secs(240)).expect("a member hung");
        assert!(status.success(), "member process {i}: {status:?}");
    }
    let lines = job.log(2, 1);
    let transferred = logged(&lines, "state transferred from a neighbour")
        .expect("the replacement did not fetch state from a neighbour");
    let joined_at = transferred["step"].as_u64().unwrap();
    assert!(
        (100..500).contains(&joined_at),
        "joined at step {joined_at}"
    );
    let spawned = lines.first().expect("the replacement logged nothing")["timestamp"]
        .as_str()
        .unwrap()
        .to_string();
    let first = lines
        .iter()
        .find(|l| l["fields"]["message"] == "first averaging round with peers")
        .expect("the replacement never averaged with a peer");
    println!(
        "replacement: first log line {spawned}, first averaging round {}",
        first["timestamp"]
    );
    let survivors: Vec<_> = [1, 3].iter().map(|&id| job.log(id, 0)).collect();
    assert!(
        survivors.iter().all(|l| l.iter().any(|line| {
            line["fields"]["message"] == "neighbour dropped from the round"
                && line["fields"]["reason"] == "disconnected"
        })),
        "the survivors never dropped the killed member"
    );
    let accuracy = final_accuracy(&job, &[(0, 0), (1, 0), (2, 1), (3, 0)]);
    println!("with a SIGKILL and a restart: {accuracy:.4}");
    assert!(accuracy >= 0.85, "accuracy {accuracy}");
    assert!(
        (accuracy - calm_accuracy).abs() <= 0.01,
        "{accuracy} vs undisturbed {calm_accuracy}"
    );
}
