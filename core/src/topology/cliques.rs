//! Cliques joined by bridges: the structure shared by D-Cliques and proxy clumps. Members inside a
//! clique are fully connected; cliques are linked by single member-to-member bridges, placed on the
//! least-connected members so no member carries much more traffic than its peers.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use crate::api::InterClique;

use super::graph::{Graph, MemberId};

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum CliqueFlavour {
    /// Cliques balanced on label histograms (Greedy Swap).
    DCliques,
    /// Cliques that take one member from every clump of similar members.
    ProxyClumps {
        clump_of: BTreeMap<MemberId, u32>,
        /// k-means centroids, used to place joining members.
        centroids: Vec<Vec<f64>>,
        /// The homogeneous control: a joiner goes where its clump already is.
        #[serde(default)]
        homogeneous: bool,
    },
}

/// Stored as `[a, b]`; read as that or as `{"a": .., "b": ..}` (memories written before).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Deserialize)]
pub struct Bridge {
    pub a: MemberId,
    pub b: MemberId,
}

impl serde::Serialize for Bridge {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (self.a, self.b).serialize(s)
    }
}

/// Stored without its derived indexes, which are made again as it is read: at 10 000 members
/// they were two fifths of the layout's text.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(from = "StoredLayout")]
pub struct CliqueLayout {
    pub flavour: CliqueFlavour,
    pub inter: InterClique,
    /// Intended members per clique; repair refills towards it.
    pub target_size: usize,
    /// Cliques were formed inside zones: a joiner prefers a clique of its own zone.
    #[serde(default)]
    pub zone_aware: bool,
    /// Clique id -> members. Ids are stable across repairs.
    pub cliques: BTreeMap<u32, Vec<MemberId>>,
    /// In the order they were made; change them only through `push_bridge` / `drop_bridges`.
    pub bridges: Vec<Bridge>,
    pub(super) next_clique: u32,
    /// Derived indexes over `bridges`, so choosing a bridge end is not a scan of all bridges.
    #[serde(skip_serializing)]
    ends: HashMap<MemberId, usize>,
    #[serde(skip_serializing)]
    pairs: HashSet<(MemberId, MemberId)>,
    /// Derived index over `cliques`: each member's clique, so finding a bridge end's clique (for
    /// every new clique of a join wave) is not a scan of every member.
    #[serde(skip_serializing)]
    owner: HashMap<MemberId, u32>,
    /// Derived indexes over `bridges` and `owner`: the bridges between each pair of cliques
    /// (lower id first), and how many cliques each clique is bridged to. A join wave makes a new
    /// clique for every clique's worth of joiners and links it to the least-linked cliques:
    /// counting the links from every bridge for each was 90% of a 10 000-member plan that took
    /// its last thousand joins.
    #[serde(skip_serializing)]
    clique_bridges: HashMap<(u32, u32), usize>,
    #[serde(skip_serializing)]
    linked_cliques: HashMap<u32, usize>,
}

/// A [`CliqueLayout`] as stored (indexes stored by earlier versions are ignored).
#[derive(serde::Deserialize)]
struct StoredLayout {
    flavour: CliqueFlavour,
    inter: InterClique,
    target_size: usize,
    #[serde(default)]
    zone_aware: bool,
    cliques: BTreeMap<u32, Vec<MemberId>>,
    bridges: Vec<Bridge>,
    next_clique: u32,
}

impl From<StoredLayout> for CliqueLayout {
    fn from(s: StoredLayout) -> Self {
        let mut layout = Self {
            flavour: s.flavour,
            inter: s.inter,
            target_size: s.target_size,
            zone_aware: s.zone_aware,
            cliques: s.cliques,
            bridges: Vec::with_capacity(s.bridges.len()),
            next_clique: s.next_clique,
            ends: HashMap::new(),
            pairs: HashSet::new(),
            owner: HashMap::new(),
            clique_bridges: HashMap::new(),
            linked_cliques: HashMap::new(),
        };
        layout.index_owners();
        for bridge in s.bridges {
            layout.push_bridge(bridge);
        }
        layout
    }
}

impl CliqueLayout {
    /// Lay out `groups` (in order) as cliques and link them with the `inter` pattern.
    pub fn new(
        flavour: CliqueFlavour,
        inter: InterClique,
        target_size: usize,
        groups: Vec<Vec<MemberId>>,
    ) -> Self {
        let mut layout = Self {
            flavour,
            inter,
            target_size,
            zone_aware: false,
            cliques: BTreeMap::new(),
            bridges: Vec::new(),
            next_clique: groups.len() as u32,
            ends: HashMap::new(),
            pairs: HashSet::new(),
            owner: HashMap::new(),
            clique_bridges: HashMap::new(),
            linked_cliques: HashMap::new(),
        };
        for (c, members) in groups.into_iter().enumerate() {
            layout.cliques.insert(c as u32, members);
        }
        layout.index_owners();
        let ids: Vec<u32> = layout.cliques.keys().copied().collect();
        for (x, y) in clique_pairs(inter, ids.len()) {
            layout.bridge(ids[x], ids[y]);
        }
        layout
    }

    fn index_owners(&mut self) {
        self.owner = self
            .cliques
            .iter()
            .flat_map(|(&c, members)| members.iter().map(move |&m| (m, c)))
            .collect();
    }

    /// Every member's clique.
    pub fn owners(&self) -> &HashMap<MemberId, u32> {
        &self.owner
    }

    pub fn clique_of(&self, id: MemberId) -> Option<u32> {
        self.owner.get(&id).copied()
    }

    pub fn clump_of(&self, id: MemberId) -> Option<u32> {
        match &self.flavour {
            CliqueFlavour::ProxyClumps { clump_of, .. } => clump_of.get(&id).copied(),
            CliqueFlavour::DCliques => None,
        }
    }

    /// The graph: complete inside each clique, plus the bridges.
    pub fn graph(&self) -> Graph {
        let inside = self.cliques.values().flat_map(|members| {
            members
                .iter()
                .enumerate()
                .flat_map(move |(k, &a)| members[k + 1..].iter().map(move |&b| (a, b)))
        });
        Graph::from_edges(
            self.cliques.values().flatten().copied(),
            inside.chain(self.bridges.iter().map(|b| (b.a, b.b))),
        )
    }

    fn bridge_ends(&self, id: MemberId) -> usize {
        self.ends.get(&id).copied().unwrap_or(0)
    }

    fn linked(&self, a: MemberId, b: MemberId) -> bool {
        self.pairs.contains(&(a.min(b), a.max(b)))
    }

    /// The cliques a bridge links, lower id first (its ends' cliques now).
    fn bridged_cliques(&self, bridge: &Bridge) -> (u32, u32) {
        let (x, y) = (self.owner[&bridge.a], self.owner[&bridge.b]);
        (x.min(y), x.max(y))
    }

    fn push_bridge(&mut self, bridge: Bridge) {
        let (x, y) = self.bridged_cliques(&bridge);
        if count_up(&mut self.clique_bridges, (x, y)) {
            count_up(&mut self.linked_cliques, x);
            if x != y {
                count_up(&mut self.linked_cliques, y);
            }
        }
        count_up(&mut self.ends, bridge.a);
        count_up(&mut self.ends, bridge.b);
        self.pairs
            .insert((bridge.a.min(bridge.b), bridge.a.max(bridge.b)));
        self.bridges.push(bridge);
    }

    /// Remove every bridge `which` selects; returns them.
    fn drop_bridges(&mut self, which: impl Fn(&Bridge) -> bool) -> Vec<Bridge> {
        let (dropped, kept): (Vec<Bridge>, Vec<Bridge>) =
            self.bridges.iter().partition(|b| which(b));
        for b in &dropped {
            count_down(&mut self.ends, b.a);
            count_down(&mut self.ends, b.b);
            self.pairs.remove(&(b.a.min(b.b), b.a.max(b.b)));
            let (x, y) = self.bridged_cliques(b);
            if count_down(&mut self.clique_bridges, (x, y)) {
                count_down(&mut self.linked_cliques, x);
                if x != y {
                    count_down(&mut self.linked_cliques, y);
                }
            }
        }
        self.bridges = kept;
        dropped
    }

    /// The member of `clique` to carry a new bridge: fewest bridge ends, preferring (for proxy
    /// clumps) a clump other than `avoid_clump`, and never one already linked to `other`.
    fn bridge_end(
        &self,
        clique: u32,
        avoid_clump: Option<u32>,
        other: Option<MemberId>,
    ) -> Option<MemberId> {
        self.cliques[&clique]
            .iter()
            .copied()
            .filter(|&m| other.is_none_or(|o| !self.linked(m, o)))
            .min_by_key(|&m| {
                let same_clump = avoid_clump.is_some() && self.clump_of(m) == avoid_clump;
                (same_clump, self.bridge_ends(m), m)
            })
    }

    /// Link two cliques with one bridge on their least-connected members.
    pub(super) fn bridge(&mut self, x: u32, y: u32) {
        if x == y || self.cliques[&x].is_empty() || self.cliques[&y].is_empty() {
            return;
        }
        let Some(a) = self.bridge_end(x, None, None) else {
            return;
        };
        if let Some(b) = self.bridge_end(y, self.clump_of(a), Some(a)) {
            self.push_bridge(Bridge { a, b });
        }
    }

    /// Clique-level adjacency (which cliques are bridged).
    fn clique_links(&self) -> BTreeMap<u32, BTreeSet<u32>> {
        let owner = &self.owner;
        let mut links: BTreeMap<u32, BTreeSet<u32>> =
            self.cliques.keys().map(|&c| (c, BTreeSet::new())).collect();
        for b in &self.bridges {
            let (x, y) = (owner[&b.a], owner[&b.b]);
            links.get_mut(&x).expect("owned").insert(y);
            links.get_mut(&y).expect("owned").insert(x);
        }
        links
    }

    /// How many cliques each bridged clique is linked to: [`Self::clique_links`]' set sizes.
    fn link_counts(&self) -> &HashMap<u32, usize> {
        &self.linked_cliques
    }

    /// Remove a member. Its bridges move to the least-connected member left in its clique; an
    /// emptied clique disappears and its neighbouring cliques are linked to each other.
    pub(super) fn remove_member(&mut self, id: MemberId) -> Option<u32> {
        let clique = self.clique_of(id)?;
        // The cliques an emptied clique linked: only a clique's last member needs them.
        let former: Vec<u32> = if self.cliques[&clique].len() == 1 {
            let links = self.clique_links();
            links[&clique]
                .iter()
                .copied()
                .filter(|c| *c != clique)
                .collect()
        } else {
            Vec::new()
        };
        self.cliques
            .get_mut(&clique)
            .expect("found")
            .retain(|&m| m != id);
        // Its bridges go while their ends' cliques are known.
        let moved = self.drop_bridges(|b| b.a == id || b.b == id);
        self.owner.remove(&id);
        if self.cliques[&clique].is_empty() {
            self.cliques.remove(&clique);
            // Close the gap the clique leaves: its former neighbour cliques link to each other
            // (a ring of cliques stays a ring), then anything still cut off is reconnected.
            if former.len() == 2 && !self.clique_links()[&former[0]].contains(&former[1]) {
                self.bridge(former[0], former[1]);
            }
        } else {
            for b in moved {
                let far = if b.a == id { b.b } else { b.a };
                if let Some(near) = self.bridge_end(clique, self.clump_of(far), Some(far)) {
                    self.push_bridge(Bridge { a: near, b: far });
                }
            }
        }
        self.reconnect();
        Some(clique)
    }

    /// Put a member into `clique` (an existing one, or a new one when None). Returns its clique.
    pub(super) fn insert_member(&mut self, id: MemberId, clique: Option<u32>) -> u32 {
        match clique {
            Some(c) => {
                self.cliques.get_mut(&c).expect("existing clique").push(id);
                self.owner.insert(id, c);
                c
            }
            None => {
                let c = self.next_clique;
                self.next_clique += 1;
                let others: Vec<u32> = self.cliques.keys().copied().collect();
                self.cliques.insert(c, vec![id]);
                self.owner.insert(id, c);
                self.link_new_clique(c, &others);
                c
            }
        }
    }

    fn link_new_clique(&mut self, c: u32, others: &[u32]) {
        if others.is_empty() {
            return;
        }
        if self.inter == InterClique::Ring && others.len() >= 2 {
            // Splice into the ring: replace one clique-ring link x-y by x-c-y.
            if let Some(&old) = self.bridges.first() {
                self.drop_bridges(|b| *b == old);
                let owner = |m: MemberId| self.clique_of(m).expect("bridged member");
                let (x, y) = (owner(old.a), owner(old.b));
                self.bridge(x, c);
                self.bridge(c, y);
                return;
            }
        }
        if self.inter == InterClique::FullyConnected {
            for &o in others {
                self.bridge(c, o);
            }
            return;
        }
        // Two links to the least-linked cliques keep the new clique off any single point of failure.
        let links = self.link_counts();
        let mut by_load: Vec<u32> = others.to_vec();
        by_load.sort_by_key(|o| (links.get(o).copied().unwrap_or(0), *o));
        for &o in by_load.iter().take(2) {
            self.bridge(c, o);
        }
    }

    /// Trade two members of different cliques. Every bridge end follows the trade, so each
    /// clique keeps its links to the same cliques and only the two cliques' members rewire.
    pub(super) fn swap_members(&mut self, a: MemberId, b: MemberId) {
        let (ca, cb) = (self.clique_of(a), self.clique_of(b));
        let mut touched: Vec<u32> = ca.into_iter().chain(cb).collect();
        touched.dedup();
        for c in touched {
            for m in self.cliques.get_mut(&c).expect("owned").iter_mut() {
                if *m == a {
                    *m = b;
                } else if *m == b {
                    *m = a;
                }
            }
        }
        self.owner.remove(&a);
        self.owner.remove(&b);
        if let Some(c) = ca {
            self.owner.insert(b, c);
        }
        if let Some(c) = cb {
            self.owner.insert(a, c);
        }
        let traded = |m: MemberId| match m {
            _ if m == a => b,
            _ if m == b => a,
            _ => m,
        };
        let bridges = std::mem::take(&mut self.bridges);
        self.ends.clear();
        self.pairs.clear();
        self.clique_bridges.clear();
        self.linked_cliques.clear();
        for bridge in bridges {
            self.push_bridge(Bridge {
                a: traded(bridge.a),
                b: traded(bridge.b),
            });
        }
    }

    /// Move a member to another existing clique; its bridges stay with the clique it leaves.
    pub(super) fn move_member(&mut self, id: MemberId, to: u32) {
        if self.remove_member(id).is_some() {
            self.insert_member(id, Some(to));
        }
    }

    /// Bridge clique components together until the clique graph is connected.
    fn reconnect(&mut self) {
        loop {
            let links = self.clique_links();
            let Some(&start) = links.keys().next() else {
                return;
            };
            let mut seen = BTreeSet::from([start]);
            let mut stack = vec![start];
            while let Some(c) = stack.pop() {
                for &d in &links[&c] {
                    if seen.insert(d) {
                        stack.push(d);
                    }
                }
            }
            let Some(&outside) = links.keys().find(|c| !seen.contains(c)) else {
                return;
            };
            let inside = *seen
                .iter()
                .min_by_key(|c| (links[c].len(), **c))
                .expect("non-empty");
            self.bridge(inside, outside);
        }
    }
}

/// Pairs of clique positions (0..n) to bridge, without duplicates.
pub fn clique_pairs(inter: InterClique, n: usize) -> Vec<(usize, usize)> {
    let mut pairs = BTreeSet::new();
    let mut add = |x: usize, y: usize| {
        if x != y {
            pairs.insert((x.min(y), x.max(y)));
        }
    };
    match inter {
        InterClique::Ring => {
            for k in 0..n {
                add(k, (k + 1) % n);
            }
        }
        InterClique::FullyConnected => {
            for x in 0..n {
                for y in x + 1..n {
                    add(x, y);
                }
            }
        }
        InterClique::SmallWorld => {
            // Clique i links cliques at offsets ±(2^s + k), k in {0, 1}: O(log n) links each.
            for i in 0..n {
                let mut s = 1;
                while s < n {
                    for off in [s, s + 1] {
                        if off < n {
                            add(i, (i + off) % n);
                            add(i, (i + n - off) % n);
                        }
                    }
                    s *= 2;
                }
            }
        }
        InterClique::Fractal => fractal_pairs((0..n).map(|c| vec![c]).collect(), &mut add),
    }
    pairs.into_iter().collect()
}

/// Groups of about ten units are fully linked (one bridge per pair of units), then each group
/// becomes a unit of the next level, until one unit remains.
const FRACTAL_FANOUT: usize = 10;

fn fractal_pairs(mut units: Vec<Vec<usize>>, add: &mut impl FnMut(usize, usize)) {
    let mut load = BTreeMap::<usize, usize>::new();
    while units.len() > 1 {
        let mut groups: Vec<Vec<Vec<usize>>> =
            units.chunks(FRACTAL_FANOUT).map(<[_]>::to_vec).collect();
        if groups.len() > 1 && groups.last().is_some_and(|g| g.len() == 1) {
            let last = groups.pop().expect("len > 1");
            groups.last_mut().expect("len > 1").extend(last);
        }
        units = groups
            .into_iter()
            .map(|group| {
                for x in 0..group.len() {
                    for y in x + 1..group.len() {
                        // The least-loaded clique of each unit carries the link.
                        let pick = |u: &Vec<usize>, load: &BTreeMap<usize, usize>| {
                            *u.iter()
                                .min_by_key(|c| (load.get(c).copied().unwrap_or(0), **c))
                                .expect("unit")
                        };
                        let (a, b) = (pick(&group[x], &load), pick(&group[y], &load));
                        add(a, b);
                        *load.entry(a).or_default() += 1;
                        *load.entry(b).or_default() += 1;
                    }
                }
                group.concat()
            })
            .collect();
    }
}

/// One more of `key`; true when it is the first.
fn count_up<K: std::hash::Hash + Eq>(counts: &mut HashMap<K, usize>, key: K) -> bool {
    let n = counts.entry(key).or_default();
    *n += 1;
    *n == 1
}

/// One fewer of `key`, forgotten at none; true when that was the last.
fn count_down<K: std::hash::Hash + Eq>(counts: &mut HashMap<K, usize>, key: K) -> bool {
    let Some(n) = counts.get_mut(&key) else {
        return false;
    };
    *n -= 1;
    let last = *n == 0;
    if last {
        counts.remove(&key);
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVERY_INTER: [InterClique; 4] = [
        InterClique::Ring,
        InterClique::SmallWorld,
        InterClique::Fractal,
        InterClique::FullyConnected,
    ];

    #[test]
    fn a_swap_relabels_two_members_and_a_move_keeps_the_cliques_linked() {
        for inter in EVERY_INTER {
            let groups: Vec<Vec<MemberId>> = (0..6).map(|c| (5 * c..5 * c + 5).collect()).collect();
            let before = CliqueLayout::new(CliqueFlavour::DCliques, inter, 5, groups);
            // Members of cliques 0, 3 and 5, some of them bridge ends.
            for (a, b) in [(0, 15), (1, 16), (4, 19), (2, 28)] {
                let mut after = before.clone();
                after.swap_members(a, b);
                let traded = |m: MemberId| match m {
                    _ if m == a => b,
                    _ if m == b => a,
                    _ => m,
                };
                let relabelled = Graph::from_edges(
                    before.graph().members(),
                    before.graph().edges().map(|(x, y)| (traded(x), traded(y))),
                );
                assert_eq!(after.graph(), relabelled, "{inter:?}: {a} <-> {b}");
                assert_eq!(after.clique_links(), before.clique_links(), "{inter:?}");
                let ends = |l: &CliqueLayout, m| l.bridge_ends(m);
                assert_eq!(ends(&after, b), ends(&before, a), "{inter:?}");
            }
            let mut moved = before.clone();
            moved.remove_member(9);
            moved.move_member(0, 1);
            assert_eq!(moved.clique_of(0), Some(1));
            assert_eq!(moved.clique_links(), before.clique_links(), "{inter:?}");
            assert!(moved.graph().is_connected(), "{inter:?}");
        }
    }

    #[test]
    fn link_counts_are_the_sizes_of_the_clique_links_as_cliques_come_and_go() {
        for inter in EVERY_INTER {
            let groups: Vec<Vec<MemberId>> = (0..8).map(|c| (4 * c..4 * c + 4).collect()).collect();
            let mut layout = CliqueLayout::new(CliqueFlavour::DCliques, inter, 4, groups);
            let same = |l: &CliqueLayout| {
                let sizes: HashMap<u32, usize> = l
                    .clique_links()
                    .into_iter()
                    .filter(|(_, linked)| !linked.is_empty())
                    .map(|(c, linked)| (c, linked.len()))
                    .collect();
                assert_eq!(l.link_counts(), &sizes, "{inter:?}");
                // As the layout read back from its stored form counts them.
                let stored = serde_json::to_string(l).unwrap();
                let read: CliqueLayout = serde_json::from_str(&stored).unwrap();
                assert_eq!(read.link_counts(), &sizes, "{inter:?}");
            };
            same(&layout);
            // New cliques linked in, members left, and a clique emptied.
            for id in 100..112 {
                let open = layout.cliques.iter().find(|(_, ms)| ms.len() < 4);
                let clique = open.map(|(c, _)| *c);
                layout.insert_member(id, clique);
                same(&layout);
            }
            for id in [0, 1, 2, 3, 5, 101] {
                layout.remove_member(id);
                same(&layout);
            }
            for (a, b) in [(4, 100), (6, 111), (7, 13)] {
                layout.swap_members(a, b);
                same(&layout);
            }
            layout.move_member(8, *layout.cliques.keys().last().unwrap());
            same(&layout);
            // Cliques emptied after the trades, their bridges with them.
            let emptied: Vec<MemberId> =
                layout.cliques.values().take(3).flatten().copied().collect();
            for id in emptied {
                layout.remove_member(id);
                same(&layout);
            }
        }
    }

    #[test]
    fn inter_clique_patterns_have_the_expected_link_counts() {
        assert_eq!(clique_pairs(InterClique::Ring, 10).len(), 10);
        assert_eq!(clique_pairs(InterClique::Ring, 2).len(), 1);
        assert_eq!(clique_pairs(InterClique::FullyConnected, 10).len(), 45);
        // Small world: offsets 1,2,3,4,5,8,9 around 20 cliques, each pair once.
        let sw = clique_pairs(InterClique::SmallWorld, 20);
        assert!(sw.contains(&(0, 1)) && sw.contains(&(0, 9)) && sw.contains(&(0, 11)));
        assert!(!sw.contains(&(0, 6)), "offset 6 is not 2^s or 2^s+1");
        // Fractal: 100 cliques -> 10 groups of 10 (45 links each) + one group of 10 units (45).
        assert_eq!(clique_pairs(InterClique::Fractal, 100).len(), 10 * 45 + 45);
        assert_eq!(clique_pairs(InterClique::Fractal, 1).len(), 0);
    }
}
