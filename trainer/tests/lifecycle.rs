//! A member's life with real processes: readiness, SIGTERM (the spot notice), whole-job loss
//! and resumption from checkpoints.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use murmur_core::api::{ModelKind, TopologyKind};
use murmur_core::contract::MemberView;
use murmur_core::contract::view::edge_agreement;
use murmur_trainer::algorithms::{Exchange, Payload, Purpose};
use murmur_trainer::model::{Model, layout};
use murmur_trainer::transport::{Agreements, Transport, TransportConfig, frame};
use support::*;

fn manifest(steps: u64, members: u32, checkpoint_every: Option<u64>) -> String {
    let checkpoint = checkpoint_every
        .map(|n| format!("  checkpoint: {{volume: {{kind: emptyDir}}, everySteps: {n}}}\n"))
        .unwrap_or_default();
    format!(
        "\
apiVersion: murmur.dev/v1alpha1
kind: DecentralizedTrainingJob
metadata: {{name: loopback}}
spec:
  replicas: {{min: 1, target: {members}, max: {members}}}
  topology: {{kind: ring}}
  algorithm: {{kind: dpsgd, roundTimeout: 2s}}
  training:
    model: mlp
    dataset: {{source: embedded}}
    partition: {{kind: iid}}
    seed: 11
    batchSize: 32
    optimizer: {{kind: sgd, momentum: 0.9}}
    learningRate: 0.05
    steps: {steps}
{checkpoint}"
    )
}

#[test]
fn a_member_is_ready_once_it_has_a_topology_and_leaves_on_sigterm() {
    let job = LocalJob::new(3, TopologyKind::Ring, &manifest(2_000, 3, Some(1_000)));
    let topology = job.dir.path().join("topology.json");
    let held_back = job.dir.path().join("topology.later");
    std::fs::rename(&topology, &held_back).unwrap();
    let ckpt = job.dir.path().join("checkpoints");
    let termination = job.dir.path().join("termination-log");
    let env = [
        ("MURMUR_CHECKPOINT_DIR", ckpt.display().to_string()),
        ("MURMUR_TERMINATION_LOG", termination.display().to_string()),
    ];
    let mut procs = Reaper::default();
    for id in 0..3 {
        procs.0.push(job.spawn(id, 0, &env));
    }
    // Alive but not ready: no topology yet.
    wait_for(Duration::from_secs(30), "healthz", || {
        job.get(0, "/healthz").is_some_and(|(c, _)| c == 200)
    });
    assert_eq!(job.get(0, "/readyz").unwrap().0, 503);
    assert_eq!(job.status(0).unwrap()["state"], "joining");
    std::fs::rename(&held_back, &topology).unwrap();
    wait_for(Duration::from_secs(30), "readiness", || {
        (0..3).all(|id| job.get(id, "/readyz").is_some_and(|(c, _)| c == 200))
    });
    wait_for(Duration::from_secs(60), "step 50", || {
        job.step(1).is_some_and(|s| s >= 50)
    });
    let metrics = job.get(1, "/metrics").unwrap().1;
    for name in [
        "murmur_trainer_steps_total",
        "murmur_trainer_rounds_total",
        "murmur_trainer_loss",
        "murmur_trainer_bytes_in_total",
        "murmur_trainer_bytes_out_total",
        "murmur_trainer_round_seconds_bucket",
        "murmur_trainer_topology_version 1",
    ] {
        assert!(metrics.contains(name), "{name} missing from\n{metrics}");
    }

    // The spot notice: member 1 finishes its step, says goodbye, checkpoints, exits 0.
    let survivors_then: Vec<u64> = [0, 2].iter().map(|&id| job.step(id).unwrap()).collect();
    let noticed = Instant::now();
    signal(&procs.0[1], "TERM");
    let status = wait_exit(&mut procs.0[1], Duration::from_secs(20)).expect("not gone in 20 s");
    let took = noticed.elapsed();
    assert!(status.success(), "{status:?}");
    println!("SIGTERM to exit: {took:?}");
    let lines = job.log(1, 0);
    let left = logged(&lines, "left the job").expect("no leave logged");
    let step = left["step"].as_u64().unwrap();
    let checkpoint = ckpt.join(format!("member-1-step-{step:010}.ckpt"));
    assert!(checkpoint.exists(), "{} missing", checkpoint.display());
    // What a pod's terminationMessagePath would hold: it left, it did not finish.
    let message: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&termination).unwrap()).unwrap();
    assert_eq!(
        message,
        serde_json::json!({"outcome": "left", "step": step})
    );

    // Its neighbours drop it as "left" and keep training.
    wait_for(Duration::from_secs(10), "survivors to go on", || {
        [0, 2]
            .iter()
            .zip(&survivors_then)
            .all(|(&id, &then)| job.step(id).is_some_and(|s| s > then + 20))
    });
    for id in [0, 2] {
        let lines = job.log(id, 0);
        assert!(
            lines.iter().any(
                |l| l["fields"]["message"] == "neighbour dropped from the round"
                    && l["fields"]["peer"] == 1
                    && l["fields"]["reason"] == "left"
            ),
            "member {id} never dropped member 1 as left"
        );
    }
    // The others leave too, even mid-run.
    for i in [0, 2] {
        signal(&procs.0[i], "TERM");
    }
    for i in [0, 2] {
        let status = wait_exit(&mut procs.0[i], Duration::from_secs(20)).expect("not gone");
        assert!(status.success());
    }
}

/// Start both members of `job` again (attempt 1) with `env`, and wait for both to finish well.
fn resume_both(job: &LocalJob, env: &[(&str, String)]) {
    let mut procs = Reaper::default();
    for id in 0..2 {
        procs.0.push(job.spawn(id, 1, env));
    }
    procs.all_succeed(Duration::from_secs(120));
}

/// Run both members of `job`, checkpointing into its `checkpoints`, until both reach `step`,
/// then SIGKILL them: the checkpoint directory and the environment that names it.
fn run_then_kill_all(
    job: &LocalJob,
    step: u64,
) -> (std::path::PathBuf, [(&'static str, String); 1]) {
    let ckpt = job.dir.path().join("checkpoints");
    let env = [("MURMUR_CHECKPOINT_DIR", ckpt.display().to_string())];
    let mut procs = Reaper::default();
    for id in 0..2 {
        procs.0.push(job.spawn(id, 0, &env));
    }
    wait_for(Duration::from_secs(60), &format!("step {step}"), || {
        (0..2).all(|id| job.step(id).is_some_and(|s| s >= step))
    });
    for c in &mut procs.0 {
        c.kill().unwrap();
        c.wait().unwrap();
    }
    (ckpt, env)
}

#[test]
fn a_job_whose_members_all_died_resumes_from_the_newest_valid_checkpoint() {
    let job = LocalJob::new(2, TopologyKind::Ring, &manifest(300, 2, Some(50)));
    let (ckpt, env) = run_then_kill_all(&job, 110);
    // Damage member 0's newest checkpoint: it must be skipped, not loaded.
    let newest = ckpt.join("member-0-step-0000000100.ckpt");
    let mut bytes = std::fs::read(&newest).unwrap();
    let n = bytes.len();
    bytes[n / 3] ^= 0xff;
    std::fs::write(&newest, bytes).unwrap();

    let out = job.dir.path().join("model");
    let termination = job.dir.path().join("termination-log");
    let env = [
        env[0].clone(),
        ("MURMUR_OUTPUT_DIR", out.display().to_string()),
        ("MURMUR_TERMINATION_LOG", termination.display().to_string()),
    ];
    resume_both(&job, &env);
    for id in 0..2 {
        let lines = job.log(id, 1);
        let resumed = logged(&lines, "resumed from checkpoint").expect("did not resume");
        assert_eq!(resumed["step"], 100, "member {id}: {resumed}");
        let skipped = logged(&lines, "skipping a checkpoint").expect("damage not noticed");
        assert!(
            skipped["error"]
                .as_str()
                .unwrap()
                .contains("member-0-step-0000000100.ckpt"),
            "{skipped}"
        );
        let done = logged(&lines, "done").expect("did not finish");
        assert_eq!(done["step"], 300);
        assert!(done["accuracy"].as_f64().unwrap() >= 0.85, "{done}");
    }
    let message: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&termination).unwrap()).unwrap();
    assert_eq!(message, serde_json::json!({"outcome": "done", "step": 300}));
    // The lowest member wrote the final model, as a burn record and as safetensors.
    assert!(out.join("model.mpk").exists());
    let bytes = std::fs::read(out.join("model.safetensors")).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<(String, Vec<usize>)> = tensors
        .tensors()
        .into_iter()
        .map(|(name, view)| (name, view.shape().to_vec()))
        .collect();
    names.sort();
    assert_eq!(
        names,
        vec![
            ("hidden.bias".to_string(), vec![256]),
            ("hidden.weight".to_string(), vec![784, 256]),
            ("output.bias".to_string(), vec![10]),
            ("output.weight".to_string(), vec![256, 10]),
        ]
    );
}

/// A control endpoint that keeps the statuses trainers post (and takes every other post):
/// its address, and what was posted.
fn status_sink(rt: &tokio::runtime::Runtime) -> (String, Arc<Mutex<Vec<serde_json::Value>>>) {
    use axum::routing::post;
    let posted = Arc::new(Mutex::new(Vec::new()));
    let keep = posted.clone();
    let app = axum::Router::new()
        .route(
            "/api/v1/namespaces/{ns}/jobs/{job}/members/{id}/status",
            post(move |body: axum::body::Bytes| async move {
                keep.lock()
                    .unwrap()
                    .push(serde_json::from_slice(&body).unwrap());
                axum::http::StatusCode::NO_CONTENT
            }),
        )
        .fallback(|| async { axum::http::StatusCode::NO_CONTENT });
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    rt.spawn(async move { axum::serve(listener, app).await });
    (address, posted)
}

/// A member that starts after the run's end (a replacement that resumed from a finished
/// member's last checkpoint) takes no step of its own: the status it posts says its accuracy at
/// the step the checkpoint was at, not at step 0.
#[test]
fn a_member_resumed_at_the_end_reports_its_accuracy_at_that_step() {
    let job = LocalJob::new(2, TopologyKind::Ring, &manifest(100, 2, Some(50)));
    let ckpt = job.dir.path().join("checkpoints");
    let env = [("MURMUR_CHECKPOINT_DIR", ckpt.display().to_string())];
    resume_both(&job, &env);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (endpoint, posted) = status_sink(&rt);
    let mut late = Reaper::default();
    late.0.push(job.spawn(
        0,
        2,
        &[env[0].clone(), ("MURMUR_CONTROL_ENDPOINT", endpoint)],
    ));
    // Its neighbour is gone: it waits out the startup timeout (30 s), then ends.
    let status = wait_exit(&mut late.0[0], Duration::from_secs(90)).expect("hung");
    assert!(status.success(), "{status:?}");
    let posted = posted.lock().unwrap();
    let last = posted
        .iter()
        .rfind(|s| s.get("accuracy").is_some_and(|a| !a.is_null()))
        .unwrap_or_else(|| panic!("no status with an accuracy: {posted:?}"));
    assert_eq!(last["step"], 100, "{last}");
    let lines = job.log(0, 2);
    let resumed = logged(&lines, "resumed from checkpoint").expect("did not resume");
    assert_eq!(resumed["step"], 100);
}

/// With outer steps the checkpoint holds the anchor and outer momentum (format 2), and a
/// resumed job takes them back.
#[test]
fn with_outer_steps_a_resumed_job_takes_its_anchor_back_from_the_checkpoint() {
    let text = manifest(200, 2, Some(50)).replace(
        "algorithm: {kind: dpsgd, roundTimeout: 2s}",
        "algorithm: {kind: dpsgd, roundTimeout: 2s, outer: {localSteps: 10}}",
    );
    let job = LocalJob::new(2, TopologyKind::Ring, &text);
    let (ckpt, env) = run_then_kill_all(&job, 60);
    let bytes = std::fs::read(ckpt.join("member-0-step-0000000050.ckpt")).unwrap();
    assert_eq!(bytes[8..12], 2u32.to_le_bytes(), "format 2: outer state");
    resume_both(&job, &env);
    for id in 0..2 {
        let lines = job.log(id, 1);
        let resumed = logged(&lines, "resumed from checkpoint").expect("did not resume");
        assert_eq!(resumed["step"], 50, "member {id}: {resumed}");
        assert_eq!(resumed["outer"], true, "member {id}: {resumed}");
        let done = logged(&lines, "done").expect("did not finish");
        assert_eq!(done["step"], 200);
        assert!(done["accuracy"].as_f64().unwrap() >= 0.85, "{done}");
    }
}

#[test]
fn a_member_whose_data_is_missing_names_the_file_in_its_termination_message() {
    let missing = "/nonexistent/murmur-dataset";
    let text = manifest(100, 1, None).replace(
        "dataset: {source: embedded}",
        &format!("dataset: {{source: idx, path: {missing}}}"),
    );
    let job = LocalJob::new(1, TopologyKind::Ring, &text);
    let termination = job.dir.path().join("termination-log");
    let mut member = job.spawn(
        0,
        0,
        &[("MURMUR_TERMINATION_LOG", termination.display().to_string())],
    );
    let status = wait_exit(&mut member, Duration::from_secs(60)).expect("hung");
    assert_eq!(status.code(), Some(2), "bad input exits 2");
    let message: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&termination).unwrap()).unwrap();
    assert_eq!(message["outcome"], "failed", "{message}");
    let why = message["message"].as_str().unwrap();
    assert!(why.contains(missing), "{why}");
}

/// At the start of a job, a neighbour already in its first round (it met everyone it waits for,
/// and answers no state request while it waits for our parameters) counts as met: the member
/// goes on to its rounds, where before the two waited for each other, one a round timeout and
/// the other its startup timeout (seen: the first round of a chaos run held 3 s).
#[test]
fn a_neighbour_already_in_its_first_round_is_not_waited_for_at_the_start() {
    let job = LocalJob::new(2, TopologyKind::Ring, &manifest(300, 2, None));
    let weight = MemberView::of(&job.topology(), 1).neighbours[0].weight;
    let parameters = layout(&Model::<murmur_trainer::backend::Cpu>::new(
        ModelKind::Mlp,
        &Default::default(),
    ));
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Member 1 is this test: past its own state fetch, in its first round.
    let mut neighbour = rt
        .block_on(Transport::bind(
            &format!("127.0.0.1:{}", job.members[1].peer_port),
            TransportConfig {
                job: frame::job_id("test", "loopback"),
                me: 1,
                key: KEY.as_bytes().to_vec(),
                layout_fingerprint: parameters.fingerprint(),
                max_message: 64 << 20,
                round_timeout: Duration::from_secs(2),
            },
        ))
        .unwrap();
    neighbour.set_topology(
        Agreements {
            by_peer: [(0, edge_agreement(weight))].into(),
            others: 0,
        },
        [(0, format!("127.0.0.1:{}", job.members[0].peer_port))].into(),
    );
    let mut procs = Reaper::default();
    procs.0.push(job.spawn(0, 0, &[]));
    wait_for(Duration::from_secs(60), "member 0's state request", || {
        !neighbour.take_state_requests().is_empty()
    });
    let _guard = rt.enter();
    neighbour.post_round(
        0,
        Purpose::Parameters,
        vec![(0, Payload::new(vec![0; 4 * parameters.len()]))],
    );
    // Well inside the 30 s startup timeout.
    wait_for(Duration::from_secs(10), "member 0's first round", || {
        logged(&job.log(0, 0), "first averaging round with peers").is_some()
    });
    assert!(
        logged(
            &job.log(0, 0),
            "not every neighbour showed up in time; starting without them"
        )
        .is_none()
    );
}
