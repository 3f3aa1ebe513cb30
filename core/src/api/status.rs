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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<f64>,
    /// Mean distance of members' parameters to their average.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consensus_distance: Option<f64>,
}

/// The most members `status.members` lists. The status lives in the job's own object, stored
/// by etcd whole (with the field manager's entry for every listed member): against a real API
/// server 3 000 members were stored and 10 000 refused ("etcdserver: request is too large").
pub const STATUS_MEMBERS_MAX: usize = 1000;

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
    /// At most 1000 members, those that need attention first; the operator's status API lists
    /// every member.
    // Atomic: the operator alone writes the list, and as a map server-side apply tracked every
    // member's every field (113 KB of managedFields at 1 000 members, each apply 2-3x slower).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub members: Vec<MemberStatus>,
    /// Members left out of `members` (jobs of more than 1000 members).
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
