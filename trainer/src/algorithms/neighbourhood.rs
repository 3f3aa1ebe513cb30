//! What one member needs to know about the topology, read from its view (and, for job-wide
//! schedules, from the whole document).

use murmur_core::contract::{MemberView, TopologyDocument};
use murmur_core::topology::{MemberId, MoshpitGrid, ONE_PEER_EXPONENTIAL, OnePeer, one_peer};

#[derive(Clone, Debug, PartialEq)]
pub struct Neighbourhood {
    pub me: MemberId,
    pub version: u64,
    /// W_ii.
    pub self_weight: f64,
    /// (neighbour, W_ij), sorted by id.
    pub neighbours: Vec<(MemberId, f64)>,
    /// Other members of my clique (empty outside clique topologies).
    pub clique_mates: Vec<MemberId>,
    /// Every edge of the graph (gossip draws matchings from them).
    pub edges: Vec<(MemberId, MemberId)>,
    /// Members in document order (Moshpit lays them on its grid in this order).
    pub members: Vec<MemberId>,
    /// The document is a one-peer exponential topology: averaging follows [`Self::one_peer`]
    /// instead of reaching every neighbour.
    pub one_peer_schedule: bool,
}

impl Neighbourhood {
    /// The neighbourhood `view` describes (None when the topology leaves the member out).
    /// `whole` supplies the job-wide schedule, every edge and member, where the algorithm
    /// needs it.
    pub fn from_view(view: &MemberView, whole: Option<&TopologyDocument>) -> Option<Self> {
        if view.outside {
            return None;
        }
        Some(Self {
            me: view.member,
            version: view.version,
            self_weight: view.self_weight,
            neighbours: view.neighbours.iter().map(|n| (n.id, n.weight)).collect(),
            clique_mates: view.clique_mates.clone(),
            edges: whole.map_or_else(Vec::new, |d| d.edges.iter().map(|e| (e.a, e.b)).collect()),
            members: whole.map_or_else(Vec::new, |d| d.members.iter().map(|m| m.id).collect()),
            one_peer_schedule: view.kind == ONE_PEER_EXPONENTIAL,
        })
    }

    /// `me`'s neighbourhood in `doc`, with the whole schedule.
    pub fn from_document(doc: &TopologyDocument, me: MemberId) -> Option<Self> {
        Self::from_view(&MemberView::of(doc, me), Some(doc))
    }

    /// My one peer each way in `round` of a one-peer exponential topology (None otherwise, or
    /// when I am alone).
    pub fn one_peer(&self, round: u64) -> Option<OnePeer> {
        self.one_peer_schedule
            .then(|| one_peer(&self.members, self.me, round))
            .flatten()
    }

    /// My Moshpit group (others only) in `round` on a grid of side `group_size`.
    pub fn moshpit_group(&self, group_size: usize, round: u64) -> Vec<MemberId> {
        let grid = MoshpitGrid::new(&self.members, group_size);
        grid.groups(round)
            .into_iter()
            .find(|g| g.contains(&self.me))
            .map(|g| g.into_iter().filter(|&m| m != self.me).collect())
            .unwrap_or_default()
    }
}
