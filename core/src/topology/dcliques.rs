//! D-Cliques (Bellet et al.): cliques whose joint label distribution is close to the global one,
//! found by Greedy Swap, so that averaging inside a clique cancels each member's label skew.

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::cliques::{CliqueFlavour, CliqueLayout};
use super::graph::Graph;
use super::skew::{distribution, skew, sum};
use super::zones::zone_groups;
use super::{BuildSpec, MemberProfile, Shape, TopologyError, profile_vectors};

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
    // Zone-aware: cliques are swapped inside each zone, towards the job's label distribution.
    let classes = histograms.first().map_or(0, |h| h.len());
    let global = distribution(&sum(histograms.iter().copied(), classes));
    let mut groups = Vec::new();
    for zone in zone_groups(members, spec.zone_aware) {
        let own: Vec<&[f64]> = zone.iter().map(|&i| histograms[i]).collect();
        let cliques =
            greedy_swap_towards(&own, &global, spec.clique_size, spec.swap_steps, spec.seed);
        groups.extend(
            cliques
                .into_iter()
                .map(|g| g.into_iter().map(|k| members[zone[k]].id).collect()),
        );
    }
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
    let classes = histograms.first().map_or(0, |h| h.len());
    let global = distribution(&sum(histograms.iter().copied(), classes));
    greedy_swap_towards(histograms, &global, size, steps, seed)
}

/// Greedy Swap towards a given label distribution (the job's, when these members are one zone).
fn greedy_swap_towards(
    histograms: &[&[f64]],
    global: &[f64],
    size: usize,
    steps: usize,
    seed: u64,
) -> Vec<Vec<usize>> {
    let n = histograms.len();
    let classes = global.len();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut rng);
    let mut cliques: Vec<Vec<usize>> = order.chunks(size.max(1)).map(<[_]>::to_vec).collect();
    if cliques.len() < 2 {
        return cliques;
    }
    let mut sums: Vec<Vec<f64>> = cliques
        .iter()
        .map(|c| sum(c.iter().map(|&k| histograms[k]), classes))
        .collect();
    let mut s1 = vec![0.0; classes];
    let mut s2 = vec![0.0; classes];
    let mut improving = Vec::new();
    for _ in 0..steps {
        let c1 = rng.random_range(0..cliques.len());
        let mut c2 = rng.random_range(0..cliques.len() - 1);
        if c2 >= c1 {
            c2 += 1;
        }
        let current = skew(&sums[c1], global) + skew(&sums[c2], global);
        improving.clear();
        for (x, &i) in cliques[c1].iter().enumerate() {
            for (y, &j) in cliques[c2].iter().enumerate() {
                for l in 0..classes {
                    let delta = histograms[j][l] - histograms[i][l];
                    s1[l] = sums[c1][l] + delta;
                    s2[l] = sums[c2][l] - delta;
                }
                if skew(&s1, global) + skew(&s2, global) < current - 1e-12 {
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
