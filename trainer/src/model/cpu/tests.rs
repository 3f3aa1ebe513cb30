use burn::tensor::module::{conv2d as burn_conv2d, max_pool2d};
use burn::tensor::{Distribution, Tensor};

use super::kernels::{self, ConvShape};
use super::*;

/// Direct loops, the definition of a stride-1 zero-padded convolution.
fn naive_conv(x: &[f32], weight: &[f32], s: &ConvShape, channels_out: usize) -> Vec<f32> {
    let (ho, wo, k, p) = (s.out_height(), s.out_width(), s.kernel, s.padding as isize);
    let mut y = vec![0.0; s.batch * channels_out * ho * wo];
    for n in 0..s.batch {
        for co in 0..channels_out {
            for oh in 0..ho {
                for ow in 0..wo {
                    let mut sum = 0.0;
                    for ci in 0..s.channels_in {
                        for kh in 0..k {
                            for kw in 0..k {
                                let ih = (oh + kh) as isize - p;
                                let iw = (ow + kw) as isize - p;
                                if ih < 0
                                    || iw < 0
                                    || ih >= s.height as isize
                                    || iw >= s.width as isize
                                {
                                    continue;
                                }
                                let xi = ((n * s.channels_in + ci) * s.height + ih as usize)
                                    * s.width
                                    + iw as usize;
                                sum +=
                                    x[xi] * weight[((co * s.channels_in + ci) * k + kh) * k + kw];
                            }
                        }
                    }
                    y[((n * channels_out + co) * ho + oh) * wo + ow] = sum;
                }
            }
        }
    }
    y
}

/// Deterministic values in [-1, 1).
fn noise(len: usize, seed: u64) -> Vec<f32> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// `f` run on a fresh rayon pool of `threads` threads.
fn on_threads<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(f)
}

fn assert_close(what: &str, got: &[f32], want: &[f32], tolerance: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tolerance * (1.0 + w.abs()),
            "{what}[{i}]: {g} against {w}"
        );
    }
}

fn shapes() -> Vec<(ConvShape, usize)> {
    let mut out = Vec::new();
    for (kernel, padding) in [(1, 0), (3, 1), (5, 2), (3, 0), (5, 1), (2, 1)] {
        for (batch, channels_in, height, width, channels_out) in [
            (1, 1, 5, 5, 1),
            (2, 3, 7, 6, 4),
            (3, 2, 4, 9, 2),
            (1, 2, 6, 6, 3),
            // Images narrower than the kernel: whole kernel columns fall in the padding.
            (2, 1, 1, 2, 2),
            (2, 1, 2, 1, 2),
        ] {
            let x = [batch, channels_in, height, width];
            let weight = [channels_out, channels_in, kernel, kernel];
            if let Some(s) = ConvShape::of(x, weight, padding) {
                out.push((s, channels_out));
            }
        }
    }
    out
}

#[test]
fn the_convolution_is_the_direct_loops() {
    for (seed, (s, channels_out)) in shapes().into_iter().enumerate() {
        let x = noise(s.batch * s.channels_in * s.height * s.width, seed as u64);
        let weight = noise(channels_out * s.col_rows(), seed as u64 + 100);
        let y = kernels::conv_forward(&x, &weight, &s);
        assert_close(
            &format!("{s:?}"),
            &y,
            &naive_conv(&x, &weight, &s, channels_out),
            1e-5,
        );
    }
}

#[test]
fn the_gradients_are_the_adjoints_of_the_convolution() {
    // The convolution is linear in x and in w, so for any output gradient g:
    // <conv(x, w), g> = <x, dx(g)> = <w, dw(g)>. Random x, w and g leave no room for a wrong
    // gradient to pass.
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(a, b)| (a * b) as f64).sum::<f64>();
    for (seed, (s, channels_out)) in shapes().into_iter().enumerate() {
        let seed = seed as u64;
        let x = noise(s.batch * s.channels_in * s.height * s.width, seed);
        let weight = noise(channels_out * s.col_rows(), seed + 100);
        let y = kernels::conv_forward(&x, &weight, &s);
        let g = noise(y.len(), seed + 200);
        let (dx, dw) = kernels::conv_backward(&g, &x, &weight, &s, true, true);
        let (dx, dw) = (dx.unwrap(), dw.unwrap());
        let output = dot(&y, &g);
        for (name, value) in [("input", dot(&x, &dx)), ("weight", dot(&weight, &dw))] {
            assert!(
                (output - value).abs() < 1e-3 * (1.0 + output.abs()),
                "{s:?}, {name}: {value} against {output}"
            );
        }
        let (none_x, none_w) = kernels::conv_backward(&g, &x, &weight, &s, false, false);
        assert!(
            none_x.is_none() && none_w.is_none(),
            "gradients not asked for are not computed"
        );
    }
}

#[test]
fn the_weight_gradient_does_not_depend_on_the_thread_count() {
    let s = ConvShape {
        batch: 19,
        channels_in: 3,
        height: 7,
        width: 7,
        kernel: 5,
        padding: 2,
    };
    let x = noise(s.batch * s.channels_in * 49, 1);
    let weight = noise(4 * s.col_rows(), 2);
    let run = |threads| {
        on_threads(threads, || {
            let y = kernels::conv_forward(&x, &weight, &s);
            let (dx, dw) = kernels::conv_backward(&y, &x, &weight, &s, true, true);
            (y, dx, dw)
        })
    };
    assert_eq!(run(1), run(3));
}

#[test]
fn the_pool_takes_the_first_maximum_and_routes_its_gradient_there() {
    // One 3x5 plane: the last row and column are dropped.
    #[rustfmt::skip]
    let plane = [
        1.0, 4.0, 2.0, 2.0, 9.0,
        3.0, 0.0, 2.0, 1.0, 9.0,
        9.0, 9.0, 9.0, 9.0, 9.0,
    ];
    let (values, from) = kernels::max_pool_2x2(&plane, 3, 5);
    assert_eq!(values, [4.0, 2.0]);
    assert_eq!(from, [1, 2]);
    let grad = kernels::max_pool_2x2_backward(&[10.0, 20.0], &from, 3, 5);
    let mut want = [0.0; 15];
    want[1] = 10.0;
    want[2] = 20.0;
    assert_eq!(grad, want);
}

type Plain = burn::backend::Flex;

fn values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().to_vec().unwrap()
}

/// `f(a, b)` on the trainer's backend: its output and both inputs' gradients under the loss
/// `Σ f(a, b)·mix` (a weighting, so that each gradient entry differs).
fn output_and_gradients<const D: usize>(
    f: &dyn Fn(Tensor<Cpu, D>, Tensor<Cpu, D>) -> Tensor<Cpu, D>,
    [a, b, mix]: [&Tensor<Plain, D>; 3],
) -> [Vec<f32>; 3] {
    let a = Tensor::<Cpu, D>::from_inner(a.clone()).require_grad();
    let b = Tensor::<Cpu, D>::from_inner(b.clone()).require_grad();
    let y = f(a.clone(), b.clone());
    let grads = (y.clone() * Tensor::from_inner(mix.clone()))
        .sum()
        .backward();
    [
        values(y.inner()),
        values(a.grad(&grads).unwrap()),
        values(b.grad(&grads).unwrap()),
    ]
}

/// Ours against burn's, entry by entry, each result named.
fn assert_results_close(what: &str, names: [&str; 3], ours: &[Vec<f32>; 3], burns: &[Vec<f32>; 3]) {
    for ((name, ours), burns) in names.iter().zip(ours).zip(burns) {
        assert_close(&format!("{what}: {name}"), ours, burns, 1e-4);
    }
}

/// burn's convolution (padding 2) and 2x2 max-pool, the reference.
fn burns_conv_and_pool<B: Backend>(x: Tensor<B, 4>, w: Tensor<B, 4>) -> Tensor<B, 4> {
    let y = burn_conv2d(x, w, None, options(2));
    max_pool2d(y, [2, 2], [2, 2], [0, 0], [1, 1], false)
}

/// The operations against burn's own, forward and all gradients, on the trainer's backend and
/// without autodiff, in GN-LeNet's shapes (and an odd size the pool must crop).
#[test]
fn conv_and_pool_match_burns_operations_forward_and_backward() {
    let device = Default::default();
    for (batch, channels_in, side, channels_out) in [(3, 1, 28, 4), (2, 3, 14, 5), (4, 2, 7, 3)] {
        let x = Tensor::<Plain, 4>::random(
            [batch, channels_in, side, side],
            Distribution::Default,
            &device,
        );
        let w = Tensor::<Plain, 4>::random(
            [channels_out, channels_in, 5, 5],
            Distribution::Default,
            &device,
        );
        // A weighting of the pooled outputs, so that each gradient entry differs.
        let side_out = side / 2;
        let mix = Tensor::<Plain, 4>::random(
            [batch, channels_out, side_out, side_out],
            Distribution::Default,
            &device,
        );

        let ours = |x, w| max_pool_2x2(conv2d(x, w, 2));
        let inputs = [&x, &w, &mix];
        let results = [
            output_and_gradients(&ours, inputs),
            output_and_gradients(&burns_conv_and_pool::<Cpu>, inputs),
        ];
        let what = format!("batch {batch}, {channels_in}->{channels_out} channels, side {side}");
        let names = ["output", "input gradient", "weight gradient"];
        assert_results_close(&what, names, &results[0], &results[1]);
        // Without autodiff (evaluation), the same output.
        let plain = max_pool_2x2(conv2d(x, w, 2));
        assert_close(
            &format!("{what}: plain output"),
            &values(plain),
            &results[1][0],
            1e-4,
        );
    }
}

#[test]
fn other_backends_take_burns_operations() {
    // ndarray is not specialised here: the same calls run burn's convolution and pool.
    type Other = burn::backend::NdArray;
    let device = Default::default();
    let x = Tensor::<Other, 4>::random([2, 2, 6, 6], Distribution::Default, &device);
    let w = Tensor::<Other, 4>::random([3, 2, 5, 5], Distribution::Default, &device);
    let ours = values(max_pool_2x2(conv2d(x.clone(), w.clone(), 2)));
    let burns = values(burns_conv_and_pool(x, w));
    assert_eq!(ours, burns);
}

#[test]
fn shapes_the_kernels_do_not_handle_take_burns_convolution() {
    // A 3x5 kernel on the trainer's backend: burn's convolution, same result as calling it.
    let device = Default::default();
    let x = Tensor::<Plain, 4>::random([2, 2, 6, 6], Distribution::Default, &device);
    let w = Tensor::<Plain, 4>::random([3, 2, 3, 5], Distribution::Default, &device);
    assert!(ConvShape::of(x.dims(), w.dims(), 2).is_none());
    let ours = values(conv2d(x.clone(), w.clone(), 2));
    assert_eq!(ours, values(burn_conv2d(x, w, None, options(2))));
}

#[test]
fn only_the_named_type_is_taken() {
    assert_eq!(exactly::<u32, u32>(7), Ok(7));
    assert_eq!(exactly::<u32, i32>(7), Err(7));
}

/// The product against burn's `matmul`, forward and both gradients, on the trainer's backend
/// and without autodiff, in the models' shapes and odd ones.
#[test]
fn the_product_matches_burns_forward_and_backward() {
    let device = Default::default();
    for (m, k, n) in [
        (64, 784, 256),
        (64, 256, 10),
        (3, 576, 10),
        (1, 1, 1),
        (5, 7, 3),
    ] {
        let lhs = Tensor::<Plain, 2>::random([m, k], Distribution::Default, &device);
        let rhs = Tensor::<Plain, 2>::random([k, n], Distribution::Default, &device);
        let mix = Tensor::<Plain, 2>::random([m, n], Distribution::Default, &device);
        let inputs = [&lhs, &rhs, &mix];
        let results = [
            output_and_gradients(&|l, r| matmul(l, r), inputs),
            output_and_gradients(&|l, r| l.matmul(r), inputs),
        ];
        let names = ["output", "left gradient", "right gradient"];
        assert_results_close(&format!("{m}x{k}x{n}"), names, &results[0], &results[1]);
        let plain = values(matmul(lhs.clone(), rhs.clone()));
        assert_close(
            &format!("{m}x{k}x{n}: plain output"),
            &plain,
            &results[1][0],
            1e-4,
        );
    }
}

#[test]
fn the_product_does_not_depend_on_the_thread_count() {
    let (m, k, n) = (64, 784, 256);
    let (lhs, rhs) = (noise(m * k, 1), noise(k * n, 2));
    let grad = noise(m * n, 3);
    let run = |threads| {
        on_threads(threads, || {
            let y = kernels::matmul(&lhs, &rhs, m, k, n);
            let (dl, dr) = kernels::matmul_backward(&grad, &lhs, &rhs, (m, k, n), true, true);
            (y, dl, dr)
        })
    };
    assert_eq!(run(1), run(3));
}

#[test]
fn the_norm_does_not_depend_on_the_thread_count_and_skips_what_is_not_asked() {
    use super::group_norm::{NormShape, backward, forward};
    let s = NormShape {
        batch: 11,
        channels: 6,
        groups: 2,
        pixels: 37,
    };
    let x = noise(s.batch * s.channels * s.pixels, 1);
    let params = [noise(6, 2), noise(6, 3), noise(6, 4)];
    let grad = noise(x.len(), 5);
    let run = |threads, want_x| {
        on_threads(threads, || {
            let (y, saved) = forward(&x, [&params[0], &params[1], &params[2]], &s, 1e-5);
            let (dx, d) = backward(&grad, &saved, &params[1], &s, want_x);
            (y, dx, d)
        })
    };
    let one = run(1, true);
    assert_eq!(one, run(3, true));
    let (_, dx, d) = run(2, false);
    assert!(
        dx.is_none(),
        "the input gradient is not computed when not asked"
    );
    assert_eq!(
        d, one.2,
        "the parameters' gradients do not need the input's"
    );
}

#[test]
fn other_backends_compose_burns_norm() {
    type Other = burn::backend::NdArray;
    let device = Default::default();
    let x = Tensor::<Other, 4>::random([2, 4, 3, 3], Distribution::Default, &device);
    let p = || Tensor::<Other, 1>::random([4], Distribution::Default, &device);
    let mut composed = false;
    bias_group_norm((x, [p(), p(), p()]), 2, 1e-5, |(x, _)| {
        composed = true;
        x
    });
    assert!(
        composed,
        "ndarray takes the caller's composition of burn's operations"
    );
}
