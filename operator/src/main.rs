//! `murmur`: the user-facing CLI — topology explorer, manifest tools, `murmur run` (the local
//! runtime) and `murmur operator` (the Kubernetes runtime).

use std::process::ExitCode;

use clap::Parser;
use murmur::cli;

/// jemalloc hands freed memory back to the system: the operator's peak at 10 000 members
/// (`e2e/scale/run.sh --members 10000`) was 479 MiB with it, 582 to 615 MiB with glibc's malloc,
/// whose arenas kept what the join wave's connections and documents had freed.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

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
