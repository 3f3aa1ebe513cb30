//! The built-in task: the spec's `training.model` (logistic regression, MLP, GN-LeNet) classifying
//! 28×28 grey-level images into 10 classes, read from the spec's `training.dataset`.

use burn::module::Module;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};
use murmur_core::api::{DatasetSpec, ModelKind};

use super::{Data, Inner, Metric, Score, Split, Task, classification_score, cross_entropy};
use crate::data::{self, CLASSES, DataError, Dataset, IMAGE_PIXELS};
use crate::model::Model;

/// One of the built-in models on images of digits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageClassification {
    pub model: ModelKind,
}

impl Data for Dataset {
    fn len(&self) -> usize {
        self.labels.len()
    }

    fn classes(&self) -> usize {
        CLASSES
    }

    fn label(&self, i: usize) -> Option<usize> {
        self.labels.get(i).map(|&l| usize::from(l))
    }
}

/// The images `batch` of `data` as `[n, 784]` and their labels.
fn tensors<B: Backend>(
    data: &Dataset,
    batch: &[usize],
    device: &B::Device,
) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
    let mut pixels = Vec::with_capacity(batch.len() * IMAGE_PIXELS);
    let mut labels = Vec::with_capacity(batch.len());
    for &i in batch {
        pixels.extend_from_slice(data.image(i));
        labels.push(i64::from(data.labels[i]));
    }
    (
        Tensor::from_data(TensorData::new(pixels, [batch.len(), IMAGE_PIXELS]), device),
        Tensor::from_data(TensorData::new(labels, [batch.len()]), device),
    )
}

impl Task for ImageClassification {
    type Data = Dataset;
    type Model<B: AutodiffBackend> = Model<B>;

    fn metric(&self) -> Metric {
        Metric::ACCURACY
    }

    fn load(&self, spec: &DatasetSpec) -> Result<Split<Dataset>, DataError> {
        data::load(spec)
    }

    fn init<B: AutodiffBackend>(&self, _: &Dataset, device: &B::Device) -> Model<B> {
        Model::new(self.model, device)
    }

    fn loss<B: AutodiffBackend>(
        &self,
        model: &Model<B>,
        data: &Dataset,
        batch: &[usize],
        device: &B::Device,
    ) -> Tensor<B, 1> {
        let (x, y) = tensors(data, batch, device);
        cross_entropy(model.forward(x), y)
    }

    fn score<B: AutodiffBackend>(
        &self,
        model: &Inner<Self, B>,
        data: &Dataset,
        batch: &[usize],
    ) -> Score {
        let device = model.devices().into_iter().next().unwrap_or_default();
        let (x, y) = tensors::<B::InnerBackend>(data, batch, &device);
        classification_score(model.forward(x), y)
    }

    fn mean_prediction<B: AutodiffBackend>(
        &self,
        model: &Inner<Self, B>,
        data: &Dataset,
        batch: &[usize],
    ) -> Option<Vec<f32>> {
        let device = model.devices().into_iter().next().unwrap_or_default();
        let (x, _) = tensors::<B::InnerBackend>(data, batch, &device);
        let n = batch.len().max(1) as f32;
        let probs = burn::tensor::activation::softmax(model.forward(x), 1).sum_dim(0) / n;
        Some(probs.into_data().iter::<f32>().collect())
    }
}
