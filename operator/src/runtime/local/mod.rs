//! The local runtime (`murmur run`): the job driver's backend whose members are child processes
//! on this machine. It serves the status router (also the trainers' control endpoint), and after
//! everything that happens asks the driver for a plan and carries it out: spawn `murmur-trainer
//! run` with the same env contract a pod gets, signal processes to stop, read how they ended. The
//! driver's memory is written to `state/` of the run's folder for inspection; the process is the
//! control plane here, so nothing reads it back.

mod chaos;
mod output;
mod progress;
mod template;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use murmur_core::api::{
    DecentralizedTrainingJob, DecentralizedTrainingJobSpec, JobPhase, NamedMetric,
};
use murmur_core::contract::{TERMINATION_LOG, TrainerEnv, TrainerState, TrainerStatus};
use murmur_core::topology::MemberId;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::Serialize;
use tokio::sync::mpsc;
use tokio::time::MissedTickBehavior;

use crate::driver::{JobDriver, Memory};
use crate::member::{Ending, Health, ObservedMember, Termination, classify, exit};
use crate::planner::{Action, Event, Reason};
use crate::status::{self, Hub, Inbound, JobView};

pub use chaos::Chaos;

/// How often the runtime reads each live trainer's `/status`.
const SCRAPE_EVERY: Duration = Duration::from_millis(500);
/// How long stopped trainers get to leave before they are killed.
const STOP_GRACE: Duration = Duration::from_secs(25);
/// The driver plans at least this often, whatever happens.
const TICK: Duration = Duration::from_millis(250);
/// Trainer posts taken in one turn of the loop, before signals, exits and the clocks are looked
/// at again.
const INBOX_BATCH: usize = 1024;

#[derive(Clone, Debug)]
pub struct LocalOptions {
    /// `murmur-trainer` to run.
    pub trainer: PathBuf,
    /// Where the status router listens (`host:port`; port 0 picks one).
    pub status_address: String,
    /// Observer reads the status router serves per second (0: unpaced).
    pub reads_per_second: u32,
    pub chaos: Option<Chaos>,
    /// Final model, metrics, plots, logs and `summary.json` go here.
    pub output: Option<PathBuf>,
    /// Trainers evaluate on the test split every this many steps.
    pub eval_every: u32,
    /// Live progress bars (a terminal) rather than log lines.
    pub bars: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error(
        "cannot find the trainer binary `murmur-trainer` (looked in: {searched}); build it with `cargo build --release -p murmur-trainer` or pass --trainer PATH"
    )]
    TrainerNotFound { searched: String },
    #[error("cannot listen on {address} for the status endpoint: {source}")]
    Bind {
        address: String,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot start {path}: {source}")]
    Spawn {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no free port below 32768 for member {member}")]
    NoPort { member: u32 },
    #[error("interrupted; members were asked to leave and checkpoint")]
    Interrupted,
}

impl LocalError {
    pub fn exit_code(&self) -> u8 {
        match self {
            LocalError::TrainerNotFound { .. } => 2,
            LocalError::Interrupted => 130,
            _ => 1,
        }
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> LocalError + '_ {
    move |source| LocalError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What `murmur run` prints at the end and writes to `summary.json`.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub namespace: String,
    pub job: String,
    pub phase: JobPhase,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Mean test accuracy of the members that reached the target (tasks judged by accuracy).
    pub final_accuracy: Option<f64>,
    pub accuracy_min: Option<f64>,
    pub accuracy_max: Option<f64>,
    /// The same for a task judged by another metric (perplexity).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub final_metric: Option<FinalMetric>,
    pub members_completed: usize,
    pub steps: u64,
    pub wall_seconds: f64,
    /// Bytes every trainer sent to its peers, all attempts together.
    pub bytes_exchanged: u64,
    pub preemptions_survived: usize,
    pub restarts: u32,
    pub topology_version: u64,
    pub status_url: String,
}

/// A test figure over the members that reached the target.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FinalMetric {
    pub name: String,
    pub higher_is_better: bool,
    pub mean: f64,
    pub min: f64,
    pub max: f64,
}

impl FinalMetric {
    /// Mean, least and most of the figures named as the first one is (None when there are none).
    fn of(metrics: &[NamedMetric]) -> Option<FinalMetric> {
        let (first, values) = NamedMetric::like_first(metrics)?;
        Some(FinalMetric {
            name: first.name.clone(),
            higher_is_better: first.higher_is_better,
            mean: values.iter().sum::<f64>() / values.len() as f64,
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        })
    }
}

/// The trainer next to this executable, else on `PATH`.
pub fn find_trainer() -> Result<PathBuf, LocalError> {
    let mut searched = Vec::new();
    if let Ok(exe) = std::env::current_exe()
        && let Some(dir) = exe.parent()
    {
        let candidate = dir.join("murmur-trainer");
        if candidate.is_file() {
            return Ok(candidate);
        }
        searched.push(dir.display().to_string());
    }
    for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
        let candidate = dir.join("murmur-trainer");
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    searched.push("PATH".into());
    Err(LocalError::TrainerNotFound {
        searched: searched.join(", "),
    })
}

/// A port nobody listens on, below Linux's ephemeral range: a port handed out by `bind(0)`
/// could be taken by a trainer's outgoing connection before the trainer binds it.
fn free_port(next: &mut u16) -> Option<u16> {
    while *next < 32_000 {
        let port = *next;
        *next += 1;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Some(port);
        }
    }
    None
}

/// A trainer gets SIGTERM from the kernel when `murmur` dies, however it dies (SIGKILL, the OOM
/// killer, a panic): it leaves and checkpoints as on a stop, instead of training on unwatched.
/// The signal follows the thread that spawned it; `murmur run` spawns on the thread that runs
/// the job, which lives as long as the process.
fn stop_with_parent(command: &mut tokio::process::Command) {
    let parent = nix::unistd::getpid();
    #[allow(unsafe_code)]
    // SAFETY: the closure runs between fork and exec, and makes only async-signal-safe system
    // calls (prctl, getppid) and no allocation.
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)?;
            // murmur died before the signal was set: nobody would send it.
            if nix::unistd::getppid() != parent {
                return Err(nix::errno::Errno::ESRCH.into());
            }
            Ok(())
        });
    }
}

/// One process: a member's attempt.
struct Process {
    pid: Pid,
    status_address: String,
    /// Where it writes how it ended (`MURMUR_TERMINATION_LOG`).
    termination_log: PathBuf,
    /// The signal murmur sent it, if any.
    sent: Option<Signal>,
}

enum Happened {
    Ended {
        member: u32,
        attempt: u32,
        ended: Termination,
    },
    Scraped {
        member: u32,
        attempt: u32,
        status: TrainerStatus,
    },
}

/// The local backend of a job: its members are child processes.
struct Local {
    spec: DecentralizedTrainingJobSpec,
    namespace: String,
    name: String,
    options: LocalOptions,
    workdir: PathBuf,
    key_file: PathBuf,
    control_url: String,
    driver: JobDriver,
    /// What the processes show: each member's newest attempt.
    members: BTreeMap<MemberId, ObservedMember>,
    processes: BTreeMap<(MemberId, u32), Process>,
    /// The driver's memory as last written to `state/`.
    persisted: BTreeMap<String, String>,
    next_port: u16,
    happened: mpsc::UnboundedSender<Happened>,
    progress: progress::Progress,
    /// One client (and connection pool) for every `/status` read.
    http: reqwest::Client,
}

/// Run a job to its end on this machine.
pub async fn run(
    job: DecentralizedTrainingJob,
    options: LocalOptions,
) -> Result<Summary, LocalError> {
    let name = job.metadata.name.clone().unwrap_or_else(|| "job".into());
    let namespace = job
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let spec = job.spec;
    let (workdir, temporary) = match &options.output {
        Some(dir) => (dir.clone(), false),
        None => (
            std::env::temp_dir().join(format!("murmur-{name}-{}", std::process::id())),
            true,
        ),
    };
    std::fs::create_dir_all(workdir.join("logs")).map_err(io(&workdir))?;
    let key = super::new_job_key();
    let key_file = workdir.join("peer-key");
    write_private(&key_file, key.as_bytes())?;

    let hub = Arc::new(Hub::default());
    let listener = bind(&options.status_address).await?;
    let address = listener.local_addr().map_err(|source| LocalError::Bind {
        address: options.status_address.clone(),
        source,
    })?;
    let status_url = format!("http://{address}");
    tokio::spawn(status::serve(
        listener,
        status::router(
            hub.clone(),
            Arc::new(status::access::LocalUser),
            options.reads_per_second,
        ),
    ));
    let (driver, inbox) = JobDriver::start(
        hub,
        &namespace,
        &name,
        key.into_bytes(),
        Memory::new(Timestamp::now()),
    );
    let (happened, happenings) = mpsc::unbounded_channel();
    let mut local = Local {
        progress: progress::Progress::new(options.bars, &name, &spec),
        spec,
        namespace,
        name,
        workdir: workdir.clone(),
        key_file,
        control_url: status_url.clone(),
        driver,
        members: BTreeMap::new(),
        processes: BTreeMap::new(),
        persisted: BTreeMap::new(),
        next_port: 20_000 + (std::process::id() % 100) as u16 * 100,
        happened,
        options,
        http: reqwest::Client::new(),
    };
    local.progress.line(&format!(
        "murmur: job {}/{}: {} members, status and dashboard at {status_url}/",
        local.namespace, local.name, local.spec.replicas.target
    ));
    if let Some(t) = &local.spec.trainer.pod_template {
        local.progress.line(&template::notice(t));
    }
    let checkpoints = local.workdir.join("checkpoints");
    if std::fs::read_dir(&checkpoints).is_ok_and(|mut d| d.next().is_some()) {
        local.progress.line(&format!(
            "murmur: {} holds checkpoints of an earlier run: members resume from them (delete it to start over)",
            checkpoints.display()
        ));
    }
    local.drive(inbox, happenings).await?;

    let view = local.publish();
    local.progress.finish();
    let summary = local.summary(&view, status_url);
    // The key only meant something while the trainers ran.
    let _ = std::fs::remove_file(&local.key_file);
    if let Some(dir) = &local.options.output {
        output::write(
            dir,
            &summary,
            &view,
            local.driver.state(),
            local.driver.handle(),
        )?;
    } else if temporary && summary.phase == JobPhase::Succeeded {
        let _ = std::fs::remove_dir_all(&workdir);
    }
    Ok(summary)
}

async fn bind(address: &str) -> Result<tokio::net::TcpListener, LocalError> {
    match crate::status::listen(address).await {
        Ok(l) => Ok(l),
        // The default port is taken (another run?): any port will do, the URL is printed.
        Err(_) if address == DEFAULT_STATUS_ADDRESS => crate::status::listen("127.0.0.1:0")
            .await
            .map_err(|source| LocalError::Bind {
                address: address.to_string(),
                source,
            }),
        Err(source) => Err(LocalError::Bind {
            address: address.to_string(),
            source,
        }),
    }
}

pub const DEFAULT_STATUS_ADDRESS: &str = "127.0.0.1:8470";

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), LocalError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io(path))?;
    f.write_all(bytes).map_err(io(path))
}

impl Local {
    /// Until the job ends and its last process is gone: take what happens, plan, act.
    async fn drive(
        &mut self,
        mut inbox: mpsc::UnboundedReceiver<Inbound>,
        mut happenings: mpsc::UnboundedReceiver<Happened>,
    ) -> Result<(), LocalError> {
        let mut scrape = tokio::time::interval(SCRAPE_EVERY);
        let mut tick = tokio::time::interval(TICK);
        // A loop that fell behind takes one tick, not a burst of them.
        scrape.set_missed_tick_behavior(MissedTickBehavior::Skip);
        tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
        let mut chaos = self.options.chaos.as_mut().map(|c| c.schedule());
        let mut interrupted = false;
        let mut stopping_since: Option<tokio::time::Instant> = None;
        let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(io(Path::new("SIGTERM handler")))?;
        // One listener for the whole run: a `ctrl_c()` future made afresh in each turn of the loop
        // missed a Ctrl-C that came while the loop was busy (the job then ran on, chaos and all).
        let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
            .map_err(io(Path::new("SIGINT handler")))?;
        loop {
            // Signals and process exits first, then the clocks, trainers' posts last: posts
            // arriving faster than the driver plans must never hold back a Ctrl-C, a member's
            // exit or a chaos kill.
            let mut changed = false;
            tokio::select! {
                biased;
                _ = sigint.recv(), if !interrupted => {
                    interrupted = true;
                    self.progress.line("murmur: interrupted; asking members to leave");
                    self.stop_all(Signal::SIGTERM);
                    stopping_since = Some(tokio::time::Instant::now());
                }
                _ = sigterm.recv(), if !interrupted => {
                    interrupted = true;
                    self.stop_all(Signal::SIGTERM);
                    stopping_since = Some(tokio::time::Instant::now());
                }
                Some(h) = happenings.recv() => {
                    self.happened(h);
                    changed = true;
                }
                Some(_) = async { match &mut chaos { Some(c) => Some(c.tick().await), None => None } }, if chaos.is_some() => {
                    self.chaos();
                    changed = true;
                }
                // Time alone moves the plan on (round and startup timeouts, backoff), and posts
                // that changed no member's state show in the view by the next tick.
                _ = tick.tick() => changed = true,
                _ = scrape.tick() => self.scrape(),
                Some(message) = inbox.recv() => {
                    changed |= self.driver.receive(message, Timestamp::now());
                }
            }
            // What else is queued, at most a batch of posts: one plan answers all of it.
            while let Ok(h) = happenings.try_recv() {
                self.happened(h);
                changed = true;
            }
            for message in std::iter::from_fn(|| inbox.try_recv().ok()).take(INBOX_BATCH) {
                changed |= self.driver.receive(message, Timestamp::now());
            }
            if interrupted {
                // Members are leaving: nothing is planned, so no replacement starts.
                if self.processes.is_empty() {
                    self.publish();
                    return Err(LocalError::Interrupted);
                }
                if stopping_since.is_some_and(|t| t.elapsed() > STOP_GRACE) {
                    self.stop_all(Signal::SIGKILL);
                }
                continue;
            }
            if changed {
                self.step()?;
            }
            if self.driver.state().phase.is_finished() {
                if stopping_since.is_none() && !self.processes.is_empty() {
                    stopping_since = Some(tokio::time::Instant::now());
                }
                if stopping_since.is_some_and(|t| t.elapsed() > STOP_GRACE) {
                    self.stop_all(Signal::SIGKILL);
                }
                if self.processes.is_empty() {
                    return Ok(());
                }
            }
        }
    }

    fn happened(&mut self, h: Happened) {
        match h {
            Happened::Ended {
                member,
                attempt,
                ended,
            } => {
                let Some(p) = self.processes.remove(&(member, attempt)) else {
                    return;
                };
                let exit = classify(&self.ending(member, attempt, &p, ended));
                if let Some(f) = self.members.get_mut(&member)
                    && f.attempt == attempt
                {
                    f.exit = Some(exit);
                }
            }
            Happened::Scraped {
                member,
                attempt,
                status,
            } => {
                if self.processes.contains_key(&(member, attempt)) {
                    self.driver
                        .take_status(member, attempt, status, Timestamp::now());
                }
            }
        }
    }

    /// What is known of an ended process: what it wrote to its termination log first, then
    /// what it last reported and what murmur sent it.
    fn ending(&self, member: MemberId, attempt: u32, p: &Process, ended: Termination) -> Ending {
        let said = std::fs::read_to_string(&p.termination_log)
            .ok()
            .and_then(|text| exit::said(&text));
        // A signal murmur sent explains the end only if the process honoured it (a clean exit)
        // or died of it; a crash while leaving is still a crash.
        let cause = p.sent.and_then(|s| match ended {
            Termination::Code(0) => Some(format!("{s} sent by murmur; left the job cleanly")),
            Termination::Signal(n) if n == s as i32 => Some(format!("{s} sent by murmur")),
            _ => None,
        });
        Ending {
            ended: Some(ended),
            said,
            last: self.driver.last_state(member, attempt),
            cause,
            detail: None,
            // Processes have no pod conditions.
            conditions: Vec::new(),
        }
    }

    /// Plan, act, commit, persist.
    fn step(&mut self) -> Result<(), LocalError> {
        let now = Timestamp::now();
        let addresses: BTreeMap<MemberId, String> = self
            .members
            .iter()
            .filter_map(|(id, f)| Some((*id, f.address.clone()?)))
            .collect();
        let plan = self.driver.plan(
            &self.spec,
            None,
            self.members.clone(),
            &|id, _| addresses.get(&id).cloned(),
            now,
        );
        for action in &plan.actions {
            match *action {
                Action::Create {
                    member, attempt, ..
                } => self.spawn(member, attempt)?,
                Action::Stop { member, attempt } => self.signal(member, attempt, Signal::SIGTERM),
                Action::Event(_) => {}
            }
        }
        self.driver.commit(&plan, now);
        for e in &plan.events {
            self.progress.line(&format!("{}: {}", e.reason, e.message));
        }
        self.persist(&plan.memory, plan.document.as_deref())?;
        self.progress.update(&plan.view);
        Ok(())
    }

    /// Keep the driver's memory in `state/` (the files the operator keeps in the job's
    /// ConfigMap), written when it changes.
    fn persist(
        &mut self,
        memory: &Memory,
        document: Option<&murmur_core::contract::TopologyDocument>,
    ) -> Result<(), LocalError> {
        let data = memory.data(document);
        if data == self.persisted {
            return Ok(());
        }
        let dir = self.workdir.join("state");
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        for (key, text) in &data {
            if self.persisted.get(key) != Some(text) {
                let path = dir.join(key);
                std::fs::write(&path, text).map_err(io(&path))?;
            }
        }
        self.persisted = data;
        Ok(())
    }

    /// A chaos event: on the terminal and in the status API.
    fn event(&self, event: Event) {
        self.progress
            .line(&format!("{}: {}", event.reason, event.message));
        self.driver.record(event, Timestamp::now());
    }

    fn publish(&self) -> JobView {
        let view = self
            .driver
            .view(&self.spec, self.members.clone(), Timestamp::now());
        self.driver.publish(view.clone());
        view
    }

    fn spawn(&mut self, member: u32, attempt: u32) -> Result<(), LocalError> {
        let peer = free_port(&mut self.next_port).ok_or(LocalError::NoPort { member })?;
        let status_port = free_port(&mut self.next_port).ok_or(LocalError::NoPort { member })?;
        let listen_address = format!("127.0.0.1:{peer}");
        let env = TrainerEnv {
            job: self.name.clone(),
            namespace: self.namespace.clone(),
            member_id: member,
            attempt,
            listen_address: listen_address.clone(),
            status_address: format!("127.0.0.1:{status_port}"),
            control_endpoint: Some(self.control_url.clone()),
            peer_key_file: self.key_file.clone(),
            topology_file: None,
            checkpoint_dir: self
                .spec
                .checkpoint
                .as_ref()
                .map(|_| self.workdir.join("checkpoints")),
            output_dir: Some(self.workdir.join("model")),
            backend: self.spec.trainer.backend,
            job_spec: Some(self.spec.for_trainer()),
        };
        let log_path = self
            .workdir
            .join("logs")
            .join(format!("member-{member}-{attempt}.log"));
        let terminations = self.workdir.join("termination");
        std::fs::create_dir_all(&terminations).map_err(io(&terminations))?;
        let termination_log = terminations.join(format!("member-{member}-{attempt}.json"));
        let log = std::fs::File::create(&log_path).map_err(io(&log_path))?;
        let log_err = log.try_clone().map_err(io(&log_path))?;
        let mut command = tokio::process::Command::new(&self.options.trainer);
        command
            .arg("run")
            .args(["--eval-every", &self.options.eval_every.to_string()])
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .kill_on_drop(true);
        // Only the contract reaches the trainer: nothing from a surrounding MURMUR_* setup.
        for (k, _) in std::env::vars() {
            if murmur_core::contract::env::is_murmurs(&k) {
                command.env_remove(k);
            }
        }
        for e in &self.spec.trainer.env {
            if let Some(v) = &e.value {
                command.env(&e.name, v);
            }
        }
        command.envs(template::env(self.spec.trainer.pod_template.as_ref()));
        command.envs(env.to_vars());
        command.env(TERMINATION_LOG, &termination_log);
        if std::env::var_os("RUST_LOG").is_none() {
            command.env("RUST_LOG", "info");
        }
        stop_with_parent(&mut command);
        let mut child = command.spawn().map_err(|source| LocalError::Spawn {
            path: self.options.trainer.clone(),
            source,
        })?;
        let pid = child.id().unwrap_or(0);
        self.processes.insert(
            (member, attempt),
            Process {
                pid: Pid::from_raw(pid as i32),
                status_address: env.status_address.clone(),
                termination_log,
                sent: None,
            },
        );
        self.members.insert(
            member,
            ObservedMember {
                attempt,
                address: Some(listen_address),
                ..Default::default()
            },
        );
        let happened = self.happened.clone();
        tokio::spawn(async move {
            let ended = match child.wait().await {
                Ok(status) => Termination::from(status),
                Err(_) => Termination::Code(-1),
            };
            let _ = happened.send(Happened::Ended {
                member,
                attempt,
                ended,
            });
        });
        tracing::debug!(member, attempt, pid, "member started");
        Ok(())
    }

    fn signal(&mut self, member: u32, attempt: u32, signal: Signal) {
        if let Some(p) = self.processes.get_mut(&(member, attempt)) {
            // A child we started and have not reaped (its waiter holds it): the pid is ours.
            let _ = kill(p.pid, signal);
            if p.sent != Some(Signal::SIGKILL) {
                p.sent = Some(signal);
            }
        }
    }

    fn stop_all(&mut self, signal: Signal) {
        let all: Vec<(u32, u32)> = self.processes.keys().copied().collect();
        for (member, attempt) in all {
            self.signal(member, attempt, signal);
        }
    }

    /// Read every live trainer's `/status` in the background.
    fn scrape(&self) {
        for (&(member, attempt), p) in &self.processes {
            let url = format!("http://{}/status", p.status_address);
            let happened = self.happened.clone();
            let client = self.http.clone();
            tokio::spawn(async move {
                let Ok(response) = client.get(&url).timeout(SCRAPE_EVERY).send().await else {
                    return;
                };
                if let Ok(status) = response.json::<TrainerStatus>().await {
                    let _ = happened.send(Happened::Scraped {
                        member,
                        attempt,
                        status,
                    });
                }
            });
        }
    }

    /// Preempt one training member, chosen at random.
    fn chaos(&mut self) {
        let Some(chaos) = &mut self.options.chaos else {
            return;
        };
        let state = self.driver.state();
        if !chaos.striking() || state.finishing() || state.phase.is_finished() {
            return;
        }
        let candidates: Vec<(u32, u32)> = self
            .members
            .iter()
            .filter(|(id, f)| {
                f.exit.is_none()
                    && self.driver.last_state(**id, f.attempt) == Some(TrainerState::Training)
            })
            .map(|(id, f)| (*id, f.attempt))
            .filter(|k| self.processes.get(k).is_some_and(|p| p.sent.is_none()))
            .collect();
        let Some((member, attempt)) = chaos.pick(&candidates) else {
            return;
        };
        let signal = chaos.signal();
        self.signal(member, attempt, signal);
        self.event(Event::warning(
            Reason::Chaos,
            Some((member, attempt)),
            format!("{signal} to member {member} (attempt {attempt})"),
        ));
    }

    fn summary(&self, view: &JobView, status_url: String) -> Summary {
        let done: Vec<NamedMetric> = view
            .members
            .iter()
            .filter(|m| m.health == Health::Done)
            .filter_map(|m| m.progress.quality())
            .collect();
        // Accuracy keeps its own fields (`finalAccuracy`, ...); any other metric is named.
        let (accuracy, final_metric) = match FinalMetric::of(&done) {
            Some(q) if q.name == NamedMetric::ACCURACY => (Some(q), None),
            other => (None, other),
        };
        let state = self.driver.state();
        Summary {
            namespace: self.namespace.clone(),
            job: self.name.clone(),
            phase: state.phase,
            message: state.message.clone(),
            final_accuracy: accuracy.as_ref().map(|q| q.mean),
            accuracy_min: accuracy.as_ref().map(|q| q.min),
            accuracy_max: accuracy.as_ref().map(|q| q.max),
            final_metric,
            members_completed: done.len(),
            steps: view
                .members
                .iter()
                .map(|m| m.progress.step)
                .max()
                .unwrap_or(0),
            wall_seconds: view.elapsed_seconds,
            bytes_exchanged: self.driver.bytes_exchanged(),
            preemptions_survived: state.preemption_count() as usize,
            restarts: state.restarts,
            topology_version: state.last_version,
            status_url,
        }
    }
}
