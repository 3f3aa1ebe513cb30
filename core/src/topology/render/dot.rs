use std::collections::BTreeMap;
use std::fmt::Write;

use super::super::Topology;
use super::{colour, colour_group};

/// Graphviz DOT: cliques as clusters, members filled by clique or clump, W_ij as edge tooltips.
pub fn dot(t: &Topology) -> String {
    let weights = t.weights();
    let mut out = String::new();
    let _ = writeln!(out, "graph murmur {{");
    let _ = writeln!(
        out,
        "  label=\"{} (version {})\"; layout=neato; overlap=false;",
        t.kind_name(),
        t.version
    );
    let _ = writeln!(
        out,
        "  node [shape=circle, style=filled, fontsize=9, fontcolor=white];"
    );
    let mut by_clique: BTreeMap<Option<u32>, Vec<u32>> = BTreeMap::new();
    for id in t.graph.members() {
        by_clique.entry(t.clique_of(id)).or_default().push(id);
    }
    for (clique, members) in by_clique {
        let indent = if let Some(c) = clique {
            let _ = writeln!(out, "  subgraph cluster_{c} {{\n    label=\"clique {c}\";");
            "    "
        } else {
            "  "
        };
        for id in members {
            let _ = writeln!(
                out,
                "{indent}{id} [fillcolor=\"{}\", tooltip=\"W_ii={:.4}\"];",
                colour(colour_group(t, id)),
                weights.weight(id, id)
            );
        }
        if clique.is_some() {
            let _ = writeln!(out, "  }}");
        }
    }
    for (a, b) in t.graph.edges() {
        let cross = t.clique_of(a) != t.clique_of(b);
        let _ = writeln!(
            out,
            "  {a} -- {b} [tooltip=\"W={:.4}\"{}];",
            weights.weight(a, b),
            if cross { ", penwidth=2" } else { "" }
        );
    }
    out.push_str("}\n");
    out
}
