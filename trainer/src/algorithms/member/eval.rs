//! Forward passes that train nothing: test evaluation, proxy vectors and neighbours' skews.

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;

use super::Member;
use crate::model;
use crate::task::{Data, Inner, Score, Task};

impl<B: AutodiffBackend, T: Task> Member<B, T> {
    /// This member's model on the whole of `test`: the task's metric and the mean loss. With
    /// outer steps that is the anchor, as DiLoCo evaluates its outer model: between two rounds
    /// the parameters are part way through local steps on this member's data alone.
    pub fn evaluate(&self, test: &T::Data) -> (f64, f64) {
        let model = match &self.outer {
            Some(outer) => model::import(self.model().clone(), &outer.anchor, &self.layout)
                .expect("the anchor has the model's layout")
                .valid(),
            None => self.model().valid(),
        };
        let all: Vec<usize> = (0..test.len()).collect();
        let mut total = Score::default();
        for batch in all.chunks(self.task.evaluation_batch().max(1)) {
            let s = self.task.score::<B>(&model, test, batch);
            total.loss += s.loss;
            total.metric += s.metric;
        }
        let n = test.len().max(1) as f64;
        let mean_loss = total.loss / n;
        (
            (self.task.metric().finish)(mean_loss, total.metric / n),
            mean_loss,
        )
    }

    /// The task's mean prediction on the shared proxy batch: what this member's model has learnt
    /// to predict, without revealing a label (the proxy-clumps join report). None where the task
    /// makes none.
    pub fn proxy_vector(&self, proxy: &T::Data) -> Option<Vec<f32>> {
        let all: Vec<usize> = (0..proxy.len()).collect();
        self.task
            .mean_prediction::<B>(&self.model().valid(), proxy, &all)
    }

    /// How differently each of `theirs` (flat models) scores from `model` on this step's
    /// mini-batch: |L_theirs − L_mine| in nats — after SkewScout's accuracy loss of a neighbour's
    /// model on local data, which grows with label skew long before the parameters look far
    /// apart. NaN when it cannot be scored.
    pub(super) fn skews(&self, model: &T::Model<B>, theirs: &[&[f32]]) -> Vec<f64> {
        let Some(batch) = &self.last_batch else {
            return vec![f64::NAN; theirs.len()];
        };
        let mine = model.valid();
        let n = batch.len().max(1) as f64;
        let loss = |m: &Inner<T, B>| self.task.score::<B>(m, &self.data, batch).loss / n;
        let base = loss(&mine);
        theirs
            .iter()
            .map(
                |values| match model::import(mine.clone(), values, &self.layout) {
                    Ok(neighbour) => (loss(&neighbour) - base).abs(),
                    Err(_) => f64::NAN,
                },
            )
            .collect()
    }
}
