//! Bad input, for real: members whose containers cannot start, on a real node (containerd, runc,
//! the kubelet; `e2e/controlplane/nodes.sh`), under the operator running in the cluster from its
//! image, as `helm install` puts it there. Each one must reach the job's status and events in
//! the kubelet's own words, naming what is wrong, and never as a silent Pending:
//!
//! - an image that does not exist (its registry does not resolve);
//! - a pull that is refused (a registry that refuses the connection);
//! - a command the container cannot run (an image without the trainer): the member fails with
//!   the runtime's reason, and the job fails once its restart budget is spent;
//! - a volume that cannot be mounted (a checkpoint claim bound to a host path that is not there).
//!
//! Then who may see and do what (`access`): users and their roles, `murmur dashboard`, replayed
//! and forged control traffic.
//!
//! Needs root, podman, mmdebstrap, catatonit, iproute2, jq and Go; skipped with the reason otherwise, unless
//! `MURMUR_REQUIRE_CONTROLPLANE` is set (CI sets it).

#[path = "real_nodes/access.rs"]
mod access;
mod support;

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::control_plane::{self, ControlPlane, repository};

const NAMESPACE: &str = "bad-input";

/// One member that trains nothing much: what matters is whether its container starts.
fn manifest(name: &str, image: &str, checkpoint: &str) -> String {
    format!(
        "apiVersion: murmur.dev/v1alpha1
kind: DecentralizedTrainingJob
metadata: {{name: {name}, namespace: {NAMESPACE}}}
spec:
  replicas: {{min: 1, target: 1, max: 1}}
  topology: {{kind: ring}}
  algorithm: {{kind: dpsgd}}
  training:
    model: logisticRegression
    dataset: {{source: embedded}}
    partition: {{kind: iid}}
    steps: 50
  trainer:
    image: {image}
    resources: {{cpu: 100m, memory: 256Mi}}
  scheduling: {{capacity: onDemand}}
  recovery: {{maxRestarts: 1, backoff: 1s}}
{checkpoint}"
    )
}

fn main() -> ExitCode {
    if !control_plane::real_nodes_available("the real-node tests") {
        return ExitCode::SUCCESS;
    }
    std::panic::set_hook(Box::new(|info| eprintln!("\n{info}\n")));
    let started = Instant::now();
    let out = Command::new(repository().join("e2e/controlplane/images.sh"))
        .arg(support::binaries())
        .output()
        .expect("run e2e/controlplane/images.sh");
    let images = PathBuf::from(control_plane::stdout_of("images.sh", out).trim());
    let cp = ControlPlane::up_for_real_nodes("nodes");
    let archives: Vec<String> = ["murmur-operator_e2e", "murmur-trainer_e2e", "runtime-base"]
        .iter()
        .map(|a| images.join(format!("{a}.tar")).display().to_string())
        .collect();
    let mut load = vec!["load"];
    load.extend(archives.iter().map(String::as_str));
    cp.nodes(&load);
    let ready = cp.add_node("node-1", "zone-1", &[]);
    println!("a real node Ready in {ready:.2} s");
    // Trainers reach the operator through a man in the middle on this machine (the access
    // scenario replays and forges their traffic), at the address pods reach this machine at.
    let mitm = access::Mitm::start();
    install_chart(&cp, &format!("http://{}:{}", cp.host_ip(), mitm.port));

    // A checkpoint claim bound to a host path that is not a directory on the node.
    cp.apply(&format!(
        "apiVersion: v1
kind: Namespace
metadata: {{name: {NAMESPACE}}}
---
apiVersion: v1
kind: PersistentVolume
metadata: {{name: not-there}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteOnce]
  storageClassName: manual
  hostPath: {{path: /var/lib/murmur-not-there, type: Directory}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: not-there, namespace: {NAMESPACE}}}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: manual
  volumeName: not-there
  resources: {{requests: {{storage: 1Gi}}}}
"
    ));
    let trainer = "localhost/murmur-trainer:e2e";
    let claim = "  checkpoint:\n    volume: {kind: persistentVolumeClaim, claimName: not-there}\n    everySteps: 10\n";
    for (name, image, checkpoint) in [
        (
            "missing-image",
            "registry.invalid/murmur/trainer:missing",
            "",
        ),
        ("refused-pull", "localhost/murmur-trainer:absent", ""),
        ("bad-command", "localhost/murmur-runtime-base:bookworm", ""),
        ("unmountable", trainer, claim),
    ] {
        cp.apply(&manifest(name, image, checkpoint));
    }

    // An image that does not exist, and one whose pull is refused: a condition and an event
    // naming the image, in the kubelet's words.
    for (name, image, says) in [
        (
            "missing-image",
            "registry.invalid/murmur/trainer:missing",
            "registry.invalid",
        ),
        (
            "refused-pull",
            "localhost/murmur-trainer:absent",
            "connection refused",
        ),
    ] {
        // On a loaded machine the kubelet's first try can fail to mount the member's key
        // Secret ("failed to sync secret cache"); its next try pulls, and that is the newest
        // reason the job shows.
        let c = condition_where(
            &cp,
            name,
            "MembersNotStarting",
            Duration::from_secs(120),
            |c| {
                c["reason"]
                    .as_str()
                    .is_some_and(|r| ["ErrImagePull", "ImagePullBackOff"].contains(&r))
            },
        );
        println!("{name}: {} {}: {}", c["status"], c["reason"], c["message"]);
        let message = c["message"].as_str().unwrap();
        assert!(message.contains(image), "the image is named: {message}");
        assert!(message.contains(says), "{message}");
        event(&cp, name, "MemberNotStarting", image);
        let job = job(&cp, name);
        assert_ne!(
            job["status"]["phase"], "Failed",
            "a pull is retried: {job:#}"
        );
        let member = job["status"]["members"][0]["message"]
            .as_str()
            .unwrap_or_default();
        assert!(member.contains(image), "the member says why: {member}");
    }

    // A command the container cannot run: a failure with the runtime's reason, each attempt,
    // and the job Failed once recovery.maxRestarts is spent.
    let failed = condition(&cp, "bad-command", "Failed", Duration::from_secs(120));
    println!("bad-command: {}", failed["message"]);
    let message = failed["message"].as_str().unwrap();
    assert!(
        message.contains("StartError"),
        "the kubelet's reason: {message}"
    );
    assert!(
        message.contains("\"run\""),
        "the command that cannot run: {message}"
    );
    event(&cp, "bad-command", "MemberFailed", "StartError");

    // A volume that cannot be mounted: said only in the pod's events, and still the job's.
    // The kubelet's first try can fail before the API server's node authorizer links the node
    // to the claim ("no relationship found"); its next try meets the host path, and that event
    // is the newest the job shows.
    let path = "/var/lib/murmur-not-there";
    let c = condition_where(
        &cp,
        "unmountable",
        "MembersNotStarting",
        Duration::from_secs(180),
        |c| c["message"].as_str().is_some_and(|m| m.contains(path)),
    );
    println!(
        "unmountable: {} {}: {}",
        c["status"], c["reason"], c["message"]
    );
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("True"), Some("FailedMount"))
    );
    event(&cp, "unmountable", "MemberNotStarting", "FailedMount");

    println!(
        "real-node bad input: 4 cases in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let access_started = Instant::now();
    let figures = access::scenario(&cp, &mitm);
    println!(
        "access: {figures} in {:.0} s",
        access_started.elapsed().as_secs_f64()
    );
    ExitCode::SUCCESS
}

/// `helm install` of the chart with the images built here, trainers told to reach the operator
/// at `control_endpoint`; the operator's pod Ready and leading.
fn install_chart(cp: &ControlPlane, control_endpoint: &str) {
    let chart = repository().join("charts/murmur");
    let out = cp.helm(&[
        "install",
        "murmur",
        chart.to_str().unwrap(),
        "--namespace",
        "murmur-system",
        "--create-namespace",
        "--set",
        "image.repository=localhost/murmur-operator",
        "--set",
        "image.tag=e2e",
        "--set",
        "trainer.image=localhost/murmur-trainer:e2e",
        "--set-json",
        &format!("operator.extraArgs=[\"--control-endpoint={control_endpoint}\"]"),
    ]);
    control_plane::stdout_of("helm install", out);
    cp.kubectl_ok(&[
        "-n",
        "murmur-system",
        "rollout",
        "status",
        "deploy/murmur-operator",
        "--timeout=180s",
    ]);
    // Ready is not leading: the Service reaches the replica that labels its pod the leader.
    let deadline = Instant::now() + Duration::from_secs(60);
    while cp
        .kubectl_ok(&[
            "-n",
            "murmur-system",
            "get",
            "pods",
            "-l",
            "murmur.dev/operator-leader=true",
            "-o",
            "name",
        ])
        .trim()
        .is_empty()
    {
        assert!(Instant::now() < deadline, "no operator replica leads");
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn job(cp: &ControlPlane, name: &str) -> Value {
    serde_json::from_str(&cp.kubectl_ok(&["-n", NAMESPACE, "get", "dtj", name, "-o", "json"]))
        .unwrap()
}

/// The job's condition of `kind` once it is there (True, or any status for `Failed`).
fn condition(cp: &ControlPlane, name: &str, kind: &str, within: Duration) -> Value {
    condition_where(cp, name, kind, within, |_| true)
}

/// The job's `kind` condition once it is True and `wanted` holds for it.
fn condition_where(
    cp: &ControlPlane,
    name: &str,
    kind: &str,
    within: Duration,
    wanted: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let job = job(cp, name);
        let found = job["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == kind && c["status"] == "True" && wanted(c))
            .cloned();
        if let Some(c) = found {
            return c;
        }
        assert!(
            Instant::now() < deadline,
            "{name}: no {kind} condition as wanted after {within:?}: {:#}\n{}",
            job["status"],
            cp.kubectl_ok(&["-n", NAMESPACE, "get", "pods,events", "-o", "wide"])
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Wait for an event of the job with `reason` whose note names `naming`. The operator writes a
/// reconcile's events after its status, so a condition can be seen before the event of the
/// same news.
fn event(cp: &ControlPlane, name: &str, reason: &str, naming: &str) {
    let within = Duration::from_secs(30);
    let deadline = Instant::now() + within;
    loop {
        let notes = cp.kubectl_ok(&[
            "-n",
            NAMESPACE,
            "get",
            "events.events.k8s.io",
            "--field-selector",
            &format!("regarding.name={name},reason={reason}"),
            "-o",
            "jsonpath={range .items[*]}{.note}{\"\\n\"}{end}",
        ]);
        if notes.contains(naming) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no {reason} event of {name} naming {naming:?} after {within:?}: {notes:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}
