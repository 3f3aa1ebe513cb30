//! The simulator: N virtual members in one process, running the same member code as the networked
//! trainer over in-process mailboxes, on the topologies the workspace's engine builds. Members run
//! as tasks spread over `threads` threads; what each computes depends only on its own state and
//! the letters it receives (keyed by sender and round), and every figure is summed in member
//! order, so results are bit-identical whatever the thread count.

mod exchange;
pub mod output;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};

use murmur_core::api::{AlgorithmKind, ModelKind, OptimizerKind, TopologyKind};
use murmur_core::contract::JoinReport;
use murmur_core::topology::{
    self, GraphChoice, MemberId, MemberProfile, Recipe, Topology, TopologyOptions,
};

use crate::algorithms::mixing::consensus_distance;
use crate::algorithms::{
    Averaging, Letter, Mailbox, Member, MemberConfig, MemberError, Neighbourhood, OuterConfig,
};
use crate::compression::Compression;
use crate::data::partition::Partition;
use crate::data::{Dataset, Split};
use crate::model::Model;
use crate::task::Data;
use crate::task::images::ImageClassification;

pub use exchange::{LocalExchange, Mailboxes};

#[derive(Clone, Debug, PartialEq)]
pub struct SimulationConfig {
    pub members: usize,
    pub topologies: Vec<GraphChoice>,
    /// None: each topology's own algorithm (see `default_algorithm`).
    pub algorithm: Option<AlgorithmKind>,
    pub partition: Partition,
    pub model: ModelKind,
    pub steps: u64,
    pub eval_every: u64,
    pub batch_size: usize,
    pub learning_rate: f64,
    pub optimizer: OptimizerKind,
    pub momentum: f64,
    pub averaging: Averaging,
    pub compression: Compression,
    pub seed: u64,
    pub topology: TopologyOptions,
    /// Local steps each member takes on a throw-away copy before reporting its proxy vector.
    pub proxy_warmup_steps: u64,
    /// Threads the members run on (at least 1); results do not depend on it.
    pub threads: usize,
    /// Asynchronous gossip: replies to requests older than this many steps are dropped.
    pub max_staleness: u64,
    /// Members slower than the rest, with their step's duration in steps of a full-speed
    /// member (4.0: a quarter of the pace). Time is virtual: see [`CurvePoint::time`].
    pub slow: Vec<(MemberId, f64)>,
    /// Report the virtual time at which the mean test accuracy first reached this.
    pub target_accuracy: Option<f64>,
    /// Averaging alone: members start from different random models (seed + id) and take no
    /// gradient step (learning rate 0), so only the algorithm's mixing moves them; accuracy is
    /// not measured. How fast each algorithm and graph reaches consensus.
    pub consensus_only: bool,
    /// Report the first step at which the consensus distance is at most this.
    pub target_consensus: Option<f64>,
    /// Build each topology for `members + departed` and remove `departed` of them, picked at
    /// random, the way the control plane repairs it after preemptions (holes in a Moshpit grid).
    pub departed: usize,
    /// Spread the members over this many zones (as evenly as possible, at random by the seed:
    /// [`topology::zones::scatter`]; 0: no zones), and count the bytes that cross between zones.
    pub zones: usize,
    /// Outer steps: every round moves an anchor by an outer optimizer step.
    pub outer: Option<OuterConfig>,
    /// Exchange while computing (`algorithm.overlap`).
    pub overlap: bool,
}

/// Virtual time per step of a full-speed member. Integer ticks keep the order of events exact.
pub const TICKS_PER_STEP: u64 = 1000;

impl SimulationConfig {
    /// The members that do not run at full speed.
    fn slow_members(&self) -> Vec<MemberId> {
        (0..self.members as MemberId)
            .filter(|&id| self.ticks_per_step(id) != TICKS_PER_STEP)
            .collect()
    }

    /// A member's step duration in ticks.
    fn ticks_per_step(&self, member: MemberId) -> u64 {
        let factor = self
            .slow
            .iter()
            .rev()
            .find(|(id, _)| *id == member)
            .map_or(1.0, |(_, f)| *f);
        ((factor * TICKS_PER_STEP as f64).round() as u64).max(1)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CurvePoint {
    pub step: u64,
    /// Virtual time, in steps of a full-speed member: with nobody slow it equals `step`; with a
    /// slow member, a synchronous algorithm's rounds wait for it and this runs ahead of `step`.
    pub time: f64,
    pub mean_accuracy: f64,
    pub min_accuracy: f64,
    pub max_accuracy: f64,
    pub mean_test_loss: f64,
    /// Mean training loss since the previous point (none at step 0).
    pub mean_train_loss: Option<f64>,
    /// Mean accuracy of the members not slowed down (`mean_accuracy` when none is): how much a
    /// slow member holds the others back.
    pub full_speed_accuracy: f64,
    pub consensus_distance: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TopologyResult {
    pub topology: String,
    pub algorithm: String,
    pub members: usize,
    pub edges: usize,
    /// 1 − |λ₂| of the graph's mixing matrix (larger mixes faster), when measured.
    #[serde(default)]
    pub spectral_gap: Option<f64>,
    pub final_test_accuracy: f64,
    pub bytes_sent: u64,
    /// Of `bytes_sent`, what went between members of different zones (with `zones`).
    #[serde(default)]
    pub cross_zone_bytes: Option<u64>,
    pub wall_seconds: f64,
    /// Virtual time at which the mean accuracy first reached the target, if it did.
    pub time_to_target: Option<f64>,
    /// The first step at which the consensus distance reached its target, if it did.
    #[serde(default)]
    pub steps_to_consensus: Option<u64>,
    /// The same for the mean accuracy of the full-speed members.
    pub full_speed_time_to_target: Option<f64>,
    pub curve: Vec<CurvePoint>,
}

#[derive(Debug, thiserror::Error)]
pub enum SimulationError {
    #[error(transparent)]
    Topology(#[from] topology::TopologyError),
    #[error(transparent)]
    Member(#[from] MemberError),
    #[error("{0}")]
    Config(String),
}

/// One member's evaluation at one step.
struct Evaluation {
    member: MemberId,
    /// The member's virtual clock, in ticks.
    time: u64,
    accuracy: f64,
    test_loss: f64,
    train_loss: Option<f64>,
    params: Vec<f32>,
}

/// Evaluations deposited by members; a curve point is made once all have reported a step.
#[derive(Default)]
struct Collector {
    pending: BTreeMap<u64, Vec<Evaluation>>,
    curve: Vec<CurvePoint>,
    /// Members slowed down, left out of `full_speed_accuracy`.
    slow: Vec<MemberId>,
    finished: usize,
    /// Rung when a curve point completes or a member finishes, so progress prints live.
    bell: Arc<tokio::sync::Notify>,
}

impl Collector {
    fn deposit(&mut self, members: usize, step: u64, evaluation: Evaluation) {
        let entries = self.pending.entry(step).or_default();
        entries.push(evaluation);
        if entries.len() == members {
            let mut entries = self.pending.remove(&step).expect("present");
            // Arrival order depends on the threads; floating-point sums must not.
            entries.sort_by_key(|e| e.member);
            let n = entries.len() as f64;
            let accs: Vec<f64> = entries.iter().map(|e| e.accuracy).collect();
            let params: Vec<&[f32]> = entries.iter().map(|e| e.params.as_slice()).collect();
            self.curve.push(CurvePoint {
                step,
                time: entries.iter().map(|e| e.time).max().unwrap_or(0) as f64
                    / TICKS_PER_STEP as f64,
                mean_accuracy: accs.iter().sum::<f64>() / n,
                min_accuracy: accs.iter().copied().fold(f64::INFINITY, f64::min),
                max_accuracy: accs.iter().copied().fold(0.0, f64::max),
                full_speed_accuracy: {
                    let full: Vec<f64> = entries
                        .iter()
                        .filter(|e| !self.slow.contains(&e.member))
                        .map(|e| e.accuracy)
                        .collect();
                    if full.is_empty() {
                        f64::NAN
                    } else {
                        full.iter().sum::<f64>() / full.len() as f64
                    }
                },
                mean_test_loss: entries.iter().map(|e| e.test_loss).sum::<f64>() / n,
                mean_train_loss: entries
                    .iter()
                    .map(|e| e.train_loss)
                    .sum::<Option<f64>>()
                    .map(|total| total / n),
                consensus_distance: consensus_distance(&params),
            });
            self.bell.notify_one();
        }
    }
}

/// The members' data: the task, the training set and each member's examples of it.
struct Shards {
    task: Arc<ImageClassification>,
    train: Arc<Dataset>,
    parts: Vec<Vec<usize>>,
}

fn build_topology<B: AutodiffBackend>(
    config: &SimulationConfig,
    choice: GraphChoice,
    shards: &Shards,
    proxy_batch: &Dataset,
    initials: &[Model<B>],
    device: &B::Device,
) -> Result<Topology, SimulationError> {
    let zone_of = topology::zones::scatter(config.members, config.zones, config.seed);
    let proxy_clumps = choice == GraphChoice::Family(TopologyKind::ProxyClumps);
    // What the control plane learns from join reports: histograms, and for proxy clumps the
    // mean softmax on a shared proxy batch after a short local warm-up.
    let mut profiles = Vec::with_capacity(config.members + config.departed);
    for id in 0..config.members {
        let proxy_vector = if proxy_clumps {
            let mut warm = Member::new(
                id as MemberId,
                member_config(config, AlgorithmKind::Dpsgd),
                shards.task.clone(),
                initials[id].clone(),
                shards.train.clone(),
                shards.parts[id].clone(),
                device.clone(),
            )?;
            for _ in 0..config.proxy_warmup_steps {
                warm.local_step();
            }
            warm.proxy_vector(proxy_batch)
        } else {
            None
        };
        let report = JoinReport {
            member_id: id as MemberId,
            label_histogram: shards.train.histogram(&shards.parts[id]),
            proxy_vector,
        };
        let zone = (config.zones > 0).then(|| topology::zones::zone_name(zone_of[id]));
        profiles.push(MemberProfile::from_join(&report, zone));
    }
    if config.departed > 0 {
        // The departed hold no data; in a seeded order, so they leave holes anywhere.
        let total = (config.members + config.departed) as MemberId;
        profiles.extend((config.members as MemberId..total).map(MemberProfile::bare));
        profiles.shuffle(&mut ChaCha8Rng::seed_from_u64(config.seed));
    }
    let mut topology =
        Recipe::from_flags(choice, &config.topology, config.seed).build(&profiles)?;
    for id in config.members..config.members + config.departed {
        topology.remove_member(id as MemberId)?;
    }
    topology::zones::move_to_their_cliques(&mut topology);
    Ok(topology)
}

fn member_config(config: &SimulationConfig, algorithm: AlgorithmKind) -> MemberConfig {
    MemberConfig {
        algorithm,
        // An outer step ends every round: the rounds come every localSteps steps.
        averaging: match config.outer {
            Some(outer) => Averaging::Every(outer.local_steps),
            None => config.averaging,
        },
        compression: config.compression,
        optimizer: config.optimizer,
        momentum: config.momentum,
        // Consensus only: the same step, with a step size that leaves the model where it is.
        learning_rate: if config.consensus_only {
            0.0
        } else {
            config.learning_rate
        },
        batch_size: config.batch_size,
        seed: config.seed,
        group_size: config.topology.group_size,
        max_staleness: config.max_staleness,
        outer: config.outer,
        overlap: config.overlap,
    }
}

/// burn draws initial weights from one process-wide generator: seeding it and drawing a model
/// must not interleave with another simulation's in the same process (tests run several at once).
static MODEL_INIT: Mutex<()> = Mutex::new(());

/// Run every configured topology on the same data, seed and steps.
pub fn simulate<B: AutodiffBackend>(
    config: &SimulationConfig,
    data: &Split,
    device: &B::Device,
    mut progress: impl FnMut(&str, &CurvePoint),
) -> Result<Vec<TopologyResult>, SimulationError> {
    if config.members == 0 || config.steps == 0 {
        return Err(SimulationError::Config(
            "members and steps must be at least 1".into(),
        ));
    }
    if config.departed > 0
        && config
            .topologies
            .iter()
            .any(|t| t.default_algorithm() == AlgorithmKind::CliqueAveraging)
    {
        return Err(SimulationError::Config(
            "--departed builds a topology with members that hold no data: use it with ring, fully-connected, exponential, exponential-one-peer, moshpit or random-regular, not dcliques or proxy-clumps".into(),
        ));
    }
    for &(id, factor) in &config.slow {
        if id as usize >= config.members || !(factor.is_finite() && factor > 0.0) {
            return Err(SimulationError::Config(format!(
                "slow member {id}:{factor}: the member must be below {} and its factor a positive number",
                config.members
            )));
        }
    }
    let labels: Vec<usize> = data.train.labels.iter().map(|&l| usize::from(l)).collect();
    let parts = config
        .partition
        .assign(&labels, data.train.classes(), config.members, config.seed);
    let shards = Shards {
        task: Arc::new(ImageClassification {
            model: config.model,
        }),
        train: Arc::new(data.train.clone()),
        parts,
    };
    let proxy_batch = &data.proxy;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.threads.max(1))
        .thread_name("member")
        .build()
        .expect("a tokio runtime");

    // Consensus only: nothing to test, and each member its own random start.
    let nothing = Dataset::empty(&data.test.shape);
    let test = if config.consensus_only {
        &nothing
    } else {
        &data.test
    };
    let mut results = Vec::new();
    for &choice in &config.topologies {
        let initials: Vec<Model<B>> = {
            let _alone = MODEL_INIT.lock();
            if config.consensus_only {
                (0..config.members as u64)
                    .map(|id| {
                        B::seed(device, config.seed.wrapping_add(id));
                        Model::<B>::new(config.model, device)
                    })
                    .collect()
            } else {
                B::seed(device, config.seed);
                vec![Model::<B>::new(config.model, device); config.members]
            }
        };
        let topo = build_topology(config, choice, &shards, proxy_batch, &initials, device)?;
        let doc = topo.to_document(|_| None);
        let algorithm = config
            .algorithm
            .unwrap_or_else(|| choice.default_algorithm());
        if matches!(config.averaging, Averaging::Auto(_))
            && (matches!(
                algorithm,
                AlgorithmKind::Gossip | AlgorithmKind::Moshpit | AlgorithmKind::AsyncGossip
            ) || choice == GraphChoice::Family(TopologyKind::ExponentialOnePeer))
        {
            return Err(SimulationError::Config(format!(
                "--average-every auto paces the edges of a static graph under D-PSGD or clique averaging, not {algorithm:?} on {}",
                choice.name()
            )));
        }
        if config.overlap
            && (algorithm == AlgorithmKind::AsyncGossip
                || matches!(config.averaging, Averaging::Auto(_)))
        {
            return Err(SimulationError::Config(
                "--overlap applies to rounds of fixed cadence: not to asynchronous gossip (it never waits) nor --average-every auto".into(),
            ));
        }
        if let Some(outer) = config.outer {
            if algorithm == AlgorithmKind::AsyncGossip {
                return Err(SimulationError::Config(
                    "--outer-local-steps does not apply to asynchronous gossip (it has no rounds)"
                        .into(),
                ));
            }
            if config.averaging != Averaging::Every(1) {
                return Err(SimulationError::Config(
                    "--average-every does not apply with --outer-local-steps (the outer steps set the rounds)".into(),
                ));
            }
            if outer.local_steps == 0 || outer.local_steps > config.steps {
                return Err(SimulationError::Config(format!(
                    "--outer-local-steps must be from 1 to --steps ({}), not {}",
                    config.steps, outer.local_steps
                )));
            }
        }
        if algorithm == AlgorithmKind::AsyncGossip
            && matches!(config.compression, Compression::TopK { .. })
        {
            return Err(SimulationError::Config(
                "asynchronous gossip does not take top-k compression (its requests and replies cross, so per-link estimates cannot stay in step): use int8 or fp16".into(),
            ));
        }
        let started = Instant::now();
        let name = choice.name();
        let hoods: Vec<Neighbourhood> = (0..config.members as MemberId)
            .map(|id| {
                Neighbourhood::from_document(&doc, id).expect("every member is in the document")
            })
            .collect();
        let (curve, sent) = if algorithm == AlgorithmKind::AsyncGossip {
            let mut members = (0..config.members as MemberId)
                .map(|id| {
                    Member::new(
                        id,
                        member_config(config, algorithm),
                        shards.task.clone(),
                        initials[id as usize].clone(),
                        shards.train.clone(),
                        shards.parts[id as usize].clone(),
                        device.clone(),
                    )
                })
                .collect::<Result<Vec<_>, _>>()?;
            let curve = run_async(config, &hoods, &mut members, test, |point| {
                progress(&name, point)
            })?;
            (
                curve,
                members.iter().map(|m| m.bytes_sent_to.clone()).collect(),
            )
        } else {
            run_rounds(
                config,
                algorithm,
                &hoods,
                &initials,
                &shards,
                test,
                device,
                &runtime,
                |point| progress(&name, point),
            )?
        };
        let reached = |accuracy: fn(&CurvePoint) -> f64| {
            config
                .target_accuracy
                .and_then(|target| curve.iter().find(|p| accuracy(p) >= target).map(|p| p.time))
        };
        let time_to_target = reached(|p| p.mean_accuracy);
        let steps_to_consensus = config.target_consensus.and_then(|target| {
            curve
                .iter()
                .find(|p| p.consensus_distance <= target)
                .map(|p| p.step)
        });
        let full_speed_time_to_target = reached(|p| p.full_speed_accuracy);
        let bytes_sent = sent.iter().flat_map(|to| to.values()).sum();
        let zone = |m: MemberId| topo.profiles.get(&m).and_then(|p| p.zone.as_deref());
        let cross_zone_bytes = (config.zones > 0).then(|| {
            sent.iter()
                .enumerate()
                .flat_map(|(from, to)| to.iter().map(move |(&to, &b)| (from as MemberId, to, b)))
                .filter(|&(from, to, _)| zone(from) != zone(to))
                .map(|(_, _, b)| b)
                .sum()
        });
        results.push(TopologyResult {
            topology: name,
            algorithm: format!("{algorithm:?}"),
            members: config.members,
            edges: topo.graph.edge_count(),
            spectral_gap: topology::measure(&topo).spectral_gap,
            final_test_accuracy: curve.last().map_or(0.0, |p| p.mean_accuracy),
            bytes_sent,
            cross_zone_bytes,
            wall_seconds: started.elapsed().as_secs_f64(),
            time_to_target,
            steps_to_consensus,
            full_speed_time_to_target,
            curve,
        });
    }
    Ok(results)
}

/// A member's bytes sent, by destination.
type SentTo = BTreeMap<MemberId, u64>;

/// A round-synchronous algorithm: members as tasks over the in-process mailboxes, each with its
/// virtual clock. Returns the curve and each member's bytes sent, by destination.
#[allow(clippy::too_many_arguments)]
fn run_rounds<B: AutodiffBackend>(
    config: &SimulationConfig,
    algorithm: AlgorithmKind,
    hoods: &[Neighbourhood],
    initials: &[Model<B>],
    shards: &Shards,
    test: &Dataset,
    device: &B::Device,
    runtime: &tokio::runtime::Runtime,
    mut progress: impl FnMut(&CurvePoint),
) -> Result<(Vec<CurvePoint>, Vec<SentTo>), SimulationError> {
    let boxes = Arc::new(Mailboxes::default());
    let collector = Arc::new(Mutex::new(Collector {
        slow: config.slow_members(),
        ..Collector::default()
    }));
    let mut handles = Vec::new();
    for id in 0..config.members as MemberId {
        let hood = hoods[id as usize].clone();
        let ticks_per_step = config.ticks_per_step(id);
        let mut member = Member::new(
            id,
            member_config(config, algorithm),
            shards.task.clone(),
            initials[id as usize].clone(),
            shards.train.clone(),
            shards.parts[id as usize].clone(),
            device.clone(),
        )?;
        member.set_total_steps(config.steps);
        let mut exchange = LocalExchange {
            me: id,
            boxes: boxes.clone(),
            clock: 0,
        };
        let collector = collector.clone();
        let (members, steps, eval_every, test) = (
            config.members,
            config.steps,
            config.eval_every.max(1),
            test.clone(),
        );
        handles.push(runtime.spawn(async move {
            let outcome = async {
                // Step 0: where every topology starts from (the shared initial model, or with
                // consensus only each member's own).
                let (accuracy, test_loss) = member.evaluate(&test);
                let params = member.parameters();
                let evaluation = Evaluation {
                    member: id,
                    time: 0,
                    accuracy,
                    test_loss,
                    train_loss: None,
                    params,
                };
                collector.lock().deposit(members, 0, evaluation);
                let mut recent = Vec::new();
                for step in 0..steps {
                    exchange.clock += ticks_per_step;
                    let report = member.step(step, &hood, &mut exchange).await?;
                    recent.push(report.loss);
                    if (step + 1) % eval_every == 0 || step + 1 == steps {
                        let (accuracy, test_loss) = member.evaluate(&test);
                        let train_loss =
                            Some(recent.iter().sum::<f64>() / recent.len().max(1) as f64);
                        recent.clear();
                        let params = member.parameters();
                        collector.lock().deposit(
                            members,
                            step + 1,
                            Evaluation {
                                member: id,
                                time: exchange.clock,
                                accuracy,
                                test_loss,
                                train_loss,
                                params,
                            },
                        );
                    }
                }
                Ok::<SentTo, MemberError>(member.bytes_sent_to)
            }
            .await;
            // Counted even on error, so the driver never waits for a member that is gone.
            let mut c = collector.lock();
            c.finished += 1;
            c.bell.notify_one();
            outcome
        }));
    }
    let sent = runtime.block_on(async {
        let mut reported = 0;
        loop {
            let bell = collector.lock().bell.clone();
            let rung = bell.notified();
            let all_done = {
                let c = collector.lock();
                for point in &c.curve[reported..] {
                    progress(point);
                }
                reported = c.curve.len();
                c.finished == config.members
            };
            if all_done {
                break;
            }
            rung.await;
        }
        let mut sent = Vec::with_capacity(handles.len());
        for handle in handles {
            sent.push(handle.await.expect("member task panicked")?);
        }
        Ok::<_, MemberError>(sent)
    })?;
    let curve = std::mem::take(&mut collector.lock().curve);
    Ok((curve, sent))
}

/// Asynchronous gossip in virtual time: each member steps at its own pace (a heap holds the
/// end of every member's next step), a letter is there for its recipient's next step, and the
/// models are evaluated at fixed virtual times. One thread: the clocks alone fix the order of
/// events, and so the result.
fn run_async<B: AutodiffBackend>(
    config: &SimulationConfig,
    hoods: &[Neighbourhood],
    members: &mut [Member<B, ImageClassification>],
    test: &Dataset,
    mut progress: impl FnMut(&CurvePoint),
) -> Result<Vec<CurvePoint>, MemberError> {
    let n = members.len();
    let end = config.steps * TICKS_PER_STEP;
    let eval_every = config.eval_every.max(1) * TICKS_PER_STEP;
    let mut evaluations: Vec<u64> = (0..end).step_by(eval_every as usize).collect();
    evaluations.push(end);
    let mut inboxes: Vec<Vec<(MemberId, Letter)>> = vec![Vec::new(); n];
    let mut steps = vec![0u64; n];
    let mut recent: Vec<Vec<f64>> = vec![Vec::new(); n];
    let ticks: Vec<u64> = (0..n)
        .map(|i| config.ticks_per_step(i as MemberId))
        .collect();
    let mut queue: BinaryHeap<Reverse<(u64, usize)>> =
        (0..n).map(|i| Reverse((ticks[i], i))).collect();
    let mut collector = Collector {
        slow: config.slow_members(),
        ..Collector::default()
    };
    for at in evaluations {
        // Every step that ends by `at` is taken before the models are looked at.
        while let Some(&Reverse((t, i))) = queue.peek()
            && t <= at
        {
            queue.pop();
            let mut mail = Instantly {
                me: i as MemberId,
                inboxes: &mut inboxes,
            };
            let report = members[i].gossip_step(steps[i], &hoods[i], &mut mail)?;
            recent[i].push(report.loss);
            steps[i] += 1;
            queue.push(Reverse((t + ticks[i], i)));
        }
        for (i, member) in members.iter_mut().enumerate() {
            let (accuracy, test_loss) = member.evaluate(test);
            let losses = std::mem::take(&mut recent[i]);
            let train_loss =
                (at > 0).then(|| losses.iter().sum::<f64>() / losses.len().max(1) as f64);
            collector.deposit(
                n,
                at / TICKS_PER_STEP,
                Evaluation {
                    member: member.id,
                    time: at,
                    accuracy,
                    test_loss,
                    train_loss,
                    params: member.parameters(),
                },
            );
        }
        if let Some(point) = collector.curve.last() {
            progress(point);
        }
    }
    Ok(collector.curve)
}

/// Asynchronous gossip's in-process mailbox: a letter waits in its recipient's inbox until the
/// recipient's next step.
struct Instantly<'a> {
    me: MemberId,
    inboxes: &'a mut [Vec<(MemberId, Letter)>],
}

impl Mailbox for Instantly<'_> {
    fn post(&mut self, to: MemberId, letter: Letter) {
        if let Some(inbox) = self.inboxes.get_mut(to as usize) {
            inbox.push((self.me, letter));
        }
    }

    fn collect(&mut self) -> Vec<(MemberId, Letter)> {
        std::mem::take(&mut self.inboxes[self.me as usize])
    }
}
