//! Speed targets of the topology engine (issue: foundation):
//! - Greedy Swap, 1000 members, 10 classes, 1000 swap steps: under 1 s.
//! - Repair of a 10 000-member ring (one removal, one join): under 1 ms.
//! - Every builder linear in its edges (see the per-edge throughput across sizes), except the
//!   swap search, which costs O(steps * clique_size^2 * classes) on top.

use std::hint::black_box;

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use murmur_core::api::TopologyKind;
use murmur_core::topology::dcliques::{greedy_swap, one_class_per_member};
use murmur_core::topology::{BuildSpec, MemberProfile, build};

fn profiles(n: usize) -> Vec<MemberProfile> {
    MemberProfile::from_histograms(one_class_per_member(n, 10, 50.0))
}

fn greedy_swap_1000(c: &mut Criterion) {
    let hs = one_class_per_member(1000, 10, 50.0);
    let refs: Vec<&[f64]> = hs.iter().map(Vec::as_slice).collect();
    c.bench_function("greedy_swap/1000 members, 10 classes, 1000 steps", |b| {
        b.iter(|| greedy_swap(black_box(&refs), 10, 1000, 7))
    });
}

fn ring_repair_10k(c: &mut Criterion) {
    let ring = build(&BuildSpec::new(TopologyKind::Ring), &profiles(10_000)).unwrap();
    c.bench_function("repair/ring 10000: remove one member", |b| {
        b.iter_batched(
            || ring.clone(),
            |mut t| {
                t.remove_member(black_box(4_321)).unwrap();
                t // dropped outside the timed section
            },
            BatchSize::LargeInput,
        )
    });
    c.bench_function("repair/ring 10000: add one member", |b| {
        b.iter_batched(
            || ring.clone(),
            |mut t| {
                t.add_member(MemberProfile::bare(black_box(20_000)))
                    .unwrap();
                t
            },
            BatchSize::LargeInput,
        )
    });
    let dc = build(&BuildSpec::new(TopologyKind::DCliques), &profiles(1_000)).unwrap();
    c.bench_function("repair/dcliques 1000: remove one member", |b| {
        b.iter_batched(
            || dc.clone(),
            |mut t| {
                t.remove_member(black_box(500)).unwrap();
                t
            },
            BatchSize::LargeInput,
        )
    });
}

fn builders(c: &mut Criterion) {
    let mut group = c.benchmark_group("build");
    for kind in [
        TopologyKind::Ring,
        TopologyKind::Exponential,
        TopologyKind::DCliques,
        TopologyKind::ProxyClumps,
        TopologyKind::FullyConnected,
    ] {
        for n in [100usize, 1_000, 10_000] {
            if kind == TopologyKind::FullyConnected && n > 1_000 {
                continue;
            }
            let members = profiles(n);
            let mut spec = BuildSpec::new(kind);
            // The swap search is measured on its own above; here only the graph construction.
            spec.swap_steps = 0;
            let edges = build(&spec, &members).unwrap().graph.edge_count();
            group.throughput(Throughput::Elements(edges as u64));
            group.bench_with_input(
                BenchmarkId::new(format!("{kind:?}"), n),
                &members,
                |b, m| b.iter(|| build(&spec, black_box(m)).unwrap()),
            );
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(3));
    targets = greedy_swap_1000, ring_repair_10k, builders
}
criterion_main!(benches);
