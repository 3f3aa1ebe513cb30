//! Where a member may run: the job's capacity choice (spot, preferSpot, onDemand) merged with
//! the user's own nodeSelector, affinity and tolerations — never dropping any of them.

use k8s_openapi::api::core::v1::{
    Affinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PodAffinityTerm,
    PreferredSchedulingTerm, Toleration, WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use murmur_core::api::{Capacity, SchedulingSpec};

use super::labels::ZONE_LABEL;

/// Node labels that mark spot capacity on the clouds and autoscalers murmur knows. A node
/// matching any of them is a spot node.
pub const SPOT_LABELS: &[(&str, &str)] = &[
    ("cloud.google.com/gke-spot", "true"),
    ("cloud.google.com/gke-preemptible", "true"),
    ("eks.amazonaws.com/capacityType", "SPOT"),
    ("karpenter.sh/capacity-type", "spot"),
    ("kubernetes.azure.com/scalesetpriority", "spot"),
];

/// Taints the clouds put on spot nodes (GKE spot and preemptible, AKS spot pools).
pub const SPOT_TAINTS: &[(&str, &str)] = &[
    ("cloud.google.com/gke-spot", "true"),
    ("cloud.google.com/gke-preemptible", "true"),
    ("kubernetes.azure.com/scalesetpriority", "spot"),
];

/// Weight of each preferred spot term under `preferSpot`.
const PREFER_SPOT_WEIGHT: i32 = 50;

/// How one attempt of a member is placed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Placement {
    pub affinity: Option<Affinity>,
    pub tolerations: Vec<Toleration>,
}

fn spot_term(key: &str, value: &str) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.to_string(),
        operator: "In".to_string(),
        values: Some(vec![value.to_string()]),
    }
}

/// The placement of an attempt; `on_demand` drops the spot requirement (fallback).
pub fn placement(scheduling: &SchedulingSpec, on_demand: bool) -> Placement {
    let mut affinity = scheduling.affinity.clone().unwrap_or_default();
    let mut tolerations = scheduling.tolerations.clone();
    let capacity = if on_demand {
        Capacity::OnDemand
    } else {
        scheduling.capacity
    };
    match capacity {
        Capacity::Spot => {
            let node = affinity.node_affinity.get_or_insert_with(Default::default);
            let required = node
                .required_during_scheduling_ignored_during_execution
                .take();
            node.required_during_scheduling_ignored_during_execution = Some(require_spot(required));
            add_spot_tolerations(&mut tolerations);
        }
        Capacity::PreferSpot => {
            let node = affinity.node_affinity.get_or_insert_with(Default::default);
            let preferred = node
                .preferred_during_scheduling_ignored_during_execution
                .get_or_insert_with(Vec::new);
            for (key, value) in SPOT_LABELS {
                preferred.push(PreferredSchedulingTerm {
                    weight: PREFER_SPOT_WEIGHT,
                    preference: NodeSelectorTerm {
                        match_expressions: Some(vec![spot_term(key, value)]),
                        match_fields: None,
                    },
                });
            }
            add_spot_tolerations(&mut tolerations);
        }
        Capacity::OnDemand => {}
    }
    let empty = affinity == Affinity::default();
    Placement {
        affinity: (!empty).then_some(affinity),
        tolerations,
    }
}

/// Weight of a replacement's preference for its clique's zone (the most a preference can weigh).
const CLIQUE_ZONE_WEIGHT: i32 = 100;

/// `affinity` plus a preference for the zone of the pods matching `clique` (its job and clique
/// labels), and for `zone` by name where the topology knows the clique's zone: zone-aware cliques
/// live in one zone, and a replacement should join them there. The pods' labels alone can
/// mislead (a clique whose members all moved has no pod yet, and labels follow a new topology a
/// reconcile late); the zone by name is a second preference, scored by the scheduler's
/// node-affinity plugin beside its pod-affinity one, against the even spread over zones the pods
/// also ask for.
pub fn prefer_clique_zone(
    affinity: Option<Affinity>,
    clique: [(String, String); 2],
    zone: Option<&str>,
) -> Affinity {
    let mut affinity = affinity.unwrap_or_default();
    if let Some(zone) = zone {
        affinity
            .node_affinity
            .get_or_insert_with(Default::default)
            .preferred_during_scheduling_ignored_during_execution
            .get_or_insert_with(Vec::new)
            .push(PreferredSchedulingTerm {
                weight: CLIQUE_ZONE_WEIGHT,
                preference: NodeSelectorTerm {
                    match_expressions: Some(vec![NodeSelectorRequirement {
                        key: ZONE_LABEL.to_string(),
                        operator: "In".to_string(),
                        values: Some(vec![zone.to_string()]),
                    }]),
                    match_fields: None,
                },
            });
    }
    affinity
        .pod_affinity
        .get_or_insert_with(Default::default)
        .preferred_during_scheduling_ignored_during_execution
        .get_or_insert_with(Vec::new)
        .push(WeightedPodAffinityTerm {
            weight: CLIQUE_ZONE_WEIGHT,
            pod_affinity_term: PodAffinityTerm {
                label_selector: Some(LabelSelector {
                    match_labels: Some(clique.into_iter().collect()),
                    match_expressions: None,
                }),
                topology_key: ZONE_LABEL.to_string(),
                ..Default::default()
            },
        });
    affinity
}

/// Kubernetes ORs node selector terms and ANDs the expressions inside one term. "The user's
/// terms AND any spot label" is therefore every user term extended by each spot label.
fn require_spot(user: Option<NodeSelector>) -> NodeSelector {
    let user_terms = user
        .map(|s| s.node_selector_terms)
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| vec![NodeSelectorTerm::default()]);
    let mut terms = Vec::with_capacity(user_terms.len() * SPOT_LABELS.len());
    for user_term in &user_terms {
        for (key, value) in SPOT_LABELS {
            let mut term = user_term.clone();
            term.match_expressions
                .get_or_insert_with(Vec::new)
                .push(spot_term(key, value));
            terms.push(term);
        }
    }
    NodeSelector {
        node_selector_terms: terms,
    }
}

fn add_spot_tolerations(tolerations: &mut Vec<Toleration>) {
    for (key, value) in SPOT_TAINTS {
        let toleration = Toleration {
            key: Some(key.to_string()),
            operator: Some("Equal".to_string()),
            value: Some(value.to_string()),
            effect: Some("NoSchedule".to_string()),
            toleration_seconds: None,
        };
        if !tolerations.contains(&toleration) {
            tolerations.push(toleration);
        }
    }
}

/// Whether a node carries one of the spot labels.
pub fn is_spot_node(labels: &std::collections::BTreeMap<String, String>) -> bool {
    SPOT_LABELS
        .iter()
        .any(|(k, v)| labels.get(*k).is_some_and(|l| l == v))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scheduling(yaml: &str) -> SchedulingSpec {
        serde_json::from_value(serde_saphyr::from_str::<serde_json::Value>(yaml).unwrap()).unwrap()
    }

    fn required(p: &Placement) -> Vec<NodeSelectorTerm> {
        p.affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|n| {
                n.required_during_scheduling_ignored_during_execution
                    .clone()
            })
            .map(|s| s.node_selector_terms)
            .unwrap_or_default()
    }

    fn keys(term: &NodeSelectorTerm) -> Vec<String> {
        term.match_expressions
            .iter()
            .flatten()
            .map(|e| e.key.clone())
            .collect()
    }

    #[test]
    fn spot_requires_any_of_the_well_known_spot_labels() {
        let p = placement(&scheduling("capacity: spot"), false);
        let terms = required(&p);
        assert_eq!(terms.len(), SPOT_LABELS.len());
        for ((key, value), term) in SPOT_LABELS.iter().zip(&terms) {
            let e = &term.match_expressions.as_ref().unwrap()[0];
            assert_eq!((e.key.as_str(), e.operator.as_str()), (*key, "In"));
            assert_eq!(e.values.as_deref(), Some(&[value.to_string()][..]));
        }
        let tolerated: Vec<_> = p.tolerations.iter().filter_map(|t| t.key.clone()).collect();
        assert!(tolerated.contains(&"cloud.google.com/gke-spot".to_string()));
        assert!(tolerated.contains(&"kubernetes.azure.com/scalesetpriority".to_string()));
    }

    #[test]
    fn the_users_required_terms_are_anded_with_the_spot_labels() {
        let p = placement(
            &scheduling(
                "
capacity: spot
affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms:
      - matchExpressions: [{key: zone, operator: In, values: [a]}]
      - matchExpressions: [{key: zone, operator: In, values: [b]}]
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 1
      podAffinityTerm: {topologyKey: kubernetes.io/hostname}
tolerations:
- {key: gpu, operator: Exists, effect: NoSchedule}
",
            ),
            false,
        );
        let terms = required(&p);
        assert_eq!(terms.len(), 2 * SPOT_LABELS.len());
        for term in &terms {
            let keys = keys(term);
            assert_eq!(keys.len(), 2, "{keys:?}");
            assert_eq!(keys[0], "zone");
        }
        let a = p.affinity.as_ref().unwrap();
        assert!(a.pod_anti_affinity.is_some(), "kept");
        assert_eq!(p.tolerations[0].key.as_deref(), Some("gpu"), "kept first");
        assert_eq!(p.tolerations.len(), 1 + SPOT_TAINTS.len());
    }

    #[test]
    fn prefer_spot_adds_preferences_and_keeps_requirements_as_they_are() {
        let p = placement(
            &scheduling(
                "
capacity: preferSpot
affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms:
      - matchExpressions: [{key: arch, operator: In, values: [amd64]}]
",
            ),
            false,
        );
        let terms = required(&p);
        assert_eq!(terms.len(), 1);
        assert_eq!(keys(&terms[0]), vec!["arch"]);
        let preferred = p
            .affinity
            .unwrap()
            .node_affinity
            .unwrap()
            .preferred_during_scheduling_ignored_during_execution
            .unwrap();
        assert_eq!(preferred.len(), SPOT_LABELS.len());
    }

    #[test]
    fn on_demand_and_fallback_attempts_have_no_spot_terms_but_keep_the_users() {
        let user = "
capacity: spot
tolerations:
- {key: team, operator: Equal, value: ml, effect: NoSchedule}
";
        let fallback = placement(&scheduling(user), true);
        assert!(fallback.affinity.is_none());
        assert_eq!(fallback.tolerations.len(), 1);
        let on_demand = placement(&scheduling("capacity: onDemand"), false);
        assert_eq!(on_demand, Placement::default());
    }

    #[test]
    fn spot_nodes_are_recognised_by_any_label() {
        let mut labels = std::collections::BTreeMap::new();
        assert!(!is_spot_node(&labels));
        labels.insert("karpenter.sh/capacity-type".into(), "on-demand".into());
        assert!(!is_spot_node(&labels));
        labels.insert("eks.amazonaws.com/capacityType".into(), "SPOT".into());
        assert!(is_spot_node(&labels));
    }
}
