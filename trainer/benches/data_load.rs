//! Loading the embedded sample (gunzip and parse of the 5 000-image CSV): every trainer pays it
//! at start, and a replacement pays it while its clique trains without it. Prints the median of
//! 15 loads and of 15 gunzips alone (the floor the parse adds to). Run:
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
    let gunzip = timed(runs, || {
        let mut text = Vec::new();
        flate2::read::GzDecoder::new(murmur_trainer::data::EMBEDDED_CSV_GZ)
            .read_to_end(&mut text)
            .expect("the embedded sample decompresses");
        black_box(text);
    });
    println!("embedded_load_ms={load:.1}");
    println!("gunzip_only_ms={gunzip:.1}");
}
