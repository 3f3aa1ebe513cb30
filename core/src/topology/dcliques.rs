//! D-Cliques (Bellet et al.): cliques whose joint label distribution is close to the global one,
//! found by Greedy Swap, so that averaging inside a clique cancels each member's label skew.

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;

use super::cliques::{CliqueFlavour, CliqueLayout};
use super::graph::{Graph, MemberId};
use super::skew::{distribution, skew, sum};
use super::zones::zone_groups;
use super::{BuildSpec, MemberProfile, Shape, Topology, TopologyError, profile_vectors};

/// Greedy Swap iterations when the job does not say.
pub const DEFAULT_SWAP_STEPS: usize = 1000;

pub(super) fn build(
    spec: &BuildSpec,
    members: &[MemberProfile],
) -> Result<(Graph, Shape), TopologyError> {
    if spec.clique_size < 2 {
        return Err(TopologyError::TooSmall {
            what: "cliqueSize",
            min: 2,
            got: spec.clique_size,
        });
    }
    let histograms = profile_vectors(members, "label histogram", "dCliques", |m| {
        m.histogram.as_ref()
    })?;
    // Zone-aware: cliques start as runs of one zone's members and Greedy Swap weighs every member
    // outside its clique's main zone as ZONE_MIX_SKEW of skew: a clique crosses zones only where
    // the members of one zone cannot balance its labels (few members, or zones that hold
    // different classes), so locality never costs label balance.
    let zone_of = spec.zone_aware.then(|| {
        let mut zone_of = vec![0; members.len()];
        for (z, group) in zone_groups(members, true).into_iter().enumerate() {
            for i in group {
                zone_of[i] = z;
            }
        }
        zone_of
    });
    let cliques = swap(
        &histograms,
        zone_of.as_deref().map(|z| (z, spec.zone_mix_skew)),
        spec.clique_size,
        spec.swap_steps,
        spec.seed,
    );
    let groups = cliques
        .into_iter()
        .map(|c| c.into_iter().map(|k| members[k].id).collect())
        .collect();
    let mut layout = CliqueLayout::new(
        CliqueFlavour::DCliques,
        spec.inter_clique,
        spec.clique_size,
        groups,
    );
    layout.zone_aware = spec.zone_aware;
    Ok((layout.graph(), Shape::Cliques(layout)))
}

/// Partition member indices into cliques of `size` (the last may be smaller) and improve them by
/// `steps` rounds of: pick two cliques, list every member swap that lowers their summed skew,
/// apply one of those at random. Each step costs O(size^2 * classes).
pub fn greedy_swap(histograms: &[&[f64]], size: usize, steps: usize, seed: u64) -> Vec<Vec<usize>> {
    swap(histograms, None, size, steps, seed)
}

/// What a clique member outside the clique's main zone costs by default, in skew (which lies in
/// [0, 2]): a swap that brings a member of another zone in must balance the labels by more than
/// this.
pub const ZONE_MIX_SKEW: f64 = 0.02;

/// Greedy Swap. With `zones` (each member's zone index, and what a member outside its clique's
/// main zone costs in skew), each zone's members start in cliques of their own and a clique's cost
/// is its skew plus that price per member outside its main zone.
fn swap(
    histograms: &[&[f64]],
    zones: Option<(&[usize], f64)>,
    size: usize,
    steps: usize,
    seed: u64,
) -> Vec<Vec<usize>> {
    let n = histograms.len();
    let classes = histograms.first().map_or(0, |h| h.len());
    let global = distribution(&sum(histograms.iter().copied(), classes));
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut rng);
    let zone_of = zones.map(|(z, _)| z);
    let mut cliques: Vec<Vec<usize>> = match zone_of {
        None => order.chunks(size.max(1)).map(<[_]>::to_vec).collect(),
        Some(zone_of) => {
            // Each zone's members (shuffled) cut into cliques of their own, as near `size` as
            // the zone's count allows: 11 members make 6 + 5, not 5 + 5 + a lone member that
            // could only be filled from another zone.
            let mut by_zone = std::collections::BTreeMap::<usize, Vec<usize>>::new();
            for &i in &order {
                by_zone.entry(zone_of[i]).or_default().push(i);
            }
            by_zone
                .into_values()
                .flat_map(|members| near_equal_chunks(members, size))
                .collect()
        }
    };
    if cliques.len() < 2 {
        return cliques;
    }
    let mix_price = zones.map_or(0.0, |(_, price)| price);
    let mixed = |clique: &[usize]| -> f64 {
        let Some(zone_of) = zone_of else { return 0.0 };
        let mut counts = std::collections::BTreeMap::<usize, usize>::new();
        for &k in clique {
            *counts.entry(zone_of[k]).or_default() += 1;
        }
        mix_price * (clique.len() - counts.values().max().copied().unwrap_or(0)) as f64
    };
    let mut sums: Vec<Vec<f64>> = cliques
        .iter()
        .map(|c| sum(c.iter().map(|&k| histograms[k]), classes))
        .collect();
    let mut s1 = vec![0.0; classes];
    let mut s2 = vec![0.0; classes];
    let mut improving = Vec::new();
    let mut trial1 = Vec::with_capacity(size);
    let mut trial2 = Vec::with_capacity(size);
    // Zone-aware: first only swaps between members of one zone (the best cliques each zone can
    // make alone), then any swap, at the cost of mixing. Local search that may mix from the start
    // can settle in mixed cliques where pure ones are as balanced.
    let phases: &[bool] = if zone_of.is_some() {
        &[true, false]
    } else {
        &[false]
    };
    for &same_zone_only in phases.iter().flat_map(|p| std::iter::repeat_n(p, steps)) {
        let c1 = rng.random_range(0..cliques.len());
        let mut c2 = rng.random_range(0..cliques.len() - 1);
        if c2 >= c1 {
            c2 += 1;
        }
        let current = skew(&sums[c1], &global)
            + skew(&sums[c2], &global)
            + mixed(&cliques[c1])
            + mixed(&cliques[c2]);
        improving.clear();
        for (x, &i) in cliques[c1].iter().enumerate() {
            for (y, &j) in cliques[c2].iter().enumerate() {
                if same_zone_only && zone_of.is_some_and(|z| z[i] != z[j]) {
                    continue;
                }
                for l in 0..classes {
                    let delta = histograms[j][l] - histograms[i][l];
                    s1[l] = sums[c1][l] + delta;
                    s2[l] = sums[c2][l] - delta;
                }
                let mut cost = skew(&s1, &global) + skew(&s2, &global);
                if zone_of.is_some() {
                    trial1.clone_from(&cliques[c1]);
                    trial2.clone_from(&cliques[c2]);
                    trial1[x] = j;
                    trial2[y] = i;
                    cost += mixed(&trial1) + mixed(&trial2);
                }
                if cost < current - 1e-12 {
                    improving.push((x, y));
                }
            }
        }
        if let Some(&(x, y)) = improving.get(rng.random_range(0..improving.len().max(1))) {
            let (i, j) = (cliques[c1][x], cliques[c2][y]);
            for l in 0..classes {
                let delta = histograms[j][l] - histograms[i][l];
                sums[c1][l] += delta;
                sums[c2][l] -= delta;
            }
            cliques[c1][x] = j;
            cliques[c2][y] = i;
        }
    }
    cliques
}

/// `members` cut into round(len / size) chunks (at least one) whose lengths differ by one at most.
fn near_equal_chunks(members: Vec<usize>, size: usize) -> Vec<Vec<usize>> {
    let n = members.len();
    let count = ((n as f64 / size.max(1) as f64).round() as usize).clamp(1, n.max(1));
    let mut rest = members.into_iter();
    (0..count)
        .map(|k| {
            rest.by_ref()
                .take(n / count + usize::from(k < n % count))
                .collect()
        })
        .collect()
}

/// The least a trade must lower two cliques' summed label skew to be made: smaller gains
/// rewire two cliques' members for next to nothing.
pub const MIN_TRADE_GAIN: f64 = 0.05;

/// One trade [`Topology::rebalance_worst_cliques`] made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trade {
    /// Two members exchanged cliques.
    Swap(MemberId, MemberId),
    /// A member moved from its clique to a smaller one below the target size.
    Move { member: MemberId, to: u32 },
}

impl Trade {
    /// The members whose clique changed.
    pub fn members(&self) -> Vec<MemberId> {
        match *self {
            Trade::Swap(a, b) => vec![a, b],
            Trade::Move { member, .. } => vec![member],
        }
    }
}

impl Topology {
    /// Greedy Swap from the cliques as they stand, aimed at the worst one: while the worst
    /// clique's label skew is above `target`, make the trade between it and another clique
    /// (a swap of two members, or a move into the smaller clique while it is below the target
    /// size) that lowers the two cliques' summed skew most, if by at least [`MIN_TRADE_GAIN`];
    /// at most `limit` trades. Only the traded members' two cliques rewire, so a change costs
    /// the members of a few cliques a new view, never everyone (a fresh build would). Members
    /// trade only within their zone, so every clique keeps the zones it has. Bumps the version
    /// when anything changed. Nothing for other shapes or members without histograms.
    pub fn rebalance_worst_cliques(&mut self, target: f64, limit: usize) -> Vec<Trade> {
        let Shape::Cliques(layout) = &mut self.shape else {
            return Vec::new();
        };
        if layout.flavour != CliqueFlavour::DCliques || layout.cliques.len() < 2 {
            return Vec::new();
        }
        let profiles = &self.profiles;
        let histogram = |m: &MemberId| profiles.get(m).and_then(|p| p.histogram.as_deref());
        let Some(classes) = layout
            .cliques
            .values()
            .flatten()
            .next()
            .and_then(histogram)
            .map(<[f64]>::len)
        else {
            return Vec::new();
        };
        let all: Option<Vec<&[f64]>> = layout.cliques.values().flatten().map(histogram).collect();
        let Some(all) = all.filter(|hs| hs.iter().all(|h| h.len() == classes)) else {
            return Vec::new();
        };
        let global = distribution(&sum(all, classes));
        let zone = |m: &MemberId| profiles.get(m).and_then(|p| p.zone.as_deref());
        let mut sums: BTreeMap<u32, Vec<f64>> = layout
            .cliques
            .iter()
            .map(|(&c, ms)| (c, sum(ms.iter().filter_map(histogram), classes)))
            .collect();
        let mut trades = Vec::new();
        let mut trial_w = vec![0.0; classes];
        let mut trial_c = vec![0.0; classes];
        while trades.len() < limit {
            let Some((w, worst)) = sums
                .iter()
                .map(|(&c, s)| (c, skew(s, &global)))
                .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)))
            else {
                break;
            };
            if worst <= target {
                break;
            }
            let ws = &layout.cliques[&w];
            let mut best: Option<(f64, Trade)> = None;
            let mut consider = |gain: f64, trade: Trade| {
                if gain >= MIN_TRADE_GAIN && best.is_none_or(|(g, _)| gain > g + 1e-12) {
                    best = Some((gain, trade));
                }
            };
            for (&c, cs) in layout.cliques.iter().filter(|(c, _)| **c != w) {
                let (sum_w, sum_c) = (&sums[&w], &sums[&c]);
                let current = worst + skew(sum_c, &global);
                // `delta` moves from clique c to clique w.
                let mut gain_of = |delta: &dyn Fn(usize) -> f64| {
                    for l in 0..classes {
                        trial_w[l] = sum_w[l] + delta(l);
                        trial_c[l] = sum_c[l] - delta(l);
                    }
                    current - skew(&trial_w, &global) - skew(&trial_c, &global)
                };
                for &i in ws {
                    for &j in cs.iter().filter(|&j| zone(j) == zone(&i)) {
                        let (hi, hj) = (
                            histogram(&i).expect("checked"),
                            histogram(&j).expect("checked"),
                        );
                        consider(gain_of(&|l| hj[l] - hi[l]), Trade::Swap(i, j));
                    }
                }
                let shares_zone =
                    |m: &MemberId, ms: &[MemberId]| ms.iter().any(|o| zone(o) == zone(m));
                if ws.len() > cs.len() && cs.len() < layout.target_size {
                    for i in ws.iter().filter(|i| shares_zone(i, cs)) {
                        let hi = histogram(i).expect("checked");
                        consider(gain_of(&|l| -hi[l]), Trade::Move { member: *i, to: c });
                    }
                }
                if cs.len() > ws.len() && ws.len() < layout.target_size {
                    for j in cs.iter().filter(|j| shares_zone(j, ws)) {
                        let hj = histogram(j).expect("checked");
                        consider(gain_of(&|l| hj[l]), Trade::Move { member: *j, to: w });
                    }
                }
            }
            let Some((_, trade)) = best else {
                break;
            };
            let owner = |m: MemberId, layout: &CliqueLayout| layout.clique_of(m).expect("placed");
            let moved: Vec<(MemberId, u32, u32)> = match trade {
                Trade::Swap(a, b) => {
                    let (ca, cb) = (owner(a, layout), owner(b, layout));
                    layout.swap_members(a, b);
                    vec![(a, ca, cb), (b, cb, ca)]
                }
                Trade::Move { member, to } => {
                    let from = owner(member, layout);
                    layout.move_member(member, to);
                    vec![(member, from, to)]
                }
            };
            for (m, from, to) in moved {
                for (l, x) in histogram(&m).expect("checked").iter().enumerate() {
                    sums.get_mut(&from).expect("clique")[l] -= x;
                    sums.get_mut(&to).expect("clique")[l] += x;
                }
            }
            trades.push(trade);
        }
        if !trades.is_empty() {
            self.graph = layout.graph();
            self.version += 1;
        }
        trades
    }
}

/// Mean and max skew over cliques (of member histograms), the measure Greedy Swap lowers.
pub fn clique_skews(cliques: &[Vec<&[f64]>]) -> Vec<f64> {
    let classes = cliques.iter().flatten().next().map_or(0, |h| h.len());
    let global = distribution(&sum(cliques.iter().flatten().copied(), classes));
    cliques
        .iter()
        .map(|c| skew(&sum(c.iter().copied(), classes), &global))
        .collect()
}

/// Histograms for the D-Cliques setting when no data is at hand: member k holds only class
/// k mod `classes`, `per_member` examples.
pub fn one_class_per_member(members: usize, classes: usize, per_member: f64) -> Vec<Vec<f64>> {
    (0..members)
        .map(|k| {
            let mut h = vec![0.0; classes];
            h[k % classes.max(1)] = per_member;
            h
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_swap_finds_balanced_cliques_for_one_class_per_member() {
        let hs = one_class_per_member(100, 10, 50.0);
        let refs: Vec<&[f64]> = hs.iter().map(Vec::as_slice).collect();
        let random = greedy_swap(&refs, 10, 0, 3);
        let swapped = greedy_swap(&refs, 10, 1000, 3);
        let skews = |cs: &Vec<Vec<usize>>| {
            let groups: Vec<Vec<&[f64]>> = cs
                .iter()
                .map(|c| c.iter().map(|&k| refs[k]).collect())
                .collect();
            clique_skews(&groups)
        };
        let before: f64 = skews(&random).iter().sum();
        let after: f64 = skews(&swapped).iter().sum();
        assert!(
            before > 1.0,
            "random cliques should be skewed, got {before}"
        );
        assert!(
            after < 1e-9,
            "1000 swaps should reach zero skew, got {after}"
        );
        // Every member is placed exactly once.
        let mut all: Vec<usize> = swapped.concat();
        all.sort();
        assert_eq!(all, (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn swaps_never_increase_total_skew() {
        let hs: Vec<Vec<f64>> = (0..60)
            .map(|k| vec![(k % 7) as f64, (k % 3) as f64 + 1.0, (k % 5) as f64])
            .collect();
        let refs: Vec<&[f64]> = hs.iter().map(Vec::as_slice).collect();
        let mut last = f64::INFINITY;
        for steps in [0, 10, 100, 1000] {
            let cs = greedy_swap(&refs, 6, steps, 9);
            let groups: Vec<Vec<&[f64]>> = cs
                .iter()
                .map(|c| c.iter().map(|&k| refs[k]).collect())
                .collect();
            let total: f64 = clique_skews(&groups).iter().sum();
            assert!(total <= last + 1e-9, "{steps} steps: {total} > {last}");
            last = total;
        }
    }
}
