//! Graph measures reported for every topology.

use serde::Serialize;

use super::dcliques::clique_skews;
use super::graph::MemberId;
use super::{Shape, Topology};

/// Above this many members the dense eigen-decomposition for the spectral gap is skipped.
pub const SPECTRAL_LIMIT: usize = 1500;
/// Above this many BFS steps (members x edges) the diameter is skipped.
pub const DIAMETER_LIMIT: usize = 50_000_000;

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Measures {
    pub members: usize,
    pub edges: usize,
    pub min_degree: usize,
    pub max_degree: usize,
    pub mean_degree: f64,
    pub connected: bool,
    /// Longest shortest path, in hops (None when disconnected or too large to compute).
    pub diameter: Option<usize>,
    /// 1 - |second largest eigenvalue| of W; larger mixes faster. For Moshpit, of the mean of the
    /// rounds' averaging matrices.
    pub spectral_gap: Option<f64>,
    /// Label skew of the cliques, when every member has a histogram.
    pub clique_skew: Option<CliqueSkew>,
    /// Parameter messages sent in one averaging round, all members together.
    pub messages_per_round: usize,
    /// Edges between members of different zones, when every member's zone is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cross_zone_edges: Option<usize>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CliqueSkew {
    pub cliques: usize,
    pub mean: f64,
    pub max: f64,
}

pub fn measure(t: &Topology) -> Measures {
    let g = &t.graph;
    let n = g.member_count();
    let degrees: Vec<usize> = g.members().map(|m| g.degree(m)).collect();
    let connected = g.is_connected();
    let diameter = (connected && n * g.edge_count().max(1) <= DIAMETER_LIMIT).then(|| {
        g.members()
            .map(|m| g.distances_from(m).into_values().max().unwrap_or(0))
            .max()
            .unwrap_or(0)
    });
    let messages_per_round = match &t.shape {
        Shape::Grid(grid) => grid
            .groups(0)
            .iter()
            .map(|gr| gr.len() * (gr.len() - 1))
            .sum(),
        _ => 2 * g.edge_count(),
    };
    Measures {
        members: n,
        edges: g.edge_count(),
        min_degree: degrees.iter().copied().min().unwrap_or(0),
        max_degree: degrees.iter().copied().max().unwrap_or(0),
        mean_degree: if n == 0 {
            0.0
        } else {
            2.0 * g.edge_count() as f64 / n as f64
        },
        connected,
        diameter,
        spectral_gap: (n <= SPECTRAL_LIMIT).then(|| spectral_gap(t)),
        clique_skew: clique_skew(t),
        messages_per_round,
        cross_zone_edges: super::zones::cross_zone_edges(g, &t.profiles),
    }
}

fn spectral_gap(t: &Topology) -> f64 {
    let order: Vec<MemberId> = t.graph.members().collect();
    let n = order.len();
    if n < 2 {
        return 1.0;
    }
    let w = match &t.shape {
        Shape::Grid(grid) => {
            let index = |m: MemberId| order.binary_search(&m).expect("member");
            let mut w = nalgebra::DMatrix::zeros(n, n);
            for round in 0..grid.dims {
                for group in grid.groups(round as u64) {
                    let share = 1.0 / (group.len() * grid.dims) as f64;
                    for &a in &group {
                        for &b in &group {
                            w[(index(a), index(b))] += share;
                        }
                    }
                }
            }
            w
        }
        _ => t.weights().dense(&order),
    };
    let mut eigen: Vec<f64> = nalgebra::SymmetricEigen::new(w)
        .eigenvalues
        .iter()
        .map(|x| x.abs())
        .collect();
    eigen.sort_by(|a, b| b.total_cmp(a));
    (1.0 - eigen[1]).max(0.0)
}

/// The label skew of `t`'s cliques (None for other graphs, or a member without a histogram).
pub fn clique_skew(t: &Topology) -> Option<CliqueSkew> {
    let Shape::Cliques(layout) = &t.shape else {
        return None;
    };
    let groups: Option<Vec<Vec<&[f64]>>> = layout
        .cliques
        .values()
        .map(|ms| {
            ms.iter()
                .map(|m| t.profiles.get(m)?.histogram.as_deref())
                .collect()
        })
        .collect();
    let skews = clique_skews(&groups?);
    Some(CliqueSkew {
        cliques: skews.len(),
        mean: skews.iter().sum::<f64>() / skews.len().max(1) as f64,
        max: skews.iter().copied().fold(0.0, f64::max),
    })
}
