//! The convolution and the max-pool as burn operations on flex, with and without autodiff. The
//! convolution keeps its input and weight for the backward pass (shared buffers, no copies) and
//! the pool its argmax.

use std::sync::Arc;

use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};

use super::group_norm::{self, NormShape};
use super::kernels::{self, ConvShape};
use crate::backend::Cpu;

type Flex = burn::backend::Flex;

/// The flex tensor's values, contiguous, in row-major order (callers check that it holds f32).
fn values(t: &FlexTensor) -> std::borrow::Cow<'_, [f32]> {
    match t.as_slice::<f32>() {
        Some(s) => s.into(),
        None => t
            .to_contiguous()
            .as_slice::<f32>()
            .map(|s| s.to_vec())
            .unwrap_or_default()
            .into(),
    }
}

fn tensor(values: Vec<f32>, shape: &[usize]) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(values, shape.to_vec()))
}

fn primitive<const D: usize>(t: Tensor<Flex, D>) -> FlexTensor {
    t.into_primitive().tensor()
}

/// What the convolution's backward pass needs: its input and weight (shared, not copied).
#[derive(Clone, Debug)]
pub struct ConvSaved {
    shape: ConvShape,
    x: FlexTensor,
    weight: FlexTensor,
}

/// `x` `[N, C_in, H, W]` convolved with `weight` `[C_out, C_in, K, K]` as `shape` describes
/// them, stride 1, no bias.
pub fn conv_forward(
    x: FlexTensor,
    weight: FlexTensor,
    shape: ConvShape,
) -> (FlexTensor, ConvSaved) {
    let channels_out = weight.layout().shape()[0];
    let y = kernels::conv_forward(&values(&x), &values(&weight), &shape);
    let y = tensor(
        y,
        &[
            shape.batch,
            channels_out,
            shape.out_height(),
            shape.out_width(),
        ],
    );
    (y, ConvSaved { shape, x, weight })
}

/// The gradients of the input and of the weight, each only when asked for.
pub fn conv_backward(
    grad: &FlexTensor,
    saved: &ConvSaved,
    want_x: bool,
    want_weight: bool,
) -> (Option<FlexTensor>, Option<FlexTensor>) {
    let s = &saved.shape;
    let (x, weight) = kernels::conv_backward(
        &values(grad),
        &values(&saved.x),
        &values(&saved.weight),
        s,
        want_x,
        want_weight,
    );
    let weight_shape = saved.weight.layout().shape().to_vec();
    (
        x.map(|x| tensor(x, &[s.batch, s.channels_in, s.height, s.width])),
        weight.map(|w| tensor(w, &weight_shape)),
    )
}

/// What the pool's backward pass needs: where each output came from, and the input's shape.
#[derive(Clone, Debug)]
pub struct PoolSaved {
    from: Arc<Vec<u32>>,
    shape: [usize; 4],
}

/// 2x2 max-pool, stride 2, of `[N, C, H, W]`.
pub fn pool_forward(x: &FlexTensor) -> (FlexTensor, PoolSaved) {
    let shape: [usize; 4] = x.layout().shape().dims();
    let [batch, channels, height, width] = shape;
    let (y, from) = kernels::max_pool_2x2(&values(x), height, width);
    let y = tensor(y, &[batch, channels, height / 2, width / 2]);
    let from = Arc::new(from);
    (y, PoolSaved { from, shape })
}

pub fn pool_backward(grad: &FlexTensor, saved: &PoolSaved) -> FlexTensor {
    let [_, _, height, width] = saved.shape;
    tensor(
        kernels::max_pool_2x2_backward(&values(grad), &saved.from, height, width),
        &saved.shape,
    )
}

#[derive(Debug)]
struct ConvOp;

impl Backward<Flex, 2> for ConvOp {
    type State = ConvSaved;

    fn backward(self, ops: Ops<ConvSaved, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let parents @ [x, weight] = ops.parents.map(|node| node.map(|node| node.id));
        let grad = grads.consume::<Flex>(&ops.node);
        let (x, weight) = conv_backward(&grad, &ops.state, x.is_some(), weight.is_some());
        register(grads, parents, [x, weight]);
    }
}

#[derive(Debug)]
struct PoolOp;

impl Backward<Flex, 1> for PoolOp {
    type State = PoolSaved;

    fn backward(self, ops: Ops<PoolSaved, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let parents @ [x] = ops.parents.map(|node| node.map(|node| node.id));
        let grad = grads.consume::<Flex>(&ops.node);
        register(
            grads,
            parents,
            [x.map(|_| pool_backward(&grad, &ops.state))],
        );
    }
}

/// Each computed gradient to its parent, where the parent is tracked (its id is `Some`).
fn register<const N: usize>(
    grads: &mut Gradients,
    parents: [Option<NodeId>; N],
    computed: [Option<FlexTensor>; N],
) {
    for (parent, gradient) in parents.into_iter().zip(computed) {
        if let (Some(parent), Some(gradient)) = (parent, gradient) {
            grads.register::<Flex>(parent, gradient);
        }
    }
}

/// `Cpu`'s strategy (burn's default): every activation is kept, none recomputed.
type Checkpointing = burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;

/// The autodiff tensor `y` computed by `op` from `parents`: one graph node whose backward pass is
/// `op`'s, keeping `state` only when a parent is tracked.
fn record<const N: usize, O: Backward<Flex, N>>(
    op: O,
    parents: [&FloatTensor<Cpu>; N],
    state: O::State,
    y: FlexTensor,
) -> FloatTensor<Cpu> {
    match op
        .prepare::<Checkpointing>(parents.map(|p| p.node.clone()))
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(state, y),
        OpsKind::UnTracked(prep) => prep.finish(y),
    }
}

/// The convolution on the autodiff backend: the graph records one node with its own backward.
pub fn conv_autodiff(
    x: Tensor<Cpu, 4>,
    weight: Tensor<Cpu, 4>,
    shape: ConvShape,
) -> Tensor<Cpu, 4> {
    let x = x.into_primitive().tensor();
    let weight = weight.into_primitive().tensor();
    let (y, saved) = conv_forward(x.primitive.clone(), weight.primitive.clone(), shape);
    let out = record(ConvOp, [&x, &weight], saved, y);
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// The 2x2 max-pool on the autodiff backend.
pub fn pool_autodiff(x: Tensor<Cpu, 4>) -> Tensor<Cpu, 4> {
    let x = x.into_primitive().tensor();
    let (y, saved) = pool_forward(&x.primitive);
    let out = record(PoolOp, [&x], saved, y);
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// The convolution without autodiff (evaluation).
pub fn conv_plain(
    x: Tensor<Flex, 4>,
    weight: Tensor<Flex, 4>,
    shape: ConvShape,
) -> Tensor<Flex, 4> {
    let (y, _) = conv_forward(primitive(x), primitive(weight), shape);
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

/// The max-pool without autodiff (evaluation).
pub fn pool_plain(x: Tensor<Flex, 4>) -> Tensor<Flex, 4> {
    let (y, _) = pool_forward(&primitive(x));
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

/// What the product's backward pass needs: both operands (shared, not copied).
#[derive(Clone, Debug)]
pub struct MatmulSaved {
    lhs: FlexTensor,
    rhs: FlexTensor,
}

fn matmul_dims(lhs: &FlexTensor, rhs: &FlexTensor) -> (usize, usize, usize) {
    let [m, k]: [usize; 2] = lhs.layout().shape().dims();
    let [_, n]: [usize; 2] = rhs.layout().shape().dims();
    (m, k, n)
}

/// `lhs` `[m, k]` times `rhs` `[k, n]` (callers check the inner dimensions).
pub fn matmul_forward(lhs: FlexTensor, rhs: FlexTensor) -> (FlexTensor, MatmulSaved) {
    let (m, k, n) = matmul_dims(&lhs, &rhs);
    let y = tensor(
        kernels::matmul(&values(&lhs), &values(&rhs), m, k, n),
        &[m, n],
    );
    (y, MatmulSaved { lhs, rhs })
}

#[derive(Debug)]
struct MatmulOp;

impl Backward<Flex, 2> for MatmulOp {
    type State = MatmulSaved;

    fn backward(self, ops: Ops<MatmulSaved, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let parents @ [lhs_node, rhs_node] = ops.parents.map(|node| node.map(|node| node.id));
        let grad = grads.consume::<Flex>(&ops.node);
        let MatmulSaved { lhs, rhs } = &ops.state;
        let dims @ (m, k, n) = matmul_dims(lhs, rhs);
        let (d_lhs, d_rhs) = kernels::matmul_backward(
            &values(&grad),
            &values(lhs),
            &values(rhs),
            dims,
            lhs_node.is_some(),
            rhs_node.is_some(),
        );
        let d_lhs = d_lhs.map(|d| tensor(d, &[m, k]));
        let d_rhs = d_rhs.map(|d| tensor(d, &[k, n]));
        register(grads, parents, [d_lhs, d_rhs]);
    }
}

/// The product on the autodiff backend.
pub fn matmul_autodiff(lhs: Tensor<Cpu, 2>, rhs: Tensor<Cpu, 2>) -> Tensor<Cpu, 2> {
    let lhs = lhs.into_primitive().tensor();
    let rhs = rhs.into_primitive().tensor();
    let (y, saved) = matmul_forward(lhs.primitive.clone(), rhs.primitive.clone());
    let out = record(MatmulOp, [&lhs, &rhs], saved, y);
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// The product without autodiff (evaluation).
pub fn matmul_plain(lhs: Tensor<Flex, 2>, rhs: Tensor<Flex, 2>) -> Tensor<Flex, 2> {
    let (y, _) = matmul_forward(primitive(lhs), primitive(rhs));
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

/// What the bias-and-GroupNorm's backward pass needs.
#[derive(Clone, Debug)]
pub struct NormSaved {
    shape: NormShape,
    dims: [usize; 4],
    gamma: FlexTensor,
    kernel: Arc<group_norm::NormSaved>,
}

/// `x` `[N, C, H, W]` plus the per-channel `bias`, then GroupNorm with `gamma` and `beta`.
pub fn norm_forward(
    x: &FlexTensor,
    [bias, gamma, beta]: [&FlexTensor; 3],
    groups: usize,
    epsilon: f32,
) -> (FlexTensor, NormSaved) {
    let dims: [usize; 4] = x.layout().shape().dims();
    let [batch, channels, height, width] = dims;
    let shape = NormShape {
        batch,
        channels,
        groups,
        pixels: height * width,
    };
    let (y, kernel) = group_norm::forward(
        &values(x),
        [&values(bias), &values(gamma), &values(beta)],
        &shape,
        epsilon,
    );
    let saved = NormSaved {
        shape,
        dims,
        gamma: gamma.clone(),
        kernel: Arc::new(kernel),
    };
    (tensor(y, &dims), saved)
}

#[derive(Debug)]
struct NormOp;

impl Backward<Flex, 4> for NormOp {
    type State = NormSaved;

    fn backward(self, ops: Ops<NormSaved, 4>, grads: &mut Gradients, _: &mut Checkpointer) {
        let parents = ops.parents.map(|node| node.map(|node| node.id));
        let grad = grads.consume::<Flex>(&ops.node);
        let s = &ops.state;
        let (dx, [d_bias, d_gamma, d_beta]) = group_norm::backward(
            &values(&grad),
            &s.kernel,
            &values(&s.gamma),
            &s.shape,
            parents[0].is_some(),
        );
        let channel = |g| Some(tensor(g, &[s.shape.channels]));
        let dx = dx.map(|dx| tensor(dx, &s.dims));
        register(
            grads,
            parents,
            [dx, channel(d_bias), channel(d_gamma), channel(d_beta)],
        );
    }
}

/// The bias and GroupNorm on the autodiff backend: one node with its own backward.
pub fn norm_autodiff(
    x: Tensor<Cpu, 4>,
    [bias, gamma, beta]: [Tensor<Cpu, 1>; 3],
    groups: usize,
    epsilon: f32,
) -> Tensor<Cpu, 4> {
    let [x, bias, gamma, beta] = [
        x.into_primitive().tensor(),
        bias.into_primitive().tensor(),
        gamma.into_primitive().tensor(),
        beta.into_primitive().tensor(),
    ];
    let (y, saved) = norm_forward(
        &x.primitive,
        [&bias.primitive, &gamma.primitive, &beta.primitive],
        groups,
        epsilon,
    );
    let out = record(NormOp, [&x, &bias, &gamma, &beta], saved, y);
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// The bias and GroupNorm without autodiff (evaluation).
pub fn norm_plain(
    x: Tensor<Flex, 4>,
    [bias, gamma, beta]: [Tensor<Flex, 1>; 3],
    groups: usize,
    epsilon: f32,
) -> Tensor<Flex, 4> {
    let [bias, gamma, beta] = [primitive(bias), primitive(gamma), primitive(beta)];
    let (y, _) = norm_forward(&primitive(x), [&bias, &gamma, &beta], groups, epsilon);
    Tensor::from_primitive(TensorPrimitive::Float(y))
}
