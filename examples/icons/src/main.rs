//! A trainer of a task of its own, as a user of murmur writes one: a small CNN learning the
//! context an icon belongs to (an action, an application, a device, a file type, a place, a
//! status...) from its 32×32 picture. The data is a real icon theme that Debian ships
//! (`oxygen-icon-theme`: `/usr/share/icons/oxygen/base/32x32/<context>/<icon>.png`), read as a
//! class-per-folder tree; a fifth of the icons, chosen by a hash of their names, are held out
//! to test on.

use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{Linear, LinearConfig, PaddingConfig2d};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use murmur_core::api::DatasetSpec;
use murmur_trainer::data::DataError;
use murmur_trainer::data::folder::{ImageFolder, image_len};
use murmur_trainer::task::{
    Data, Inner, Metric, Score, Split, Task, classification_score, cross_entropy,
};

/// Icons are read at this side.
const SIDE: usize = 32;

/// Three blocks of 3×3 convolution, ReLU and 2×2 max-pool (16, 32, 64 channels), then a linear
/// layer from the 4×4×64 features to the classes.
#[derive(Module, Debug)]
struct IconNet<B: Backend> {
    convs: Vec<Conv2d<B>>,
    pool: MaxPool2d,
    output: Linear<B>,
}

impl<B: Backend> IconNet<B> {
    fn new(classes: usize, device: &B::Device) -> Self {
        let conv = |i, o| {
            Conv2dConfig::new([i, o], [3, 3])
                .with_padding(PaddingConfig2d::Same)
                .init(device)
        };
        Self {
            convs: vec![conv(3, 16), conv(16, 32), conv(32, 64)],
            pool: MaxPool2dConfig::new([2, 2]).with_strides([2, 2]).init(),
            output: LinearConfig::new(64 * (SIDE / 8) * (SIDE / 8), classes).init(device),
        }
    }

    fn forward(&self, images: Tensor<B, 4>) -> Tensor<B, 2> {
        let mut x = images;
        for conv in &self.convs {
            x = self
                .pool
                .forward(burn::tensor::activation::relu(conv.forward(x)));
        }
        self.output.forward(x.flatten(1, 3))
    }
}

/// The icons `batch` of `data` as `[n, 3, side, side]` and their classes.
fn tensors<B: Backend>(
    data: &ImageFolder,
    batch: &[usize],
    device: &B::Device,
) -> (Tensor<B, 4>, Tensor<B, 1, Int>) {
    let mut pixels = Vec::with_capacity(batch.len() * image_len(data.side));
    let mut labels = Vec::with_capacity(batch.len());
    for &i in batch {
        pixels.extend_from_slice(data.image(i));
        labels.push(data.labels[i] as i64);
    }
    (
        Tensor::from_data(
            TensorData::new(pixels, [batch.len(), 3, data.side, data.side]),
            device,
        ),
        Tensor::from_data(TensorData::new(labels, [batch.len()]), device),
    )
}

/// FNV-1a: a hash of an icon's name that is the same on every member and every run.
fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

struct Icons;

impl Task for Icons {
    type Data = ImageFolder;
    type Model<B: AutodiffBackend> = IconNet<B>;

    fn metric(&self) -> Metric {
        Metric::ACCURACY
    }

    fn load(&self, spec: &DatasetSpec) -> Result<Split<ImageFolder>, DataError> {
        let dir = spec
            .path
            .as_deref()
            .unwrap_or("/usr/share/icons/oxygen/base/32x32");
        let all = ImageFolder::read(std::path::Path::new(dir), SIDE)?;
        // A fifth held out by name; of those, one in ten is the proxy batch, the rest the test.
        let (mut train, mut proxy, mut test) = (Vec::new(), Vec::new(), Vec::new());
        for (i, file) in all.files.iter().enumerate() {
            match fnv(file) % 50 {
                0..=1 => proxy.push(i),
                2..=9 => test.push(i),
                _ => train.push(i),
            }
        }
        Ok(Split {
            train: all.subset(&train),
            proxy: all.subset(&proxy),
            test: all.subset(&test),
        })
    }

    fn init<B: AutodiffBackend>(&self, data: &ImageFolder, device: &B::Device) -> IconNet<B> {
        IconNet::new(data.classes(), device)
    }

    fn loss<B: AutodiffBackend>(
        &self,
        model: &IconNet<B>,
        data: &ImageFolder,
        batch: &[usize],
        device: &B::Device,
    ) -> Tensor<B, 1> {
        let (x, y) = tensors(data, batch, device);
        cross_entropy(model.forward(x), y)
    }

    fn score<B: AutodiffBackend>(
        &self,
        model: &Inner<Self, B>,
        data: &ImageFolder,
        batch: &[usize],
    ) -> Score {
        let device = model.devices().into_iter().next().unwrap_or_default();
        let (x, y) = tensors::<B::InnerBackend>(data, batch, &device);
        classification_score(model.forward(x), y)
    }

    fn evaluation_batch(&self) -> usize {
        128
    }
}

fn main() -> std::process::ExitCode {
    murmur_trainer::run_task(Icons)
}
