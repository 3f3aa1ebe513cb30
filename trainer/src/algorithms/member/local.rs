//! The local half of a step: mini-batches, loss and gradients, and the step with no
//! communication.

use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use rand::seq::SliceRandom;

use super::Member;
use crate::task::Task;

impl<B: AutodiffBackend, T: Task> Member<B, T> {
    /// The next mini-batch (examples of the data), reshuffling the shard at every epoch.
    fn next_batch(&mut self) -> Vec<usize> {
        let n = self.config.batch_size.min(self.shard.len()).max(1);
        let mut batch = Vec::with_capacity(n);
        for _ in 0..n {
            if self.cursor >= self.order.len() {
                self.order.shuffle(&mut self.rng);
                self.cursor = 0;
            }
            batch.push(self.shard[self.order[self.cursor]]);
            self.cursor += 1;
        }
        batch
    }

    /// Loss and gradients of `model` on the next mini-batch.
    pub(super) fn gradients(&mut self, model: &T::Model<B>) -> (f64, GradientsParams) {
        let batch = self.next_batch();
        let loss = self.task.loss(model, &self.data, &batch, &self.device);
        if self.cadence.is_some() {
            self.last_batch = Some(batch);
        }
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
