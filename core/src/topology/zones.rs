//! Zones: cross-zone traffic is the part of a cloud bill a decentralized job controls. Each clique
//! averages every round and bridges carry far less, so zone-aware clique topologies form every
//! clique inside one zone and let only bridges cross.

use std::collections::BTreeMap;

use super::MemberProfile;
use super::graph::Graph;

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

#[cfg(test)]
mod tests {
    use super::*;

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
