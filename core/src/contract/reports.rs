//! What a trainer tells the control plane: once on join, and continuously through `/status`.

use serde::{Deserialize, Serialize};

/// Sent once on start. The control plane never reads training data: data-aware topologies are
/// built from these summaries only.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JoinReport {
    pub member_id: u32,
    /// Examples per class in this member's shard (D-Cliques).
    pub label_histogram: Vec<u64>,
    /// Mean softmax output on the shared proxy batch after a short warm-up (proxy clumps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_vector: Option<Vec<f32>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum TrainerState {
    Joining,
    Training,
    Paused,
    Leaving,
    Done,
}

/// A trainer's `/status` document.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrainerStatus {
    pub member_id: u32,
    pub state: TrainerState,
    pub step: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consensus_distance: Option<f64>,
    pub topology_version: u64,
    /// Neighbours heard from in the last round.
    pub neighbours_seen: Vec<u32>,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub rejected_frames: u64,
}
