//! Data-oblivious builders: ring, fully connected, exponential. Each is linear in its edges.

use super::Shape;
use super::graph::{Graph, MemberId};

pub fn ring(ids: &[MemberId]) -> (Graph, Shape) {
    (
        ring_graph(ids),
        Shape::Ring {
            order: ids.to_vec(),
        },
    )
}

pub fn ring_graph(order: &[MemberId]) -> Graph {
    let mut g = Graph::with_members(order.iter().copied());
    let n = order.len();
    if n >= 2 {
        for k in 0..n {
            let (a, b) = (order[k], order[(k + 1) % n]);
            if a != b {
                g.add_edge(a, b);
            }
        }
    }
    g
}

pub fn fully_connected(ids: &[MemberId]) -> (Graph, Shape) {
    let mut g = Graph::with_members(ids.iter().copied());
    for (k, &a) in ids.iter().enumerate() {
        for &b in &ids[k + 1..] {
            g.add_edge(a, b);
        }
    }
    (g, Shape::FullyConnected)
}

pub fn exponential(ids: &[MemberId]) -> (Graph, Shape) {
    (
        exponential_graph(ids),
        Shape::Exponential {
            order: ids.to_vec(),
        },
    )
}

/// Member k links to members k ± 1, 2, 4, ... (mod n) in `order`.
pub fn exponential_graph(order: &[MemberId]) -> Graph {
    let mut g = Graph::with_members(order.iter().copied());
    let n = order.len();
    let mut offset = 1;
    while offset < n {
        for k in 0..n {
            g.add_edge(order[k], order[(k + offset) % n]);
        }
        offset *= 2;
    }
    g
}
