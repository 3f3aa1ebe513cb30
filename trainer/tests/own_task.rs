//! A task of one's own (`examples/own_task.rs`, built on the library's `Task` and `run_task`)
//! trained by four processes on a ring, as `murmur run --trainer` runs it: the algorithms,
//! state, status and logs are murmur's, the model, loss and data are the example's.

mod support;

use std::path::PathBuf;
use std::time::Duration;

use murmur_core::api::TopologyKind;
use support::*;

const MANIFEST: &str = "\
apiVersion: murmur.dev/v1alpha1
kind: DecentralizedTrainingJob
metadata: {name: quadrants}
spec:
  replicas: {min: 2, target: 4, max: 4}
  topology: {kind: ring}
  algorithm: {kind: dpsgd, averageEvery: 1, roundTimeout: 2s}
  training:
    model: mlp
    partition: {kind: classesPerMember, k: 1}
    seed: 3
    batchSize: 32
    optimizer: {kind: sgd, momentum: 0.9}
    learningRate: 0.05
    steps: 400
";

/// The example's binary: `cargo test` builds examples beside the test binaries' folder.
fn example() -> PathBuf {
    let deps = std::env::current_exe().unwrap();
    deps.parent()
        .and_then(|d| d.parent())
        .unwrap()
        .join("examples/own_task")
}

#[test]
fn a_task_of_ones_own_trains_across_members_with_one_class_each() {
    let mut job = LocalJob::new(4, TopologyKind::Ring, MANIFEST);
    job.trainer = example();
    assert!(
        job.trainer.is_file(),
        "{} not built (cargo test builds the examples)",
        job.trainer.display()
    );
    let mut procs = Reaper::default();
    for id in 0..4 {
        procs.0.push(job.spawn(id, 0, &[]));
    }
    procs.all_succeed(Duration::from_secs(240));
    for id in 0..4 {
        let lines = job.log(id, 0);
        let done = logged(&lines, "done").unwrap_or_else(|| panic!("member {id} never finished"));
        // Each member holds one of the two classes: alone it would call every point its class
        // (50%). Averaging with its neighbours is what teaches it the other.
        let accuracy = done["accuracy"].as_f64().unwrap();
        println!("member {id}: {accuracy:.4}");
        assert!(accuracy >= 0.9, "member {id}: accuracy {accuracy}");
        assert!(
            logged(&lines, "first averaging round with peers").is_some(),
            "member {id} never averaged"
        );
    }
}
