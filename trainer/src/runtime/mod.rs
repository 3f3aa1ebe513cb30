//! `murmur-trainer run`: one member of a job, in a pod or as a local process. It trains its
//! shard and averages with its neighbours over the TCP transport, using the same member code as
//! the simulator; follows the topology at round boundaries; joins by fetching state from a live
//! neighbour; leaves cleanly on SIGTERM; checkpoints; and reports to the control endpoint.
//!
//! Where each concern lives:
//! - here: [`run`], which sets a member up and starts it; the trainer's state; the training
//!   loop; reports to the control endpoint; signals, leaving, and lingering after the target;
//! - `setup.rs`: [`RunSetup`], [`RunOptions`], [`RunError`], reading the peer key
//!   and the job spec, and the allocator settings of the process;
//! - `membership.rs`: following the topology, state transfer to and from joiners, catching up;
//! - `persist.rs`: using checkpoints (writing, resuming) and writing the final model;
//! - `checkpoint.rs`: the checkpoint files themselves;
//! - `control.rs`: the trainer's side of the control endpoint, and the topology source;
//! - `observe.rs`: `/healthz`, `/readyz`, `/metrics` and `/status`;
//! - `plan.rs`: what the job spec means for one member.

mod checkpoint;
mod control;
mod membership;
mod observe;
mod persist;
mod plan;
mod setup;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use burn::tensor::backend::AutodiffBackend;
use tokio::sync::{Notify, watch};

use murmur_core::api::{AlgorithmKind, NamedMetric, TopologyKind};
use murmur_core::contract::view::follows_whole_document;
use murmur_core::contract::{
    JoinReport, PeerEvent, TerminationMessage, TerminationOutcome, TrainerEnv, TrainerState,
    TrainerStatus,
};
use murmur_core::topology::MemberId;

use crate::algorithms::{Averaging, Exchange, Member, Neighbourhood, Payload, Purpose};
use crate::task::{Data, Task};
use crate::transport::{Transport, TransportConfig, frame};

pub use checkpoint::{Checkpoint, CheckpointError, CheckpointMeta, newest_valid};
pub use control::{ControlClient, Followed, TopologySource};
pub use observe::Observed;
pub use persist::write_model;
pub use plan::MemberPlan;
pub use setup::{RunError, RunOptions, RunSetup, keep_freed_buffers, read_key, spec_from_env};

/// Local steps on a throw-away copy before a member measures its proxy vector.
pub const PROXY_WARMUP_STEPS: u64 = 20;

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

/// Times what the training loop waits for each averaging round (the communication it does not
/// hide behind computation) for the round-latency histogram, and adds it to `waited`.
struct Timed<'a> {
    transport: &'a mut Transport,
    observed: &'a Observed,
    waited: &'a mut Duration,
}

impl Exchange for Timed<'_> {
    fn post_round(&mut self, round: u64, purpose: Purpose, outgoing: Vec<(MemberId, Payload)>) {
        self.transport.post_round(round, purpose, outgoing);
    }

    async fn collect_round(
        &mut self,
        round: u64,
        purpose: Purpose,
        from: &[MemberId],
    ) -> Vec<(MemberId, Payload)> {
        let started = Instant::now();
        let got = self.transport.collect_round(round, purpose, from).await;
        let waited = started.elapsed();
        *self.waited += waited;
        if purpose == Purpose::Parameters {
            self.observed.round(waited.as_secs_f64());
        }
        got
    }
}

/// Everything the loop touches, so helpers stay small.
struct Trainer<B: AutodiffBackend, T: Task> {
    env: TrainerEnv,
    plan: MemberPlan,
    member: Member<B, T>,
    test: T::Data,
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
    /// Trained from the shared initial model on our own data alone: started at step 0, and
    /// nothing taken or mixed from a peer since. Joiners get our step alone.
    trained_alone: bool,
    /// Time the loop waited for peers' payloads, all rounds together (logged at the end).
    waited: Duration,
    /// What this member reported on start; sent again whenever a topology leaves it out (the
    /// operator that took the first report may have restarted before it kept it).
    join: Option<JoinReport>,
    /// When the join report was last posted.
    joined_at: Instant,
    /// How long [`Trainer::fetch_state`] waits for neighbours.
    startup_timeout: Duration,
}

impl<B: AutodiffBackend, T: Task> Trainer<B, T> {
    fn job_key(&self) -> String {
        format!("{}/{}", self.env.namespace, self.env.job)
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

    /// Whether the last step ended an averaging round (with outer steps, the anchor was just
    /// moved). Each edge keeps its own schedule under auto averaging: any step is a boundary.
    fn at_round_boundary(&self) -> bool {
        match self.plan.member.averaging {
            Averaging::Every(n) => self.step.is_multiple_of(n.max(1)),
            Averaging::Auto(_) => true,
        }
    }

    /// The task's metric on the test set, recorded in the status under its name.
    fn evaluate(&mut self) -> NamedMetric {
        let (value, _) = self.member.evaluate(&self.test);
        let metric = self.member.task().metric();
        let quality = NamedMetric {
            name: metric.name.to_string(),
            value,
            higher_is_better: metric.higher_is_better,
        };
        // The step goes with it: a member that ends without a step of its own (a replacement
        // that resumed from a finished member's checkpoint) said its accuracy at step 0.
        let step = self.step;
        self.observed.update(|s| {
            s.progress.step = step;
            s.progress.set_quality(quality.clone());
        });
        quality
    }

    async fn leave(&mut self) -> Result<TerminationMessage, RunError> {
        self.set_state(TrainerState::Leaving);
        self.transport.leave(None, Duration::from_secs(2)).await;
        self.checkpoint()?;
        self.post_status(2).await;
        tracing::info!(step = self.step, "left the job");
        Ok(TerminationMessage {
            outcome: TerminationOutcome::Left,
            step: self.step,
            message: None,
        })
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

    async fn train(&mut self) -> Result<TerminationMessage, RunError> {
        self.observed.set_ready(true);
        self.set_state(TrainerState::Training);
        let training_began = Instant::now();
        let eval_every = self.eval_every.max(1);
        let mut recent_loss = Vec::new();
        while self.step < self.total_steps {
            if self.stop.raised() {
                return self.leave().await;
            }
            // A peer reached the stopping target (or ended because one of its own did): the job
            // is over. Trained on with whichever neighbours are left, a few members' models
            // drift to their few classes (with outer steps, 93% to 72% over the last 100 steps
            // of two replacements that lagged in a whole-job run). This member ends once the
            // round it is in is over (at once between two rounds), with the model it then holds:
            // the peers that finished queued their payloads for that round before they left.
            if let Some(ended) = self
                .transport
                .job_ended()
                .filter(|_| self.at_round_boundary())
            {
                tracing::info!(
                    step = self.step,
                    ended,
                    "a peer ended the job at its stopping target; ending here"
                );
                break;
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
                    waited: &mut self.waited,
                };
                self.member.step(self.step, &hood, &mut timed).await?
            };
            self.report_drops();
            if report.heard_from > 0 {
                self.trained_alone = false;
            }
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
                let quality = self.evaluate();
                let (accuracy, metric, value) = log_fields(&quality);
                let loss = recent_loss.iter().sum::<f64>() / recent_loss.len().max(1) as f64;
                recent_loss.clear();
                if self.plan.member.algorithm == AlgorithmKind::AsyncGossip {
                    let c = self.member.gossip_counts();
                    tracing::info!(
                        step,
                        loss,
                        accuracy,
                        metric,
                        value,
                        requested = c.requested,
                        served = c.served,
                        settled = c.settled,
                        stale = c.stale,
                        abandoned = c.abandoned,
                        "progress"
                    );
                } else {
                    tracing::info!(step, loss, accuracy, metric, value, "progress");
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
        let quality = self.evaluate();
        let (accuracy, metric, value) = log_fields(&quality);
        self.write_final_model()?;
        self.observed.update(|s| s.state = TrainerState::Done);
        // Everything we owe the neighbours is queued before the leave: they finish their last
        // rounds with our payloads, then stop counting on us.
        let ended = self.transport.job_ended().unwrap_or(0).max(self.step);
        self.transport
            .leave(Some(ended), Duration::from_secs(5))
            .await;
        self.post_status(5).await;
        // Where the time went: waiting for peers, and everything else (computing, evaluating).
        let trained_seconds = training_began.elapsed().as_secs_f64();
        let waited_seconds = self.waited.as_secs_f64();
        tracing::info!(
            step = self.step,
            accuracy,
            metric,
            value,
            trained_seconds,
            waited_seconds,
            "done"
        );
        Ok(TerminationMessage {
            outcome: TerminationOutcome::Done,
            step: self.step,
            message: None,
        })
    }
}

/// The class of every example of `data`, as the partitioner deals them out. A class-based
/// partition of data without classes is refused, naming the field.
fn partition_classes<D: Data>(data: &D, plan: &MemberPlan) -> Result<Vec<usize>, RunError> {
    if plan.partition.needs_classes() && data.classes() == 0 {
        return Err(RunError::Spec(format!(
            "training.partition: {} deals examples out by class, but this task's data has no classes: use iid",
            plan.partition.kind_name(),
        )));
    }
    Ok((0..data.len())
        .map(|i| data.label(i).unwrap_or(0))
        .collect())
}

/// Outer steps longer than the run never take one: refused, naming the field. (With
/// `training.steps` the API server refuses it already; epochs are known only here.)
fn outer_fits(plan: &MemberPlan, total_steps: u64) -> Result<(), RunError> {
    match plan.member.outer {
        Some(outer) if outer.local_steps > total_steps => Err(RunError::Spec(format!(
            "algorithm.outer.localSteps: {} local steps exceed the run's {total_steps} steps (training.epochs over the mean shard): lower it, or train longer",
            outer.local_steps
        ))),
        _ => Ok(()),
    }
}

/// Run one member of `task` to the end. Call inside a multi-threaded tokio runtime's
/// `block_on`: the training compute holds this thread while the transport's tasks run on the
/// workers.
pub async fn run<B: AutodiffBackend, T: Task>(
    setup: RunSetup,
    task: T,
    device: B::Device,
) -> Result<TerminationMessage, RunError> {
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

    let split = task.load(&spec.training.dataset)?;
    let classes = partition_classes(&split.train, &plan)?;
    let parts = plan.partition.assign(
        &classes,
        split.train.classes(),
        plan.shards,
        plan.member.seed,
    );
    let shard = parts[plan.shard_of(me)].clone();
    let total_steps = plan.total_steps(split.train.len());
    outer_fits(&plan, total_steps)?;
    let (task, train) = (Arc::new(task), Arc::new(split.train));
    // Every member starts from the same model: the backend is seeded from the job's seed.
    B::seed(&device, plan.member.seed);
    let initial = task.init::<B>(&train, &device);
    let proxy_vector = if plan.topology == TopologyKind::ProxyClumps {
        let mut warm = Member::new(
            me,
            plan.member.clone(),
            task.clone(),
            initial.clone(),
            train.clone(),
            shard.clone(),
            device.clone(),
        )?;
        for _ in 0..PROXY_WARMUP_STEPS {
            warm.local_step();
        }
        warm.proxy_vector(&split.proxy)
    } else {
        None
    };
    let mut member = Member::new(me, plan.member.clone(), task, initial, train, shard, device)?;
    member.set_total_steps(total_steps);
    let layout_len = member.layout().len();

    let transport = Transport::bind(
        &env.listen_address,
        TransportConfig {
            job: frame::job_id(&env.namespace, &env.job),
            me,
            key: key.clone(),
            layout_fingerprint: member.layout().fingerprint(),
            // The largest message is a state reply: the parameters and the optimizer state
            // (Adam: two moments per parameter), with room for the records' names.
            // A state reply: the transferable state (one model length, three with outer steps)
            // and an optimizer state of up to three (Adam's moments and their record).
            max_message: (member.transferable_len() as u64 + 3 * layout_len as u64) * 4 + (1 << 16),
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
        trained_alone: false,
        waited: Duration::ZERO,
        join: None,
        joined_at: Instant::now(),
        startup_timeout: options.startup_timeout,
    };
    // The join goes first: the control plane places a replacement in the topology while it
    // reads its checkpoint, which its neighbours' state supersedes anyway when they are ahead.
    if let Some(c) = trainer.control.clone() {
        let report = JoinReport {
            member_id: me,
            label_histogram: trainer.member.label_histogram(),
            proxy_vector,
        };
        trainer.join = Some(report.clone());
        tokio::spawn(async move { c.post_retrying(&c.join_path(), &report, 30).await });
    }
    trainer.restore_checkpoint()?;
    if !trainer.wait_for_topology().await {
        return trainer.leave().await;
    }
    trainer.fetch_state(trainer.startup_timeout).await?;
    // Neither restored from a checkpoint nor given a neighbour's state.
    trainer.trained_alone = trainer.step == 0;
    trainer.train().await
}

/// A test figure as log fields: `accuracy=` for a task judged by accuracy (what scripts read
/// from the `done` line), else `metric=<name> value=`.
fn log_fields(q: &NamedMetric) -> (Option<f64>, Option<&str>, Option<f64>) {
    if q.name == NamedMetric::ACCURACY {
        (Some(q.value), None, None)
    } else {
        (None, Some(q.name.as_str()), Some(q.value))
    }
}

#[cfg(test)]
mod tests {
    use murmur_core::api::parse_manifest;

    use super::*;

    /// Examples with no classes (next-token prediction).
    struct Unlabelled;

    impl Data for Unlabelled {
        fn len(&self) -> usize {
            10
        }
    }

    fn plan(partition: &str) -> MemberPlan {
        let text = format!(
            "apiVersion: murmur.dev/v1alpha1\nkind: DecentralizedTrainingJob\nmetadata: {{name: t}}\nspec:\n  replicas: {{min: 2, target: 2, max: 2}}\n  training:\n    model: mlp\n    steps: 10\n    partition: {partition}\n"
        );
        MemberPlan::from_spec(&parse_manifest(&text, "t.yaml").unwrap().spec)
    }

    #[test]
    fn a_class_partition_of_data_without_classes_is_refused_naming_the_field() {
        let e = partition_classes(&Unlabelled, &plan("{kind: classesPerMember, k: 1}"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("training.partition: classesPerMember") && e.contains("no classes"),
            "{e}"
        );
        assert_eq!(
            partition_classes(&Unlabelled, &plan("{kind: iid}")).unwrap(),
            vec![0; 10]
        );
    }

    #[test]
    fn outer_steps_longer_than_the_run_are_refused_naming_the_field() {
        let text = "apiVersion: murmur.dev/v1alpha1\nkind: DecentralizedTrainingJob\nmetadata: {name: t}\nspec:\n  replicas: {min: 2, target: 2, max: 2}\n  algorithm: {kind: dpsgd, outer: {localSteps: 50}}\n  training:\n    model: mlp\n    epochs: 1\n    batchSize: 10\n";
        let plan = MemberPlan::from_spec(&parse_manifest(text, "t.yaml").unwrap().spec);
        assert_eq!(plan.member.averaging, Averaging::Every(50));
        // 200 examples in 2 shards: 10 steps of 10, against 50 local steps.
        let e = outer_fits(&plan, plan.total_steps(200))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("algorithm.outer.localSteps: 50 local steps exceed the run's 10 steps"),
            "{e}"
        );
        outer_fits(&plan, plan.total_steps(1000)).unwrap();
    }
}
