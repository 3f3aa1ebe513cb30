//! Trainers on separate hosts, made on this machine with network namespaces: each member in its
//! own namespace behind a veth, all plugged into a bridge in a "switch" namespace. The test makes
//! the namespaces and removes them, and touches nothing outside them.
//!
//! - A ring of six partitioned into two halves for 30 s: both halves keep training, and after
//!   healing the members' consensus distance gets back below its pre-partition level within a
//!   bounded number of rounds (printed).
//! - One member slow and lossy for 20 s (`tc netem delay 200ms loss 1%`, or where the kernel has
//!   no netem a tbf rate limit and iptables loss): the job completes; its neighbours drop it from
//!   rounds it is late for, and it rejoins.
//!
//! Needs root, iproute2 (`ip`, `tc`) and iptables. Without them the tests say which is missing
//! and pass, unless MURMUR_REQUIRE_NETNS=1 (CI sets it).

mod support;

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use murmur_core::api::TopologyKind;
use support::{Reaper, http_get_at, read_log, trainer_command, write_job};

const PEER_PORT: u16 = 7070;
const STATUS_PORT: u16 = 7071;

/// Run a program; its stderr is the error.
fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    run("ip", args).map_err(|e| format!("ip {}: {e}", args.join(" ")))
}

/// Namespaces `<prefix>sw` (the switch) and `<prefix>0..n`, member i at 10.<net>.0.(i+1).
struct Hosts {
    prefix: String,
    net: u8,
    n: u32,
}

impl Hosts {
    /// None (with the reason) where namespaces cannot be made.
    fn create(tag: &str, n: u32) -> Result<Self, String> {
        let pid = std::process::id();
        let hosts = Hosts {
            prefix: format!("m{tag}{}-", pid % 100_000),
            net: if tag == "p" { 100 } else { 150 } + (pid % 50) as u8,
            n,
        };
        let sw = hosts.switch();
        ip(&["netns", "add", &sw])?;
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &sw, "link", "set", "br0", "up"])?;
        ip(&[
            "-n",
            &sw,
            "addr",
            "add",
            &format!("10.{}.0.254/24", hosts.net),
            "dev",
            "br0",
        ])?;
        for i in 0..n {
            let ns = hosts.ns(i);
            ip(&["netns", "add", &ns])?;
            ip(&[
                "link",
                "add",
                "name",
                &format!("v{i}"),
                "netns",
                &sw,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                &ns,
            ])?;
            ip(&[
                "-n",
                &sw,
                "link",
                "set",
                &format!("v{i}"),
                "master",
                "br0",
                "up",
            ])?;
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/24", hosts.ip(i)),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(hosts)
    }

    fn switch(&self) -> String {
        format!("{}sw", self.prefix)
    }
    fn ns(&self, i: u32) -> String {
        format!("{}{i}", self.prefix)
    }
    fn ip(&self, i: u32) -> String {
        format!("10.{}.0.{}", self.net, i + 1)
    }

    /// Members in `a` and in `b` can no longer reach each other (blackhole routes both ways).
    fn partition(&self, a: &[u32], b: &[u32], add: bool) {
        for (from, to) in [(a, b), (b, a)] {
            for &i in from {
                for &j in to {
                    let verb = if add { "add" } else { "del" };
                    ip(&[
                        "-n",
                        &self.ns(i),
                        "route",
                        verb,
                        "blackhole",
                        &format!("{}/32", self.ip(j)),
                    ])
                    .unwrap();
                }
            }
        }
    }

    /// Run `f` on a thread inside the switch namespace (which reaches every member).
    fn in_switch<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/var/run/netns/{}", self.switch());
        std::thread::scope(|s| {
            s.spawn(|| {
                let file = std::fs::File::open(&path).unwrap();
                // This thread only.
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                    .unwrap_or_else(|e| panic!("setns {path}: {e}"));
                f()
            })
            .join()
            .unwrap()
        })
    }

    /// Every member's /status (None for one that does not answer).
    fn statuses(&self) -> Vec<Option<serde_json::Value>> {
        let addresses: Vec<String> = (0..self.n).map(|i| self.ip(i)).collect();
        self.in_switch(move || {
            addresses
                .iter()
                .map(|a| {
                    let (code, body) = http_get_at(a, STATUS_PORT, "/status")?;
                    (code == 200).then(|| serde_json::from_str(&body).ok())?
                })
                .collect()
        })
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for i in 0..self.n {
            let _ = ip(&["netns", "del", &self.ns(i)]);
        }
        let _ = ip(&["netns", "del", &self.switch()]);
    }
}

/// One scenario at a time: both are timing-sensitive, and share the machine's two cores.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The hosts, or None when this machine cannot make them (and CI does not insist). `tools`:
/// the programs the scenario runs besides `ip`.
fn hosts(tag: &str, n: u32, tools: &[(&str, &str)]) -> Option<Hosts> {
    let mut needed = vec![("ip", "iproute2")];
    needed.extend_from_slice(tools);
    if !support::tools::available(tag, &needed, "MURMUR_REQUIRE_NETNS") {
        return None;
    }
    match Hosts::create(tag, n) {
        Ok(h) => Some(h),
        Err(why) => {
            assert!(
                std::env::var_os("MURMUR_REQUIRE_NETNS").is_none(),
                "network namespaces are required here: {why}"
            );
            eprintln!("skipping: cannot make network namespaces ({why}); needs root and iproute2");
            None
        }
    }
}

/// A job on the hosts: manifest, key and topology file in a temporary folder.
struct Job {
    dir: tempfile::TempDir,
}

impl Job {
    fn new(hosts: &Hosts, kind: TopologyKind, manifest: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        write_job(dir.path(), hosts.n, kind, manifest, |i| {
            format!("{}:{PEER_PORT}", hosts.ip(i))
        });
        Self { dir }
    }

    fn log(&self, i: u32) -> PathBuf {
        self.dir.path().join(format!("member-{i}.log"))
    }

    fn spawn(&self, hosts: &Hosts, i: u32) -> Child {
        trainer_command(
            &["ip", "netns", "exec", &hosts.ns(i)],
            self.dir.path(),
            "netns",
            i,
            format!("{}:{PEER_PORT}", hosts.ip(i)),
            format!("{}:{STATUS_PORT}", hosts.ip(i)),
            &self.log(i),
        )
        .spawn()
        .unwrap()
    }
}

fn field(status: &Option<serde_json::Value>, name: &str) -> Option<f64> {
    status.as_ref()?[name].as_f64()
}

/// (smallest step, largest consensus distance) over the members, once all answer.
fn sample(hosts: &Hosts) -> Option<(u64, f64)> {
    let statuses = hosts.statuses();
    let steps: Option<Vec<f64>> = statuses.iter().map(|s| field(s, "step")).collect();
    let distances: Option<Vec<f64>> = statuses
        .iter()
        .map(|s| field(s, "consensusDistance"))
        .collect();
    Some((
        steps?.into_iter().fold(f64::MAX, f64::min) as u64,
        distances?.into_iter().fold(0.0, f64::max),
    ))
}

fn wait_sample(
    hosts: &Hosts,
    within: Duration,
    what: &str,
    mut ok: impl FnMut(u64, f64) -> bool,
) -> (u64, f64) {
    let deadline = Instant::now() + within;
    loop {
        if let Some((step, distance)) = sample(hosts)
            && ok(step, distance)
        {
            return (step, distance);
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

const RING: &str = "\
apiVersion: murmur.dev/v1alpha1
kind: DecentralizedTrainingJob
metadata: {name: netns}
spec:
  replicas: {min: 1, target: 6, max: 6}
  topology: {kind: ring}
  algorithm: {kind: dpsgd, roundTimeout: 1s}
  training: {model: mlp, partition: {kind: classesPerMember, k: 5}, steps: 100000, seed: 3, learningRate: 0.05}
";

#[test]
fn a_partitioned_ring_keeps_training_in_both_halves_and_reconverges_after_healing() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(hosts) = hosts("p", 6, &[]) else {
        return;
    };
    let job = Job::new(&hosts, TopologyKind::Ring, RING);
    let reaper = Reaper((0..6).map(|i| job.spawn(&hosts, i)).collect());

    // Warm up: everyone trains with everyone.
    let (start, _) = wait_sample(
        &hosts,
        Duration::from_secs(120),
        "all six training",
        |s, _| s >= 40,
    );
    // The consensus distance before: the largest over members, averaged over a few samples.
    let mut before = Vec::new();
    while before.len() < 8 {
        if let Some((_, d)) = sample(&hosts) {
            before.push(d);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let before = before.iter().sum::<f64>() / before.len() as f64;

    let (a, b) = ([0, 1, 2], [3, 4, 5]);
    hosts.partition(&a, &b, true);
    let cut_at = sample(&hosts).unwrap().0;
    std::thread::sleep(Duration::from_secs(30));
    let statuses = hosts.statuses();
    for (i, s) in statuses.iter().enumerate() {
        let step =
            field(s, "step").unwrap_or_else(|| panic!("member {i} stopped answering")) as u64;
        assert!(
            step > cut_at + 5,
            "member {i} stalled during the partition: step {step} (cut at {cut_at})"
        );
    }
    let (healed_at, during) = sample(&hosts).unwrap();
    hosts.partition(&a, &b, false);
    // The cut was real: the members at its two ends went on without each other.
    for (member, peer) in [(2, 3), (3, 2), (0, 5), (5, 0)] {
        let cut = drops(&job, member, peer, None);
        assert!(
            cut.iter().any(|&r| r >= cut_at),
            "member {member} never dropped {peer} during the partition"
        );
    }

    // Healed: how many rounds until every member's distance to its neighbours is back below
    // where it was before the cut.
    let (back_at, after) =
        wait_sample(&hosts, Duration::from_secs(180), "reconvergence", |s, d| {
            s > healed_at && d < before
        });
    let rounds = back_at - healed_at;
    println!(
        "partition: consensus distance {before:.3e} before, {during:.3e} at healing, {after:.3e} after {rounds} rounds (steps {start}..{back_at})"
    );
    assert!(rounds <= 200, "took {rounds} rounds to reconverge");
    drop(reaper);
}

const STRAGGLER: &str = "\
apiVersion: murmur.dev/v1alpha1
kind: DecentralizedTrainingJob
metadata: {name: netns}
spec:
  replicas: {min: 1, target: 4, max: 4}
  topology: {kind: ring}
  algorithm: {kind: dpsgd, roundTimeout: 500ms}
  training: {model: mlp, partition: {kind: classesPerMember, k: 5}, steps: 300, seed: 3, learningRate: 0.05}
";

/// Make `member` slow and lossy: `tc netem delay 200ms loss 1%` where the kernel has netem.
/// Kernels without it (CONFIG_NET_SCH_NETEM unset, like our CI's) get the closest we can build:
/// a token-bucket rate limit of 8 Mbit/s on its link, which delays each of its ~0.8 MB payloads
/// by about as long as a round may wait, and iptables dropping 1% of what it sends. Returns
/// which one it used.
fn slow_and_lossy(hosts: &Hosts, member: u32) -> &'static str {
    let ns = hosts.ns(member);
    let netem = [
        "-n", &ns, "qdisc", "add", "dev", "eth0", "root", "netem", "delay", "200ms", "loss", "1%",
    ];
    match run("tc", &netem) {
        Ok(()) => "netem delay 200ms loss 1%",
        Err(e) if e.contains("unknown") => {
            let tbf = [
                "-n", &ns, "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "8mbit", "burst",
                "32kbit", "latency", "5s",
            ];
            run("tc", &tbf).unwrap();
            let loss = [
                "netns",
                "exec",
                &ns,
                "iptables",
                "-A",
                "OUTPUT",
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                "0.01",
                "-j",
                "DROP",
            ];
            run("ip", &loss).unwrap_or_else(|e| panic!("iptables (apt-get install iptables): {e}"));
            "tbf rate 8mbit + iptables 1% loss (this kernel has no netem)"
        }
        Err(e) => panic!("tc netem: {e}"),
    }
}

fn back_to_normal(hosts: &Hosts, member: u32) {
    let ns = hosts.ns(member);
    run("tc", &["-n", &ns, "qdisc", "del", "dev", "eth0", "root"]).unwrap();
    let _ = run("ip", &["netns", "exec", &ns, "iptables", "-F", "OUTPUT"]);
}

/// Rounds in which `member` logged dropping `peer` (for `reason`, or any).
fn drops(job: &Job, member: u32, peer: u32, reason: Option<&str>) -> Vec<u64> {
    read_log(&job.log(member))
        .iter()
        .filter(|l| {
            l["fields"]["message"] == "neighbour dropped from the round"
                && l["fields"]["peer"].as_u64() == Some(u64::from(peer))
                && reason.is_none_or(|r| l["fields"]["reason"] == r)
        })
        .filter_map(|l| l["fields"]["round"].as_u64())
        .collect()
}

#[test]
fn a_slow_lossy_member_is_dropped_from_rounds_it_is_late_for_and_rejoins() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // tc shapes the member's link; iptables drops its packets where the kernel has no netem.
    let Some(hosts) = hosts("s", 4, &[("tc", "iproute2"), ("iptables", "iptables")]) else {
        return;
    };
    let job = Job::new(&hosts, TopologyKind::Ring, STRAGGLER);
    let mut reaper = Reaper((0..4).map(|i| job.spawn(&hosts, i)).collect());
    // Sampled before the fault: once member 2 is slow its status may be lost or late.
    let (slow_from, _) = wait_sample(
        &hosts,
        Duration::from_secs(120),
        "all four training",
        |s, _| s >= 20,
    );
    // Member 2 turns slow and lossy for 20 s.
    let how = slow_and_lossy(&hosts, 2);
    std::thread::sleep(Duration::from_secs(20));
    let slow_until = sample(&hosts).map(|s| s.0).unwrap_or(slow_from);
    back_to_normal(&hosts, 2);
    reaper.all_succeed(Duration::from_secs(300));
    // Its neighbours (1 and 3) went on without it in rounds it was late for…
    for neighbour in [1, 3] {
        let late = drops(&job, neighbour, 2, Some("timeout"));
        assert!(
            !late.is_empty(),
            "member {neighbour} never dropped the straggler"
        );
        // …and averaged with it again once it was back: no drop in the last rounds.
        let last = late.iter().max().copied().unwrap_or(0);
        println!(
            "straggler ({how}): member {neighbour} dropped it in {} rounds (slow during steps {slow_from}..{slow_until}), last at round {last} of 300",
            late.len()
        );
        assert!(
            last < 280,
            "member {neighbour} still dropped it at round {last}"
        );
    }
    drop(reaper);
}
