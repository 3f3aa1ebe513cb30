//! The whole job as a user runs it, in containers (`e2e/controlplane/job.sh`): the project's
//! images built from `images/`, real nodes (containerd, runc, the kubelet, kube-proxy, CoreDNS),
//! `helm install` of the chart with the operator running in the cluster, `kubectl apply` of the
//! manifest; against `murmur run` of the same manifest.
//!
//! 1. `manifests/examples/dcliques-spot-cpu.yaml` unchanged: Succeeded, within 1.5 points of
//!    `murmur run`, `kubectl get dtj -w` showing the step move, zone-aware cliques by default,
//!    every member a container of the trainer image under containerd, `kubectl logs` and
//!    `kubectl exec` working on a member.
//! 2. Zone-aware cliques on and off, 20 members over two zones: at least 3x fewer cross-zone
//!    bytes at equal accuracy.
//! 3. `manifests/examples/dcliques-outer-cpu.yaml` (outer steps every 8, int4), longer, with an
//!    eviction, a drained node, a node that dies (and a new one that joins), the operator's pod
//!    deleted and a `helm upgrade` mid-run: still Succeeded, at most 1.5 points below its own
//!    `murmur run`, every loss a preemption (no restart), every replacement on a spot node and
//!    averaging again (it takes a neighbour's anchor), the topology version never going
//!    backwards, and at least 50x fewer bytes a step than the per-step run of 1.
//!
//! Needs root, podman, mmdebstrap, catatonit, iproute2, jq and Go; skipped with the reason otherwise, unless
//! `MURMUR_REQUIRE_CONTROLPLANE` is set (CI sets it). One job at a time (two cores).

mod support;

use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

use serde_json::Value;
use support::control_plane::{self, repository};
use support::tools;

const MANIFEST: &str = "manifests/examples/dcliques-spot-cpu.yaml";
const OUTER: &str = "manifests/examples/dcliques-outer-cpu.yaml";

fn main() -> ExitCode {
    if !control_plane::real_nodes_available("the whole-job tests") {
        return ExitCode::SUCCESS;
    }
    std::panic::set_hook(Box::new(|info| eprintln!("\n{info}\n")));
    control_plane::build();
    let started = Instant::now();
    let reference = murmur_run(MANIFEST);
    println!("murmur run: {:.2}%", 100.0 * reference);

    // 1. The user's flow, the manifest as it is (zone-aware cliques by default), with the
    //    operator's dashboard opened in Chromium mid-run (when there is one: CI installs it).
    let dashboard = tempfile::tempdir().unwrap();
    let browser = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .any(tools::on_path);
    assert!(
        browser || std::env::var_os("MURMUR_REQUIRE_CHROMIUM").is_none(),
        "MURMUR_REQUIRE_CHROMIUM is set, but chromium is not on PATH"
    );
    let dashboard_dir = dashboard.path().display().to_string();
    let mut args = vec!["--seed", "1"];
    if browser {
        args.extend(["--dashboard", dashboard_dir.as_str()]);
    } else {
        eprintln!("SKIPPED the operator's dashboard in Chromium: chromium not on PATH");
    }
    let plain = job(&args);
    let accuracy = plain["finalAccuracy"].as_f64().unwrap();
    println!(
        "job.sh, unchanged manifest: {} {:.2}% in {:.1} s",
        plain["phase"],
        100.0 * accuracy,
        plain["jobSeconds"].as_f64().unwrap()
    );
    assert_succeeded_near(&plain, reference, "in the cluster");
    assert_eq!(plain["preemptions"], 0);
    assert_eq!(plain["restarts"], 0);
    let watch = std::fs::read_to_string(kept(&plain).join("watch.log")).unwrap();
    let steps: std::collections::BTreeSet<&str> = watch
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(4))
        .collect();
    assert!(
        steps.len() >= 4,
        "kubectl get dtj -w should show the step move:\n{watch}"
    );
    // Containers of the trainer image on real nodes, and the operator's own pod in the cluster.
    // Every attempt on a spot node; each member's last attempt (the one that trained to the end)
    // seen running. An attempt moved to its clique's zone within seconds of starting may have
    // been deleted between two of job.sh's polls, before its container status was read.
    let mut last: std::collections::BTreeMap<u64, &Value> = std::collections::BTreeMap::new();
    for m in plain["members"].as_array().unwrap() {
        assert_eq!(m["nodeLabels"]["karpenter.sh/capacity-type"], "spot", "{m}");
        let member = m["member"].as_u64().unwrap();
        if last
            .get(&member)
            .is_none_or(|l| l["attempt"].as_u64() < m["attempt"].as_u64())
        {
            last.insert(member, m);
        }
    }
    assert_eq!(last.len(), 10, "{plain:#}");
    for m in last.values() {
        assert!(
            starts(&m["containerRuntimeVersion"], "containerd://"),
            "{m}"
        );
        assert!(starts(&m["imageID"], "sha256:"), "{m}");
    }
    // Each member's completion as the real kubelet read it back from its termination message.
    let done: std::collections::BTreeSet<u64> = plain["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| {
            m["terminated"]["message"]
                .as_str()
                .and_then(|t| serde_json::from_str::<Value>(t).ok())
                .is_some_and(|t| t["outcome"] == "done")
        })
        .map(|m| m["member"].as_u64().unwrap())
        .collect();
    assert_eq!(
        done.len(),
        10,
        "members whose termination message says done: {done:?}"
    );
    let operator = &plain["operator"][0];
    assert!(
        operator["pod"].is_string() && operator["node"].is_string(),
        "{plain:#}"
    );
    assert!(
        starts(&plain["exec"], "murmur-trainer "),
        "kubectl exec on a member: {plain:#}"
    );
    assert!(
        plain["podStartSeconds"]["n"].as_u64().unwrap() >= 10,
        "{plain:#}"
    );
    if browser {
        // The dashboard the operator serves shows the job as murmur run's does, and its zones.
        let dom = std::fs::read_to_string(dashboard.path().join("dom.html")).unwrap();
        assert_eq!(
            dom.matches("class=\"member\"").count(),
            10,
            "ten members:\n{dom}"
        );
        assert!(
            dom.contains("class=\"curve\""),
            "accuracy and loss curves:\n{dom}"
        );
        assert!(dom.contains("Running"), "the job's phase:\n{dom}");
        for zone in ["zone-1", "zone-2"] {
            assert!(
                dom.contains(&format!("data-zone=\"{zone}\"")),
                "members of {zone}:\n{dom}"
            );
        }
        let png = std::fs::read(dashboard.path().join("dashboard.png")).unwrap();
        assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
        let artifacts = std::env::var_os("MURMUR_ARTIFACTS_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| repository().join("target/e2e-artifacts"));
        std::fs::create_dir_all(&artifacts).unwrap();
        std::fs::write(artifacts.join("dashboard-operator.png"), png).unwrap();
    }

    // 2. Zone-aware cliques against zone-blind ones. The scheduler places members knowing
    //    nothing of their data, so a zone's members rarely balance its cliques' labels: cliques
    //    cross zones for balance, and the operator then moves their few outsiders into the
    //    clique's zone before training. 200 steps: bytes per step is the measure, and both runs
    //    stop at the same step.
    // A quarter of a CPU each: twenty members fit the four spot nodes (this machine's two CPUs
    // each, as the kubelets report them).
    let twenty = [
        "--set",
        ".spec.replicas = {min: 12, target: 20, max: 24}",
        "--set",
        ".spec.trainer.resources.cpu = \"250m\"",
        "--steps",
        "200",
        "--seed",
        "2",
    ];
    // The zone-blind run's two zones are in two regions: its traffic crosses regions.
    let aware = job(&[&twenty[..], &["--zone-aware", "on"]].concat());
    let blind = job(&[&twenty[..], &["--zone-aware", "off", "--regions", "2"]].concat());
    assert_eq!(aware["phase"], "Succeeded", "{aware:#}");
    assert_eq!(blind["phase"], "Succeeded", "{blind:#}");
    let (aware_bytes, blind_bytes) = (cross_zone_bytes(&aware), cross_zone_bytes(&blind));
    let (aware_accuracy, blind_accuracy) = (
        aware["finalAccuracy"].as_f64().unwrap(),
        blind["finalAccuracy"].as_f64().unwrap(),
    );
    println!(
        "20 members over 2 zones, 200 steps: cross-zone bytes zone-aware {:.1} MB ({:.2}%, {} members moved), off {:.1} MB ({:.2}%): {:.1}x fewer",
        aware_bytes as f64 / 1e6,
        100.0 * aware_accuracy,
        aware["relocations"],
        blind_bytes as f64 / 1e6,
        100.0 * blind_accuracy,
        blind_bytes as f64 / aware_bytes.max(1) as f64
    );
    println!(
        "10 members (the unchanged manifest, zone-aware by default): {:.1} MB across zones",
        cross_zone_bytes(&plain) as f64 / 1e6
    );
    // The aim: at least 3x fewer, at equal accuracy.
    assert!(
        3 * aware_bytes <= blind_bytes,
        "zone-aware cliques should cut cross-zone bytes 3x: {aware_bytes} against {blind_bytes}"
    );
    assert_eq!(blind["relocations"], 0, "zone-blind jobs move nobody");
    // The job's traffic by locality, and its cost at the chart's list prices, in its status.
    let (aware_traffic, blind_traffic) = (traffic(&aware), traffic(&blind));
    println!(
        "traffic, zone-aware in one region: {aware_traffic}; zone-blind over two: {blind_traffic}"
    );
    assert_eq!(aware_traffic["crossRegionBytes"], 0, "{aware_traffic}");
    assert_eq!(blind_traffic["crossZoneBytes"], 0, "{blind_traffic}");
    for (t, crossing, per_gb, members) in [
        (&aware_traffic, "crossZoneBytes", 0.01, aware_bytes),
        (&blind_traffic, "crossRegionBytes", 0.02, blind_bytes),
    ] {
        let crossed = t[crossing].as_u64().unwrap();
        let within = t["withinZoneBytes"].as_u64().unwrap();
        assert!(within > crossed / 10, "{t}");
        // The members' own figures count their current attempts only, and the job's every
        // attempt: the two agree where nobody was replaced mid-run.
        assert!(
            crossed.abs_diff(members) * 100 <= members.max(1),
            "{crossing} {crossed} against the members' {members}: {t}"
        );
        let cost = t["costUsd"].as_f64().unwrap();
        let expected = crossed as f64 * per_gb / 1e9;
        assert!((cost - expected).abs() <= 1e-9 + expected * 1e-9, "{t}");
    }
    assert!(
        (aware_accuracy - blind_accuracy).abs() <= 0.015,
        "zone-aware {aware_accuracy} against zone-blind {blind_accuracy}"
    );

    // 3. Disruptions mid-run, with outer steps, on a run long enough to see each one heal: its
    //    steps take about a third of a per-step one's time.
    let outer_reference = murmur_run(OUTER);
    let hurt = job_of(
        OUTER,
        &[
            "--seed",
            "3",
            "--steps",
            "4000",
            "--evict",
            "1",
            "--drain-node",
            "--delete-node",
            "--delete-operator-pod",
            "--upgrade-operator",
        ],
    );
    let hurt_accuracy = hurt["finalAccuracy"].as_f64().unwrap_or(0.0);
    println!(
        "disrupted: {} {:.2}%, {} preemptions, {} restarts, topology version {}",
        hurt["phase"],
        100.0 * hurt_accuracy,
        hurt["preemptions"],
        hurt["restarts"],
        hurt["topologyVersion"]
    );
    for h in hurt["healing"].as_array().unwrap() {
        println!(
            "  {} of member {}: survivors moved on after {:.2} s, {} averaged after {:.2} s",
            h["kind"],
            h["member"],
            h["survivorsSeconds"].as_f64().unwrap_or(f64::NAN),
            h["replacement"],
            h["replacementSeconds"].as_f64().unwrap_or(f64::NAN)
        );
    }
    assert_succeeded_no_worse(&hurt, outer_reference, "after the disruptions");
    for d in hurt["disruptions"].as_array().unwrap() {
        assert!(d["skipped"].is_null(), "a disruption did not happen: {d}");
        // helm upgrade mid-job: the rolling update completed (job.sh fails otherwise) and
        // one replica of the two leads.
        if d["kind"] == "upgrade-operator" {
            println!(
                "  helm upgrade to 2 replicas {:.0} s into the job: rolled out in {:.1} s, {} leading {:.1} s after the upgrade began",
                d["atSeconds"].as_f64().unwrap(),
                d["rolloutSeconds"].as_f64().unwrap(),
                d["target"],
                d["leaderSeconds"].as_f64().unwrap()
            );
        }
    }
    assert!(
        hurt["disruptions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["kind"] == "upgrade-operator"),
        "{hurt:#}"
    );
    assert_eq!(hurt["restarts"], 0, "a preemption is never a restart");
    // An eviction, a drained node and a deleted node: one member at least each.
    assert!(hurt["preemptions"].as_u64().unwrap() >= 3, "{hurt:#}");
    assert_eq!(
        hurt["versionsMonotonic"], true,
        "topology version went back"
    );
    assert_eq!(hurt["stepsMonotonic"], true, "the job's step went back");
    let healing = hurt["healing"].as_array().unwrap();
    assert_eq!(healing.len(), 3, "{hurt:#}");
    // A replacement lost itself before its first averaging round (a later disruption struck it,
    // or the node it landed on died) is followed by another attempt of its member: that one heals.
    let attempts_of = |member: &Value| -> Vec<u64> {
        hurt["members"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["member"] == *member)
            .filter_map(|m| m["attempt"].as_u64())
            .collect()
    };
    for h in healing {
        assert!(h["survivorsSeconds"].is_number(), "{h}");
        let replacement_attempt = h["replacement"]
            .as_str()
            .and_then(|r| r.rsplit_once('-'))
            .and_then(|(_, a)| a.parse::<u64>().ok());
        let lost_again = replacement_attempt
            .is_some_and(|a| attempts_of(&h["member"]).iter().any(|&later| later > a));
        assert!(
            h["replacementSeconds"].is_number() || lost_again,
            "the replacement never averaged: {h}"
        );
    }
    // No duplicate: every member's attempts are distinct pods, each new one only after a loss
    // or a move to its clique's zone. Counted from the pod watch: a replacement can be lost
    // before the harness's poll sees it on a node (created as its node is deleted).
    let members = hurt["members"].as_array().unwrap();
    let created = hurt["podsCreated"].as_u64().unwrap();
    assert!(members.len() as u64 <= created, "{hurt:#}");
    assert_eq!(
        created,
        10 + hurt["preemptions"].as_u64().unwrap() + hurt["relocations"].as_u64().unwrap(),
        "one pod per member, one per preemption and one per relocation: {members:#?}"
    );
    for m in members {
        assert_eq!(m["nodeLabels"]["karpenter.sh/capacity-type"], "spot", "{m}");
    }
    // Outer steps' bytes a step, every attempt's (state handed to replacements included),
    // against the per-step run's.
    let per_step = |bytes: u64, result: &Value| bytes as f64 / result["step"].as_f64().unwrap();
    let hurt_traffic: murmur_core::api::traffic::Traffic =
        serde_json::from_value(traffic(&hurt)).unwrap();
    let hurt_bytes = hurt_traffic.total_bytes();
    let (plain_rate, outer_rate) = (
        per_step(bytes_out(&plain), &plain),
        per_step(hurt_bytes, &hurt),
    );
    println!(
        "outer steps: {:.1} kB a step against {:.1} kB per-step: {:.0}x fewer (murmur run of the outer example {:.2}%)",
        outer_rate / 1e3,
        plain_rate / 1e3,
        plain_rate / outer_rate.max(1.0),
        100.0 * outer_reference
    );
    assert!(
        50.0 * outer_rate <= plain_rate,
        "outer steps should send at least 50x fewer bytes a step: {outer_rate} against {plain_rate}"
    );
    println!(
        "whole job: 4 runs and 2 murmur runs in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    ExitCode::SUCCESS
}

/// Whether `value` is a string that starts with `prefix`.
fn starts(value: &Value, prefix: &str) -> bool {
    value.as_str().is_some_and(|v| v.starts_with(prefix))
}

/// The job Succeeded, its final accuracy within 1.5 points of `murmur run`'s `reference`.
fn assert_succeeded_near(result: &Value, reference: f64, when: &str) {
    assert_eq!(result["phase"], "Succeeded", "{result:#}");
    let accuracy = result["finalAccuracy"].as_f64().unwrap();
    assert!(
        (accuracy - reference).abs() <= 0.015,
        "{:.2}% {when} against {:.2}% with murmur run\n{}",
        100.0 * accuracy,
        100.0 * reference,
        members_at_the_end(result)
    );
}

/// The job Succeeded, its final accuracy at most 1.5 points below `murmur run`'s `reference`
/// (a run longer than the reference's may end higher).
fn assert_succeeded_no_worse(result: &Value, reference: f64, when: &str) {
    assert_eq!(result["phase"], "Succeeded", "{result:#}");
    let accuracy = result["finalAccuracy"].as_f64().unwrap();
    assert!(
        accuracy >= reference - 0.015,
        "{:.2}% {when} against {:.2}% with murmur run\n{}",
        100.0 * accuracy,
        100.0 * reference,
        members_at_the_end(result)
    );
}

/// Each member as the operator's status API showed it last, one line each: which of them an
/// accuracy short of the reference comes from, and where they sat in the topology.
fn members_at_the_end(result: &Value) -> String {
    let path = kept(result).join("view.json");
    let view: Value = std::fs::read_to_string(&path)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or_default();
    let members = view["members"].as_array().cloned().unwrap_or_default();
    let lines: Vec<String> = members
        .iter()
        .map(|m| {
            format!(
                "  member {}-{} {} step {} accuracy {} clique {} neighbours seen {} zone {}",
                m["id"],
                m["attempt"],
                m["phase"],
                m["step"],
                m["accuracy"],
                m["clique"],
                m["neighboursSeen"],
                m["zone"]
            )
        })
        .collect();
    format!(
        "members at the end ({}):\n{}",
        path.display(),
        lines.join("\n")
    )
}

/// `murmur run` of `manifest`: its final accuracy.
fn murmur_run(manifest: &str) -> f64 {
    let out = tempfile::tempdir().unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_murmur"))
        .args([
            "run",
            manifest,
            "--status-address",
            "127.0.0.1:0",
            "--output",
        ])
        .arg(out.path())
        .current_dir(repository())
        .stdout(Stdio::null())
        .status()
        .expect("run murmur run");
    assert!(status.success(), "murmur run {manifest} failed");
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("summary.json")).unwrap())
            .unwrap();
    summary["finalAccuracy"].as_f64().unwrap()
}

/// `job.sh MANIFEST ARGS...` with the test build's binaries: its final status (the last line).
fn job(args: &[&str]) -> Value {
    job_of(MANIFEST, args)
}

/// `job.sh manifest ARGS...`, as [`job`].
fn job_of(manifest: &str, args: &[&str]) -> Value {
    let keep = tempfile::tempdir().unwrap().keep().join("logs");
    let began = Instant::now();
    let out = Command::new(repository().join("e2e/controlplane/job.sh"))
        .arg(manifest)
        .args(args)
        .args(["--timeout", "600", "--keep"])
        .arg(&keep)
        .current_dir(repository())
        .env("MURMUR_BINARIES", support::binaries())
        .env("MURMUR_CONTROLPLANE_BIN", control_plane::bin_dir())
        .stderr(Stdio::inherit())
        .output()
        .expect("run job.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    let mut result: Value = serde_json::from_str(last).unwrap_or_else(|e| {
        panic!(
            "job.sh {args:?} printed no final status ({e}); logs in {}\n{stdout}",
            keep.display()
        )
    });
    println!(
        "job.sh {} in {:.0} s (logs in {})",
        args.join(" "),
        began.elapsed().as_secs_f64(),
        keep.display()
    );
    result["keptLogs"] = Value::String(keep.display().to_string());
    result
}

fn kept(result: &Value) -> PathBuf {
    PathBuf::from(result["keptLogs"].as_str().unwrap()).join("job")
}

/// The job as the operator's status API showed it last.
fn view_of(result: &Value) -> Value {
    serde_json::from_str(&std::fs::read_to_string(kept(result).join("view.json")).unwrap()).unwrap()
}

/// Bytes every member's current attempt sent to its peers, from the operator's status API.
fn bytes_out(result: &Value) -> u64 {
    view_of(result)["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["bytesOut"].as_u64())
        .sum()
}

/// The job's `status.traffic`, from the operator's status API.
fn traffic(result: &Value) -> Value {
    view_of(result)["status"]["traffic"].clone()
}

/// Bytes every member sent to members in other zones, from the operator's status API.
fn cross_zone_bytes(result: &Value) -> u64 {
    view_of(result)["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m["crossZoneBytes"].as_u64() {
            Some(bytes) => bytes,
            // A member that never reported (nothing sent) has no figure; one that did must.
            None => {
                assert_eq!(
                    m["bytesOut"], 0,
                    "no crossZoneBytes for a member that sent: {m}"
                );
                0
            }
        })
        .sum()
}
