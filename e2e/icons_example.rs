//! The icons example (`examples/icons/`) in a cluster, as its user runs it: its own trainer
//! image, built from its Containerfile on the trainer images' base and imported into the nodes
//! as a registry would serve it; its manifest applied with fewer steps; the nodes' icon theme
//! (Debian's `oxygen-icon-theme`) mounted through `trainer.podTemplate`; real nodes, the chart's
//! operator (`e2e/controlplane/job.sh`). The members run `icons-trainer`, a task murmur does not
//! know: Succeeded, above the most common context's share, proves the library carries it.
//!
//! Needs what the whole-job tests need, and the icon theme on this machine (CI installs it).

mod support;

use std::path::Path;
use std::process::{Command, ExitCode, Stdio};

use serde_json::Value;
use support::control_plane::{self, repository};

const MANIFEST: &str = "examples/icons/job.yaml";
const ICONS: &str = "/usr/share/icons/oxygen";
/// The most common context's share of the icons (actions: 672 of 1 528).
const MAJORITY: f64 = 0.44;

fn main() -> ExitCode {
    if !control_plane::real_nodes_available("the icons example in the cluster") {
        return ExitCode::SUCCESS;
    }
    if !Path::new(ICONS).join("base/32x32").is_dir() {
        assert!(
            std::env::var_os("MURMUR_REQUIRE_CONTROLPLANE").is_none(),
            "MURMUR_REQUIRE_CONTROLPLANE is set, but {ICONS} is missing (apt-get install oxygen-icon-theme)"
        );
        eprintln!("SKIPPED the icons example in the cluster: apt-get install oxygen-icon-theme");
        return ExitCode::SUCCESS;
    }
    std::panic::set_hook(Box::new(|info| eprintln!("\n{info}\n")));
    control_plane::build();
    let binaries = support::binaries();
    // The trainer images' runtime base (and murmur's images, which job.sh reuses), then the
    // example's image on that base.
    let images = script(&[
        "e2e/controlplane/images.sh",
        &binaries.display().to_string(),
    ]);
    let archive = script(&[
        "examples/icons/image.sh",
        &binaries.display().to_string(),
        images.trim(),
    ]);
    let keep = tempfile::tempdir().unwrap().keep().join("logs");
    let out = Command::new(repository().join("e2e/controlplane/job.sh"))
        .arg(MANIFEST)
        .args(["--steps", "150", "--seed", "4", "--timeout", "600"])
        .args(["--image", archive.trim(), "--host-path", ICONS, "--keep"])
        .arg(&keep)
        .current_dir(repository())
        .env("MURMUR_BINARIES", &binaries)
        .env("MURMUR_CONTROLPLANE_BIN", control_plane::bin_dir())
        .stderr(Stdio::inherit())
        .output()
        .expect("run job.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let result: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| {
            panic!(
                "job.sh printed no final status ({e}); logs in {}",
                keep.display()
            )
        });
    let accuracy = result["finalAccuracy"].as_f64().unwrap_or(0.0);
    println!(
        "icons example in the cluster: {} {:.2}% after 150 steps (logs in {})",
        result["phase"],
        100.0 * accuracy,
        keep.display()
    );
    assert_eq!(result["phase"], "Succeeded", "{result:#}");
    // The members ran the example's image: `kubectl exec` into one finds its trainer.
    assert!(
        result["exec"]
            .as_str()
            .is_some_and(|e| e.starts_with("icons-trainer ")),
        "kubectl exec on a member: {}",
        result["exec"]
    );
    assert!(
        accuracy > MAJORITY + 0.05,
        "{:.2}%: no better than calling every icon an action",
        100.0 * accuracy
    );
    ExitCode::SUCCESS
}

/// Run a script of the repository; its stdout.
fn script(args: &[&str]) -> String {
    let out = Command::new(repository().join(args[0]))
        .args(&args[1..])
        .current_dir(repository())
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", args[0]));
    assert!(out.status.success(), "{} failed", args[0]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}
