//! Elastic repair: remove or add one member with minimal rewiring and a bumped version. A ring stays
//! a ring (the gap closes with one edge), cliques refill with the best-fitting joiner, and a clique
//! left at less than half its size is dissolved into the others.

use super::cliques::{CliqueFlavour, CliqueLayout};
use super::graph::MemberId;
use super::proxy_clumps::nearest;
use super::simple::{exponential_graph, one_peer_exponential};
use super::skew::{distribution, skew, sum};
use super::{MemberProfile, Shape, Topology, TopologyError};

impl Topology {
    /// Remove a member (it left, or was preempted). Bumps the version.
    pub fn remove_member(&mut self, id: MemberId) -> Result<(), TopologyError> {
        self.repair().remove_member(id)
    }

    /// Remove a member that will come back to its clique (moved to the clique's zone): as
    /// [`Topology::remove_member`], but a clique it leaves small is kept for it, not dissolved
    /// into the others, which would move its stayers across zones. Bumps the version.
    pub fn set_aside(&mut self, id: MemberId) -> Result<(), TopologyError> {
        self.repair().set_aside(id)
    }

    /// Add a member (new, or a replacement with a fresh id). Bumps the version.
    pub fn add_member(&mut self, profile: MemberProfile) -> Result<(), TopologyError> {
        self.repair().rejoin(profile, None)
    }

    /// Add a member that returns to clique `home` (the one it left, or was moved to the zone
    /// of) while that clique has room: its data is what the clique's label balance counted on,
    /// and a relocated member's zone is the clique's. Elsewhere, or for other shapes, as
    /// [`Topology::add_member`]. Bumps the version.
    pub fn rejoin(
        &mut self,
        profile: MemberProfile,
        home: Option<u32>,
    ) -> Result<(), TopologyError> {
        self.repair().rejoin(profile, home)
    }

    /// Many joins and leaves as one repair: see [`Repair`].
    pub fn repair(&mut self) -> Repair<'_> {
        Repair {
            t: self,
            stale: false,
            labels: None,
        }
    }

    /// The graph the shape makes, for the shapes whose repairs rebuild it.
    fn rewire(&mut self) {
        match &self.shape {
            Shape::Exponential { order } => self.graph = exponential_graph(order),
            Shape::OnePeerExponential => {
                self.graph = one_peer_exponential(&self.graph.members().collect::<Vec<_>>()).0;
            }
            Shape::Cliques(layout) => self.graph = layout.graph(),
            Shape::Grid(grid) => self.graph = grid.union_graph(),
            Shape::Ring { .. } | Shape::FullyConnected | Shape::RandomRegular { .. } => {}
        }
    }
}

/// Joins and leaves of one topology, each made as [`Topology::rejoin`] and
/// [`Topology::remove_member`] make it (the same cliques, the same version), but the graph of a
/// shape that rebuilds it (cliques, exponential graphs, Moshpit's grid) rebuilt once, when the
/// repair is dropped, rather than after each member: at 10 000 members, rebuilding it for each
/// of a thousand joins in one plan took seconds. Until then the topology's graph is behind its
/// members, so the repair answers what callers ask meanwhile.
pub struct Repair<'a> {
    t: &'a mut Topology,
    /// Whether the graph is behind the shape.
    stale: bool,
    /// The members' label histograms summed (D-Cliques' global distribution, against which a
    /// joiner's best clique is chosen), kept up as members come and go once a choice needed
    /// it: summing 10 000 histograms for each joiner was the rest of those seconds.
    labels: Option<Vec<f64>>,
}

impl Drop for Repair<'_> {
    fn drop(&mut self) {
        if self.stale {
            self.t.rewire();
        }
    }
}

impl Repair<'_> {
    /// Whether `id` is a member now.
    pub fn contains(&self, id: MemberId) -> bool {
        self.t.profiles.contains_key(&id)
    }

    /// The members now.
    pub fn member_count(&self) -> usize {
        self.t.profiles.len()
    }

    /// The clique `id` is in now (clique topologies).
    pub fn clique_of(&self, id: MemberId) -> Option<u32> {
        self.t.clique_of(id)
    }

    /// The zone clique `clique` trains in now (zone-aware cliques).
    pub fn zone_of_clique(&self, clique: u32) -> Option<String> {
        super::zones::zone_of_clique(self.t, clique)
    }

    /// As [`Topology::remove_member`].
    pub fn remove_member(&mut self, id: MemberId) -> Result<(), TopologyError> {
        self.remove(id, Leaving::ForGood)
    }

    /// As [`Topology::set_aside`].
    pub fn set_aside(&mut self, id: MemberId) -> Result<(), TopologyError> {
        self.remove(id, Leaving::ToReturn)
    }

    fn remove(&mut self, id: MemberId, leaving: Leaving) -> Result<(), TopologyError> {
        if !self.contains(id) {
            return Err(TopologyError::UnknownMember(id));
        }
        let t = &mut *self.t;
        match &mut t.shape {
            Shape::Ring { order } => {
                let n = order.len();
                let pos = order
                    .iter()
                    .position(|&m| m == id)
                    .expect("graph and order agree");
                let (prev, next) = (order[(pos + n - 1) % n], order[(pos + 1) % n]);
                order.remove(pos);
                t.graph.remove_member(id);
                if prev != next && prev != id {
                    t.graph.add_edge(prev, next);
                }
            }
            Shape::FullyConnected => {
                t.graph.remove_member(id);
            }
            Shape::Exponential { order } => {
                order.retain(|&m| m != id);
                self.stale = true;
            }
            Shape::OnePeerExponential => {
                t.graph.remove_member(id);
                self.stale = true;
            }
            Shape::Cliques(layout) => {
                if let Some(clique) = layout.remove_member(id)
                    && leaving == Leaving::ForGood
                {
                    rebalance(layout, clique, &t.profiles, &mut self.labels);
                }
                self.stale = true;
            }
            Shape::Grid(grid) => {
                grid.remove(id);
                self.stale = true;
            }
            Shape::RandomRegular { .. } => {
                // The orphaned neighbours pair up, restoring their degrees where they can.
                let orphans = t.graph.remove_member(id);
                for pair in orphans.chunks(2) {
                    if let [a, b] = pair {
                        t.graph.add_edge(*a, *b);
                    }
                }
                reconnect_components(&mut t.graph);
            }
        }
        if let Some(profile) = t.profiles.remove(&id) {
            labels_less(&mut self.labels, &profile);
        }
        t.version += 1;
        Ok(())
    }

    /// As [`Topology::add_member`].
    pub fn add_member(&mut self, profile: MemberProfile) -> Result<(), TopologyError> {
        self.rejoin(profile, None)
    }

    /// As [`Topology::rejoin`].
    pub fn rejoin(
        &mut self,
        profile: MemberProfile,
        home: Option<u32>,
    ) -> Result<(), TopologyError> {
        let id = profile.id;
        if self.contains(id) {
            return Err(TopologyError::DuplicateMember(id));
        }
        labels_more(&mut self.labels, &profile);
        let t = &mut *self.t;
        t.profiles.insert(id, profile);
        match &mut t.shape {
            Shape::Ring { order } => {
                // Splice between the last and first member: one edge out, two in.
                t.graph.add_member(id);
                if let (Some(&first), Some(&last)) = (order.first(), order.last()) {
                    if order.len() >= 3 {
                        t.graph.remove_edge(last, first);
                    }
                    t.graph.add_edge(last, id);
                    if first != last {
                        t.graph.add_edge(id, first);
                    }
                }
                order.push(id);
            }
            Shape::FullyConnected => {
                let others: Vec<MemberId> = t.graph.members().collect();
                t.graph.add_member(id);
                for o in others {
                    t.graph.add_edge(id, o);
                }
            }
            Shape::Exponential { order } => {
                order.push(id);
                self.stale = true;
            }
            Shape::OnePeerExponential => {
                t.graph.add_member(id);
                self.stale = true;
            }
            Shape::Cliques(layout) => {
                let room = |c: &u32| {
                    layout
                        .cliques
                        .get(c)
                        .is_some_and(|ms| ms.len() < layout.target_size)
                };
                let clique = match home.filter(room) {
                    Some(c) => Some(c),
                    None => best_clique(layout, &t.profiles, id, None, &mut self.labels),
                };
                layout.insert_member(id, clique);
                self.stale = true;
            }
            Shape::Grid(grid) => {
                grid.insert(id);
                self.stale = true;
            }
            Shape::RandomRegular { degree } => {
                // Split degree/2 edges a-b into a-new-b: everyone else keeps their degree.
                let edges: Vec<(MemberId, MemberId)> = t.graph.edges().collect();
                t.graph.add_member(id);
                let step = (edges.len() / (*degree / 2).max(1)).max(1);
                let mut linked = false;
                for &(a, b) in edges.iter().step_by(step).take((*degree / 2).max(1)) {
                    if !t.graph.has_edge(a, id) && !t.graph.has_edge(b, id) {
                        t.graph.remove_edge(a, b);
                        t.graph.add_edge(a, id);
                        t.graph.add_edge(id, b);
                        linked = true;
                    }
                }
                let other = t.graph.members().find(|&m| m != id);
                if !linked && let Some(other) = other {
                    t.graph.add_edge(id, other);
                }
            }
        }
        t.version += 1;
        Ok(())
    }
}

/// The clique a member should join: for D-Cliques the one whose skew it lowers most, for proxy
/// clumps one still missing the member's clump; only cliques below target size qualify. None means
/// "start a new clique".
fn best_clique(
    layout: &CliqueLayout,
    profiles: &std::collections::BTreeMap<MemberId, MemberProfile>,
    id: MemberId,
    exclude: Option<u32>,
    labels: &mut Option<Vec<f64>>,
) -> Option<u32> {
    let profile = &profiles[&id];
    let mut open: Vec<(u32, &Vec<MemberId>)> = layout
        .cliques
        .iter()
        .filter(|(c, ms)| Some(**c) != exclude && ms.len() < layout.target_size)
        .map(|(c, ms)| (*c, ms))
        .collect();
    // Zone-aware cliques: a clique of the joiner's own zone when one has room.
    let same_zone = |ms: &Vec<MemberId>| {
        profile.zone.is_some()
            && ms
                .iter()
                .any(|m| profiles.get(m).and_then(|p| p.zone.as_ref()) == profile.zone.as_ref())
    };
    if layout.zone_aware && open.iter().any(|(_, ms)| same_zone(ms)) {
        open.retain(|(_, ms)| same_zone(ms));
    }
    let smallest = open
        .iter()
        .min_by_key(|(c, ms)| (ms.len(), *c))
        .map(|(c, _)| *c);
    match &layout.flavour {
        CliqueFlavour::DCliques => {
            let Some(h) = profile.histogram.as_deref() else {
                return smallest;
            };
            let classes = h.len();
            let total = match labels {
                Some(total) if total.len() == classes => total,
                _ => labels.insert(sum(
                    profiles.values().filter_map(|p| p.histogram.as_deref()),
                    classes,
                )),
            };
            let global = distribution(total);
            let clique_sum = |ms: &Vec<MemberId>| {
                sum(
                    ms.iter()
                        .filter_map(|m| profiles.get(m)?.histogram.as_deref()),
                    classes,
                )
            };
            open.iter()
                .map(|(c, ms)| {
                    let mut s = clique_sum(ms);
                    let before = skew(&s, &global);
                    for (x, y) in s.iter_mut().zip(h) {
                        *x += y;
                    }
                    (skew(&s, &global) - before, ms.len(), *c)
                })
                .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)))
                .map(|(_, _, c)| c)
        }
        CliqueFlavour::ProxyClumps {
            clump_of,
            centroids,
            homogeneous,
        } => {
            let v = profile.proxy.as_deref().or(profile.histogram.as_deref());
            let Some(v) = v.filter(|v| centroids.first().is_some_and(|c| c.len() == v.len()))
            else {
                return smallest;
            };
            let total: f64 = v.iter().sum();
            let normalised: Vec<f64> = if profile.proxy.is_none() && total > 0.0 {
                v.iter().map(|x| x / total).collect()
            } else {
                v.to_vec()
            };
            let clump = nearest(centroids, &normalised) as u32;
            let of_clump = |ms: &[MemberId]| {
                ms.iter()
                    .filter(|m| clump_of.get(m) == Some(&clump))
                    .count()
            };
            if *homogeneous {
                // The clique holding most of the joiner's clump (the smallest on a tie).
                open.iter()
                    .max_by_key(|(c, ms)| (of_clump(ms), std::cmp::Reverse((ms.len(), *c))))
                    .map(|(c, _)| *c)
            } else {
                open.iter()
                    .filter(|(_, ms)| of_clump(ms) == 0)
                    .min_by_key(|(c, ms)| (ms.len(), *c))
                    .map(|(c, _)| *c)
                    .or(smallest)
            }
        }
    }
}

/// A joiner's label histogram added to the members' sum, where one is kept. The histograms are
/// counts, so the sum is exact whatever the order it is kept in.
fn labels_more(labels: &mut Option<Vec<f64>>, joiner: &MemberProfile) {
    if let (Some(total), Some(h)) = (labels.as_mut(), joiner.histogram.as_deref()) {
        for (t, x) in total.iter_mut().zip(h) {
            *t += x;
        }
    }
}

/// A leaver's label histogram taken from the members' sum, where one is kept.
fn labels_less(labels: &mut Option<Vec<f64>>, leaver: &MemberProfile) {
    if let (Some(total), Some(h)) = (labels.as_mut(), leaver.histogram.as_deref()) {
        for (t, x) in total.iter_mut().zip(h) {
            *t -= x;
        }
    }
}

/// Whether a removed member comes back to its clique.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Leaving {
    ForGood,
    ToReturn,
}

/// Dissolve a clique that shrank below half its target size into the other cliques.
fn rebalance(
    layout: &mut CliqueLayout,
    clique: u32,
    profiles: &std::collections::BTreeMap<MemberId, MemberProfile>,
    labels: &mut Option<Vec<f64>>,
) {
    let Some(members) = layout.cliques.get(&clique).cloned() else {
        return;
    };
    if layout.cliques.len() < 2 || members.len() * 2 >= layout.target_size {
        return;
    }
    for m in members {
        layout.remove_member(m);
        let target = best_clique(layout, profiles, m, Some(clique), labels).or_else(|| {
            // Every other clique is full: join the smallest rather than stay alone.
            layout
                .cliques
                .iter()
                .filter(|(c, _)| **c != clique)
                .min_by_key(|(c, ms)| (ms.len(), **c))
                .map(|(c, _)| *c)
        });
        layout.insert_member(m, target);
    }
}

/// Join any stray components to the first one (a removal can cut a sparse graph).
fn reconnect_components(graph: &mut super::Graph) {
    loop {
        let Some(first) = graph.members().next() else {
            return;
        };
        let reached = graph.distances_from(first);
        let Some(outside) = graph.members().find(|m| !reached.contains_key(m)) else {
            return;
        };
        let inside = *reached
            .keys()
            .min_by_key(|&&m| (graph.degree(m), m))
            .expect("first is reached");
        graph.add_edge(inside, outside);
    }
}
