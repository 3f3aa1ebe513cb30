//! The models (burn), and their parameters as one flat f32 buffer for averaging and transfer.

mod cpu;
mod flat;

use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{GroupNorm, GroupNormConfig, Linear, LinearConfig, PaddingConfig2d, Relu};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use murmur_core::api::ModelKind;

pub use flat::{
    FlatError, Layout, ParamSlot, export, export_gradients, export_into, gradients_from_flat,
    import, layout, with_slot_ids,
};

use crate::data::{CLASSES, IMAGE_PIXELS, IMAGE_SIDE};

/// 784 -> 10.
#[derive(Module, Debug)]
pub struct LogisticRegression<B: Backend> {
    linear: Linear<B>,
}

/// 784 -> 256 -> 10 with ReLU.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    hidden: Linear<B>,
    output: Linear<B>,
    activation: Relu,
}

/// One GN-LeNet block: conv 5x5 -> GroupNorm(2 groups) -> ReLU -> 2x2 max-pool. GroupNorm rather
/// than BatchNorm: batch statistics are meaningless when a member sees one or two classes.
/// (The forward pass pools before the ReLU: the same values and gradients, as ReLU is monotone,
/// on a quarter of the elements.)
#[derive(Module, Debug)]
pub struct ConvBlock<B: Backend> {
    conv: Conv2d<B>,
    norm: GroupNorm<B>,
    pool: MaxPool2d,
    activation: Relu,
}

/// Three conv blocks (32, 32, 64 channels) and a linear layer to 10 classes.
#[derive(Module, Debug)]
pub struct GnLenet<B: Backend> {
    blocks: Vec<ConvBlock<B>>,
    output: Linear<B>,
}

// One model per member, moved rather than copied: the variants' size difference does not matter,
// and burn's Module derive does not see through a Box.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum Model<B: Backend> {
    LogisticRegression(LogisticRegression<B>),
    Mlp(Mlp<B>),
    GnLenet(GnLenet<B>),
}

/// The blocks' 5x5 convolutions keep the image size.
const KERNEL: usize = 5;
const PADDING: usize = 2;

impl<B: Backend> ConvBlock<B> {
    fn new(channels_in: usize, channels_out: usize, device: &B::Device) -> Self {
        Self {
            conv: Conv2dConfig::new([channels_in, channels_out], [KERNEL, KERNEL])
                .with_padding(PaddingConfig2d::Explicit(
                    PADDING, PADDING, PADDING, PADDING,
                ))
                .init(device),
            norm: GroupNormConfig::new(2, channels_out).init(device),
            pool: MaxPool2dConfig::new([2, 2]).with_strides([2, 2]).init(),
            activation: Relu::new(),
        }
    }

    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        // `self.pool` is a 2x2, stride-2 max-pool; `cpu::max_pool_2x2` computes the same.
        let y = cpu::conv2d(x, self.conv.weight.val(), PADDING);
        self.activation
            .forward(cpu::max_pool_2x2(self.bias_and_norm(y)))
    }

    /// The conv bias, then GroupNorm: one operation on the CPU backend, burn's operations
    /// elsewhere.
    fn bias_and_norm(&self, y: Tensor<B, 4>) -> Tensor<B, 4> {
        let (norm, bias) = (&self.norm, &self.conv.bias);
        let burns = |y| group_norm(norm, add_row_bias(bias.as_ref(), y));
        match (bias, &norm.gamma, &norm.beta) {
            (Some(bias), Some(gamma), Some(beta)) => {
                let params = [bias.val(), gamma.val(), beta.val()];
                cpu::bias_group_norm((y, params), norm.num_groups, norm.epsilon, |(y, _)| {
                    burns(y)
                })
            }
            _ => burns(y),
        }
    }
}

/// The conv bias (of `Conv2d::forward`) added as one value per (sample, channel) row of
/// `[N·C, H·W]`, whose gradient sums contiguous rows (burn's own bias gradient swaps the batch
/// and channel axes first, a strided copy that took 8% of a GN-LeNet step on flex).
fn add_row_bias<B: Backend>(bias: Option<&Param<Tensor<B, 1>>>, y: Tensor<B, 4>) -> Tensor<B, 4> {
    let Some(bias) = bias else {
        return y;
    };
    let [batch, channels, height, width] = y.dims();
    y.reshape([batch * channels, height * width])
        .add(per_row(bias.val(), batch))
        .reshape([batch, channels, height, width])
}

/// A per-channel parameter `[C]` as a column `[N·C, 1]`: one value per (sample, channel) row.
fn per_row<B: Backend>(p: Tensor<B, 1>, batch: usize) -> Tensor<B, 2> {
    let [channels] = p.dims();
    p.unsqueeze_dim::<2>(0)
        .repeat_dim(0, batch)
        .reshape([batch * channels, 1])
}

/// burn's GroupNorm arithmetic, with the scale and shift laid out for a fast kernel. burn
/// broadcasts gamma and beta as `[1, C, 1, 1]` over `[N, C, H, W]`, a pattern the flex backend
/// walks element by element (a quarter of a GN-LeNet step, forward and backward); here they are
/// repeated to one value per (sample, channel) row of `[N·C, H·W]`, a per-row broadcast that flex
/// vectorises. The same operations on the same values: results are bit-identical to
/// `GroupNorm::forward`, and the parameters are the module's own (same names, same records).
fn group_norm<B: Backend>(norm: &GroupNorm<B>, x: Tensor<B, 4>) -> Tensor<B, 4> {
    let [batch, channels, height, width] = x.dims();
    let hidden = channels / norm.num_groups * height * width;
    let x = x.reshape([batch, norm.num_groups, hidden]);
    let mean = x.clone().sum_dim(2) / hidden as f64;
    let x = x.sub(mean);
    let var = x.clone().square().sum_dim(2) / hidden as f64;
    let x = x
        .div(var.add_scalar(norm.epsilon).sqrt())
        .reshape([batch * channels, height * width]);
    let x = match (&norm.gamma, &norm.beta) {
        (Some(gamma), Some(beta)) => x
            .mul(per_row(gamma.val(), batch))
            .add(per_row(beta.val(), batch)),
        _ => x,
    };
    x.reshape([batch, channels, height, width])
}

/// `Linear::forward` for a batch `[N, d_in]`: `x · W + b` with the product from `cpu::matmul`
/// (one thread on the CPU backend, where flex would split the MLP's over its pool and lose).
/// Same parameters, same arithmetic.
fn dense<B: Backend>(layer: &Linear<B>, x: Tensor<B, 2>) -> Tensor<B, 2> {
    let y = cpu::matmul(x, layer.weight.val());
    match &layer.bias {
        Some(bias) => y.add(bias.val().unsqueeze_dim(0)),
        None => y,
    }
}

/// Draws every lazily initialised parameter.
struct Materialize;

impl<B: Backend> ModuleVisitor<B> for Materialize {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let _ = param.val();
    }
}

impl<B: Backend> Model<B> {
    /// A freshly initialised model (burn's default initialisers, seeded through the backend).
    /// burn initialises parameters lazily, on first use, from one process-wide generator; the
    /// values are drawn here, in module order, so they do not depend on which thread touches a
    /// parameter first.
    pub fn new(kind: ModelKind, device: &B::Device) -> Self {
        Self::for_inputs(kind, IMAGE_PIXELS, device)
    }

    /// [`new`](Self::new), for examples of `inputs` values (MNIST: 784). GN-LeNet reads 28×28
    /// images whatever `inputs` says: the spec's validation keeps other shapes from it.
    pub fn for_inputs(kind: ModelKind, inputs: usize, device: &B::Device) -> Self {
        let model = Self::declare(kind, inputs, device);
        model.visit(&mut Materialize);
        model
    }

    fn declare(kind: ModelKind, inputs: usize, device: &B::Device) -> Self {
        match kind {
            ModelKind::LogisticRegression => Model::LogisticRegression(LogisticRegression {
                linear: LinearConfig::new(inputs, CLASSES).init(device),
            }),
            ModelKind::Mlp => Model::Mlp(Mlp {
                hidden: LinearConfig::new(inputs, 256).init(device),
                output: LinearConfig::new(256, CLASSES).init(device),
                activation: Relu::new(),
            }),
            ModelKind::GnLenet => Model::GnLenet(GnLenet {
                blocks: vec![
                    ConvBlock::new(1, 32, device),
                    ConvBlock::new(32, 32, device),
                    ConvBlock::new(32, 64, device),
                ],
                // 28 -> 14 -> 7 -> 3 after three 2x2 pools.
                output: LinearConfig::new(64 * 3 * 3, CLASSES).init(device),
            }),
        }
    }

    /// Logits for a batch of flattened examples, `[batch, 784]` (or the model's inputs) ->
    /// `[batch, 10]`.
    pub fn forward(&self, images: Tensor<B, 2>) -> Tensor<B, 2> {
        match self {
            Model::LogisticRegression(m) => dense(&m.linear, images),
            Model::Mlp(m) => dense(&m.output, m.activation.forward(dense(&m.hidden, images))),
            Model::GnLenet(m) => {
                let [batch, _] = images.dims();
                let mut x = images.reshape([batch, 1, IMAGE_SIDE, IMAGE_SIDE]);
                for block in &m.blocks {
                    x = block.forward(x);
                }
                dense(&m.output, x.flatten(1, 3))
            }
        }
    }
}

#[cfg(test)]
mod tests;
