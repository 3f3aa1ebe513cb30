//! Flat export + import of a 10M-parameter model, against a plain memcpy of the same bytes.
//! Target: at most 2x the memcpy. Run: `cargo bench -p murmur-trainer --bench flat_params`.

use std::hint::black_box;
use std::time::Instant;

use burn::backend::Flex;
use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::backend::Backend;
use murmur_trainer::model::{export, export_into, import};

/// Ten 1000x1000 layers: 10 010 000 parameters.
#[derive(Module, Debug)]
struct Big<B: Backend> {
    layers: Vec<Linear<B>>,
}

type B = Flex;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let device = Default::default();
    let model = Big::<B> {
        layers: (0..10)
            .map(|_| LinearConfig::new(1000, 1000).init(&device))
            .collect(),
    };
    let (mut model, values, layout) = export(model);
    println!("parameters={}", values.len());
    let rounds = 15;

    // memcpy into a buffer reused across rounds (pages already mapped), and into a fresh one.
    let mut copy = vec![0f32; values.len()];
    let memcpy: Vec<f64> = (0..rounds)
        .map(|_| {
            let start = Instant::now();
            copy.copy_from_slice(black_box(&values));
            black_box(&copy);
            start.elapsed().as_secs_f64()
        })
        .collect();
    let memcpy_fresh: Vec<f64> = (0..rounds)
        .map(|_| {
            let start = Instant::now();
            let fresh = black_box(&values).to_vec();
            black_box(&fresh);
            start.elapsed().as_secs_f64()
        })
        .collect();

    let (mut export_s, mut export_fresh_s, mut import_s) = (Vec::new(), Vec::new(), Vec::new());
    let mut flat = Vec::new();
    for _ in 0..rounds {
        let start = Instant::now();
        let (exported, _) = export_into(black_box(model), &mut flat);
        export_s.push(start.elapsed().as_secs_f64());
        let start = Instant::now();
        let (exported, fresh, _) = export(black_box(exported));
        export_fresh_s.push(start.elapsed().as_secs_f64());
        black_box(&fresh);
        let start = Instant::now();
        model = import(exported, black_box(&flat), &layout).expect("same layout");
        import_s.push(start.elapsed().as_secs_f64());
    }
    let (m, mf, e, ef, i) = (
        median(memcpy),
        median(memcpy_fresh),
        median(export_s),
        median(export_fresh_s),
        median(import_s),
    );
    let gb = values.len() as f64 * 4.0 / 1e9;
    println!(
        "memcpy_ms={:.2} ({:.1} GB/s), into a fresh buffer {:.2}",
        m * 1e3,
        gb / m,
        mf * 1e3
    );
    println!(
        "export_into_reused_ms={:.2} export_fresh_ms={:.2} import_ms={:.2}",
        e * 1e3,
        ef * 1e3,
        i * 1e3
    );
    println!(
        "ratio_export_plus_import_over_memcpy={:.2} (reused buffer vs memcpy)",
        (e + i) / m
    );
    println!(
        "ratio_fresh_export_plus_import_over_fresh_memcpy={:.2}",
        (ef + i) / mf
    );
}
