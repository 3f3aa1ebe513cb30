//! Metropolis–Hastings mixing weights: W_ij = 1 / (max(d_i, d_j) + 1) on edges, W_ii = 1 - row
//! sum. Symmetric and doubly stochastic for any graph, using only neighbours' degrees.

use std::collections::BTreeMap;

use super::graph::{Graph, MemberId};

#[derive(Clone, Debug, PartialEq)]
pub struct MixingRow {
    pub self_weight: f64,
    /// Sorted by neighbour id.
    pub neighbours: Vec<(MemberId, f64)>,
}

#[derive(Clone, Debug, PartialEq, Default)]
pub struct MixingWeights {
    rows: BTreeMap<MemberId, MixingRow>,
}

pub fn metropolis_hastings(graph: &Graph) -> MixingWeights {
    let rows = graph
        .members()
        .map(|i| {
            let di = graph.degree(i);
            let neighbours: Vec<(MemberId, f64)> = graph
                .neighbours(i)
                .map(|j| (j, edge_weight(di, graph.degree(j))))
                .collect();
            let self_weight = 1.0 - neighbours.iter().map(|(_, w)| w).sum::<f64>();
            (
                i,
                MixingRow {
                    self_weight,
                    neighbours,
                },
            )
        })
        .collect();
    MixingWeights { rows }
}

pub fn edge_weight(degree_a: usize, degree_b: usize) -> f64 {
    1.0 / (degree_a.max(degree_b) as f64 + 1.0)
}

impl MixingWeights {
    pub fn row(&self, id: MemberId) -> Option<&MixingRow> {
        self.rows.get(&id)
    }

    pub fn rows(&self) -> impl Iterator<Item = (MemberId, &MixingRow)> {
        self.rows.iter().map(|(&id, row)| (id, row))
    }

    /// W_ij (0 when i and j are not neighbours).
    pub fn weight(&self, i: MemberId, j: MemberId) -> f64 {
        let Some(row) = self.rows.get(&i) else {
            return 0.0;
        };
        if i == j {
            return row.self_weight;
        }
        row.neighbours
            .binary_search_by_key(&j, |(id, _)| *id)
            .map_or(0.0, |k| row.neighbours[k].1)
    }

    /// Dense W in `order` (rows and columns), for spectral measures of small graphs.
    pub fn dense(&self, order: &[MemberId]) -> nalgebra::DMatrix<f64> {
        let index: BTreeMap<MemberId, usize> =
            order.iter().enumerate().map(|(k, &id)| (id, k)).collect();
        let mut w = nalgebra::DMatrix::zeros(order.len(), order.len());
        for (&i, row) in &self.rows {
            let Some(&r) = index.get(&i) else { continue };
            w[(r, r)] = row.self_weight;
            for &(j, x) in &row.neighbours {
                if let Some(&c) = index.get(&j) {
                    w[(r, c)] = x;
                }
            }
        }
        w
    }
}
