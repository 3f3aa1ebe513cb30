//! Moshpit grid (Ryabinin et al.): members sit on a d-dimensional grid of side g; in round t each
//! member averages exactly with the members that share all its coordinates except axis t mod d.
//! On a full grid, d rounds give every member the global average.

use super::graph::{Graph, MemberId};

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MoshpitGrid {
    pub side: usize,
    pub dims: usize,
    /// Cell index (coordinates in base `side`) -> member; holes left by departed members.
    cells: Vec<Option<MemberId>>,
}

impl MoshpitGrid {
    /// Smallest grid of side `side` (>= 2) that holds all members, filled in order.
    pub fn new(members: &[MemberId], side: usize) -> Self {
        let side = side.max(2);
        let mut dims = 1;
        while side.pow(dims as u32) < members.len() {
            dims += 1;
        }
        let mut cells = vec![None; side.pow(dims as u32)];
        for (cell, &m) in cells.iter_mut().zip(members) {
            *cell = Some(m);
        }
        Self { side, dims, cells }
    }

    pub fn members(&self) -> impl Iterator<Item = MemberId> + '_ {
        self.cells.iter().flatten().copied()
    }

    pub fn coordinates(&self, id: MemberId) -> Option<Vec<usize>> {
        let cell = self.cells.iter().position(|c| *c == Some(id))?;
        Some(
            (0..self.dims)
                .map(|axis| (cell / self.side.pow(axis as u32)) % self.side)
                .collect(),
        )
    }

    /// The averaging groups of `round` (groups of one member included).
    pub fn groups(&self, round: u64) -> Vec<Vec<MemberId>> {
        let axis = (round % self.dims as u64) as usize;
        let stride = self.side.pow(axis as u32);
        let mut groups = Vec::new();
        for base in 0..self.cells.len() {
            // A group is identified by its cell with coordinate 0 on `axis`.
            if !(base / stride).is_multiple_of(self.side) {
                continue;
            }
            let group: Vec<MemberId> = (0..self.side)
                .filter_map(|k| self.cells[base + k * stride])
                .collect();
            if !group.is_empty() {
                groups.push(group);
            }
        }
        groups
    }

    /// Members adjacent when they share a group in some round.
    pub fn union_graph(&self) -> Graph {
        let mut g = Graph::with_members(self.members());
        for axis in 0..self.dims {
            for group in self.groups(axis as u64) {
                for (k, &a) in group.iter().enumerate() {
                    for &b in &group[k + 1..] {
                        g.add_edge(a, b);
                    }
                }
            }
        }
        g
    }

    /// Remove a member; the member in the last occupied cell moves into its place. Keeping
    /// cells 0..n filled keeps the grid connected: any cell reaches cell 0 by zeroing its
    /// coordinates one at a time, through smaller (so occupied) cells.
    pub(super) fn remove(&mut self, id: MemberId) -> bool {
        let Some(pos) = self.cells.iter().position(|c| *c == Some(id)) else {
            return false;
        };
        let last = self
            .cells
            .iter()
            .rposition(Option::is_some)
            .expect("id is present");
        self.cells[pos] = self.cells[last];
        self.cells[last] = None;
        // Drop an axis whose groups would all be singletons.
        while self.dims > 1 && self.members().count() <= self.side.pow(self.dims as u32 - 1) {
            self.dims -= 1;
            self.cells.truncate(self.side.pow(self.dims as u32));
        }
        true
    }

    /// Take the first free cell; grow by one dimension when the grid is full (existing cells keep
    /// their coordinates).
    pub(super) fn insert(&mut self, id: MemberId) {
        if !self.cells.contains(&None) {
            self.dims += 1;
            self.cells.resize(self.side.pow(self.dims as u32), None);
        }
        let hole = self
            .cells
            .iter_mut()
            .find(|c| c.is_none())
            .expect("a hole exists");
        *hole = Some(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_alternate_rows_and_columns() {
        let ids: Vec<MemberId> = (0..16).collect();
        let grid = MoshpitGrid::new(&ids, 4);
        assert_eq!(grid.dims, 2);
        assert_eq!(grid.groups(0)[0], vec![0, 1, 2, 3]);
        assert_eq!(grid.groups(1)[0], vec![0, 4, 8, 12]);
        assert_eq!(grid.groups(2), grid.groups(0));
        assert_eq!(grid.coordinates(6), Some(vec![2, 1]));
        // Each member shares a group with 3 others per axis.
        let g = grid.union_graph();
        assert!(g.members().all(|m| g.degree(m) == 6));
    }

    #[test]
    fn the_last_member_fills_a_hole_and_joiners_append() {
        let ids: Vec<MemberId> = (0..9).collect();
        let mut grid = MoshpitGrid::new(&ids, 3);
        assert!(grid.remove(4));
        assert_eq!(
            grid.coordinates(8),
            Some(vec![1, 1]),
            "member 8 moved into the hole"
        );
        assert_eq!(grid.groups(0)[1], vec![3, 8, 5]);
        grid.insert(42);
        assert_eq!(grid.coordinates(42), Some(vec![2, 2]));
        grid.insert(43);
        assert_eq!(grid.dims, 3, "a full grid grows a dimension");
        assert_eq!(grid.coordinates(0), Some(vec![0, 0, 0]));
        assert!(grid.remove(43));
        assert_eq!(grid.dims, 2, "and shrinks back when the extra axis empties");
    }
}
