//! GN-LeNet's conv bias and GroupNorm as one kernel on plain `f32` slices, forward and backward.
//!
//! Written with burn's tensor operations (as `model::group_norm` does for other backends), the
//! bias and the normalisation are a dozen element-wise operations, each a pass over the
//! activations with a fresh buffer, and as many again backward: 18% of a GN-LeNet step at batch
//! 64 in a `perf` profile on flex. Here they are three passes forward (sum, squared deviation,
//! normalise) and two backward, per sample; samples spread over the rayon pool, and the
//! per-channel parameter gradients are summed over samples in order, so results do not depend on
//! the thread count.

use rayon::prelude::*;

/// `[N, C, H·W]` activations normalised over `groups` groups of `C / groups` channels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NormShape {
    pub batch: usize,
    pub channels: usize,
    pub groups: usize,
    /// `H·W`.
    pub pixels: usize,
}

impl NormShape {
    fn sample_len(&self) -> usize {
        (self.channels * self.pixels).max(1)
    }

    /// Elements per group of one sample.
    fn group_len(&self) -> usize {
        self.channels / self.groups * self.pixels
    }

    fn channels_per_group(&self) -> usize {
        self.channels / self.groups
    }
}

/// What the backward pass needs: the normalised values and each (sample, group)'s `1/σ`.
#[derive(Clone, Debug)]
pub struct NormSaved {
    pub normalized: Vec<f32>,
    pub inv_std: Vec<f32>,
}

/// The sum of `f` over a slice, in 16 lanes so that it vectorises.
#[inline(always)]
fn lane_sum(values: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    lane_sum2(values, values, |v, _| f(v))
}

/// The same over two slices of equal length.
#[inline(always)]
fn lane_sum2(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) -> f32 {
    const LANES: usize = 16;
    let mut lanes = [0.0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = (ca.remainder().iter().zip(cb.remainder()))
        .map(|(&x, &y)| f(x, y))
        .sum();
    for (x, y) in ca.zip(cb) {
        for ((l, &x), &y) in lanes.iter_mut().zip(x).zip(y) {
            *l += f(x, y);
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// `y = γ·(z − μ)/√(σ² + ε) + β` with `z = x + bias`, μ and σ² over each (sample, group):
/// `Conv2d`'s bias followed by burn's `GroupNorm`.
pub fn forward(
    x: &[f32],
    [bias, gamma, beta]: [&[f32]; 3],
    s: &NormShape,
    epsilon: f32,
) -> (Vec<f32>, NormSaved) {
    let (p, per_group) = (s.pixels, s.channels_per_group());
    let mut y = vec![0.0f32; x.len()];
    let mut normalized = vec![0.0f32; x.len()];
    let mut inv_std = vec![0.0f32; s.batch * s.groups];
    let m = s.group_len() as f32;
    y.par_chunks_mut(s.sample_len())
        .zip(normalized.par_chunks_mut(s.sample_len()))
        .zip(inv_std.par_chunks_mut(s.groups.max(1)))
        .zip(x.par_chunks(s.sample_len()))
        .for_each(|(((y, normalized), inv_std), x)| {
            for (g, inv) in inv_std.iter_mut().enumerate() {
                let channels = g * per_group..(g + 1) * per_group;
                let plane = |c: usize| &x[c * p..(c + 1) * p];
                let mean = channels
                    .clone()
                    .map(|c| lane_sum(plane(c), |v| v + bias[c]))
                    .sum::<f32>()
                    / m;
                let var = channels
                    .clone()
                    .map(|c| {
                        let shift = bias[c] - mean;
                        lane_sum(plane(c), |v| (v + shift) * (v + shift))
                    })
                    .sum::<f32>()
                    / m;
                *inv = 1.0 / (var + epsilon).sqrt();
                for c in channels {
                    let shift = bias[c] - mean;
                    let out = y[c * p..(c + 1) * p].iter_mut();
                    let norm = normalized[c * p..(c + 1) * p].iter_mut();
                    for ((y, n), &v) in out.zip(norm).zip(plane(c)) {
                        *n = (v + shift) * *inv;
                        *y = *n * gamma[c] + beta[c];
                    }
                }
            }
        });
    (
        y,
        NormSaved {
            normalized,
            inv_std,
        },
    )
}

/// The gradients of `forward`'s input and of its bias, scale and shift (each `[C]`) from the
/// output's gradient `grad`. The input's gradient is computed whenever the input's or the
/// bias's is asked for (the bias's is its per-channel sum).
pub fn backward(
    grad: &[f32],
    saved: &NormSaved,
    gamma: &[f32],
    s: &NormShape,
    want_x: bool,
) -> (Option<Vec<f32>>, [Vec<f32>; 3]) {
    let (p, per_group, c_all) = (s.pixels, s.channels_per_group(), s.channels);
    let m = s.group_len() as f32;
    let mut dx = vec![0.0f32; if want_x { grad.len() } else { 0 }];
    let dx_samples: Vec<Option<&mut [f32]>> = if want_x {
        dx.chunks_mut(s.sample_len()).map(Some).collect()
    } else {
        (0..s.batch).map(|_| None).collect()
    };
    // Per sample: [d bias | d γ | d β], one value per channel each.
    let partials: Vec<Vec<f32>> = dx_samples
        .into_par_iter()
        .zip(grad.par_chunks(s.sample_len()))
        .zip(saved.normalized.par_chunks(s.sample_len()))
        .zip(saved.inv_std.par_chunks(s.groups.max(1)))
        .map(|(((mut dx, dy), xhat), inv_std)| {
            let mut sums = vec![0.0f32; 3 * c_all];
            let (d_bias, rest) = sums.split_at_mut(c_all);
            let (d_gamma, d_beta) = rest.split_at_mut(c_all);
            for (g, &inv) in inv_std.iter().enumerate() {
                let channels = g * per_group..(g + 1) * per_group;
                // Σ dy·γ and Σ dy·γ·x̂ over the group, from the per-channel sums.
                let (mut a, mut b) = (0.0f32, 0.0f32);
                for c in channels.clone() {
                    let (dy, xh) = (&dy[c * p..(c + 1) * p], &xhat[c * p..(c + 1) * p]);
                    d_beta[c] = lane_sum(dy, |v| v);
                    d_gamma[c] = lane_sum2(dy, xh, |d, x| d * x);
                    a += d_beta[c] * gamma[c];
                    b += d_gamma[c] * gamma[c];
                }
                let (a, b) = (a / m, b / m);
                for c in channels {
                    let (dy, xh) = (&dy[c * p..(c + 1) * p], &xhat[c * p..(c + 1) * p]);
                    // dz = (dy·γ − mean(dy·γ) − x̂·mean(dy·γ·x̂)) / σ; the bias's gradient is
                    // its sum, so it needs dz even where the input's is not asked for.
                    let dz = |d: f32, x: f32| (d * gamma[c] - a - x * b) * inv;
                    d_bias[c] = lane_sum2(dy, xh, dz);
                    if let Some(dx) = dx.as_deref_mut() {
                        let out = dx[c * p..(c + 1) * p].iter_mut();
                        for ((o, &d), &x) in out.zip(dy).zip(xh) {
                            *o = dz(d, x);
                        }
                    }
                }
            }
            sums
        })
        .collect();
    let mut total = vec![0.0f32; 3 * c_all];
    for partial in &partials {
        for (t, v) in total.iter_mut().zip(partial) {
            *t += v;
        }
    }
    let d_beta = total.split_off(2 * c_all);
    let d_gamma = total.split_off(c_all);
    (want_x.then_some(dx), [total, d_gamma, d_beta])
}
