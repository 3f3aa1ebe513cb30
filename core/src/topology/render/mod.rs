//! Text renderings of a topology for people: a table, Graphviz DOT and a standalone SVG.

mod dot;
mod svg;
mod table;

pub use dot::dot;
pub use svg::svg;
pub use table::table;

use super::graph::MemberId;
use super::{Shape, Topology};

/// What a member is coloured by: its clump for proxy clumps, else its clique.
fn colour_group(t: &Topology, id: MemberId) -> Option<u32> {
    match &t.shape {
        Shape::Cliques(layout) => match layout.flavour {
            super::CliqueFlavour::ProxyClumps { .. } => t.clump_of(id),
            super::CliqueFlavour::DCliques => t.clique_of(id),
        },
        _ => None,
    }
}

const PALETTE: [&str; 12] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#1f77b4", "#8c564b", "#17becf",
];

/// A distinct colour per group: a fixed palette first, then golden-angle hues.
fn colour(group: Option<u32>) -> String {
    match group {
        None => "#4e79a7".to_string(),
        Some(g) if (g as usize) < PALETTE.len() => PALETTE[g as usize].to_string(),
        Some(g) => format!("hsl({:.0},65%,55%)", (g as f64 * 137.508) % 360.0),
    }
}

/// The class a member holds most of, if it has a histogram.
fn dominant_class(t: &Topology, id: MemberId) -> Option<usize> {
    let h = t.profiles.get(&id)?.histogram.as_ref()?;
    h.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .filter(|(_, c)| **c > 0.0)
        .map(|(k, _)| k)
}
