//! The CPU backend the trainer computes on, and how many threads it may use.
//!
//! burn's `flex` backend (pure Rust, on the `gemm` crate), chosen by `cargo bench -p murmur-trainer
//! --bench mlp_step`, which runs every model on both CPU backends that build offline (flex and
//! ndarray) beside PyTorch: flex was the faster on every model, by over 20× on GN-LeNet, whose
//! convolutions ndarray runs naively. GN-LeNet's convolution, pool, conv bias and GroupNorm, and
//! every model's dense products, run on the model's own operations over flex (`model::cpu`),
//! which replace flex's generic ones. The figures are in docs/benchmarks.md.

/// The CPU training backend (autodiff over flex).
pub type Cpu = burn::backend::Autodiff<burn::backend::Flex>;

/// Threads for the backend's kernels (its rayon pool). They start here, from the calling thread,
/// so they treat subnormals as it does ([`flush_subnormals`]). Call once, before the first tensor
/// operation; a later call keeps the first setting.
pub fn set_threads(threads: usize) {
    if let Err(e) = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .build_global()
    {
        tracing::debug!(error = %e, "the compute thread pool was already set up");
    }
}

/// Treat subnormal floats as zero on this thread, and on threads it starts from now on (Linux
/// copies the floating-point control register into a new thread): x86-64's FTZ and DAZ bits,
/// as `torch.set_flush_denormal(True)` sets them; a no-op on other architectures.
///
/// Why: in the step bench (MLP, batch 64, one thread) the optimizer's two scalar
/// multiplications were 40% of the step, and flushing alone made the step 1.8 times as fast
/// (35 944 samples/s against 64 813). The likely cause: a weight whose gradient stops (a ReLU
/// unit that died) keeps a momentum velocity that shrinks by `m` every step into the subnormal
/// range, where every operation takes a slow microcode path. Values that small change nothing
/// in training. Call first thing in `main`, before any thread starts.
pub fn flush_subnormals() {
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    // SAFETY: reads and writes this thread's MXCSR through a local; FTZ (bit 15) and DAZ (bit 6)
    // only change how subnormal results and operands are treated. (`_mm_setcsr` does the same
    // and is deprecated in favour of inline assembly.)
    unsafe {
        let mut csr = 0u32;
        std::arch::asm!("stmxcsr [{}]", in(reg) &raw mut csr, options(nostack, preserves_flags));
        csr |= (1 << 15) | (1 << 6);
        std::arch::asm!("ldmxcsr [{}]", in(reg) &raw const csr, options(nostack, preserves_flags, readonly));
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
    use super::{flush_subnormals, threads_for};
    use std::hint::black_box;

    /// Half the smallest normal f32: subnormal, unless flushed.
    fn half_of_smallest_normal() -> f32 {
        black_box(f32::MIN_POSITIVE) * black_box(0.5)
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn subnormals_are_flushed_on_the_thread_and_on_threads_it_starts() {
        // On its own thread, so the test harness's threads keep their default.
        std::thread::spawn(|| {
            assert!(
                half_of_smallest_normal() > 0.0,
                "subnormal before the flush"
            );
            flush_subnormals();
            assert_eq!(half_of_smallest_normal(), 0.0);
            let child = std::thread::spawn(half_of_smallest_normal).join().unwrap();
            assert_eq!(child, 0.0, "a thread started afterwards flushes too");
        })
        .join()
        .unwrap();
    }

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
