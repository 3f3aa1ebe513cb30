//! Topology flags shared by `murmur topology` and `murmur-trainer simulate`.

use crate::api::{InterClique, TopologyKind};

use super::BuildSpec;

#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct TopologyFlags {
    /// dcliques: members per clique.
    #[arg(long, default_value_t = 10)]
    pub clique_size: usize,
    /// dcliques: how cliques are linked.
    #[arg(long, value_enum, default_value = "small-world")]
    pub inter_clique: InterClique,
    /// proxy-clumps: number of clumps (default ceil(log2 members)).
    #[arg(long)]
    pub clumps: Option<usize>,
    /// moshpit: grid side (members per group).
    #[arg(long, default_value_t = 4)]
    pub group_size: usize,
}

impl TopologyFlags {
    /// A build spec for `kind` with these flags and `seed`.
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
