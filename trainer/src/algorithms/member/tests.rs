use std::sync::Arc;

use burn::tensor::backend::Backend;
use murmur_core::api::{AlgorithmKind, ModelKind, OptimizerKind};

use super::{Member, MemberConfig};
use crate::algorithms::cadence::Averaging;
use crate::backend::Cpu;
use crate::compression::Compression;
use crate::task::Task;
use crate::task::images::ImageClassification;

fn largest_difference(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// A member that takes a neighbour's parameters and optimizer state steps as the neighbour does;
/// with the parameters alone, a fresh Adam's first step moves every parameter by the whole
/// learning rate, and the two part.
#[test]
fn a_member_given_a_neighbours_optimizer_state_steps_as_that_neighbour_does() {
    let task = Arc::new(ImageClassification {
        model: ModelKind::LogisticRegression,
    });
    let data = Arc::new(crate::data::embedded().train);
    let config = MemberConfig {
        algorithm: AlgorithmKind::Dpsgd,
        averaging: Averaging::Every(1),
        compression: Compression::None,
        optimizer: OptimizerKind::Adam,
        momentum: 0.0,
        learning_rate: 0.01,
        batch_size: 32,
        seed: 1,
        group_size: 2,
        max_staleness: 1,
        outer: None,
    };
    let device = Default::default();
    // The whole shard is every mini-batch, so the members' different shuffles draw alike.
    let shard: Vec<usize> = (0..32).collect();
    // Each member inits its own model, as each process does: the same values (the same seed),
    // but burn draws every parameter's id at random.
    let member = |id| {
        Cpu::seed(&device, 1);
        Member::<Cpu, ImageClassification>::new(
            id,
            config.clone(),
            task.clone(),
            task.init::<Cpu>(&data, &device),
            data.clone(),
            shard.clone(),
            device,
        )
        .unwrap()
    };
    let mut neighbour = member(0);
    for _ in 0..5 {
        neighbour.local_step();
    }
    let trained = neighbour.parameters();
    let mut joiner = member(1);
    joiner.set_parameters(&trained).unwrap();
    joiner
        .set_optimizer_state(neighbour.optimizer_state().unwrap())
        .unwrap();
    let mut fresh = member(2);
    fresh.set_parameters(&trained).unwrap();
    for m in [&mut neighbour, &mut joiner, &mut fresh] {
        m.local_step();
    }
    let expected = neighbour.parameters();
    assert!(largest_difference(&joiner.parameters(), &expected) < 1e-5);
    assert!(largest_difference(&fresh.parameters(), &expected) > 1e-3);
}
