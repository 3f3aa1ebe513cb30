//! The built-in task: the spec's `training.model` (logistic regression, MLP, GN-LeNet) classifying
//! examples into 10 classes: 28×28 grey-level images, or for logistic regression and the MLP, any
//! shape the spec's `training.dataset` declares, flattened.

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

/// The examples `batch` of `data`, flattened (`[n, 784]` for MNIST), and their labels.
fn tensors<B: Backend>(
    data: &Dataset,
    batch: &[usize],
    device: &B::Device,
) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
    let width = data.example_len();
    let mut pixels = Vec::with_capacity(batch.len() * width);
    let mut labels = Vec::with_capacity(batch.len());
    for &i in batch {
        pixels.extend_from_slice(data.image(i));
        labels.push(i64::from(data.labels[i]));
    }
    (
        Tensor::from_data(TensorData::new(pixels, [batch.len(), width]), device),
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
        let split = data::load(spec)?;
        if self.model == ModelKind::GnLenet && split.train.example_len() != IMAGE_PIXELS {
            return Err(DataError::malformed(
                "training.dataset.shape",
                format!(
                    "gnLenet reads 28x28 images, not {:?}: use logisticRegression or mlp",
                    split.train.shape
                ),
            ));
        }
        Ok(split)
    }

    fn init<B: AutodiffBackend>(&self, data: &Dataset, device: &B::Device) -> Model<B> {
        Model::for_inputs(self.model, data.example_len(), device)
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

#[cfg(test)]
mod tests {
    use burn::module::AutodiffModule;
    use murmur_core::api::DatasetSource;

    use super::*;
    use crate::backend::Cpu;

    /// Rows of 3 features (class 0 when the first is largest, 1 otherwise), as CSV files.
    fn features(dir: &std::path::Path) {
        for (name, rows) in [("mnist_train.csv", 200), ("mnist_test.csv", 60)] {
            let mut text = String::from("label,a,b,c\n");
            for k in 0..rows {
                let a = (k * 37) % 256;
                let b = (k * 91) % 256;
                text += &format!("{},{a},{b},{}\n", usize::from(a <= b), (k * 13) % 256);
            }
            std::fs::write(dir.join(name), text).unwrap();
        }
    }

    #[test]
    fn the_built_in_models_read_examples_of_the_declared_shape() {
        let dir = tempfile::tempdir().unwrap();
        features(dir.path());
        let spec = DatasetSpec {
            source: DatasetSource::Csv,
            path: Some(dir.path().display().to_string()),
            shape: Some(vec![3]),
        };
        let task = ImageClassification {
            model: ModelKind::Mlp,
        };
        let split = task.load(&spec).unwrap();
        assert_eq!(
            (split.train.shape.clone(), split.train.len()),
            (vec![3], 200)
        );
        let device = Default::default();
        let model = task.init::<Cpu>(&split.train, &device);
        let all: Vec<usize> = (0..split.test.len()).collect();
        let score = task.score::<Cpu>(&model.valid(), &split.test, &all);
        assert!(score.loss.is_finite() && score.metric <= all.len() as f64);
        // GN-LeNet reads 28x28 images only, and says so naming the field.
        let err = ImageClassification {
            model: ModelKind::GnLenet,
        }
        .load(&spec)
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("training.dataset.shape: gnLenet reads 28x28 images, not [3]"),
            "{err}"
        );
    }
}
