//! What a trainer tells the control plane: once on join, and continuously through `/status`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::api::Progress;

/// Sent once on start. The control plane never reads training data: data-aware topologies are
/// built from these summaries only.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JoinReport {
    pub member_id: u32,
    /// Examples per class in this member's shard (D-Cliques).
    pub label_histogram: Vec<u64>,
    /// Mean softmax output on the shared proxy batch after a short warm-up (proxy clumps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_vector: Option<Vec<f32>>,
}

impl JoinReport {
    /// Decimal places of a proxy vector's entries the control plane keeps.
    pub const PROXY_DECIMALS: i32 = 3;

    /// The report as the control plane keeps it: each proxy-vector entry rounded to
    /// [`Self::PROXY_DECIMALS`] places. Clumping needs no more (entries are probabilities), and
    /// a job's memory holds every member's report: at 10 000 members of ten classes, full f32
    /// digits packed to 1.6 MB, over the 1 MiB a ConfigMap may hold. Kept rounded from the
    /// start, the topology built live and the one rebuilt from the memory are the same.
    pub fn kept(mut self) -> Self {
        let scale = 10f32.powi(Self::PROXY_DECIMALS);
        for x in self.proxy_vector.iter_mut().flatten() {
            *x = (*x * scale).round() / scale;
        }
        self
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum TrainerState {
    Joining,
    Training,
    Paused,
    Leaving,
    Done,
}

/// A trainer's `/status` document. Its progress fields are the job status's own `Progress`
/// (flattened: `step`, `loss`, `accuracy`, `consensusDistance` at the top level).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrainerStatus {
    pub member_id: u32,
    pub state: TrainerState,
    #[serde(flatten)]
    pub progress: Progress,
    pub topology_version: u64,
    /// Neighbours heard from in the last round.
    pub neighbours_seen: Vec<u32>,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub rejected_frames: u64,
    /// Model bytes sent to each peer so far (member id: bytes), for the cross-zone bill.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub bytes_sent_to: BTreeMap<u32, u64>,
}

impl TrainerStatus {
    /// A member's status before it has done anything: no progress, no topology, nothing sent.
    pub fn new(member_id: u32, state: TrainerState) -> Self {
        Self {
            member_id,
            state,
            progress: Progress::default(),
            topology_version: 0,
            neighbours_seen: Vec::new(),
            bytes_in: 0,
            bytes_out: 0,
            rejected_frames: 0,
            bytes_sent_to: BTreeMap::new(),
        }
    }
}

/// Where a trainer in a pod writes its [`TerminationMessage`] (the operator sets it to the
/// container's `terminationMessagePath`), so a completed member is told from one that left on a
/// spot notice even by an operator that restarted in between.
pub const TERMINATION_LOG: &str = "MURMUR_TERMINATION_LOG";

/// How a trainer ended, as it last wrote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum TerminationOutcome {
    /// Reached the stopping target.
    Done,
    /// Left the job on SIGTERM (a spot notice, a suspend, a scale-down).
    Left,
    /// Stopped on an error it cannot train past (a missing or malformed dataset, a bad spec):
    /// `message` names the file or field and what is wrong.
    Failed,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TerminationMessage {
    pub outcome: TerminationOutcome,
    /// The step it reached (0 from a trainer that failed: its message says where).
    pub step: u64,
    /// Why it failed (`failed` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_join_is_kept_with_its_proxy_vector_rounded_and_keeping_it_again_changes_nothing() {
        let report = JoinReport {
            member_id: 7,
            label_histogram: vec![400, 10],
            proxy_vector: Some(vec![0.123_456_78, 0.876_543_2, 0.0, 1.0]),
        };
        let kept = report.clone().kept();
        assert_eq!(kept.proxy_vector, Some(vec![0.123, 0.877, 0.0, 1.0]));
        assert_eq!(kept.label_histogram, report.label_histogram);
        assert_eq!(kept.clone().kept(), kept);
        // As the memory stores it, and back.
        let text = serde_json::to_string(&kept).unwrap();
        assert!(text.contains("[0.123,0.877,0.0,1.0]"), "{text}");
        assert_eq!(serde_json::from_str::<JoinReport>(&text).unwrap(), kept);
    }

    #[test]
    fn status_json_is_flat() {
        let status = TrainerStatus {
            member_id: 3,
            state: TrainerState::Training,
            progress: Progress {
                step: 40,
                loss: Some(0.5),
                accuracy: None,
                metric: None,
                consensus_distance: Some(0.1),
            },
            topology_version: 2,
            neighbours_seen: vec![2, 4],
            bytes_in: 10,
            bytes_out: 12,
            rejected_frames: 0,
            bytes_sent_to: BTreeMap::from([(2, 7), (4, 5)]),
        };
        let v = serde_json::to_value(&status).unwrap();
        assert_eq!(v["step"], 40);
        assert_eq!(v["consensusDistance"], 0.1);
        assert_eq!(v["state"], "training");
        assert!(v.get("accuracy").is_none());
        assert_eq!(v["bytesSentTo"]["2"], 7);
        assert_eq!(serde_json::from_value::<TrainerStatus>(v).unwrap(), status);
    }
}
