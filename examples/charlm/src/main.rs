//! A trainer of a task of its own, as a user of murmur writes one: a small transformer language
//! model reading text a byte at a time, judged by its perplexity on text it never trained on.
//! The data is real prose that Debian ships in every installation (`base-files`: the licence
//! texts in `/usr/share/common-licenses`), read with murmur's text reader; its last tenth is
//! the test set.

use burn::nn::attention::generate_autoregressive_mask;
use burn::nn::transformer::{
    TransformerEncoder, TransformerEncoderConfig, TransformerEncoderInput,
};
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use murmur_core::api::DatasetSpec;
use murmur_trainer::data::DataError;
use murmur_trainer::data::text::{self, TokenWindows, VOCABULARY};
use murmur_trainer::task::{Inner, Metric, Score, Split, Task, cross_entropy};

/// Bytes the model reads before each prediction.
const CONTEXT: usize = 64;
const WIDTH: usize = 64;

/// Byte and position embeddings, two pre-norm transformer layers with causal attention (4
/// heads), and a linear read-out to the next byte's logits.
#[derive(Module, Debug)]
struct CharTransformer<B: Backend> {
    bytes: Embedding<B>,
    positions: Embedding<B>,
    layers: TransformerEncoder<B>,
    output: Linear<B>,
}

impl<B: Backend> CharTransformer<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            bytes: EmbeddingConfig::new(VOCABULARY, WIDTH).init(device),
            positions: EmbeddingConfig::new(CONTEXT, WIDTH).init(device),
            layers: TransformerEncoderConfig::new(WIDTH, 4 * WIDTH, 4, 2)
                .with_dropout(0.0)
                .with_norm_first(true)
                .init(device),
            output: LinearConfig::new(WIDTH, VOCABULARY).init(device),
        }
    }

    /// `[n, t]` bytes to `[n, t, 256]` logits, each position seeing only those before it.
    fn forward(&self, inputs: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let [n, t] = inputs.dims();
        let device = inputs.device();
        let positions = Tensor::<B, 1, Int>::arange(0..t as i64, &device)
            .reshape([1, t])
            .repeat_dim(0, n);
        let x = self.bytes.forward(inputs) + self.positions.forward(positions);
        let mask = generate_autoregressive_mask::<B>(n, t, &device);
        let x = self
            .layers
            .forward(TransformerEncoderInput::new(x).mask_attn(mask));
        self.output.forward(x)
    }
}

/// The windows `batch` of `data` as inputs `[n, CONTEXT]` and next bytes `[n * CONTEXT]`.
fn tensors<B: Backend>(
    data: &TokenWindows,
    batch: &[usize],
    device: &B::Device,
) -> (Tensor<B, 2, Int>, Tensor<B, 1, Int>) {
    let context = data.context();
    let (mut inputs, mut targets) = (Vec::new(), Vec::new());
    for &i in batch {
        let w = data.window(i);
        inputs.extend(w[..context].iter().map(|&b| i64::from(b)));
        targets.extend(w[1..].iter().map(|&b| i64::from(b)));
    }
    (
        Tensor::from_data(TensorData::new(inputs, [batch.len(), context]), device),
        Tensor::from_data(TensorData::new(targets, [batch.len() * context]), device),
    )
}

/// The mean cross-entropy of every next byte in `batch`, in nats.
fn next_byte_loss<B: Backend>(
    model: &CharTransformer<B>,
    data: &TokenWindows,
    batch: &[usize],
    device: &B::Device,
) -> Tensor<B, 1> {
    let (x, y) = tensors(data, batch, device);
    let logits = model
        .forward(x)
        .reshape([batch.len() * data.context(), VOCABULARY]);
    cross_entropy(logits, y)
}

struct CharLm;

impl Task for CharLm {
    type Data = TokenWindows;
    type Model<B: AutodiffBackend> = CharTransformer<B>;

    fn metric(&self) -> Metric {
        Metric::PERPLEXITY
    }

    fn load(&self, spec: &DatasetSpec) -> Result<Split<TokenWindows>, DataError> {
        text::load(spec, CONTEXT)
    }

    fn init<B: AutodiffBackend>(&self, _: &TokenWindows, device: &B::Device) -> CharTransformer<B> {
        CharTransformer::new(device)
    }

    fn loss<B: AutodiffBackend>(
        &self,
        model: &CharTransformer<B>,
        data: &TokenWindows,
        batch: &[usize],
        device: &B::Device,
    ) -> Tensor<B, 1> {
        next_byte_loss(model, data, batch, device)
    }

    fn score<B: AutodiffBackend>(
        &self,
        model: &Inner<Self, B>,
        data: &TokenWindows,
        batch: &[usize],
    ) -> Score {
        let device = model.devices().into_iter().next().unwrap_or_default();
        let loss = next_byte_loss(model, data, batch, &device);
        Score {
            // Every window has as many next bytes, so the mean over windows is the mean per byte.
            loss: loss.into_scalar().elem::<f64>() * batch.len() as f64,
            metric: 0.0,
        }
    }

    fn evaluation_batch(&self) -> usize {
        64
    }
}

fn main() -> std::process::ExitCode {
    murmur_trainer::run_task(CharLm)
}
