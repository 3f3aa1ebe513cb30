//! Command-line surface. Each subcommand parses its flags, calls pure code, and prints.

mod dashboard;
pub mod operator;
mod run;
mod topology;

use std::io::Write;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use murmur_core::api::{self, ManifestError};

#[derive(Parser, Debug)]
#[command(
    name = "murmur",
    version,
    about = "Decentralized training on spot nodes"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Build a communication graph and print it with its measures.
    Topology(topology::TopologyArgs),
    /// Run a job manifest on this machine: trainers as local processes, with the status API
    /// and dashboard.
    Run(run::RunArgs),
    /// Run the Kubernetes operator: reconcile DecentralizedTrainingJobs into trainer pods.
    // A flag given twice takes the last value: the chart's `operator.extraArgs` override.
    #[command(args_override_self = true)]
    Operator(operator::OperatorArgs),
    /// Open the operator's dashboard as you: your kubeconfig's credentials, through the API
    /// server's service proxy, showing the jobs you may get.
    Dashboard(dashboard::DashboardArgs),
    /// Print the DecentralizedTrainingJob CustomResourceDefinition (what `crds/` holds).
    Crd {
        /// Print the API reference in Markdown instead (what `docs/reference/api.md` holds).
        #[arg(long)]
        reference: bool,
    },
    /// Check a job manifest with the same rules the cluster applies.
    Validate {
        /// Path to a DecentralizedTrainingJob manifest.
        manifest: PathBuf,
        /// The job as it stands: check `manifest` as an edit of it, with the rules the cluster
        /// applies to an update (immutable fields).
        #[arg(long, value_name = "MANIFEST")]
        previous: Option<PathBuf>,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Topology(#[from] topology::TopologyCliError),
    #[error("cannot write output: {0}")]
    Output(#[from] std::io::Error),
    #[error(transparent)]
    Local(#[from] crate::runtime::local::LocalError),
    #[error("the job failed: {0}")]
    JobFailed(String),
    #[error(transparent)]
    Operator(operator::OperatorCliError),
    #[error(transparent)]
    Dashboard(#[from] dashboard::DashboardError),
}

impl CliError {
    /// 2 for bad input (flags, files, manifests), 1 for anything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Manifest(_) | CliError::Topology(_) => 2,
            CliError::Output(_)
            | CliError::JobFailed(_)
            | CliError::Operator(_)
            | CliError::Dashboard(_) => 1,
            CliError::Local(e) => e.exit_code(),
        }
    }
}

pub fn run(cli: Cli) -> Result<(), CliError> {
    // Locked per write, never for a whole command: a lock held by the main thread while it runs
    // the operator (or a local job) blocks every worker thread that logs to stdout — forever.
    let mut out = std::io::stdout();
    match cli.command {
        Command::Topology(args) => topology::run(args, &mut out),
        Command::Run(args) => run::run(args, &mut out),
        Command::Operator(args) => operator::run(args),
        Command::Dashboard(args) => dashboard::run(args, &mut out),
        Command::Crd { reference } => {
            let text = if reference {
                api::reference::api_reference()
            } else {
                api::crd_yaml()
            };
            out.write_all(text.as_bytes())?;
            Ok(())
        }
        Command::Validate { manifest, previous } => {
            let job = api::load_manifest(&manifest)?;
            if let Some(previous) = previous {
                let old = api::load_manifest(&previous)?;
                api::validate_update(&job, &old).map_err(|violations| ManifestError::Invalid {
                    file: manifest.display().to_string(),
                    violations,
                })?;
            }
            writeln!(
                out,
                "{}: valid {} {:?} job, {} members (min {}, max {})",
                manifest.display(),
                job.metadata.name.as_deref().unwrap_or_default(),
                job.spec.topology.kind,
                job.spec.replicas.target,
                job.spec.replicas.min,
                job.spec.replicas.max,
            )?;
            Ok(())
        }
    }
}
