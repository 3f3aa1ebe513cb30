//! The topology engine: pure graph builders, Metropolis–Hastings weights, elastic repair and graph
//! measures. Used by the planner, the `murmur topology` CLI and the trainer's simulator, which all
//! choose their graph through [`Recipe`]. No I/O.

mod choice;
mod cliques;
pub mod dcliques;
mod flags;
pub mod graph;
pub mod measures;
pub mod moshpit;
pub mod proxy_clumps;
pub mod render;
mod repair;
mod simple;
pub mod skew;
pub mod weights;
pub mod zones;

use std::collections::BTreeMap;

use crate::api::{CliqueMix, InterClique, TopologyKind};
use crate::contract::{DocumentEdge, DocumentMember, TopologyDocument};

pub use choice::{GraphChoice, Rebalance, Recipe};
pub use cliques::{Bridge, CliqueFlavour, CliqueLayout};
pub use flags::TopologyOptions;
pub use graph::{Graph, MemberId};
pub use measures::{Measures, measure};
pub use moshpit::MoshpitGrid;
pub use repair::Repair;
pub use simple::{ONE_PEER_EXPONENTIAL, OnePeer, one_peer};
pub use weights::{MixingWeights, metropolis_hastings};

/// What the control plane knows about a member's data: summaries from its join report, never the
/// data itself.
#[derive(Clone, Debug, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct MemberProfile {
    pub id: MemberId,
    /// Examples per class in the member's shard.
    pub histogram: Option<Vec<f64>>,
    /// Mean softmax on the shared proxy batch.
    pub proxy: Option<Vec<f64>>,
    /// The zone the member runs in (its node's `topology.kubernetes.io/zone`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
}

impl MemberProfile {
    pub fn bare(id: MemberId) -> Self {
        Self {
            id,
            ..Self::default()
        }
    }

    /// Members 0..n described by their label histograms only.
    pub fn from_histograms(histograms: Vec<Vec<f64>>) -> Vec<Self> {
        histograms
            .into_iter()
            .enumerate()
            .map(|(k, h)| Self {
                id: k as MemberId,
                histogram: Some(h),
                ..Self::default()
            })
            .collect()
    }
}

/// How to build a graph: the job's topology spec with defaults resolved, plus a seed.
#[derive(Clone, Debug, PartialEq)]
pub struct BuildSpec {
    pub kind: TopologyKind,
    pub clique_size: usize,
    pub inter_clique: InterClique,
    /// proxyClumps: number of clumps; None means ceil(log2 n).
    pub clumps: Option<usize>,
    /// proxyClumps: heterogeneous cliques, or the homogeneous control.
    pub clique_mix: CliqueMix,
    /// dCliques and proxyClumps: form each clique inside one zone (members' `zone`), so that
    /// every round's clique traffic stays in its zone and only bridges cross.
    pub zone_aware: bool,
    /// dCliques, zone-aware: what a clique member outside the clique's main zone costs, in skew.
    pub zone_mix_skew: f64,
    pub seed: u64,
    /// dCliques: Greedy Swap iterations.
    pub swap_steps: usize,
}

impl BuildSpec {
    pub fn new(kind: TopologyKind) -> Self {
        Self {
            kind,
            clique_size: crate::api::TopologySpec::DEFAULT_CLIQUE_SIZE as usize,
            inter_clique: InterClique::default(),
            clumps: None,
            clique_mix: CliqueMix::default(),
            zone_aware: false,
            zone_mix_skew: dcliques::ZONE_MIX_SKEW,
            seed: 0,
            swap_steps: dcliques::DEFAULT_SWAP_STEPS,
        }
    }

    /// Resolve a job's topology spec (defaults filled in).
    pub fn from_spec(spec: &crate::api::TopologySpec, seed: u64) -> Self {
        Self {
            kind: spec.kind,
            clique_size: spec
                .clique_size
                .unwrap_or(crate::api::TopologySpec::DEFAULT_CLIQUE_SIZE)
                as usize,
            inter_clique: spec.inter_clique.unwrap_or_default(),
            clumps: spec.clumps.map(|c| c as usize),
            clique_mix: spec.clique_mix.unwrap_or_default(),
            zone_aware: false,
            zone_mix_skew: dcliques::ZONE_MIX_SKEW,
            seed,
            swap_steps: dcliques::DEFAULT_SWAP_STEPS,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    #[error("a topology needs at least one member")]
    NoMembers,
    #[error("member {0} appears more than once")]
    DuplicateMember(MemberId),
    #[error("member {0} is not in the topology")]
    UnknownMember(MemberId),
    #[error("member {member} has no {what}; {kind} topologies are built from members' {what}s")]
    MissingProfile {
        member: MemberId,
        what: &'static str,
        kind: &'static str,
    },
    #[error("member {member}'s {what} has {found} entries, other members' have {expected}")]
    ProfileLength {
        member: MemberId,
        what: &'static str,
        expected: usize,
        found: usize,
    },
    #[error("{what} must be at least {min}, got {got}")]
    TooSmall {
        what: &'static str,
        min: usize,
        got: usize,
    },
}

/// The structure a graph was built with; repair keeps it (a ring stays a ring).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[expect(
    clippy::large_enum_variant,
    reason = "one Shape a topology, never in a collection: boxing the clique layout saves nothing"
)]
pub enum Shape {
    Ring {
        order: Vec<MemberId>,
    },
    FullyConnected,
    Exponential {
        order: Vec<MemberId>,
    },
    /// The one-peer exponential schedule over members in id order (the document's order); the
    /// graph is the union of its rounds, the exponential graph in that order.
    OnePeerExponential,
    Cliques(CliqueLayout),
    Grid(MoshpitGrid),
    /// Random d-regular graph; repair keeps every degree at most d and the graph connected.
    RandomRegular {
        degree: usize,
    },
}

impl Shape {
    /// The graph this shape makes on its own, where it makes one: repair keeps a topology's
    /// graph equal to it for these shapes.
    pub fn graph(&self) -> Option<Graph> {
        match self {
            Shape::Cliques(layout) => Some(layout.graph()),
            Shape::Grid(grid) => Some(grid.union_graph()),
            Shape::Exponential { order } => Some(simple::exponential_graph(order)),
            Shape::Ring { .. }
            | Shape::FullyConnected
            | Shape::OnePeerExponential
            | Shape::RandomRegular { .. } => None,
        }
    }

    /// Whether [`Shape::graph`] makes one (without making it).
    fn determines_graph(&self) -> bool {
        matches!(
            self,
            Shape::Cliques(_) | Shape::Grid(_) | Shape::Exponential { .. }
        )
    }
}

/// A versioned communication graph. Serializable, so a control plane can keep it across
/// restarts (the operator stores it in the job's topology ConfigMap). The graph is stored only
/// where the shape does not determine it ([`Shape::graph`]): a 10 000-member D-Cliques graph was
/// a quarter of the operator's stored memory.
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(try_from = "StoredTopology")]
pub struct Topology {
    pub version: u64,
    pub graph: Graph,
    pub shape: Shape,
    /// Profiles of current members (kept for data-aware repair and skew measures).
    pub profiles: BTreeMap<MemberId, MemberProfile>,
    /// The worst clique's label skew when the cliques were built, or last settled after trades:
    /// repair is measured against it, so that members are traded between cliques only when
    /// repair has drifted clearly past it. None until measured.
    pub settled_skew: Option<f64>,
}

/// A [`Topology`] as stored: its graph absent where the shape makes it.
#[derive(serde::Deserialize)]
struct StoredTopology {
    version: u64,
    #[serde(default)]
    graph: Option<Graph>,
    shape: Shape,
    profiles: BTreeMap<MemberId, MemberProfile>,
    #[serde(default, alias = "fresh_skew")]
    settled_skew: Option<f64>,
}

impl serde::Serialize for Topology {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct Borrowed<'a> {
            version: u64,
            #[serde(skip_serializing_if = "Option::is_none")]
            graph: Option<&'a Graph>,
            shape: &'a Shape,
            profiles: &'a BTreeMap<MemberId, MemberProfile>,
            #[serde(skip_serializing_if = "Option::is_none")]
            settled_skew: Option<f64>,
        }
        Borrowed {
            version: self.version,
            graph: (!self.shape.determines_graph()).then_some(&self.graph),
            shape: &self.shape,
            profiles: &self.profiles,
            settled_skew: self.settled_skew,
        }
        .serialize(s)
    }
}

impl TryFrom<StoredTopology> for Topology {
    type Error = String;

    fn try_from(s: StoredTopology) -> Result<Self, String> {
        let graph = match s.graph {
            // Written before the graph was left out, or a shape that needs it.
            Some(graph) => graph,
            None => s.shape.graph().ok_or_else(|| {
                "topology: no `graph`, and its shape does not determine one".to_string()
            })?,
        };
        Ok(Self {
            version: s.version,
            graph,
            shape: s.shape,
            profiles: s.profiles,
            settled_skew: s.settled_skew,
        })
    }
}

/// Build a topology of `spec.kind` over `members` (version 1).
pub fn build(spec: &BuildSpec, members: &[MemberProfile]) -> Result<Topology, TopologyError> {
    if members.is_empty() {
        return Err(TopologyError::NoMembers);
    }
    let mut seen = std::collections::BTreeSet::new();
    for m in members {
        if !seen.insert(m.id) {
            return Err(TopologyError::DuplicateMember(m.id));
        }
    }
    let ids: Vec<MemberId> = members.iter().map(|m| m.id).collect();
    let (graph, shape) = match spec.kind {
        TopologyKind::Ring => simple::ring(&ids),
        TopologyKind::FullyConnected => simple::fully_connected(&ids),
        TopologyKind::Exponential => simple::exponential(&ids),
        TopologyKind::ExponentialOnePeer => simple::one_peer_exponential(&ids),
        TopologyKind::DCliques => dcliques::build(spec, members)?,
        TopologyKind::ProxyClumps => proxy_clumps::build(spec, members)?,
    };
    Ok(Topology {
        version: 1,
        graph,
        shape,
        profiles: members.iter().map(|m| (m.id, m.clone())).collect(),
        settled_skew: None,
    })
}

/// A random d-regular graph over `members` (a baseline of the same degree as a data-aware graph).
pub fn random_regular(
    members: &[MemberProfile],
    degree: usize,
    seed: u64,
) -> Result<Topology, TopologyError> {
    if members.is_empty() {
        return Err(TopologyError::NoMembers);
    }
    let ids: Vec<MemberId> = members.iter().map(|m| m.id).collect();
    Ok(Topology {
        version: 1,
        graph: simple::random_regular(&ids, degree, seed)?,
        shape: Shape::RandomRegular { degree },
        profiles: members.iter().map(|m| (m.id, m.clone())).collect(),
        settled_skew: None,
    })
}

/// A Moshpit grid as a topology: members adjacent when they share a group on some axis.
pub fn moshpit(members: &[MemberProfile], group_size: usize) -> Result<Topology, TopologyError> {
    if members.is_empty() {
        return Err(TopologyError::NoMembers);
    }
    if group_size < 2 {
        return Err(TopologyError::TooSmall {
            what: "groupSize",
            min: 2,
            got: group_size,
        });
    }
    let ids: Vec<MemberId> = members.iter().map(|m| m.id).collect();
    let grid = MoshpitGrid::new(&ids, group_size);
    Ok(Topology {
        version: 1,
        graph: grid.union_graph(),
        shape: Shape::Grid(grid),
        profiles: members.iter().map(|m| (m.id, m.clone())).collect(),
        settled_skew: None,
    })
}

impl Topology {
    pub fn kind_name(&self) -> &'static str {
        match &self.shape {
            Shape::Ring { .. } => "ring",
            Shape::FullyConnected => "fullyConnected",
            Shape::Exponential { .. } => "exponential",
            Shape::OnePeerExponential => ONE_PEER_EXPONENTIAL,
            Shape::Cliques(c) => match c.flavour {
                CliqueFlavour::DCliques => "dCliques",
                CliqueFlavour::ProxyClumps { .. } => "proxyClumps",
            },
            Shape::Grid(_) => "moshpit",
            Shape::RandomRegular { .. } => "randomRegular",
        }
    }

    pub fn weights(&self) -> MixingWeights {
        metropolis_hastings(&self.graph)
    }

    pub fn clique_of(&self, id: MemberId) -> Option<u32> {
        match &self.shape {
            Shape::Cliques(c) => c.clique_of(id),
            _ => None,
        }
    }

    /// Every member's clique (none outside clique topologies).
    pub fn cliques_by_member(&self) -> std::collections::HashMap<MemberId, u32> {
        match &self.shape {
            Shape::Cliques(c) => c.owners().clone(),
            _ => std::collections::HashMap::new(),
        }
    }

    pub fn clump_of(&self, id: MemberId) -> Option<u32> {
        match &self.shape {
            Shape::Cliques(c) => c.clump_of(id),
            _ => None,
        }
    }

    /// The document trainers follow; `address` supplies each member's peer address when known.
    pub fn to_document(&self, address: impl Fn(MemberId) -> Option<String>) -> TopologyDocument {
        let weights = self.weights();
        TopologyDocument {
            version: self.version,
            kind: self.kind_name().to_string(),
            step: 0,
            members: weights
                .rows()
                .map(|(id, row)| DocumentMember {
                    id,
                    address: address(id),
                    clique: self.clique_of(id),
                    clump: self.clump_of(id),
                    self_weight: row.self_weight,
                })
                .collect(),
            edges: self
                .graph
                .edges()
                .map(|(a, b)| DocumentEdge {
                    a,
                    b,
                    weight: weights.weight(a, b),
                })
                .collect(),
        }
    }
}

/// Check that every profile carries a vector of one common length.
fn profile_vectors<'a>(
    members: &'a [MemberProfile],
    what: &'static str,
    kind: &'static str,
    pick: impl Fn(&'a MemberProfile) -> Option<&'a Vec<f64>>,
) -> Result<Vec<&'a [f64]>, TopologyError> {
    let mut out = Vec::with_capacity(members.len());
    for m in members {
        let v = pick(m).ok_or(TopologyError::MissingProfile {
            member: m.id,
            what,
            kind,
        })?;
        if let Some(first) = out.first().map(|f: &&[f64]| f.len())
            && v.len() != first
        {
            return Err(TopologyError::ProfileLength {
                member: m.id,
                what,
                expected: first,
                found: v.len(),
            });
        }
        out.push(v.as_slice());
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
