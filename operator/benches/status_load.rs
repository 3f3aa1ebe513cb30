//! The status endpoint under load while a job trains: `wrk` with 100 connections for 30 s on
//! the job's JSON status, against the same 30-s window of the same job undisturbed. Prints the
//! latency percentiles and both training throughputs.
//!
//!     cargo build --release -p murmur-trainer && cargo bench -p murmur --bench status_load
//!
//! Needs `wrk` (Debian: apt-get install wrk). Not a test: its figures depend on the machine.

#[path = "../../e2e/support/mod.rs"]
mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use support::{Run, http_get};

const EXAMPLE: &str = "manifests/examples/dcliques-spot-cpu.yaml";
const JOB: &str = "/api/v1/namespaces/default/jobs/mnist-dcliques";
const WINDOW: Duration = Duration::from_secs(30);
/// Start measuring this long after the job runs (past start-up and the first topology).
const SETTLE: Duration = Duration::from_secs(5);

fn job(port: u16) -> Option<serde_json::Value> {
    let (200, body) = http_get(port, JOB)? else {
        return None;
    };
    serde_json::from_str(&body).ok()
}

fn step(view: &serde_json::Value) -> u64 {
    view["status"]["progress"]["step"].as_u64().unwrap_or(0)
}

/// Training steps per second over WINDOW, with `load` running (given the job URL) meanwhile.
fn measure(load: Option<&dyn Fn(String) -> String>) -> (f64, Option<String>) {
    let run = Run::start(EXAMPLE, &[]);
    let mut running_since: Option<Instant> = None;
    let mut result = None;
    let mut report = None;
    let finished = run.finish(|port| {
        if result.is_some() {
            return;
        }
        let Some(view) = job(port) else { return };
        if view["status"]["phase"] != "Running" {
            return;
        }
        let since = *running_since.get_or_insert_with(Instant::now);
        if since.elapsed() < SETTLE {
            return;
        }
        // Once: the same window, loaded or not.
        let (began, first) = (Instant::now(), step(&view));
        match load {
            Some(load) => report = Some(load(format!("http://127.0.0.1:{port}{JOB}"))),
            None => std::thread::sleep(WINDOW),
        }
        let last = job(port).map(|v| step(&v)).unwrap_or(first);
        result = Some((last - first) as f64 / began.elapsed().as_secs_f64());
    });
    assert!(finished.status.success(), "{}", finished.stdout);
    (result.expect("the job ran long enough to measure"), report)
}

fn main() {
    if Command::new("wrk").arg("--version").output().is_err() {
        eprintln!("status_load: needs wrk on PATH (Debian: apt-get install wrk)");
        return;
    }
    let calm = measure(None).0;
    let wrk = |url: String| -> String {
        let out = Command::new("wrk")
            .args(["-t2", "-c100", "-d30s", "--latency", &url])
            .output()
            .expect("wrk runs");
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let (loaded, report) = measure(Some(&wrk));
    let report = report.unwrap();
    println!("{report}");
    let line = |label: &str| {
        report
            .lines()
            .find(|l| l.trim_start().starts_with(label))
            .map(|l| l.trim().to_string())
            .unwrap_or_default()
    };
    println!(
        "status endpoint under wrk -t2 -c100 -d30s: {} | p50 {} | p99 {}",
        line("Requests/sec"),
        line("50%"),
        line("99%")
    );
    println!(
        "training throughput over the same 30 s: undisturbed {calm:.2} steps/s, under load {loaded:.2} steps/s ({:+.1}%)",
        100.0 * (loaded / calm - 1.0)
    );
}
