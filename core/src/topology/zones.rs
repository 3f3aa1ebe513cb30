//! Zones: cross-zone traffic is the part of a cloud bill a decentralized job controls. Each clique
//! averages every round and bridges carry far less, so zone-aware clique topologies form every
//! clique inside one zone and let only bridges cross.

use std::collections::BTreeMap;

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

use super::graph::Graph;
use super::{MemberId, MemberProfile, Shape, Topology};

/// Zone `k`'s name in tests and simulations: zone-a, zone-b, ..., zone-z, zone-aa, ...
pub fn zone_name(k: usize) -> String {
    let mut name = String::new();
    let mut k = k;
    loop {
        name.insert(0, char::from(b'a' + (k % 26) as u8));
        if k < 26 {
            break;
        }
        k = k / 26 - 1;
    }
    format!("zone-{name}")
}

/// Zone index of each of `members` members spread over `zones` zones the way a scheduler that
/// knows nothing of their data spreads pods: counts as even as they can be, which member lands
/// where decided by `seed`. (Member i in zone i mod zones would tie zones to the partition's own
/// arithmetic: classes-per-member gives member m the classes of m mod 5, so even members alone
/// would hold every class twice.)
pub fn scatter(members: usize, zones: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..members).collect();
    order.shuffle(&mut ChaCha8Rng::seed_from_u64(seed ^ 0x7a6f_6e65));
    let mut zone_of = vec![0; members];
    for (k, &m) in order.iter().enumerate() {
        zone_of[m] = k % zones.max(1);
    }
    zone_of
}

/// Member indices grouped by zone, zones in name order (members with no zone form a group of their
/// own, last); all members in one group when `zone_aware` is off.
pub fn zone_groups(members: &[MemberProfile], zone_aware: bool) -> Vec<Vec<usize>> {
    if !zone_aware {
        return vec![(0..members.len()).collect()];
    }
    let mut by_zone: BTreeMap<Option<&str>, Vec<usize>> = BTreeMap::new();
    for (i, m) in members.iter().enumerate() {
        by_zone.entry(m.zone.as_deref()).or_default().push(i);
    }
    // BTreeMap orders None first; the zoneless go last.
    let zoneless = by_zone.remove(&None);
    by_zone.into_values().chain(zoneless).collect()
}

/// Edges whose two ends are in different zones, when every member has a zone.
pub fn cross_zone_edges(graph: &Graph, profiles: &BTreeMap<u32, MemberProfile>) -> Option<usize> {
    let zone = |m: u32| profiles.get(&m).and_then(|p| p.zone.as_deref());
    if graph.members().any(|m| zone(m).is_none()) {
        return None;
    }
    Some(graph.edges().filter(|&(a, b)| zone(a) != zone(b)).count())
}

/// A member of a zone-aware clique topology that runs outside its clique's zone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Misplaced {
    pub member: MemberId,
    pub clique: u32,
    /// The zone its clique trains in.
    pub zone: String,
}

/// Members of zone-aware cliques to move so that every clique trains in one zone. Cliques cross
/// zones where one zone's members cannot balance the labels; a member's data moves with it, so
/// moving it to its clique's zone keeps the balance and takes the clique's every-round traffic
/// off the cross-zone bill. Each clique gets a zone, the one holding most of its members where
/// that zone still has room (room: the members it runs now, so the zones keep their sizes);
/// cliques that fit nowhere go to their majority zone. Empty unless the topology is zone-aware.
pub fn misplaced(t: &Topology) -> Vec<Misplaced> {
    let Shape::Cliques(layout) = &t.shape else {
        return Vec::new();
    };
    if !layout.zone_aware {
        return Vec::new();
    }
    let zone = |m: &MemberId| t.profiles.get(m).and_then(|p| p.zone.as_deref());
    let mut room = BTreeMap::<&str, usize>::new();
    // (members of the clique in the zone, clique size, clique, zone), best first.
    let mut candidates = Vec::new();
    let mut majority = BTreeMap::<u32, &str>::new();
    for (&clique, members) in &layout.cliques {
        let mut counts = BTreeMap::<&str, usize>::new();
        for z in members.iter().filter_map(zone) {
            *counts.entry(z).or_default() += 1;
            *room.entry(z).or_default() += 1;
        }
        if let Some(z) = most_common(&counts) {
            majority.insert(clique, z);
        }
        candidates.extend(
            counts
                .into_iter()
                .map(|(z, n)| (n, members.len(), clique, z)),
        );
    }
    candidates.sort_by(|a, b| {
        b.0.cmp(&a.0)
            .then(b.1.cmp(&a.1))
            .then(a.2.cmp(&b.2))
            .then(a.3.cmp(b.3))
    });
    let mut home = BTreeMap::<u32, &str>::new();
    for (_, size, clique, z) in candidates {
        if home.contains_key(&clique) || room[z] < size {
            continue;
        }
        *room.get_mut(z).expect("counted") -= size;
        home.insert(clique, z);
    }
    for (clique, z) in majority {
        home.entry(clique).or_insert(z);
    }
    let mut out = Vec::new();
    for (clique, main) in home {
        out.extend(
            layout.cliques[&clique]
                .iter()
                .filter(|m| zone(m).is_some_and(|z| z != main))
                .map(|&member| Misplaced {
                    member,
                    clique,
                    zone: main.to_string(),
                }),
        );
    }
    out
}

/// The zone holding most of `clique`'s members (the first name of equals), where the topology
/// is zone-aware cliques: a replacement for one of them is asked to run there.
pub fn zone_of_clique(t: &Topology, clique: u32) -> Option<String> {
    let Shape::Cliques(layout) = &t.shape else {
        return None;
    };
    if !layout.zone_aware {
        return None;
    }
    let mut counts = BTreeMap::<&str, usize>::new();
    for m in layout.cliques.get(&clique)? {
        if let Some(z) = t.profiles.get(m).and_then(|p| p.zone.as_deref()) {
            *counts.entry(z).or_default() += 1;
        }
    }
    most_common(&counts).map(str::to_string)
}

/// The key with the largest count; the first of equals.
fn most_common<'a>(counts: &BTreeMap<&'a str, usize>) -> Option<&'a str> {
    // max_by_key keeps the last of equals: walk backwards so the first name wins a tie.
    counts
        .iter()
        .rev()
        .max_by_key(|&(_, &n)| n)
        .map(|(&z, _)| z)
}

/// The topology once every [`misplaced`] member runs in its clique's zone: the graph a zone-aware
/// job trains on after the operator moved them (a member's data moves with it, so only its zone
/// changes). Returns the moves.
pub fn move_to_their_cliques(t: &mut Topology) -> Vec<Misplaced> {
    let moves = misplaced(t);
    for m in &moves {
        if let Some(p) = t.profiles.get_mut(&m.member) {
            p.zone = Some(m.zone.clone());
        }
    }
    moves
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scatter_evens_the_zones_and_is_seeded() {
        for (members, zones) in [(20, 2), (21, 2), (10, 3), (3, 5)] {
            let z = scatter(members, zones, 4);
            let counts: Vec<usize> = (0..zones)
                .map(|k| z.iter().filter(|&&x| x == k).count())
                .collect();
            assert!(
                counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1,
                "{members} over {zones}: {counts:?}"
            );
            assert_eq!(z, scatter(members, zones, 4));
        }
        let round_robin: Vec<usize> = (0..20).map(|m| m % 2).collect();
        assert!(
            (0..8).any(|seed| scatter(20, 2, seed) != round_robin),
            "scatter should not be member i in zone i mod 2"
        );
    }

    #[test]
    fn zone_names_run_a_to_z_then_aa() {
        assert_eq!(
            [0, 1, 25, 26, 27, 701, 702].map(zone_name),
            [
                "zone-a", "zone-b", "zone-z", "zone-aa", "zone-ab", "zone-zz", "zone-aaa"
            ]
        );
    }
}
