//! Table tests for the API: every CEL rule, the loader's errors, and the CRD's shape.

use super::*;

const VALID: &str = r#"
apiVersion: murmur.dev/v1alpha1
kind: DecentralizedTrainingJob
metadata: {name: job}
spec:
  replicas: {min: 2, target: 4, max: 8}
  topology: {kind: dCliques, cliqueSize: 4, interClique: smallWorld}
  algorithm: {kind: cliqueAveraging, averageEvery: 1, roundTimeout: 5s}
  training:
    model: mlp
    partition: {kind: classesPerMember, k: 1}
    steps: 100
"#;

/// Parse VALID after replacing one line (`from` must occur exactly once).
fn with(from: &str, to: &str) -> Result<DecentralizedTrainingJob, ManifestError> {
    assert_eq!(
        VALID.matches(from).count(),
        1,
        "fixture has no unique {from:?}"
    );
    parse_manifest(&VALID.replace(from, to), "job.yaml")
}

fn rejected_fields(from: &str, to: &str) -> Vec<String> {
    match with(from, to) {
        Ok(_) => panic!("{to:?} was accepted"),
        Err(e) => {
            let fields: Vec<String> = e.fields().iter().map(|f| f.to_string()).collect();
            assert!(!fields.is_empty(), "error names no field: {e}");
            let text = e.to_string();
            assert!(
                text.starts_with("job.yaml: "),
                "error names no file: {text}"
            );
            fields
        }
    }
}

#[test]
fn the_valid_fixture_is_valid_and_defaults_are_filled() {
    let job = with("steps: 100", "steps: 100").unwrap();
    assert_eq!(job.spec.replicas.target, 4);
    assert_eq!(job.spec.training.batch_size, 32);
    assert_eq!(job.spec.trainer.image, None, "the operator picks it");
    assert_eq!(job.spec.scheduling.capacity, Capacity::PreferSpot);
    assert_eq!(job.spec.recovery.max_restarts, None, "no job-wide limit");
    assert_eq!(job.spec.recovery.max_restarts_per_member, 3);
    assert_eq!(job.spec.algorithm.round_timeout, Duration::from_secs(5));
}

#[test]
fn a_fully_connected_topology_takes_at_most_256_members_unless_moshpit_groups_them() {
    // Every view and every round of a complete graph grow with the job: at 10 000 members,
    // 50 million links and views of 9 999 peers each.
    let job = |max: u32, algorithm: &str| {
        let text = VALID
            .replace(
                "{min: 2, target: 4, max: 8}",
                &format!("{{min: 2, target: 4, max: {max}}}"),
            )
            .replace(
                "{kind: dCliques, cliqueSize: 4, interClique: smallWorld}",
                "{kind: fullyConnected}",
            )
            .replace("kind: cliqueAveraging", &format!("kind: {algorithm}"));
        parse_manifest(&text, "job.yaml")
    };
    job(256, "dpsgd").expect("256 members");
    for algorithm in ["dpsgd", "gossip", "asyncGossip"] {
        let e = job(257, algorithm).expect_err(algorithm);
        let fields: Vec<String> = e.fields().iter().map(|f| f.to_string()).collect();
        assert_eq!(fields, ["spec.replicas.max"], "{e}");
        assert!(e.to_string().contains("at most 256 members"), "{e}");
    }
    // Moshpit averages in groups of its grid, whatever the topology says.
    job(10_000, "moshpit").expect("Moshpit at 10 000 members");
}

#[test]
fn every_cel_rule_rejects_with_the_field_it_guards() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "{min: 2, target: 4, max: 8}",
            "{min: 0, target: 4, max: 8}",
            "spec.replicas.min",
        ),
        (
            "{min: 2, target: 4, max: 8}",
            "{min: 5, target: 4, max: 8}",
            "spec.replicas.target",
        ),
        (
            "{min: 2, target: 4, max: 8}",
            "{min: 2, target: 9, max: 8}",
            "spec.replicas.target",
        ),
        (
            "{min: 2, target: 4, max: 8}",
            "{min: 2, target: 4, max: 20000}",
            "spec.replicas.max",
        ),
        (
            "cliqueSize: 4,",
            "cliqueSize: 1,",
            "spec.topology.cliqueSize",
        ),
        (
            "cliqueSize: 4,",
            "cliqueSize: 9,",
            "spec.topology.cliqueSize",
        ),
        (
            "{kind: dCliques, cliqueSize: 4, interClique: smallWorld}",
            "{kind: ring, cliqueSize: 4}",
            "spec.topology.kind",
        ),
        (
            "{kind: dCliques, cliqueSize: 4, interClique: smallWorld}",
            "{kind: ring, clumps: 3}",
            "spec.topology.kind",
        ),
        (
            "{kind: dCliques, cliqueSize: 4, interClique: smallWorld}",
            "{kind: proxyClumps, clumps: 0}",
            "spec.topology.clumps",
        ),
        (
            "{kind: dCliques, cliqueSize: 4, interClique: smallWorld}",
            "{kind: dCliques, cliqueMix: homogeneous}",
            "spec.topology.kind",
        ),
        (
            "{kind: dCliques, cliqueSize: 4, interClique: smallWorld}",
            "{kind: exponential, interClique: ring}",
            "spec.topology.kind",
        ),
        (
            "{kind: dCliques, cliqueSize: 4, interClique: smallWorld}",
            "{kind: proxyClumps, cliqueMix: sideways}",
            "spec.topology.cliqueMix",
        ),
        (
            "{kind: dCliques, cliqueSize: 4, interClique: smallWorld}",
            "{kind: ring}",
            "spec.algorithm.kind",
        ),
        (
            "averageEvery: 1,",
            "averageEvery: 0,",
            "spec.algorithm.averageEvery",
        ),
        (
            "averageEvery: 1,",
            "averageEvery: sometimes,",
            "spec.algorithm.averageEvery",
        ),
        (
            "averageEvery: 1,",
            "averageEvery: 1000000000,",
            "spec.algorithm.averageEvery",
        ),
        (
            "averageEvery: 1,",
            "averageEvery: 5000000000,",
            "spec.algorithm.averageEvery",
        ),
        (
            "averageEvery: 1,",
            "averageEvery: 2, auto: {maxEvery: 4},",
            "spec.algorithm.auto",
        ),
        (
            "averageEvery: 1,",
            "averageEvery: auto, auto: {maxEvery: 0},",
            "spec.algorithm.auto.maxEvery",
        ),
        (
            "averageEvery: 1,",
            "averageEvery: auto, auto: {targetSkew: 0},",
            "spec.algorithm.auto.targetSkew",
        ),
        (
            "{kind: cliqueAveraging, averageEvery: 1,",
            "{kind: gossip, averageEvery: auto,",
            "spec.algorithm.averageEvery",
        ),
        (
            "topology: {kind: dCliques, cliqueSize: 4, interClique: smallWorld}\n  algorithm: {kind: cliqueAveraging, averageEvery: 1,",
            "topology: {kind: exponentialOnePeer}\n  algorithm: {kind: dpsgd, averageEvery: auto,",
            "spec.algorithm.averageEvery",
        ),
        (
            "{kind: cliqueAveraging, averageEvery: 1,",
            "{kind: asyncGossip, maxStaleness: 0, averageEvery: 1,",
            "spec.algorithm.maxStaleness",
        ),
        (
            "{kind: cliqueAveraging, averageEvery: 1,",
            "{kind: asyncGossip, maxStaleness: 1001, averageEvery: 1,",
            "spec.algorithm.maxStaleness",
        ),
        (
            "{kind: cliqueAveraging, averageEvery: 1,",
            "{kind: dpsgd, maxStaleness: 4, averageEvery: 1,",
            "spec.algorithm.maxStaleness",
        ),
        (
            "{kind: cliqueAveraging, averageEvery: 1, roundTimeout: 5s}",
            "{kind: asyncGossip, averageEvery: 1, roundTimeout: 5s, compression: {kind: topK, ratio: 0.01}}",
            "spec.algorithm.compression.kind",
        ),
        (
            "{kind: cliqueAveraging, averageEvery: 1,",
            "{kind: asyncGossip, averageEvery: auto,",
            "spec.algorithm.averageEvery",
        ),
        (
            "roundTimeout: 5s}",
            "roundTimeout: 5s, compression: {kind: topK}}",
            "spec.algorithm.compression.ratio",
        ),
        (
            "roundTimeout: 5s}",
            "roundTimeout: 5s, compression: {kind: topK, ratio: 0}}",
            "spec.algorithm.compression.ratio",
        ),
        (
            "roundTimeout: 5s}",
            "roundTimeout: 5s, compression: {kind: topK, ratio: 1.5}}",
            "spec.algorithm.compression.ratio",
        ),
        (
            "roundTimeout: 5s}",
            "roundTimeout: 5s, compression: {kind: fp16, ratio: 0.5}}",
            "spec.algorithm.compression.ratio",
        ),
        (
            "roundTimeout: 5s}",
            "roundTimeout: 5s, groupSize: 4}",
            "spec.algorithm.groupSize",
        ),
        (
            "{kind: cliqueAveraging,",
            "{kind: moshpit, groupSize: 1,",
            "spec.algorithm.groupSize",
        ),
        (
            "steps: 100",
            "steps: 100\n    epochs: 2",
            "spec.training.steps",
        ),
        ("steps: 100", "batchSize: 32", "spec.training.steps"),
        ("steps: 100", "steps: 0", "spec.training.steps"),
        ("steps: 100", "epochs: 0", "spec.training.epochs"),
        (
            "steps: 100",
            "steps: 100\n    batchSize: 0",
            "spec.training.batchSize",
        ),
        (
            "steps: 100",
            "steps: 100\n    learningRate: 0",
            "spec.training.learningRate",
        ),
        (
            "steps: 100",
            "steps: 100\n    learningRate: -0.1",
            "spec.training.learningRate",
        ),
        (
            "{kind: classesPerMember, k: 1}",
            "{kind: classesPerMember}",
            "spec.training.partition.k",
        ),
        (
            "{kind: classesPerMember, k: 1}",
            "{kind: classesPerMember, k: 0}",
            "spec.training.partition.k",
        ),
        (
            "{kind: classesPerMember, k: 1}",
            "{kind: dirichlet, alpha: 0}",
            "spec.training.partition.alpha",
        ),
        (
            "{kind: classesPerMember, k: 1}",
            "{kind: shards}",
            "spec.training.partition.perMember",
        ),
        (
            "{kind: classesPerMember, k: 1}",
            "{kind: iid, alpha: 0.5}",
            "spec.training.partition.kind",
        ),
        (
            "steps: 100",
            "steps: 100\n    dataset: {source: idx}",
            "spec.training.dataset.path",
        ),
        (
            "steps: 100",
            "steps: 100\n    dataset: {source: embedded, path: /x}",
            "spec.training.dataset.path",
        ),
        (
            "steps: 100",
            "steps: 100\n    optimizer: {kind: sgd, momentum: 1.0}",
            "spec.training.optimizer.momentum",
        ),
        (
            "steps: 100",
            "steps: 100\n    optimizer: {kind: adam, momentum: 0.9}",
            "spec.training.optimizer.momentum",
        ),
        (
            "steps: 100",
            "steps: 100\n  trainer: {backend: cuda}",
            "spec.trainer.backend",
        ),
        (
            "steps: 100",
            "steps: 100\n  trainer: {backend: cuda, resources: {gpus: 0}}",
            "spec.trainer.backend",
        ),
        (
            "steps: 100",
            "steps: 100\n  trainer: {resources: {gpus: 17}}",
            "spec.trainer.resources.gpus",
        ),
        (
            "steps: 100",
            "steps: 100\n  scheduling: {capacity: onDemand, fallbackToOnDemandAfter: 5m}",
            "spec.scheduling.fallbackToOnDemandAfter",
        ),
        (
            "steps: 100",
            "steps: 100\n  recovery: {maxRestarts: -1}",
            "spec.recovery.maxRestarts",
        ),
        (
            "steps: 100",
            "steps: 100\n  checkpoint: {everySteps: 0}",
            "spec.checkpoint.everySteps",
        ),
        (
            "steps: 100",
            "steps: 100\n  checkpoint: {everySteps: 10, volume: {kind: persistentVolumeClaim}}",
            "spec.checkpoint.volume.claimName",
        ),
        (
            "steps: 100",
            "steps: 100\n  checkpoint: {everySteps: 10, volume: {kind: emptyDir, claimName: x}}",
            "spec.checkpoint.volume.claimName",
        ),
        (
            "steps: 100",
            "steps: 100\n  ttlSecondsAfterFinished: -5",
            "spec.ttlSecondsAfterFinished",
        ),
        (
            "steps: 100",
            "steps: 100\n    dataset: {source: csv, path: /VERYLONG}",
            "spec.training.dataset.path",
        ),
        (
            "steps: 100",
            "steps: 100\n    dataset: {source: text, path: /t}",
            "spec.training.partition.kind",
        ),
        (
            "steps: 100",
            "steps: 100\n    dataset: {source: text, path: /t}",
            "spec.topology.kind",
        ),
        (
            "steps: 100",
            "steps: 100\n    dataset: {source: embedded, shape: [28, 28]}",
            "spec.training.dataset.shape",
        ),
        (
            "steps: 100",
            "steps: 100\n    dataset: {source: csv, path: /d, shape: []}",
            "spec.training.dataset.shape",
        ),
        (
            "steps: 100",
            "steps: 100\n    dataset: {source: csv, path: /d, shape: [3, 0]}",
            "spec.training.dataset.shape",
        ),
        (
            "model: mlp",
            "model: gnLenet\n    dataset: {source: idx, path: /d, shape: [3, 32, 32]}",
            "spec.training.dataset.shape",
        ),
        (
            "roundTimeout: 5s}",
            "roundTimeout: 5s, outer: {localSteps: 0}}",
            "spec.algorithm.outer.localSteps",
        ),
        (
            "roundTimeout: 5s}",
            "roundTimeout: 5s, outer: {localSteps: 100001}}",
            "spec.algorithm.outer.localSteps",
        ),
        (
            "roundTimeout: 5s}",
            "roundTimeout: 5s, outer: {localSteps: 10, learningRate: 0}}",
            "spec.algorithm.outer.learningRate",
        ),
        (
            "roundTimeout: 5s}",
            "roundTimeout: 5s, outer: {localSteps: 10, learningRate: 10.5}}",
            "spec.algorithm.outer.learningRate",
        ),
        (
            "roundTimeout: 5s}",
            "roundTimeout: 5s, outer: {localSteps: 10, momentum: 1}}",
            "spec.algorithm.outer.momentum",
        ),
        (
            "roundTimeout: 5s}",
            "roundTimeout: 5s, outer: {localSteps: 10, momentum: -0.1}}",
            "spec.algorithm.outer.momentum",
        ),
        (
            "{kind: cliqueAveraging, averageEvery: 1, roundTimeout: 5s}",
            "{kind: asyncGossip, roundTimeout: 5s, outer: {localSteps: 10}}",
            "spec.algorithm.outer",
        ),
        (
            "{kind: cliqueAveraging, averageEvery: 1, roundTimeout: 5s}",
            "{kind: cliqueAveraging, averageEvery: 2, roundTimeout: 5s, outer: {localSteps: 10}}",
            "spec.algorithm.averageEvery",
        ),
        (
            "roundTimeout: 5s}",
            "roundTimeout: 5s, outer: {localSteps: 101}}",
            "spec.algorithm.outer.localSteps",
        ),
        (
            "{kind: cliqueAveraging, averageEvery: 1, roundTimeout: 5s}",
            "{kind: asyncGossip, roundTimeout: 5s, overlap: true}",
            "spec.algorithm.overlap",
        ),
        (
            "roundTimeout: 5s}",
            "roundTimeout: 5s, outer: {localSteps: 8, overlapSteps: 9}, overlap: true}",
            "spec.algorithm.outer.overlapSteps",
        ),
        (
            "roundTimeout: 5s}",
            "roundTimeout: 5s, outer: {localSteps: 8, overlapSteps: 0}, overlap: true}",
            "spec.algorithm.outer.overlapSteps",
        ),
        (
            "{kind: cliqueAveraging, averageEvery: 1, roundTimeout: 5s}",
            "{kind: dpsgd, averageEvery: auto, roundTimeout: 5s, overlap: true}",
            "spec.algorithm.overlap",
        ),
        ("{name: job}", "{name: Job_1}", "metadata.name"),
        ("{name: job}", "{}", "metadata.name"),
        (
            "{name: job}",
            "{name: a-very-long-job-name-that-will-not-fit-into-pod-names-x}",
            "metadata.name",
        ),
    ];
    for (from, to, field) in cases {
        let to = &to.replace("VERYLONG", &"x".repeat(5000));
        let fields = rejected_fields(from, to);
        assert!(
            fields.iter().any(|f| f == field),
            "{to:?}: expected a violation of {field}, got {fields:?}"
        );
    }
}

#[test]
fn the_boundaries_of_each_rule_are_accepted() {
    for (from, to) in [
        (
            "model: mlp",
            "model: mlp\n    dataset: {source: csv, path: /d, shape: [3, 32, 32]}",
        ),
        (
            "model: mlp",
            "model: gnLenet\n    dataset: {source: idx, path: /d, shape: [1, 28, 28]}",
        ),
        ("{min: 2, target: 4, max: 8}", "{min: 4, target: 4, max: 4}"),
        ("cliqueSize: 4,", "cliqueSize: 2,"),
        (
            "{kind: dCliques, cliqueSize: 4, interClique: smallWorld}",
            "{kind: proxyClumps, clumps: 3, interClique: ring, cliqueMix: homogeneous}",
        ),
        (
            "roundTimeout: 5s}",
            "roundTimeout: 5s, compression: {kind: topK, ratio: 1}}",
        ),
        (
            "roundTimeout: 5s}",
            "roundTimeout: 5s, compression: {kind: int8}}",
        ),
        ("steps: 100", "epochs: 1"),
        (
            "roundTimeout: 5s}",
            "roundTimeout: 5s, outer: {localSteps: 1, learningRate: 10, momentum: 0}}",
        ),
        (
            "roundTimeout: 5s}",
            "roundTimeout: 5s, outer: {localSteps: 100, optimizer: sgd, momentum: 0.99}}",
        ),
        (
            "roundTimeout: 5s}",
            "roundTimeout: 5s, outer: {localSteps: 10, overlapSteps: 10}, overlap: true}",
        ),
        (
            "{kind: cliqueAveraging, averageEvery: 1, roundTimeout: 5s}",
            "{kind: dpsgd, averageEvery: 4, roundTimeout: 5s, overlap: true}",
        ),
        // With epochs, not steps, only the trainer knows the run's length.
        (
            "roundTimeout: 5s}\n  training:\n    model: mlp\n    partition: {kind: classesPerMember, k: 1}\n    steps: 100",
            "roundTimeout: 5s, outer: {localSteps: 100000}}\n  training:\n    model: mlp\n    partition: {kind: classesPerMember, k: 1}\n    epochs: 1",
        ),
        ("averageEvery: 1,", "averageEvery: auto,"),
        (
            "averageEvery: 1,",
            "averageEvery: auto, auto: {maxEvery: 1000, targetSkew: 1},",
        ),
        ("averageEvery: 1,", "averageEvery: '7',"),
        ("averageEvery: 1,", "averageEvery: 999999999,"),
        (
            "{kind: cliqueAveraging, averageEvery: 1, roundTimeout: 5s}",
            "{kind: asyncGossip, maxStaleness: 1000, averageEvery: 1, roundTimeout: 5s, compression: {kind: int8}}",
        ),
        (
            "{kind: cliqueAveraging, averageEvery: 1,",
            "{kind: asyncGossip, maxStaleness: 1, averageEvery: 3,",
        ),
        (
            "steps: 100",
            "steps: 100\n  trainer: {backend: cuda, resources: {gpus: 1}}",
        ),
        (
            "steps: 100",
            "steps: 100\n  checkpoint: {everySteps: 1, volume: {kind: persistentVolumeClaim, claimName: ckpt}}",
        ),
    ] {
        if let Err(e) = with(from, to) {
            panic!("{to:?} was rejected: {e}");
        }
    }
}

#[test]
fn average_every_reads_a_number_or_auto_and_writes_them_back() {
    let every = |text: &str| with("averageEvery: 1,", text).unwrap().spec.algorithm;
    assert_eq!(
        every("averageEvery: 3,").average_every,
        AverageEvery::Steps(3)
    );
    assert_eq!(
        every("averageEvery: '3',").average_every,
        AverageEvery::Steps(3)
    );
    let auto = every("averageEvery: auto, auto: {maxEvery: 8},");
    assert_eq!(auto.average_every, AverageEvery::Auto);
    assert_eq!(auto.auto.and_then(|a| a.max_every), Some(8));
    assert_eq!(
        serde_json::to_value(AverageEvery::Auto).unwrap(),
        serde_json::json!("auto")
    );
    assert_eq!(
        serde_json::to_value(AverageEvery::Steps(4)).unwrap(),
        serde_json::json!(4)
    );
    let err = with("averageEvery: 1,", "averageEvery: often,").unwrap_err();
    assert!(err.to_string().contains("\"auto\""), "{err}");
}

#[test]
fn type_errors_name_the_field_path() {
    let err = with(
        "{min: 2, target: 4, max: 8}",
        "{min: two, target: 4, max: 8}",
    )
    .unwrap_err();
    assert_eq!(err.fields(), vec!["spec.replicas.min"], "{err}");
    let err = with("roundTimeout: 5s}", "roundTimeout: soon}").unwrap_err();
    assert_eq!(err.fields(), vec!["spec.algorithm.roundTimeout"]);
    assert!(err.to_string().contains("invalid duration"), "{err}");
    let err = with("model: mlp", "model: resnet").unwrap_err();
    assert_eq!(err.fields(), vec!["spec.training.model"]);
    let err = with(
        "{kind: dCliques, cliqueSize: 4, interClique: smallWorld}",
        "{cliqueSize: 4, interClique: smallWorld}",
    )
    .unwrap_err();
    assert_eq!(err.fields(), vec!["spec.topology"], "{err}");
    assert!(err.to_string().contains("kind"), "{err}");
    // The model is the built-in MLP unless named: a trainer of its own task needs none.
    let job = with("model: mlp", "").unwrap();
    assert_eq!(job.spec.training.model, ModelKind::Mlp);
}

#[test]
fn unknown_fields_are_named_rather_than_silently_dropped() {
    let err = with("cliqueSize: 4,", "cliqeSize: 4,").unwrap_err();
    assert!(matches!(err, ManifestError::UnknownFields { .. }), "{err}");
    assert_eq!(err.fields(), vec!["spec.topology.cliqeSize"]);
}

#[test]
fn yaml_syntax_and_wrong_kind_are_reported() {
    let err = parse_manifest("spec: [unclosed", "broken.yaml").unwrap_err();
    assert!(matches!(err, ManifestError::Yaml { .. }));
    assert!(
        err.to_string().starts_with("broken.yaml: not valid YAML"),
        "{err}"
    );
    let err = parse_manifest(
        &VALID.replace("kind: DecentralizedTrainingJob", "kind: Job"),
        "x.yaml",
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("found apiVersion murmur.dev/v1alpha1 and kind Job"),
        "{err}"
    );
    let err = parse_manifest("- 1\n- 2\n", "list.yaml").unwrap_err();
    assert!(matches!(err, ManifestError::WrongKind { .. }));
    let err = load_manifest(std::path::Path::new("/nonexistent/job.yaml")).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("/nonexistent/job.yaml: cannot read"),
        "{err}"
    );
}

#[test]
fn fields_that_cannot_change_mid_run_are_immutable() {
    let old = with("steps: 100", "steps: 100").unwrap();
    // Growing the job and the stopping target are fine mid-run.
    let grown = with("{min: 2, target: 4, max: 8}", "{min: 2, target: 6, max: 8}").unwrap();
    manifest::validate_update(&grown, &old).unwrap();
    for (from, to, field) in [
        ("model: mlp", "model: gnLenet", "spec.training.model"),
        (
            "{kind: classesPerMember, k: 1}",
            "{kind: classesPerMember, k: 2}",
            "spec.training.partition",
        ),
        (
            "steps: 100",
            "steps: 100\n    seed: 9",
            "spec.training.seed",
        ),
        (
            "steps: 100",
            "steps: 100\n    dataset: {source: csv, path: /d}",
            "spec.training.dataset",
        ),
        (
            "{kind: cliqueAveraging,",
            "{kind: dpsgd,",
            "spec.algorithm.kind",
        ),
        (
            "{kind: dCliques, cliqueSize: 4, interClique: smallWorld}",
            "{kind: proxyClumps}",
            "spec.topology.kind",
        ),
        (
            "roundTimeout: 5s}",
            "roundTimeout: 5s, outer: {localSteps: 10}}",
            "spec.algorithm.outer",
        ),
    ] {
        let new = with(from, to).unwrap();
        let violations = manifest::validate_update(&new, &old).unwrap_err();
        assert!(
            violations.iter().any(|v| v.field == field),
            "changing {field}: got {violations:?}"
        );
    }
}

#[test]
fn every_example_manifest_is_valid() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/examples");
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let job = load_manifest(&path).unwrap_or_else(|e| panic!("{e}"));
            seen.push((
                job.spec.topology.kind,
                job.spec.trainer.backend,
                job.spec.scheduling.capacity,
            ));
        }
    }
    assert!(seen.contains(&(TopologyKind::Ring, Backend::Cpu, Capacity::OnDemand)));
    assert!(seen.contains(&(TopologyKind::DCliques, Backend::Cpu, Capacity::Spot)));
    assert!(seen.contains(&(TopologyKind::ProxyClumps, Backend::Cuda, Capacity::Spot)));
}

#[test]
fn crd_in_the_repo_matches_the_rust_types() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../crds/decentralizedtrainingjobs.murmur.dev.yaml");
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == crd_yaml(),
        "{} is out of date: regenerate it with `cargo run -p murmur -- crd > crds/decentralizedtrainingjobs.murmur.dev.yaml`",
        path.display()
    );
}

#[test]
fn crd_has_the_advertised_shape() {
    let crd = super::crd();
    assert_eq!(crd.spec.group, "murmur.dev");
    assert_eq!(crd.spec.scope, "Namespaced");
    assert_eq!(
        crd.spec.names.short_names.as_deref(),
        Some(&["dtj".to_string()][..])
    );
    let version = &crd.spec.versions[0];
    assert_eq!(version.name, "v1alpha1");
    assert!(version.subresources.as_ref().unwrap().status.is_some());
    let columns: Vec<&str> = version
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        columns,
        ["Phase", "Members", "Topology", "Step", "Preemptions", "Age"]
    );
    let schema = serde_json::to_value(version.schema.as_ref().unwrap()).unwrap();
    let conditions = &schema["openAPIV3Schema"]["properties"]["status"]["properties"]["conditions"];
    assert_eq!(conditions["x-kubernetes-list-type"], "map");
    assert_eq!(conditions["x-kubernetes-list-map-keys"][0], "type");
    let rules = crd_yaml().matches("rule: ").count();
    assert!(rules >= 30, "only {rules} CEL rules in the CRD");
}

/// The API server warns on every apply of a CRD whose schema has a format it does not know
/// (apiextensions-apiserver's `validation/formats.go`: for integers only `int32` and `int64`).
#[test]
fn every_format_in_the_crd_is_one_the_api_server_knows() {
    fn formats(v: &serde_json::Value, path: &str, out: &mut Vec<(String, String, String)>) {
        match v {
            serde_json::Value::Object(map) => {
                if let (Some(kind), Some(format)) = (
                    map.get("type").and_then(|t| t.as_str()),
                    map.get("format").and_then(|f| f.as_str()),
                ) {
                    out.push((path.to_string(), kind.to_string(), format.to_string()));
                }
                for (k, child) in map {
                    formats(child, &format!("{path}.{k}"), out);
                }
            }
            serde_json::Value::Array(items) => {
                for (i, child) in items.iter().enumerate() {
                    formats(child, &format!("{path}[{i}]"), out);
                }
            }
            _ => {}
        }
    }
    let crd = serde_json::to_value(super::crd()).unwrap();
    let mut found = Vec::new();
    formats(&crd, "", &mut found);
    assert!(found.len() > 20, "the schema has formats to check");
    for (path, kind, format) in &found {
        let known = match kind.as_str() {
            "integer" => ["int32", "int64"].contains(&format.as_str()),
            "number" => ["float", "double"].contains(&format.as_str()),
            "string" => ["date-time", "byte", "duration"].contains(&format.as_str()),
            _ => false,
        };
        assert!(
            known,
            "{path}: format {format} of a {kind} makes the API server warn"
        );
    }
    // Unsigned fields keep their range as bounds.
    let step = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
        ["progress"]["properties"]["step"];
    assert_eq!(step["format"], "int64", "{step}");
    assert_eq!(step["minimum"].as_f64(), Some(0.0), "{step}");
}

#[test]
fn a_failure_policy_decides_how_a_crash_counts() {
    let job = with(
        "steps: 100",
        "steps: 100\n  recovery:\n    failurePolicy:\n    - {action: FailJob, onExitCodes: {operator: In, values: [42]}}\n    - {action: Ignore, onExitCodes: {operator: In, values: [137]}}\n    - {action: Ignore, onPodConditions: [{type: ConfigIssue}]}",
    )
    .unwrap();
    let r = &job.spec.recovery;
    let none: &[(String, String)] = &[];
    assert_eq!(r.action_for(Some(42), none), FailureAction::FailJob);
    assert_eq!(r.action_for(Some(137), none), FailureAction::Ignore);
    assert_eq!(
        r.action_for(Some(1), none),
        FailureAction::Count,
        "no rule matches"
    );
    assert_eq!(
        r.action_for(None, none),
        FailureAction::Count,
        "a signal has no code"
    );
    let config = [("ConfigIssue".to_string(), "True".to_string())];
    assert_eq!(r.action_for(Some(1), &config), FailureAction::Ignore);
    let not_now = [("ConfigIssue".to_string(), "False".to_string())];
    assert_eq!(r.action_for(Some(1), &not_now), FailureAction::Count);
    let not_in = FailureRule {
        action: FailureAction::Count,
        on_exit_codes: Some(ExitCodeMatch {
            operator: ExitCodeOperator::NotIn,
            values: vec![1, 2],
        }),
        on_pod_conditions: Vec::new(),
    };
    assert!(not_in.matches(Some(3), none) && !not_in.matches(Some(2), none));
}

#[test]
fn a_failure_rule_names_one_thing_to_match_and_never_success() {
    for (rule, says) in [
        (
            "{action: Ignore}",
            "a rule names onExitCodes or onPodConditions",
        ),
        (
            "{action: Ignore, onExitCodes: {operator: In, values: [1]}, onPodConditions: [{type: X}]}",
            "a rule names onExitCodes or onPodConditions",
        ),
        (
            "{action: Count, onExitCodes: {operator: In, values: [0, 1]}}",
            "0 is success",
        ),
    ] {
        let err = with(
            "steps: 100",
            &format!("steps: 100\n  recovery: {{failurePolicy: [{rule}]}}"),
        )
        .unwrap_err();
        assert!(format!("{err:?}").contains(says), "{rule}: {err:?}");
    }
    let err = with(
        "steps: 100",
        "steps: 100\n  recovery: {maxRestartsPerMember: -1}",
    )
    .unwrap_err();
    assert!(
        format!("{err:?}").contains("maxRestartsPerMember"),
        "{err:?}"
    );
}

#[test]
fn text_is_accepted_with_partitions_and_topologies_that_need_no_classes() {
    let manifest = VALID
        .replace(
            "{kind: dCliques, cliqueSize: 4, interClique: smallWorld}",
            "{kind: ring}",
        )
        .replace("kind: cliqueAveraging,", "kind: dpsgd,")
        .replace("{kind: classesPerMember, k: 1}", "{kind: iid}")
        .replace(
            "steps: 100",
            "steps: 100\n    dataset: {source: text, path: /usr/share/common-licenses}",
        );
    let job = parse_manifest(&manifest, "job.yaml").unwrap();
    assert_eq!(job.spec.training.dataset.source, DatasetSource::Text);
}
