//! The `murmur` binary as a user runs it: outputs parse, bad input exits 2 with a named cause.

use std::path::Path;
use std::process::{Command, Output};

fn murmur(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_murmur"))
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .output()
        .expect("murmur runs")
}

fn ok(args: &[&str]) -> String {
    let out = murmur(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn fails(args: &[&str]) -> String {
    let out = murmur(args);
    assert_eq!(out.status.code(), Some(2), "{args:?} should exit 2");
    String::from_utf8(out.stderr).unwrap()
}

#[test]
fn json_has_members_weighted_edges_and_measures() {
    let text = ok(&[
        "topology",
        "--kind",
        "dcliques",
        "--members",
        "100",
        "--classes",
        "10",
        "--format",
        "json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["members"].as_array().unwrap().len(), 100);
    let edges = v["edges"].as_array().unwrap();
    let m = &v["measures"];
    assert_eq!(edges.len() as u64, m["edges"].as_u64().unwrap());
    assert!(edges.iter().all(|e| e["weight"].as_f64().unwrap() > 0.0));
    for key in [
        "members",
        "edges",
        "minDegree",
        "maxDegree",
        "diameter",
        "spectralGap",
        "cliqueSkew",
        "messagesPerRound",
    ] {
        assert!(!m[key].is_null(), "measures.{key} missing");
    }
    assert!(m["cliqueSkew"]["max"].as_f64().unwrap() < 1e-9);
    // At most 15% of the fully connected graph's edges.
    assert!(m["edges"].as_u64().unwrap() * 100 <= 15 * 4950);
    // The JSON is a valid topology document for trainers.
    murmur_core::contract::TopologyDocument::parse(&text).unwrap();
}

#[test]
fn svg_is_well_formed_with_one_circle_per_member() {
    for kind in [
        "ring",
        "fully-connected",
        "exponential",
        "dcliques",
        "proxy-clumps",
        "moshpit",
    ] {
        let text = ok(&[
            "topology",
            "--kind",
            kind,
            "--members",
            "40",
            "--format",
            "svg",
        ]);
        let doc = roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("{kind}: {e}"));
        let members = doc
            .descendants()
            .filter(|n| n.has_tag_name("circle") && n.children().any(|c| c.has_tag_name("title")))
            .count();
        assert_eq!(members, 40, "{kind}");
    }
}

#[test]
fn dot_and_table_describe_the_same_graph() {
    let dot = ok(&[
        "topology",
        "--kind",
        "ring",
        "--members",
        "12",
        "--format",
        "dot",
    ]);
    assert!(dot.starts_with("graph murmur {"));
    assert_eq!(dot.matches(" -- ").count(), 12);
    let table = ok(&[
        "topology",
        "--kind",
        "ring",
        "--members",
        "12",
        "--remove",
        "3,7",
    ]);
    assert!(table.contains("version 3"), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.trim_start().starts_with("edges") && l.trim_end().ends_with("10")),
        "{table}"
    );
}

#[test]
fn histograms_come_from_a_file_of_counts_or_of_join_reports() {
    let dir = tempfile::tempdir().unwrap();
    let counts = dir.path().join("counts.json");
    std::fs::write(&counts, "[[5,0],[0,5],[5,0],[0,5]]").unwrap();
    let text = ok(&[
        "topology",
        "--kind",
        "dcliques",
        "--clique-size",
        "2",
        "--histograms",
        counts.to_str().unwrap(),
        "--format",
        "json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(
        v["measures"]["cliqueSkew"]["max"].as_f64().unwrap() < 1e-9,
        "pairs of opposite classes"
    );
    let reports = dir.path().join("reports.json");
    std::fs::write(&reports, r#"[{"memberId": 10, "labelHistogram": [1, 9]}, {"memberId": 11, "labelHistogram": [9, 1]}]"#).unwrap();
    let text = ok(&[
        "topology",
        "--kind",
        "ring",
        "--histograms",
        reports.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert!(text.contains("\"id\": 10") && text.contains("\"id\": 11"));
}

#[test]
fn bad_input_names_its_cause() {
    assert!(fails(&["topology", "--kind", "ring"]).contains("--members is required"));
    let err = fails(&[
        "topology",
        "--kind",
        "ring",
        "--histograms",
        "/nonexistent/h.json",
    ]);
    assert!(err.contains("/nonexistent/h.json: cannot read"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{\"not\": \"a list\"}").unwrap();
    let err = fails(&[
        "topology",
        "--kind",
        "dcliques",
        "--histograms",
        bad.to_str().unwrap(),
    ]);
    assert!(err.contains("bad.json: expected a JSON array"), "{err}");
    std::fs::write(&bad, "[[1, 2], [3]]").unwrap();
    let err = fails(&[
        "topology",
        "--kind",
        "dcliques",
        "--histograms",
        bad.to_str().unwrap(),
    ]);
    assert!(
        err.contains("member 1's label histogram has 1 entries"),
        "{err}"
    );
    std::fs::write(&bad, "[[1, -2]]").unwrap();
    let err = fails(&[
        "topology",
        "--kind",
        "dcliques",
        "--histograms",
        bad.to_str().unwrap(),
    ]);
    assert!(err.contains("count -2"), "{err}");
    assert!(
        fails(&[
            "topology",
            "--kind",
            "ring",
            "--members",
            "5",
            "--remove",
            "9"
        ])
        .contains("member 9 is not in the topology")
    );
    assert!(
        fails(&[
            "topology",
            "--kind",
            "dcliques",
            "--members",
            "5",
            "--clique-size",
            "1"
        ])
        .contains("cliqueSize must be at least 2")
    );
    assert!(
        fails(&[
            "topology",
            "--kind",
            "moshpit",
            "--members",
            "5",
            "--group-size",
            "1"
        ])
        .contains("groupSize")
    );
    assert_eq!(
        murmur(&["topology", "--kind", "hexagon", "--members", "5"])
            .status
            .code(),
        Some(2)
    );
}

#[test]
fn crd_and_validate_use_the_api_types() {
    let crd = ok(&["crd"]);
    let on_disk = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../crds/decentralizedtrainingjobs.murmur.dev.yaml"),
    )
    .unwrap();
    assert_eq!(crd, on_disk);
    let reference = ok(&["crd", "--reference"]);
    let on_disk = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/reference/api.md"),
    )
    .unwrap();
    assert!(
        reference == on_disk,
        "docs/reference/api.md is out of date: cargo run -p murmur -- crd --reference > docs/reference/api.md"
    );
    let out = ok(&["validate", "manifests/examples/dcliques-spot-cpu.yaml"]);
    assert!(out.contains("valid mnist-dcliques"));
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("job.yaml");
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/examples/ring-cpu.yaml"),
    )
    .unwrap()
    .replace("{min: 3, target: 4, max: 6}", "{min: 5, target: 4, max: 6}");
    std::fs::write(&bad, text).unwrap();
    let err = fails(&["validate", bad.to_str().unwrap()]);
    assert!(
        err.contains("spec.replicas.target: replicas must satisfy min <= target <= max"),
        "{err}"
    );
}

#[test]
fn json_documents_can_carry_peer_addresses_for_bare_metal_trainers() {
    let text = ok(&[
        "topology",
        "--kind",
        "ring",
        "--members",
        "3",
        "--format",
        "json",
        "--address",
        "127.0.0.1:{id+7000}",
    ]);
    let doc = murmur_core::contract::TopologyDocument::parse(&text).unwrap();
    let addresses: Vec<_> = doc
        .members
        .iter()
        .map(|m| m.address.clone().unwrap())
        .collect();
    assert_eq!(
        addresses,
        ["127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"]
    );
    let text = ok(&[
        "topology",
        "--kind",
        "ring",
        "--members",
        "2",
        "--format",
        "json",
        "--address",
        "trainer-{id}.mnist:7070",
    ]);
    assert!(text.contains("\"trainer-1.mnist:7070\""), "{text}");
    for bad in ["10.0.0.1:7070", "host-{name}:1", "host-{id:1"] {
        let err = fails(&[
            "topology",
            "--kind",
            "ring",
            "--members",
            "2",
            "--format",
            "json",
            "--address",
            bad,
        ]);
        assert!(err.contains("--address"), "{bad}: {err}");
    }
}

#[test]
fn the_operator_without_a_cluster_says_so() {
    let out = Command::new(env!("CARGO_BIN_EXE_murmur"))
        .args(["operator", "--log-format", "text"])
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .output()
        .expect("murmur runs");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no Kubernetes configuration"), "{stderr}");
}

/// A member's last status post can lose the race with its exit: murmur then learns how it
/// ended from the trainer's termination message, as the operator does from the pod. These
/// trainers never post at all — they only write "done" to `MURMUR_TERMINATION_LOG` — and the job
/// must succeed without a single preemption (it used to take each clean exit for a spot notice
/// and replace the member, forever).
#[test]
fn a_member_whose_last_status_lost_the_race_with_its_exit_completed() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let trainer = dir.path().join("murmur-trainer");
    std::fs::write(
        &trainer,
        "#!/bin/sh\nsleep 0.2\nprintf '{\"outcome\":\"done\",\"step\":400}' > \"$MURMUR_TERMINATION_LOG\"\nexit 0\n",
    )
    .unwrap();
    std::fs::set_permissions(&trainer, std::fs::Permissions::from_mode(0o755)).unwrap();
    let output = dir.path().join("out");
    let mut child = Command::new(env!("CARGO_BIN_EXE_murmur"))
        .args([
            "run",
            "manifests/examples/ring-cpu.yaml",
            "--status-address",
            "127.0.0.1:0",
        ])
        .arg("--trainer")
        .arg(&trainer)
        .arg("--output")
        .arg(&output)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the job never ended: its members' clean exits were taken for preemptions");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(output.join("summary.json")).unwrap()).unwrap();
    assert!(status.success(), "{summary}");
    assert_eq!(summary["phase"], "Succeeded");
    assert_eq!(summary["preemptionsSurvived"], 0);
    assert_eq!(summary["restarts"], 0);
    // The driver's memory is kept beside the run, as the operator keeps it in the ConfigMap.
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(output.join("state/state.json")).unwrap()).unwrap();
    assert_eq!(state["phase"], "Succeeded");
}
