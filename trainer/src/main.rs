//! `murmur-trainer`: the trainer process. `run` is one member of a job; `simulate` runs many
//! virtual members in one process.

use std::process::ExitCode;

use clap::Parser;
use murmur_trainer::cli;

fn main() -> ExitCode {
    cli::init_process();
    cli::exit(cli::run(cli::Cli::parse()))
}
