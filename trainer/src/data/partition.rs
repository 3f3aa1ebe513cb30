//! Partitioners: which training examples each member holds. Every member computes the same global
//! partition from (seed, member count) and keeps its own part, so no data ever moves.

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Gamma};

use murmur_core::api::{PartitionKind, PartitionSpec};

/// A partitioner with its parameters resolved.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Partition {
    Iid,
    /// Sort by label, cut into `members * per_member` shards, deal them out at random.
    Shards {
        per_member: usize,
    },
    /// Per class, proportions across members drawn from Dirichlet(alpha).
    Dirichlet {
        alpha: f64,
    },
    /// Each member holds `k` classes; each class is split evenly among its holders.
    ClassesPerMember {
        k: usize,
    },
}

impl Partition {
    pub fn from_spec(spec: &PartitionSpec) -> Self {
        match spec.kind {
            PartitionKind::Iid => Partition::Iid,
            PartitionKind::Shards => Partition::Shards {
                per_member: spec.per_member.unwrap_or(2) as usize,
            },
            PartitionKind::Dirichlet => Partition::Dirichlet {
                alpha: spec.alpha.unwrap_or(0.5),
            },
            PartitionKind::ClassesPerMember => Partition::ClassesPerMember {
                k: spec.k.unwrap_or(1) as usize,
            },
        }
    }

    /// Whether it deals examples out by their class: all but an IID partition.
    pub fn needs_classes(&self) -> bool {
        !matches!(self, Partition::Iid)
    }

    /// Its `training.partition.kind` in a job spec.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Partition::Iid => "iid",
            Partition::Shards { .. } => "shards",
            Partition::Dirichlet { .. } => "dirichlet",
            Partition::ClassesPerMember { .. } => "classesPerMember",
        }
    }

    /// Parse the CLI form: `iid`, `shards:2`, `dirichlet:0.1`, `classes-per-member:1`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (name, arg) = text
            .split_once(':')
            .map_or((text, None), |(n, a)| (n, Some(a)));
        let num = |what: &str| -> Result<f64, String> {
            let a =
                arg.ok_or_else(|| format!("partition {name} needs a value, e.g. {name}:{what}"))?;
            a.parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v > 0.0)
                .ok_or_else(|| format!("partition {name}: {a:?} is not a positive number"))
        };
        let whole = |what: &str| -> Result<usize, String> {
            let v = num(what)?;
            if v.fract() == 0.0 {
                Ok(v as usize)
            } else {
                Err(format!("partition {name}: {v} is not a whole number"))
            }
        };
        match name {
            "iid" if arg.is_none() => Ok(Partition::Iid),
            "shards" => Ok(Partition::Shards {
                per_member: whole("2")?,
            }),
            "dirichlet" => Ok(Partition::Dirichlet { alpha: num("0.1")? }),
            "classes-per-member" => Ok(Partition::ClassesPerMember { k: whole("1")? }),
            _ => Err(format!(
                "unknown partition {text:?}: use iid, shards:N, dirichlet:ALPHA or classes-per-member:K"
            )),
        }
    }

    /// Indices (into `labels`, each below `classes`) held by each of `members` members.
    pub fn assign(
        &self,
        labels: &[usize],
        classes: usize,
        members: usize,
        seed: u64,
    ) -> Vec<Vec<usize>> {
        assert!(members > 0, "at least one member");
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6d75_726d_7572);
        let mut parts = vec![Vec::new(); members];
        match *self {
            Partition::Iid => {
                let mut all: Vec<usize> = (0..labels.len()).collect();
                all.shuffle(&mut rng);
                for (k, part) in parts.iter_mut().enumerate() {
                    part.extend_from_slice(
                        &all[k * all.len() / members..(k + 1) * all.len() / members],
                    );
                }
            }
            Partition::Shards { per_member } => {
                let mut sorted: Vec<usize> = (0..labels.len()).collect();
                sorted.sort_by_key(|&i| (labels[i], i));
                let shards = members * per_member.max(1);
                let mut order: Vec<usize> = (0..shards).collect();
                order.shuffle(&mut rng);
                for (slot, &shard) in order.iter().enumerate() {
                    let range = shard * sorted.len() / shards..(shard + 1) * sorted.len() / shards;
                    parts[slot / per_member.max(1)].extend_from_slice(&sorted[range]);
                }
            }
            Partition::Dirichlet { alpha } => {
                let gamma = Gamma::new(alpha, 1.0).expect("alpha > 0");
                for class in 0..classes {
                    let mut idx: Vec<usize> =
                        (0..labels.len()).filter(|&i| labels[i] == class).collect();
                    idx.shuffle(&mut rng);
                    let mut p: Vec<f64> = (0..members).map(|_| gamma.sample(&mut rng)).collect();
                    let total: f64 = p.iter().sum();
                    if total <= 0.0 || !total.is_finite() {
                        // Every draw underflowed (tiny alpha): the class goes to one member.
                        p = vec![0.0; members];
                        p[rng.random_range(0..members)] = 1.0;
                    }
                    let total: f64 = p.iter().sum();
                    let mut start = 0;
                    let mut acc = 0.0;
                    for (k, share) in p.iter().enumerate() {
                        acc += share / total;
                        let end = if k + 1 == members {
                            idx.len()
                        } else {
                            (acc * idx.len() as f64).round() as usize
                        };
                        parts[k].extend_from_slice(&idx[start..end.max(start)]);
                        start = end.max(start);
                    }
                }
                // A member with nothing to train on would stall: give it one example.
                for k in 0..members {
                    if parts[k].is_empty() {
                        let donor = (0..members)
                            .max_by_key(|&d| parts[d].len())
                            .expect("members");
                        if parts[donor].len() > 1 {
                            let moved = parts[donor].pop().expect("non-empty");
                            parts[k].push(moved);
                        }
                    }
                }
            }
            Partition::ClassesPerMember { k } => {
                let classes = classes.max(1);
                let k = k.clamp(1, classes);
                let classes_of = |m: usize| (0..k).map(move |j| (m * k + j) % classes);
                for class in 0..classes {
                    let holders: Vec<usize> = (0..members)
                        .filter(|&m| classes_of(m).any(|c| c == class))
                        .collect();
                    if holders.is_empty() {
                        continue;
                    }
                    let mut idx: Vec<usize> =
                        (0..labels.len()).filter(|&i| labels[i] == class).collect();
                    idx.shuffle(&mut rng);
                    for (h, &m) in holders.iter().enumerate() {
                        parts[m].extend_from_slice(
                            &idx[h * idx.len() / holders.len()
                                ..(h + 1) * idx.len() / holders.len()],
                        );
                    }
                }
            }
        }
        for part in &mut parts {
            part.sort_unstable();
        }
        parts
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    const CLASSES: usize = 10;

    fn labels() -> Vec<usize> {
        (0..4000).map(|i| i / 400).collect()
    }

    fn histograms(p: Partition, members: usize) -> Vec<Vec<u64>> {
        let l = labels();
        p.assign(&l, CLASSES, members, 5)
            .iter()
            .map(|ix| {
                let mut h = vec![0; CLASSES];
                for &i in ix {
                    h[l[i]] += 1;
                }
                h
            })
            .collect()
    }

    #[test]
    fn class_partitions_deal_out_as_many_classes_as_the_data_has() {
        // Two classes over four members, one each: two holders per class, none empty.
        let l: Vec<usize> = (0..1000).map(|i| i % 2).collect();
        let parts = Partition::ClassesPerMember { k: 1 }.assign(&l, 2, 4, 9);
        for (m, part) in parts.iter().enumerate() {
            assert_eq!(part.len(), 250, "member {m}");
            assert!(part.iter().all(|&i| l[i] == m % 2), "member {m}");
        }
        // Twelve classes: the last two are dealt out too.
        let l: Vec<usize> = (0..1200).map(|i| i % 12).collect();
        for p in [
            Partition::ClassesPerMember { k: 1 },
            Partition::Dirichlet { alpha: 0.5 },
        ] {
            let total: usize = p.assign(&l, 12, 12, 3).iter().map(Vec::len).sum();
            assert_eq!(total, 1200, "{p:?}");
        }
    }

    #[test]
    fn one_class_per_member_is_the_dcliques_setting() {
        let hs = histograms(Partition::ClassesPerMember { k: 1 }, 100);
        for (m, h) in hs.iter().enumerate() {
            assert_eq!(h.iter().filter(|&&c| c > 0).count(), 1, "member {m}: {h:?}");
            assert_eq!(h[m % 10], 40);
        }
        let hs = histograms(Partition::ClassesPerMember { k: 2 }, 10);
        assert!(
            hs.iter()
                .all(|h| h.iter().filter(|&&c| c > 0).count() == 2 && h.iter().sum::<u64>() == 400)
        );
    }

    #[test]
    fn iid_is_balanced_and_shards_are_few_classes() {
        for h in histograms(Partition::Iid, 10) {
            assert_eq!(h.iter().sum::<u64>(), 400);
            assert!(h.iter().all(|&c| (15..=70).contains(&c)), "{h:?}");
        }
        for h in histograms(Partition::Shards { per_member: 2 }, 20) {
            assert_eq!(h.iter().sum::<u64>(), 200);
            assert!(h.iter().filter(|&&c| c > 0).count() <= 2, "{h:?}");
        }
    }

    #[test]
    fn small_dirichlet_alpha_is_skewed_large_is_not() {
        let top_share = |alpha| {
            let hs = histograms(Partition::Dirichlet { alpha }, 20);
            hs.iter()
                .map(|h| *h.iter().max().unwrap() as f64 / h.iter().sum::<u64>().max(1) as f64)
                .sum::<f64>()
                / 20.0
        };
        assert!(top_share(0.1) > 0.6, "alpha 0.1 should concentrate classes");
        assert!(top_share(100.0) < 0.2, "alpha 100 should be close to iid");
    }

    #[test]
    fn parses_cli_forms() {
        assert_eq!(Partition::parse("iid"), Ok(Partition::Iid));
        assert_eq!(
            Partition::parse("dirichlet:0.1"),
            Ok(Partition::Dirichlet { alpha: 0.1 })
        );
        assert_eq!(
            Partition::parse("classes-per-member:1"),
            Ok(Partition::ClassesPerMember { k: 1 })
        );
        assert_eq!(
            Partition::parse("shards:3"),
            Ok(Partition::Shards { per_member: 3 })
        );
        for bad in ["dirichlet", "dirichlet:-1", "shards:1.5", "random", "iid:2"] {
            assert!(Partition::parse(bad).is_err(), "{bad}");
        }
    }

    proptest! {
        /// Every partition is a disjoint cover of the data (nothing lost, nothing duplicated), is
        /// the same for the same seed, and gives every member something to train on.
        #[test]
        fn partitions_are_deterministic_disjoint_covers(
            kind in 0usize..4, members in 1usize..60, seed in any::<u64>(), alpha in 0.05f64..5.0,
        ) {
            let p = match kind {
                0 => Partition::Iid,
                1 => Partition::Shards { per_member: 2 },
                2 => Partition::Dirichlet { alpha },
                _ => Partition::ClassesPerMember { k: 1 + members % 3 },
            };
            let l = labels();
            let parts = p.assign(&l, CLASSES, members, seed);
            prop_assert_eq!(&parts, &p.assign(&l, CLASSES, members, seed));
            let total: usize = parts.iter().map(Vec::len).sum();
            let unique: BTreeSet<usize> = parts.iter().flatten().copied().collect();
            prop_assert_eq!(unique.len(), total, "an example is held twice");
            if !matches!(p, Partition::ClassesPerMember { .. }) || members * (1 + members % 3) >= CLASSES {
                prop_assert_eq!(total, l.len(), "examples were lost");
            }
            prop_assert!(parts.iter().all(|p| !p.is_empty()), "a member holds nothing");
        }
    }
}
