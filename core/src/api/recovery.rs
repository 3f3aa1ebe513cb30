//! `spec.recovery` and `spec.checkpoint`: restart budgets and exit-code rules for crashes, and
//! where members keep what a replacement resumes from.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::duration::Duration;

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.maxRestarts) || self.maxRestarts >= 0").message("recovery.maxRestarts must be >= 0").field_path(".maxRestarts"))]
#[x_kube(validation = Rule::new("self.maxRestartsPerMember >= 0").message("recovery.maxRestartsPerMember must be >= 0").field_path(".maxRestartsPerMember"))]
pub struct RecoverySpec {
    /// Crash restarts allowed across the whole job; past them it fails. Unset: no job-wide
    /// limit, only each member's. Preemptions never count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_restarts: Option<i32>,
    /// Crash restarts allowed per member id. A member past its budget is not started again:
    /// the job goes on without it (`Degraded`), and fails only once fewer than `replicas.min`
    /// members are left that may run.
    #[serde(default = "default_max_restarts_per_member")]
    pub max_restarts_per_member: i32,
    /// First crash-restart delay; doubles per crash of the same member.
    #[serde(default = "default_backoff")]
    pub backoff: Duration,
    /// A member Pending longer than this is reported (and may fall back to on-demand).
    #[serde(default = "default_pending_timeout")]
    pub pending_timeout: Duration,
    /// How a crash counts, in the shape of a Job's `podFailurePolicy`: the first rule that
    /// matches the trainer's exit code or its pod's conditions decides; a crash no rule
    /// matches is counted. Preemptions are never crashes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20))]
    pub failure_policy: Vec<FailureRule>,
}

/// One rule of `recovery.failurePolicy`: `onExitCodes` or `onPodConditions`, not both.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.onExitCodes) != (has(self.onPodConditions) && size(self.onPodConditions) > 0)").message("recovery.failurePolicy: a rule names onExitCodes or onPodConditions, one of them").field_path(".onExitCodes"))]
pub struct FailureRule {
    pub action: FailureAction,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_exit_codes: Option<ExitCodeMatch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20))]
    pub on_pod_conditions: Vec<PodConditionMatch>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureAction {
    /// Not counted against any budget: the member is started again after the backoff.
    Ignore,
    /// Counted against `maxRestartsPerMember` (and `maxRestarts`), as a crash no rule matches.
    Count,
    /// The job fails at once.
    FailJob,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.operator != 'In' || !self.values.exists(v, v == 0)").message("recovery.failurePolicy.onExitCodes: 0 is success and cannot be matched with In").field_path(".values"))]
pub struct ExitCodeMatch {
    pub operator: ExitCodeOperator,
    #[schemars(length(min = 1, max = 255))]
    pub values: Vec<i32>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitCodeOperator {
    In,
    NotIn,
}

/// A pod condition, e.g. `{type: ConfigIssue}` (its status `True` by default).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodConditionMatch {
    #[serde(rename = "type")]
    #[schemars(length(min = 1, max = 316))]
    pub type_: String,
    #[serde(default = "default_condition_status")]
    pub status: String,
}

fn default_condition_status() -> String {
    "True".into()
}

impl FailureRule {
    /// Whether this rule matches a crash with `code` (if the trainer exited with one) on a pod
    /// with `conditions` (type, status).
    pub fn matches(&self, code: Option<i32>, conditions: &[(String, String)]) -> bool {
        if let Some(m) = &self.on_exit_codes {
            return code.is_some_and(|c| match m.operator {
                ExitCodeOperator::In => m.values.contains(&c),
                ExitCodeOperator::NotIn => !m.values.contains(&c),
            });
        }
        self.on_pod_conditions.iter().any(|want| {
            conditions
                .iter()
                .any(|(t, st)| *t == want.type_ && *st == want.status)
        })
    }
}

impl RecoverySpec {
    /// What a crash with `code` on a pod with `conditions` counts as: the first matching
    /// rule's action, else `Count`.
    pub fn action_for(&self, code: Option<i32>, conditions: &[(String, String)]) -> FailureAction {
        self.failure_policy
            .iter()
            .find(|r| r.matches(code, conditions))
            .map_or(FailureAction::Count, |r| r.action)
    }
}

fn default_max_restarts_per_member() -> i32 {
    3
}
fn default_backoff() -> Duration {
    Duration::from_secs(10)
}
fn default_pending_timeout() -> Duration {
    Duration::from_secs(600)
}

impl Default for RecoverySpec {
    fn default() -> Self {
        Self {
            max_restarts: None,
            max_restarts_per_member: default_max_restarts_per_member(),
            backoff: default_backoff(),
            pending_timeout: default_pending_timeout(),
            failure_policy: Vec::new(),
        }
    }
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[serde(rename_all = "camelCase")]
pub enum CheckpointVolumeKind {
    #[default]
    EmptyDir,
    PersistentVolumeClaim,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.everySteps >= 1").message("checkpoint.everySteps must be >= 1").field_path(".everySteps"))]
pub struct CheckpointSpec {
    #[serde(default)]
    pub volume: CheckpointVolume,
    pub every_steps: u64,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.kind != 'persistentVolumeClaim' || (has(self.claimName) && self.claimName != '')").message("checkpoint.volume.claimName is required for kind persistentVolumeClaim").field_path(".claimName"),
    validation = Rule::new("self.kind == 'persistentVolumeClaim' || !has(self.claimName)").message("checkpoint.volume.claimName applies only to kind persistentVolumeClaim").field_path(".claimName"),
)]
pub struct CheckpointVolume {
    pub kind: CheckpointVolumeKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub claim_name: Option<String>,
}
