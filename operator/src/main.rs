//! `murmur`: the user-facing CLI — topology explorer, manifest tools, `murmur run` (the local
//! runtime) and `murmur operator` (the Kubernetes runtime).

use std::process::ExitCode;

use clap::Parser;
use murmur::cli;

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
