//! Proxy clumps: members are described by a similarity vector (a label histogram, or their model's
//! mean output on a shared proxy batch), clustered by k-means into K clumps of similar members;
//! every clique then draws one member from each clump, so cliques are diverse without anyone
//! revealing labels. Cliques are joined in a ring with bridge ends from different clumps.

use std::collections::BTreeMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::cliques::{CliqueFlavour, CliqueLayout};
use super::graph::{Graph, MemberId};
use super::{BuildSpec, MemberProfile, Shape, TopologyError, profile_vectors};
use crate::api::InterClique;

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
    let (assignment, centroids) = kmeans(&vectors, k, spec.seed);

    // Deal members into ceil(n / k) cliques clump by clump, so each clique gets about one member
    // from every clump.
    let clique_count = members.len().div_ceil(k);
    let mut groups = vec![Vec::new(); clique_count];
    let mut next = 0;
    for clump in 0..k {
        for (idx, m) in members.iter().enumerate() {
            if assignment[idx] == clump {
                groups[next % clique_count].push(m.id);
                next += 1;
            }
        }
    }
    let clump_of: BTreeMap<MemberId, u32> = members
        .iter()
        .zip(&assignment)
        .map(|(m, &c)| (m.id, c as u32))
        .collect();
    let layout = CliqueLayout::new(
        CliqueFlavour::ProxyClumps {
            clump_of,
            centroids,
        },
        InterClique::Ring,
        k,
        groups,
    );
    Ok((layout.graph(), Shape::Cliques(layout)))
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
        for (c, centroid) in centroids.iter_mut().enumerate() {
            let members: Vec<&Vec<f64>> = vectors
                .iter()
                .zip(&assignment)
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
    (assignment, centroids)
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
