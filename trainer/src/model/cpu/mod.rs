//! GN-LeNet's convolution and max-pool on the CPU backend, with their own backward passes.
//!
//! burn's flex backend computes a 2-D convolution as a 3-D one and derives its gradients
//! generically: the weight gradient through a convolution of axis-swapped (strided, copied)
//! tensors, the input gradient through a transposed convolution, and its 2x2 max-pool through the
//! 3-D pool with indices. In a `perf` profile of a GN-LeNet step those took about three quarters
//! of the time, with the matrix products themselves a quarter. Here the convolution is, per
//! sample, im2col and one matrix product (the `gemm` crate, flex's own); the backward pass
//! rebuilds each sample's column matrix for the weight gradient, and takes the input gradient as
//! a second product and col2im (see `kernels`).
//!
//! So are the conv bias and GroupNorm that follow each convolution, as one operation
//! (`bias_group_norm`), and the dense layers' matrix products, kept on one thread (`matmul`).
//!
//! The model stays generic over the backend: `conv2d` and `max_pool_2x2` take this path when the
//! backend is the trainer's CPU backend (with or without autodiff) and the tensors are f32, and
//! burn's own operations otherwise (CUDA, ndarray).

mod group_norm;
mod kernels;
mod ops;
#[cfg(test)]
mod tests;

use std::any::Any;

use burn::tensor::backend::Backend;
use burn::tensor::module::{conv2d as burn_conv2d, max_pool2d};
use burn::tensor::ops::ConvOptions;
use burn::tensor::{DType, Tensor};

use crate::backend::Cpu;

type Flex = burn::backend::Flex;

/// `value` as a `T` when it is one (the backend type is known only at run time here; Rust has no
/// specialisation), else `value` back.
fn exactly<A: 'static, T: 'static>(value: A) -> Result<T, A> {
    let mut slot = Some(value);
    match (&mut slot as &mut dyn Any).downcast_mut::<Option<T>>() {
        Some(t) => Ok(t.take().expect("the slot was just filled")),
        None => Err(slot.expect("the slot was not taken")),
    }
}

/// Runs `cpu` when `input` is the trainer's backend's (`CI`), `plain` when it is flex's without
/// autodiff (`FI`), and `other` otherwise. The result has the input's backend, so the casts back
/// cannot fail.
fn dispatch<I: 'static, O: 'static, CI: 'static, CO: 'static, FI: 'static, FO: 'static>(
    input: I,
    cpu: impl FnOnce(CI) -> CO,
    plain: impl FnOnce(FI) -> FO,
    other: impl FnOnce(I) -> O,
) -> O {
    let input = match exactly::<I, CI>(input) {
        Ok(input) => {
            return exactly(cpu(input)).unwrap_or_else(|_| unreachable!("the input was Cpu's"));
        }
        Err(input) => input,
    };
    match exactly::<I, FI>(input) {
        Ok(input) => exactly(plain(input)).unwrap_or_else(|_| unreachable!("the input was Flex's")),
        Err(input) => other(input),
    }
}

/// A stride-1 convolution with `padding` zeros on every side and no bias.
pub fn conv2d<B: Backend>(x: Tensor<B, 4>, weight: Tensor<B, 4>, padding: usize) -> Tensor<B, 4> {
    let f32s = x.dtype() == DType::F32 && weight.dtype() == DType::F32;
    let Some(shape) = kernels::ConvShape::of(x.dims(), weight.dims(), padding).filter(|_| f32s)
    else {
        return burn_conv2d(x, weight, None, options(padding));
    };
    dispatch(
        (x, weight),
        |(x, w): (Tensor<Cpu, 4>, Tensor<Cpu, 4>)| ops::conv_autodiff(x, w, shape),
        |(x, w): (Tensor<Flex, 4>, Tensor<Flex, 4>)| ops::conv_plain(x, w, shape),
        |(x, w)| burn_conv2d(x, w, None, options(padding)),
    )
}

fn options(padding: usize) -> ConvOptions<2> {
    ConvOptions::new([1, 1], [padding, padding], [1, 1], 1)
}

/// `bias_group_norm`'s input.
pub type NormInput<B> = (Tensor<B, 4>, [Tensor<B, 1>; 3]);

/// `x` `[N, C, H, W]` plus a per-channel `bias`, then GroupNorm over `groups` groups with scale
/// `gamma` and shift `beta` (each `[C]`) and `epsilon`: one operation on the CPU backend
/// (`group_norm`); elsewhere, or for shapes it does not take, `otherwise` (burn's operations).
pub fn bias_group_norm<B: Backend>(
    input: NormInput<B>,
    groups: usize,
    epsilon: f64,
    otherwise: impl FnOnce(NormInput<B>) -> Tensor<B, 4>,
) -> Tensor<B, 4> {
    let (x, params) = &input;
    let channels = x.dims()[1];
    let handled = groups > 0
        && channels.is_multiple_of(groups)
        && params
            .iter()
            .all(|p| p.dims() == [channels] && p.dtype() == DType::F32)
        && x.dtype() == DType::F32;
    if !handled {
        return otherwise(input);
    }
    let epsilon = epsilon as f32;
    dispatch(
        input,
        |(x, p): NormInput<Cpu>| ops::norm_autodiff(x, p, groups, epsilon),
        |(x, p): NormInput<Flex>| ops::norm_plain(x, p, groups, epsilon),
        otherwise,
    )
}

/// `lhs` `[m, k]` times `rhs` `[k, n]`: on the CPU backend always on one thread (see
/// `kernels::matmul` for the measurement), elsewhere burn's `matmul`.
pub fn matmul<B: Backend>(lhs: Tensor<B, 2>, rhs: Tensor<B, 2>) -> Tensor<B, 2> {
    let f32s = lhs.dtype() == DType::F32 && rhs.dtype() == DType::F32;
    if !f32s || lhs.dims()[1] != rhs.dims()[0] {
        return lhs.matmul(rhs);
    }
    dispatch(
        (lhs, rhs),
        |(l, r): (Tensor<Cpu, 2>, Tensor<Cpu, 2>)| ops::matmul_autodiff(l, r),
        |(l, r): (Tensor<Flex, 2>, Tensor<Flex, 2>)| ops::matmul_plain(l, r),
        |(l, r)| l.matmul(r),
    )
}

/// A 2x2 max-pool with stride 2 (an odd last row or column dropped).
pub fn max_pool_2x2<B: Backend>(x: Tensor<B, 4>) -> Tensor<B, 4> {
    if x.dtype() != DType::F32 {
        return max_pool2d(x, [2, 2], [2, 2], [0, 0], [1, 1], false);
    }
    dispatch(x, ops::pool_autodiff, ops::pool_plain, |x| {
        max_pool2d(x, [2, 2], [2, 2], [0, 0], [1, 1], false)
    })
}
