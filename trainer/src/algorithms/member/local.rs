//! The local half of a step: mini-batches, loss and gradients, and the step with no
//! communication.

use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor, TensorData};
use rand::seq::SliceRandom;

use super::Member;
use crate::data::IMAGE_PIXELS;
use crate::model::Model;

impl<B: AutodiffBackend> Member<B> {
    /// The next mini-batch, reshuffling the shard at every epoch.
    fn next_batch(&mut self) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
        let n = self.config.batch_size.min(self.shard.len()).max(1);
        let mut pixels = Vec::with_capacity(n * IMAGE_PIXELS);
        let mut labels = Vec::with_capacity(n);
        for _ in 0..n {
            if self.cursor >= self.order.len() {
                self.order.shuffle(&mut self.rng);
                self.cursor = 0;
            }
            let i = self.order[self.cursor];
            self.cursor += 1;
            pixels.extend_from_slice(self.shard.image(i));
            labels.push(i64::from(self.shard.labels[i]));
        }
        (
            Tensor::from_data(TensorData::new(pixels, [n, IMAGE_PIXELS]), &self.device),
            Tensor::from_data(TensorData::new(labels, [n]), &self.device),
        )
    }

    /// Loss and gradients of `model` on the next mini-batch.
    pub(super) fn gradients(&mut self, model: &Model<B>) -> (f64, GradientsParams) {
        let (x, y) = self.next_batch();
        if self.cadence.is_some() {
            self.last_batch = Some((x.clone().inner(), y.clone().inner()));
        }
        let loss = CrossEntropyLossConfig::new()
            .init(&self.device)
            .forward(model.forward(x), y);
        let value: f64 = loss
            .clone()
            .into_data()
            .iter::<f64>()
            .next()
            .unwrap_or(f64::NAN);
        (value, GradientsParams::from_grads(loss.backward(), model))
    }

    /// A step on local data only, with no communication (warm-up). Returns the loss.
    pub fn local_step(&mut self) -> f64 {
        let model = self.model.take().expect("model present");
        let (loss, grads) = self.gradients(&model);
        self.model = Some(self.optim.step(self.config.learning_rate, model, grads));
        loss
    }
}
