//! The arithmetic of averaging, shared by every algorithm and both runtimes. Pure functions over
//! flat parameter buffers.
//!
//! The averaging kernels are also compiled for AVX2 and AVX-512 and picked at run time
//! (`multiversion`; the baseline x86-64 build converts two f32s to f64 per instruction). The
//! operations and their order are the same in every version and Rust never fuses a multiply
//! and an add on its own, so every CPU computes the same bits.

use std::collections::BTreeSet;

use multiversion::multiversion;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

use murmur_core::topology::MemberId;

/// x_i <- (W_ii x_i + sum_j W_ij x_j) / (W_ii + sum_j W_ij) over the neighbours that delivered.
/// With every neighbour present the denominator is 1 (W is stochastic); a neighbour that left or
/// timed out drops out and the remaining weights are renormalised, so the round still completes.
#[multiversion(targets = "simd")]
pub fn weighted_average(own: &[f32], self_weight: f64, received: &[(f64, &[f32])]) -> Vec<f32> {
    let total: f64 = self_weight + received.iter().map(|(w, _)| w).sum::<f64>();
    // Sums run in f64 one cache-sized block at a time: exact enough, and no f64 copy of the
    // whole model (which for 10M parameters is 80 MB of page faults per round).
    const BLOCK: usize = 2048;
    let mut acc = [0f64; BLOCK];
    let mut out = Vec::with_capacity(own.len());
    for start in (0..own.len()).step_by(BLOCK) {
        let end = (start + BLOCK).min(own.len());
        let acc = &mut acc[..end - start];
        for (a, v) in acc.iter_mut().zip(&own[start..end]) {
            *a = f64::from(*v) * self_weight;
        }
        for (w, x) in received {
            for (a, v) in acc.iter_mut().zip(&x[start..end]) {
                *a += w * f64::from(*v);
            }
        }
        out.extend(acc.iter().map(|a| (a / total) as f32));
    }
    out
}

/// [`weighted_average`] together with `distance(own, &mean(own, ..))` (the member's local
/// disagreement), in one pass over the received models instead of two: with many neighbours the
/// round is bound by reading them. Both results are bit-identical to the two separate calls (a
/// proptest checks it), so a change to one of the two kernels belongs in both. One const-generic
/// kernel for both was tried and measured slower on the 100-member fully connected simulation.
#[multiversion(targets = "simd")]
pub fn weighted_average_and_disagreement(
    own: &[f32],
    self_weight: f64,
    received: &[(f64, &[f32])],
) -> (Vec<f32>, f64) {
    let total: f64 = self_weight + received.iter().map(|(w, _)| w).sum::<f64>();
    let count: f64 = 1.0 + received.iter().map(|_| 1.0).sum::<f64>();
    const BLOCK: usize = 2048;
    let (mut weighted, mut plain) = ([0f64; BLOCK], [0f64; BLOCK]);
    let mut out = Vec::with_capacity(own.len());
    let mut squares = -0.0f64;
    for start in (0..own.len()).step_by(BLOCK) {
        let end = (start + BLOCK).min(own.len());
        let (weighted, plain) = (&mut weighted[..end - start], &mut plain[..end - start]);
        for ((w, p), v) in weighted
            .iter_mut()
            .zip(plain.iter_mut())
            .zip(&own[start..end])
        {
            *w = f64::from(*v) * self_weight;
            *p = f64::from(*v) * 1.0;
        }
        for (weight, x) in received {
            for ((w, p), v) in weighted
                .iter_mut()
                .zip(plain.iter_mut())
                .zip(&x[start..end])
            {
                *w += weight * f64::from(*v);
                *p += 1.0 * f64::from(*v);
            }
        }
        out.extend(weighted.iter().map(|a| (a / total) as f32));
        for (p, v) in plain.iter().zip(&own[start..end]) {
            let mean = (p / count) as f32;
            squares += (f64::from(*v) - f64::from(mean)).powi(2);
        }
    }
    (out, squares.sqrt())
}

/// Uniform mean of `own` and everything received (clique gradients, Moshpit groups).
pub fn mean(own: &[f32], received: &[&[f32]]) -> Vec<f32> {
    let weighted: Vec<(f64, &[f32])> = received.iter().map(|x| (1.0, *x)).collect();
    weighted_average(own, 1.0, &weighted)
}

/// The gossip partner of `me` in `round`: a random maximal matching of the graph's edges, drawn
/// from (seed, round) so that every member computes the same matching without talking.
pub fn gossip_partner(
    edges: &[(MemberId, MemberId)],
    seed: u64,
    round: u64,
    me: MemberId,
) -> Option<MemberId> {
    let mut order: Vec<(MemberId, MemberId)> = edges.to_vec();
    order.sort_unstable();
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ round.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    order.shuffle(&mut rng);
    let mut taken = BTreeSet::new();
    for (a, b) in order {
        if taken.contains(&a) || taken.contains(&b) {
            continue;
        }
        taken.insert(a);
        taken.insert(b);
        if a == me {
            return Some(b);
        }
        if b == me {
            return Some(a);
        }
    }
    None
}

/// Euclidean distance between two parameter buffers.
pub fn distance(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2))
        .sum::<f64>()
        .sqrt()
}

/// Mean distance of members' parameters to their average: (1/n) sum_i ||x_i - x_bar||.
pub fn consensus_distance(models: &[&[f32]]) -> f64 {
    let Some(first) = models.first() else {
        return 0.0;
    };
    let n = models.len() as f64;
    let mut avg = vec![0f64; first.len()];
    for m in models {
        for (a, v) in avg.iter_mut().zip(m.iter()) {
            *a += f64::from(*v) / n;
        }
    }
    models
        .iter()
        .map(|m| {
            m.iter()
                .zip(&avg)
                .map(|(v, a)| (f64::from(*v) - a).powi(2))
                .sum::<f64>()
                .sqrt()
        })
        .sum::<f64>()
        / n
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn the_fused_round_equals_the_two_separate_calls_bit_for_bit(
            len in 0usize..5000,
            seeds in proptest::collection::vec((0.0f64..1.0, any::<u64>()), 0..5),
            self_weight in 0.01f64..1.0,
        ) {
            let values = |seed: u64| -> Vec<f32> {
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                (0..len).map(|_| rand::Rng::random_range(&mut rng, -3.0f32..3.0)).collect()
            };
            let own = values(1);
            let others: Vec<(f64, Vec<f32>)> = seeds.iter().map(|(w, s)| (*w, values(*s))).collect();
            let received: Vec<(f64, &[f32])> = others.iter().map(|(w, x)| (*w, x.as_slice())).collect();
            let refs: Vec<&[f32]> = others.iter().map(|(_, x)| x.as_slice()).collect();
            let (mixed, disagreement) = weighted_average_and_disagreement(&own, self_weight, &received);
            prop_assert_eq!(mixed, weighted_average(&own, self_weight, &received));
            prop_assert_eq!(disagreement.to_bits(), distance(&own, &mean(&own, &refs)).to_bits());
        }
    }

    #[test]
    fn full_rounds_apply_w_and_missing_neighbours_renormalise() {
        let (a, b, c) = (vec![0.0f32, 3.0], vec![3.0f32, 0.0], vec![6.0f32, 6.0]);
        let third = 1.0 / 3.0;
        let all = weighted_average(&a, third, &[(third, &b), (third, &c)]);
        assert!((all[0] - 3.0).abs() < 1e-6 && (all[1] - 3.0).abs() < 1e-6);
        // c timed out: a and b weigh a half each.
        let partial = weighted_average(&a, third, &[(third, &b)]);
        assert!((partial[0] - 1.5).abs() < 1e-6 && (partial[1] - 1.5).abs() < 1e-6);
        assert_eq!(mean(&a, &[&b, &c]), vec![3.0, 3.0]);
        assert_eq!(mean(&a, &[]), a);
    }

    #[test]
    fn gossip_pairs_are_mutual_and_deterministic() {
        let edges: Vec<(MemberId, MemberId)> = (0..10).map(|i| (i, (i + 1) % 10)).collect();
        for round in 0..20 {
            for me in 0..10 {
                if let Some(p) = gossip_partner(&edges, 3, round, me) {
                    assert_eq!(
                        gossip_partner(&edges, 3, round, p),
                        Some(me),
                        "round {round}"
                    );
                    assert!(
                        edges.contains(&(me.min(p), me.max(p)))
                            || edges.contains(&(me.max(p), me.min(p)))
                    );
                }
            }
        }
        let r0: Vec<_> = (0..10).map(|m| gossip_partner(&edges, 3, 0, m)).collect();
        let r1: Vec<_> = (0..10).map(|m| gossip_partner(&edges, 3, 1, m)).collect();
        assert_ne!(r0, r1, "matchings change between rounds");
    }

    #[test]
    fn consensus_distance_is_zero_only_at_agreement() {
        let (a, b) = (vec![1.0f32, 1.0], vec![1.0f32, 1.0]);
        assert_eq!(consensus_distance(&[&a, &b]), 0.0);
        let c = vec![3.0f32, 1.0];
        assert!((consensus_distance(&[&a, &c]) - 1.0).abs() < 1e-12);
    }
}
