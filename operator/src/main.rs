//! `murmur`: the user-facing CLI — topology explorer, manifest tools, and (in later issues) the
//! local runtime and the operator.

mod cli;
mod planner;
mod runtime;
mod status;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    match cli::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
