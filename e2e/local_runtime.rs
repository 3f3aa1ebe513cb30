//! End to end: `murmur run` stays in charge of its processes while its control endpoint is
//! flooded with signed posts. A chaos kill is counted as a preemption within seconds, Ctrl-C
//! stops every trainer, and a `murmur` killed outright takes its trainers with it.

mod support;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use murmur_core::contract::control::{self, DropReason, Envelope, PeerEvent};
use support::*;

/// Four fast logistic-regression members that post their status at every tenth step.
const MANIFEST: &str = "\
apiVersion: murmur.dev/v1alpha1
kind: DecentralizedTrainingJob
metadata: {name: flood, namespace: demo}
spec:
  replicas: {min: 2, target: 4, max: 4}
  topology: {kind: ring}
  algorithm: {kind: dpsgd, roundTimeout: 2s}
  training:
    model: logisticRegression
    partition: {kind: iid}
    batchSize: 16
    steps: 2000000
";

const JOB: &str = "/api/v1/namespaces/demo/jobs/flood";

/// How long a kill may wait to be counted: the trainer's exit is seen at once, and the next
/// step of the driver counts it.
const COUNTED_WITHIN: f64 = 5.0;

fn start(dir: &Path, chaos: &[&str]) -> Run {
    let manifest = dir.join("flood.yaml");
    std::fs::write(&manifest, MANIFEST).unwrap();
    let mut args = vec!["--eval-every", "10"];
    args.extend_from_slice(chaos);
    Run::start(manifest.to_str().unwrap(), &args)
}

/// Posts signed peer events as a member the job does not have, as fast as the control endpoint
/// takes them, until `stop`: each is a message for the runtime, and none changes the job.
/// Counts the accepted ones.
fn flood(port: u16, key: Vec<u8>, member: u32, stop: Arc<AtomicBool>, accepted: Arc<AtomicU64>) {
    let path = control::peer_events_path("demo", "flood", member);
    let mut sequence = 0;
    while !stop.load(Ordering::Relaxed) {
        sequence += 1;
        let body = serde_json::to_vec(&PeerEvent {
            member_id: member,
            peer: 0,
            round: sequence,
            reason: DropReason::Timeout,
            topology_version: 1,
        })
        .unwrap();
        let envelope = Envelope {
            attempt: 0,
            sequence,
            time_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64,
        };
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
            continue;
        };
        let mut request = format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (name, value) in control::signed_headers(&key, "POST", &path, &envelope, &body) {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        let mut response = String::new();
        if s.write_all(request.as_bytes()).is_ok()
            && s.write_all(&body).is_ok()
            && s.read_to_string(&mut response).is_ok()
            && response.starts_with("HTTP/1.1 204")
        {
            accepted.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Processes whose environment names `dir`: the trainers of the run writing there.
fn trainers_of(dir: &Path) -> Vec<u32> {
    let needle = dir.to_str().unwrap().as_bytes();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let trainer = cmdline
            .split(|&b| b == 0)
            .next()
            .is_some_and(|exe| exe.ends_with(b"murmur-trainer"));
        if trainer && environ.windows(needle.len()).any(|w| w == needle) {
            found.push(pid);
        }
    }
    found
}

/// Waits up to `limit` for the run's trainers to be gone; the ones left.
fn trainers_gone_within(dir: &Path, limit: Duration) -> Vec<u32> {
    let deadline = Instant::now() + limit;
    loop {
        let left = trainers_of(dir);
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_flood_of_signed_posts_delays_neither_chaos_nor_ctrl_c() {
    let dir = tempfile::tempdir().unwrap();
    let run = start(dir.path(), &["--chaos", "preempt", "--every", "4s"]);
    let stop = Arc::new(AtomicBool::new(false));
    let accepted = Arc::new(AtomicU64::new(0));
    let mut flooders = Vec::new();
    // (member, attempt) -> when murmur sent the kill, and when it counted the preemption (seconds
    // since the job started).
    let mut kills: BTreeMap<(u64, u64), f64> = BTreeMap::new();
    let mut counted: BTreeMap<(u64, u64), f64> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let Some(port) = run.port() else {
            assert!(Instant::now() < deadline, "murmur never printed its port");
            continue;
        };
        if flooders.is_empty() {
            let key = std::fs::read(run.output().join("peer-key")).unwrap();
            for member in [1000, 1001] {
                let (key, stop, accepted) = (key.clone(), stop.clone(), accepted.clone());
                flooders.push(std::thread::spawn(move || {
                    flood(port, key, member, stop, accepted)
                }));
            }
        }
        if let Some((200, body)) = http_get(port, &format!("{JOB}/events")) {
            let events: serde_json::Value = serde_json::from_str(&body).unwrap();
            for e in events.as_array().unwrap() {
                if e["reason"] == "Chaos" {
                    let key = (e["member"].as_u64().unwrap(), attempt_of(e));
                    kills.entry(key).or_insert(e["atSeconds"].as_f64().unwrap());
                }
            }
        }
        let Some((200, body)) = http_get(port, JOB) else {
            continue;
        };
        let view: serde_json::Value = serde_json::from_str(&body).unwrap();
        for p in view["preemptionHistory"].as_array().unwrap() {
            let key = (
                p["member"].as_u64().unwrap(),
                p["attempt"].as_u64().unwrap(),
            );
            counted
                .entry(key)
                .or_insert(p["atSeconds"].as_f64().unwrap());
        }
        // Seconds since the job started, as the events and preemptions count them.
        let now = view["elapsedSeconds"].as_f64().unwrap();
        for (key, &killed) in &kills {
            match counted.get(key) {
                Some(&at) => assert!(
                    at - killed <= COUNTED_WITHIN,
                    "member {key:?} was killed at {killed:.1} and counted only {:.1} s later",
                    at - killed
                ),
                None => assert!(
                    now - killed <= COUNTED_WITHIN + 2.0,
                    "member {key:?} was killed {:.1} s ago and is not counted yet",
                    now - killed
                ),
            }
        }
        let all_counted = kills.keys().all(|k| counted.contains_key(k));
        if kills.len() >= 3 && all_counted {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {} chaos kills in 180 s ({} counted)",
            kills.len(),
            counted.len()
        );
    }
    let output = run.output().to_path_buf();
    let members = trainers_of(&output);
    assert!(!members.is_empty(), "the job's trainers run");

    // Ctrl-C, still flooded: every member leaves, and no replacement starts after it.
    let interrupted = Instant::now();
    let finished = run.interrupt();
    stop.store(true, Ordering::Relaxed);
    for f in flooders {
        f.join().unwrap();
    }
    assert_eq!(finished.status.code(), Some(130), "{}", finished.stdout);
    let worst = kills
        .iter()
        .map(|(key, killed)| counted[key] - killed)
        .fold(0.0, f64::max);
    println!(
        "{} kills, counted at worst {worst:.2} s after, under {} flooding posts; Ctrl-C to exit {:.1} s",
        kills.len(),
        accepted.load(Ordering::Relaxed),
        interrupted.elapsed().as_secs_f64()
    );
    let left = trainers_gone_within(&output, Duration::from_secs(2));
    assert!(
        left.is_empty(),
        "trainers {left:?} still run after murmur exited:\n{}",
        finished.stdout
    );
}

#[test]
fn a_murmur_killed_outright_takes_its_trainers_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let run = start(dir.path(), &[]);
    let deadline = Instant::now() + Duration::from_secs(120);
    let output = run.output().to_path_buf();
    while trainers_of(&output).len() < 4 {
        assert!(Instant::now() < deadline, "the four trainers never started");
        std::thread::sleep(Duration::from_millis(200));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(run.pid() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let left = trainers_gone_within(&output, Duration::from_secs(30));
    assert!(
        left.is_empty(),
        "trainers {left:?} outlived their murmur by 30 s"
    );
    drop(run);
}
