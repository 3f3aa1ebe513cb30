//! One local training step (SGD with momentum 0.9, lr 0.05, cross-entropy) of each model on each
//! of burn's CPU backends that build offline, in samples per second, beside the same step in
//! PyTorch on CPU (bench/mlp_step_torch.py) with the same thread count, and the ratio.
//!
//! Run: `cargo bench -p murmur-trainer --bench mlp_step`
//! - `BENCH_THREADS` (default: all cores): threads for burn (its rayon pool) and for torch.
//! - `BENCH_SECONDS` (default 3): time per backend and case.
//! - `BENCH_CASES` (default `mlp:64,gn-lenet:32,gn-lenet:64,logistic:64`): model:batch pairs.
//! - `BENCH_BACKENDS` (default `ndarray,flex`).
//! - `BENCH_OPTIMIZER` (default `in-place`, the trainer's; `burn` for burn's `Sgd`).
//! - `BENCH_SUBNORMALS=keep`: do not flush subnormals to zero (the trainer does).
//! - `BENCH_PYTHON` (default python3); the torch half is skipped, saying so, without torch.
//!
//! ndarray as built for the trainer runs on one thread; `--features ndarray-threads` turns on
//! its rayon threads and `--features openblas` also its matmul on Debian's OpenBLAS (threads:
//! `OPENBLAS_NUM_THREADS`, default every core). The table names the build in its backend column.

use std::process::Command;
use std::time::{Duration, Instant};

use burn::backend::{Autodiff, Flex, NdArray};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Distribution, Int, Tensor};
use murmur_core::api::ModelKind;
use murmur_trainer::algorithms::sgd::InPlaceSgd;
use murmur_trainer::model::Model;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Samples per second of `kind` at `batch` on backend `B`, over about `budget`.
fn burn_rate<B: AutodiffBackend>(kind: ModelKind, batch: usize, budget: Duration) -> f64 {
    // The trainer's optimizer, or burn's own (the same update as torch.optim.SGD(momentum=0.9)).
    match env_or("BENCH_OPTIMIZER", String::from("in-place")).as_str() {
        "in-place" => rate_with::<B, _>(kind, batch, budget, InPlaceSgd::new(0.9).init()),
        "burn" => {
            let momentum = MomentumConfig::new().with_momentum(0.9).with_dampening(0.0);
            let sgd = SgdConfig::new().with_momentum(Some(momentum));
            rate_with::<B, _>(kind, batch, budget, sgd.init())
        }
        other => panic!("BENCH_OPTIMIZER: in-place or burn, not {other}"),
    }
}

fn rate_with<B: AutodiffBackend, O: Optimizer<Model<B>, B>>(
    kind: ModelKind,
    batch: usize,
    budget: Duration,
    mut optim: O,
) -> f64 {
    let device = Default::default();
    B::seed(&device, 0);
    let mut model = Model::<B>::new(kind, &device);
    let x = Tensor::<B, 2>::random([batch, 784], Distribution::Uniform(0.0, 1.0), &device);
    let y = Tensor::<B, 1, Int>::random([batch], Distribution::Uniform(0.0, 10.0), &device);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut step = |model: Model<B>| {
        let loss = loss_fn.forward(model.forward(x.clone()), y.clone());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        optim.step(0.05, model, grads)
    };
    // Warm-up: allocator pools, thread pools, caches.
    let warm = Instant::now();
    while warm.elapsed() < budget / 10 {
        model = step(model);
    }
    let (start, mut steps) = (Instant::now(), 0usize);
    while start.elapsed() < budget {
        model = step(model);
        steps += 1;
    }
    (steps * batch) as f64 / start.elapsed().as_secs_f64()
}

fn torch_rate(
    python: &str,
    model: &str,
    batch: usize,
    steps: usize,
    threads: usize,
) -> Result<f64, String> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/mlp_step_torch.py");
    let out = Command::new(python)
        .arg(script)
        .args(["--model", model, "--batch", &batch.to_string()])
        .args([
            "--steps",
            &steps.to_string(),
            "--threads",
            &threads.to_string(),
        ])
        .output()
        .map_err(|e| format!("cannot run {python}: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("torch_samples_per_second="))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| "no torch_samples_per_second line".into())
}

fn main() {
    // As murmur-trainer's main does: large freed buffers stay in the heap (no page faults),
    // subnormals are flushed to zero.
    murmur_trainer::runtime::keep_freed_buffers();
    // `BENCH_SUBNORMALS=keep` measures without the flush.
    if std::env::var("BENCH_SUBNORMALS").as_deref() != Ok("keep") {
        murmur_trainer::backend::flush_subnormals();
    }
    let threads = env_or("BENCH_THREADS", murmur_trainer::backend::all_cores());
    murmur_trainer::backend::set_threads(threads);
    let budget = Duration::from_secs_f64(env_or("BENCH_SECONDS", 3.0));
    let cases: String = env_or(
        "BENCH_CASES",
        "mlp:64,gn-lenet:32,gn-lenet:64,logistic:64".into(),
    );
    let backends: String = env_or("BENCH_BACKENDS", "ndarray,flex".into());
    let python: String = env_or("BENCH_PYTHON", "python3".into());
    println!(
        "threads={threads} seconds_per_case={}",
        budget.as_secs_f64()
    );
    println!(
        "{:<10} {:>5} {:<16} {:>14} {:>14} {:>10}",
        "model", "batch", "backend", "burn samples/s", "torch samples/s", "burn/torch"
    );
    for case in cases.split(',') {
        let (name, batch) = case.split_once(':').expect("BENCH_CASES: model:batch");
        let batch: usize = batch.parse().expect("BENCH_CASES: a batch size");
        let kind = match name {
            "mlp" => ModelKind::Mlp,
            "gn-lenet" => ModelKind::GnLenet,
            "logistic" => ModelKind::LogisticRegression,
            other => panic!("BENCH_CASES: unknown model {other}"),
        };
        let mut torch = None;
        for backend in backends.split(',') {
            let rate = match backend {
                "ndarray" => burn_rate::<Autodiff<NdArray<f32>>>(kind, batch, budget),
                "flex" => burn_rate::<Autodiff<Flex>>(kind, batch, budget),
                other => panic!("BENCH_BACKENDS: unknown backend {other}"),
            };
            // Torch runs once per case, for about as long as burn did.
            let torch_rate = torch.get_or_insert_with(|| {
                let steps = ((rate * budget.as_secs_f64()) / batch as f64).max(20.0) as usize;
                torch_rate(&python, name, batch, steps, threads)
            });
            let backend = match backend {
                "ndarray" if cfg!(feature = "openblas") => "ndarray+openblas",
                "ndarray" if cfg!(feature = "ndarray-threads") => "ndarray+threads",
                other => other,
            };
            match torch_rate {
                Ok(t) => println!(
                    "{name:<10} {batch:>5} {backend:<16} {rate:>14.0} {t:>14.0} {:>10.2}",
                    rate / *t
                ),
                Err(e) => println!(
                    "{name:<10} {batch:>5} {backend:<16} {rate:>14.0} {:>14} {:>10}   (torch skipped: {e})",
                    "-", "-"
                ),
            }
        }
    }
}
