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

/// Member `id` of a logistic regression whose shard, 32 examples, is every mini-batch, so that
/// members' different shuffles draw alike. Each inits its own model, as each process does: the
/// same values (the same seed), but burn draws every parameter's id at random.
fn member(id: u32, config: &MemberConfig) -> Member<Cpu, ImageClassification> {
    let task = Arc::new(ImageClassification {
        model: ModelKind::LogisticRegression,
    });
    let data = Arc::new(crate::data::embedded().train);
    let device = Default::default();
    Cpu::seed(&device, 1);
    Member::new(
        id,
        config.clone(),
        task.clone(),
        task.init::<Cpu>(&data, &device),
        data,
        (0..32).collect(),
        device,
    )
    .unwrap()
}

/// A member that takes a neighbour's parameters and optimizer state steps as the neighbour does;
/// with the parameters alone, a fresh Adam's first step moves every parameter by the whole
/// learning rate, and the two part.
#[test]
fn a_member_given_a_neighbours_optimizer_state_steps_as_that_neighbour_does() {
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
        overlap: false,
    };
    let member = |id| member(id, &config);
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

/// An exchange with no one on it: a member without neighbours still takes its outer steps.
struct Alone;

impl crate::algorithms::Exchange for Alone {
    fn post_round(
        &mut self,
        _: u64,
        _: crate::algorithms::Purpose,
        _: Vec<(murmur_core::topology::MemberId, crate::algorithms::Payload)>,
    ) {
    }

    async fn collect_round(
        &mut self,
        _: u64,
        _: crate::algorithms::Purpose,
        _: &[murmur_core::topology::MemberId],
    ) -> Vec<(murmur_core::topology::MemberId, crate::algorithms::Payload)> {
        Vec::new()
    }
}

/// D-PSGD with SGD inside and a Nesterov outer step (lr 0.7, momentum 0.9) every 3 steps.
fn outer_every_3() -> MemberConfig {
    MemberConfig {
        algorithm: AlgorithmKind::Dpsgd,
        averaging: Averaging::Every(3),
        compression: Compression::None,
        optimizer: OptimizerKind::Sgd,
        momentum: 0.0,
        learning_rate: 0.05,
        batch_size: 32,
        seed: 1,
        group_size: 2,
        max_staleness: 1,
        outer: Some(crate::algorithms::OuterConfig {
            local_steps: 3,
            optimizer: murmur_core::api::OuterOptimizerKind::Nesterov,
            learning_rate: 0.7,
            momentum: 0.9,
            overlap_steps: 1,
        }),
        overlap: false,
    }
}

/// With outer steps, a member that takes a neighbour's transferable state (parameters, anchor,
/// outer momentum) steps as that neighbour does; one given the parameters alone restarts its
/// anchor there and parts from it at the next outer step.
#[test]
fn with_outer_steps_a_member_given_a_neighbours_state_steps_as_that_neighbour_does() {
    use crate::algorithms::Neighbourhood;
    let config = outer_every_3();
    let member = |id| member(id, &config);
    let hood = Neighbourhood {
        me: 0,
        version: 1,
        self_weight: 1.0,
        neighbours: Vec::new(),
        clique_mates: Vec::new(),
        edges: Vec::new(),
        members: vec![0],
        one_peer_schedule: false,
    };
    let run = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let steps = |m: &mut Member<Cpu, ImageClassification>, from: u64, to: u64| {
        for step in from..to {
            run.block_on(m.step(step, &hood, &mut Alone)).unwrap();
        }
    };
    let mut neighbour = member(0);
    // Two outer steps and one local step into the third round.
    steps(&mut neighbour, 0, 7);
    let state = neighbour.transferable_state();
    assert_eq!(state.len(), 3 * neighbour.layout().len());
    let mut joiner = member(1);
    joiner.set_transferable_state(&state).unwrap();
    let mut fresh = member(2);
    fresh.set_parameters(&neighbour.parameters()).unwrap();
    for m in [&mut neighbour, &mut joiner, &mut fresh] {
        steps(m, 7, 9);
    }
    let expected = neighbour.parameters();
    assert!(largest_difference(&joiner.parameters(), &expected) < 1e-6);
    assert!(largest_difference(&fresh.parameters(), &expected) > 1e-3);
    // A state of another length changes nothing.
    let before = joiner.transferable_state();
    let e = joiner.set_transferable_state(&expected).unwrap_err();
    assert!(e.to_string().contains("where this member takes"), "{e}");
    assert_eq!(joiner.transferable_state(), before);
}

/// With outer steps, a round that expected a neighbour and heard none leaves the anchor where it
/// was and starts the next local steps from it, exchanged in step or overlapped: an outer step
/// on the member's own drift would carry it along its own data (a member left alone after its
/// neighbours finished fell from 93% to 32%). A member with no neighbours at all still takes
/// its outer steps (the test above).
#[test]
fn with_outer_steps_a_round_that_hears_no_neighbour_keeps_the_anchor() {
    use crate::algorithms::Neighbourhood;
    let hood = Neighbourhood {
        me: 0,
        version: 1,
        self_weight: 0.5,
        neighbours: vec![(1, 0.5)],
        clique_mates: Vec::new(),
        edges: vec![(0, 1)],
        members: vec![0, 1],
        one_peer_schedule: false,
    };
    let run = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for overlap in [false, true] {
        let config = MemberConfig {
            overlap,
            ..outer_every_3()
        };
        let mut m = member(0, &config);
        let start = m.parameters();
        // Two rounds; overlapped, the second is mixed in one step after it was posted.
        let steps = if overlap { 7 } else { 6 };
        for step in 0..steps {
            run.block_on(m.step(step, &hood, &mut Alone)).unwrap();
        }
        // Both heard nobody: the anchor is where it started.
        let state = m.transferable_state();
        let n = m.layout().len();
        assert_eq!(&state[n..2 * n], &start[..], "overlap {overlap}");
        if !overlap {
            // In step, the parameters are the anchor after a round.
            assert_eq!(m.parameters(), start);
        }
    }
}
