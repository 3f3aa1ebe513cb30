//! `murmur-chart install > manifests/install.yaml` regenerates the plain install manifest;
//! `murmur-chart template [-f values.yaml]` prints what `helm template` would.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use murmur_chart::{Chart, ChartError, Release};

#[derive(Parser)]
#[command(name = "murmur-chart", about = "Render charts/murmur without helm")]
struct Cli {
    /// The chart folder.
    #[arg(long, default_value = "charts/murmur")]
    chart: PathBuf,
    /// Release name, as in `helm install <name>`.
    #[arg(long, default_value = "murmur")]
    release: String,
    /// Namespace, as in `helm install --namespace`.
    #[arg(long, short, default_value = "murmur-system")]
    namespace: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The namespace, the CRDs and the chart with default values (manifests/install.yaml).
    Install,
    /// The chart's objects, with values files merged in order (like `helm template -f`).
    Template {
        #[arg(long = "values", short = 'f')]
        values: Vec<PathBuf>,
    },
}

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error(transparent)]
    Chart(#[from] ChartError),
    #[error("{path}: not valid YAML: {message}")]
    Values { path: PathBuf, message: String },
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn run(cli: Cli) -> Result<String, Error> {
    let chart = Chart::load(&cli.chart)?;
    let release = Release {
        name: cli.release,
        namespace: cli.namespace,
    };
    match cli.command {
        Command::Install => Ok(chart.install_manifest(&release)?),
        Command::Template { values } => {
            let mut overrides = serde_json::json!({});
            for path in values {
                let text = std::fs::read_to_string(&path).map_err(|source| Error::Read {
                    path: path.clone(),
                    source,
                })?;
                let more: serde_json::Value =
                    serde_saphyr::from_str(&text).map_err(|e| Error::Values {
                        path: path.clone(),
                        message: e.to_string(),
                    })?;
                murmur_chart::merge(&mut overrides, &more);
            }
            Ok(murmur_chart::to_yaml(&chart.render(&release, &overrides)?))
        }
    }
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("murmur-chart: {e}");
            ExitCode::from(2)
        }
    }
}
