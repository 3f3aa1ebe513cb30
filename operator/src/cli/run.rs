//! `murmur run job.yaml`: the whole job on this machine, from the manifest a cluster would take.

use std::io::IsTerminal;
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use murmur_core::api::{self, JobPhase};

use super::CliError;
use crate::runtime::local::{self, Chaos, LocalOptions, Summary};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ChaosKind {
    /// Preempt a random training member on a schedule.
    Preempt,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// A DecentralizedTrainingJob manifest (the one you would `kubectl apply`).
    pub manifest: PathBuf,
    /// Inject failures while the job runs.
    #[arg(long, value_enum)]
    pub chaos: Option<ChaosKind>,
    /// How often chaos strikes, e.g. 20s or 1m.
    #[arg(long, default_value = "20s", requires = "chaos")]
    pub every: api::Duration,
    /// SIGKILL (node loss, no notice) instead of SIGTERM (a spot notice).
    #[arg(long, requires = "chaos")]
    pub kill: bool,
    /// Stop striking after this long (default: until the job ends), e.g. 2m.
    #[arg(long = "for", value_name = "DURATION", requires = "chaos")]
    pub chaos_for: Option<api::Duration>,
    /// Seeds the choice of victims (default: the job's training seed).
    #[arg(long, requires = "chaos")]
    pub chaos_seed: Option<u64>,
    /// Write the final model, metrics CSV, plots, topology SVG, logs and summary.json here.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// The status API and dashboard (port 0: any free port).
    #[arg(long, default_value = local::DEFAULT_STATUS_ADDRESS)]
    pub status_address: String,
    /// Observer reads (status API, dashboard, /metrics) served per second, queued beyond that
    /// so that watching cannot slow training; 0 serves them unpaced. Trainers' control traffic
    /// and probes are never paced.
    #[arg(long, default_value_t = crate::status::pacer::DEFAULT_READS_PER_SECOND)]
    pub status_reads_per_second: u32,
    /// The trainer binary (default: next to `murmur`, else on PATH).
    #[arg(long)]
    pub trainer: Option<PathBuf>,
    /// Members evaluate test accuracy every this many steps.
    #[arg(long, default_value_t = 25, value_parser = clap::value_parser!(u32).range(1..))]
    pub eval_every: u32,
}

pub fn run(args: RunArgs, out: &mut impl std::io::Write) -> Result<(), CliError> {
    let job = api::load_manifest(&args.manifest)?;
    let trainer = match args.trainer {
        Some(path) if path.is_file() => path,
        Some(path) => {
            return Err(CliError::Local(local::LocalError::TrainerNotFound {
                searched: path.display().to_string(),
            }));
        }
        None => local::find_trainer()?,
    };
    let seed = job.spec.training.seed;
    let options = LocalOptions {
        trainer,
        status_address: args.status_address,
        reads_per_second: args.status_reads_per_second,
        chaos: args.chaos.map(|ChaosKind::Preempt| {
            Chaos::new(
                args.every.as_std(),
                args.kill,
                args.chaos_seed.unwrap_or(seed),
            )
            .lasting(args.chaos_for.map(|d| d.as_std()))
        }),
        output: args.output,
        eval_every: args.eval_every,
        bars: std::io::stdout().is_terminal(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let summary = runtime.block_on(local::run(job, options))?;
    print_summary(&summary, out)?;
    match summary.phase {
        JobPhase::Succeeded => Ok(()),
        _ => {
            Err(CliError::JobFailed(summary.message.unwrap_or_else(|| {
                format!("the job ended {:?}", summary.phase)
            })))
        }
    }
}

fn print_summary(s: &Summary, out: &mut impl std::io::Write) -> std::io::Result<()> {
    let pct = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{:.2}%", 100.0 * v));
    writeln!(out, "job {}/{}: {:?}", s.namespace, s.job, s.phase)?;
    if let Some(m) = &s.message {
        writeln!(out, "  {m}")?;
    }
    match &s.final_metric {
        Some(m) => writeln!(
            out,
            "  final {:<14} {:.3} (mean of {} members; min {:.3}, max {:.3})",
            m.name, m.mean, s.members_completed, m.min, m.max
        )?,
        None => writeln!(
            out,
            "  final accuracy       {} (mean of {} members; min {}, max {})",
            pct(s.final_accuracy),
            s.members_completed,
            pct(s.accuracy_min),
            pct(s.accuracy_max)
        )?,
    }
    writeln!(out, "  steps                {}", s.steps)?;
    writeln!(out, "  wall time            {:.1} s", s.wall_seconds)?;
    writeln!(
        out,
        "  bytes exchanged      {:.1} MB",
        s.bytes_exchanged as f64 / 1e6
    )?;
    writeln!(out, "  preemptions survived {}", s.preemptions_survived)?;
    writeln!(out, "  crash restarts       {}", s.restarts)?;
    writeln!(out, "  topology version     {}", s.topology_version)?;
    Ok(())
}
