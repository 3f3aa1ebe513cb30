//! Outer steps (DiLoCo, SlowMo): a member takes `local_steps` optimizer steps on its own, then
//! mixes with its neighbours and moves an anchor copy of the parameters by an outer optimizer
//! step; the next local steps start from the anchor.
//!
//! What the outer optimizer steps on is the mixed pseudo-gradient measured against this
//! member's own anchor, `g = θ − Σ_j W_ij x_j` (self included, renormalised over who delivered).
//! It equals `Σ_j W_ij (θ_j − x_j) + Σ_j W_ij (θ − θ_j)`: the topology-weighted mean of the
//! neighbours' pseudo-gradients, plus a term that pulls the anchors together. On a sparse graph
//! that second term is what keeps the anchors from drifting apart (an all-reduce, as in DiLoCo,
//! makes them equal; a neighbourhood does not). With SGD, learning rate 1 and no momentum the
//! anchor becomes the mixed parameters: averaging every `local_steps` steps, exactly.
//!
//! Pure functions over flat buffers, computed per element in f64 in a fixed order, so every
//! member and every CPU gets the same bits.

use murmur_core::api::{OuterOptimizerKind, OuterSpec};

/// The outer optimizer's settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OuterConfig {
    /// Local optimizer steps between two outer steps.
    pub local_steps: u64,
    pub optimizer: OuterOptimizerKind,
    pub learning_rate: f64,
    pub momentum: f64,
    /// With overlap: the local steps after a round is posted at which it is mixed in.
    pub overlap_steps: u64,
}

impl OuterConfig {
    pub fn from_spec(spec: &OuterSpec) -> Self {
        Self {
            local_steps: u64::from(spec.local_steps.max(1)),
            optimizer: spec.optimizer,
            learning_rate: spec.learning_rate(),
            momentum: spec.momentum(),
            overlap_steps: spec.overlap_steps(),
        }
    }
}

/// A member's outer state: the anchor the local steps start from, and the outer momentum.
#[derive(Clone, Debug, PartialEq)]
pub struct Outer {
    pub anchor: Vec<f32>,
    pub momentum: Vec<f32>,
}

impl Outer {
    /// The state before any outer step: the anchor is the initial parameters, no momentum.
    pub fn start(parameters: &[f32]) -> Self {
        Self {
            anchor: parameters.to_vec(),
            momentum: vec![0.0; parameters.len()],
        }
    }

    /// One outer step towards `mixed` (the neighbourhood's weighted mix of parameters): see
    /// [`outer_step`].
    pub fn step(&mut self, mixed: &[f32], config: &OuterConfig) {
        outer_step(&mut self.anchor, &mut self.momentum, mixed, config);
    }

    /// The outer step that ends an averaging round, in whichever way the round was exchanged.
    /// A round that expected neighbours and heard from none (they finished, or all were lost)
    /// has nothing to mix: an outer step on this member's own drift, momentum and all, carries
    /// it along its own classes (93% to 32% over a run's last 50 steps alone, in the whole-job
    /// test), so the anchor stays where the last mix put it. A member with no neighbours at
    /// all steps on its own drift, as DiLoCo with one worker does.
    pub fn end_round(&mut self, mixed: &[f32], config: &OuterConfig, expected: bool, heard: bool) {
        if heard || !expected {
            self.step(mixed, config);
        }
    }
}

/// `g = anchor − mixed; m ← μ·m + g`, then Nesterov: `anchor −= lr·(g + μ·m)` (PyTorch's
/// `SGD(nesterov=True)`, DiLoCo's outer optimizer), or SGD with heavy-ball momentum:
/// `anchor −= lr·m`.
pub fn outer_step(anchor: &mut [f32], momentum: &mut [f32], mixed: &[f32], c: &OuterConfig) {
    debug_assert_eq!(anchor.len(), mixed.len());
    debug_assert_eq!(momentum.len(), mixed.len());
    let (lr, mu) = (c.learning_rate, c.momentum);
    let nesterov = c.optimizer == OuterOptimizerKind::Nesterov;
    for ((a, m), x) in anchor.iter_mut().zip(momentum.iter_mut()).zip(mixed) {
        let g = f64::from(*a) - f64::from(*x);
        let velocity = mu * f64::from(*m) + g;
        let update = if nesterov {
            g + mu * velocity
        } else {
            velocity
        };
        *m = velocity as f32;
        *a = (f64::from(*a) - lr * update) as f32;
    }
}

/// `anchor − parameters`: how far the local steps moved from the anchor.
pub fn pseudo_gradient(anchor: &[f32], parameters: &[f32]) -> Vec<f32> {
    anchor
        .iter()
        .zip(parameters)
        .map(|(a, x)| (f64::from(*a) - f64::from(*x)) as f32)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn config(optimizer: OuterOptimizerKind, learning_rate: f64, momentum: f64) -> OuterConfig {
        OuterConfig {
            local_steps: 10,
            optimizer,
            learning_rate,
            momentum,
            overlap_steps: 1,
        }
    }

    #[test]
    fn sgd_with_learning_rate_one_and_no_momentum_moves_the_anchor_to_the_mix() {
        let mut outer = Outer::start(&[1.0, -2.0, 0.5]);
        let mixed = [0.25, 3.0, 0.5];
        outer.step(&mixed, &config(OuterOptimizerKind::Sgd, 1.0, 0.0));
        assert_eq!(outer.anchor, mixed);
    }

    #[test]
    fn a_round_that_heard_no_one_it_expected_keeps_the_anchor_and_the_momentum() {
        let c = config(OuterOptimizerKind::Nesterov, 0.7, 0.9);
        let mut outer = Outer::start(&[1.0, -2.0]);
        outer.step(&[0.5, -1.0], &c);
        let before = outer.clone();
        outer.end_round(&[9.0, 9.0], &c, true, false);
        assert_eq!(outer, before);
        // Heard from someone, or alone by design: an outer step.
        let mut stepped = before.clone();
        stepped.step(&[9.0, 9.0], &c);
        for (expected, heard) in [(true, true), (false, false)] {
            let mut outer = before.clone();
            outer.end_round(&[9.0, 9.0], &c, expected, heard);
            assert_eq!(outer, stepped, "expected {expected}, heard {heard}");
        }
    }

    #[test]
    fn nesterov_follows_pytorchs_formula_by_hand() {
        // PyTorch SGD(lr=0.7, momentum=0.9, nesterov=True) on grad g = θ − x:
        // step 1: b = g = 1; θ = 2 − 0.7·(1 + 0.9·1) = 0.67
        // step 2: g = 0.67 − 0.17 = 0.5; b = 0.9·1 + 0.5 = 1.4; θ = 0.67 − 0.7·(0.5 + 1.26) = −0.562
        let c = config(OuterOptimizerKind::Nesterov, 0.7, 0.9);
        let mut outer = Outer::start(&[2.0]);
        outer.step(&[1.0], &c);
        assert!((outer.anchor[0] - 0.67).abs() < 1e-6, "{:?}", outer.anchor);
        assert!((outer.momentum[0] - 1.0).abs() < 1e-6);
        outer.step(&[0.17], &c);
        assert!(
            (outer.momentum[0] - 1.4).abs() < 1e-6,
            "{:?}",
            outer.momentum
        );
        assert!((outer.anchor[0] + 0.562).abs() < 1e-6, "{:?}", outer.anchor);
    }

    #[test]
    fn heavy_ball_momentum_accumulates_across_steps() {
        let c = config(OuterOptimizerKind::Sgd, 0.5, 0.5);
        let mut outer = Outer::start(&[0.0]);
        // The mix sits one below the anchor each time: the velocity goes 1, 1.5, 1.75.
        for expected in [1.0, 1.5, 1.75] {
            let mixed = [outer.anchor[0] - 1.0];
            let before = outer.anchor[0];
            outer.step(&mixed, &c);
            assert!((outer.momentum[0] - expected).abs() < 1e-6);
            assert!((before - outer.anchor[0] - 0.5 * expected).abs() < 1e-6);
        }
    }

    #[test]
    fn the_pseudo_gradient_is_the_anchor_minus_the_parameters() {
        assert_eq!(pseudo_gradient(&[1.0, 2.0], &[0.5, 3.0]), vec![0.5, -1.0]);
    }

    proptest! {
        /// Whatever the values, the step is the f64 formula rounded once per output.
        #[test]
        fn the_step_is_the_f64_formula_rounded_once(
            values in proptest::collection::vec((-10f32..10.0, -1f32..1.0, -10f32..10.0), 1..64),
            lr in 0.01f64..2.0,
            mu in 0.0f64..0.99,
            nesterov: bool,
        ) {
            let optimizer = if nesterov { OuterOptimizerKind::Nesterov } else { OuterOptimizerKind::Sgd };
            let c = config(optimizer, lr, mu);
            let mut anchor: Vec<f32> = values.iter().map(|v| v.0).collect();
            let mut momentum: Vec<f32> = values.iter().map(|v| v.1).collect();
            let mixed: Vec<f32> = values.iter().map(|v| v.2).collect();
            outer_step(&mut anchor, &mut momentum, &mixed, &c);
            for (i, (a, m, x)) in values.iter().enumerate() {
                let g = f64::from(*a) - f64::from(*x);
                let v = mu * f64::from(*m) + g;
                let u = if nesterov { g + mu * v } else { v };
                prop_assert_eq!(momentum[i], v as f32);
                prop_assert_eq!(anchor[i], (f64::from(*a) - lr * u) as f32);
            }
        }
    }
}
