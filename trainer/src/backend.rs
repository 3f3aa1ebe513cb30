//! The CPU backend the trainer computes on, and how many threads it may use.
//!
//! burn's `flex` backend (pure Rust, on the `gemm` crate), chosen by `cargo bench -p murmur-trainer
//! --bench mlp_step`, which runs every model on both CPU backends that build offline (flex and
//! ndarray) beside PyTorch: flex was the faster on every model, by over 20× on GN-LeNet, whose
//! convolutions ndarray runs naively. GN-LeNet's convolution and pool run on the model's own
//! operations over flex (`model::cpu`), which replace flex's generic ones. The figures are in the
//! README.

/// The CPU training backend (autodiff over flex).
pub type Cpu = burn::backend::Autodiff<burn::backend::Flex>;

/// Threads for the backend's kernels (its rayon pool). Call once, before the first tensor
/// operation; a later call keeps the first setting.
pub fn set_threads(threads: usize) {
    if let Err(e) = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .build_global()
    {
        tracing::debug!(error = %e, "the compute thread pool was already set up");
    }
}

/// Threads for one trainer: its CPU limit rounded up (`500m` is one thread, `1.5` two), so that
/// trainers packed one per core on a node do not oversubscribe it; without a limit, one: a
/// trainer cannot tell how many others share its cores (`murmur run` starts them all on one
/// machine), and rayon's workers spin while they wait for work.
pub fn threads_for(cpu_limit: Option<f64>) -> usize {
    match cpu_limit {
        Some(cores) if cores.is_finite() && cores > 0.0 => cores.ceil() as usize,
        _ => 1,
    }
}

/// Every core this process may run on (the simulator's default).
pub fn all_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::threads_for;

    #[test]
    fn a_trainer_gets_its_cpu_limit_rounded_up_and_one_thread_without_a_limit() {
        assert_eq!(threads_for(Some(0.5)), 1);
        assert_eq!(threads_for(Some(1.0)), 1);
        assert_eq!(threads_for(Some(1.5)), 2);
        assert_eq!(threads_for(Some(4.0)), 4);
        assert_eq!(threads_for(None), 1);
        assert_eq!(threads_for(Some(0.0)), 1);
    }
}
