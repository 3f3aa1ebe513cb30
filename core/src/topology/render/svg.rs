//! A standalone SVG: cliques drawn as rings of members around their own centres, bridges in dark
//! ink, members coloured by clique (or clump), and the measures beside the graph.

use std::collections::BTreeMap;
use std::f64::consts::TAU;
use std::fmt::Write;

use super::super::graph::MemberId;
use super::super::measures::Measures;
use super::super::{Shape, Topology};
use super::{colour, colour_group, dominant_class};

const GRAPH: f64 = 760.0;
const PANEL: f64 = 300.0;

fn positions(t: &Topology) -> BTreeMap<MemberId, (f64, f64)> {
    let centre = GRAPH / 2.0;
    let on_circle = |k: usize, n: usize, r: f64, cx: f64, cy: f64| {
        let a = TAU * k as f64 / n.max(1) as f64 - TAU / 4.0;
        (cx + r * a.cos(), cy + r * a.sin())
    };
    let mut pos = BTreeMap::new();
    match &t.shape {
        Shape::Cliques(layout) => {
            let nc = layout.cliques.len();
            let big = if nc == 1 { 0.0 } else { GRAPH * 0.36 };
            let small = if nc == 1 {
                GRAPH * 0.36
            } else {
                (big * (TAU / (2.0 * nc as f64)).sin() * 0.8).min(GRAPH * 0.12)
            };
            for (c, members) in layout.cliques.values().enumerate() {
                let (cx, cy) = on_circle(c, nc, big, centre, centre);
                for (k, &m) in members.iter().enumerate() {
                    pos.insert(m, on_circle(k, members.len(), small, cx, cy));
                }
            }
        }
        Shape::Grid(grid) if grid.dims == 2 => {
            let step = GRAPH * 0.8 / (grid.side.max(2) - 1) as f64;
            for m in grid.members() {
                let xy = grid.coordinates(m).expect("member");
                pos.insert(
                    m,
                    (
                        GRAPH * 0.1 + xy[0] as f64 * step,
                        GRAPH * 0.1 + xy[1] as f64 * step,
                    ),
                );
            }
        }
        Shape::Ring { order } | Shape::Exponential { order } => {
            for (k, &m) in order.iter().enumerate() {
                pos.insert(m, on_circle(k, order.len(), GRAPH * 0.42, centre, centre));
            }
        }
        _ => {
            let n = t.graph.member_count();
            for (k, m) in t.graph.members().enumerate() {
                pos.insert(m, on_circle(k, n, GRAPH * 0.42, centre, centre));
            }
        }
    }
    pos
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

pub fn svg(t: &Topology, m: &Measures) -> String {
    let pos = positions(t);
    let n = t.graph.member_count().max(1);
    let radius = (260.0 / (n as f64).sqrt()).clamp(2.5, 13.0);
    let faint = if t.graph.edge_count() > 3000 {
        0.08
    } else {
        0.3
    };
    let mut out = String::new();
    let width = GRAPH + PANEL;
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{GRAPH}" viewBox="0 0 {width} {GRAPH}" font-family="Helvetica, Arial, sans-serif">"#
    );
    let _ = writeln!(
        out,
        r##"<rect width="100%" height="100%" fill="#fbfbfd"/>"##
    );

    // Edges first, so members sit on top. Bridges between cliques stand out.
    let _ = writeln!(out, r#"<g stroke-linecap="round">"#);
    for (a, b) in t.graph.edges() {
        let ((x1, y1), (x2, y2)) = (pos[&a], pos[&b]);
        let bridge = matches!(t.shape, Shape::Cliques(_)) && t.clique_of(a) != t.clique_of(b);
        let style = if bridge {
            r##"stroke="#2b2b2b" stroke-width="1.6" stroke-opacity="0.85""##.to_string()
        } else {
            format!(r##"stroke="#8a8fa3" stroke-width="0.8" stroke-opacity="{faint}""##)
        };
        let _ = writeln!(
            out,
            r#"<line x1="{x1:.1}" y1="{y1:.1}" x2="{x2:.1}" y2="{y2:.1}" {style}/>"#
        );
    }
    let _ = writeln!(out, "</g>");

    let show_labels = n <= 200;
    let _ = writeln!(out, r#"<g stroke="white" stroke-width="1">"#);
    for id in t.graph.members() {
        let (x, y) = pos[&id];
        let group = colour_group(t, id);
        let class = dominant_class(t, id);
        let mut title = format!("member {id}, degree {}", t.graph.degree(id));
        if let Some(c) = t.clique_of(id) {
            let _ = write!(title, ", clique {c}");
        }
        if let Some(c) = t.clump_of(id) {
            let _ = write!(title, ", clump {c}");
        }
        if let Some(c) = class {
            let _ = write!(title, ", mostly class {c}");
        }
        let _ = writeln!(
            out,
            r#"<circle cx="{x:.1}" cy="{y:.1}" r="{radius:.1}" fill="{}"><title>{}</title></circle>"#,
            colour(group),
            escape(&title)
        );
        if show_labels && radius >= 8.0 {
            // The member id: two cliques covering the same classes would otherwise show the
            // same labels twice. The main class is in the tooltip.
            let label = id;
            let _ = writeln!(
                out,
                r#"<text x="{x:.1}" y="{:.1}" font-size="{:.0}" text-anchor="middle" fill="white" stroke="none">{label}</text>"#,
                y + radius * 0.35,
                radius
            );
        }
    }
    let _ = writeln!(out, "</g>");

    // Side panel: what this is and how good it is.
    let px = GRAPH + 10.0;
    let _ = writeln!(
        out,
        r##"<rect x="{GRAPH}" y="0" width="{PANEL}" height="{GRAPH}" fill="#f0f1f5"/>"##
    );
    let mut y = 40.0;
    let _ = writeln!(
        out,
        r##"<text x="{px}" y="{y}" font-size="20" font-weight="bold" fill="#222">{}</text>"##,
        t.kind_name()
    );
    y += 22.0;
    let _ = writeln!(
        out,
        r##"<text x="{px}" y="{y}" font-size="12" fill="#666">murmur topology · version {}</text>"##,
        t.version
    );
    y += 30.0;
    let fmt_opt =
        |v: Option<f64>, digits: usize| v.map_or("—".to_string(), |x| format!("{x:.digits$}"));
    let mut lines = vec![
        ("members", m.members.to_string()),
        ("edges", m.edges.to_string()),
        (
            "degree min / max",
            format!("{} / {}", m.min_degree, m.max_degree),
        ),
        (
            "diameter",
            m.diameter.map_or("—".to_string(), |d| d.to_string()),
        ),
        ("spectral gap", fmt_opt(m.spectral_gap, 4)),
        ("messages / round", m.messages_per_round.to_string()),
    ];
    if let Some(s) = &m.clique_skew {
        lines.push(("cliques", s.cliques.to_string()));
        lines.push(("clique skew mean", format!("{:.4}", s.mean)));
        lines.push(("clique skew max", format!("{:.4}", s.max)));
    }
    for (k, v) in lines {
        let _ = writeln!(
            out,
            r##"<text x="{px}" y="{y}" font-size="13" fill="#444">{k}</text><text x="{:.0}" y="{y}" font-size="13" font-weight="bold" fill="#222" text-anchor="end">{}</text>"##,
            GRAPH + PANEL - 14.0,
            escape(&v)
        );
        y += 20.0;
    }
    if let Shape::Cliques(layout) = &t.shape {
        y += 14.0;
        let what = match layout.flavour {
            super::super::CliqueFlavour::ProxyClumps { .. } => "colour = clump, label = member id",
            super::super::CliqueFlavour::DCliques => "colour = clique, label = member id",
        };
        for line in [
            what,
            "hover a member for its main class",
            "dark lines are bridges between cliques",
        ] {
            let _ = writeln!(
                out,
                r##"<text x="{px}" y="{y}" font-size="12" fill="#666">{line}</text>"##
            );
            y += 16.0;
        }
        y += 4.0;
        let groups: std::collections::BTreeSet<u32> = t
            .graph
            .members()
            .filter_map(|id| colour_group(t, id))
            .collect();
        for (k, g) in groups.iter().take(24).enumerate() {
            let (gx, gy) = (px + (k % 4) as f64 * 70.0, y + (k / 4) as f64 * 20.0);
            let _ = writeln!(
                out,
                r##"<circle cx="{:.0}" cy="{:.0}" r="6" fill="{}"/><text x="{:.0}" y="{:.0}" font-size="11" fill="#444">{g}</text>"##,
                gx + 6.0,
                gy - 4.0,
                colour(Some(*g)),
                gx + 16.0,
                gy
            );
        }
    }
    out.push_str("</svg>\n");
    out
}
