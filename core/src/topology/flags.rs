//! How to shape a topology beyond its kind: the options the job spec, `murmur topology` and
//! `murmur-trainer simulate` share. With the `cli` feature they are also command-line flags.

use crate::api::{InterClique, TopologyKind};

use super::BuildSpec;

#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct TopologyOptions {
    /// dcliques: members per clique.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 10))]
    pub clique_size: usize,
    /// dcliques: how cliques are linked.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value = "small-world"))]
    pub inter_clique: InterClique,
    /// proxy-clumps: number of clumps (default ceil(log2 members)).
    #[cfg_attr(feature = "cli", arg(long))]
    pub clumps: Option<usize>,
    /// moshpit: grid side (members per group).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = crate::api::AlgorithmSpec::DEFAULT_GROUP_SIZE as usize))]
    pub group_size: usize,
}

impl TopologyOptions {
    /// A build spec for `kind` with these options and `seed`.
    pub fn build_spec(&self, kind: TopologyKind, seed: u64) -> BuildSpec {
        BuildSpec {
            clique_size: self.clique_size,
            inter_clique: self.inter_clique,
            clumps: self.clumps,
            seed,
            ..BuildSpec::new(kind)
        }
    }
}
