//! SGD with heavy-ball momentum (no dampening, as PyTorch's `SGD(momentum=m)`), written so that
//! every update happens in place.
//!
//! burn's `Sgd` computes `v ← m·v + g; p ← p − lr·v` through a clone of the gradient and a
//! clone of the velocity, so each step allocates and fills two new buffers per parameter: on
//! flex that was about 9% of the MLP step (`perf`, batch 64). Here the state is the velocity
//! already scaled by the learning rate, `u = lr·v`, so the update is
//! `u ← m·(lr/lr_prev)·u + lr·g; p ← p − u`: flex runs each of those operations in the
//! buffer it was given (its tensors are uniquely owned here), and nothing is allocated.
//! The values equal burn's up to rounding (a test compares them).

use burn::module::AutodiffModule;
use burn::optim::SimpleOptimizer;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::record::Record;
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};

/// The optimizer: momentum `m` (0 for plain SGD, which keeps no state).
#[derive(Clone, Debug)]
pub struct InPlaceSgd {
    momentum: f64,
}

/// Per parameter: the velocity times the learning rate it was last stepped with, and that rate
/// (so a changed rate rescales it).
#[derive(Record, Clone)]
pub struct ScaledVelocity<B: Backend, const D: usize> {
    pub scaled_velocity: Tensor<B, D>,
    pub learning_rate: f64,
}

impl InPlaceSgd {
    pub fn new(momentum: f64) -> Self {
        Self { momentum }
    }

    /// As burn's `SgdConfig::init`: the optimizer for a module's parameters.
    pub fn init<B: AutodiffBackend, M: AutodiffModule<B>>(
        self,
    ) -> OptimizerAdaptor<InPlaceSgd, M, B> {
        OptimizerAdaptor::from(self)
    }
}

impl<B: Backend> SimpleOptimizer<B> for InPlaceSgd {
    type State<const D: usize> = ScaledVelocity<B, D>;

    fn step<const D: usize>(
        &self,
        lr: f64,
        tensor: Tensor<B, D>,
        grad: Tensor<B, D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<B, D>, Option<Self::State<D>>) {
        let step = grad.mul_scalar(lr);
        if self.momentum == 0.0 {
            return (tensor.sub(step), None);
        }
        let scaled_velocity = match state {
            None => step,
            Some(s) => {
                // Exactly `m` while the rate is unchanged (m·lr/lr can round off m).
                let decay = if s.learning_rate == lr {
                    self.momentum
                } else {
                    self.momentum * lr / s.learning_rate
                };
                s.scaled_velocity.mul_scalar(decay).add(step)
            }
        };
        let tensor = tensor.sub(scaled_velocity.clone());
        (
            tensor,
            Some(ScaledVelocity {
                scaled_velocity,
                learning_rate: lr,
            }),
        )
    }

    fn to_device<const D: usize>(state: Self::State<D>, device: &B::Device) -> Self::State<D> {
        ScaledVelocity {
            scaled_velocity: state.scaled_velocity.to_device(device),
            learning_rate: state.learning_rate,
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::Autodiff;
    use burn::nn::loss::CrossEntropyLossConfig;
    use burn::optim::momentum::MomentumConfig;
    use burn::optim::{GradientsParams, Optimizer, SgdConfig};
    use burn::tensor::{Distribution, Int, Tensor};
    use murmur_core::api::ModelKind;

    use super::InPlaceSgd;
    use crate::backend::Cpu;
    use crate::model::{Model, export};

    type Nd = Autodiff<burn::backend::NdArray<f32>>;

    /// Ten steps (the rate changed half way) of ours and of burn's `Sgd` from the same model
    /// on the same batch: the same parameters up to rounding.
    fn matches_burns_sgd<B: burn::tensor::backend::AutodiffBackend>(momentum: f64) {
        let device = Default::default();
        let model = Model::<B>::new(ModelKind::Mlp, &device);
        let x = Tensor::<B, 2>::random([16, 784], Distribution::Uniform(0.0, 1.0), &device);
        let y = Tensor::<B, 1, Int>::from_ints(
            [1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5, 6],
            &device,
        );
        let loss = CrossEntropyLossConfig::new().init(&device);
        let mut ours = InPlaceSgd::new(momentum).init::<B, Model<B>>();
        let mut burns = SgdConfig::new()
            .with_momentum((momentum > 0.0).then(|| {
                MomentumConfig::new()
                    .with_momentum(momentum)
                    .with_dampening(0.0)
            }))
            .init::<B, Model<B>>();
        let (model, start, _) = export(model);
        let (mut a, mut b) = (model.clone(), model);
        for step in 0..10 {
            let lr = if step < 5 { 0.05 } else { 0.02 };
            let grads = GradientsParams::from_grads(
                loss.forward(a.forward(x.clone()), y.clone()).backward(),
                &a,
            );
            a = ours.step(lr, a, grads);
            let grads = GradientsParams::from_grads(
                loss.forward(b.forward(x.clone()), y.clone()).backward(),
                &b,
            );
            b = burns.step(lr, b, grads);
        }
        let (_, a, _) = export(a);
        let (_, b, _) = export(b);
        let moved = a.iter().zip(&start).any(|(x, y)| x != y);
        assert!(moved, "the steps changed nothing");
        let worst = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(
            worst < 1e-5,
            "momentum {momentum}: differs from burn's SGD by {worst}"
        );
    }

    #[test]
    fn in_place_sgd_matches_burns_sgd_with_and_without_momentum() {
        matches_burns_sgd::<Cpu>(0.9);
        matches_burns_sgd::<Cpu>(0.0);
        matches_burns_sgd::<Nd>(0.9);
    }
}
