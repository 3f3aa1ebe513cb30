//! Proxy clumps (arXiv 2212.08743): members are described by a similarity vector (their model's
//! mean output on a shared public proxy batch, or else a label histogram), clustered into K
//! clumps of similar members of equal size; every clique then draws one member from each clump,
//! so cliques are diverse without anyone revealing labels. The homogeneous control cuts the same
//! number of cliques, of the same sizes, out of one clump each. Cliques are linked like D-Cliques'
//! (`interClique`), with bridge ends from different clumps.

use std::collections::BTreeMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::cliques::{CliqueFlavour, CliqueLayout};
use super::graph::{Graph, MemberId};
use super::zones::zone_groups;
use super::{BuildSpec, MemberProfile, Shape, TopologyError, profile_vectors};
use crate::api::CliqueMix;

/// Default clump count: ceil(log2 n), at least 1.
pub fn default_clumps(members: usize) -> usize {
    (usize::BITS - members.saturating_sub(1).leading_zeros()).max(1) as usize
}

pub(super) fn build(
    spec: &BuildSpec,
    members: &[MemberProfile],
) -> Result<(Graph, Shape), TopologyError> {
    // A member's proxy vector when it sent one, else its label histogram (normalised).
    let vectors: Vec<Vec<f64>> = if members.iter().all(|m| m.proxy.is_some()) {
        profile_vectors(members, "proxy vector", "proxyClumps", |m| m.proxy.as_ref())?
            .into_iter()
            .map(<[f64]>::to_vec)
            .collect()
    } else {
        profile_vectors(
            members,
            "proxy vector or label histogram",
            "proxyClumps",
            |m| m.proxy.as_ref().or(m.histogram.as_ref()),
        )?
        .into_iter()
        .map(normalise)
        .collect()
    };
    let k = spec
        .clumps
        .unwrap_or_else(|| default_clumps(members.len()))
        .clamp(1, members.len());
    let (assignment, centroids) = balanced_kmeans(&vectors, k, spec.seed);
    // Zone-aware: each zone's members make their own cliques from the job-wide clumps.
    let mut groups = Vec::new();
    for zone in zone_groups(members, spec.zone_aware) {
        let clumps: Vec<usize> = zone.iter().map(|&i| assignment[i]).collect();
        groups.extend(compose(&clumps, k, spec.clique_mix).into_iter().map(|g| {
            g.into_iter()
                .map(|i| members[zone[i]].id)
                .collect::<Vec<_>>()
        }));
    }
    let clump_of: BTreeMap<MemberId, u32> = members
        .iter()
        .zip(&assignment)
        .map(|(m, &c)| (m.id, c as u32))
        .collect();
    let mut layout = CliqueLayout::new(
        CliqueFlavour::ProxyClumps {
            clump_of,
            centroids,
            homogeneous: spec.clique_mix == CliqueMix::Homogeneous,
        },
        spec.inter_clique,
        k,
        groups,
    );
    layout.zone_aware = spec.zone_aware;
    Ok((layout.graph(), Shape::Cliques(layout)))
}

/// Cliques (as indices into `clump`) from each member's clump: ceil(n / k) cliques. Members are
/// taken clump by clump; heterogeneous deals them round the cliques, so with clumps of at most
/// ceil(n / k) members no clique holds two of one clump; homogeneous fills the cliques one after
/// the other with the same sizes, so each is cut from one clump (or two, where a clump ends).
fn compose(clump: &[usize], k: usize, mix: CliqueMix) -> Vec<Vec<usize>> {
    let n = clump.len();
    let cliques = n.div_ceil(k.max(1));
    let order: Vec<usize> = (0..k)
        .flat_map(|c| (0..n).filter(move |&i| clump[i] == c))
        .collect();
    let mut groups = vec![Vec::new(); cliques];
    for (slot, &i) in order.iter().enumerate() {
        groups[slot % cliques].push(i);
    }
    if mix == CliqueMix::Homogeneous {
        let sizes: Vec<usize> = groups.iter().map(Vec::len).collect();
        let mut rest = order.into_iter();
        groups = sizes
            .into_iter()
            .map(|size| rest.by_ref().take(size).collect())
            .collect();
    }
    groups
}

fn normalise(v: &[f64]) -> Vec<f64> {
    let total: f64 = v.iter().sum();
    if total > 0.0 {
        v.iter().map(|x| x / total).collect()
    } else {
        v.to_vec()
    }
}

fn distance2(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum()
}

/// Index of the centroid nearest to `v`.
pub fn nearest(centroids: &[Vec<f64>], v: &[f64]) -> usize {
    centroids
        .iter()
        .enumerate()
        .min_by(|(_, a), (_, b)| distance2(a, v).total_cmp(&distance2(b, v)))
        .map_or(0, |(k, _)| k)
}

/// Seeded k-means (k-means++ start, Lloyd iterations until stable). Returns each vector's cluster
/// and the centroids. Deterministic for a seed.
pub fn kmeans(vectors: &[Vec<f64>], k: usize, seed: u64) -> (Vec<usize>, Vec<Vec<f64>>) {
    let n = vectors.len();
    let k = k.clamp(1, n.max(1));
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut centroids = vec![vectors[rng.random_range(0..n)].clone()];
    while centroids.len() < k {
        let d: Vec<f64> = vectors
            .iter()
            .map(|v| {
                centroids
                    .iter()
                    .map(|c| distance2(c, v))
                    .fold(f64::INFINITY, f64::min)
            })
            .collect();
        let total: f64 = d.iter().sum();
        let pick = if total <= 0.0 {
            // Fewer distinct points than clusters: take any unused point.
            centroids.len()
        } else {
            let mut r = rng.random_range(0.0..total);
            d.iter()
                .position(|&x| {
                    r -= x;
                    r < 0.0
                })
                .unwrap_or(n - 1)
        };
        centroids.push(vectors[pick.min(n - 1)].clone());
    }
    let mut assignment = vec![usize::MAX; n];
    for _ in 0..100 {
        let next: Vec<usize> = vectors.iter().map(|v| nearest(&centroids, v)).collect();
        if next == assignment {
            break;
        }
        assignment = next;
        update_centroids(vectors, &assignment, &mut centroids);
    }
    (assignment, centroids)
}

/// k-means with clumps of equal size (floor or ceil of n / k): seeded k-means for the centroids,
/// then assignments under capacity (nearest pairs first) alternating with centroid updates until
/// stable. Equal clumps are what lets every clique take one member of each.
pub fn balanced_kmeans(vectors: &[Vec<f64>], k: usize, seed: u64) -> (Vec<usize>, Vec<Vec<f64>>) {
    let (_, mut centroids) = kmeans(vectors, k, seed);
    let mut assignment = Vec::new();
    for _ in 0..100 {
        let next = assign_with_capacity(vectors, &centroids);
        if next == assignment {
            break;
        }
        assignment = next;
        update_centroids(vectors, &assignment, &mut centroids);
    }
    (assignment, centroids)
}

/// Nearest (member, centroid) pairs first; a clump takes floor(n / k) members, and n mod k of
/// them one more.
fn assign_with_capacity(vectors: &[Vec<f64>], centroids: &[Vec<f64>]) -> Vec<usize> {
    let (n, k) = (vectors.len(), centroids.len().max(1));
    let floor = n / k;
    let mut extra = n % k;
    let mut pairs: Vec<(f64, usize, usize)> = vectors
        .iter()
        .enumerate()
        .flat_map(|(i, v)| {
            centroids
                .iter()
                .enumerate()
                .map(move |(c, centroid)| (distance2(centroid, v), i, c))
        })
        .collect();
    pairs.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let mut assignment = vec![usize::MAX; n];
    let mut size = vec![0usize; k];
    for (_, i, c) in pairs {
        if assignment[i] != usize::MAX {
            continue;
        }
        if size[c] < floor || (size[c] == floor && extra > 0) {
            if size[c] == floor {
                extra -= 1;
            }
            size[c] += 1;
            assignment[i] = c;
        }
    }
    assignment
}

fn update_centroids(vectors: &[Vec<f64>], assignment: &[usize], centroids: &mut [Vec<f64>]) {
    for (c, centroid) in centroids.iter_mut().enumerate() {
        let members: Vec<&Vec<f64>> = vectors
            .iter()
            .zip(assignment)
            .filter(|(_, a)| **a == c)
            .map(|(v, _)| v)
            .collect();
        if !members.is_empty() {
            for (d, x) in centroid.iter_mut().enumerate() {
                *x = members.iter().map(|m| m[d]).sum::<f64>() / members.len() as f64;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_clump_count_is_ceil_log2() {
        assert_eq!(
            [1, 2, 3, 4, 5, 8, 9, 100, 1024].map(default_clumps),
            [1, 1, 2, 2, 3, 3, 4, 7, 10]
        );
    }

    #[test]
    fn kmeans_separates_well_separated_groups() {
        let mut vs = Vec::new();
        for g in 0..3 {
            for k in 0..5 {
                vs.push(vec![g as f64 * 10.0 + k as f64 * 0.01, -(g as f64) * 10.0]);
            }
        }
        let (assign, centroids) = kmeans(&vs, 3, 1);
        assert_eq!(centroids.len(), 3);
        for g in 0..3 {
            let first = assign[g * 5];
            assert!(assign[g * 5..g * 5 + 5].iter().all(|&a| a == first));
        }
        assert_ne!(assign[0], assign[5]);
        assert_ne!(assign[5], assign[10]);
    }
}
