//! `murmur-trainer run`: one member of a job, in a pod or as a local process. It trains its
//! shard and averages with its neighbours over the TCP transport, using the same member code as
//! the simulator; follows the topology at round boundaries; joins by fetching state from a live
//! neighbour; leaves cleanly on SIGTERM; checkpoints; and reports to the control endpoint.

mod checkpoint;
mod control;
mod observe;
mod plan;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use burn::module::Module;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder, Recorder};
use burn::tensor::backend::AutodiffBackend;
use tokio::sync::{Notify, watch};

use murmur_core::api::{
    AlgorithmKind, DecentralizedTrainingJob, DecentralizedTrainingJobSpec, TopologyKind,
};
use murmur_core::contract::view::{edge_agreement, follows_whole_document};
use murmur_core::contract::{
    JoinReport, PeerEvent, TopologyDocument, TrainerEnv, TrainerState, TrainerStatus,
};
use murmur_core::topology::MemberId;

use crate::algorithms::{Exchange, Member, MemberError, Neighbourhood, Payload, Purpose};
use crate::data::{self, DataError, Dataset};
use crate::model::{Layout, Model};
use crate::transport::{Agreements, StateReply, Transport, TransportConfig, frame};

pub use checkpoint::{Checkpoint, CheckpointError, CheckpointMeta, newest_valid};
pub use control::{ControlClient, Followed, TopologySource};
pub use observe::Observed;
pub use plan::MemberPlan;

/// Local steps on a throw-away copy before a member measures its proxy vector.
pub const PROXY_WARMUP_STEPS: u64 = 20;

#[derive(Clone, Debug)]
pub struct RunOptions {
    /// SIGTERM to exit: finish the step, leave, checkpoint. GKE gives 30 s; we aim inside it.
    pub grace_period: Duration,
    /// Evaluate on the test split every this many steps (and at the end).
    pub eval_every: u64,
    /// How long a starting member waits for its neighbours before training without them.
    pub startup_timeout: Duration,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            grace_period: Duration::from_secs(20),
            eval_every: 25,
            startup_timeout: Duration::from_secs(30),
        }
    }
}

/// Everything a trainer process starts from.
pub struct RunSetup {
    pub env: TrainerEnv,
    pub spec: DecentralizedTrainingJobSpec,
    /// The per-job key (from the peer-key file). Never logged.
    pub key: Vec<u8>,
    pub options: RunOptions,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{file}: cannot read the peer key: {source}")]
    KeyFile {
        file: String,
        source: std::io::Error,
    },
    #[error("{file}: the peer key is empty")]
    EmptyKey { file: String },
    #[error("job spec: {0}")]
    Spec(String),
    #[error("no topology source: set MURMUR_TOPOLOGY_FILE or MURMUR_CONTROL_ENDPOINT")]
    NoTopologySource,
    #[error("cannot listen on {address}: {source}")]
    Bind {
        address: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Data(#[from] DataError),
    #[error(transparent)]
    Member(#[from] MemberError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("{file}: cannot write the final model: {message}")]
    FinalModel { file: String, message: String },
}

/// How a run ended; both are a clean exit.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The stopping target was reached.
    Done { step: u64, accuracy: f64 },
    /// SIGTERM: left the job at a round boundary.
    Left { step: u64 },
}

/// Keep freed large buffers in the heap instead of returning them to the kernel. A trainer
/// allocates model-sized buffers every round (received payloads, decoded parameters, averages);
/// with glibc's defaults each is a fresh mmap whose pages fault in one by one, which cost more
/// than the network copy itself (measured by benches/peer_exchange.rs: 0.14 s -> 0.09 s per
/// 10M-parameter exchange). Memory stays at its steady-state peak, which a trainer reaches in
/// its first round anyway. One arena for all threads: glibc's per-thread arenas grow in heaps
/// of at most 64 MB and serve anything larger with a fresh mmap whatever the threshold, so the
/// buffers a runtime worker thread allocated (received models) faulted in anew every round.
pub fn keep_freed_buffers() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: mallopt only sets allocator parameters; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 30);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Read the peer key: the file's bytes, less a trailing newline (`echo key > file`).
pub fn read_key(path: &Path) -> Result<Vec<u8>, RunError> {
    let file = path.display().to_string();
    let mut key = std::fs::read(path).map_err(|source| RunError::KeyFile {
        file: file.clone(),
        source,
    })?;
    while key.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        key.pop();
    }
    if key.is_empty() {
        return Err(RunError::EmptyKey { file });
    }
    Ok(key)
}

/// The job spec from `MURMUR_JOB_SPEC` (JSON), checked with the CRD's own rules.
pub fn spec_from_env(env: &TrainerEnv) -> Result<Option<DecentralizedTrainingJobSpec>, RunError> {
    let Some(text) = &env.job_spec else {
        return Ok(None);
    };
    let spec: DecentralizedTrainingJobSpec = serde_json::from_str(text).map_err(|e| {
        RunError::Spec(format!(
            "{} is not a valid spec: {e}",
            murmur_core::contract::env::JOB_SPEC
        ))
    })?;
    let job = DecentralizedTrainingJob::new(&env.job, spec);
    murmur_core::api::validate(&job).map_err(|violations| {
        RunError::Spec(
            violations
                .iter()
                .map(|v| format!("{}: {}", v.field, v.message))
                .collect::<Vec<_>>()
                .join("; "),
        )
    })?;
    Ok(Some(job.spec))
}

/// SIGTERM or SIGINT seen: leave at the next round boundary.
#[derive(Default)]
struct StopSignal {
    raised: AtomicBool,
    bell: Notify,
}

impl StopSignal {
    fn raised(&self) -> bool {
        self.raised.load(Ordering::Relaxed)
    }
}

fn watch_signals(stop: Arc<StopSignal>, grace: Duration) {
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::error!("cannot install signal handlers");
            return;
        };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: leaving at the next round boundary"),
            _ = int.recv() => tracing::info!("SIGINT: leaving at the next round boundary"),
        }
        stop.raised.store(true, Ordering::Relaxed);
        stop.bell.notify_waiters();
        // A backstop on its own thread: it fires even if the training thread is stuck.
        std::thread::spawn(move || {
            std::thread::sleep(grace);
            tracing::error!(
                grace_seconds = grace.as_secs_f64(),
                "did not leave within the grace period; exiting"
            );
            std::process::exit(1);
        });
    });
}

/// Times each exchange for the round-latency histogram.
struct Timed<'a> {
    transport: &'a mut Transport,
    observed: &'a Observed,
}

impl Exchange for Timed<'_> {
    async fn exchange(
        &mut self,
        round: u64,
        purpose: Purpose,
        outgoing: Vec<(MemberId, Payload)>,
        from: &[MemberId],
    ) -> Vec<(MemberId, Payload)> {
        let started = Instant::now();
        let got = self
            .transport
            .exchange(round, purpose, outgoing, from)
            .await;
        if purpose == Purpose::Parameters {
            self.observed.round(started.elapsed().as_secs_f64());
        }
        got
    }
}

/// How many members beyond its neighbourhood a joiner asks for state at a time.
const STATE_ASK_BATCH: usize = 8;

/// How many rounds a neighbour may be ahead before we take its state: past this, our payloads
/// are stale to it and its are out of our window, so rounds with it no longer meet.
const CATCH_UP_ROUNDS: u64 = crate::transport::book::STALE_ROUNDS;

/// The members of `doc` other than `me` and its `neighbours`, in the order a joiner asks them
/// for state: ids just above its own first, wrapping around, so that joiners spread their asks.
fn beyond_neighbourhood(
    doc: &TopologyDocument,
    me: MemberId,
    neighbours: &[MemberId],
) -> Vec<MemberId> {
    let mut ids: Vec<MemberId> = doc
        .members
        .iter()
        .map(|m| m.id)
        .filter(|&id| id != me && !neighbours.contains(&id))
        .collect();
    ids.sort_by_key(|&id| (id < me, id));
    ids
}

/// Everything the loop touches, so helpers stay small.
struct Trainer<B: AutodiffBackend> {
    env: TrainerEnv,
    plan: MemberPlan,
    member: Member<B>,
    test: Dataset,
    transport: Transport,
    observed: Arc<Observed>,
    control: Option<ControlClient>,
    stop: Arc<StopSignal>,
    topology: watch::Receiver<Option<Arc<Followed>>>,
    followed: Option<Arc<Followed>>,
    /// The algorithm's schedule spans the job: members follow the whole document and agree on
    /// its version, instead of following their views and agreeing on their edges' weights.
    whole: bool,
    hood: Option<Neighbourhood>,
    step: u64,
    total_steps: u64,
    eval_every: u64,
    /// Whether a round with peers has completed yet (logged once: the join latency).
    averaged_yet: bool,
    /// What this member reported on start; sent again whenever a topology leaves it out (the
    /// operator that took the first report may have restarted before it kept it).
    join: Option<JoinReport>,
    /// How long [`Trainer::fetch_state`] waits for neighbours.
    startup_timeout: Duration,
}

impl<B: AutodiffBackend> Trainer<B> {
    fn job_key(&self) -> String {
        format!("{}/{}", self.env.namespace, self.env.job)
    }

    /// Answer joining members with our step and parameters.
    fn serve_state_requests(&mut self) {
        let requests = self.transport.take_state_requests();
        if requests.is_empty() {
            return;
        }
        let parameters = self.member.parameters();
        for request in requests {
            tracing::info!(
                peer = request.from,
                step = self.step,
                "sending state to a joining member"
            );
            self.transport.reply_state(request, self.step, &parameters);
        }
    }

    /// Follow the newest topology, if it includes us. Called at round boundaries only.
    fn apply_topology(&mut self) -> bool {
        let latest = self.topology.borrow_and_update().clone();
        let Some(followed) = latest else {
            return self.hood.is_some();
        };
        if self
            .followed
            .as_ref()
            .is_some_and(|f| f.view.version == followed.view.version)
        {
            return self.hood.is_some();
        }
        let me = self.env.member_id;
        let view = &followed.view;
        let mut addresses: BTreeMap<MemberId, String> = view
            .neighbours
            .iter()
            .filter_map(|n| Some((n.id, n.address.clone()?)))
            .collect();
        let agreements = match &followed.document {
            Some(doc) if self.whole => {
                addresses.extend(
                    doc.members
                        .iter()
                        .filter(|m| m.id != me)
                        .filter_map(|m| Some((m.id, m.address.clone()?))),
                );
                Agreements::all(doc.version)
            }
            _ => Agreements {
                by_peer: view
                    .neighbours
                    .iter()
                    .map(|n| (n.id, edge_agreement(n.weight)))
                    .collect(),
                others: 0,
            },
        };
        self.transport.set_topology(agreements, addresses);
        let whole = followed.document.as_ref().filter(|_| self.whole);
        self.hood = Neighbourhood::from_view(view, whole);
        match &self.hood {
            Some(hood) => {
                let neighbours: Vec<MemberId> = hood.neighbours.iter().map(|(id, _)| *id).collect();
                self.transport.connect(&neighbours);
                tracing::info!(version = view.version, ?neighbours, "following topology");
            }
            None => {
                tracing::warn!(
                    version = view.version,
                    "this member is not in the topology; pausing"
                );
                if let (Some(c), Some(report)) = (self.control.clone(), self.join.clone()) {
                    tokio::spawn(async move { c.post_retrying(&c.join_path(), &report, 3).await });
                }
            }
        }
        let version = view.version;
        self.observed.update(|s| s.topology_version = version);
        self.followed = Some(followed);
        self.hood.is_some()
    }

    /// The version of the topology followed (0 before the first).
    fn topology_version(&self) -> u64 {
        self.followed.as_ref().map_or(0, |f| f.view.version)
    }

    /// Whether the job has come further than this member: the step the topology carries is
    /// ahead of ours.
    fn job_ahead(&self) -> bool {
        self.followed
            .as_ref()
            .is_some_and(|f| f.view.step > self.step)
    }

    /// The members beyond our neighbourhood, nearest last, for a joiner whose neighbours have
    /// not trained: read from the whole document (fetched once for this, when only the view is
    /// followed), their addresses handed to the transport.
    async fn members_beyond(&self, neighbours: &[MemberId]) -> Vec<MemberId> {
        let held = self.followed.as_ref().and_then(|f| f.document.clone());
        let doc = match (held, &self.control) {
            (Some(doc), _) => doc,
            (None, Some(c)) => match c.document_after(0).await {
                Ok(Some(doc)) => doc,
                Ok(None) => return Vec::new(),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the whole topology to find members beyond the neighbourhood");
                    return Vec::new();
                }
            },
            (None, None) => return Vec::new(),
        };
        let me = self.env.member_id;
        self.transport.learn_addresses(
            doc.members
                .iter()
                .filter(|m| m.id != me)
                .filter_map(|m| Some((m.id, m.address.clone()?))),
        );
        let mut beyond = beyond_neighbourhood(&doc, me, neighbours);
        beyond.reverse(); // popped from the back: nearest first
        beyond
    }

    async fn post_status(&self, attempts: u32) {
        if let Some(c) = &self.control {
            let status = self.observed.snapshot();
            c.post_retrying(&c.status_path(), &status, attempts).await;
        }
    }

    /// Post the status after an evaluation, without waiting: in a cluster nobody reads a
    /// trainer's `/status`, and the job's progress, curves and `kubectl get` columns come from
    /// these posts. One try; the next evaluation brings a newer one.
    fn report_progress(&self) {
        if let Some(c) = self.control.clone() {
            let status = self.observed.snapshot();
            tokio::spawn(async move { c.post_retrying(&c.status_path(), &status, 1).await });
        }
    }

    fn set_state(&self, state: TrainerState) {
        self.observed.update(|s| s.state = state);
        if let Some(c) = self.control.clone() {
            let status = self.observed.snapshot();
            tokio::spawn(async move { c.post_retrying(&c.status_path(), &status, 5).await });
        }
    }

    /// Wait (serving state requests) until a topology that includes us arrives.
    async fn wait_for_topology(&mut self) -> bool {
        loop {
            if self.stop.raised() {
                return false;
            }
            if self.apply_topology() {
                return true;
            }
            self.serve_state_requests();
            let stopped = self.stop.bell.notified();
            tokio::select! {
                _ = self.topology.changed() => {}
                _ = stopped => {}
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
    }

    /// Ask the neighbours for their state; adopt the most advanced one if it is ahead of ours.
    /// Starting members meet here too: it returns once every neighbour is connected and has
    /// answered, or one is ahead (we are joining a running job), or the startup timeout passes.
    /// When the topology says the job is under way and no neighbour has trained (a whole clique
    /// replaced at once), the members beyond the neighbourhood are asked, a few at a time, until
    /// one is ahead.
    async fn fetch_state(&mut self, timeout: Duration) -> Result<(), RunError> {
        let neighbours: Vec<MemberId> = self
            .hood
            .as_ref()
            .map(|h| h.neighbours.iter().map(|(id, _)| *id).collect())
            .unwrap_or_default();
        let under_way = self.job_ahead();
        let mut beyond: Option<Vec<MemberId>> = None;
        for &n in &neighbours {
            self.transport.request_state(n);
        }
        let mut asked_beyond: Vec<MemberId> = Vec::new();
        let deadline = Instant::now() + timeout;
        let mut replies: Vec<StateReply> = Vec::new();
        loop {
            self.serve_state_requests();
            replies.extend(self.transport.take_state_replies());
            let connected = self.transport.connected_peers();
            let replied = |n: &MemberId| replies.iter().any(|r| r.from == *n);
            let everyone = neighbours
                .iter()
                .all(|n| connected.contains(n) && replied(n))
                && asked_beyond.iter().all(replied);
            let ahead = replies.iter().any(|r| r.step > self.step);
            if ahead || self.stop.raised() || (everyone && !under_way) {
                break;
            }
            if everyone {
                if beyond.is_none() {
                    beyond = Some(self.members_beyond(&neighbours).await);
                }
                let beyond = beyond.as_mut().expect("just found");
                if beyond.is_empty() {
                    tracing::warn!("the job is under way, but no member that answered has trained");
                    break;
                }
                let batch: Vec<MemberId> =
                    (0..STATE_ASK_BATCH).map_while(|_| beyond.pop()).collect();
                tracing::info!(
                    ?batch,
                    "no neighbour has trained yet; asking members beyond them"
                );
                for &n in &batch {
                    self.transport.request_state(n);
                }
                asked_beyond.extend(batch);
                continue;
            }
            if Instant::now() >= deadline {
                tracing::warn!(
                    ?neighbours,
                    ?connected,
                    "not every neighbour showed up in time; starting without them"
                );
                break;
            }
            self.transport
                .changed(tokio::time::Instant::now() + Duration::from_millis(200))
                .await;
        }
        if let Some((peer, step)) = self.adopt_best(&replies)? {
            tracing::info!(peer, step, "state transferred from a neighbour");
        }
        Ok(())
    }

    /// Take the state of the most advanced of `replies`, if it is ahead of ours: its peer and
    /// step.
    fn adopt_best(&mut self, replies: &[StateReply]) -> Result<Option<(MemberId, u64)>, RunError> {
        let Some(best) = replies
            .iter()
            .filter(|r| r.step > self.step && r.parameters.len() == self.member.layout().len())
            .max_by_key(|r| r.step)
        else {
            return Ok(None);
        };
        self.member.set_parameters(&best.parameters)?;
        self.step = best.step;
        Ok(Some((best.from, best.step)))
    }

    /// Rounds with neighbours far ahead of us no longer meet: we wait a round timeout for each
    /// of their payloads, they for ours, and neither side ever catches up (a member that fell
    /// behind while a neighbour of it was lost, or while it was starved of CPU). Take the state
    /// of the most advanced of them, as a joiner does, and go on in step with them.
    async fn catch_up(&mut self) -> Result<(), RunError> {
        let ahead = self.transport.far_ahead(CATCH_UP_ROUNDS);
        if ahead.is_empty() {
            return Ok(());
        }
        for &peer in &ahead {
            self.transport.request_state(peer);
        }
        let deadline = Instant::now() + self.plan.round_timeout;
        let mut replies: Vec<StateReply> = Vec::new();
        loop {
            self.serve_state_requests();
            replies.extend(self.transport.take_state_replies());
            let answered = ahead.iter().all(|p| replies.iter().any(|r| r.from == *p));
            if answered || self.stop.raised() || Instant::now() >= deadline {
                break;
            }
            self.transport
                .changed(tokio::time::Instant::now() + Duration::from_millis(200))
                .await;
        }
        let behind = self.step;
        if let Some((peer, step)) = self.adopt_best(&replies)? {
            tracing::info!(
                peer,
                step,
                behind = step - behind,
                "caught up with a neighbour far ahead"
            );
        }
        Ok(())
    }

    fn report_drops(&self) {
        for d in self.transport.take_drops() {
            self.observed.dropped(d.reason);
            tracing::info!(
                peer = d.peer,
                round = d.round,
                reason = d.reason.as_str(),
                "neighbour dropped from the round"
            );
            if let Some(c) = self.control.clone() {
                let event = PeerEvent {
                    member_id: self.env.member_id,
                    peer: d.peer,
                    round: d.round,
                    reason: d.reason,
                    topology_version: self.topology_version(),
                };
                tokio::spawn(
                    async move { c.post_retrying(&c.peer_events_path(), &event, 3).await },
                );
            }
        }
    }

    fn checkpoint(&self) -> Result<(), RunError> {
        let Some(dir) = &self.env.checkpoint_dir else {
            return Ok(());
        };
        let (model, optimizer) = self.member.records()?;
        let path = Checkpoint {
            meta: CheckpointMeta {
                job: self.job_key(),
                member_id: self.env.member_id,
                step: self.step,
                topology_version: self.topology_version(),
                layout_fingerprint: self.member.layout().fingerprint(),
            },
            model,
            optimizer,
        }
        .save(dir)?;
        tracing::info!(step = self.step, file = %path.display(), "checkpoint written");
        Ok(())
    }

    fn restore_checkpoint(&mut self) -> Result<(), RunError> {
        let Some(dir) = self.env.checkpoint_dir.clone() else {
            return Ok(());
        };
        let (best, skipped) =
            newest_valid(&dir, &self.job_key(), self.member.layout().fingerprint());
        for e in skipped {
            tracing::warn!(error = %e, "skipping a checkpoint");
        }
        if let Some((path, c)) = best {
            match self.member.restore(c.model, c.optimizer) {
                Ok(()) => {
                    self.step = c.meta.step;
                    tracing::info!(step = self.step, file = %path.display(), "resumed from checkpoint");
                }
                Err(e) => {
                    tracing::warn!(error = %e, file = %path.display(), "skipping a checkpoint")
                }
            }
        }
        Ok(())
    }

    fn evaluate(&mut self) -> f64 {
        let (accuracy, _) = self.member.evaluate(&self.test);
        self.observed
            .update(|s| s.progress.accuracy = Some(accuracy));
        accuracy
    }

    async fn leave(&mut self) -> Result<Outcome, RunError> {
        self.set_state(TrainerState::Leaving);
        self.transport.leave(Duration::from_secs(2)).await;
        self.checkpoint()?;
        self.post_status(2).await;
        tracing::info!(step = self.step, "left the job");
        Ok(Outcome::Left { step: self.step })
    }

    /// The lowest member of the topology writes the final model.
    fn write_final_model(&mut self) -> Result<(), RunError> {
        let Some(dir) = self.env.model_dir().map(Path::to_path_buf) else {
            return Ok(());
        };
        if !self.followed.as_ref().is_some_and(|f| f.view.writes_model) {
            return Ok(());
        }
        let parameters = self.member.parameters();
        write_model(self.member.model(), self.member.layout(), &parameters, &dir)?;
        tracing::info!(dir = %dir.display(), "final model written (model.mpk, model.safetensors)");
        Ok(())
    }

    /// Asynchronous gossip, stopping target reached: keep answering neighbours that still train
    /// (members finish at their own pace), until none has asked for a round timeout — they are
    /// done or gone — or SIGTERM.
    async fn linger(&mut self) -> Result<(), RunError> {
        let Some(hood) = self.hood.clone() else {
            return Ok(());
        };
        let quiet = self.plan.round_timeout;
        let mut last_heard = Instant::now();
        let mut served = 0;
        while !self.stop.raised() && last_heard.elapsed() < quiet {
            self.serve_state_requests();
            let heard = self
                .member
                .gossip_serve(self.step, &hood, &mut self.transport)?;
            if heard > 0 {
                served += heard;
                last_heard = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tracing::info!(
            served,
            "stopping target reached; neighbours served until they were done"
        );
        Ok(())
    }

    async fn train(&mut self) -> Result<Outcome, RunError> {
        self.observed.set_ready(true);
        self.set_state(TrainerState::Training);
        let eval_every = self.eval_every.max(1);
        let mut recent_loss = Vec::new();
        while self.step < self.total_steps {
            if self.stop.raised() {
                return self.leave().await;
            }
            self.serve_state_requests();
            if !self.apply_topology() {
                self.observed.set_ready(false);
                self.set_state(TrainerState::Paused);
                if !self.wait_for_topology().await {
                    return self.leave().await;
                }
                // Back in a topology after a pause: the job may have moved on without us.
                if self.job_ahead() {
                    self.fetch_state(self.startup_timeout).await?;
                }
                self.observed.set_ready(true);
                self.set_state(TrainerState::Training);
            }
            self.catch_up().await?;
            let hood = self.hood.clone().expect("applied above");
            let report = if self.plan.member.algorithm == AlgorithmKind::AsyncGossip {
                // No rounds: whatever has arrived is mixed in, and nothing is waited for.
                self.member
                    .gossip_step(self.step, &hood, &mut self.transport)?
            } else {
                let mut timed = Timed {
                    transport: &mut self.transport,
                    observed: &self.observed,
                };
                self.member.step(self.step, &hood, &mut timed).await?
            };
            self.report_drops();
            if report.heard_from > 0 && !self.averaged_yet {
                self.averaged_yet = true;
                tracing::info!(
                    step = self.step,
                    peers = report.heard_from,
                    "first averaging round with peers"
                );
            }
            self.step += 1;
            recent_loss.push(report.loss);
            self.observed.stepped();
            let (step, seen) = (self.step, report.heard_from);
            let neighbours: Vec<u32> = hood.neighbours.iter().map(|(id, _)| *id).collect();
            let sent_to = &self.member.bytes_sent_to;
            self.observed.update(|s| {
                s.progress.step = step;
                s.progress.loss = Some(report.loss);
                s.bytes_sent_to.clone_from(sent_to);
                if let Some(d) = report.local_disagreement {
                    s.progress.consensus_distance = Some(d);
                }
                // Between averaging rounds nothing is heard, and nothing is lost either.
                if report.exchanged {
                    if seen == 0 {
                        s.neighbours_seen.clear();
                    } else {
                        s.neighbours_seen = neighbours;
                    }
                }
            });
            self.observed.refresh(self.transport.stats());
            if step.is_multiple_of(eval_every) || step == self.total_steps {
                let accuracy = self.evaluate();
                let loss = recent_loss.iter().sum::<f64>() / recent_loss.len().max(1) as f64;
                recent_loss.clear();
                if self.plan.member.algorithm == AlgorithmKind::AsyncGossip {
                    let c = self.member.gossip_counts();
                    tracing::info!(
                        step,
                        loss,
                        accuracy,
                        requested = c.requested,
                        served = c.served,
                        settled = c.settled,
                        stale = c.stale,
                        abandoned = c.abandoned,
                        "progress"
                    );
                } else {
                    tracing::info!(step, loss, accuracy, "progress");
                }
                self.report_progress();
            }
            if self
                .plan
                .checkpoint_every
                .is_some_and(|n| step.is_multiple_of(n))
            {
                self.checkpoint()?;
            }
        }
        if self.plan.member.algorithm == AlgorithmKind::AsyncGossip {
            self.linger().await?;
        }
        let accuracy = self.evaluate();
        self.write_final_model()?;
        self.observed.update(|s| s.state = TrainerState::Done);
        // Everything we owe the neighbours is queued before the leave: they finish their last
        // rounds with our payloads, then stop counting on us.
        self.transport.leave(Duration::from_secs(5)).await;
        self.post_status(5).await;
        tracing::info!(step = self.step, accuracy, "done");
        Ok(Outcome::Done {
            step: self.step,
            accuracy,
        })
    }
}

/// Write the model as a burn record (`model.mpk`) and as safetensors (`model.safetensors`).
pub fn write_model<B: AutodiffBackend>(
    model: &Model<B>,
    layout: &Layout,
    parameters: &[f32],
    dir: &Path,
) -> Result<(), RunError> {
    let fail = |file: &Path, message: String| RunError::FinalModel {
        file: file.display().to_string(),
        message,
    };
    std::fs::create_dir_all(dir).map_err(|e| fail(dir, e.to_string()))?;
    let record_path = dir.join("model");
    Recorder::<B>::record(
        &NamedMpkFileRecorder::<FullPrecisionSettings>::new(),
        model.clone().into_record(),
        record_path.clone(),
    )
    .map_err(|e| fail(&record_path.with_extension("mpk"), e.to_string()))?;
    let bytes: Vec<Vec<u8>> = layout
        .slots
        .iter()
        .map(|slot| {
            parameters[slot.offset..slot.offset + slot.len()]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect()
        })
        .collect();
    let tensors: Vec<(String, safetensors::tensor::TensorView<'_>)> = layout
        .slots
        .iter()
        .zip(&bytes)
        .map(|(slot, data)| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, slot.shape.clone(), data)
                .map(|view| (slot.path.clone(), view))
        })
        .collect::<Result<_, _>>()
        .map_err(|e| fail(&dir.join("model.safetensors"), e.to_string()))?;
    let path = dir.join("model.safetensors");
    safetensors::tensor::serialize_to_file(tensors, None, &path)
        .map_err(|e| fail(&path, e.to_string()))?;
    Ok(())
}

/// Run one member to the end. Call inside a multi-threaded tokio runtime's `block_on`: the
/// training compute holds this thread while the transport's tasks run on the workers.
pub async fn run<B: AutodiffBackend>(
    setup: RunSetup,
    device: B::Device,
) -> Result<Outcome, RunError> {
    let RunSetup {
        env,
        spec,
        key,
        options,
    } = setup;
    let plan = MemberPlan::from_spec(&spec);
    let me = env.member_id;
    let stop = Arc::new(StopSignal::default());
    watch_signals(stop.clone(), options.grace_period);

    let split = data::load(&spec.training.dataset)?;
    let parts = plan
        .partition
        .assign(&split.train.labels, plan.shards, plan.member.seed);
    let shard = split.train.subset(&parts[plan.shard_of(me)]);
    let total_steps = plan.total_steps(split.train.len());
    // Every member starts from the same model: the backend is seeded from the job's seed.
    B::seed(&device, plan.member.seed);
    let initial = Model::<B>::new(plan.model, &device);
    let proxy_vector = (plan.topology == TopologyKind::ProxyClumps)
        .then(|| -> Result<Vec<f32>, MemberError> {
            let mut warm = Member::new(
                me,
                plan.member.clone(),
                initial.clone(),
                shard.clone(),
                device.clone(),
            )?;
            for _ in 0..PROXY_WARMUP_STEPS {
                warm.local_step();
            }
            Ok(warm.proxy_vector(&split.proxy))
        })
        .transpose()?;
    let member = Member::new(me, plan.member.clone(), initial, shard, device)?;
    let layout_len = member.layout().len();

    let transport = Transport::bind(
        &env.listen_address,
        TransportConfig {
            job: frame::job_id(&env.namespace, &env.job),
            me,
            key: key.clone(),
            layout_fingerprint: member.layout().fingerprint(),
            // Parameters travel uncompressed at worst; state replies are exactly this size.
            max_message: (layout_len as u64) * 4 + (1 << 16),
            round_timeout: plan.round_timeout,
        },
    )
    .await
    .map_err(|source| RunError::Bind {
        address: env.listen_address.clone(),
        source,
    })?;
    let observed = Observed::new(TrainerStatus::new(me, TrainerState::Joining));
    let listener = tokio::net::TcpListener::bind(&env.status_address)
        .await
        .map_err(|source| RunError::Bind {
            address: env.status_address.clone(),
            source,
        })?;
    tokio::spawn(
        axum::serve(
            listener,
            observe::router(observed.clone(), transport.clone()),
        )
        .into_future(),
    );
    tracing::info!(
        member = me,
        peers = %transport.local_addr(),
        status = %env.status_address,
        steps = total_steps,
        "trainer listening"
    );

    let key = Arc::new(key);
    let control = env.control_endpoint.as_deref().map(|url| {
        ControlClient::new(
            url,
            &env.namespace,
            &env.job,
            (me, env.attempt),
            key.clone(),
        )
    });
    let source = match (&env.topology_file, &control) {
        (Some(file), _) => TopologySource::File(file.clone()),
        (None, Some(c)) => TopologySource::Control(c.clone()),
        (None, None) => return Err(RunError::NoTopologySource),
    };
    let whole = follows_whole_document(plan.member.algorithm, plan.topology);
    let (topology_tx, topology_rx) = watch::channel(None);
    tokio::spawn(control::follow(source, me, whole, topology_tx));

    let mut trainer = Trainer {
        env,
        plan,
        member,
        test: split.test,
        transport,
        observed,
        control,
        stop,
        topology: topology_rx,
        followed: None,
        whole,
        hood: None,
        step: 0,
        total_steps,
        eval_every: options.eval_every,
        averaged_yet: false,
        join: None,
        startup_timeout: options.startup_timeout,
    };
    trainer.restore_checkpoint()?;
    if let Some(c) = trainer.control.clone() {
        let report = JoinReport {
            member_id: me,
            label_histogram: trainer.member.label_histogram(),
            proxy_vector,
        };
        trainer.join = Some(report.clone());
        tokio::spawn(async move { c.post_retrying(&c.join_path(), &report, 30).await });
    }
    if !trainer.wait_for_topology().await {
        return trainer.leave().await;
    }
    trainer.fetch_state(trainer.startup_timeout).await?;
    trainer.train().await
}
