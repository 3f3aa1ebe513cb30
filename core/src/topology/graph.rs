//! An undirected simple graph over member ids, with deterministic (sorted) iteration so every
//! output — documents, SVGs, weights — is reproducible.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// A member's stable identity in a job. Replacements get fresh ids.
pub type MemberId = u32;

#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Graph {
    adjacency: BTreeMap<MemberId, BTreeSet<MemberId>>,
    edge_count: usize,
}

impl Graph {
    pub fn with_members(members: impl IntoIterator<Item = MemberId>) -> Self {
        Self {
            adjacency: members.into_iter().map(|m| (m, BTreeSet::new())).collect(),
            edge_count: 0,
        }
    }

    /// The graph over `members` with `edges` (either way round; repeats count once). Built in
    /// bulk, from sorted lists: a D-Cliques graph of 10 000 members is rebuilt this way on every
    /// change, and edge-by-edge insertion was most of what a change cost.
    pub fn from_edges(
        members: impl IntoIterator<Item = MemberId>,
        edges: impl IntoIterator<Item = (MemberId, MemberId)>,
    ) -> Self {
        let mut ids: Vec<MemberId> = members.into_iter().collect();
        ids.sort_unstable();
        ids.dedup();
        let mut lists: Vec<Vec<MemberId>> = vec![Vec::new(); ids.len()];
        let index = |m: MemberId| {
            ids.binary_search(&m)
                .unwrap_or_else(|_| panic!("edge to unknown member {m}"))
        };
        for (a, b) in edges {
            assert!(a != b, "self-loop on member {a}");
            let (i, j) = (index(a), index(b));
            lists[i].push(b);
            lists[j].push(a);
        }
        let mut ends = 0;
        let adjacency = ids
            .iter()
            .zip(lists)
            .map(|(&m, mut list)| {
                list.sort_unstable();
                list.dedup();
                ends += list.len();
                (m, list.into_iter().collect())
            })
            .collect();
        Self {
            adjacency,
            edge_count: ends / 2,
        }
    }

    pub fn add_member(&mut self, id: MemberId) {
        self.adjacency.entry(id).or_default();
    }

    /// Removes the member and its edges; returns its former neighbours.
    pub fn remove_member(&mut self, id: MemberId) -> Vec<MemberId> {
        let Some(neighbours) = self.adjacency.remove(&id) else {
            return Vec::new();
        };
        for n in &neighbours {
            if let Some(set) = self.adjacency.get_mut(n) {
                set.remove(&id);
            }
        }
        self.edge_count -= neighbours.len();
        neighbours.into_iter().collect()
    }

    /// Adds an edge between two existing, distinct members; false if it was already there.
    pub fn add_edge(&mut self, a: MemberId, b: MemberId) -> bool {
        assert!(a != b, "self-loop on member {a}");
        assert!(
            self.contains(a) && self.contains(b),
            "edge {a}-{b} between unknown members"
        );
        let added = self.adjacency.get_mut(&a).expect("checked").insert(b);
        if added {
            self.adjacency.get_mut(&b).expect("checked").insert(a);
            self.edge_count += 1;
        }
        added
    }

    pub fn remove_edge(&mut self, a: MemberId, b: MemberId) -> bool {
        let removed = self.adjacency.get_mut(&a).is_some_and(|s| s.remove(&b));
        if removed {
            self.adjacency.get_mut(&b).expect("symmetric").remove(&a);
            self.edge_count -= 1;
        }
        removed
    }

    pub fn contains(&self, id: MemberId) -> bool {
        self.adjacency.contains_key(&id)
    }

    pub fn has_edge(&self, a: MemberId, b: MemberId) -> bool {
        self.adjacency.get(&a).is_some_and(|s| s.contains(&b))
    }

    pub fn neighbours(&self, id: MemberId) -> impl Iterator<Item = MemberId> + '_ {
        self.adjacency.get(&id).into_iter().flatten().copied()
    }

    pub fn degree(&self, id: MemberId) -> usize {
        self.adjacency.get(&id).map_or(0, BTreeSet::len)
    }

    pub fn members(&self) -> impl Iterator<Item = MemberId> + '_ {
        self.adjacency.keys().copied()
    }

    pub fn member_count(&self) -> usize {
        self.adjacency.len()
    }

    pub fn edge_count(&self) -> usize {
        self.edge_count
    }

    /// Every edge once, as (smaller id, larger id), sorted.
    pub fn edges(&self) -> impl Iterator<Item = (MemberId, MemberId)> + '_ {
        self.adjacency
            .iter()
            .flat_map(|(&a, set)| set.range(a + 1..).map(move |&b| (a, b)))
    }

    /// Hop distances from `source` to every reachable member.
    pub fn distances_from(&self, source: MemberId) -> BTreeMap<MemberId, usize> {
        let mut dist = BTreeMap::new();
        if !self.contains(source) {
            return dist;
        }
        dist.insert(source, 0);
        let mut queue = VecDeque::from([source]);
        while let Some(u) = queue.pop_front() {
            let d = dist[&u];
            for v in self.neighbours(u) {
                if let std::collections::btree_map::Entry::Vacant(e) = dist.entry(v) {
                    e.insert(d + 1);
                    queue.push_back(v);
                }
            }
        }
        dist
    }

    /// True for the empty graph and for one component.
    pub fn is_connected(&self) -> bool {
        match self.adjacency.keys().next() {
            None => true,
            Some(&first) => self.distances_from(first).len() == self.member_count(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edges_are_undirected_and_counted_once() {
        let mut g = Graph::with_members(0..4);
        assert!(g.add_edge(0, 1));
        assert!(!g.add_edge(1, 0));
        g.add_edge(1, 2);
        g.add_edge(2, 3);
        assert_eq!(g.edge_count(), 3);
        assert_eq!(g.edges().collect::<Vec<_>>(), vec![(0, 1), (1, 2), (2, 3)]);
        assert!(g.is_connected());
        assert_eq!(g.distances_from(0)[&3], 3);
        assert_eq!(g.remove_member(1), vec![0, 2]);
        assert_eq!(g.edge_count(), 1);
        assert!(!g.is_connected());
        assert!(g.remove_edge(3, 2));
        assert_eq!(g.edge_count(), 0);
    }

    #[test]
    fn a_graph_built_in_bulk_equals_one_built_edge_by_edge() {
        let edges = [(3, 1), (1, 3), (0, 1), (2, 0), (1, 2), (4, 0)];
        let mut one_by_one = Graph::with_members([4, 0, 1, 2, 3, 5]);
        for (a, b) in edges {
            one_by_one.add_edge(a, b);
        }
        let bulk = Graph::from_edges([5, 4, 3, 2, 1, 0, 1], edges);
        assert_eq!(bulk, one_by_one);
        assert_eq!(bulk.edge_count(), 5);
        assert_eq!(bulk.degree(5), 0);
    }
}
