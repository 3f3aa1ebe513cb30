//! What a member trains: a [`Task`] (a burn model, its loss and a named quality metric) on
//! [`Data`] (examples by index, with their classes where there are any). Everything else is
//! murmur's and works for any task: the algorithms and compression (on the model's parameters as
//! one flat buffer), join reports and elastic repair (from the classes), state transfer,
//! checkpoints, status, metrics and the dashboard.
//!
//! The built-in models are one task, [`images::ImageClassification`]. A model of your own is
//! another: implement [`Task`] (and [`Data`] for its examples), and call [`crate::run_task`] from
//! your `main`. Build it into an image on the trainer's runtime base, name the image in
//! `spec.trainer.image`, or run it locally with `murmur run job.yaml --trainer <your binary>`.
//! This whole program (`trainer/examples/own_task.rs`) is such a trainer:
//!
//! ```no_run
#![doc = include_str!("../../examples/own_task.rs")]
//! ```

pub mod images;

use burn::module::AutodiffModule;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Int, Tensor};
use murmur_core::api::DatasetSpec;

use crate::data::DataError;

/// Examples by index. What an example is belongs to the task; murmur only counts them, deals
/// them out to members and, for class-based partitions and data-aware topologies, reads their
/// classes.
pub trait Data: Send + Sync + 'static {
    /// How many examples there are.
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many classes a classification task has (0: none, as for next-token prediction).
    fn classes(&self) -> usize {
        0
    }

    /// Example `i`'s class, below [`classes`](Self::classes); None when there are none.
    fn label(&self, i: usize) -> Option<usize> {
        let _ = i;
        None
    }

    /// Examples per class among `indices` (empty when there are no classes): a member's join
    /// report, which D-Cliques are built from.
    fn histogram(&self, indices: &[usize]) -> Vec<u64> {
        let mut h = vec![0u64; self.classes()];
        for &i in indices {
            if let Some(slot) = self.label(i).and_then(|c| h.get_mut(c)) {
                *slot += 1;
            }
        }
        h
    }
}

/// Training data, the proxy batch and the test set: three disjoint sets of examples. The proxy
/// batch is what every member scores the same way for its proxy vector (proxy clumps); it may be
/// empty where [`Task::mean_prediction`] is not implemented.
#[derive(Clone, Debug, PartialEq)]
pub struct Split<D> {
    pub train: D,
    pub proxy: D,
    pub test: D,
}

/// The quality a task is judged by, as the status and the dashboard name it.
#[derive(Clone, Copy, Debug)]
pub struct Metric {
    /// Its name ("accuracy", "perplexity").
    pub name: &'static str,
    /// Whether more is better.
    pub higher_is_better: bool,
    /// From the test set's mean loss and mean per-example metric to the figure reported.
    pub finish: fn(mean_loss: f64, mean_metric: f64) -> f64,
}

impl Metric {
    /// The share of examples classified right: [`Score::metric`] counts them.
    pub const ACCURACY: Metric = Metric {
        name: "accuracy",
        higher_is_better: true,
        finish: |_, mean| mean,
    };

    /// e to the mean loss (in nats per example): next-token tasks. [`Score::metric`] is unused.
    pub const PERPLEXITY: Metric = Metric {
        name: "perplexity",
        higher_is_better: false,
        finish: |loss, _| loss.exp(),
    };
}

/// A batch's scores, summed over its examples.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Score {
    /// The loss, summed (mean loss × examples).
    pub loss: f64,
    /// The per-example metric, summed (for accuracy: the examples classified right).
    pub metric: f64,
}

/// A classifier's mean loss: the cross-entropy of `logits` (`[n, classes]`) against the examples'
/// `classes` (`[n]`). What [`Task::loss`] returns for a classification task.
pub fn cross_entropy<B: Backend>(logits: Tensor<B, 2>, classes: Tensor<B, 1, Int>) -> Tensor<B, 1> {
    CrossEntropyLossConfig::new()
        .init(&logits.device())
        .forward(logits, classes)
}

/// A classifier's [`Score`] on a batch: the summed cross-entropy and the examples whose largest
/// logit is their class. What [`Task::score`] returns for a classification task judged by
/// [`Metric::ACCURACY`].
pub fn classification_score<B: Backend>(logits: Tensor<B, 2>, classes: Tensor<B, 1, Int>) -> Score {
    let n = classes.dims()[0] as f64;
    let right = logits
        .clone()
        .argmax(1)
        .flatten::<1>(0, 1)
        .equal(classes.clone())
        .int()
        .sum();
    Score {
        loss: cross_entropy(logits, classes).into_scalar().elem::<f64>() * n,
        metric: right.into_scalar().elem::<f64>(),
    }
}

/// A task's model for evaluation: the model without autodiff (`model.valid()`).
pub type Inner<T, B> = <<T as Task>::Model<B> as AutodiffModule<B>>::InnerModule;

/// A model and what it learns. Implement it for your burn model; murmur does the rest.
pub trait Task: Send + Sync + 'static {
    /// The examples this task learns from.
    type Data: Data;
    /// The burn model, on any autodiff backend.
    type Model<B: AutodiffBackend>: AutodiffModule<B> + Send + 'static;

    /// What the task is judged by.
    fn metric(&self) -> Metric;

    /// The job's `training.dataset`, read: training data, the proxy batch and the test set.
    /// Bad data is an error naming the file and what is wrong with it.
    fn load(&self, spec: &DatasetSpec) -> Result<Split<Self::Data>, DataError>;

    /// A fresh model for the training data `data` (its classes, its vocabulary). Every member
    /// draws it from the same seeded generator, so all start alike.
    fn init<B: AutodiffBackend>(&self, data: &Self::Data, device: &B::Device) -> Self::Model<B>;

    /// The mean loss of `model` on the examples `batch` of `data`: a scalar to backpropagate.
    fn loss<B: AutodiffBackend>(
        &self,
        model: &Self::Model<B>,
        data: &Self::Data,
        batch: &[usize],
        device: &B::Device,
    ) -> Tensor<B, 1>;

    /// The summed loss and metric of `model` (no autodiff) on the examples `batch` of `data`.
    fn score<B: AutodiffBackend>(
        &self,
        model: &Inner<Self, B>,
        data: &Self::Data,
        batch: &[usize],
    ) -> Score;

    /// Examples scored at once when evaluating (bounds the memory of a forward pass).
    fn evaluation_batch(&self) -> usize {
        500
    }

    /// The mean predicted class distribution on the examples `batch`: a proxy vector, which
    /// tells what a member has learnt without revealing a label (proxy clumps). None where the
    /// task has no classes; the topology then uses the class histogram alone.
    fn mean_prediction<B: AutodiffBackend>(
        &self,
        model: &Inner<Self, B>,
        data: &Self::Data,
        batch: &[usize],
    ) -> Option<Vec<f32>> {
        let _ = (model, data, batch);
        None
    }
}
