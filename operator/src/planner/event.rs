//! Something that happened to a job: the one event type. The planner emits it, the local runtime
//! emits its chaos with it, the job driver keeps it (timestamped) for the status API, the
//! terminal prints it and the operator writes it as a Kubernetes Event.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use murmur_core::topology::MemberId;

/// The Kubernetes Event `type`.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    Normal,
    Warning,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Normal => "Normal",
            EventKind::Warning => "Warning",
        }
    }
}

/// Why: the Kubernetes Event `reason` (and `action`), one word a person can filter on.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// A member's pod was placed on a node.
    Scheduled,
    /// A member sent its join report.
    Joined,
    /// A member waited longer than `recovery.pendingTimeout` for a node.
    PendingTooLong,
    /// A member waited too long for a spot node and runs on-demand.
    FellBackToOnDemand,
    /// A lost member got a new attempt.
    Replaced,
    /// A member left the topology; its neighbours were rewired.
    Left,
    /// A new topology version.
    TopologyChanged,
    /// Repairs left the cliques skewed (a burst of losses): members were traded between them.
    CliquesRebalanced,
    /// Every member is gone.
    AllMembersLost,
    /// A member lost to spot reclaim, eviction or node loss (never a failure).
    Preempted,
    /// A member crashed (counted against `recovery.maxRestarts`).
    MemberFailed,
    /// A member reached the stopping target.
    MemberCompleted,
    /// A member the finishing job no longer needs was stopped.
    MemberRetired,
    /// A member outside its clique's zone was stopped, to start again in that zone.
    Relocated,
    Suspended,
    Resumed,
    Succeeded,
    Failed,
    InvalidSpec,
    /// The API server refuses the members' pods.
    PodsRejected,
    /// A member's container cannot start: the kubelet's reason and message.
    MemberNotStarting,
    /// `murmur run --chaos`: a signal murmur itself sent to a member.
    Chaos,
    /// The operator cannot decode the job as stored (written under an older, looser CRD): it
    /// leaves it alone and says which field.
    Undecodable,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Scheduled => "Scheduled",
            Reason::Joined => "Joined",
            Reason::PendingTooLong => "PendingTooLong",
            Reason::FellBackToOnDemand => "FellBackToOnDemand",
            Reason::Replaced => "Replaced",
            Reason::Left => "Left",
            Reason::TopologyChanged => "TopologyChanged",
            Reason::CliquesRebalanced => "CliquesRebalanced",
            Reason::AllMembersLost => "AllMembersLost",
            Reason::Preempted => "Preempted",
            Reason::MemberFailed => "MemberFailed",
            Reason::MemberCompleted => "MemberCompleted",
            Reason::Relocated => "Relocated",
            Reason::MemberRetired => "MemberRetired",
            Reason::Suspended => "Suspended",
            Reason::Resumed => "Resumed",
            Reason::Succeeded => "Succeeded",
            Reason::Failed => "Failed",
            Reason::InvalidSpec => "InvalidSpec",
            Reason::PodsRejected => "PodsRejected",
            Reason::MemberNotStarting => "MemberNotStarting",
            Reason::Chaos => "Chaos",
            Reason::Undecodable => "Undecodable",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One event of a job.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// `Normal` or `Warning`.
    #[serde(rename = "type")]
    pub kind: EventKind,
    pub reason: Reason,
    /// The member it concerns, if one...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<MemberId>,
    /// ...and which of its attempts (its pod, in a cluster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    pub message: String,
    /// The Kubernetes Event's `action` where it is not the reason: the kind of problem a
    /// `MemberNotStarting` is (`FailedMount`, `ErrImagePull`), for `kubectl events` to filter on.
    #[serde(skip)]
    pub action: Option<String>,
}

impl Event {
    /// A warning about `member`'s attempt, if one.
    pub fn warning(reason: Reason, member: Option<(MemberId, u32)>, message: String) -> Self {
        Self {
            kind: EventKind::Warning,
            reason,
            member: member.map(|(id, _)| id),
            attempt: member.map(|(_, attempt)| attempt),
            message,
            action: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_serializes_as_the_status_api_always_showed_it() {
        let e = Event::warning(Reason::Preempted, Some((3, 1)), "gone".into());
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"type": "Warning", "reason": "Preempted", "member": 3, "attempt": 1, "message": "gone"})
        );
        assert_eq!(serde_json::from_value::<Event>(v).unwrap(), e);
        // Each reason's name is its serialized form.
        for r in [
            Reason::FellBackToOnDemand,
            Reason::Chaos,
            Reason::InvalidSpec,
        ] {
            assert_eq!(serde_json::to_value(r).unwrap(), r.as_str());
        }
    }
}
