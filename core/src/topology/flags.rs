//! How to shape a topology beyond its kind: the options the job spec, `murmur topology` and
//! `murmur-trainer simulate` share. With the `cli` feature they are also command-line flags.

use crate::api::{CliqueMix, InterClique, TopologyKind};

use super::BuildSpec;

#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct TopologyOptions {
    /// dcliques: members per clique.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = crate::api::TopologySpec::DEFAULT_CLIQUE_SIZE as usize))]
    pub clique_size: usize,
    /// dcliques and proxy-clumps: how cliques are linked (default small-world).
    #[cfg_attr(feature = "cli", arg(long, value_enum))]
    pub inter_clique: Option<InterClique>,
    /// proxy-clumps: number of clumps (default ceil(log2 members)).
    #[cfg_attr(feature = "cli", arg(long))]
    pub clumps: Option<usize>,
    /// proxy-clumps: one member of every clump per clique (heterogeneous), or cliques cut from
    /// one clump each (homogeneous, the paper's control).
    #[cfg_attr(
        feature = "cli",
        arg(long, value_enum, default_value = "heterogeneous")
    )]
    pub clique_mix: CliqueMix,
    /// dcliques and proxy-clumps: form each clique inside one zone (members' zones), so only
    /// bridges cross zones.
    #[cfg_attr(feature = "cli", arg(long))]
    pub zone_aware: bool,
    /// dcliques, --zone-aware: what each clique member outside its clique's main zone costs, in
    /// label skew (which lies in [0, 2]): Greedy Swap mixes zones only for a larger gain.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = super::dcliques::ZONE_MIX_SKEW))]
    pub zone_mix_skew: f64,
    /// moshpit: grid side (members per group).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = crate::api::AlgorithmSpec::DEFAULT_GROUP_SIZE as usize))]
    pub group_size: usize,
}

/// The flags' defaults.
impl Default for TopologyOptions {
    fn default() -> Self {
        Self {
            clique_size: crate::api::TopologySpec::DEFAULT_CLIQUE_SIZE as usize,
            inter_clique: None,
            clumps: None,
            clique_mix: CliqueMix::default(),
            zone_aware: false,
            zone_mix_skew: super::dcliques::ZONE_MIX_SKEW,
            group_size: crate::api::AlgorithmSpec::DEFAULT_GROUP_SIZE as usize,
        }
    }
}

impl TopologyOptions {
    /// A build spec for `kind` with these options and `seed`.
    pub fn build_spec(&self, kind: TopologyKind, seed: u64) -> BuildSpec {
        BuildSpec {
            clique_size: self.clique_size,
            inter_clique: self.inter_clique.unwrap_or_default(),
            clumps: self.clumps,
            clique_mix: self.clique_mix,
            zone_aware: self.zone_aware,
            zone_mix_skew: self.zone_mix_skew,
            seed,
            ..BuildSpec::new(kind)
        }
    }
}
