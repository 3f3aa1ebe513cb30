//! Builder, weight, measure and repair tests, with property tests over random membership changes.

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::dcliques::{clique_skews, one_class_per_member};
use super::*;

fn bare(n: u32) -> Vec<MemberProfile> {
    (0..n).map(MemberProfile::bare).collect()
}

fn spec(kind: TopologyKind) -> BuildSpec {
    BuildSpec::new(kind)
}

/// W is symmetric, non-negative and doubly stochastic; the document agrees and passes its checks.
fn assert_weights_valid(t: &Topology) {
    let w = t.weights();
    for (i, row) in w.rows() {
        let total: f64 = row.self_weight + row.neighbours.iter().map(|(_, x)| x).sum::<f64>();
        assert!((total - 1.0).abs() < 1e-9, "row {i} sums to {total}");
        assert!(row.self_weight >= -1e-12, "W_{i}{i} = {}", row.self_weight);
        for &(j, x) in &row.neighbours {
            assert!(x > 0.0);
            assert!(
                (x - w.weight(j, i)).abs() < 1e-15,
                "W not symmetric at {i},{j}"
            );
        }
    }
    t.to_document(|_| None)
        .check()
        .expect("document is consistent");
}

#[test]
fn ring_has_degree_two_and_half_n_diameter() {
    let t = build(&spec(TopologyKind::Ring), &bare(10)).unwrap();
    let m = measure(&t);
    assert_eq!(
        (m.edges, m.min_degree, m.max_degree, m.diameter),
        (10, 2, 2, Some(5))
    );
    assert_eq!(m.messages_per_round, 20);
    // Spectral gap of a 10-ring with MH weights (1/3 each): 1 - (1 + 2cos(2pi/10))/3.
    let expected = 1.0 - (1.0 + 2.0 * (2.0 * std::f64::consts::PI / 10.0).cos()) / 3.0;
    assert!((m.spectral_gap.unwrap() - expected).abs() < 1e-9);
    assert_weights_valid(&t);
    for n in [1, 2, 3] {
        let t = build(&spec(TopologyKind::Ring), &bare(n)).unwrap();
        assert_eq!(t.graph.edge_count(), [0, 1, 3][n as usize - 1]);
        assert_weights_valid(&t);
    }
}

#[test]
fn fully_connected_mixes_in_one_round() {
    let t = build(&spec(TopologyKind::FullyConnected), &bare(6)).unwrap();
    let m = measure(&t);
    assert_eq!((m.edges, m.diameter), (15, Some(1)));
    assert!((m.spectral_gap.unwrap() - 1.0).abs() < 1e-9);
    assert!((t.weights().weight(0, 5) - 1.0 / 6.0).abs() < 1e-12);
}

#[test]
fn exponential_links_powers_of_two() {
    let t = build(&spec(TopologyKind::Exponential), &bare(16)).unwrap();
    // Offsets 1, 2, 4 each way and 8 (its own mirror): degree 7.
    assert!(t.graph.members().all(|m| t.graph.degree(m) == 7));
    assert!(t.graph.has_edge(0, 8) && t.graph.has_edge(0, 12) && !t.graph.has_edge(0, 3));
    assert_eq!(measure(&t).diameter, Some(2));
    assert_weights_valid(&t);
}

/// One round of the one-peer schedule over a document's members: x_i <- (x_i + x_from)/2.
fn one_peer_round(
    members: &[MemberId],
    x: &BTreeMap<MemberId, f64>,
    round: u64,
) -> BTreeMap<MemberId, f64> {
    members
        .iter()
        .map(|&m| {
            let p = one_peer(members, m, round).expect("a peer when n >= 2");
            (m, (x[&m] + x[&p.receive_from]) / 2.0)
        })
        .collect()
}

/// Every member sends once and receives once, from the one that sends to it, never itself.
fn assert_one_peer_schedule_valid(members: &[MemberId], round: u64) {
    let mut receivers = BTreeSet::new();
    for &m in members {
        let p = one_peer(members, m, round).expect("listed");
        assert_ne!(p.send_to, m);
        assert_eq!(
            one_peer(members, p.send_to, round).unwrap().receive_from,
            m,
            "round {round}"
        );
        assert!(receivers.insert(p.send_to), "{} receives twice", p.send_to);
    }
}

#[test]
fn one_peer_exponential_reaches_the_exact_average_in_log2_n_rounds() {
    for log in 1..=7u32 {
        let n = 1u32 << log;
        // Ids with gaps, as after replacements: the schedule runs in the document's order.
        let ids: Vec<MemberId> = (0..n).map(|k| 3 * k + 7).collect();
        let t = build(&spec(TopologyKind::ExponentialOnePeer), &bare_ids(&ids)).unwrap();
        let doc = t.to_document(|_| None);
        assert_eq!(doc.kind, ONE_PEER_EXPONENTIAL);
        let members: Vec<MemberId> = doc.members.iter().map(|m| m.id).collect();
        assert_eq!(members, ids);
        // Its graph is the union of the rounds: the exponential graph.
        assert_eq!(t.graph, simple::exponential_graph(&ids));
        for start in [0, 1, 5] {
            let mut x: BTreeMap<MemberId, f64> = ids
                .iter()
                .map(|&m| (m, f64::from(m).sin() * 100.0))
                .collect();
            let mean = x.values().sum::<f64>() / f64::from(n);
            for round in start..start + u64::from(log) {
                assert_one_peer_schedule_valid(&members, round);
                x = one_peer_round(&members, &x, round);
            }
            for v in x.values() {
                assert!(
                    (v - mean).abs() < 1e-9,
                    "n {n}, start {start}: {v} vs {mean}"
                );
            }
        }
    }
}

#[test]
fn one_peer_exponential_keeps_the_mean_and_contracts_at_any_size() {
    for n in 2..40u32 {
        let ids: Vec<MemberId> = (0..n).collect();
        let rounds = u64::from(u32::BITS - (n - 1).leading_zeros());
        let mut x: BTreeMap<MemberId, f64> = ids.iter().map(|&m| (m, f64::from(m * m))).collect();
        let mean = x.values().sum::<f64>() / f64::from(n);
        let spread =
            |x: &BTreeMap<MemberId, f64>| x.values().map(|v| (v - mean).abs()).fold(0.0, f64::max);
        let before = spread(&x);
        for round in 0..8 * rounds {
            assert_one_peer_schedule_valid(&ids, round);
            x = one_peer_round(&ids, &x, round);
            assert!((x.values().sum::<f64>() / f64::from(n) - mean).abs() < 1e-9);
        }
        assert!(
            spread(&x) < before * 1e-3,
            "n {n}: spread {} from {before}",
            spread(&x)
        );
    }
    assert_eq!(one_peer(&[4], 4, 0), None, "alone");
    assert_eq!(one_peer(&[1, 2], 3, 0), None, "not listed");
}

fn bare_ids(ids: &[MemberId]) -> Vec<MemberProfile> {
    ids.iter().copied().map(MemberProfile::bare).collect()
}

#[test]
fn dcliques_balance_one_class_members_with_few_edges() {
    let members = MemberProfile::from_histograms(one_class_per_member(100, 10, 50.0));
    let t = build(&spec(TopologyKind::DCliques), &members).unwrap();
    let m = measure(&t);
    let skew = m.clique_skew.clone().unwrap();
    assert_eq!(skew.cliques, 10);
    assert!(
        skew.max < 1e-9,
        "every clique holds all ten classes: {skew:?}"
    );
    let full_edges = 100 * 99 / 2;
    assert!(m.edges * 100 <= 15 * full_edges, "{} edges", m.edges);
    assert!(m.connected);
    assert_weights_valid(&t);
    for clique in 0..10 {
        let members: Vec<MemberId> = t
            .graph
            .members()
            .filter(|&id| t.clique_of(id) == Some(clique))
            .collect();
        assert_eq!(members.len(), 10);
    }
}

/// A D-Cliques topology is stored as its cliques and bridges, each bridge a pair, and read
/// back whole; one stored the earlier way, graph and bridge indexes included and bridges as
/// objects, reads back the same.
#[test]
fn a_dcliques_topology_is_stored_without_what_its_cliques_determine() {
    let members = MemberProfile::from_histograms(one_class_per_member(100, 10, 50.0));
    let t = build(&spec(TopologyKind::DCliques), &members).unwrap();
    let Shape::Cliques(layout) = &t.shape else {
        unreachable!()
    };
    let stored = serde_json::to_value(&t).unwrap();
    assert!(stored.get("graph").is_none(), "{stored}");
    let cliques = &stored["shape"]["Cliques"];
    assert!(cliques.get("ends").is_none() && cliques.get("pairs").is_none());
    let b = layout.bridges[0];
    assert_eq!(cliques["bridges"][0], serde_json::json!([b.a, b.b]));
    assert_eq!(
        serde_json::from_value::<Topology>(stored.clone()).unwrap(),
        t
    );

    let mut earlier = stored;
    earlier["graph"] = serde_json::to_value(&t.graph).unwrap();
    let old = &mut earlier["shape"]["Cliques"];
    old["bridges"] = layout
        .bridges
        .iter()
        .map(|b| serde_json::json!({"a": b.a, "b": b.b}))
        .collect();
    old["ends"] = serde_json::json!({"0": 1});
    old["pairs"] = serde_json::json!([[0, 1]]);
    assert_eq!(serde_json::from_value::<Topology>(earlier).unwrap(), t);

    let mut ring =
        serde_json::to_value(build(&spec(TopologyKind::Ring), &bare(5)).unwrap()).unwrap();
    ring.as_object_mut().unwrap().remove("graph");
    let e = serde_json::from_value::<Topology>(ring)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no `graph`"), "{e}");
}

#[test]
fn every_inter_clique_pattern_is_connected_and_balanced() {
    for inter in [
        InterClique::Ring,
        InterClique::SmallWorld,
        InterClique::Fractal,
        InterClique::FullyConnected,
    ] {
        let members = MemberProfile::from_histograms(one_class_per_member(200, 10, 1.0));
        let mut s = spec(TopologyKind::DCliques);
        s.inter_clique = inter;
        let t = build(&s, &members).unwrap();
        let m = measure(&t);
        assert!(m.connected, "{inter:?}");
        // Bridges go to least-connected members: no member carries many more than its share.
        let Shape::Cliques(layout) = &t.shape else {
            unreachable!()
        };
        let per_clique = 2 * layout.bridges.len() / layout.cliques.len();
        assert!(
            m.max_degree <= 9 + per_clique.div_ceil(10) + 1,
            "{inter:?}: max degree {}",
            m.max_degree
        );
        assert_weights_valid(&t);
    }
}

#[test]
fn dcliques_need_histograms_of_one_length() {
    let mut members = MemberProfile::from_histograms(one_class_per_member(20, 10, 1.0));
    members[3].histogram = None;
    assert_eq!(
        build(&spec(TopologyKind::DCliques), &members),
        Err(TopologyError::MissingProfile {
            member: 3,
            what: "label histogram",
            kind: "dCliques"
        })
    );
    members[3].histogram = Some(vec![1.0; 4]);
    assert!(matches!(
        build(&spec(TopologyKind::DCliques), &members),
        Err(TopologyError::ProfileLength {
            member: 3,
            expected: 10,
            found: 4,
            ..
        })
    ));
    assert_eq!(
        build(&spec(TopologyKind::Ring), &[]),
        Err(TopologyError::NoMembers)
    );
    assert_eq!(
        build(
            &spec(TopologyKind::Ring),
            &[MemberProfile::bare(1), MemberProfile::bare(1)]
        ),
        Err(TopologyError::DuplicateMember(1))
    );
}

#[test]
fn proxy_clumps_put_one_member_of_each_clump_in_a_clique() {
    // 8 classes, 32 members, one class each: clumps follow the classes.
    let members = MemberProfile::from_histograms(one_class_per_member(32, 8, 10.0));
    let mut s = spec(TopologyKind::ProxyClumps);
    s.clumps = Some(8);
    let t = build(&s, &members).unwrap();
    let Shape::Cliques(layout) = &t.shape else {
        unreachable!()
    };
    assert_eq!(layout.cliques.len(), 4);
    for members in layout.cliques.values() {
        let clumps: BTreeSet<u32> = members.iter().map(|&m| t.clump_of(m).unwrap()).collect();
        assert_eq!(clumps.len(), members.len(), "a clique repeats a clump");
    }
    for b in &layout.bridges {
        assert_ne!(
            t.clump_of(b.a),
            t.clump_of(b.b),
            "bridge ends share a clump"
        );
    }
    assert!(measure(&t).clique_skew.unwrap().max < 1e-9);
    assert_weights_valid(&t);
}

#[test]
fn a_joiner_goes_where_its_clump_is_in_the_homogeneous_control() {
    // 4 clumps of 4 (one class each), 4 cliques: homogeneous cliques are the clumps.
    let members = MemberProfile::from_histograms(one_class_per_member(16, 4, 10.0));
    let mut s = spec(TopologyKind::ProxyClumps);
    s.clumps = Some(4);
    s.clique_mix = crate::api::CliqueMix::Homogeneous;
    let mut t = build(&s, &members).unwrap();
    for m in 0..16 {
        assert_eq!(t.clique_of(m), t.clique_of(m % 4), "member {m}");
    }
    // Members 5 (class 1) and 6 (class 2) leave; a newcomer of class 1 refills the clique of
    // class 1 (heterogeneous cliques would send it to the one without class 1).
    t.remove_member(5).unwrap();
    t.remove_member(6).unwrap();
    let mut h = vec![0.0; 4];
    h[1] = 10.0;
    t.add_member(MemberProfile {
        id: 99,
        histogram: Some(h),
        ..MemberProfile::default()
    })
    .unwrap();
    assert_eq!(t.clique_of(99), t.clique_of(1));
    assert_weights_valid(&t);
}

#[test]
fn zone_aware_d_cliques_cross_zones_rather_than_lose_label_balance() {
    // 20 members, one class each, cliques of 10; zone a holds classes 0-4 only, zone b classes
    // 5-9: a clique of one zone could never see more than half the classes. Zone-aware cliques
    // must be as balanced as zone-blind ones (every class once), and cross zones to be so.
    let mut members = MemberProfile::from_histograms(one_class_per_member(20, 10, 10.0));
    for m in &mut members {
        m.zone = Some(if m.id % 10 < 5 { "a" } else { "b" }.into());
    }
    let skews = |zone_aware| {
        let mut s = spec(TopologyKind::DCliques);
        s.clique_size = 10;
        s.zone_aware = zone_aware;
        let t = build(&s, &members).unwrap();
        let Shape::Cliques(layout) = &t.shape else {
            unreachable!()
        };
        let histograms: Vec<Vec<&[f64]>> = layout
            .cliques
            .values()
            .map(|c| {
                c.iter()
                    .map(|m| members[*m as usize].histogram.as_deref().unwrap())
                    .collect()
            })
            .collect();
        clique_skews(&histograms)
            .into_iter()
            .fold(0.0_f64, f64::max)
    };
    let (aware, blind) = (skews(true), skews(false));
    assert!(
        aware < 1e-9,
        "worst zone-aware clique skew {aware} (zone-blind {blind})"
    );
}

#[test]
fn members_outside_their_cliques_zone_are_the_ones_to_move() {
    // The setting above: zones holding disjoint classes force every clique of 10 across, half
    // and half. Moving the misplaced members puts every clique in one zone, one clique per zone:
    // the zones keep their sizes.
    let mut members = MemberProfile::from_histograms(one_class_per_member(20, 10, 10.0));
    for m in &mut members {
        m.zone = Some(if m.id % 10 < 5 { "a" } else { "b" }.into());
    }
    let mut s = spec(TopologyKind::DCliques);
    s.clique_size = 10;
    s.zone_aware = true;
    let t = build(&s, &members).unwrap();
    let moves = zones::misplaced(&t);
    assert_eq!(moves.len(), 10, "{moves:?}");
    let Shape::Cliques(layout) = &t.shape else {
        unreachable!()
    };
    for m in &moves {
        assert_eq!(t.clique_of(m.member), Some(m.clique));
        assert_ne!(t.profiles[&m.member].zone.as_deref(), Some(m.zone.as_str()));
    }
    let mut after = t.clone();
    assert_eq!(zones::move_to_their_cliques(&mut after), moves);
    assert!(zones::misplaced(&after).is_empty());
    let moved = after.profiles;
    for (c, ms) in &layout.cliques {
        let zones: BTreeSet<_> = ms.iter().map(|m| &moved[m].zone).collect();
        assert_eq!(
            zones.len(),
            1,
            "clique {c} {ms:?} still spans zones after the moves"
        );
    }
    for z in ["a", "b"] {
        let in_zone = |p: &BTreeMap<u32, MemberProfile>| {
            p.values().filter(|p| p.zone.as_deref() == Some(z)).count()
        };
        assert_eq!(
            in_zone(&moved),
            in_zone(&t.profiles),
            "zone {z} changed size"
        );
    }
    // A clique with a clear majority moves its few others to that majority's zone.
    let mut t = t.clone();
    let c0: Vec<u32> = layout.cliques.values().next().unwrap().clone();
    for (k, m) in c0.iter().enumerate() {
        t.profiles.get_mut(m).unwrap().zone = Some(if k < 8 { "b" } else { "a" }.into());
    }
    let c1: Vec<u32> = layout.cliques.values().nth(1).unwrap().clone();
    for (k, m) in c1.iter().enumerate() {
        t.profiles.get_mut(m).unwrap().zone = Some(if k < 8 { "a" } else { "b" }.into());
    }
    let moves = zones::misplaced(&t);
    assert_eq!(moves.len(), 4, "{moves:?}");
    // A replacement of any of them is asked for the zone of its clique's majority.
    let (k0, k1) = (layout.cliques.keys().next(), layout.cliques.keys().nth(1));
    assert_eq!(
        zones::zone_of_clique(&t, *k0.unwrap()).as_deref(),
        Some("b")
    );
    assert_eq!(
        zones::zone_of_clique(&t, *k1.unwrap()).as_deref(),
        Some("a")
    );
    assert_eq!(zones::zone_of_clique(&t, u32::MAX), None, "no such clique");
    assert!(
        moves
            .iter()
            .all(|m| (m.clique == *layout.cliques.keys().next().unwrap()) == (m.zone == "b"))
    );
    // Zone-blind cliques, and cliques already inside zones, have nothing to move.
    s.zone_aware = false;
    let blind = build(&s, &members).unwrap();
    assert!(zones::misplaced(&blind).is_empty());
    assert_eq!(
        zones::zone_of_clique(&blind, 0),
        None,
        "zone-blind cliques have no zone"
    );
    for m in &mut members {
        m.zone = Some(if m.id < 10 { "a" } else { "b" }.into());
    }
    s.zone_aware = true;
    s.clique_size = 5;
    assert!(zones::misplaced(&build(&s, &members).unwrap()).is_empty());
}

#[test]
fn a_member_rejoins_the_clique_it_was_moved_for_while_that_has_room() {
    // Two cliques of ten, one member of each class twice over. With x out of one and y (another
    // class) out of the other, x lowers its own clique's skew most, but was moved for y's.
    let members = MemberProfile::from_histograms(one_class_per_member(20, 10, 10.0));
    let mut s = spec(TopologyKind::DCliques);
    s.clique_size = 10;
    let mut t = build(&s, &members).unwrap();
    let (x, home) = (0, t.clique_of(0).unwrap());
    let y = (0..20)
        .find(|&m| t.clique_of(m) != Some(home) && m % 10 != x % 10)
        .unwrap();
    let other = t.clique_of(y).unwrap();
    let profile = |id: u32| members.iter().find(|p| p.id == id).unwrap().clone();
    t.remove_member(x).unwrap();
    t.remove_member(y).unwrap();
    let mut anywhere = t.clone();
    anywhere.add_member(profile(x)).unwrap();
    assert_eq!(
        anywhere.clique_of(x),
        Some(home),
        "the label-balanced choice"
    );
    t.rejoin(profile(x), Some(other)).unwrap();
    assert_eq!(t.clique_of(x), Some(other));
    // The clique it was moved for is full now: the next one goes where it fits best.
    t.rejoin(profile(y), Some(other)).unwrap();
    assert_eq!(t.clique_of(y), Some(home));
    assert_weights_valid(&t);
}

#[test]
fn zones_of_uneven_size_still_get_cliques_of_their_own() {
    // 11 members in zone a, 9 in zone b, each zone holding every class at least once: cliques
    // of 5 as runs of the zone-sorted order would put one member of a into b's cliques.
    let mut members = MemberProfile::from_histograms(one_class_per_member(20, 10, 10.0));
    for m in &mut members {
        m.zone = Some(if m.id < 11 { "a" } else { "b" }.into());
    }
    let mut s = spec(TopologyKind::DCliques);
    s.clique_size = 5;
    s.zone_aware = true;
    s.zone_mix_skew = 2.0;
    let t = build(&s, &members).unwrap();
    assert!(zones::misplaced(&t).is_empty(), "{:?}", t.shape);
    let Shape::Cliques(layout) = &t.shape else {
        unreachable!()
    };
    let mut sizes: Vec<usize> = layout.cliques.values().map(Vec::len).collect();
    sizes.sort();
    assert_eq!(sizes, [4, 5, 5, 6]);
}

#[test]
fn zone_aware_cliques_stay_inside_zones_and_only_bridges_cross() {
    // 40 members, one class each, the first 20 in zone a and the rest in zone b: each zone holds
    // every class twice, so cliques of 5 can be balanced inside a zone.
    let mut members = MemberProfile::from_histograms(one_class_per_member(40, 10, 10.0));
    for m in &mut members {
        m.zone = Some(if m.id < 20 { "a" } else { "b" }.into());
    }
    for kind in [TopologyKind::DCliques, TopologyKind::ProxyClumps] {
        let build_with = |zone_aware| {
            let mut s = spec(kind);
            s.clique_size = 5;
            s.clumps = Some(5);
            s.inter_clique = InterClique::Ring;
            s.zone_aware = zone_aware;
            build(&s, &members).unwrap()
        };
        let aware = build_with(true);
        let Shape::Cliques(layout) = &aware.shape else {
            unreachable!()
        };
        for c in layout.cliques.values() {
            let zones: BTreeSet<_> = c.iter().map(|m| &aware.profiles[m].zone).collect();
            assert_eq!(zones.len(), 1, "{kind:?}: clique {c:?} spans zones");
        }
        // Cliques of a zone are consecutive on the ring: two bridges cross.
        assert_eq!(measure(&aware).cross_zone_edges, Some(2), "{kind:?}");
        let blind = measure(&build_with(false)).cross_zone_edges.unwrap();
        assert!(
            blind > 20,
            "{kind:?}: {blind} cross-zone edges without zones"
        );
        assert_weights_valid(&aware);
        // Members 5 (zone a) and 25 (zone b), both of class 5, leave; a joiner of class 5 in
        // zone b refills zone b's clique, though zone a's lacks class 5 as much.
        let mut t = aware.clone();
        let leaver = 25;
        let hole = t.clique_of(leaver);
        t.remove_member(5).unwrap();
        t.remove_member(leaver).unwrap();
        t.add_member(MemberProfile {
            id: 99,
            histogram: Some(one_class_per_member(40, 10, 10.0)[leaver as usize].clone()),
            zone: Some("b".into()),
            ..MemberProfile::default()
        })
        .unwrap();
        assert_eq!(t.clique_of(99), hole, "{kind:?}");
    }
}

#[test]
fn proxy_vectors_take_precedence_over_histograms() {
    let mut members = bare(12);
    for m in &mut members {
        let g = (m.id % 3) as f64;
        m.proxy = Some(vec![g, 1.0 - g / 3.0]);
    }
    let mut s = spec(TopologyKind::ProxyClumps);
    s.clumps = Some(3);
    let t = build(&s, &members).unwrap();
    for id in 0..12 {
        assert_eq!(t.clump_of(id), t.clump_of(id % 3), "member {id}");
    }
}

#[test]
fn moshpit_grid_measures_use_round_groups() {
    let t = moshpit(&bare(16), 4).unwrap();
    let m = measure(&t);
    assert_eq!(m.messages_per_round, 16 * 3);
    // Mean of a row- and a column-averaging round: eigenvalues 1, 1/2, 0, so the gap is 1/2.
    assert!((m.spectral_gap.unwrap() - 0.5).abs() < 1e-9);
    assert_eq!(m.diameter, Some(2));
}

#[test]
fn ring_repair_closes_the_gap_and_splices_joiners() {
    let mut t = build(&spec(TopologyKind::Ring), &bare(6)).unwrap();
    t.remove_member(3).unwrap();
    assert!(t.graph.has_edge(2, 4));
    assert_eq!(t.graph.edge_count(), 5);
    assert_eq!(t.version, 2);
    t.add_member(MemberProfile::bare(9)).unwrap();
    assert!(t.graph.has_edge(5, 9) && t.graph.has_edge(9, 0) && !t.graph.has_edge(5, 0));
    assert_eq!(t.version, 3);
    assert_eq!(t.remove_member(3), Err(TopologyError::UnknownMember(3)));
    assert_eq!(
        t.add_member(MemberProfile::bare(9)),
        Err(TopologyError::DuplicateMember(9))
    );
    assert_eq!(t.version, 3, "a failed repair leaves the version alone");
}

#[test]
fn dcliques_refill_a_hole_with_the_matching_class() {
    let members = MemberProfile::from_histograms(one_class_per_member(30, 10, 5.0));
    let mut s = spec(TopologyKind::DCliques);
    s.inter_clique = InterClique::Ring;
    let mut t = build(&s, &members).unwrap();
    let hole = t.clique_of(13).unwrap();
    t.remove_member(13).unwrap();
    let mut h = vec![0.0; 10];
    h[3] = 5.0; // member 13 held class 3
    t.add_member(MemberProfile {
        id: 100,
        histogram: Some(h),
        ..MemberProfile::default()
    })
    .unwrap();
    assert_eq!(t.clique_of(100), Some(hole));
    assert!(measure(&t).clique_skew.unwrap().max < 1e-9);
}

/// Thirty members in three D-Cliques of ten, six of member 0's clique taken out by `take_out`:
/// the members, the topology, that clique and its members before.
fn six_out_of_one_clique(
    take_out: fn(&mut Topology, MemberId) -> Result<(), TopologyError>,
) -> (Vec<MemberProfile>, Topology, u32, Vec<MemberId>) {
    let members = MemberProfile::from_histograms(one_class_per_member(30, 10, 5.0));
    let mut t = build(&spec(TopologyKind::DCliques), &members).unwrap();
    let target = t.clique_of(0).unwrap();
    let mates: Vec<MemberId> = t
        .graph
        .members()
        .filter(|&m| t.clique_of(m) == Some(target))
        .collect();
    for &m in &mates[..6] {
        take_out(&mut t, m).unwrap();
    }
    (members, t, target, mates)
}

#[test]
fn a_clique_below_half_size_is_dissolved() {
    let (_, t, _, _) = six_out_of_one_clique(Topology::remove_member);
    let Shape::Cliques(layout) = &t.shape else {
        unreachable!()
    };
    assert_eq!(layout.cliques.len(), 2, "the shrunk clique was merged away");
    assert_eq!(layout.cliques.values().map(Vec::len).sum::<usize>(), 24);
    assert!(t.graph.is_connected());
}

#[test]
fn a_clique_set_aside_below_half_size_waits_for_its_members() {
    // As above, but its members will come back (moved to the clique's zone): the clique stays,
    // its four stayers in it, and the movers return to it.
    let (members, mut t, target, mates) = six_out_of_one_clique(Topology::set_aside);
    let Shape::Cliques(layout) = &t.shape else {
        unreachable!()
    };
    assert_eq!(layout.cliques.len(), 3, "the clique waits");
    let mut stayers = layout.cliques[&target].clone();
    stayers.sort();
    assert_eq!(stayers, mates[6..]);
    assert!(t.graph.is_connected());
    for &m in &mates[..6] {
        t.rejoin(members[m as usize].clone(), Some(target)).unwrap();
    }
    assert!(mates.iter().all(|&m| t.clique_of(m) == Some(target)));
}

#[derive(Clone, Debug)]
enum Op {
    Remove(usize),
    Add(usize),
    /// Trade between D-Cliques (up to this many trades), aiming at no skew at all.
    Rebalance(usize),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            any::<usize>().prop_map(Op::Remove),
            (0usize..10).prop_map(Op::Add),
            (0usize..4).prop_map(Op::Rebalance),
        ],
        0..40,
    )
}

fn kinds() -> impl Strategy<Value = (TopologyKind, InterClique)> {
    (
        prop_oneof![
            Just(TopologyKind::Ring),
            Just(TopologyKind::FullyConnected),
            Just(TopologyKind::Exponential),
            Just(TopologyKind::ExponentialOnePeer),
            Just(TopologyKind::DCliques),
            Just(TopologyKind::ProxyClumps),
        ],
        prop_oneof![
            Just(InterClique::Ring),
            Just(InterClique::SmallWorld),
            Just(InterClique::Fractal),
            Just(InterClique::FullyConnected),
        ],
    )
}

/// A topology the repair property tests start from: Moshpit's grid (`shape` 1), a random
/// regular graph (`shape` 2, over 4 members), else `kind` built with these options.
struct Start {
    kind: TopologyKind,
    inter: InterClique,
    clique_size: usize,
    seed: u64,
    shape: usize,
    homogeneous: bool,
    zone_aware: bool,
}

fn start(members: &[MemberProfile], o: &Start) -> Topology {
    if o.shape == 1 {
        moshpit(members, o.clique_size.max(2)).unwrap()
    } else if o.shape == 2 && members.len() > 4 {
        random_regular(members, 4, o.seed).unwrap()
    } else {
        let mut s = BuildSpec::new(o.kind);
        s.inter_clique = o.inter;
        s.clique_size = o.clique_size;
        s.seed = o.seed;
        if o.homogeneous {
            s.clique_mix = crate::api::CliqueMix::Homogeneous;
        }
        s.zone_aware = o.zone_aware;
        build(&s, members).unwrap()
    }
}

fn class_histogram(class: usize) -> Vec<f64> {
    let mut h = vec![1.0; 10];
    h[class] = 20.0;
    h
}

proptest! {

    /// Clumps hold floor(n/k) or ceil(n/k) members; heterogeneous cliques never hold two of one
    /// clump; the homogeneous control has the same clique sizes on the same ring of cliques, and
    /// where its cliques are no larger than a clump, each spans at most two clumps.
    #[test]
    fn clumps_are_equal_and_cliques_mix_them_as_asked(
        vectors in prop::collection::vec(prop::collection::vec(0.0f64..1.0, 3), 1..60),
        k in 1usize..9,
        seed in any::<u64>(),
    ) {
        let n = vectors.len();
        let members: Vec<MemberProfile> = vectors
            .into_iter()
            .enumerate()
            .map(|(id, v)| MemberProfile { id: id as u32, histogram: None, proxy: Some(v), zone: None })
            .collect();
        let build_mix = |mix| {
            let mut s = spec(TopologyKind::ProxyClumps);
            s.clumps = Some(k);
            s.seed = seed;
            s.inter_clique = InterClique::Ring;
            s.clique_mix = mix;
            build(&s, &members).unwrap()
        };
        let hetero = build_mix(crate::api::CliqueMix::Heterogeneous);
        let homo = build_mix(crate::api::CliqueMix::Homogeneous);
        let k = k.min(n);
        let mut sizes = vec![0usize; k];
        for m in 0..n as u32 {
            let clump = hetero.clump_of(m).unwrap() as usize;
            prop_assert_eq!(Some(clump as u32), homo.clump_of(m), "the same clumps");
            sizes[clump] += 1;
        }
        prop_assert!(sizes.iter().all(|&s| s == n / k || s == n.div_ceil(k)), "clump sizes {:?}", sizes);
        let cliques = |t: &Topology| -> Vec<Vec<MemberId>> {
            let Shape::Cliques(layout) = &t.shape else { unreachable!() };
            layout.cliques.values().cloned().collect()
        };
        let spans = |t: &Topology, c: &[MemberId]| -> usize {
            c.iter().map(|&m| t.clump_of(m).unwrap()).collect::<BTreeSet<_>>().len()
        };
        for c in cliques(&hetero) {
            prop_assert_eq!(spans(&hetero, &c), c.len(), "a clique repeats a clump: {:?}", c);
        }
        let lengths = |t: &Topology| cliques(t).iter().map(Vec::len).collect::<Vec<_>>();
        prop_assert_eq!(lengths(&hetero), lengths(&homo));
        prop_assert_eq!(hetero.graph.edge_count(), homo.graph.edge_count());
        if lengths(&homo).into_iter().max().unwrap() <= n / k {
            for c in cliques(&homo) {
                prop_assert!(spans(&homo, &c) <= 2, "a homogeneous clique spans {:?}", c);
            }
        }
        assert_weights_valid(&hetero);
        assert_weights_valid(&homo);
    }

    // 256 cases by default; PROPTEST_CASES=N runs more.
    /// After any sequence of removals, joins and trades between cliques: connected, W symmetric
    /// and doubly stochastic, versions only grow (trades bump it when they change anything), and
    /// the members are exactly those expected. Trades lower the cliques' summed skew and bring no
    /// clique a zone it did not have.
    #[test]
    fn repair_keeps_the_invariants(
        (kind, inter) in kinds(),
        n in 1usize..40,
        clique_size in 2usize..8,
        seed in any::<u64>(),
        ops in ops(),
        shape in 0usize..3,
        homogeneous in any::<bool>(),
        zones in 0usize..4,
    ) {
        let zone = |k: usize| (zones > 0).then(|| format!("z{}", k % zones));
        let members: Vec<MemberProfile> = (0..n)
            .map(|k| MemberProfile { id: k as u32, histogram: Some(class_histogram(k % 10)), proxy: None, zone: zone(k) })
            .collect();
        let mut t = start(&members, &Start { kind, inter, clique_size, seed, shape, homogeneous, zone_aware: zones > 0 });
        let mut expected: BTreeSet<MemberId> = (0..n as u32).collect();
        let mut next_id = n as u32;
        let was_ring = matches!(t.shape, Shape::Ring { .. });
        for op in ops {
            let before = t.version;
            match op {
                Op::Remove(pick) => {
                    if expected.len() <= 1 { continue; }
                    let id = *expected.iter().nth(pick % expected.len()).unwrap();
                    t.remove_member(id).unwrap();
                    expected.remove(&id);
                }
                Op::Add(class) => {
                    t.add_member(MemberProfile { id: next_id, histogram: Some(class_histogram(class)), proxy: None, zone: zone(class) }).unwrap();
                    expected.insert(next_id);
                    next_id += 1;
                }
                Op::Rebalance(limit) => {
                    let skews = |t: &Topology| measures::clique_skew(t).map(|s| s.mean * s.cliques as f64);
                    let zones_of = |t: &Topology| -> BTreeMap<u32, BTreeSet<Option<String>>> {
                        let mut zones = BTreeMap::<u32, BTreeSet<Option<String>>>::new();
                        for (m, c) in t.cliques_by_member() {
                            zones.entry(c).or_default().insert(t.profiles[&m].zone.clone());
                        }
                        zones
                    };
                    let (total, zones) = (skews(&t), zones_of(&t));
                    let trades = t.rebalance_worst_cliques(0.0, limit);
                    prop_assert!(trades.len() <= limit);
                    if trades.is_empty() {
                        prop_assert_eq!(t.version, before);
                        continue;
                    }
                    prop_assert!(skews(&t).unwrap() < total.unwrap() - 1e-9, "{:?} raised the skew", trades);
                    for (c, now) in zones_of(&t) {
                        prop_assert!(now.is_subset(&zones[&c]), "clique {} got zones {:?}, had {:?}", c, now, zones[&c]);
                    }
                }
            }
            prop_assert!(t.version > before);
            // What is stored reads back the same, the graph included where it is left out.
            let stored = serde_json::to_string(&t).unwrap();
            prop_assert_eq!(&serde_json::from_str::<Topology>(&stored).unwrap(), &t);
            prop_assert_eq!(stored.contains("\"graph\""), t.shape.graph().is_none());
            prop_assert!(t.graph.is_connected(), "disconnected after {:?}", op);
            prop_assert_eq!(t.graph.members().collect::<BTreeSet<_>>(), expected.clone());
            prop_assert_eq!(t.profiles.keys().copied().collect::<BTreeSet<_>>(), expected.clone());
            if was_ring && expected.len() >= 3 {
                prop_assert!(t.graph.members().all(|m| t.graph.degree(m) == 2), "ring is no longer a ring");
            }
            assert_weights_valid(&t);
            if matches!(t.shape, Shape::OnePeerExponential) {
                // Still the one-peer schedule over whoever is left, in the document's order.
                let members: Vec<MemberId> = t.to_document(|_| None).members.iter().map(|m| m.id).collect();
                prop_assert_eq!(&t.graph, &simple::exponential_graph(&members));
                if members.len() >= 2 {
                    for round in 0..8 {
                        assert_one_peer_schedule_valid(&members, round);
                    }
                }
            }
        }
    }
}

proptest! {
    /// One repair of many leaves and joins (members set aside and rejoining their cliques
    /// included, and refused changes) leaves the topology the same changes leave one by one: the
    /// same cliques, graph, profiles and version, and the same answers on the way.
    #[test]
    fn one_repair_of_many_changes_leaves_what_the_changes_one_by_one_leave(
        (kind, inter) in kinds(),
        n in 1usize..40,
        clique_size in 2usize..8,
        seed in any::<u64>(),
        changes in prop::collection::vec((0usize..5, any::<usize>(), 0usize..10), 0..40),
        shape in 0usize..3,
        zones in 0usize..4,
    ) {
        let zone = |k: usize| (zones > 0).then(|| format!("z{}", k % zones));
        let profile = |id: u32, class: usize| MemberProfile {
            id,
            histogram: Some(class_histogram(class)),
            proxy: None,
            zone: zone(class),
        };
        let members: Vec<MemberProfile> = (0..n).map(|k| profile(k as u32, k % 10)).collect();
        let first = start(&members, &Start { kind, inter, clique_size, seed, shape, homogeneous: false, zone_aware: zones > 0 });
        let mut one_by_one = first.clone();
        let mut at_once = first;
        let mut repair = at_once.repair();
        let mut next_id = n as u32;
        let mut aside: Vec<(MemberProfile, Option<u32>)> = Vec::new();
        for (change, pick, class) in changes {
            let present: Vec<MemberId> = one_by_one.profiles.keys().copied().collect();
            let picked = present[pick % present.len()];
            let (single, batched) = match change {
                0 | 1 if present.len() <= 1 => continue,
                0 => (one_by_one.remove_member(picked), repair.remove_member(picked)),
                1 => {
                    aside.push((one_by_one.profiles[&picked].clone(), one_by_one.clique_of(picked)));
                    (one_by_one.set_aside(picked), repair.set_aside(picked))
                }
                2 => {
                    let (joiner, home) = if aside.is_empty() {
                        next_id += 1;
                        (profile(next_id, class), None)
                    } else {
                        aside.remove(pick % aside.len())
                    };
                    (one_by_one.rejoin(joiner.clone(), home), repair.rejoin(joiner, home))
                }
                3 => (one_by_one.remove_member(10_000), repair.remove_member(10_000)),
                _ => {
                    let again = one_by_one.profiles[&picked].clone();
                    (one_by_one.add_member(again.clone()), repair.add_member(again))
                }
            };
            prop_assert_eq!(&batched, &single);
            prop_assert_eq!(repair.member_count(), one_by_one.profiles.len());
            prop_assert_eq!(repair.contains(picked), one_by_one.graph.contains(picked));
        }
        drop(repair);
        prop_assert_eq!(&at_once, &one_by_one);
    }
}

#[test]
fn random_regular_graphs_are_regular_connected_and_stay_so() {
    let mut t = random_regular(&bare(30), 4, 11).unwrap();
    assert!(t.graph.members().all(|m| t.graph.degree(m) == 4));
    assert!(t.graph.is_connected());
    assert_eq!(t.graph.edge_count(), 60);
    t.add_member(MemberProfile::bare(99)).unwrap();
    assert_eq!(t.graph.degree(99), 4);
    assert!(
        t.graph.members().all(|m| t.graph.degree(m) == 4),
        "a joiner splits edges"
    );
    t.remove_member(5).unwrap();
    assert!(t.graph.members().all(|m| t.graph.degree(m) <= 4) && t.graph.is_connected());
    assert!(random_regular(&bare(5), 3, 0).is_err(), "n*d must be even");
}

#[test]
fn random_regular_graphs_of_higher_degree_are_random_not_circulant() {
    // A circulant 7-regular graph on 100 members (the fallback) has a spectral gap of 0.03; a
    // random one about 0.25. Different seeds give different graphs.
    let a = random_regular(&bare(100), 7, 7).unwrap();
    let b = random_regular(&bare(100), 7, 8).unwrap();
    for t in [&a, &b] {
        assert!(t.graph.members().all(|m| t.graph.degree(m) == 7));
        let gap = measure(t).spectral_gap.unwrap();
        assert!(gap > 0.15, "spectral gap {gap}");
    }
    assert_ne!(a.graph, b.graph);
}
