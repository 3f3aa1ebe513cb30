//! One local MLP step (784 -> 256 -> 10, batch 64, SGD with momentum) on the ndarray backend, in
//! samples per second, beside the same step in PyTorch on CPU (bench/mlp_step_torch.py), with the
//! ratio. Run: `cargo bench -p murmur-trainer --bench mlp_step` (set BENCH_PYTHON to choose the
//! interpreter; the torch half is skipped, saying so, when torch is not installed).

use std::process::Command;
use std::time::Instant;

use burn::backend::{Autodiff, NdArray};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::tensor::{Distribution, Int, Tensor};
use murmur_core::api::ModelKind;
use murmur_trainer::model::Model;

type B = Autodiff<NdArray<f32>>;

fn main() {
    let device = Default::default();
    let mut model = Model::<B>::new(ModelKind::Mlp, &device);
    let mut optim = SgdConfig::new()
        .with_momentum(Some(
            MomentumConfig::new().with_momentum(0.9).with_dampening(0.0),
        ))
        .init::<B, Model<B>>();
    let x = Tensor::<B, 2>::random([64, 784], Distribution::Uniform(0.0, 1.0), &device);
    let y = Tensor::<B, 1, Int>::random([64], Distribution::Uniform(0.0, 10.0), &device);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut step = |model: Model<B>| {
        let loss = loss_fn.forward(model.forward(x.clone()), y.clone());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        optim.step(0.05, model, grads)
    };
    for _ in 0..50 {
        model = step(model);
    }
    let steps: usize = std::env::var("BENCH_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let start = Instant::now();
    for _ in 0..steps {
        model = step(model);
    }
    let burn_rate = (steps * 64) as f64 / start.elapsed().as_secs_f64();
    println!("burn_ndarray_samples_per_second={burn_rate:.0}");

    let python = std::env::var("BENCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/mlp_step_torch.py");
    match Command::new(&python).arg(script).output() {
        Ok(out) if out.status.success() => {
            let text = String::from_utf8_lossy(&out.stdout);
            print!("{text}");
            let torch_rate = text
                .lines()
                .find_map(|l| l.strip_prefix("torch_samples_per_second="))
                .and_then(|v| v.parse::<f64>().ok());
            if let Some(torch_rate) = torch_rate {
                println!("ratio_burn_over_torch={:.2}", burn_rate / torch_rate);
            }
        }
        Ok(out) => println!(
            "torch reference skipped: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(e) => println!("torch reference skipped: cannot run {python}: {e}"),
    }
}
