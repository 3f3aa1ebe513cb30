//! Data-oblivious builders: ring, fully connected, exponential, one-peer exponential. Each is
//! linear in its edges.

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

/// The document kind of the one-peer exponential topology: trainers that read it follow
/// [`one_peer`]'s schedule instead of averaging with every neighbour.
pub const ONE_PEER_EXPONENTIAL: &str = "exponentialOnePeer";

/// The one-peer exponential topology over `ids`: the schedule runs in id order, the document's,
/// so every member derives it from the document alone, and repair keeps it valid by construction.
pub fn one_peer_exponential(ids: &[MemberId]) -> (Graph, Shape) {
    let mut order = ids.to_vec();
    order.sort_unstable();
    (exponential_graph(&order), Shape::OnePeerExponential)
}

/// Who a member sends to and receives from in one round of the one-peer exponential schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OnePeer {
    pub send_to: MemberId,
    pub receive_from: MemberId,
}

/// Round `round` of the one-peer exponential schedule over `members` (in their order): with
/// τ = ceil(log2 n) and k = round mod τ, the member at position p sends to p + 2^k and receives
/// from p − 2^k (mod n), and keeps half of its own model. Each round's mixing matrix is doubly
/// stochastic (sends and receives are both permutations), so the mean is preserved; with n a
/// power of two, τ consecutive rounds starting at k = 0 multiply to the exact average. None for
/// a member alone or not listed.
pub fn one_peer(members: &[MemberId], me: MemberId, round: u64) -> Option<OnePeer> {
    let n = members.len();
    let p = members.iter().position(|&m| m == me)?;
    if n < 2 {
        return None;
    }
    let rounds_per_cycle = usize::BITS - (n - 1).leading_zeros();
    let distance = 1usize << (round % u64::from(rounds_per_cycle));
    Some(OnePeer {
        send_to: members[(p + distance) % n],
        receive_from: members[(p + n - distance) % n],
    })
}

/// A random d-regular graph, for data-oblivious baselines of a given degree. Needs n*d even and
/// d < n. Stubs are paired at random one edge at a time, skipping pairs that would make a loop or
/// a double edge (Steger and Wormald's method): unlike drawing whole pairings until one is simple,
/// whose odds fall as e^(-(d²-1)/4) (about 1 in 6 000 at d = 6), it succeeds at once for d much
/// smaller than n. Drawn again if stuck or disconnected.
pub fn random_regular(
    ids: &[MemberId],
    degree: usize,
    seed: u64,
) -> Result<Graph, super::TopologyError> {
    use rand::{Rng, SeedableRng};
    let n = ids.len();
    if degree >= n || (n * degree) % 2 == 1 {
        return Err(super::TopologyError::TooSmall {
            what: "members for a random regular graph (n > degree, n*degree even)",
            min: degree + 1,
            got: n,
        });
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    'draw: for _ in 0..100 {
        let mut stubs: Vec<MemberId> = ids
            .iter()
            .flat_map(|&m| std::iter::repeat_n(m, degree))
            .collect();
        let mut g = Graph::with_members(ids.iter().copied());
        while !stubs.is_empty() {
            let tries = 64 + 4 * stubs.len();
            let pair = (0..tries).find_map(|_| {
                let (i, j) = (
                    rng.random_range(0..stubs.len()),
                    rng.random_range(0..stubs.len()),
                );
                let (a, b) = (stubs[i], stubs[j]);
                (a != b && !g.has_edge(a, b)).then_some((i.max(j), i.min(j)))
            });
            let Some((hi, lo)) = pair else {
                continue 'draw;
            };
            g.add_edge(stubs[hi], stubs[lo]);
            stubs.swap_remove(hi);
            stubs.swap_remove(lo);
        }
        if g.is_connected() {
            return Ok(g);
        }
    }
    // Dense or tiny cases where random pairing keeps failing: a circulant graph is d-regular too.
    let mut g = Graph::with_members(ids.iter().copied());
    for k in 0..n {
        for off in 1..=degree / 2 {
            g.add_edge(ids[k], ids[(k + off) % n]);
        }
        if degree % 2 == 1 {
            g.add_edge(ids[k], ids[(k + n / 2) % n]);
        }
    }
    Ok(g)
}
