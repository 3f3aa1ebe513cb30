//! A member's view of the topology: its row of the mixing matrix and the addresses of the peers
//! it mixes with, not the whole graph. A join or leave changes only the views of the members it
//! touches, so the control plane serves each of them O(degree) bytes instead of serving the whole
//! document to every member.
//!
//! A view is a pure function of the document, so a restarted operator serves the same views.
//! Algorithms whose schedule spans the whole job (gossip's matchings, Moshpit's grid, the
//! one-peer exponential schedule) need every member and edge: their trainers follow the whole
//! document instead ([`follows_whole_document`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::document::{
    DocumentError, DocumentMember, ROW_SUM_TOLERANCE, TopologyDocument, is_zero,
};
use crate::api::{AlgorithmKind, TopologyKind};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberView {
    /// The job's topology version when this view last changed; a long-poll waits for a newer one.
    pub version: u64,
    /// Graph family, for people reading the view (`ring`, `dCliques`, ...).
    pub kind: String,
    /// The furthest step any member had reported when this view changed (see
    /// [`TopologyDocument::step`]): above a joiner's own step, the job is under way.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub step: u64,
    pub member: u32,
    /// The topology leaves this member out: it pauses and reports its join again.
    #[serde(default, skip_serializing_if = "is_false")]
    pub outside: bool,
    /// W_ii.
    pub self_weight: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clique: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clump: Option<u32>,
    /// Sorted by id.
    pub neighbours: Vec<ViewNeighbour>,
    /// The other members of this member's clique (clique topologies only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clique_mates: Vec<u32>,
    /// This member has the lowest id in the topology: it writes the final model.
    #[serde(default, skip_serializing_if = "is_false")]
    pub writes_model: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ViewNeighbour {
    pub id: u32,
    /// `host:port` of the neighbour's peer listener, once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// W_ij = W_ji.
    pub weight: f64,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Whether members of a job with this algorithm and topology need the whole document: their
/// schedule (gossip's matchings over every edge, Moshpit's grid over every member, the one-peer
/// exponential schedule over member order) is computed from all of it.
pub fn follows_whole_document(algorithm: AlgorithmKind, topology: TopologyKind) -> bool {
    matches!(algorithm, AlgorithmKind::Gossip | AlgorithmKind::Moshpit)
        || topology == TopologyKind::ExponentialOnePeer
}

/// What two members must agree on before one mixes the other's payload, for payloads between
/// members that follow views: the weight of their shared edge. W stays symmetric however the
/// members' views change, because a payload is used only where both ends hold the same W_ij.
pub fn edge_agreement(weight: f64) -> u64 {
    weight.to_bits()
}

impl MemberView {
    /// The view of a member the topology leaves out.
    pub fn outside(doc: &TopologyDocument, member: u32) -> Self {
        Self {
            version: doc.version,
            kind: doc.kind.clone(),
            step: doc.step,
            member,
            outside: true,
            self_weight: 1.0,
            clique: None,
            clump: None,
            neighbours: Vec::new(),
            clique_mates: Vec::new(),
            writes_model: false,
        }
    }

    /// `member`'s view of `doc` (the whole graph scanned once: for every member at once, use
    /// [`views`]).
    pub fn of(doc: &TopologyDocument, member: u32) -> Self {
        let index = Index::new(doc);
        index.view(doc, member)
    }

    /// Parse and check a view; anything inconsistent is an error naming the field.
    pub fn parse(text: &str) -> Result<Self, DocumentError> {
        let view: Self =
            serde_json::from_str(text).map_err(|e| DocumentError::Json(e.to_string()))?;
        view.check()?;
        Ok(view)
    }

    pub fn check(&self) -> Result<(), DocumentError> {
        let invalid = |field: String, message: String| DocumentError::Invalid { field, message };
        if !(0.0..=1.0).contains(&self.self_weight) {
            return Err(invalid(
                "selfWeight".into(),
                format!("{} is not in [0, 1]", self.self_weight),
            ));
        }
        let mut sum = self.self_weight;
        for (i, n) in self.neighbours.iter().enumerate() {
            if n.id == self.member {
                return Err(invalid(
                    format!("neighbours[{i}].id"),
                    format!("member {} is its own neighbour", n.id),
                ));
            }
            if i > 0 && self.neighbours[i - 1].id >= n.id {
                return Err(invalid(
                    format!("neighbours[{i}].id"),
                    "neighbours must be sorted by id, each once".into(),
                ));
            }
            if !(n.weight > 0.0 && n.weight <= 1.0) {
                return Err(invalid(
                    format!("neighbours[{i}].weight"),
                    format!("{} is not in (0, 1]", n.weight),
                ));
            }
            sum += n.weight;
        }
        if !self.outside && (sum - 1.0).abs() > ROW_SUM_TOLERANCE {
            return Err(invalid(
                "neighbours".into(),
                format!("weights of member {} sum to {sum}, not 1", self.member),
            ));
        }
        Ok(())
    }

    /// The view apart from when it was made: two views with the same content mix alike.
    pub fn same_content(&self, other: &Self) -> bool {
        let Self {
            version: _,
            step: _,
            kind,
            member,
            outside,
            self_weight,
            clique,
            clump,
            neighbours,
            clique_mates,
            writes_model,
        } = self;
        *kind == other.kind
            && *member == other.member
            && *outside == other.outside
            && self_weight.to_bits() == other.self_weight.to_bits()
            && *clique == other.clique
            && *clump == other.clump
            && *neighbours == other.neighbours
            && *clique_mates == other.clique_mates
            && *writes_model == other.writes_model
    }
}

/// Every member's view of `doc`, by id.
pub fn views(doc: &TopologyDocument) -> BTreeMap<u32, MemberView> {
    let index = Index::new(doc);
    doc.members
        .iter()
        .map(|m| (m.id, index.view(doc, m.id)))
        .collect()
}

/// The document's edges by member, and its cliques, built once for all views.
struct Index<'a> {
    members: HashMap<u32, &'a DocumentMember>,
    rows: HashMap<u32, Vec<(u32, f64)>>,
    cliques: HashMap<u32, Vec<u32>>,
    lowest: Option<u32>,
}

impl<'a> Index<'a> {
    fn new(doc: &'a TopologyDocument) -> Self {
        let mut rows: HashMap<u32, Vec<(u32, f64)>> = HashMap::new();
        for e in &doc.edges {
            rows.entry(e.a).or_default().push((e.b, e.weight));
            rows.entry(e.b).or_default().push((e.a, e.weight));
        }
        let mut cliques: HashMap<u32, Vec<u32>> = HashMap::new();
        for m in &doc.members {
            if let Some(c) = m.clique {
                cliques.entry(c).or_default().push(m.id);
            }
        }
        // Sorted once here, so a view is read off in order and compared without copying.
        for row in rows.values_mut() {
            row.sort_by_key(|&(n, _)| n);
        }
        for mates in cliques.values_mut() {
            mates.sort_unstable();
        }
        Self {
            members: doc.members.iter().map(|m| (m.id, m)).collect(),
            rows,
            cliques,
            lowest: doc.members.iter().map(|m| m.id).min(),
        }
    }

    fn view(&self, doc: &TopologyDocument, id: u32) -> MemberView {
        let Some(me) = self.members.get(&id) else {
            return MemberView::outside(doc, id);
        };
        let neighbours: Vec<ViewNeighbour> = self
            .row(id)
            .map(|(n, address, weight)| ViewNeighbour {
                id: n,
                address: address.cloned(),
                weight,
            })
            .collect();
        let clique_mates: Vec<u32> = self.clique_mates(me, id).collect();
        MemberView {
            version: doc.version,
            kind: doc.kind.clone(),
            step: doc.step,
            member: id,
            outside: false,
            self_weight: me.self_weight,
            clique: me.clique,
            clump: me.clump,
            neighbours,
            clique_mates,
            writes_model: self.lowest == Some(id),
        }
    }

    /// `id`'s neighbours in id order: each one's id, address and weight.
    fn row(&self, id: u32) -> impl Iterator<Item = (u32, Option<&'a String>, f64)> + '_ {
        self.rows
            .get(&id)
            .into_iter()
            .flatten()
            .map(|&(n, weight)| {
                let address = self.members.get(&n).and_then(|m| m.address.as_ref());
                (n, address, weight)
            })
    }

    fn clique_mates(&self, me: &DocumentMember, id: u32) -> impl Iterator<Item = u32> + '_ {
        me.clique
            .and_then(|c| self.cliques.get(&c))
            .into_iter()
            .flatten()
            .copied()
            .filter(move |&m| m != id)
    }

    /// Whether `served` has the content [`Index::view`] would make of member `me` now (see
    /// [`MemberView::same_content`]), read off the index without making the view: at 10 000
    /// members making every view again was most of following a change, and almost all of them
    /// are unchanged.
    fn holds(&self, doc: &TopologyDocument, me: &DocumentMember, served: &MemberView) -> bool {
        let id = me.id;
        served.kind == doc.kind
            && served.member == id
            && !served.outside
            && served.self_weight.to_bits() == me.self_weight.to_bits()
            && served.clique == me.clique
            && served.clump == me.clump
            && served.writes_model == (self.lowest == Some(id))
            && served
                .neighbours
                .iter()
                .map(|n| (n.id, n.address.as_ref(), n.weight))
                .eq(self.row(id))
            && served
                .clique_mates
                .iter()
                .copied()
                .eq(self.clique_mates(me, id))
    }
}

/// The views last served, so that a new document changes only the views whose content changed:
/// those keep the version they had, and their followers are not woken. Each view is shared
/// with whoever serves it, not copied (a 1 000-member job's views are 1 MB).
#[derive(Debug, Default)]
pub struct ViewBook {
    views: BTreeMap<u32, Arc<MemberView>>,
}

/// What following a new document changed.
#[derive(Debug, Default, PartialEq)]
pub struct ViewChanges {
    /// Views that changed or are new, stamped with the document's version.
    pub changed: Vec<Arc<MemberView>>,
    /// Members the new document leaves out.
    pub left: Vec<u32>,
}

impl ViewBook {
    pub fn view(&self, member: u32) -> Option<&Arc<MemberView>> {
        self.views.get(&member)
    }

    /// Follow `doc`: every member's served view is compared with the document, and made
    /// again only where its content changed. An unchanged view is kept as it was served.
    pub fn follow(&mut self, doc: &TopologyDocument) -> ViewChanges {
        let index = Index::new(doc);
        let mut served = std::mem::take(&mut self.views);
        let mut changes = ViewChanges::default();
        for m in &doc.members {
            let view = match served.remove(&m.id) {
                Some(old) if index.holds(doc, m, &old) => old,
                _ => {
                    let view = Arc::new(index.view(doc, m.id));
                    changes.changed.push(view.clone());
                    view
                }
            };
            self.views.insert(m.id, view);
        }
        changes.changed.sort_by_key(|v| v.member);
        changes.left = served.into_keys().collect();
        changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{BuildSpec, MemberProfile, build};

    fn document(kind: TopologyKind, n: u32) -> (crate::topology::Topology, TopologyDocument) {
        let members: Vec<MemberProfile> = (0..n)
            .map(|id| MemberProfile {
                id,
                histogram: Some((0..10).map(|c| f64::from(u8::from(c == id % 10))).collect()),
                ..MemberProfile::default()
            })
            .collect();
        let topology = build(&BuildSpec::new(kind), &members).unwrap();
        let doc = topology.to_document(|id| Some(format!("10.0.0.{id}:7000")));
        (topology, doc)
    }

    #[test]
    fn a_view_is_its_members_row_of_the_document() {
        let (_, doc) = document(TopologyKind::DCliques, 40);
        let all = views(&doc);
        assert_eq!(all.len(), 40);
        for m in &doc.members {
            let view = &all[&m.id];
            view.check().unwrap();
            let (self_weight, mut row) = doc.mixing_row(m.id).unwrap();
            row.sort_by_key(|(id, _)| *id);
            assert_eq!(view.self_weight, self_weight);
            let got: Vec<(u32, f64)> = view.neighbours.iter().map(|n| (n.id, n.weight)).collect();
            assert_eq!(got, row);
            for n in &view.neighbours {
                assert_eq!(n.address, Some(format!("10.0.0.{}:7000", n.id)));
            }
            let mates: Vec<u32> = doc
                .members
                .iter()
                .filter(|o| o.id != m.id && o.clique.is_some() && o.clique == m.clique)
                .map(|o| o.id)
                .collect();
            assert!(!mates.is_empty());
            assert_eq!(view.clique_mates, mates);
            assert_eq!(view.writes_model, m.id == 0);
            assert_eq!(MemberView::of(&doc, m.id), *view);
        }
        let outside = MemberView::of(&doc, 99);
        assert!(outside.outside && outside.neighbours.is_empty());
        outside.check().unwrap();
    }

    #[test]
    fn a_join_or_leave_changes_only_the_views_it_touches() {
        for kind in [TopologyKind::Ring, TopologyKind::DCliques] {
            let (mut topology, doc) = document(kind, 1000);
            let mut book = ViewBook::default();
            assert_eq!(
                book.follow(&doc).changed.len(),
                1000,
                "{kind:?}: all are new"
            );
            let full = serde_json::to_vec(&doc).unwrap().len();

            topology.remove_member(417).unwrap();
            let doc = topology.to_document(|id| Some(format!("10.0.0.{id}:7000")));
            let changes = book.follow(&doc);
            assert_eq!(changes.left, vec![417], "{kind:?}");
            let touched = changes.changed.len();
            assert!((1..=30).contains(&touched), "{kind:?}: {touched} views");
            for v in &changes.changed {
                assert_eq!(v.version, doc.version);
            }
            let bytes: usize = changes
                .changed
                .iter()
                .map(|v| serde_json::to_vec(&**v).unwrap().len())
                .sum();
            // Serving the document to every member cost `full` bytes a member.
            assert!(
                bytes * 10 < full,
                "{kind:?}: {bytes} bytes ({touched} views) against {full} for one document"
            );
            // An unchanged view keeps its version: its follower is not woken.
            let untouched = (0..1000)
                .find(|id| *id != 417 && !changes.changed.iter().any(|v| v.member == *id))
                .unwrap();
            assert!(book.view(untouched).unwrap().version < doc.version);

            topology
                .add_member(MemberProfile {
                    id: 1000,
                    histogram: Some((0..10).map(|c| f64::from(u8::from(c == 3))).collect()),
                    ..MemberProfile::default()
                })
                .unwrap();
            let doc = topology.to_document(|id| Some(format!("10.0.0.{id}:7000")));
            let changes = book.follow(&doc);
            assert!(changes.left.is_empty());
            assert!(changes.changed.iter().any(|v| v.member == 1000));
            assert!(
                changes.changed.len() <= 30,
                "{kind:?}: {}",
                changes.changed.len()
            );
        }
    }

    #[test]
    fn a_new_address_changes_the_views_of_its_neighbours_only() {
        let (topology, doc) = document(TopologyKind::Ring, 100);
        let mut book = ViewBook::default();
        book.follow(&doc);
        let mut doc = topology.to_document(|id| {
            Some(if id == 50 {
                "10.0.9.9:7000".to_string()
            } else {
                format!("10.0.0.{id}:7000")
            })
        });
        doc.version += 1;
        doc.step = 300;
        let mut changed: Vec<u32> = book.follow(&doc).changed.iter().map(|v| v.member).collect();
        changed.sort_unstable();
        let mut expected: Vec<u32> = doc
            .mixing_row(50)
            .unwrap()
            .1
            .iter()
            .map(|(id, _)| *id)
            .collect();
        expected.sort_unstable();
        assert_eq!(changed, expected, "the step alone changes no view");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Following a document changes exactly the views whose content differs from the one
        /// made afresh, keeps the rest as served, and names the members left out.
        #[test]
        fn following_changes_exactly_the_views_a_fresh_build_would(
            cliques in proptest::prelude::any::<bool>(),
            ops in proptest::collection::vec((0u8..3, 0u32..80), 1..12),
        ) {
            let kind = if cliques { TopologyKind::DCliques } else { TopologyKind::Ring };
            let (mut topology, _) = document(kind, 40);
            let mut moved = std::collections::BTreeSet::new();
            let address = |moved: &std::collections::BTreeSet<u32>, id: u32| {
                Some(format!("10.0.{}.{id}:7000", u8::from(moved.contains(&id))))
            };
            let mut book = ViewBook::default();
            let mut served: BTreeMap<u32, MemberView> = BTreeMap::new();
            for (op, id) in ops {
                match op {
                    0 => { let _ = topology.remove_member(id); }
                    1 => {
                        let _ = topology.add_member(MemberProfile {
                            id,
                            histogram: Some((0..10).map(|c| f64::from(u8::from(c == id % 10))).collect()),
                            ..MemberProfile::default()
                        });
                    }
                    _ => { moved.insert(id); }
                }
                let mut doc = topology.to_document(|m| address(&moved, m));
                doc.version = served.values().map(|v| v.version).max().unwrap_or(0) + 1;
                let fresh = views(&doc);
                let changes = book.follow(&doc);
                let expected: Vec<u32> = fresh
                    .iter()
                    .filter(|(id, v)| served.get(id).is_none_or(|s| !s.same_content(v)))
                    .map(|(id, _)| *id)
                    .collect();
                let changed: Vec<u32> = changes.changed.iter().map(|v| v.member).collect();
                proptest::prop_assert_eq!(changed, expected);
                let left: Vec<u32> = served.keys().copied().filter(|id| !fresh.contains_key(id)).collect();
                proptest::prop_assert_eq!(&changes.left, &left);
                for (id, v) in &fresh {
                    let held = book.view(*id).unwrap();
                    proptest::prop_assert!(held.same_content(v), "member {id}");
                    let version = served.get(id).filter(|s| s.same_content(v)).map_or(doc.version, |s| s.version);
                    proptest::prop_assert_eq!(held.version, version);
                }
                served = fresh.keys().map(|id| (*id, (**book.view(*id).unwrap()).clone())).collect();
            }
        }
    }

    #[test]
    fn views_that_do_not_add_up_are_refused_naming_the_field() {
        let (_, doc) = document(TopologyKind::Ring, 5);
        let mut view = MemberView::of(&doc, 2);
        let text = serde_json::to_string(&view).unwrap();
        assert_eq!(MemberView::parse(&text).unwrap(), view);
        view.neighbours[0].weight = 0.9;
        let err = MemberView::parse(&serde_json::to_string(&view).unwrap()).unwrap_err();
        assert!(err.to_string().contains("neighbours"), "{err}");
        view.neighbours.reverse();
        let err = view.check().unwrap_err();
        assert!(err.to_string().contains("neighbours[1].id"), "{err}");
    }

    #[test]
    fn whole_job_schedules_follow_the_document() {
        assert!(follows_whole_document(
            AlgorithmKind::Gossip,
            TopologyKind::Ring
        ));
        assert!(follows_whole_document(
            AlgorithmKind::Moshpit,
            TopologyKind::DCliques
        ));
        assert!(follows_whole_document(
            AlgorithmKind::Dpsgd,
            TopologyKind::ExponentialOnePeer
        ));
        assert!(!follows_whole_document(
            AlgorithmKind::Dpsgd,
            TopologyKind::DCliques
        ));
        assert!(!follows_whole_document(
            AlgorithmKind::CliqueAveraging,
            TopologyKind::ProxyClumps
        ));
        assert!(!follows_whole_document(
            AlgorithmKind::AsyncGossip,
            TopologyKind::Ring
        ));
    }
}
