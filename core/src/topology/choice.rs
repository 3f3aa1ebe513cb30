//! The topology for a set of members: which graph to build and with what options, decided in
//! one place for the planner (from a job's spec), `murmur topology` and the trainer's simulator
//! (from their flags), and what the control plane learns of a member from its join report.

use crate::api::{AlgorithmKind, DecentralizedTrainingJobSpec, TopologyKind};
use crate::contract::JoinReport;

use super::measures::clique_skew;
use super::{
    BuildSpec, MemberProfile, Topology, TopologyError, TopologyOptions, build, moshpit,
    random_regular,
};

/// How much less skewed (in label skew, which lies in [0, 2]) a fresh build's worst clique must
/// be than the repaired one's for [`Recipe::reform`] to re-form the cliques: one class missing
/// from a clique of five costs 0.2.
pub const REFORM_MARGIN: f64 = 0.1;

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

    /// The topology over `members` (version 1). A D-Cliques build remembers its worst clique's
    /// label skew ([`Topology::fresh_skew`]), what [`Recipe::reform`] measures repair against.
    pub fn build(&self, members: &[MemberProfile]) -> Result<Topology, TopologyError> {
        match self.graph {
            GraphChoice::Family(kind) => {
                let mut t = build(
                    &BuildSpec {
                        kind,
                        ..self.spec.clone()
                    },
                    members,
                )?;
                if kind == TopologyKind::DCliques {
                    t.fresh_skew = clique_skew(&t).map(|s| s.max);
                }
                Ok(t)
            }
            GraphChoice::Moshpit => moshpit(members, self.group_size),
            GraphChoice::RandomRegular { degree } => {
                random_regular(members, degree, self.spec.seed)
            }
        }
    }
}

impl Recipe {
    /// `t`'s cliques formed afresh over its current members, when member-by-member repair has
    /// left its worst clique more than [`REFORM_MARGIN`] more skewed than a fresh build's. A
    /// burst of losses does that: a clique left under half its size is dissolved into the
    /// others, and the replacements then fill a new clique with whatever labels they bring, so
    /// two cliques each miss classes the other holds twice. The result carries `t`'s next
    /// version. None for graphs other than D-Cliques, members without label histograms, or no
    /// clear gain.
    ///
    /// A fresh build is tried only when repair has drifted more than the margin past the last
    /// fresh build's skew (`t.fresh_skew`; 0 when unknown). One that brings no clear gain is
    /// remembered in `t`, so the next changes, each moving the skew a little, do not build
    /// again: at 10 000 members a build is most of what a change costs the planner.
    pub fn reform(&self, t: &mut Topology) -> Option<Topology> {
        if self.graph != GraphChoice::Family(TopologyKind::DCliques) {
            return None;
        }
        let before = clique_skew(t)?.max;
        if before - t.fresh_skew.unwrap_or(0.0) <= REFORM_MARGIN {
            return None;
        }
        let members: Vec<MemberProfile> = t.profiles.values().cloned().collect();
        let mut fresh = self.build(&members).ok()?;
        let after = fresh.fresh_skew?;
        if before - after > REFORM_MARGIN {
            fresh.version = t.version + 1;
            Some(fresh)
        } else {
            t.fresh_skew = Some(after);
            None
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
    use crate::topology::MemberId;

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

    /// Member `id` of ten holding two classes each (`partition: classesPerMember, k: 2`).
    fn two_classes(id: MemberId) -> MemberProfile {
        let classes = [(2 * id) % 10, (2 * id + 1) % 10];
        MemberProfile::from_join(
            &JoinReport {
                member_id: id,
                label_histogram: (0..10)
                    .map(|c| u64::from(classes.contains(&c)) * 50)
                    .collect(),
                proxy_vector: None,
            },
            None,
        )
    }

    fn worst_skew(t: &Topology) -> f64 {
        clique_skew(t).unwrap().max
    }

    #[test]
    fn cliques_a_burst_of_losses_left_skewed_are_formed_afresh_and_balanced_ones_are_kept() {
        let mut spec = job(TopologyKind::DCliques, AlgorithmKind::CliqueAveraging);
        spec.topology.clique_size = Some(5);
        let recipe = Recipe::for_job(&spec);
        let mut t = recipe
            .build(&(0..10).map(two_classes).collect::<Vec<_>>())
            .unwrap();
        assert!(worst_skew(&t) < 1e-9, "two cliques holding every class");
        assert_eq!(
            t.fresh_skew,
            Some(worst_skew(&t)),
            "a build remembers its skew"
        );
        assert_eq!(recipe.reform(&mut t), None, "a balanced topology is kept");
        // A node holding three members of one clique dies and a member of the other is
        // evicted: the three-member hole dissolves the first clique's remnant into the second.
        let (a, b) = (t.clique_of(0).unwrap(), t.clique_of(5).unwrap());
        assert_ne!(a, b);
        let of = |t: &Topology, c: u32| -> Vec<MemberId> {
            t.graph
                .members()
                .filter(|&m| t.clique_of(m) == Some(c))
                .collect()
        };
        let lost: Vec<MemberId> = of(&t, a).into_iter().take(3).chain([5]).collect();
        for &id in &lost {
            t.remove_member(id).unwrap();
        }
        // Their replacements join one by one, with the data they had.
        for &id in &lost {
            t.add_member(two_classes(id)).unwrap();
        }
        let repaired = worst_skew(&t);
        assert!(
            repaired > 2.0 * REFORM_MARGIN,
            "the repair alone left the cliques balanced ({repaired}): the scenario no longer shows the drift"
        );
        // Measured against the last fresh build's skew: within the margin of it, no build.
        let mut known = t.clone();
        known.fresh_skew = Some(repaired - REFORM_MARGIN / 2.0);
        assert_eq!(recipe.reform(&mut known), None);
        let fresh = recipe.reform(&mut t).expect("re-formed");
        assert_eq!(fresh.version, t.version + 1);
        assert!(worst_skew(&fresh) < 1e-9, "{}", worst_skew(&fresh));
        assert_eq!(
            fresh.graph.members().collect::<Vec<_>>(),
            t.graph.members().collect::<Vec<_>>()
        );
        let mut fresh = fresh;
        assert_eq!(recipe.reform(&mut fresh), None, "once re-formed, kept");
        // Other graphs are repaired member by member only.
        let ring = Recipe::for_job(&job(TopologyKind::Ring, AlgorithmKind::Dpsgd));
        assert_eq!(ring.reform(&mut t), None);
    }

    #[test]
    fn a_fresh_build_that_brings_nothing_is_remembered_and_not_made_again() {
        let mut spec = job(TopologyKind::DCliques, AlgorithmKind::CliqueAveraging);
        spec.topology.clique_size = Some(5);
        let recipe = Recipe::for_job(&spec);
        // One member holds most of the examples, all of one class the others lack: no clique
        // can be balanced, a fresh one no more than this one.
        let one_class = |id: MemberId| {
            let (class, count) = if id == 9 { (1, 1000) } else { (0, 50) };
            MemberProfile::from_join(
                &JoinReport {
                    member_id: id,
                    label_histogram: (0..10).map(|c| u64::from(c == class) * count).collect(),
                    proxy_vector: None,
                },
                None,
            )
        };
        let mut t = recipe
            .build(&(0..10).map(one_class).collect::<Vec<_>>())
            .unwrap();
        let skew = worst_skew(&t);
        assert!(skew > 2.0 * REFORM_MARGIN, "{skew}");
        // Its fresh skew unknown (a topology kept from before it was recorded): one build is
        // made, gains nothing, and its skew is kept.
        t.fresh_skew = None;
        let before = t.clone();
        assert_eq!(recipe.reform(&mut t), None);
        assert_eq!(t.fresh_skew, Some(skew));
        assert_eq!(t.graph, before.graph, "only the measure changed");
        // Now within the margin of what a build gives: nothing to try.
        let mut again = t.clone();
        assert_eq!(recipe.reform(&mut again), None);
        assert_eq!(again, t);
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
