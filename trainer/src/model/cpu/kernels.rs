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
    pub fn out_height(&self) -> usize {
        self.height + 2 * self.padding + 1 - self.kernel
    }

    pub fn out_width(&self) -> usize {
        self.width + 2 * self.padding + 1 - self.kernel
    }

    /// Rows of the column matrix: one per (input channel, kernel row, kernel column).
    pub fn col_rows(&self) -> usize {
        self.channels_in * self.kernel * self.kernel
    }

    /// For kernel column `kw`, the output columns whose input column is inside the image, and
    /// the input column of the first of them.
    fn columns(&self, kw: usize) -> (std::ops::Range<usize>, usize) {
        let first = self.padding.saturating_sub(kw);
        let end = self.out_width().min(self.width + self.padding - kw);
        (first..end.max(first), first + kw - self.padding)
    }

    /// For kernel row `kh` and output row `oh`, the input row, if inside the image.
    fn input_row(&self, kh: usize, oh: usize) -> Option<usize> {
        (oh + kh)
            .checked_sub(self.padding)
            .filter(|&ih| ih < self.height)
    }
}

/// Samples per task of the weight gradient's sum. Fixed, so that the order in which the
/// per-sample products are added (and so every bit of the result) does not depend on the
/// number of threads.
const SAMPLES_PER_TASK: usize = 8;

/// One sample `x` (`[C_in, H, W]`) as its column matrix `[C_in·K·K, H_out·W_out]`, zero where
/// the kernel hangs over the padding: the convolution is then one matrix product with the
/// weights. `col` must hold zeros where the padding is.
fn im2col(x: &[f32], s: &ConvShape, col: &mut [f32]) {
    let (h, w, k) = (s.height, s.width, s.kernel);
    let (ho, wo) = (s.out_height(), s.out_width());
    for (row, out) in col.chunks_mut(ho * wo).enumerate() {
        let (ci, kh, kw) = (row / (k * k), row / k % k, row % k);
        let (cols, first_in) = s.columns(kw);
        let plane = &x[ci * h * w..][..h * w];
        for oh in 0..ho {
            if let Some(ih) = s.input_row(kh, oh) {
                out[oh * wo + cols.start..oh * wo + cols.end]
                    .copy_from_slice(&plane[ih * w + first_in..][..cols.len()]);
            }
        }
    }
}

/// The adjoint of `im2col` for one sample: adds each column-matrix entry onto the input pixel
/// it was read from.
fn col2im(col: &[f32], s: &ConvShape, x: &mut [f32]) {
    let (h, w, k) = (s.height, s.width, s.kernel);
    let (ho, wo) = (s.out_height(), s.out_width());
    for (row, src) in col.chunks(ho * wo).enumerate() {
        let (ci, kh, kw) = (row / (k * k), row / k % k, row % k);
        let (cols, first_in) = s.columns(kw);
        let plane = &mut x[ci * h * w..][..h * w];
        for oh in 0..ho {
            if let Some(ih) = s.input_row(kh, oh) {
                let src = &src[oh * wo + cols.start..][..cols.len()];
                let dst = &mut plane[ih * w + first_in..][..cols.len()];
                for (d, v) in dst.iter_mut().zip(src) {
                    *d += v;
                }
            }
        }
    }
}

/// The convolution of `x` (`[N, C_in, H, W]`) with `weight` (`[C_out, C_in, K, K]`): the output
/// `[N, C_out, H_out, W_out]` and the column matrices `[N, C_in·K·K, H_out·W_out]`, which the
/// weight gradient needs. One task per sample: its column matrix, then one product.
pub fn conv_forward(x: &[f32], weight: &[f32], s: &ConvShape) -> (Vec<f32>, Vec<f32>) {
    let channels_out = weight.len() / s.col_rows();
    let pixels = s.out_height() * s.out_width();
    let mut y = vec![0.0f32; s.batch * channels_out * pixels];
    let mut col = vec![0.0f32; s.batch * s.col_rows() * pixels];
    let weight = Matrix::rows(weight, channels_out, s.col_rows());
    y.par_chunks_mut(channels_out * pixels.max(1))
        .zip(col.par_chunks_mut(s.col_rows() * pixels.max(1)))
        .zip(x.par_chunks(s.channels_in * s.height * s.width))
        .for_each(|((y, col), x)| {
            im2col(x, s, col);
            gemm(
                y,
                Out::RowMajor,
                weight,
                Matrix::rows(col, s.col_rows(), pixels),
                false,
            );
        });
    (y, col)
}

/// The gradients of the convolution's input and weight from the output's gradient `grad`
/// (`[N, C_out, H_out, W_out]`) and the forward pass's column matrices, each only when asked.
pub fn conv_backward(
    grad: &[f32],
    col: &[f32],
    weight: &[f32],
    s: &ConvShape,
    want_x: bool,
    want_weight: bool,
) -> (Option<Vec<f32>>, Option<Vec<f32>>) {
    let (rows, pixels) = (s.col_rows(), s.out_height() * s.out_width());
    let channels_out = weight.len() / rows;
    let sample_grad = channels_out * pixels.max(1);
    let sample_col = rows * pixels.max(1);
    let x = want_x.then(|| {
        let mut x = vec![0.0f32; s.batch * s.channels_in * s.height * s.width];
        let weight_t = Matrix::rows(weight, channels_out, rows).transpose();
        x.par_chunks_mut(s.channels_in * s.height * s.width)
            .zip(grad.par_chunks(sample_grad))
            .for_each_init(
                || vec![0.0f32; rows * pixels],
                |scratch, (x, grad)| {
                    let grad = Matrix::rows(grad, channels_out, pixels);
                    gemm(scratch, Out::RowMajor, weight_t, grad, false);
                    col2im(scratch, s, x);
                },
            );
        x
    });
    let weight = want_weight.then(|| {
        // Summed as dWᵀ = Σ colₙ · gradₙᵀ, `[C_in·K·K, C_out]`: in this orientation gemm reads
        // the column matrix where it lies; for dW itself it would first repack all of it (14% of
        // a GN-LeNet step in a profile).
        let partials: Vec<Vec<f32>> = grad
            .par_chunks(sample_grad * SAMPLES_PER_TASK)
            .zip(col.par_chunks(sample_col * SAMPLES_PER_TASK))
            .map(|(grads, cols)| {
                let mut sum = vec![0.0f32; channels_out * rows];
                for (i, (grad, col)) in grads
                    .chunks(sample_grad)
                    .zip(cols.chunks(sample_col))
                    .enumerate()
                {
                    let lhs = Matrix::rows(grad, channels_out, pixels);
                    let rhs = Matrix::rows(col, rows, pixels).transpose();
                    gemm(&mut sum, Out::Transposed, lhs, rhs, i > 0);
                }
                sum
            })
            .collect();
        let mut partials = partials.into_iter();
        let mut total = partials
            .next()
            .unwrap_or_else(|| vec![0.0; channels_out * rows]);
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
    (x, weight)
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
/// thread: the callers spread samples over the threads.
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
            for oh in 0..ho {
                for ow in 0..wo {
                    let top = 2 * oh * width + 2 * ow;
                    let mut best = top;
                    for i in [top + 1, top + width, top + width + 1] {
                        if plane[i] > plane[best] {
                            best = i;
                        }
                    }
                    values[oh * wo + ow] = plane[best];
                    from[oh * wo + ow] = best as u32;
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
