//! A task of one's own: a small network learning which quadrants of the plane x·y is positive
//! in, trained by murmur like a built-in model (`murmur run job.yaml --trainer` this binary).

use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use murmur_core::api::DatasetSpec;
use murmur_trainer::data::DataError;
use murmur_trainer::task::{
    Data, Inner, Metric, Score, Split, Task, classification_score, cross_entropy,
};

/// Points in the plane; a point's class is whether x·y > 0.
struct Points(Vec<[f32; 2]>);

impl Points {
    /// `n` points spread over [-1, 1]², the same for the same `seed`.
    fn spread(n: usize, seed: u64) -> Self {
        let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        Points((0..n).map(|_| [next(), next()]).collect())
    }
}

impl Data for Points {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn classes(&self) -> usize {
        2
    }
    fn label(&self, i: usize) -> Option<usize> {
        Some(usize::from(self.0[i][0] * self.0[i][1] > 0.0))
    }
}

#[derive(Module, Debug)]
struct Net<B: Backend> {
    hidden: Linear<B>,
    output: Linear<B>,
}

impl<B: Backend> Net<B> {
    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let h = burn::tensor::activation::relu(self.hidden.forward(x));
        self.output.forward(h)
    }
}

/// The points `batch` of `data` and their classes, as tensors on `device`.
fn tensors<B: Backend>(
    data: &Points,
    batch: &[usize],
    device: &B::Device,
) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
    let x: Vec<f32> = batch.iter().flat_map(|&i| data.0[i]).collect();
    let y: Vec<i64> = batch
        .iter()
        .map(|&i| data.label(i).unwrap_or(0) as i64)
        .collect();
    (
        Tensor::from_data(TensorData::new(x, [batch.len(), 2]), device),
        Tensor::from_data(TensorData::new(y, [batch.len()]), device),
    )
}

struct Quadrants;

impl Task for Quadrants {
    type Data = Points;
    type Model<B: AutodiffBackend> = Net<B>;

    fn metric(&self) -> Metric {
        Metric::ACCURACY
    }

    fn load(&self, _: &DatasetSpec) -> Result<Split<Points>, DataError> {
        Ok(Split {
            train: Points::spread(4000, 1),
            proxy: Points::spread(50, 2),
            test: Points::spread(1000, 3),
        })
    }

    fn init<B: AutodiffBackend>(&self, data: &Points, device: &B::Device) -> Net<B> {
        Net {
            hidden: LinearConfig::new(2, 32).init(device),
            output: LinearConfig::new(32, data.classes()).init(device),
        }
    }

    fn loss<B: AutodiffBackend>(
        &self,
        model: &Net<B>,
        data: &Points,
        batch: &[usize],
        device: &B::Device,
    ) -> Tensor<B, 1> {
        let (x, y) = tensors(data, batch, device);
        cross_entropy(model.forward(x), y)
    }

    fn score<B: AutodiffBackend>(
        &self,
        model: &Inner<Self, B>,
        data: &Points,
        batch: &[usize],
    ) -> Score {
        let device = model.devices().into_iter().next().unwrap_or_default();
        let (x, y) = tensors::<B::InnerBackend>(data, batch, &device);
        classification_score(model.forward(x), y)
    }
}

fn main() -> std::process::ExitCode {
    murmur_trainer::run_task(Quadrants)
}
