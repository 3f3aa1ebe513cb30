//! Driving the built `murmur` binary as a user would: a real process, its stdout, its status
//! API over HTTP, and what it leaves in `--output`.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::str::FromStr;

pub mod control_plane;
pub mod tools;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;

/// The longest a run may take before the test gives up: a guard against a hang, not a speed
/// bar. The storm's 5000-step calm run takes 330 s on this 2-core machine and over 420 s on a
/// slower one (the CI machine once ran it at 9 steps/s against 15 here).
const RUN_LIMIT: Duration = Duration::from_secs(900);

pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn murmur() -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_murmur"));
    let trainer = bin.with_file_name("murmur-trainer");
    assert!(
        trainer.is_file(),
        "{} is missing: run the tests with `cargo test --workspace` (or `cargo build -p murmur-trainer` first)",
        trainer.display()
    );
    bin
}

/// The directory holding the test build's `murmur` and `murmur-trainer`, side by side: what the
/// images of the real-node tests are built of.
pub fn binaries() -> PathBuf {
    murmur().parent().unwrap().to_path_buf()
}

pub struct Run {
    child: Child,
    dir: Option<tempfile::TempDir>,
    stdout: Arc<Mutex<String>>,
    started: Instant,
}

pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub dir: tempfile::TempDir,
}

impl Run {
    /// `murmur run MANIFEST --output TMP --status-address 127.0.0.1:0 ARGS...`
    pub fn start(manifest: &str, args: &[&str]) -> Self {
        let mut dir = tempfile::tempdir().unwrap();
        if std::env::var_os("MURMUR_KEEP_TEST_DIRS").is_some() {
            dir.disable_cleanup(true);
            eprintln!("keeping {}", dir.path().display());
        }
        let mut child = Command::new(murmur())
            .current_dir(workspace())
            .args([
                "run",
                manifest,
                "--status-address",
                "127.0.0.1:0",
                "--output",
            ])
            .arg(dir.path())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = Arc::new(Mutex::new(String::new()));
        for stream in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let sink = stdout.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    let mut s = sink.lock().unwrap();
                    s.push_str(&line);
                    s.push('\n');
                }
            });
        }
        Self {
            child,
            dir: Some(dir),
            stdout,
            started: Instant::now(),
        }
    }

    /// The run's `--output` folder (its trainers' working folder too).
    pub fn output(&self) -> &Path {
        self.dir.as_ref().expect("running").path()
    }

    /// murmur's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The status API's port, once murmur printed it.
    pub fn port(&self) -> Option<u16> {
        let out = self.stdout.lock().unwrap();
        let at = out.find("dashboard at http://127.0.0.1:")?;
        let rest = &out[at + "dashboard at http://127.0.0.1:".len()..];
        rest[..rest.find('/')?].parse().ok()
    }

    /// Wait for the run to end, calling `poll(port)` every 200 ms while it goes.
    pub fn finish(mut self, mut poll: impl FnMut(u16)) -> Finished {
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // Let the reader threads drain the pipes.
                std::thread::sleep(Duration::from_millis(200));
                let stdout = self.stdout.lock().unwrap().clone();
                return Finished {
                    status,
                    stdout,
                    dir: self.dir.take().expect("finished once"),
                };
            }
            if self.started.elapsed() > RUN_LIMIT {
                // No SIGKILL here: `Drop` stops murmur with SIGTERM first, so murmur stops its
                // trainers. Killed outright, it left them training on, loading later tests.
                // Copied out first: a panic holding the lock would poison it for the readers.
                let stdout = self.stdout.lock().unwrap().clone();
                panic!("murmur run took over {RUN_LIMIT:?}:\n{stdout}");
            }
            if let Some(port) = self.port() {
                poll(port);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// Signal our own child (not yet reaped: the pid is still ours).
fn signal(child: &std::process::Child, signal: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal);
}

impl Run {
    /// SIGINT, as Ctrl-C would, then wait for murmur to end.
    pub fn interrupt(self) -> Finished {
        signal(&self.child, nix::sys::signal::Signal::SIGINT);
        self.finish(|_| {})
    }
}

impl Drop for Run {
    /// A failing test still lets murmur stop its trainers: SIGTERM, then SIGKILL.
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_some() {
            return;
        }
        signal(&self.child, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(40);
        while Instant::now() < deadline {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
    }
}

fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// How one lost member healed.
#[derive(Debug)]
pub struct Healing {
    pub member: u64,
    /// From the kill until every neighbour that had it completed a round without it.
    pub dropped_after: f64,
    /// From the replacement's spawn to its first averaging round with peers.
    pub averaged_after: f64,
}

/// What became of the chaos kills of a run.
#[derive(Debug)]
pub struct Kills {
    /// Each kill whose replacement joined before the job finished.
    pub healed: Vec<Healing>,
    /// Kills with nothing to heal: they landed as a member reached the target (a finishing job
    /// replaces no one), or the finishing job retired the replacement before it joined.
    pub nothing_to_heal: usize,
    /// Kills whose replacement was itself killed before its first averaging round (a spot
    /// preemption may strike a member that has only just started): the later kill is measured.
    pub killed_again: usize,
}

fn seconds(text: &str) -> f64 {
    let t = Timestamp::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    t.as_microsecond() as f64 / 1e6
}

/// The attempt a Chaos event names ("SIGKILL to member 3 (attempt 1)").
pub fn attempt_of(event: &serde_json::Value) -> u64 {
    let message = event["message"].as_str().unwrap();
    let at = message.find("(attempt ").unwrap() + "(attempt ".len();
    message[at..message.len() - 1].parse().unwrap()
}

impl Finished {
    /// A run under chaos: it succeeded, survived at least `at_least` preemptions and counted
    /// none of them as a crash. Its summary and the preemptions.
    pub fn survived_chaos(&self, at_least: u64) -> (serde_json::Value, u64) {
        assert!(self.status.success(), "chaos run failed:\n{}", self.stdout);
        let summary = self.summary();
        assert_eq!(summary["phase"], "Succeeded");
        let preemptions = summary["preemptionsSurvived"].as_u64().unwrap();
        assert!(
            preemptions >= at_least,
            "only {preemptions} preemptions:\n{}",
            self.stdout
        );
        assert_eq!(
            summary["restarts"], 0,
            "a preemption was counted as a crash"
        );
        (summary, preemptions)
    }

    pub fn summary(&self) -> serde_json::Value {
        read_json(&self.dir.path().join("summary.json"))
    }

    pub fn events(&self) -> Vec<serde_json::Value> {
        read_json(&self.dir.path().join("events.json"))
            .as_array()
            .unwrap()
            .clone()
    }

    /// Every trainer's JSON log lines, by (member, attempt).
    pub fn logs(&self) -> Vec<((u64, u64), Vec<serde_json::Value>)> {
        let mut logs = Vec::new();
        for entry in std::fs::read_dir(self.dir.path().join("logs")).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_stem().unwrap().to_str().unwrap().to_string();
            let mut parts = name.trim_start_matches("member-").split('-');
            let member = parts.next().unwrap().parse().unwrap();
            let attempt = parts.next().unwrap().parse().unwrap();
            let lines = std::fs::read_to_string(&path)
                .unwrap()
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect();
            logs.push(((member, attempt), lines));
        }
        logs
    }

    /// Every chaos kill, accounted for: for each whose replacement joined before the job
    /// finished, how long until the survivors moved on and how long the replacement took from
    /// spawn to its first averaging round; the others counted, each checked to have had nothing
    /// to heal.
    pub fn healing(&self) -> Kills {
        let events = self.events();
        let logs = self.logs();
        let mut out = Vec::new();
        let mut nothing_to_heal = 0;
        let mut killed_again_count = 0;
        for kill in events.iter().filter(|e| e["reason"] == "Chaos") {
            let member = kill["member"].as_u64().unwrap();
            let killed_at = seconds(kill["time"].as_str().unwrap());
            let replaced = events.iter().find(|e| {
                e["reason"] == "Replaced"
                    && e["member"].as_u64() == Some(member)
                    && seconds(e["time"].as_str().unwrap()) >= killed_at
            });
            let Some(replaced) = replaced else {
                // A member reached the target as the kill landed: a finishing job replaces no one.
                let finishing = events.iter().any(|e| {
                    e["reason"] == "MemberCompleted"
                        && seconds(e["time"].as_str().unwrap()) <= killed_at + 1.0
                });
                assert!(finishing, "member {member} was not replaced");
                nothing_to_heal += 1;
                continue;
            };
            let spawned_at = seconds(replaced["time"].as_str().unwrap());
            let attempt = attempt_of(kill) + 1;
            let (_, lines) = logs
                .iter()
                .find(|(k, _)| *k == (member, attempt))
                .unwrap_or_else(|| panic!("no log of member {member} attempt {attempt}"));
            let averaged = lines
                .iter()
                .find(|l| l["fields"]["message"] == "first averaging round with peers")
                .map(|l| seconds(l["timestamp"].as_str().unwrap()));
            let Some(averaged) = averaged else {
                let killed_again = events.iter().any(|e| {
                    e["reason"] == "Chaos"
                        && e["member"].as_u64() == Some(member)
                        && attempt_of(e) == attempt
                });
                if killed_again {
                    killed_again_count += 1;
                    continue;
                }
                // Killed just before the end: the job finished before its replacement joined,
                // and the planner retired it, or a neighbour said so as it left and the
                // replacement ended with the job (nothing to heal).
                let retired = events.iter().any(|e| {
                    e["reason"] == "MemberRetired"
                        && e["member"].as_u64() == Some(member)
                        && seconds(e["time"].as_str().unwrap()) >= spawned_at
                });
                let ended_with_the_job = lines.iter().any(|l| {
                    l["fields"]["message"]
                        == "a peer ended the job at its stopping target; ending here"
                });
                assert!(
                    retired || ended_with_the_job,
                    "member {member} attempt {attempt} never averaged"
                );
                nothing_to_heal += 1;
                continue;
            };
            // Each survivor's first round without the killed attempt: dropped as disconnected
            // after the kill and before its replacement was back (later drops are of the
            // replacement).
            let mut dropped = Vec::new();
            for ((m, _), lines) in &logs {
                if *m == member {
                    continue;
                }
                let first = lines
                    .iter()
                    .filter(|l| {
                        l["fields"]["message"] == "neighbour dropped from the round"
                            && l["fields"]["peer"].as_u64() == Some(member)
                            && l["fields"]["reason"] == "disconnected"
                    })
                    .map(|l| seconds(l["timestamp"].as_str().unwrap()))
                    .find(|&t| t >= killed_at && t < averaged);
                dropped.extend(first);
            }
            // On a loaded machine the control plane can repair the topology before any
            // neighbour's round noticed the closed connection: the survivors then move on with
            // the repaired topology (the `Left` event) and never log a drop.
            if dropped.is_empty() {
                let repaired = events
                    .iter()
                    .filter(|e| e["reason"] == "Left" && e["member"].as_u64() == Some(member))
                    .map(|e| seconds(e["time"].as_str().unwrap()))
                    .find(|&t| t >= killed_at && t < averaged);
                dropped.extend(repaired);
            }
            assert!(
                !dropped.is_empty(),
                "no survivor dropped member {member} and the topology was never repaired"
            );
            out.push(Healing {
                member,
                dropped_after: dropped.iter().fold(0.0f64, |a, &t| a.max(t - killed_at)),
                averaged_after: averaged - spawned_at,
            });
        }
        Kills {
            healed: out,
            nothing_to_heal,
            killed_again: killed_again_count,
        }
    }
}

/// A bare HTTP/1.1 GET on loopback.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((code, body))
}
