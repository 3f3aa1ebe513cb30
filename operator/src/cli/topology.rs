//! `murmur topology`: build a graph with the engine the planner uses, print it and its measures.

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use murmur_core::contract::{JoinReport, TopologyDocument};
use murmur_core::topology::{
    self, GraphChoice, Measures, MemberProfile, Recipe, Topology, TopologyError, TopologyOptions,
    render,
};
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Format {
    Table,
    Json,
    Dot,
    Svg,
}

#[derive(Args, Debug)]
pub struct TopologyArgs {
    /// Graph family: ring, fully-connected, exponential, exponential-one-peer, dcliques,
    /// proxy-clumps, moshpit or random-regular:DEGREE.
    #[arg(long, value_parser = str::parse::<GraphChoice>)]
    kind: GraphChoice,
    /// Number of members (taken from --histograms when that is given).
    #[arg(long)]
    members: Option<u32>,
    /// Classes for the default histograms (member k holds only class k mod classes).
    #[arg(long, default_value_t = 10)]
    classes: usize,
    /// JSON file with the members' label histograms: an array of arrays of counts, or the
    /// trainers' join reports ([{"memberId", "labelHistogram", "proxyVector"?}, ...]).
    #[arg(long)]
    histograms: Option<PathBuf>,
    #[command(flatten)]
    topology: TopologyOptions,
    /// Spread the members over this many zones (evenly, which member where at random by --seed):
    /// the table shows the edges that cross zones, and --zone-aware keeps cliques inside them.
    #[arg(long, default_value_t = 0)]
    zones: usize,
    /// Seed for Greedy Swap and k-means.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// dcliques: Greedy Swap iterations.
    #[arg(long, default_value_t = topology::dcliques::DEFAULT_SWAP_STEPS)]
    swap_steps: usize,
    /// Remove these members after building (shows elastic repair).
    #[arg(long, value_delimiter = ',')]
    remove: Vec<u32>,
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
    /// json: each member's peer address, `{id}` standing for its id and `{id+N}` for id + N,
    /// e.g. `10.0.0.{id+10}:7070` or `127.0.0.1:{id+7000}`. Trainers started without a control
    /// plane (`MURMUR_TOPOLOGY_FILE`) dial their neighbours at these addresses.
    #[arg(long)]
    address: Option<String>,
    /// Write here instead of standard output.
    #[arg(long, short)]
    output: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum TopologyCliError {
    #[error("{file}: {message}")]
    HistogramFile { file: String, message: String },
    #[error("--members is required unless --histograms gives the members")]
    NoMembers,
    #[error("--members {flag} disagrees with {file}, which describes {found} members")]
    MemberCount {
        flag: u32,
        file: String,
        found: usize,
    },
    #[error("--classes must be at least 1")]
    NoClasses,
    #[error("--address {template:?}: {reason}")]
    AddressTemplate {
        template: String,
        reason: &'static str,
    },
    #[error(transparent)]
    Build(#[from] TopologyError),
}

/// Either bare histograms or join reports, as the control plane stores them.
#[derive(Deserialize)]
#[serde(untagged)]
enum HistogramFile {
    Histograms(Vec<Vec<f64>>),
    Reports(Vec<JoinReport>),
}

fn load_profiles(path: &PathBuf) -> Result<Vec<MemberProfile>, TopologyCliError> {
    let file = path.display().to_string();
    let err = |message: String| TopologyCliError::HistogramFile {
        file: file.clone(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(format!("cannot read: {e}")))?;
    let parsed: HistogramFile = serde_json::from_str(&text).map_err(|_| {
        err("expected a JSON array of histograms ([[3, 0, 5], ...]) or of join reports ([{\"memberId\": 0, \"labelHistogram\": [...]}, ...])".into())
    })?;
    let profiles: Vec<MemberProfile> = match parsed {
        HistogramFile::Histograms(hs) => MemberProfile::from_histograms(hs),
        HistogramFile::Reports(rs) => rs
            .into_iter()
            .map(|r| MemberProfile::from_join(&r, None))
            .collect(),
    };
    for (k, p) in profiles.iter().enumerate() {
        let h = p.histogram.as_deref().unwrap_or_default();
        if let Some(bad) = h.iter().find(|x| !x.is_finite() || **x < 0.0) {
            return Err(err(format!(
                "member {k}: count {bad} is not a non-negative number"
            )));
        }
    }
    if profiles.is_empty() {
        return Err(err("describes no members".into()));
    }
    Ok(profiles)
}

fn profiles(args: &TopologyArgs) -> Result<Vec<MemberProfile>, TopologyCliError> {
    if let Some(path) = &args.histograms {
        let profiles = load_profiles(path)?;
        if let Some(flag) = args.members
            && flag as usize != profiles.len()
        {
            return Err(TopologyCliError::MemberCount {
                flag,
                file: path.display().to_string(),
                found: profiles.len(),
            });
        }
        return Ok(profiles);
    }
    let n = args.members.ok_or(TopologyCliError::NoMembers)?;
    if args.classes == 0 {
        return Err(TopologyCliError::NoClasses);
    }
    Ok(MemberProfile::from_histograms(
        topology::dcliques::one_class_per_member(n as usize, args.classes, 1.0),
    ))
}

pub fn build(args: &TopologyArgs) -> Result<Topology, TopologyCliError> {
    let mut members = profiles(args)?;
    if args.zones > 0 {
        let zone_of = topology::zones::scatter(members.len(), args.zones, args.seed);
        for (m, z) in members.iter_mut().zip(zone_of) {
            m.zone = Some(topology::zones::zone_name(z));
        }
    }
    let mut recipe = Recipe::from_flags(args.kind, &args.topology, args.seed);
    recipe.spec.swap_steps = args.swap_steps;
    let mut t = recipe.build(&members)?;
    remove(&mut t, &args.remove)?;
    Ok(t)
}

fn remove(t: &mut Topology, ids: &[u32]) -> Result<(), TopologyError> {
    ids.iter().try_for_each(|&id| t.remove_member(id))
}

/// The JSON rendering: the topology document (members, edges with weights) plus measures.
#[derive(Serialize)]
struct JsonOut<'a> {
    #[serde(flatten)]
    document: TopologyDocument,
    measures: &'a Measures,
}

/// One member's address from a `--address` template.
fn expand(template: &str, id: u32) -> Result<String, TopologyCliError> {
    let bad = |reason| TopologyCliError::AddressTemplate {
        template: template.to_string(),
        reason,
    };
    let mut out = String::new();
    let mut rest = template;
    let mut placed = false;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let close = rest[open..]
            .find('}')
            .ok_or_else(|| bad("a `{` is never closed"))?
            + open;
        let value = match &rest[open + 1..close] {
            "id" => u64::from(id),
            field => field
                .strip_prefix("id+")
                .and_then(|n| n.parse::<u64>().ok())
                .map(|n| n + u64::from(id))
                .ok_or_else(|| bad("placeholders are {id} and {id+N}"))?,
        };
        out.push_str(&value.to_string());
        placed = true;
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    if !placed {
        return Err(bad(
            "needs {id} or {id+N}, or every member gets the same address",
        ));
    }
    Ok(out)
}

pub fn render(
    t: &Topology,
    format: Format,
    address: Option<&str>,
) -> Result<String, TopologyCliError> {
    let m = topology::measure(t);
    let addresses = t
        .graph
        .members()
        .map(|id| Ok((id, address.map(|a| expand(a, id)).transpose()?)))
        .collect::<Result<std::collections::BTreeMap<_, _>, TopologyCliError>>()?;
    Ok(match format {
        Format::Table => render::table(t, &m),
        Format::Dot => render::dot(t),
        Format::Svg => render::svg(t, &m),
        Format::Json => {
            let out = JsonOut {
                document: t.to_document(|id| addresses.get(&id).cloned().flatten()),
                measures: &m,
            };
            serde_json::to_string_pretty(&out).expect("serializable") + "\n"
        }
    })
}

pub fn run(args: TopologyArgs, out: &mut impl Write) -> Result<(), super::CliError> {
    let t = build(&args)?;
    let text = render(&t, args.format, args.address.as_deref())?;
    match &args.output {
        Some(path) => std::fs::write(path, text)?,
        None => out.write_all(text.as_bytes())?,
    }
    Ok(())
}
