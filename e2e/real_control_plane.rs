//! The operator against a real Kubernetes control plane: kube-apiserver, etcd, the scheduler and
//! the controller manager built from their Go modules (`e2e/controlplane/`), with kwok playing
//! the kubelet of fake nodes. What the mocked API server cannot show: the CRD's structural schema
//! and CEL rules as the API server checks them, server-side apply, RBAC, the scheduler reading
//! murmur's affinity and tolerations, and the controller manager's disruption conditions.
//!
//! One control plane serves every scenario (each in a namespace of its own); scenarios run one
//! after another, named on the command line to run only some (`cargo test --test
//! real_control_plane -- crd`). Without Go the whole file is skipped with a printed reason, unless
//! `MURMUR_REQUIRE_CONTROLPLANE` is set (CI sets it).

mod support;

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::time::Instant;

use futures::FutureExt;
use support::control_plane::{self, ControlPlane};

#[path = "real_control_plane/mod.rs"]
mod scenarios;

/// What every scenario gets.
pub struct Env {
    pub cp: ControlPlane,
    /// Where scenarios keep what they write (logs of operators they start, manifests).
    pub dir: tempfile::TempDir,
}

type Scenario = for<'a> fn(&'a Env) -> Pin<Box<dyn Future<Output = ()> + 'a>>;

fn main() -> ExitCode {
    if !control_plane::available("the real control plane tests") {
        return ExitCode::SUCCESS;
    }
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let selected: Vec<(&str, Scenario)> = scenarios::ALL
        .iter()
        .copied()
        .filter(|(name, _)| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str())))
        .collect();
    if selected.is_empty() {
        println!("no scenario matches {filters:?}");
        return ExitCode::SUCCESS;
    }
    // A failed scenario says what failed and where; a backtrace of the harness says nothing more.
    std::panic::set_hook(Box::new(|info| eprintln!("\n{info}\n")));
    let started = Instant::now();
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let env = Env {
        cp: ControlPlane::up("e2e", &scenarios::apiserver_args(), ""),
        dir: tempfile::tempdir().unwrap(),
    };
    // Every scenario works with jobs: the CRD first, whichever scenarios run.
    env.cp
        .kubectl_ok(&["apply", "--server-side", "-f", "crds/"]);
    env.cp
        .wait_established("decentralizedtrainingjobs.murmur.dev");
    let mut failed = Vec::new();
    for (name, scenario) in &selected {
        let began = Instant::now();
        println!("scenario {name} ...");
        let outcome = runtime.block_on(std::panic::AssertUnwindSafe(scenario(&env)).catch_unwind());
        let seconds = began.elapsed().as_secs_f64();
        match outcome {
            Ok(()) => println!("scenario {name} ... ok ({seconds:.1} s)"),
            Err(_) => {
                println!("scenario {name} ... FAILED ({seconds:.1} s)");
                failed.push(*name);
            }
        }
    }
    println!(
        "real control plane: {} passed, {} failed in {:.0} s",
        selected.len() - failed.len(),
        failed.len(),
        started.elapsed().as_secs_f64()
    );
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        println!("failed: {failed:?} (logs: {})", env.cp.dir.display());
        // Keep the control plane's logs for a look.
        let kept = std::env::temp_dir().join("murmur-cp-failed-logs");
        let _ = std::fs::remove_dir_all(&kept);
        let _ = copy_dir(&env.cp.dir.join("logs"), &kept);
        let _ = copy_dir(env.dir.path(), &kept.join("scenarios"));
        println!(
            "control plane and scenario logs copied to {}",
            kept.display()
        );
        ExitCode::FAILURE
    }
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}
