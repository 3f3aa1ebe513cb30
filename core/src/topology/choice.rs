//! The topology for a set of members: which graph to build and with what options, decided in
//! one place for the planner (from a job's spec), `murmur topology` and the trainer's simulator
//! (from their flags), and what the control plane learns of a member from its join report.

use crate::api::{AlgorithmKind, DecentralizedTrainingJobSpec, TopologyKind};
use crate::contract::JoinReport;

use super::{
    BuildSpec, MemberProfile, Topology, TopologyError, TopologyOptions, build, moshpit,
    random_regular,
};

/// Which graph to build: one of the job spec's families, a Moshpit grid (what Moshpit averaging
/// trains on), or a random regular graph (a baseline of a data-aware graph's degree).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GraphChoice {
    Family(TopologyKind),
    Moshpit,
    RandomRegular { degree: usize },
}

impl GraphChoice {
    /// Every family, in the order the flags list them (random regular needs a degree).
    pub const FAMILIES: [GraphChoice; 7] = [
        GraphChoice::Family(TopologyKind::Ring),
        GraphChoice::Family(TopologyKind::FullyConnected),
        GraphChoice::Family(TopologyKind::Exponential),
        GraphChoice::Family(TopologyKind::ExponentialOnePeer),
        GraphChoice::Family(TopologyKind::DCliques),
        GraphChoice::Family(TopologyKind::ProxyClumps),
        GraphChoice::Moshpit,
    ];

    /// The graph a job trains on: the Moshpit grid under Moshpit averaging, else its topology's
    /// family.
    pub fn for_job(spec: &DecentralizedTrainingJobSpec) -> Self {
        match spec.algorithm.kind {
            AlgorithmKind::Moshpit => GraphChoice::Moshpit,
            _ => GraphChoice::Family(spec.topology.kind),
        }
    }

    /// The flag's name: `ring`, `dcliques`, `random-regular:3`, ...
    pub fn name(&self) -> String {
        match self {
            GraphChoice::Family(kind) => match kind {
                TopologyKind::Ring => "ring",
                TopologyKind::FullyConnected => "fully-connected",
                TopologyKind::Exponential => "exponential",
                TopologyKind::ExponentialOnePeer => "exponential-one-peer",
                TopologyKind::DCliques => "dcliques",
                TopologyKind::ProxyClumps => "proxy-clumps",
            }
            .to_string(),
            GraphChoice::Moshpit => "moshpit".to_string(),
            GraphChoice::RandomRegular { degree } => format!("random-regular:{degree}"),
        }
    }

    /// The algorithm the graph is meant for: clique averaging on cliques, Moshpit on its grid,
    /// D-PSGD elsewhere.
    pub fn default_algorithm(&self) -> AlgorithmKind {
        match self {
            GraphChoice::Family(TopologyKind::DCliques | TopologyKind::ProxyClumps) => {
                AlgorithmKind::CliqueAveraging
            }
            GraphChoice::Moshpit => AlgorithmKind::Moshpit,
            _ => AlgorithmKind::Dpsgd,
        }
    }
}

impl std::fmt::Display for GraphChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

impl std::str::FromStr for GraphChoice {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        if let Some(known) = Self::FAMILIES.into_iter().find(|c| c.name() == text) {
            return Ok(known);
        }
        match text
            .strip_prefix("random-regular:")
            .map(str::parse::<usize>)
        {
            Some(Ok(degree)) if degree >= 1 => Ok(GraphChoice::RandomRegular { degree }),
            _ => Err(format!(
                "unknown topology {text:?}: use ring, fully-connected, exponential, exponential-one-peer, dcliques, proxy-clumps, moshpit or random-regular:DEGREE"
            )),
        }
    }
}

/// A graph to build and everything it is built with.
#[derive(Clone, Debug, PartialEq)]
pub struct Recipe {
    pub graph: GraphChoice,
    /// The families' options (its `kind` is the graph's family, or unused) and the seed.
    pub spec: BuildSpec,
    /// Moshpit: members per group.
    pub group_size: usize,
}

impl Recipe {
    /// What a job's spec asks for: its graph, its topology options, and zone-aware cliques
    /// where its scheduling says so.
    pub fn for_job(spec: &DecentralizedTrainingJobSpec) -> Self {
        Self {
            graph: GraphChoice::for_job(spec),
            spec: BuildSpec {
                zone_aware: spec.scheduling.zone_aware(),
                ..BuildSpec::from_spec(&spec.topology, spec.training.seed)
            },
            group_size: spec.algorithm.group_size(),
        }
    }

    /// What command-line flags ask for (`murmur topology`, the simulator).
    pub fn from_flags(graph: GraphChoice, options: &TopologyOptions, seed: u64) -> Self {
        let kind = match graph {
            GraphChoice::Family(kind) => kind,
            _ => TopologyKind::default(),
        };
        Self {
            graph,
            spec: options.build_spec(kind, seed),
            group_size: options.group_size,
        }
    }

    /// The topology over `members` (version 1).
    pub fn build(&self, members: &[MemberProfile]) -> Result<Topology, TopologyError> {
        match self.graph {
            GraphChoice::Family(kind) => build(
                &BuildSpec {
                    kind,
                    ..self.spec.clone()
                },
                members,
            ),
            GraphChoice::Moshpit => moshpit(members, self.group_size),
            GraphChoice::RandomRegular { degree } => {
                random_regular(members, degree, self.spec.seed)
            }
        }
    }
}

impl MemberProfile {
    /// What the control plane knows of a member: its join report's summaries, and the zone of
    /// the node it runs on.
    pub fn from_join(report: &JoinReport, zone: Option<String>) -> Self {
        Self {
            id: report.member_id,
            histogram: Some(report.label_histogram.iter().map(|&c| c as f64).collect()),
            proxy: report
                .proxy_vector
                .as_ref()
                .map(|v| v.iter().map(|&x| f64::from(x)).collect()),
            zone,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{AlgorithmSpec, TopologySpec};

    fn job(kind: TopologyKind, algorithm: AlgorithmKind) -> DecentralizedTrainingJobSpec {
        let mut spec: DecentralizedTrainingJobSpec = serde_json::from_value(serde_json::json!({
            "replicas": {"min": 2, "target": 8, "max": 8},
            "training": {"model": "mlp", "partition": {"kind": "iid"}, "steps": 10},
        }))
        .unwrap();
        spec.topology = TopologySpec {
            kind,
            ..spec.topology
        };
        spec.algorithm = AlgorithmSpec {
            kind: algorithm,
            ..spec.algorithm
        };
        spec
    }

    fn members(n: u32) -> Vec<MemberProfile> {
        let reports = (0..n).map(|id| JoinReport {
            member_id: id,
            label_histogram: (0..10).map(|c| u64::from(c == id % 10) * 50).collect(),
            proxy_vector: None,
        });
        reports
            .map(|r| MemberProfile::from_join(&r, None))
            .collect()
    }

    #[test]
    fn every_name_parses_back_to_its_choice_and_anything_else_is_named_in_the_error() {
        let mut all = GraphChoice::FAMILIES.to_vec();
        all.push(GraphChoice::RandomRegular { degree: 3 });
        for choice in all {
            assert_eq!(choice.name().parse::<GraphChoice>(), Ok(choice));
        }
        for bad in ["torus", "random-regular:0", "random-regular:x", "Ring"] {
            let e = bad.parse::<GraphChoice>().unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn a_job_trains_on_its_family_unless_moshpit_averaging_asks_for_the_grid() {
        assert_eq!(
            GraphChoice::for_job(&job(TopologyKind::DCliques, AlgorithmKind::CliqueAveraging)),
            GraphChoice::Family(TopologyKind::DCliques)
        );
        assert_eq!(
            GraphChoice::for_job(&job(TopologyKind::Ring, AlgorithmKind::Moshpit)),
            GraphChoice::Moshpit
        );
        let t = Recipe::for_job(&job(TopologyKind::Ring, AlgorithmKind::Moshpit))
            .build(&members(9))
            .unwrap();
        assert_eq!(t.kind_name(), "moshpit");
        let t = Recipe::for_job(&job(TopologyKind::DCliques, AlgorithmKind::CliqueAveraging))
            .build(&members(20))
            .unwrap();
        assert_eq!(t.kind_name(), "dCliques");
    }

    #[test]
    fn flags_and_a_job_spec_with_the_same_options_build_the_same_graph() {
        let spec = job(TopologyKind::DCliques, AlgorithmKind::CliqueAveraging);
        let options = TopologyOptions {
            zone_aware: spec.scheduling.zone_aware(),
            ..TopologyOptions::default()
        };
        let flags = Recipe::from_flags(
            GraphChoice::Family(TopologyKind::DCliques),
            &options,
            spec.training.seed,
        );
        assert_eq!(
            flags.build(&members(30)).unwrap(),
            Recipe::for_job(&spec).build(&members(30)).unwrap()
        );
    }

    #[test]
    fn every_choice_builds_over_the_same_members() {
        let options = TopologyOptions {
            clique_size: 5,
            group_size: 4,
            ..TopologyOptions::default()
        };
        let mut all = GraphChoice::FAMILIES.to_vec();
        all.push(GraphChoice::RandomRegular { degree: 3 });
        for choice in all {
            let mut profiles = members(16);
            for p in &mut profiles {
                p.proxy = Some(vec![0.1; 10]);
            }
            let t = Recipe::from_flags(choice, &options, 7)
                .build(&profiles)
                .unwrap_or_else(|e| panic!("{choice}: {e}"));
            assert_eq!(t.graph.member_count(), 16, "{choice}");
        }
    }

    #[test]
    fn a_profile_carries_the_reports_summaries_and_the_nodes_zone() {
        let report = JoinReport {
            member_id: 4,
            label_histogram: vec![3, 0, 5],
            proxy_vector: Some(vec![0.25, 0.75]),
        };
        let p = MemberProfile::from_join(&report, Some("zone-b".into()));
        assert_eq!(p.id, 4);
        assert_eq!(p.histogram, Some(vec![3.0, 0.0, 5.0]));
        assert_eq!(p.proxy, Some(vec![0.25, 0.75]));
        assert_eq!(p.zone.as_deref(), Some("zone-b"));
    }
}
