use std::fmt::Write;

use super::super::Topology;
use super::super::measures::Measures;

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_string(), |x| x.to_string())
}

/// Measures, then one line per member with its clique, clump, degree and neighbours.
pub fn table(t: &Topology, m: &Measures) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "topology {} (version {})", t.kind_name(), t.version);
    let mut rows = vec![
        ("members", m.members.to_string()),
        ("edges", m.edges.to_string()),
        (
            "degree min/mean/max",
            format!("{}/{:.2}/{}", m.min_degree, m.mean_degree, m.max_degree),
        ),
        ("connected", m.connected.to_string()),
        ("diameter", opt(m.diameter)),
        (
            "spectral gap",
            opt(m.spectral_gap.map(|g| format!("{g:.6}"))),
        ),
        ("messages per round", m.messages_per_round.to_string()),
    ];
    if let Some(cross) = m.cross_zone_edges {
        rows.push(("cross-zone edges", cross.to_string()));
    }
    if let Some(s) = &m.clique_skew {
        rows.push(("cliques", s.cliques.to_string()));
        rows.push((
            "clique skew mean/max",
            format!("{:.4}/{:.4}", s.mean, s.max),
        ));
    }
    for (k, v) in rows {
        let _ = writeln!(out, "  {k:<22}{v}");
    }
    let _ = writeln!(
        out,
        "\n{:>7} {:>7} {:>6} {:>7}  neighbours",
        "member", "clique", "clump", "degree"
    );
    for id in t.graph.members() {
        let neighbours: Vec<String> = t.graph.neighbours(id).map(|n| n.to_string()).collect();
        let _ = writeln!(
            out,
            "{:>7} {:>7} {:>6} {:>7}  {}",
            id,
            opt(t.clique_of(id)),
            opt(t.clump_of(id)),
            t.graph.degree(id),
            neighbours.join(" ")
        );
    }
    out
}
