//! What is seen of a member's newest attempt now: the runtime's part (its process or pod) and
//! the driver's (what its trainer posted).

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use murmur_core::contract::{JoinReport, TrainerStatus};

use super::Exit;

/// Why a member's container has not started, in the kubelet's words: its reason
/// (`ImagePullBackOff`, `ErrImagePull`, `CreateContainerConfigError`, `FailedMount`, ...) and
/// message. The attempt lives on (the kubelet keeps trying); people are told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotStarting {
    pub reason: String,
    pub message: String,
}

impl NotStarting {
    /// The problem, whatever stage of retrying the kubelet is in: a pull that failed and the
    /// back-off before the next one are one problem, said once.
    pub fn kind(&self) -> &str {
        match self.reason.as_str() {
            "ImagePullBackOff" => "ErrImagePull",
            other => other,
        }
    }
}

impl std::fmt::Display for NotStarting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.message.is_empty() {
            f.write_str(&self.reason)
        } else {
            write!(f, "{}: {}", self.reason, self.message)
        }
    }
}

/// What is seen of one member: its newest attempt. A runtime fills what its process or pod
/// shows and leaves `join` and `status` unset; the driver sets those two from what the same
/// attempt's trainer posted.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ObservedMember {
    pub attempt: u32,
    /// `host:port` of its peer listener, once known.
    pub address: Option<String>,
    /// Its join report (the driver's, shared: every plan observes every member).
    pub join: Option<Arc<JoinReport>>,
    /// The newest status it reported, posted or read from its `/status` (the driver's,
    /// shared).
    pub status: Option<Arc<TrainerStatus>>,
    /// Set once it ended.
    pub exit: Option<Exit>,
    /// The node it runs on, once scheduled (the operator; local processes leave it unset).
    pub node: Option<String>,
    /// That node's zone (`topology.kubernetes.io/zone`), when it has one: zone-aware cliques
    /// form inside zones.
    pub zone: Option<String>,
    /// That node's region (`topology.kubernetes.io/region`), when it has one: what its traffic
    /// costs.
    pub region: Option<String>,
    /// Since when it has waited for a node (the operator; local processes never wait).
    pub pending_since: Option<Timestamp>,
    /// Why its container cannot start, while it cannot (pods only).
    pub not_starting: Option<NotStarting>,
    /// The scheduling gates that hold its pod back from scheduling, while they do (a queue's
    /// admission, such as Kueue's), comma-separated. A gated member waits for admission, not
    /// for a node.
    pub gated_by: Option<String>,
}

impl ObservedMember {
    pub fn is_live(&self) -> bool {
        self.exit.is_none()
    }
}
