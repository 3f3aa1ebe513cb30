//! The simulator end to end, on small jobs: same member code, in-process exchange.

use murmur_core::api::{
    CliqueMix, InterClique, ModelKind, OptimizerKind, OuterOptimizerKind, TopologyKind,
};
use murmur_core::topology::{GraphChoice, TopologyOptions};
use murmur_trainer::algorithms::{AutoPolicy, Averaging, OuterConfig};
use murmur_trainer::compression::Compression;
use murmur_trainer::data::{self, partition::Partition};
use murmur_trainer::simulator::{SimulationConfig, simulate};

type B = murmur_trainer::backend::Cpu;

fn config(
    members: usize,
    topologies: Vec<GraphChoice>,
    partition: Partition,
    steps: u64,
) -> SimulationConfig {
    SimulationConfig {
        members,
        topologies,
        algorithm: None,
        partition,
        model: ModelKind::LogisticRegression,
        steps,
        eval_every: steps,
        batch_size: 16,
        learning_rate: 0.05,
        optimizer: OptimizerKind::Sgd,
        momentum: 0.9,
        averaging: Averaging::Every(1),
        compression: Compression::None,
        seed: 3,
        topology: TopologyOptions {
            clique_size: 5,
            inter_clique: Some(InterClique::SmallWorld),
            clumps: None,
            clique_mix: CliqueMix::Heterogeneous,
            zone_aware: false,
            zone_mix_skew: murmur_core::topology::dcliques::ZONE_MIX_SKEW,
            group_size: 3,
        },
        proxy_warmup_steps: 5,
        threads: 2,
        max_staleness: 8,
        slow: Vec::new(),
        target_accuracy: None,
        consensus_only: false,
        target_consensus: None,
        departed: 0,
        zones: 0,
        outer: None,
        overlap: false,
    }
}

#[test]
fn fully_connected_dpsgd_keeps_every_member_identical() {
    let data = data::embedded();
    let cfg = config(
        6,
        vec![GraphChoice::Family(TopologyKind::FullyConnected)],
        Partition::ClassesPerMember { k: 1 },
        20,
    );
    let results = simulate::<B>(&cfg, &data, &Default::default(), |_, _| {}).unwrap();
    let last = results[0].curve.last().unwrap();
    assert_eq!(last.step, 20);
    // W = 1/n everywhere: after each round all members hold the exact average.
    assert!(
        last.consensus_distance < 1e-5,
        "consensus distance {}",
        last.consensus_distance
    );
    assert!(last.min_accuracy == last.max_accuracy);
    assert_eq!(
        results[0].curve[0].step, 0,
        "curves start at the shared initial model"
    );
}

#[test]
fn every_topology_and_codec_trains() {
    let data = data::embedded();
    let topologies = vec![
        GraphChoice::Family(TopologyKind::DCliques),
        GraphChoice::Family(TopologyKind::ProxyClumps),
        GraphChoice::Family(TopologyKind::Ring),
        GraphChoice::Moshpit,
        GraphChoice::RandomRegular { degree: 3 },
        GraphChoice::Family(TopologyKind::Exponential),
        GraphChoice::Family(TopologyKind::ExponentialOnePeer),
    ];
    let mut cfg = config(10, topologies, Partition::Iid, 30);
    cfg.compression = Compression::Int8;
    let results = simulate::<B>(&cfg, &data, &Default::default(), |_, _| {}).unwrap();
    assert_eq!(results.len(), 7);
    for r in &results {
        let (first, last) = (&r.curve[0], r.curve.last().unwrap());
        assert!(
            last.mean_accuracy > first.mean_accuracy + 0.3,
            "{}: {} -> {}",
            r.topology,
            first.mean_accuracy,
            last.mean_accuracy
        );
        assert!(r.bytes_sent > 0, "{} sent nothing", r.topology);
    }
    // int8 sends about a quarter of f32 bytes.
    let dense = simulate::<B>(
        &config(
            10,
            vec![GraphChoice::Family(TopologyKind::Ring)],
            Partition::Iid,
            30,
        ),
        &data,
        &Default::default(),
        |_, _| {},
    )
    .unwrap();
    let ring_int8 = results.iter().find(|r| r.topology == "ring").unwrap();
    let ratio = ring_int8.bytes_sent as f64 / dense[0].bytes_sent as f64;
    assert!((0.25..0.27).contains(&ratio), "int8/f32 byte ratio {ratio}");
}

#[test]
fn one_peer_exponential_sends_one_model_a_round_and_trains() {
    let data = data::embedded();
    let cfg = config(
        8,
        vec![
            GraphChoice::Family(TopologyKind::Exponential),
            GraphChoice::Family(TopologyKind::ExponentialOnePeer),
        ],
        Partition::ClassesPerMember { k: 2 },
        60,
    );
    let results = simulate::<B>(&cfg, &data, &Default::default(), |_, _| {}).unwrap();
    let (full, one) = (&results[0], &results[1]);
    assert_eq!(one.topology, "exponential-one-peer");
    // 8 members on the exponential graph have 5 neighbours each (offsets 1, 2 both ways, and 4):
    // D-PSGD sends 5 models a round, the one-peer schedule 1.
    assert_eq!(full.bytes_sent, 5 * one.bytes_sent);
    for r in [full, one] {
        let (first, last) = (&r.curve[0], r.curve.last().unwrap());
        assert!(
            last.mean_accuracy > first.mean_accuracy + 0.3,
            "{}: {} -> {}",
            r.topology,
            first.mean_accuracy,
            last.mean_accuracy
        );
    }
}

/// `averageEvery: auto` follows the skew: on D-Cliques, clique averaging keeps a clique's models
/// alike and its parameter edges go quiet; on a ring at a target no edge can meet, every edge
/// averages at every step.
#[test]
fn auto_averaging_saves_bytes_where_models_agree_and_none_where_they_cannot() {
    let data = data::embedded();
    let run = |topology: GraphChoice, averaging: Averaging| {
        let mut cfg = config(10, vec![topology], Partition::ClassesPerMember { k: 2 }, 60);
        cfg.topology.inter_clique = Some(InterClique::Ring);
        cfg.averaging = averaging;
        simulate::<B>(&cfg, &data, &Default::default(), |_, _| {})
            .unwrap()
            .remove(0)
    };
    let every_step = run(
        GraphChoice::Family(TopologyKind::DCliques),
        Averaging::Every(1),
    );
    let auto = run(
        GraphChoice::Family(TopologyKind::DCliques),
        Averaging::Auto(AutoPolicy::default()),
    );
    assert!(
        auto.bytes_sent < every_step.bytes_sent * 3 / 4,
        "auto {} bytes against {} averaging every step",
        auto.bytes_sent,
        every_step.bytes_sent
    );
    let (first, last) = (&auto.curve[0], auto.curve.last().unwrap());
    assert!(
        last.mean_accuracy > first.mean_accuracy + 0.3,
        "auto: {} -> {}",
        first.mean_accuracy,
        last.mean_accuracy
    );

    let ring = run(GraphChoice::Family(TopologyKind::Ring), Averaging::Every(1));
    let strict = Averaging::Auto(AutoPolicy {
        max_every: 16,
        target_skew: 1e-9,
    });
    let ring_strict = run(GraphChoice::Family(TopologyKind::Ring), strict);
    // An edge's first gap may double once from the common start; after that, every step. The
    // trailers add a few bytes.
    assert!(
        ring_strict.bytes_sent as f64 > 0.95 * ring.bytes_sent as f64,
        "strict auto {} bytes against {} averaging every step",
        ring_strict.bytes_sent,
        ring.bytes_sent
    );
}

#[test]
fn gossip_top_k_and_adam_train_too() {
    let data = data::embedded();
    let mut cfg = config(
        8,
        vec![GraphChoice::Family(TopologyKind::Ring)],
        Partition::Iid,
        30,
    );
    cfg.algorithm = Some(murmur_core::api::AlgorithmKind::Gossip);
    cfg.compression = Compression::TopK { ratio: 0.2 };
    cfg.optimizer = OptimizerKind::Adam;
    cfg.learning_rate = 0.005;
    let r = &simulate::<B>(&cfg, &data, &Default::default(), |_, _| {}).unwrap()[0];
    assert!(
        r.curve.last().unwrap().mean_accuracy > 0.6,
        "{:?}",
        r.curve.last()
    );
}

#[test]
fn same_seed_same_curves() {
    let data = data::embedded();
    let cfg = config(
        5,
        vec![GraphChoice::Family(TopologyKind::DCliques)],
        Partition::ClassesPerMember { k: 2 },
        10,
    );
    let a = simulate::<B>(&cfg, &data, &Default::default(), |_, _| {}).unwrap();
    let b = simulate::<B>(&cfg, &data, &Default::default(), |_, _| {}).unwrap();
    assert_eq!(a[0].curve, b[0].curve);
}

#[test]
fn the_thread_count_changes_nothing_but_the_wall_time() {
    let data = data::embedded();
    let mut cfg = config(
        10,
        vec![
            GraphChoice::Family(TopologyKind::DCliques),
            GraphChoice::Family(TopologyKind::Ring),
        ],
        Partition::ClassesPerMember { k: 2 },
        12,
    );
    cfg.model = ModelKind::Mlp;
    cfg.eval_every = 4;
    let mut curves = Vec::new();
    for threads in [1, 2, 5] {
        cfg.threads = threads;
        let results = simulate::<B>(&cfg, &data, &Default::default(), |_, _| {}).unwrap();
        curves.push(
            results
                .into_iter()
                .map(|r| (r.topology, r.bytes_sent, r.curve))
                .collect::<Vec<_>>(),
        );
    }
    assert_eq!(curves[0], curves[1], "1 thread against 2");
    assert_eq!(curves[0], curves[2], "1 thread against 5");
}

#[test]
fn a_slow_member_holds_up_synchronous_rounds_but_not_asynchronous_gossip() {
    let data = data::embedded();
    let mut cfg = config(
        8,
        vec![GraphChoice::Family(TopologyKind::Ring)],
        Partition::Iid,
        40,
    );
    cfg.eval_every = 20;
    cfg.slow = vec![(3, 4.0)];
    cfg.target_accuracy = Some(0.5);
    let mut sync = cfg.clone();
    sync.algorithm = Some(murmur_core::api::AlgorithmKind::Dpsgd);
    let sync = &simulate::<B>(&sync, &data, &Default::default(), |_, _| {}).unwrap()[0];
    let last = sync.curve.last().unwrap();
    // Every round waits for member 3: 40 steps take 160 steps of a full-speed member.
    assert_eq!((last.step, last.time), (40, 160.0));
    cfg.algorithm = Some(murmur_core::api::AlgorithmKind::AsyncGossip);
    let asynchronous = &simulate::<B>(&cfg, &data, &Default::default(), |_, _| {}).unwrap()[0];
    let times: Vec<f64> = asynchronous.curve.iter().map(|p| p.time).collect();
    assert_eq!(times, vec![0.0, 20.0, 40.0]);
    let last = asynchronous.curve.last().unwrap();
    assert!(last.mean_accuracy > 0.6, "{last:?}");
    assert!(last.consensus_distance < 1.0, "{last:?}");
    let reached = asynchronous.time_to_target.expect("reached 50%");
    assert!(
        reached < sync.time_to_target.expect("reached 50%"),
        "async {reached} against sync {:?}",
        sync.time_to_target
    );
    // One request a step per member at most, each a model; replies as many.
    assert!(asynchronous.bytes_sent > 0);
}

#[test]
fn asynchronous_gossip_is_deterministic_and_mixes_models() {
    let data = data::embedded();
    let mut cfg = config(
        6,
        vec![GraphChoice::Family(TopologyKind::Ring)],
        Partition::ClassesPerMember { k: 2 },
        30,
    );
    cfg.algorithm = Some(murmur_core::api::AlgorithmKind::AsyncGossip);
    cfg.eval_every = 10;
    cfg.slow = vec![(0, 2.5)];
    let a = simulate::<B>(&cfg, &data, &Default::default(), |_, _| {}).unwrap();
    cfg.threads = 1;
    let b = simulate::<B>(&cfg, &data, &Default::default(), |_, _| {}).unwrap();
    assert_eq!(a[0].curve, b[0].curve);
    // Without exchanges, members on two classes each stay far apart; with them, they meet.
    let mut alone = cfg.clone();
    alone.averaging = Averaging::Every(1_000_000);
    let alone = simulate::<B>(&alone, &data, &Default::default(), |_, _| {}).unwrap();
    let mixed = a[0].curve.last().unwrap();
    let apart = alone[0].curve.last().unwrap();
    assert_eq!(alone[0].bytes_sent, 0);
    assert!(
        mixed.consensus_distance < 0.5 * apart.consensus_distance,
        "mixed {} apart {}",
        mixed.consensus_distance,
        apart.consensus_distance
    );
    assert!(
        mixed.mean_accuracy > apart.mean_accuracy + 0.1,
        "{mixed:?} {apart:?}"
    );
}

#[test]
fn asynchronous_gossip_refuses_top_k_auto_averaging_and_bad_slow_members() {
    let data = data::embedded();
    let mut cfg = config(
        4,
        vec![GraphChoice::Family(TopologyKind::Ring)],
        Partition::Iid,
        2,
    );
    cfg.algorithm = Some(murmur_core::api::AlgorithmKind::AsyncGossip);
    cfg.compression = Compression::TopK { ratio: 0.1 };
    let err = simulate::<B>(&cfg, &data, &Default::default(), |_, _| {}).unwrap_err();
    assert!(err.to_string().contains("top-k"), "{err}");
    cfg.compression = Compression::Int8;
    cfg.averaging = Averaging::Auto(AutoPolicy::from_spec(None));
    let err = simulate::<B>(&cfg, &data, &Default::default(), |_, _| {}).unwrap_err();
    assert!(err.to_string().contains("auto"), "{err}");
    cfg.averaging = Averaging::Every(1);
    cfg.slow = vec![(9, 2.0)];
    let err = simulate::<B>(&cfg, &data, &Default::default(), |_, _| {}).unwrap_err();
    assert!(err.to_string().contains("slow member 9"), "{err}");
}

#[test]
fn averaging_alone_is_exact_in_d_rounds_on_a_full_moshpit_grid_and_slower_with_holes() {
    let data = data::embedded();
    let rounds = |members: usize, departed: usize, choice: GraphChoice, algorithm| {
        let mut cfg = config(members, vec![choice], Partition::Iid, 40);
        cfg.algorithm = Some(algorithm);
        cfg.eval_every = 1;
        cfg.consensus_only = true;
        cfg.target_consensus = Some(1e-6);
        cfg.departed = departed;
        let r = simulate::<B>(&cfg, &data, &Default::default(), |_, _| {})
            .unwrap()
            .remove(0);
        // Members start apart (each its own random model), and nothing but mixing moves them.
        assert!(r.curve[0].consensus_distance > 0.5, "{:?}", r.curve[0]);
        assert_eq!(
            r.curve.last().unwrap().mean_accuracy,
            0.0,
            "accuracy is not measured"
        );
        r.steps_to_consensus
    };
    use murmur_core::api::AlgorithmKind::{Dpsgd, Moshpit};
    // A 3x3x3 grid (group size 3): the exact average after 3 rounds.
    assert_eq!(rounds(27, 0, GraphChoice::Moshpit, Moshpit), Some(3));
    // Two of the 27 gone: the groups are uneven, the average is no longer exact in 3 rounds.
    let holes = rounds(25, 2, GraphChoice::Moshpit, Moshpit).expect("reached in 40 rounds");
    assert!(holes > 3, "{holes}");
    // D-PSGD on a ring of 25 is far from it after 40 rounds.
    assert_eq!(
        rounds(25, 0, GraphChoice::Family(TopologyKind::Ring), Dpsgd),
        None
    );
}

#[test]
fn departed_members_are_refused_on_topologies_built_from_data() {
    let data = data::embedded();
    let mut cfg = config(
        8,
        vec![GraphChoice::Family(TopologyKind::DCliques)],
        Partition::Iid,
        2,
    );
    cfg.departed = 2;
    let err = simulate::<B>(&cfg, &data, &Default::default(), |_, _| {}).unwrap_err();
    assert!(err.to_string().contains("--departed"), "{err}");
}

#[test]
fn zone_aware_cliques_keep_clique_traffic_inside_zones() {
    let data = data::embedded();
    let run = |zone_aware| {
        let mut cfg = config(
            20,
            vec![GraphChoice::Family(TopologyKind::DCliques)],
            Partition::ClassesPerMember { k: 2 },
            10,
        );
        cfg.zones = 2;
        cfg.topology.zone_aware = zone_aware;
        simulate::<B>(&cfg, &data, &Default::default(), |_, _| {})
            .unwrap()
            .remove(0)
    };
    let (blind, aware) = (run(false), run(true));
    let (blind_cross, aware_cross) = (
        blind.cross_zone_bytes.unwrap(),
        aware.cross_zone_bytes.unwrap(),
    );
    assert!(aware_cross > 0, "bridges still cross");
    assert!(
        blind_cross >= 3 * aware_cross,
        "{blind_cross} cross-zone bytes without zones, {aware_cross} with"
    );
    // The same graph shape and traffic, only placed differently.
    assert_eq!(blind.bytes_sent, aware.bytes_sent);
    assert_eq!(blind.edges, aware.edges);
    // Without zones nothing is counted.
    let mut cfg = config(
        4,
        vec![GraphChoice::Family(TopologyKind::Ring)],
        Partition::Iid,
        2,
    );
    cfg.zones = 0;
    let r = simulate::<B>(&cfg, &data, &Default::default(), |_, _| {}).unwrap();
    assert_eq!(r[0].cross_zone_bytes, None);
}

fn outer(local_steps: u64, optimizer: OuterOptimizerKind, lr: f64, mu: f64) -> OuterConfig {
    OuterConfig {
        local_steps,
        optimizer,
        learning_rate: lr,
        momentum: mu,
        overlap_steps: 1,
    }
}

/// With SGD, learning rate 1 and no momentum, the anchor becomes the mix: the same run as
/// averaging every `localSteps` steps (with no inner momentum, which an outer step restarts).
#[test]
fn an_outer_sgd_step_of_one_without_momentum_is_averaging_every_local_steps() {
    let data = data::embedded();
    let mut plain = config(
        6,
        vec![GraphChoice::Family(TopologyKind::Ring)],
        Partition::ClassesPerMember { k: 2 },
        24,
    );
    plain.eval_every = 4;
    plain.momentum = 0.0;
    plain.averaging = Averaging::Every(4);
    let mut outer_cfg = plain.clone();
    outer_cfg.averaging = Averaging::Every(1);
    outer_cfg.outer = Some(outer(4, OuterOptimizerKind::Sgd, 1.0, 0.0));
    let run = |cfg: &SimulationConfig| simulate::<B>(cfg, &data, &Default::default(), |_, _| {});
    let (a, b) = (run(&plain).unwrap(), run(&outer_cfg).unwrap());
    assert_eq!(a[0].curve.len(), b[0].curve.len());
    for (p, o) in a[0].curve.iter().zip(&b[0].curve) {
        assert_eq!(p.step, o.step);
        assert!(
            (p.mean_accuracy - o.mean_accuracy).abs() < 1e-9,
            "step {}: {} against {}",
            p.step,
            p.mean_accuracy,
            o.mean_accuracy
        );
        assert!((p.consensus_distance - o.consensus_distance).abs() < 1e-5);
    }
    assert_eq!(a[0].bytes_sent, b[0].bytes_sent);
    // Nesterov's outer step is not averaging: the same rounds, another run.
    outer_cfg.outer = Some(outer(4, OuterOptimizerKind::Nesterov, 0.7, 0.9));
    let c = run(&outer_cfg).unwrap();
    assert_eq!(c[0].bytes_sent, a[0].bytes_sent);
    assert_ne!(
        c[0].curve.last().unwrap().consensus_distance,
        a[0].curve.last().unwrap().consensus_distance
    );
}

/// Outer steps on every synchronous algorithm and a spread of graphs and codecs: each trains,
/// and sends a round's bytes every `localSteps` steps, not every step. The run's last step
/// always ends in a round, even when the steps are not a multiple of `localSteps`.
#[test]
fn outer_steps_train_every_algorithm_with_a_round_every_local_steps() {
    use murmur_core::api::AlgorithmKind;
    let data = data::embedded();
    for (algorithm, topology) in [
        (
            AlgorithmKind::Dpsgd,
            GraphChoice::Family(TopologyKind::Ring),
        ),
        (
            AlgorithmKind::Gossip,
            GraphChoice::Family(TopologyKind::Exponential),
        ),
        (AlgorithmKind::Moshpit, GraphChoice::Moshpit),
        (
            AlgorithmKind::CliqueAveraging,
            GraphChoice::Family(TopologyKind::DCliques),
        ),
        (
            AlgorithmKind::Dpsgd,
            GraphChoice::Family(TopologyKind::ExponentialOnePeer),
        ),
    ] {
        for compression in [
            Compression::None,
            Compression::Int4,
            Compression::TopK { ratio: 0.2 },
        ] {
            let mut per_step = config(10, vec![topology], Partition::Iid, 30);
            per_step.algorithm = Some(algorithm);
            per_step.compression = compression;
            let mut outer_cfg = per_step.clone();
            outer_cfg.outer = Some(outer(4, OuterOptimizerKind::Nesterov, 0.7, 0.9));
            let run = |cfg: &SimulationConfig| {
                simulate::<B>(cfg, &data, &Default::default(), |_, _| {}).unwrap()
            };
            let (dense, sparse) = (run(&per_step), run(&outer_cfg));
            let (first, last) = (&sparse[0].curve[0], sparse[0].curve.last().unwrap());
            let what = format!(
                "{algorithm:?} on {} with {compression:?}",
                sparse[0].topology
            );
            assert!(
                last.mean_accuracy > first.mean_accuracy + 0.3,
                "{what}: {} -> {}",
                first.mean_accuracy,
                last.mean_accuracy
            );
            // Rounds after steps 4, 8, .., 28 and the last (30): 8 of 30. Clique averaging's
            // per-step gradients stay (they are its point; never top-k'd), its parameters go
            // 8 times.
            let rounds = sparse[0].bytes_sent as f64 / dense[0].bytes_sent as f64;
            if algorithm == AlgorithmKind::CliqueAveraging {
                assert!(rounds < 0.85, "{what}: {rounds}");
            } else {
                assert!(
                    (8.0 / 30.0 * 0.8..8.0 / 30.0 * 1.25).contains(&rounds),
                    "{what}: byte ratio {rounds}"
                );
            }
        }
    }
}

#[test]
fn outer_steps_refuse_asynchronous_gossip_another_cadence_and_more_steps_than_the_run() {
    let data = data::embedded();
    let mut cfg = config(
        4,
        vec![GraphChoice::Family(TopologyKind::Ring)],
        Partition::Iid,
        8,
    );
    cfg.outer = Some(outer(4, OuterOptimizerKind::Nesterov, 0.7, 0.9));
    let refusal = |cfg: &SimulationConfig| {
        simulate::<B>(cfg, &data, &Default::default(), |_, _| {})
            .unwrap_err()
            .to_string()
    };
    cfg.algorithm = Some(murmur_core::api::AlgorithmKind::AsyncGossip);
    assert!(refusal(&cfg).contains("asynchronous gossip"));
    cfg.algorithm = None;
    cfg.averaging = Averaging::Every(2);
    assert!(refusal(&cfg).contains("--average-every"));
    cfg.averaging = Averaging::Every(1);
    cfg.outer = Some(outer(9, OuterOptimizerKind::Nesterov, 0.7, 0.9));
    assert!(refusal(&cfg).contains("--outer-local-steps must be from 1 to --steps (8), not 9"));
}

/// Overlap moves where a member waits, not what training reaches where the local gradients
/// are unbiased: outer rounds mixed one local step late, and clique averaging's, D-PSGD's and
/// gossip's rounds exchanged beside the step's gradient (under clique-averaged gradients or IID
/// shards), each end within 1.5 points of the same run without; an overlapped run is the same
/// whatever the thread count; a whole round's delay still trains.
#[test]
fn overlapped_rounds_train_as_well_and_deterministically() {
    use murmur_core::api::AlgorithmKind;
    let data = data::embedded();
    let skewed = Partition::ClassesPerMember { k: 2 };
    let outer8 = Some(outer(8, OuterOptimizerKind::Nesterov, 0.7, 0.9));
    for (algorithm, topology, partition, outer) in [
        (
            AlgorithmKind::Dpsgd,
            GraphChoice::Family(TopologyKind::DCliques),
            skewed,
            outer8,
        ),
        (
            AlgorithmKind::CliqueAveraging,
            GraphChoice::Family(TopologyKind::DCliques),
            skewed,
            None,
        ),
        (
            AlgorithmKind::Dpsgd,
            GraphChoice::Family(TopologyKind::Ring),
            Partition::Iid,
            None,
        ),
        (
            AlgorithmKind::Gossip,
            GraphChoice::Family(TopologyKind::Exponential),
            Partition::Iid,
            None,
        ),
    ] {
        let mut plain = config(10, vec![topology], partition, 160);
        plain.algorithm = Some(algorithm);
        plain.outer = outer;
        let mut overlapped = plain.clone();
        overlapped.overlap = true;
        let run = |cfg: &SimulationConfig| {
            simulate::<B>(cfg, &data, &Default::default(), |_, _| {}).unwrap()
        };
        let (a, b) = (run(&plain), run(&overlapped));
        let what = format!(
            "{algorithm:?} on {}, outer {}",
            b[0].topology,
            outer.is_some()
        );
        let end = |r: &[murmur_trainer::simulator::TopologyResult]| {
            r[0].curve.last().unwrap().mean_accuracy
        };
        let (a_end, b_end) = (end(&a), end(&b));
        assert!(b_end > 0.6, "{what}: {b_end}");
        assert!(
            (a_end - b_end).abs() <= 0.015,
            "{what}: {a_end} against {b_end} overlapped"
        );
        // The same rounds, the same bytes.
        assert_eq!(a[0].bytes_sent, b[0].bytes_sent, "{what}");
        overlapped.threads = 1;
        assert_eq!(
            end(&run(&overlapped)),
            b_end,
            "{what}: one thread against two"
        );
        if let Some(o) = outer {
            overlapped.outer = Some(OuterConfig {
                overlap_steps: o.local_steps,
                ..o
            });
            let late = end(&run(&overlapped));
            assert!(late > 0.6, "{what}, a round late: {late}");
        }
    }
    // Rounds of a fixed cadence only.
    let mut cfg = config(
        4,
        vec![GraphChoice::Family(TopologyKind::Ring)],
        Partition::Iid,
        8,
    );
    cfg.overlap = true;
    cfg.averaging = Averaging::Auto(AutoPolicy::default());
    let refusal = simulate::<B>(&cfg, &data, &Default::default(), |_, _| {}).unwrap_err();
    assert!(refusal.to_string().contains("--overlap"), "{refusal}");
}
