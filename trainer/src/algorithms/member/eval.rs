//! Forward passes that train nothing: test evaluation, proxy vectors and neighbours' skews.

use burn::module::{AutodiffModule, Module};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor, TensorData};

use super::Member;
use crate::data::{Dataset, IMAGE_PIXELS};
use crate::model::{self, Model};

impl<B: AutodiffBackend> Member<B> {
    /// Test accuracy and mean cross-entropy of this member's model.
    pub fn evaluate(&self, test: &Dataset) -> (f64, f64) {
        let model = self.model().valid();
        let device = model.devices().into_iter().next().unwrap_or_default();
        let (mut correct, mut loss_sum) = (0usize, 0f64);
        for start in (0..test.len()).step_by(500) {
            let end = (start + 500).min(test.len());
            let n = end - start;
            let x = Tensor::<B::InnerBackend, 2>::from_data(
                TensorData::new(
                    test.pixels[start * IMAGE_PIXELS..end * IMAGE_PIXELS].to_vec(),
                    [n, IMAGE_PIXELS],
                ),
                &device,
            );
            let labels: Vec<i64> = test.labels[start..end]
                .iter()
                .map(|&l| i64::from(l))
                .collect();
            let y = Tensor::<B::InnerBackend, 1, Int>::from_data(
                TensorData::new(labels.clone(), [n]),
                &device,
            );
            let logits = model.forward(x);
            let loss = CrossEntropyLossConfig::new()
                .init(&device)
                .forward(logits.clone(), y);
            loss_sum += loss.into_data().iter::<f64>().next().unwrap_or(f64::NAN) * n as f64;
            let predicted: Vec<i64> = logits.argmax(1).into_data().iter::<i64>().collect();
            correct += predicted
                .iter()
                .zip(&labels)
                .filter(|(p, l)| p == l)
                .count();
        }
        let n = test.len().max(1) as f64;
        (correct as f64 / n, loss_sum / n)
    }

    /// Mean softmax output on the shared proxy batch: what this member's model has learnt to
    /// predict, without revealing a label (the proxy-clumps join report).
    pub fn proxy_vector(&self, proxy: &Dataset) -> Vec<f32> {
        let model = self.model().valid();
        let device = model.devices().into_iter().next().unwrap_or_default();
        let n = proxy.len().max(1);
        let x = Tensor::<B::InnerBackend, 2>::from_data(
            TensorData::new(proxy.pixels.clone(), [proxy.len(), IMAGE_PIXELS]),
            &device,
        );
        let probs = burn::tensor::activation::softmax(model.forward(x), 1).sum_dim(0) / n as f32;
        probs.into_data().iter::<f32>().collect()
    }

    /// How differently each of `theirs` (flat models) scores from `model` on this step's
    /// mini-batch: |L_theirs − L_mine| in nats — after SkewScout's accuracy loss of a neighbour's
    /// model on local data, which grows with label skew long before the parameters look far
    /// apart. NaN when it cannot be scored.
    pub(super) fn skews(&self, model: &Model<B>, theirs: &[&[f32]]) -> Vec<f64> {
        let Some((x, y)) = &self.last_batch else {
            return vec![f64::NAN; theirs.len()];
        };
        let mine = model.valid();
        let loss = |m: &Model<B::InnerBackend>| -> f64 {
            let device = x.device();
            CrossEntropyLossConfig::new()
                .init(&device)
                .forward(m.forward(x.clone()), y.clone())
                .into_data()
                .iter::<f64>()
                .next()
                .unwrap_or(f64::NAN)
        };
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
