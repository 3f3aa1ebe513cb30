//! Loading the embedded sample, which every trainer pays at start and a replacement pays while
//! its clique trains without it: the bytes build.rs decoded, scaled and split. Beside it, the
//! same sample read as a CSV file (gunzip and parse of 3.9 million numbers: what a `csv`
//! dataset costs, and what the embedded sample cost before build.rs decoded it), and the gunzip
//! alone. Prints the median of 15 runs of each. Run:
//! `cargo bench -p murmur-trainer --bench data_load`.

use std::hint::black_box;
use std::io::Read;
use std::time::Instant;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn timed(runs: usize, mut f: impl FnMut()) -> f64 {
    median(
        (0..runs)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect(),
    )
}

fn main() {
    let runs = 15;
    let load = timed(runs, || {
        black_box(murmur_trainer::data::embedded());
    });
    let file: &[u8] = include_bytes!("../data/mnist_5k.csv.gz");
    let csv = timed(runs, || {
        black_box(
            murmur_trainer::data::parse_csv(
                flate2::read::GzDecoder::new(file),
                "mnist_5k.csv.gz",
                murmur_trainer::data::LabelColumn::Last,
                &murmur_trainer::data::MNIST_SHAPE,
            )
            .expect("the sample parses"),
        );
    });
    let gunzip = timed(runs, || {
        let mut text = Vec::new();
        flate2::read::GzDecoder::new(file)
            .read_to_end(&mut text)
            .expect("the embedded sample decompresses");
        black_box(text);
    });
    println!("embedded_load_ms={load:.1}");
    println!("csv_load_ms={csv:.1}");
    println!("gunzip_only_ms={gunzip:.1}");
}
