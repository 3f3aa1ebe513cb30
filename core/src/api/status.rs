//! What the control plane observed: written only through the status subresource.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum JobPhase {
    #[default]
    Pending,
    Running,
    /// Training continues with fewer than `replicas.target` members, or waits below `min`.
    Degraded,
    Suspended,
    Succeeded,
    Failed,
}

impl JobPhase {
    pub fn is_finished(self) -> bool {
        matches!(self, JobPhase::Succeeded | JobPhase::Failed)
    }
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub enum MemberCapacity {
    Spot,
    OnDemand,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum MemberPhase {
    /// Created, not yet heard from (waiting for a node, starting, or its pod refused for now).
    #[default]
    Pending,
    /// Starting: reporting itself and waiting for its place in the topology.
    Joining,
    /// Training its shard and averaging with its neighbours.
    Training,
    /// Out of the current topology, waiting to be placed in one again.
    Paused,
    /// Leaving the job: on a spot notice, or stopped by murmur.
    Leaving,
    /// Stopped because the job no longer needed it (finishing, suspended, scaled down, moved to its clique's zone): counts as nothing.
    Retired,
    /// Reached the stopping target.
    Done,
    /// Lost to spot reclaim, eviction or node loss: never counted as a failure.
    Preempted,
    /// Crashed: counted as `recovery.failurePolicy` says.
    Failed,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct MemberStatus {
    /// Stable member id (its place in the topology).
    pub id: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<MemberCapacity>,
    pub phase: MemberPhase,
    #[serde(default)]
    pub step: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub joined_at: Option<Time>,
    /// A note for a person, e.g. why this member fell back to on-demand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Its node's zone (`topology.kubernetes.io/zone`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// Model bytes this member sent to members in other zones, when the zones are known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cross_zone_bytes: Option<u64>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    pub step: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
    /// The share of test examples classified right, for tasks judged by accuracy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<f64>,
    /// The test figure of a task judged by another metric (a language model's perplexity);
    /// absent where `accuracy` says how good the model is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<NamedMetric>,
    /// Mean distance of members' parameters to their average.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consensus_distance: Option<f64>,
}

/// A quality figure with its name: what a task is judged by.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NamedMetric {
    /// "accuracy", "perplexity", or a task's own.
    #[schemars(length(max = 63))]
    pub name: String,
    pub value: f64,
    /// Whether more is better (accuracy) or worse (perplexity).
    pub higher_is_better: bool,
}

impl NamedMetric {
    pub const ACCURACY: &str = "accuracy";

    /// The first of `metrics`, and the values of those that share its name (its own first);
    /// None when there are none.
    pub fn like_first<'a>(
        metrics: impl IntoIterator<Item = &'a NamedMetric>,
    ) -> Option<(&'a NamedMetric, Vec<f64>)> {
        let mut metrics = metrics.into_iter();
        let first = metrics.next()?;
        let values = std::iter::once(first.value)
            .chain(metrics.filter(|m| m.name == first.name).map(|m| m.value))
            .collect();
        Some((first, values))
    }

    /// The mean of `metrics` that share the first one's name (None when there are none).
    pub fn mean<'a>(metrics: impl IntoIterator<Item = &'a NamedMetric>) -> Option<NamedMetric> {
        let (first, values) = Self::like_first(metrics)?;
        Some(NamedMetric {
            value: values.iter().sum::<f64>() / values.len() as f64,
            ..first.clone()
        })
    }
}

impl Progress {
    /// How good the model is, whatever the task is judged by: `accuracy` or `metric`.
    pub fn quality(&self) -> Option<NamedMetric> {
        match (self.accuracy, &self.metric) {
            (Some(value), _) => Some(NamedMetric {
                name: NamedMetric::ACCURACY.to_string(),
                value,
                higher_is_better: true,
            }),
            (None, metric) => metric.clone(),
        }
    }

    /// Record a test figure: accuracy in `accuracy`, any other in `metric`.
    pub fn set_quality(&mut self, quality: NamedMetric) {
        if quality.name == NamedMetric::ACCURACY {
            self.accuracy = Some(quality.value);
            self.metric = None;
        } else {
            self.accuracy = None;
            self.metric = Some(quality);
        }
    }

    /// The mean quality of `progress` (accuracy or the first member's metric), as `set_quality`
    /// would record it: what a job's progress says.
    pub fn mean_quality<'a>(
        progress: impl IntoIterator<Item = &'a Progress>,
    ) -> Option<NamedMetric> {
        let qualities: Vec<NamedMetric> =
            progress.into_iter().filter_map(Progress::quality).collect();
        NamedMetric::mean(&qualities)
    }
}

/// The most members `status.members` lists. The status lives in the job's own object, stored
/// by etcd whole, and a reconcile that changes any member writes it again: an apply's cost
/// grows with the list (on an idle API server 16 ms with 10 members, 34 ms with 100, 195 ms
/// with 1 000; `e2e/scale/status-apply.sh`). Every member is in the status API.
pub const STATUS_MEMBERS_MAX: usize = 100;

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct DecentralizedTrainingJobStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<JobPhase>,
    /// Standard conditions; `lastTransitionTime` moves only when a condition's status flips.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// At most 100 members, those that need attention first; the operator's status API lists
    /// every member.
    // Atomic: the operator alone writes the list, and as a map server-side apply tracked every
    // member's every field (113 KB of managedFields at 1 000 members, each apply 2-3x slower).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub members: Vec<MemberStatus>,
    /// Members left out of `members` (jobs of more than 100 members).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub members_omitted: u32,
    /// "ready/target", for `kubectl get dtj`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_summary: Option<String>,
    #[serde(default)]
    pub topology_version: u64,
    /// Members lost to spot reclaim, eviction or node loss. Never counted as restarts.
    #[serde(default)]
    pub preemptions: u32,
    /// Crash restarts, counted against `recovery.maxRestarts`.
    #[serde(default)]
    pub restarts: u32,
    /// Members moved once, before training, to the zone their clique trains in
    /// (`scheduling.zoneAware`). Neither preemptions nor restarts.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub relocations: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
    /// Model bytes sent between members to date, within a zone, across zones and across
    /// regions, and what they cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic: Option<super::traffic::Traffic>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The image the job's trainer pods run: `spec.trainer.image`, or the operator's default
    /// when the job started. Kept, so a replacement after an operator upgrade runs what its
    /// peers run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trainer_image: Option<String>,
}

#[cfg(test)]
mod quality_tests {
    use super::*;

    fn perplexity(value: f64) -> NamedMetric {
        NamedMetric {
            name: "perplexity".into(),
            value,
            higher_is_better: false,
        }
    }

    #[test]
    fn accuracy_is_recorded_as_accuracy_and_any_other_metric_by_its_name() {
        let mut p = Progress::default();
        p.set_quality(perplexity(4.0));
        assert_eq!(
            (p.accuracy, p.metric.clone()),
            (None, Some(perplexity(4.0)))
        );
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(json["metric"]["name"], "perplexity");
        assert_eq!(json["metric"]["higherIsBetter"], false);
        assert!(json.get("accuracy").is_none());
        p.set_quality(NamedMetric {
            name: NamedMetric::ACCURACY.into(),
            value: 0.9,
            higher_is_better: true,
        });
        assert_eq!((p.accuracy, p.metric.clone()), (Some(0.9), None));
        assert_eq!(p.quality().unwrap().name, "accuracy");
    }

    #[test]
    fn the_mean_quality_is_over_the_members_reporting_the_same_metric() {
        let members: Vec<Progress> = [Some(3.0), None, Some(5.0)]
            .into_iter()
            .map(|v| {
                let mut p = Progress::default();
                if let Some(v) = v {
                    p.set_quality(perplexity(v));
                }
                p
            })
            .collect();
        assert_eq!(Progress::mean_quality(&members), Some(perplexity(4.0)));
        assert_eq!(Progress::mean_quality(&[Progress::default()]), None);
    }
}
