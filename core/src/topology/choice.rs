//! The topology for a set of members: which graph to build and with what options, decided in
//! one place for the planner (from a job's spec), `murmur topology` and the trainer's simulator
//! (from their flags), and what the control plane learns of a member from its join report.

use crate::api::{AlgorithmKind, DecentralizedTrainingJobSpec, TopologyKind};
use crate::contract::JoinReport;

use super::dcliques::Trade;
use super::measures::clique_skew;
use super::{
    BuildSpec, MemberProfile, Topology, TopologyError, TopologyOptions, build, moshpit,
    random_regular,
};

/// How far past the skew the cliques settled at (in label skew, which lies in [0, 2]) repair may
/// leave the worst clique before [`Recipe::rebalance`] trades members between cliques: one class
/// missing from a clique of five costs 0.2.
pub const REBALANCE_MARGIN: f64 = 0.1;

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
    /// label skew ([`Topology::settled_skew`]), what [`Recipe::rebalance`] measures repair against.
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
                    t.settled_skew = clique_skew(&t).map(|s| s.max);
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

/// What [`Recipe::rebalance`] did.
#[derive(Clone, Debug, PartialEq)]
pub struct Rebalance {
    pub trades: Vec<Trade>,
    /// The worst clique's label skew before the trades and after them.
    pub before: f64,
    pub after: f64,
}

impl Recipe {
    /// Trades between `t`'s cliques ([`Topology::rebalance_worst_cliques`]) when member-by-member
    /// repair has left its worst clique more than [`REBALANCE_MARGIN`] more skewed than the cliques
    /// last settled at (`t.settled_skew`; 0 when unknown). A burst of losses does that: a clique
    /// left under half its size is dissolved into the others, and the replacements then fill a
    /// new clique with whatever labels they bring, so two cliques each miss classes the other
    /// holds twice. The trades aim at half the margin and number at most two cliques' worth, so
    /// one change rewires a few cliques, never all of them.
    ///
    /// Where trades bring the worst clique no nearer (one class short while its member is
    /// replaced: no trade helps), its skew is remembered as settled, so the next changes do not
    /// search again; and a skew below the settled one lowers it. None for graphs other than
    /// D-Cliques, members without histograms, or no trade worth making.
    pub fn rebalance(&self, t: &mut Topology) -> Option<Rebalance> {
        if self.graph != GraphChoice::Family(TopologyKind::DCliques) {
            return None;
        }
        let before = clique_skew(t)?.max;
        let settled = t.settled_skew.unwrap_or(0.0).min(before);
        t.settled_skew = Some(settled);
        if before - settled <= REBALANCE_MARGIN {
            return None;
        }
        let trades =
            t.rebalance_worst_cliques(settled + REBALANCE_MARGIN / 2.0, 2 * self.spec.clique_size);
        let after = clique_skew(t)?.max;
        if after - settled > REBALANCE_MARGIN {
            t.settled_skew = Some(after);
        }
        (!trades.is_empty()).then_some(Rebalance {
            trades,
            before,
            after,
        })
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

    /// Every member's clique.
    fn cliques(t: &Topology) -> std::collections::BTreeMap<MemberId, u32> {
        t.cliques_by_member().into_iter().collect()
    }

    #[test]
    fn cliques_a_burst_of_losses_left_skewed_are_rebalanced_by_trades_and_balanced_ones_kept() {
        let mut spec = job(TopologyKind::DCliques, AlgorithmKind::CliqueAveraging);
        spec.topology.clique_size = Some(5);
        let recipe = Recipe::for_job(&spec);
        let mut t = recipe
            .build(&(0..10).map(two_classes).collect::<Vec<_>>())
            .unwrap();
        assert!(worst_skew(&t) < 1e-9, "two cliques holding every class");
        assert_eq!(
            t.settled_skew,
            Some(worst_skew(&t)),
            "a build remembers its skew"
        );
        assert_eq!(
            recipe.rebalance(&mut t),
            None,
            "a balanced topology is kept"
        );
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
            repaired > 2.0 * REBALANCE_MARGIN,
            "the repair alone left the cliques balanced ({repaired}): the scenario no longer shows the drift"
        );
        // Measured against the skew the cliques settled at: within the margin of it, no trade.
        let mut known = t.clone();
        known.settled_skew = Some(repaired - REBALANCE_MARGIN / 2.0);
        assert_eq!(recipe.rebalance(&mut known), None);
        let version = t.version;
        let members: Vec<MemberId> = t.graph.members().collect();
        let done = recipe.rebalance(&mut t).expect("rebalanced");
        assert_eq!(t.version, version + 1, "one change, one version");
        assert!(worst_skew(&t) < 1e-9, "{}", worst_skew(&t));
        assert_eq!((done.before, done.after), (repaired, worst_skew(&t)));
        assert!(done.trades.len() <= 2 * 5, "{done:?}");
        assert_eq!(t.graph.members().collect::<Vec<_>>(), members);
        let sizes: Vec<usize> = t
            .cliques_by_member()
            .values()
            .fold(
                std::collections::BTreeMap::<u32, usize>::new(),
                |mut n, c| {
                    *n.entry(*c).or_default() += 1;
                    n
                },
            )
            .into_values()
            .collect();
        assert_eq!(
            sizes,
            vec![5, 5],
            "the oversized clique gave a member to the short one"
        );
        assert!(t.graph.is_connected());
        assert_eq!(recipe.rebalance(&mut t), None, "once rebalanced, kept");
        // Other graphs are repaired member by member only.
        let ring = Recipe::for_job(&job(TopologyKind::Ring, AlgorithmKind::Dpsgd));
        assert_eq!(ring.rebalance(&mut t), None);
    }

    #[test]
    fn cliques_no_trade_can_balance_are_remembered_and_not_searched_again() {
        let mut spec = job(TopologyKind::DCliques, AlgorithmKind::CliqueAveraging);
        spec.topology.clique_size = Some(5);
        let recipe = Recipe::for_job(&spec);
        // One member holds most of the examples, all of one class the others lack: no clique
        // can be balanced.
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
        assert!(skew > 2.0 * REBALANCE_MARGIN, "{skew}");
        // Its settled skew unknown (a topology kept from before it was recorded): one search is
        // made, finds nothing, and the skew is kept.
        t.settled_skew = None;
        let before = t.clone();
        assert_eq!(recipe.rebalance(&mut t), None);
        assert_eq!(t.settled_skew, Some(skew));
        assert_eq!(t.graph, before.graph, "only the measure changed");
        assert_eq!(t.version, before.version);
        // Now within the margin of it: nothing to try.
        let mut again = t.clone();
        assert_eq!(recipe.rebalance(&mut again), None);
        assert_eq!(again, t);
    }

    /// The scale harness's members (`e2e/scale/loadgen.rs`): 400 examples of class `id % 10`,
    /// 10 of each other.
    fn harness_member(id: MemberId) -> MemberProfile {
        MemberProfile::from_join(
            &JoinReport {
                member_id: id,
                label_histogram: (0..10)
                    .map(|c| if c == id % 10 { 400 } else { 10 })
                    .collect(),
                proxy_vector: None,
            },
            None,
        )
    }

    fn harness_recipe() -> Recipe {
        let mut spec = job(TopologyKind::DCliques, AlgorithmKind::CliqueAveraging);
        spec.topology.clique_size = Some(10);
        Recipe::for_job(&spec)
    }

    /// The members whose clique differs between `a` and `b` (those in both).
    fn moved(a: &Topology, b: &Topology) -> std::collections::BTreeSet<MemberId> {
        let (a, b) = (cliques(a), cliques(b));
        a.iter()
            .filter(|(m, c)| b.get(m).is_some_and(|d| d != *c))
            .map(|(m, _)| *m)
            .collect()
    }

    fn traded(r: &Option<Rebalance>) -> std::collections::BTreeSet<MemberId> {
        r.iter()
            .flat_map(|r| r.trades.iter().flat_map(Trade::members))
            .collect()
    }

    #[test]
    fn a_member_replaced_in_a_thousand_moves_only_the_members_traded_for_it() {
        // A 1 000-member harness run relabelled 989 pods for one replacement: the departure
        // made a fresh build of every clique. Now only members traded between two cliques move.
        let recipe = harness_recipe();
        let built = recipe
            .build(&(0..1000).map(harness_member).collect::<Vec<_>>())
            .unwrap();
        let (mut replacements, mut with_trades, mut most) = (0, 0, 0);
        for id in (0..1000).step_by(7).chain([360, 768]) {
            let mut t = built.clone();
            t.remove_member(id).unwrap();
            let left = recipe.rebalance(&mut t);
            t.add_member(harness_member(id)).unwrap();
            let back = recipe.rebalance(&mut t);
            let traded: std::collections::BTreeSet<MemberId> =
                traded(&left).union(&traded(&back)).copied().collect();
            let moved = moved(&built, &t);
            assert!(
                moved.is_subset(&traded),
                "member {id}: {moved:?} moved, {traded:?} traded"
            );
            assert!(traded.len() <= 2 * 2 * 10, "member {id}: {traded:?}");
            replacements += 1;
            with_trades += usize::from(!traded.is_empty());
            most = most.max(moved.len());
        }
        println!("{replacements} replacements, {with_trades} with trades, at most {most} moved");
    }

    #[test]
    fn late_joiners_rewire_a_few_cliques_each_and_leave_them_balanced() {
        // The last 100 of 1 000 join one by one onto cliques built over the first 900.
        let recipe = harness_recipe();
        let mut t = recipe
            .build(&(0..900).map(harness_member).collect::<Vec<_>>())
            .unwrap();
        let mut most_moved = 0;
        for id in 900..1000 {
            let before = t.clone();
            t.add_member(harness_member(id)).unwrap();
            let rebalanced = recipe.rebalance(&mut t);
            let moved = moved(&before, &t);
            let traded = traded(&rebalanced);
            assert!(
                moved.is_subset(&traded),
                "member {id}: {moved:?} moved, {traded:?} traded"
            );
            most_moved = most_moved.max(moved.len());
        }
        println!("at most {most_moved} members moved for one join");
        assert!(
            most_moved <= 2 * 2 * 10,
            "{most_moved} members moved for one join"
        );
        let fresh = recipe
            .build(&(0..1000).map(harness_member).collect::<Vec<_>>())
            .unwrap();
        assert!(
            worst_skew(&t) <= worst_skew(&fresh) + REBALANCE_MARGIN,
            "repaired {} against a fresh build's {}",
            worst_skew(&t),
            worst_skew(&fresh)
        );
        assert!(t.graph.is_connected());
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
