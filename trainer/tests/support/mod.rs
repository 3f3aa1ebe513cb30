//! Helpers for tests that run real `murmur-trainer run` processes on loopback.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use murmur_core::api::TopologyKind;
use murmur_core::topology::{self, BuildSpec, MemberProfile};

#[path = "../../../e2e/support/tools.rs"]
pub mod tools;

pub const KEY: &str = "test-job-key-0123456789";

/// A port nobody listens on right now, below Linux's ephemeral range (32768 and up): a port
/// the kernel handed out for `bind(0)` can be taken by any outgoing connection (a dialing peer)
/// before the trainer binds it. Each test process walks its own stretch of ports.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let _ = NEXT.compare_exchange(
        0,
        10_000 + (std::process::id() % 200) as u16 * 100,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    loop {
        let port = NEXT.fetch_add(1, Ordering::SeqCst);
        assert!(port < 32_000, "ran out of test ports");
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// Write a job's folder: `job.yaml`, the peer key, and a static `topology.json` of `n` members of
/// `kind` in which member `id` is at `address(id)`. Returns the manifest's path.
pub fn write_job(
    dir: &Path,
    n: u32,
    kind: TopologyKind,
    manifest: &str,
    address: impl Fn(u32) -> String,
) -> PathBuf {
    let profiles: Vec<MemberProfile> = (0..n).map(MemberProfile::bare).collect();
    let topo = topology::build(&BuildSpec::new(kind), &profiles).unwrap();
    let doc = topo.to_document(|id| Some(address(id)));
    std::fs::write(
        dir.join("topology.json"),
        serde_json::to_string_pretty(&doc).unwrap(),
    )
    .unwrap();
    std::fs::write(dir.join("peer-key"), format!("{KEY}\n")).unwrap();
    let manifest_path = dir.join("job.yaml");
    std::fs::write(&manifest_path, manifest).unwrap();
    manifest_path
}

/// `murmur-trainer run` as member `id` of job `job`, from the folder [`write_job`] wrote: peers
/// on `listen`, status on `status`, logs to `log`, no control endpoint. `wrapper` runs it, if
/// given (`ip netns exec NS`).
pub fn trainer_command(
    wrapper: &[&str],
    dir: &Path,
    job: &str,
    id: u32,
    listen: String,
    status: String,
    log: &Path,
) -> Command {
    let trainer = Path::new(env!("CARGO_BIN_EXE_murmur-trainer"));
    program_command(trainer, wrapper, dir, job, id, listen, status, log)
}

/// [`trainer_command`] of another trainer binary (one built on the library with a task of its
/// own).
#[allow(clippy::too_many_arguments)]
pub fn program_command(
    trainer: &Path,
    wrapper: &[&str],
    dir: &Path,
    job: &str,
    id: u32,
    listen: String,
    status: String,
    log: &Path,
) -> Command {
    let mut cmd = match wrapper.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(trainer);
            c
        }
        None => Command::new(trainer),
    };
    let log = std::fs::File::create(log).unwrap();
    cmd.args(["run", "--manifest"])
        .arg(dir.join("job.yaml"))
        .args(["--eval-every", "50"])
        .env("MURMUR_JOB", job)
        .env("MURMUR_NAMESPACE", "test")
        .env("MURMUR_MEMBER_ID", id.to_string())
        .env("MURMUR_LISTEN_ADDRESS", listen)
        .env("MURMUR_STATUS_ADDRESS", status)
        .env("MURMUR_PEER_KEY_FILE", dir.join("peer-key"))
        .env("MURMUR_TOPOLOGY_FILE", dir.join("topology.json"))
        .env_remove("MURMUR_CONTROL_ENDPOINT")
        .env_remove("MURMUR_JOB_SPEC")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log);
    cmd
}

pub struct Member {
    pub id: u32,
    pub peer_port: u16,
    pub status_port: u16,
}

/// A job of `n` members on loopback with a static topology file.
pub struct LocalJob {
    pub dir: tempfile::TempDir,
    pub members: Vec<Member>,
    pub manifest: PathBuf,
    /// The trainer binary its members run (`murmur-trainer` unless a test sets another).
    pub trainer: PathBuf,
}

impl LocalJob {
    pub fn new(n: u32, kind: TopologyKind, manifest: &str) -> Self {
        let mut dir = tempfile::tempdir().unwrap();
        // MURMUR_KEEP_TEST_DIRS=1 keeps logs and checkpoints for a post-mortem.
        if std::env::var_os("MURMUR_KEEP_TEST_DIRS").is_some() {
            dir.disable_cleanup(true);
            eprintln!("keeping {}", dir.path().display());
        }
        let members: Vec<Member> = (0..n)
            .map(|id| Member {
                id,
                peer_port: free_port(),
                status_port: free_port(),
            })
            .collect();
        let ports: BTreeMap<u32, u16> = members.iter().map(|m| (m.id, m.peer_port)).collect();
        let manifest = write_job(dir.path(), n, kind, manifest, |id| {
            format!("127.0.0.1:{}", ports[&id])
        });
        Self {
            dir,
            members,
            manifest,
            trainer: env!("CARGO_BIN_EXE_murmur-trainer").into(),
        }
    }

    /// The static topology document the job's folder holds.
    pub fn topology(&self) -> murmur_core::contract::TopologyDocument {
        let text = std::fs::read_to_string(self.dir.path().join("topology.json")).unwrap();
        murmur_core::contract::TopologyDocument::parse(&text).unwrap()
    }

    pub fn log_path(&self, id: u32, attempt: u32) -> PathBuf {
        self.dir.path().join(format!("member-{id}-{attempt}.log"))
    }

    pub fn spawn(&self, id: u32, attempt: u32, extra_env: &[(&str, String)]) -> Child {
        let mut cmd = self.command(id, attempt);
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        cmd.spawn().unwrap()
    }

    /// [`Self::spawn`] with more arguments to `murmur-trainer run`.
    pub fn spawn_with(&self, id: u32, attempt: u32, args: &[&str]) -> Child {
        self.command(id, attempt).args(args).spawn().unwrap()
    }

    fn command(&self, id: u32, attempt: u32) -> Command {
        let m = &self.members[id as usize];
        program_command(
            &self.trainer,
            &[],
            self.dir.path(),
            "loopback",
            id,
            format!("127.0.0.1:{}", m.peer_port),
            format!("127.0.0.1:{}", m.status_port),
            &self.log_path(id, attempt),
        )
    }

    /// GET a path on a member's status port; None if it does not answer.
    pub fn get(&self, id: u32, path: &str) -> Option<(u16, String)> {
        http_get(self.members[id as usize].status_port, path)
    }

    pub fn status(&self, id: u32) -> Option<serde_json::Value> {
        let (code, body) = self.get(id, "/status")?;
        (code == 200).then(|| serde_json::from_str(&body).ok())?
    }

    pub fn step(&self, id: u32) -> Option<u64> {
        self.status(id)?["step"].as_u64()
    }

    /// The JSON log lines of one process.
    pub fn log(&self, id: u32, attempt: u32) -> Vec<serde_json::Value> {
        read_log(&self.log_path(id, attempt))
    }

    /// One process's log as written, for a failing assertion to show.
    pub fn log_text(&self, id: u32, attempt: u32) -> String {
        std::fs::read_to_string(self.log_path(id, attempt)).unwrap_or_default()
    }
}

pub fn read_log(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The fields of the first log line whose message is `message`.
pub fn logged<'a>(lines: &'a [serde_json::Value], message: &str) -> Option<&'a serde_json::Value> {
    lines
        .iter()
        .map(|l| &l["fields"])
        .find(|f| f["message"] == message)
}

/// A bare HTTP/1.1 GET on loopback (no client library needed for a test).
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    http_get_at("127.0.0.1", port, path)
}

/// A bare HTTP/1.1 GET to `host` (an IPv4 address).
pub fn http_get_at(host: &str, port: u16, path: &str) -> Option<(u16, String)> {
    let address = format!("{host}:{port}").parse().ok()?;
    let mut s = TcpStream::connect_timeout(&address, Duration::from_secs(2)).ok()?;
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

/// Wait until `f` holds, or fail after `within`.
pub fn wait_for(within: Duration, what: &str, f: impl FnMut() -> bool) {
    wait_for_or_explain(within, what, f, String::new);
}

/// As [`wait_for`]; a timeout's message adds what `explain` says was seen.
pub fn wait_for_or_explain(
    within: Duration,
    what: &str,
    mut f: impl FnMut() -> bool,
    explain: impl FnOnce() -> String,
) {
    let deadline = Instant::now() + within;
    while !f() {
        if Instant::now() >= deadline {
            panic!("timed out waiting for {what}\n{}", explain());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Wait for a child to exit, killing it if it outlives `within`.
pub fn wait_exit(child: &mut Child, within: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Kills its processes when dropped, so a failing test leaves nothing behind.
#[derive(Default)]
pub struct Reaper(pub Vec<Child>);

impl Reaper {
    /// Every process exits successfully, each within `within` of the last; a hung one fails
    /// the test.
    pub fn all_succeed(&mut self, within: Duration) {
        self.all_but_succeed(&[], within);
    }

    /// [`Self::all_succeed`] for all but the processes at `skipped` (ones the test killed).
    pub fn all_but_succeed(&mut self, skipped: &[usize], within: Duration) {
        for (i, c) in self.0.iter_mut().enumerate() {
            if skipped.contains(&i) {
                continue;
            }
            let status = wait_exit(c, within).unwrap_or_else(|| panic!("process {i} hung"));
            assert!(status.success(), "process {i}: {status:?}");
        }
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{sig} failed");
}
