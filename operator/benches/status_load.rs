//! The status endpoint under load while a job trains: `wrk` with 100 connections for 30 s on the
//! job's JSON status. Within one run of the example (made longer), a calm 30-s window, a loaded
//! one, and a calm one again: the loaded window's training throughput is compared with the mean
//! of the calm ones around it (the same phase of the same run, so run-to-run noise stays out).
//! Done twice: with observer reads paced at the default rate, and unpaced. Prints wrk's latency
//! percentiles, both throughputs and the CPU time the load cost (`murmur` serving it, and wrk).
//!
//!     cargo build --release -p murmur-trainer && cargo bench -p murmur --bench status_load
//!
//! Needs `wrk` (Debian: apt-get install wrk). Not a test: its figures depend on the machine.

#[path = "../../e2e/support/mod.rs"]
mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use murmur::status::pacer::DEFAULT_READS_PER_SECOND;
use support::{Run, http_get, workspace};

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

fn step(port: u16) -> u64 {
    job(port).map_or(0, |v| v["status"]["progress"]["step"].as_u64().unwrap_or(0))
}

/// CPU seconds (user + system) process `pid` has used so far.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are the 14th and 15th.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    let per_second = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100);
    ticks / per_second as f64
}

struct Window {
    steps_per_second: f64,
    murmur_cpu: f64,
}

fn window(port: u16, pid: u32, during: impl FnOnce()) -> Window {
    let (began, first, cpu) = (Instant::now(), step(port), cpu_seconds(pid));
    during();
    let (last, cpu_after) = (step(port), cpu_seconds(pid));
    Window {
        steps_per_second: last.saturating_sub(first) as f64 / began.elapsed().as_secs_f64(),
        murmur_cpu: cpu_after - cpu,
    }
}

struct Measured {
    calm: [Window; 2],
    loaded: Window,
    wrk: String,
    wrk_cpu: f64,
}

/// CPU seconds used by this process's reaped children so far.
fn children_cpu_seconds() -> f64 {
    use nix::sys::resource::{UsageWho, getrusage};
    use nix::sys::time::TimeValLike;
    let usage = getrusage(UsageWho::RUSAGE_CHILDREN).expect("getrusage of our children");
    (usage.user_time().num_microseconds() + usage.system_time().num_microseconds()) as f64 / 1e6
}

/// wrk -t2 -c100 -d30s on `url`: its report and the CPU seconds it used (the only child reaped
/// meanwhile: murmur is reaped when the run ends).
fn wrk(url: &str) -> (String, f64) {
    let before = children_cpu_seconds();
    let out = Command::new("wrk")
        .args(["-t2", "-c100", "-d30s", "--latency", url])
        .output()
        .expect("wrk runs");
    (
        String::from_utf8_lossy(&out.stdout).to_string(),
        children_cpu_seconds() - before,
    )
}

/// The example, long enough for the three windows.
fn long_manifest(dir: &std::path::Path) -> String {
    let text = std::fs::read_to_string(workspace().join(EXAMPLE)).unwrap();
    assert!(
        text.contains("steps: 400"),
        "{EXAMPLE} changed: update this bench"
    );
    let path = dir.join("long.yaml");
    std::fs::write(&path, text.replace("steps: 400", "steps: 3000")).unwrap();
    path.display().to_string()
}

fn measure(reads_per_second: u32) -> Measured {
    let dir = tempfile::tempdir().unwrap();
    let run = Run::start(
        &long_manifest(dir.path()),
        &["--status-reads-per-second", &reads_per_second.to_string()],
    );
    let pid = run.pid();
    let mut running_since: Option<Instant> = None;
    let mut measured = None;
    run.finish(|port| {
        if measured.is_some() {
            return;
        }
        match job(port) {
            Some(v) if v["status"]["phase"] == "Running" => {}
            _ => return,
        }
        if running_since.get_or_insert_with(Instant::now).elapsed() < SETTLE {
            return;
        }
        let url = format!("http://127.0.0.1:{port}{JOB}");
        let before = window(port, pid, || std::thread::sleep(WINDOW));
        let mut report = (String::new(), 0.0);
        let loaded = window(port, pid, || report = wrk(&url));
        let after = window(port, pid, || std::thread::sleep(WINDOW));
        assert_eq!(
            job(port).map(|v| v["status"]["phase"].clone()),
            Some("Running".into()),
            "the job ended inside the windows: make it longer"
        );
        measured = Some(Measured {
            calm: [before, after],
            loaded,
            wrk: report.0,
            wrk_cpu: report.1,
        });
        // Measured: stop the job as Ctrl-C would.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGINT,
        );
    });
    measured.expect("the job ran long enough to measure")
}

fn print(label: &str, m: &Measured) {
    let line = |prefix: &str| {
        m.wrk
            .lines()
            .find(|l| l.trim_start().starts_with(prefix))
            .map(|l| l.split_whitespace().last().unwrap_or("").to_string())
            .unwrap_or_default()
    };
    let calm = (m.calm[0].steps_per_second + m.calm[1].steps_per_second) / 2.0;
    let calm_cpu = (m.calm[0].murmur_cpu + m.calm[1].murmur_cpu) / 2.0;
    println!(
        "{label}: {} requests/s, p50 {}, p99 {} | training {calm:.2} steps/s calm (mean of {:.2} before, {:.2} after) -> {:.2} loaded ({:+.1}%) | load cost {:.2} CPU-s in murmur + {:.2} in wrk over {}s",
        line("Requests/sec"),
        line("50%"),
        line("99%"),
        m.calm[0].steps_per_second,
        m.calm[1].steps_per_second,
        m.loaded.steps_per_second,
        100.0 * (m.loaded.steps_per_second / calm - 1.0),
        m.loaded.murmur_cpu - calm_cpu,
        m.wrk_cpu,
        WINDOW.as_secs(),
    );
}

fn main() {
    if Command::new("wrk").arg("--version").output().is_err() {
        eprintln!("status_load: needs wrk on PATH (Debian: apt-get install wrk)");
        return;
    }
    let paced = measure(DEFAULT_READS_PER_SECOND);
    let unpaced = measure(0);
    println!("status endpoint under wrk -t2 -c100 -d30s while the example trains:");
    print(
        &format!("  paced at {DEFAULT_READS_PER_SECOND}/s (default)"),
        &paced,
    );
    print("  unpaced (--status-reads-per-second 0)", &unpaced);
}
