//! Command line of `murmur-trainer`.

use std::path::PathBuf;

use crate::algorithms::{AutoPolicy, Averaging, OuterConfig};
use crate::compression::Compression;
use crate::data::{self, DataError, partition::Partition};
use crate::runtime::{self, RunError, RunOptions, RunSetup};
use crate::simulator::{self, SimulationConfig, SimulationError, output};
use std::io::IsTerminal;

use crate::task::Task;
use crate::task::images::ImageClassification;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use murmur_core::api::{
    AlgorithmKind, Backend, DecentralizedTrainingJobSpec, ModelKind, OptimizerKind,
};
use murmur_core::contract::TrainerEnv;
use murmur_core::topology::{GraphChoice, TopologyOptions};
use tracing_subscriber::EnvFilter;

#[derive(Parser, Debug)]
#[command(
    name = "murmur-trainer",
    version,
    about = "murmur's trainer: decentralized training, one member per process, or many simulated"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Simulate N members in one process on one or more topologies (same data, seed and steps).
    Simulate(Box<SimulateArgs>),
    /// Run one member of a job: the process in each pod and each local process. Configured by
    /// the MURMUR_* environment variables (the contract between the planes).
    Run(RunArgs),
    /// Draw the curves of several simulations (their results.json) on one plot.
    Plot(PlotArgs),
}

#[derive(clap::Args, Debug)]
struct PlotArgs {
    /// The PNG to write.
    #[arg(long, short)]
    output: PathBuf,
    /// results.json files, each optionally as LABEL=PATH (the label replaces the topology's
    /// name in the legend).
    #[arg(required = true)]
    results: Vec<String>,
    /// Plot the consensus distance (log scale) rather than the test accuracy: for runs of
    /// `simulate --consensus-only`.
    #[arg(long)]
    consensus: bool,
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Read the job spec from this manifest instead of MURMUR_JOB_SPEC (bare-metal runs).
    #[arg(long)]
    manifest: Option<PathBuf>,
    /// After SIGTERM, exit within this long (spot notices give 30 s).
    #[arg(long, default_value = "20s")]
    grace_period: murmur_core::api::Duration,
    /// Evaluate on the test split every this many steps.
    #[arg(long, default_value_t = 25)]
    eval_every: u64,
    /// How long a starting member waits for its neighbours before training without them.
    #[arg(long, default_value = "30s")]
    startup_timeout: murmur_core::api::Duration,
}

#[derive(clap::Args, Debug)]
struct SimulateArgs {
    #[arg(long, default_value_t = 100)]
    members: usize,
    /// Comma-separated: ring, fully-connected, exponential, exponential-one-peer, dcliques,
    /// proxy-clumps, moshpit, random-regular:DEGREE.
    #[arg(
        long,
        value_delimiter = ',',
        value_parser = str::parse::<GraphChoice>,
        default_value = "dcliques,fully-connected,ring"
    )]
    topology: Vec<GraphChoice>,
    /// iid, shards:N, dirichlet:ALPHA or classes-per-member:K.
    #[arg(long, default_value = "classes-per-member:1")]
    partition: String,
    #[arg(long, value_enum, default_value = "logistic")]
    model: ModelKind,
    /// Unset: clique averaging on dcliques and proxy-clumps, Moshpit on moshpit, D-PSGD
    /// elsewhere.
    #[arg(long, value_enum)]
    algorithm: Option<AlgorithmKind>,
    #[arg(long, default_value_t = 500)]
    steps: u64,
    #[arg(long, default_value_t = 50)]
    eval_every: u64,
    #[arg(long, default_value_t = 20)]
    batch_size: usize,
    #[arg(long, default_value_t = 0.05)]
    learning_rate: f64,
    #[arg(long, value_enum, default_value = "sgd")]
    optimizer: OptimizerKind,
    #[arg(long, default_value_t = 0.9)]
    momentum: f64,
    /// Steps between averaging rounds (1 or more), or auto: each edge at its own pace, by how
    /// differently its two models score on local data (D-PSGD and clique averaging on static
    /// graphs).
    #[arg(long, default_value = "1")]
    average_every: String,
    /// --average-every auto: the longest gap between two averagings on one edge.
    #[arg(long, default_value_t = murmur_core::api::AutoAverageSpec::DEFAULT_MAX_EVERY)]
    auto_max_every: u32,
    /// --average-every auto: the loss gap |L(x_j) - L(x_i)| (nats, on the deciding member's
    /// mini-batch) an edge's models should reach by each averaging; its gap follows.
    #[arg(long, default_value_t = murmur_core::api::AutoAverageSpec::DEFAULT_TARGET_SKEW)]
    auto_target_skew: f64,
    /// none, fp16, int8, int4 or top-k:RATIO.
    #[arg(long, default_value = "none")]
    compression: String,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[command(flatten)]
    topology_options: TopologyOptions,
    #[arg(long, default_value_t = 20)]
    proxy_warmup_steps: u64,
    /// async-gossip: replies to requests older than this many steps are dropped.
    #[arg(long, default_value_t = murmur_core::api::AlgorithmSpec::DEFAULT_MAX_STALENESS)]
    max_staleness: u32,
    /// Slow members, as MEMBER:FACTOR (4 = a step takes four times as long), comma-separated.
    /// Time becomes virtual: synchronous rounds wait for their slowest member, asynchronous
    /// gossip does not. The summary's "to target" then reads ALL/FULL-SPEED: the time for the
    /// mean accuracy of all members, and of the full-speed members alone.
    #[arg(long, value_delimiter = ',')]
    slow: Vec<String>,
    /// Report the virtual time (in steps of a full-speed member) at which the mean test
    /// accuracy first reached this fraction.
    #[arg(long)]
    target_accuracy: Option<f64>,
    /// Averaging alone: members start from different random models and take no gradient step,
    /// so only mixing moves them (accuracy is not measured). With --target-consensus, how many
    /// rounds each algorithm and graph needs to agree.
    #[arg(long)]
    consensus_only: bool,
    /// Report the first step at which the consensus distance (the members' mean L2 distance
    /// to their average model) is at most this.
    #[arg(long)]
    target_consensus: Option<f64>,
    /// Build each topology for MEMBERS + this many and remove these, picked at random, as the
    /// control plane's repair would after preemptions (holes in a Moshpit grid). Not with
    /// dcliques or proxy-clumps.
    #[arg(long, default_value_t = 0)]
    departed: usize,
    /// Spread the members over this many zones (evenly, which member where at random by --seed,
    /// as a scheduler that knows nothing of their data would) and report the bytes that crossed
    /// between zones; with --zone-aware, cliques form inside zones.
    #[arg(long, default_value_t = 0)]
    zones: usize,
    /// Outer steps (DiLoCo, SlowMo): this many local steps, then an averaging round whose mix
    /// moves an anchor by an outer optimizer step (replaces --average-every).
    #[arg(long)]
    outer_local_steps: Option<u64>,
    /// With --outer-local-steps: the outer optimizer.
    #[arg(long, value_enum, default_value = "nesterov")]
    outer_optimizer: murmur_core::api::OuterOptimizerKind,
    /// With --outer-local-steps: the outer learning rate.
    #[arg(long, default_value_t = murmur_core::api::OuterSpec::DEFAULT_LEARNING_RATE)]
    outer_learning_rate: f64,
    /// With --outer-local-steps: the outer momentum.
    #[arg(long, default_value_t = murmur_core::api::OuterSpec::DEFAULT_MOMENTUM)]
    outer_momentum: f64,
    /// Exchange while computing: with --outer-local-steps a round is mixed in
    /// --outer-overlap-steps local steps after it is sent; without, a round's parameters
    /// travel while the step's gradient is computed.
    #[arg(long)]
    overlap: bool,
    /// With --overlap and --outer-local-steps: the local steps a round's exchange runs beside
    /// (1 to --outer-local-steps).
    #[arg(long, default_value_t = 1)]
    outer_overlap_steps: u64,
    /// Threads to spread the members and their kernels over (default: every core). Results are
    /// the same whatever the count.
    #[arg(long)]
    threads: Option<usize>,
    /// Where the tensors live: cpu (burn's flex backend) or cuda (needs a build with
    /// --features cuda).
    #[arg(long, value_enum, default_value = "cpu")]
    backend: Backend,
    /// Training data: embedded (the 5 000-image sample), idx:DIR or csv:DIR.
    #[arg(long, default_value = "embedded")]
    data: String,
    /// Write curves.csv, results.json and accuracy.png (consensus.png with --consensus-only)
    /// here.
    #[arg(long)]
    output: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Flag(String),
    #[error(transparent)]
    Data(#[from] DataError),
    #[error(transparent)]
    Simulation(#[from] SimulationError),
    #[error(transparent)]
    Output(#[from] output::OutputError),
    #[error(transparent)]
    Env(#[from] murmur_core::contract::EnvError),
    #[error(transparent)]
    Manifest(#[from] murmur_core::api::ManifestError),
    #[error(transparent)]
    Run(#[from] RunError),
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Flag(_) | CliError::Data(_) | CliError::Env(_) | CliError::Manifest(_) => 2,
            CliError::Run(
                RunError::KeyFile { .. }
                | RunError::EmptyKey { .. }
                | RunError::Spec(_)
                | RunError::NoTopologySource
                | RunError::Data(_),
            ) => 2,
            CliError::Simulation(SimulationError::Config(_) | SimulationError::Topology(_)) => 2,
            CliError::Output(output::OutputError::Results { .. }) => 2,
            _ => 1,
        }
    }
}

fn averaging(args: &SimulateArgs) -> Result<Averaging, CliError> {
    use murmur_core::api::{AutoAverageSpec, AverageEvery};
    let every: AverageEvery =
        serde_json::from_value(serde_json::Value::String(args.average_every.clone()))
            .map_err(|e| CliError::Flag(format!("--average-every: {e}")))?;
    if !(1..=1000).contains(&args.auto_max_every) {
        return Err(CliError::Flag(format!(
            "--auto-max-every {}: must be from 1 to 1000",
            args.auto_max_every
        )));
    }
    if !(args.auto_target_skew > 0.0 && args.auto_target_skew <= 10.0) {
        return Err(CliError::Flag(format!(
            "--auto-target-skew {}: must be in (0, 10]",
            args.auto_target_skew
        )));
    }
    Ok(match every {
        AverageEvery::Steps(n) => Averaging::Every(u64::from(n)),
        AverageEvery::Auto => Averaging::Auto(AutoPolicy::from_spec(Some(&AutoAverageSpec {
            max_every: Some(args.auto_max_every),
            target_skew: Some(args.auto_target_skew),
        }))),
    })
}

fn load_data(spec: &str) -> Result<data::Split, CliError> {
    use murmur_core::api::{DatasetSource, DatasetSpec};
    let (source, path) = match spec.split_once(':') {
        None if spec == "embedded" => (DatasetSource::Embedded, None),
        Some(("idx", dir)) => (DatasetSource::Idx, Some(dir.to_string())),
        Some(("csv", dir)) => (DatasetSource::Csv, Some(dir.to_string())),
        _ => {
            return Err(CliError::Flag(format!(
                "--data {spec:?}: use embedded, idx:DIR or csv:DIR"
            )));
        }
    };
    Ok(data::load(&DatasetSpec {
        source,
        path,
        shape: None,
    })?)
}

/// burn's CUDA backend panics when the driver library is missing; say so plainly instead.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
fn cuda_driver_present() -> Result<(), CliError> {
    for name in ["libcuda.so.1", "libcuda.so"] {
        // SAFETY: loading the NVIDIA driver library runs its initialisers, as burn itself would.
        if unsafe { libloading::Library::new(name) }.is_ok() {
            return Ok(());
        }
    }
    Err(CliError::Flag(
        "--backend cuda: the NVIDIA driver library (libcuda.so.1) is not on this machine; run on a GPU node or use --backend cpu".into(),
    ))
}

fn run_on<B: burn::tensor::backend::AutodiffBackend>(
    config: &SimulationConfig,
    data: &data::Split,
) -> Result<Vec<simulator::TopologyResult>, CliError> {
    let device = B::Device::default();
    println!(
        "{:<18} {:>6} {:>8} {:>9} {:>9} {:>11}",
        "topology", "step", "time", "accuracy", "min", "consensus"
    );
    Ok(simulator::simulate::<B>(
        config,
        data,
        &device,
        |name, p| {
            println!(
                "{:<18} {:>6} {:>8.1} {:>8.2}% {:>8.2}% {:>11.3e}",
                name,
                p.step,
                p.time,
                100.0 * p.mean_accuracy,
                100.0 * p.min_accuracy,
                p.consensus_distance
            );
        },
    )?)
}

/// `MEMBER:FACTOR`, as `--slow` takes it.
fn slow_member(text: &str) -> Result<(u32, f64), CliError> {
    let parsed = text
        .split_once(':')
        .and_then(|(id, f)| Some((id.parse::<u32>().ok()?, f.parse::<f64>().ok()?)));
    match parsed {
        Some((id, factor)) if factor.is_finite() && factor > 0.0 => Ok((id, factor)),
        _ => Err(CliError::Flag(format!(
            "--slow {text:?}: use MEMBER:FACTOR, e.g. 3:4 for member 3 at a quarter of the pace"
        ))),
    }
}

fn compression(text: &str) -> Result<Compression, CliError> {
    match text {
        "none" => Ok(Compression::None),
        "fp16" => Ok(Compression::Fp16),
        "int8" => Ok(Compression::Int8),
        "int4" => Ok(Compression::Int4),
        _ => match text.strip_prefix("top-k:").map(str::parse::<f64>) {
            Some(Ok(ratio)) if ratio > 0.0 && ratio <= 1.0 => Ok(Compression::TopK { ratio }),
            _ => Err(CliError::Flag(format!(
                "--compression {text:?}: use none, fp16, int8, int4 or top-k:RATIO with RATIO in (0, 1]"
            ))),
        },
    }
}

pub fn run(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Simulate(args) => simulate(*args),
        Command::Run(args) => run_member(args, |spec| ImageClassification {
            model: spec.training.model,
        }),
        Command::Plot(args) => plot(args),
    }
}

/// The command line of a trainer of a task of its own ([`run_task`]): `run` only.
#[derive(Parser, Debug)]
#[command(
    version,
    about = "A murmur trainer: one member of a job, configured by MURMUR_*"
)]
struct TaskCli {
    #[command(subcommand)]
    command: TaskCommand,
}

#[derive(Subcommand, Debug)]
enum TaskCommand {
    /// Run one member of a job: the process in each pod and each local process. Configured by
    /// the MURMUR_* environment variables (the contract between the planes).
    Run(RunArgs),
}

/// The `main` of a trainer of `task`: one member of a job, as `murmur-trainer run` is for the
/// built-in models, with the same flags, environment, logs, exit codes and termination message.
/// See [`crate::task`].
pub fn run_task<T: Task>(task: T) -> std::process::ExitCode {
    init_process();
    // Its help and version speak in the name of the program it is (`icons-trainer 0.1.0`),
    // however it was started (`kubectl exec ... /proc/1/exe --version`).
    let name: &'static str = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .map_or("murmur-trainer", |n| Box::leak(n.into_boxed_str()));
    let matches = TaskCli::command().name(name).get_matches();
    let TaskCommand::Run(args) = TaskCli::from_arg_matches(&matches)
        .unwrap_or_else(|e| e.exit())
        .command;
    exit(run_member(args, |_| task))
}

/// What every trainer process sets up first: the allocator, subnormal flushing and logs (JSON
/// when a machine reads them, as pods and `murmur run` do; plain text at a terminal).
pub fn init_process() {
    crate::runtime::keep_freed_buffers();
    crate::backend::flush_subnormals();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    if std::io::stdout().is_terminal() {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    } else {
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .init();
    }
}

/// The process's exit code for `result`, the error said on stderr.
pub fn exit(result: Result<(), CliError>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::from(e.exit_code())
        }
    }
}

fn plot(args: PlotArgs) -> Result<(), CliError> {
    let mut all = Vec::new();
    for spec in &args.results {
        let (label, path) = match spec.split_once('=') {
            Some((label, path)) => (Some(label), path),
            None => (None, spec.as_str()),
        };
        for mut r in output::read_results(std::path::Path::new(path))? {
            if let Some(label) = label {
                r.topology = label.to_string();
            }
            all.push(r);
        }
    }
    let metric = if args.consensus {
        output::Metric::Consensus
    } else {
        output::Metric::Accuracy
    };
    output::plot(&args.output, &all, metric)?;
    println!("wrote {}", args.output.display());
    Ok(())
}

/// One member of the job, training the task `task_of` its spec; a failure is said in the
/// termination message too (the operator reads why from there; the log has it as well).
fn run_member<T: Task>(
    args: RunArgs,
    task_of: impl FnOnce(&DecentralizedTrainingJobSpec) -> T,
) -> Result<(), CliError> {
    member(args, task_of).inspect_err(|e| {
        write_termination_message(&murmur_core::contract::TerminationMessage {
            outcome: murmur_core::contract::TerminationOutcome::Failed,
            step: 0,
            message: Some(e.to_string()),
        })
    })
}

fn member<T: Task>(
    args: RunArgs,
    task_of: impl FnOnce(&DecentralizedTrainingJobSpec) -> T,
) -> Result<(), CliError> {
    let env = TrainerEnv::from_lookup(|k| std::env::var(k).ok())?;
    let spec = match &args.manifest {
        Some(path) => murmur_core::api::load_manifest(path)?.spec,
        None => runtime::spec_from_env(&env)?.ok_or_else(|| {
            CliError::Flag(format!(
                "no job spec: set {} (JSON) or pass --manifest FILE",
                murmur_core::contract::env::JOB_SPEC
            ))
        })?,
    };
    let key = runtime::read_key(&env.peer_key_file)?;
    let backend = env.backend;
    let task = task_of(&spec);
    // One compute thread per core of the member's CPU limit (see `backend::threads_for`).
    let threads =
        crate::backend::threads_for(spec.trainer.resources.as_ref().and_then(|r| r.cpu_cores()));
    crate::backend::set_threads(threads);
    tracing::info!(threads, "compute threads");
    let setup = RunSetup {
        env,
        spec,
        key,
        options: RunOptions {
            grace_period: args.grace_period.as_std(),
            eval_every: args.eval_every,
            startup_timeout: args.startup_timeout.as_std(),
        },
    };
    // The training loop holds the main thread; peers and HTTP run on the workers.
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let outcome = match backend {
        Backend::Cpu => tokio.block_on(runtime::run::<crate::backend::Cpu, T>(
            setup,
            task,
            Default::default(),
        ))?,
        #[cfg(feature = "cuda")]
        Backend::Cuda => {
            cuda_driver_present()?;
            tokio.block_on(runtime::run::<
                burn::backend::Autodiff<burn::backend::Cuda>,
                T,
            >(setup, task, Default::default()))?
        }
        #[cfg(not(feature = "cuda"))]
        Backend::Cuda => {
            return Err(CliError::Flag(
                "MURMUR_BACKEND=cuda: this murmur-trainer was built without CUDA; rebuild with `cargo build --release -p murmur-trainer --features cuda`".into(),
            ));
        }
    };
    tracing::info!(?outcome, "exiting");
    write_termination_message(&outcome);
    // Detached tasks (HTTP, dialers) end with the process.
    tokio.shutdown_timeout(std::time::Duration::from_millis(200));
    Ok(())
}

/// Tell the runtime how this member ended (see `TERMINATION_LOG`; a pod's termination message).
/// Best effort: a runtime that cannot read it falls back to the member's last posted status
/// and its exit code.
fn write_termination_message(message: &murmur_core::contract::TerminationMessage) {
    let Some(path) = std::env::var_os(murmur_core::contract::TERMINATION_LOG) else {
        return;
    };
    let text = serde_json::to_string(message).expect("a termination message serializes");
    if let Err(e) = std::fs::write(&path, text) {
        tracing::warn!(path = %std::path::Path::new(&path).display(), error = %e, "cannot write the termination message");
    }
}

/// `--outer-*`: the outer optimizer, with the ranges `algorithm.outer` takes in a manifest.
fn outer(args: &SimulateArgs) -> Result<Option<OuterConfig>, CliError> {
    let Some(local_steps) = args.outer_local_steps else {
        return Ok(None);
    };
    if !(args.outer_learning_rate > 0.0 && args.outer_learning_rate <= 10.0) {
        return Err(CliError::Flag(format!(
            "--outer-learning-rate must be in (0, 10], not {}",
            args.outer_learning_rate
        )));
    }
    if !(0.0..1.0).contains(&args.outer_momentum) {
        return Err(CliError::Flag(format!(
            "--outer-momentum must be in [0, 1), not {}",
            args.outer_momentum
        )));
    }
    if !(1..=local_steps).contains(&args.outer_overlap_steps) {
        return Err(CliError::Flag(format!(
            "--outer-overlap-steps must be from 1 to --outer-local-steps ({local_steps}), not {}",
            args.outer_overlap_steps
        )));
    }
    Ok(Some(OuterConfig {
        local_steps,
        optimizer: args.outer_optimizer,
        learning_rate: args.outer_learning_rate,
        momentum: args.outer_momentum,
        overlap_steps: args.outer_overlap_steps,
    }))
}

fn simulate(args: SimulateArgs) -> Result<(), CliError> {
    let outer = outer(&args)?;
    let config = SimulationConfig {
        members: args.members,
        topologies: args.topology.clone(),
        algorithm: args.algorithm,
        partition: Partition::parse(&args.partition)
            .map_err(|e| CliError::Flag(format!("--partition: {e}")))?,
        model: args.model,
        steps: args.steps,
        eval_every: args.eval_every,
        batch_size: args.batch_size,
        learning_rate: args.learning_rate,
        optimizer: args.optimizer,
        momentum: args.momentum,
        averaging: averaging(&args)?,
        compression: compression(&args.compression)?,
        seed: args.seed,
        topology: args.topology_options,
        proxy_warmup_steps: args.proxy_warmup_steps,
        threads: args.threads.unwrap_or_else(crate::backend::all_cores),
        max_staleness: u64::from(args.max_staleness),
        slow: args
            .slow
            .iter()
            .map(|s| slow_member(s))
            .collect::<Result<_, _>>()?,
        target_accuracy: args.target_accuracy,
        consensus_only: args.consensus_only,
        target_consensus: args.target_consensus,
        departed: args.departed,
        zones: args.zones,
        overlap: args.overlap,
        outer,
    };
    if args.target_accuracy.is_some() && args.target_consensus.is_some() {
        return Err(CliError::Flag(
            "--target-accuracy and --target-consensus share the summary's \"to target\" column: give one".into(),
        ));
    }
    if let Some(d) = args.target_consensus
        && !(d >= 0.0 && d.is_finite())
    {
        return Err(CliError::Flag(format!(
            "--target-consensus {d}: must be a distance of 0 or more"
        )));
    }
    if !(1..=1000).contains(&args.max_staleness) {
        return Err(CliError::Flag(format!(
            "--max-staleness {}: must be from 1 to 1000",
            args.max_staleness
        )));
    }
    if let Some(t) = args.target_accuracy
        && !(t > 0.0 && t <= 1.0)
    {
        return Err(CliError::Flag(format!(
            "--target-accuracy {t}: must be a fraction in (0, 1]"
        )));
    }
    if config.threads == 0 {
        return Err(CliError::Flag("--threads 0: must be at least 1".into()));
    }
    crate::backend::set_threads(config.threads);
    if !(args.learning_rate > 0.0 && args.learning_rate.is_finite()) {
        return Err(CliError::Flag(format!(
            "--learning-rate {}: must be a positive number",
            args.learning_rate
        )));
    }
    if !(0.0..1.0).contains(&args.momentum) {
        return Err(CliError::Flag(format!(
            "--momentum {}: must be in [0, 1)",
            args.momentum
        )));
    }
    let data = load_data(&args.data)?;
    let results = match args.backend {
        Backend::Cpu => run_on::<crate::backend::Cpu>(&config, &data)?,
        #[cfg(feature = "cuda")]
        Backend::Cuda => {
            cuda_driver_present()?;
            run_on::<burn::backend::Autodiff<burn::backend::Cuda>>(&config, &data)?
        }
        #[cfg(not(feature = "cuda"))]
        Backend::Cuda => {
            return Err(CliError::Flag(
                "--backend cuda: this murmur-trainer was built without CUDA; rebuild with `cargo build --release -p murmur-trainer --features cuda`".into(),
            ));
        }
    };
    println!(
        "\n{:<18} {:<16} {:>9} {:>7} {:>7} {:>12} {:>12} {:>9} {:>12}",
        "topology",
        "algorithm",
        "accuracy",
        "edges",
        "gap",
        "MB sent",
        "cross-zone",
        "seconds",
        "to target"
    );
    for r in &results {
        let reached = |time: Option<f64>| match (args.target_accuracy, time) {
            (None, _) => "-".to_string(),
            (Some(_), None) => "not reached".to_string(),
            (Some(_), Some(t)) => format!("{t:.0}"),
        };
        let mut to_target = match config.target_consensus {
            Some(_) => r
                .steps_to_consensus
                .map_or_else(|| "not reached".to_string(), |s| s.to_string()),
            None => reached(r.time_to_target),
        };
        if !config.slow.is_empty() {
            // The full-speed members' mean, after the slash: how far the slow ones held them up.
            to_target = format!("{to_target}/{}", reached(r.full_speed_time_to_target));
        }
        let gap = r
            .spectral_gap
            .map_or_else(|| "-".to_string(), |g| format!("{g:.4}"));
        let accuracy = if config.consensus_only {
            "-".to_string()
        } else {
            format!("{:.2}%", 100.0 * r.final_test_accuracy)
        };
        let cross_zone = r
            .cross_zone_bytes
            .map_or_else(|| "-".to_string(), |b| format!("{:.1}", b as f64 / 1e6));
        println!(
            "{:<18} {:<16} {:>9} {:>7} {:>7} {:>12.1} {:>12} {:>9.1} {:>12}",
            r.topology,
            r.algorithm,
            accuracy,
            r.edges,
            gap,
            r.bytes_sent as f64 / 1e6,
            cross_zone,
            r.wall_seconds,
            to_target
        );
    }
    if let Some(dir) = &args.output {
        let metric = if config.consensus_only {
            output::Metric::Consensus
        } else {
            output::Metric::Accuracy
        };
        output::write_all(dir, &results, metric)?;
        println!(
            "\nwrote {}/curves.csv, results.json, {}",
            dir.display(),
            metric.file_name()
        );
    }
    Ok(())
}
