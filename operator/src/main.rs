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

/// jemalloc's options, read at its start (`_RJEM_MALLOC_CONF` in the environment adds to them):
/// - freed pages go back to the system at once rather than after 10 s, which a join wave's
///   burst of connections and documents kept resident: the 1 000-member peak was 70 to 72 MiB
///   with it, 84 to 90 without it (`e2e/scale/run.sh --members 1000`);
/// - each thread's cache keeps freed blocks of at most 4 KiB rather than 32 KiB: the larger
///   ones, a burst of connections' buffers, waited there for a reuse that rarely came. The
///   1 000-member peak was 42 MiB with it, 44 without it, and the reconcile's CPU p99 the same
///   (56.8 ms).
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: Option<&std::ffi::CStr> =
    Some(c"dirty_decay_ms:0,muzzy_decay_ms:0,tcache_max:4096");

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
