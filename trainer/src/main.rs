//! `murmur-trainer`: the trainer process. `run` is one member of a job; `simulate` runs many
//! virtual members in one process.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use murmur_trainer::cli;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    murmur_trainer::runtime::keep_freed_buffers();
    murmur_trainer::backend::flush_subnormals();
    // JSON logs when a machine reads them (pods, `murmur run`), plain text at a terminal.
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    if std::io::stdout().is_terminal() {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    } else {
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .init();
    }
    match cli::run(cli::Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
