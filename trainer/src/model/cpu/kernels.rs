//! The kernels on plain `f32` slices: a stride-1 convolution as im2col and a matrix product per
//! sample (forward and backward), and a 2x2 max-pool. Each spreads samples or planes over the
//! rayon pool in a fixed partition, so results do not depend on the thread count.

use rayon::prelude::*;

/// A stride-1, dilation-1, ungrouped convolution with square kernel and symmetric zero padding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvShape {
    pub batch: usize,
    pub channels_in: usize,
    pub height: usize,
    pub width: usize,
    pub kernel: usize,
    pub padding: usize,
}

impl ConvShape {
    /// The convolution of an input `[N, C_in, H, W]` with a weight `[C_out, C_in, K, K]`, if
    /// these kernels compute it: a square kernel no larger than the padded image, and matching
    /// input channels. Anything else goes to burn's own (and its checks).
    pub fn of(x: [usize; 4], weight: [usize; 4], padding: usize) -> Option<Self> {
        let [batch, channels_in, height, width] = x;
        let [_, weight_in, kernel, kernel_w] = weight;
        let handled = weight_in == channels_in
            && kernel == kernel_w
            && kernel >= 1
            && kernel <= height + 2 * padding
            && kernel <= width + 2 * padding;
        handled.then_some(Self {
            batch,
            channels_in,
            height,
            width,
            kernel,
            padding,
        })
    }

    pub fn out_height(&self) -> usize {
        self.height + 2 * self.padding + 1 - self.kernel
    }

    pub fn out_width(&self) -> usize {
        self.width + 2 * self.padding + 1 - self.kernel
    }

    /// Values per input sample, `C_in·H·W`.
    pub fn sample_len(&self) -> usize {
        (self.channels_in * self.height * self.width).max(1)
    }

    /// Rows of the column matrix: one per (input channel, kernel row, kernel column).
    pub fn col_rows(&self) -> usize {
        self.channels_in * self.kernel * self.kernel
    }

    /// Values per sample with the padding laid out as zeros, `C_in·(H+2p)·(W+2p)`.
    fn padded_len(&self) -> usize {
        self.channels_in * self.padded_height() * self.padded_width()
    }

    fn padded_height(&self) -> usize {
        self.height + 2 * self.padding
    }

    fn padded_width(&self) -> usize {
        self.width + 2 * self.padding
    }
}

/// Samples per task of the weight gradient's sum. Fixed, so that the order in which the
/// per-sample products are added (and so every bit of the result) does not depend on the
/// number of threads.
const SAMPLES_PER_TASK: usize = 8;

/// One sample `x` (`[C_in, H, W]`) into the interior of `padded` (`[C_in, H+2p, W+2p]`), whose
/// border must hold zeros (it is never written).
fn pad(x: &[f32], s: &ConvShape, padded: &mut [f32]) {
    let (w, p, pw) = (s.width, s.padding, s.padded_width());
    if s.height * w == 0 {
        return;
    }
    let rows = padded.chunks_exact_mut(pw * s.padded_height());
    for (plane, x) in rows.zip(x.chunks_exact(s.height * w)) {
        for (row, x) in plane.chunks_exact_mut(pw).skip(p).zip(x.chunks_exact(w)) {
            row[p..p + w].copy_from_slice(x);
        }
    }
}

/// The adjoint of `pad`: the interior of `padded` into `x`.
fn crop(padded: &[f32], s: &ConvShape, x: &mut [f32]) {
    let (w, p, pw) = (s.width, s.padding, s.padded_width());
    if s.height * w == 0 {
        return;
    }
    let planes = padded.chunks_exact(pw * s.padded_height());
    for (plane, x) in planes.zip(x.chunks_exact_mut(s.height * w)) {
        for (row, x) in plane.chunks_exact(pw).skip(p).zip(x.chunks_exact_mut(w)) {
            x.copy_from_slice(&row[p..p + w]);
        }
    }
}

/// For each row of the column matrix (input channel `ci`, kernel row `kh`, column `kw`) and each
/// output row `oh`: where that row's `W_out` values start in the padded sample. With the padding
/// laid out, every such run has the same length and no bounds to work out.
fn for_each_run(s: &ConvShape, mut f: impl FnMut(usize, usize)) {
    let (k, ho, wo) = (s.kernel, s.out_height(), s.out_width());
    let (ph, pw) = (s.padded_height(), s.padded_width());
    for row in 0..s.col_rows() {
        let (ci, kh, kw) = (row / (k * k), row / k % k, row % k);
        let from = (ci * ph + kh) * pw + kw;
        for oh in 0..ho {
            f((row * ho + oh) * wo, from + oh * pw);
        }
    }
}

/// One padded sample as its column matrix `[C_in·K·K, H_out·W_out]` (every entry written): the
/// convolution is then one matrix product with the weights.
fn im2col(padded: &[f32], s: &ConvShape, col: &mut [f32]) {
    let wo = s.out_width();
    for_each_run(s, |at, from| {
        col[at..at + wo].copy_from_slice(&padded[from..from + wo]);
    });
}

/// The adjoint of `im2col`: adds each column-matrix entry onto the padded pixel it was read from.
fn col2im(col: &[f32], s: &ConvShape, padded: &mut [f32]) {
    let wo = s.out_width();
    for_each_run(s, |at, to| {
        for (d, v) in padded[to..to + wo].iter_mut().zip(&col[at..at + wo]) {
            *d += v;
        }
    });
}

/// The convolution of `x` (`[N, C_in, H, W]`) with `weight` (`[C_out, C_in, K, K]`), giving
/// `[N, C_out, H_out, W_out]`. One task per sample: its column matrix (in a buffer each thread
/// reuses, small enough to stay in cache), then one product.
pub fn conv_forward(x: &[f32], weight: &[f32], s: &ConvShape) -> Vec<f32> {
    let rows = s.col_rows();
    let channels_out = weight.len() / rows;
    let pixels = s.out_height() * s.out_width();
    let mut y = vec![0.0f32; s.batch * channels_out * pixels];
    let weight = Matrix::rows(weight, channels_out, rows);
    y.par_chunks_mut((channels_out * pixels).max(1))
        .zip(x.par_chunks(s.sample_len()))
        .for_each_init(
            || (vec![0.0f32; s.padded_len()], vec![0.0f32; rows * pixels]),
            |(padded, col), (y, x)| {
                pad(x, s, padded);
                im2col(padded, s, col);
                gemm(
                    y,
                    Out::RowMajor,
                    weight,
                    Matrix::rows(col, rows, pixels),
                    false,
                );
            },
        );
    y
}

/// The gradients of the convolution's input and weight from the output's gradient `grad`
/// (`[N, C_out, H_out, W_out]`), each only when asked for. Samples go to tasks in fixed groups
/// of `SAMPLES_PER_TASK`; each task rebuilds its samples' column matrices (cheaper than keeping
/// them: they would not fit in cache), adds their weight-gradient products, and writes their
/// input gradients. The groups' sums are then added in order.
pub fn conv_backward(
    grad: &[f32],
    x: &[f32],
    weight: &[f32],
    s: &ConvShape,
    want_x: bool,
    want_weight: bool,
) -> (Option<Vec<f32>>, Option<Vec<f32>>) {
    let (rows, pixels) = (s.col_rows(), s.out_height() * s.out_width());
    let channels_out = weight.len() / rows;
    let sample_grad = (channels_out * pixels).max(1);
    let groups = s.batch.div_ceil(SAMPLES_PER_TASK);
    let mut dx = vec![0.0f32; if want_x { s.batch * s.sample_len() } else { 0 }];
    let dx_groups: Vec<Option<&mut [f32]>> = if want_x {
        dx.chunks_mut(s.sample_len() * SAMPLES_PER_TASK)
            .map(Some)
            .collect()
    } else {
        (0..groups).map(|_| None).collect()
    };
    let weight_t = Matrix::rows(weight, channels_out, rows).transpose();
    let partials: Vec<Vec<f32>> = dx_groups
        .into_par_iter()
        .zip(grad.par_chunks(sample_grad * SAMPLES_PER_TASK))
        .zip(x.par_chunks(s.sample_len() * SAMPLES_PER_TASK))
        .map(|((mut dx, grads), xs)| {
            // The padded sample and its column matrix, and the input gradient's.
            let mut padded = vec![0.0f32; if want_weight { s.padded_len() } else { 0 }];
            let mut col = vec![0.0f32; if want_weight { rows * pixels } else { 0 }];
            let mut padded_dx = vec![0.0f32; if want_x { s.padded_len() } else { 0 }];
            let mut grad_col = vec![0.0f32; if want_x { rows * pixels } else { 0 }];
            // dWᵀ = Σ colₙ · gradₙᵀ, `[C_in·K·K, C_out]`: in this orientation gemm reads the
            // column matrix where it lies; for dW itself it would first repack all of it (14% of
            // a GN-LeNet step in a profile).
            let mut sum = vec![0.0f32; if want_weight { rows * channels_out } else { 0 }];
            let samples = grads.chunks(sample_grad).zip(xs.chunks(s.sample_len()));
            for (i, (grad, x)) in samples.enumerate() {
                let grad = Matrix::rows(grad, channels_out, pixels);
                if want_weight {
                    pad(x, s, &mut padded);
                    im2col(&padded, s, &mut col);
                    let col_t = Matrix::rows(&col, rows, pixels).transpose();
                    gemm(&mut sum, Out::Transposed, grad, col_t, i > 0);
                }
                if let Some(dx) = dx.as_deref_mut() {
                    gemm(&mut grad_col, Out::RowMajor, weight_t, grad, false);
                    padded_dx.fill(0.0);
                    col2im(&grad_col, s, &mut padded_dx);
                    crop(
                        &padded_dx,
                        s,
                        &mut dx[i * s.sample_len()..][..s.sample_len()],
                    );
                }
            }
            sum
        })
        .collect();
    let weight = want_weight.then(|| {
        let mut partials = partials.into_iter();
        let mut total = partials
            .next()
            .unwrap_or_else(|| vec![0.0; rows * channels_out]);
        for p in partials {
            for (t, v) in total.iter_mut().zip(&p) {
                *t += v;
            }
        }
        let mut weight = vec![0.0f32; channels_out * rows];
        for (r, row) in total.chunks(channels_out.max(1)).enumerate() {
            for (co, v) in row.iter().enumerate() {
                weight[co * rows + r] = *v;
            }
        }
        weight
    });
    (want_x.then_some(dx), weight)
}

/// `lhs` `[m, k]` times `rhs` `[k, n]`, both row-major: a dense layer's product.
///
/// On one thread, whatever the pool: flex hands every product of more than 192³ multiply-adds
/// to gemm's rayon split, and for the MLP's (64·784·256, 12.8M) that made its whole step slower
/// at 2 threads than at 1 (66 559 against 92 377 samples/s in `--bench mlp_step`): on a 2-vCPU
/// VM, waking the second worker for each product costs more than half the product saves
/// (a fifth of the 2-thread profile was the scheduler). The trainer's largest product is that
/// one, and one thread also makes the result independent of the thread count.
pub fn matmul(lhs: &[f32], rhs: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; m * n];
    gemm(
        &mut out,
        Out::RowMajor,
        Matrix::rows(lhs, m, k),
        Matrix::rows(rhs, k, n),
        false,
    );
    out
}

/// The gradients of `matmul`'s operands from the output's gradient `grad` (`[m, n]`), each only
/// when asked for: `grad · rhsᵀ` (`[m, k]`) and `lhsᵀ · grad` (`[k, n]`).
pub fn matmul_backward(
    grad: &[f32],
    lhs: &[f32],
    rhs: &[f32],
    (m, k, n): (usize, usize, usize),
    want_lhs: bool,
    want_rhs: bool,
) -> (Option<Vec<f32>>, Option<Vec<f32>>) {
    let grad = Matrix::rows(grad, m, n);
    let d_lhs = want_lhs.then(|| {
        let mut d = vec![0.0f32; m * k];
        gemm(
            &mut d,
            Out::RowMajor,
            grad,
            Matrix::rows(rhs, k, n).transpose(),
            false,
        );
        d
    });
    let d_rhs = want_rhs.then(|| {
        let mut d = vec![0.0f32; k * n];
        gemm(
            &mut d,
            Out::RowMajor,
            Matrix::rows(lhs, m, k).transpose(),
            grad,
            false,
        );
        d
    });
    (d_lhs, d_rhs)
}

/// A read-only matrix over a slice: element (i, j) at `i * row_stride + j * col_stride`.
#[derive(Clone, Copy, Debug)]
struct Matrix<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

impl<'a> Matrix<'a> {
    /// A row-major `rows x cols` matrix.
    fn rows(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self {
            data,
            rows,
            cols,
            row_stride: cols,
            col_stride: 1,
        }
    }

    fn transpose(self) -> Self {
        Self {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..self
        }
    }

    /// Whether every element lies inside `data`.
    fn fits(&self) -> bool {
        self.rows == 0
            || self.cols == 0
            || (self.rows - 1) * self.row_stride + (self.cols - 1) * self.col_stride
                < self.data.len()
    }
}

/// How a product's `m x n` result lies in its slice.
#[derive(Clone, Copy, Debug)]
enum Out {
    /// `[m, n]`, row-major.
    RowMajor,
    /// The transpose, `[n, m]` row-major.
    Transposed,
}

/// `out` = `lhs · rhs`, plus `out` when `accumulate`. The `gemm` crate (flex's own) on one
/// thread: the callers spread samples over the threads, or not at all (see `matmul`).
#[allow(unsafe_code)]
fn gemm(out: &mut [f32], layout: Out, lhs: Matrix, rhs: Matrix, accumulate: bool) {
    let (m, k, n) = (lhs.rows, lhs.cols, rhs.cols);
    assert_eq!(rhs.rows, k, "matrix product: inner dimensions");
    assert!(
        lhs.fits() && rhs.fits(),
        "matrix product: an operand overruns its slice"
    );
    assert!(
        out.len() >= m * n,
        "matrix product: the output is too small"
    );
    if m == 0 || n == 0 {
        return;
    }
    let (out_row_stride, out_col_stride) = match layout {
        Out::RowMajor => (n, 1),
        Out::Transposed => (1, m),
    };
    // SAFETY: the asserts above keep every element gemm reads (lhs, rhs) or writes (out, m x n
    // in either layout) inside its slice, and `out` is borrowed mutably, apart from both
    // operands.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            out_col_stride as isize,
            out_row_stride as isize,
            accumulate,
            lhs.data.as_ptr(),
            lhs.col_stride as isize,
            lhs.row_stride as isize,
            rhs.data.as_ptr(),
            rhs.col_stride as isize,
            rhs.row_stride as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// A 2x2 max-pool with stride 2 over planes of `height x width` (an odd last row or column is
/// dropped, as burn's pool does). Returns the pooled values and, for each, the index within its
/// plane of the input it came from (the first of equal values, in row-major order).
pub fn max_pool_2x2(x: &[f32], height: usize, width: usize) -> (Vec<f32>, Vec<u32>) {
    let (ho, wo) = (height / 2, width / 2);
    let planes = x.len() / (height * width).max(1);
    let mut values = vec![0.0f32; planes * ho * wo];
    let mut from = vec![0u32; planes * ho * wo];
    if ho * wo == 0 {
        return (values, from);
    }
    values
        .par_chunks_mut(ho * wo)
        .zip(from.par_chunks_mut(ho * wo))
        .enumerate()
        .for_each(|(p, (values, from))| {
            let plane = &x[p * height * width..][..height * width];
            let rows = values.chunks_mut(wo).zip(from.chunks_mut(wo));
            for (oh, (values, from)) in rows.enumerate() {
                let top = &plane[2 * oh * width..][..width];
                let bottom = &plane[(2 * oh + 1) * width..][..width];
                let windows = top.chunks_exact(2).zip(bottom.chunks_exact(2));
                let outputs = values.iter_mut().zip(from.iter_mut());
                for (ow, ((t, b), (value, from))) in windows.zip(outputs).enumerate() {
                    // Offsets from the window's top-left input, in row-major order.
                    let mut best = (t[0], 0);
                    for (v, offset) in [(t[1], 1), (b[0], width), (b[1], width + 1)] {
                        if v > best.0 {
                            best = (v, offset);
                        }
                    }
                    *value = best.0;
                    *from = (2 * oh * width + 2 * ow + best.1) as u32;
                }
            }
        });
    (values, from)
}

/// The gradient of `max_pool_2x2`'s input: each output gradient goes to the input it came from.
pub fn max_pool_2x2_backward(grad: &[f32], from: &[u32], height: usize, width: usize) -> Vec<f32> {
    let (ho, wo) = (height / 2, width / 2);
    let planes = grad.len() / (ho * wo).max(1);
    let mut x = vec![0.0f32; planes * height * width];
    if ho * wo == 0 {
        return x;
    }
    x.par_chunks_mut(height * width)
        .enumerate()
        .for_each(|(p, plane)| {
            let grad = &grad[p * ho * wo..][..ho * wo];
            let from = &from[p * ho * wo..][..ho * wo];
            for (g, &i) in grad.iter().zip(from) {
                plane[i as usize] += g;
            }
        });
    x
}
