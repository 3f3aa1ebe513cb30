//! Condition bookkeeping shared by both runtimes: a condition's `lastTransitionTime` moves only
//! when its status really flips, so watchers can trust it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// The condition types murmur sets on a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConditionType {
    Created,
    Running,
    Degraded,
    Suspended,
    Succeeded,
    Failed,
    InvalidSpec,
    /// The API server refuses the members' pods (a priority class that does not exist, a field
    /// only a Pod checks): the message is its word.
    PodsRejected,
    /// Members' containers cannot start (an image that cannot be pulled, a volume that cannot
    /// be mounted, a container the runtime cannot create): the reason and message are the
    /// kubelet's.
    MembersNotStarting,
    /// Members' pods wait for admission: scheduling gates hold them (Kueue's
    /// `kueue.x-k8s.io/admission`, until its queue admits the job's pod group).
    Queued,
}

impl ConditionType {
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionType::Created => "Created",
            ConditionType::Running => "Running",
            ConditionType::Degraded => "Degraded",
            ConditionType::Suspended => "Suspended",
            ConditionType::Succeeded => "Succeeded",
            ConditionType::Failed => "Failed",
            ConditionType::InvalidSpec => "InvalidSpec",
            ConditionType::PodsRejected => "PodsRejected",
            ConditionType::MembersNotStarting => "MembersNotStarting",
            ConditionType::Queued => "Queued",
        }
    }
}

/// Why a condition stands as it does: its `reason`, one CamelCase word that tools match on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConditionReason {
    /// `Created`: the members are planned.
    Planned,
    /// `InvalidSpec` is false again.
    SpecValid,
    /// `InvalidSpec`: the spec fails a validation rule.
    InvalidSpec,
    /// `PodsRejected`: the API server refuses the members' pods.
    PodsRejected,
    /// `PodsRejected` is false again.
    PodsCreated,
    /// `Queued`: scheduling gates hold members' pods.
    WaitingForAdmission,
    /// `Queued` is false again.
    Admitted,
    /// `MembersNotStarting`: the kubelet's reason (see [`KubeletReason`]).
    Kubelet(KubeletReason),
    /// `MembersNotStarting` is false again.
    Started,
    /// `Running` is false: no topology yet.
    WaitingForJoins,
    /// `Running`: members train.
    Training,
    /// The job finished.
    Completed,
    /// `spec.suspend` stopped the members.
    Suspended,
    /// `spec.suspend` was lifted.
    Resumed,
    /// The job failed.
    Failed,
    /// `Degraded`: fewer members live than `replicas.min`.
    BelowMinimum,
    /// `Degraded`: fewer members live than `replicas.target`.
    MembersLost,
    /// `Degraded` is false: every member the target asks for is live.
    AllMembersLive,
}

impl ConditionReason {
    pub fn as_str(&self) -> &str {
        match self {
            ConditionReason::Planned => "Planned",
            ConditionReason::SpecValid => "SpecValid",
            ConditionReason::InvalidSpec => "InvalidSpec",
            ConditionReason::PodsRejected => "PodsRejected",
            ConditionReason::PodsCreated => "PodsCreated",
            ConditionReason::WaitingForAdmission => "WaitingForAdmission",
            ConditionReason::Admitted => "Admitted",
            ConditionReason::Kubelet(k) => k.as_str(),
            ConditionReason::Started => "Started",
            ConditionReason::WaitingForJoins => "WaitingForJoins",
            ConditionReason::Training => "Training",
            ConditionReason::Completed => "Completed",
            ConditionReason::Suspended => "Suspended",
            ConditionReason::Resumed => "Resumed",
            ConditionReason::Failed => "Failed",
            ConditionReason::BelowMinimum => "BelowMinimum",
            ConditionReason::MembersLost => "MembersLost",
            ConditionReason::AllMembersLive => "AllMembersLive",
        }
    }
}

/// The kubelet's reason a container cannot start (`ImagePullBackOff`, `CreateContainerError`),
/// kept when it is a valid condition reason (the API server's pattern) and `NotStarting`
/// otherwise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeletReason(String);

impl KubeletReason {
    pub fn new(reason: &str) -> Self {
        let valid = reason.starts_with(|c: char| c.is_ascii_alphabetic())
            && reason
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_,:".contains(c))
            && !reason.ends_with([',', ':']);
        Self(if valid { reason } else { "NotStarting" }.to_string())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Insert or update one condition. Returns true when anything changed (so callers can skip a
/// write). `now` is passed in: this module never reads a clock.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    kind: ConditionType,
    status: bool,
    reason: ConditionReason,
    message: &str,
    observed_generation: Option<i64>,
    now: Time,
) -> bool {
    let reason = reason.as_str();
    let status = if status { "True" } else { "False" }.to_string();
    match conditions.iter_mut().find(|c| c.type_ == kind.as_str()) {
        Some(existing) => {
            let flipped = existing.status != status;
            let changed = flipped
                || existing.reason != reason
                || existing.message != message
                || existing.observed_generation != observed_generation;
            if flipped {
                existing.last_transition_time = now;
            }
            existing.status = status;
            existing.reason = reason.to_string();
            existing.message = message.to_string();
            existing.observed_generation = observed_generation;
            changed
        }
        None => {
            conditions.push(Condition {
                type_: kind.as_str().to_string(),
                status,
                reason: reason.to_string(),
                message: message.to_string(),
                observed_generation,
                last_transition_time: now,
            });
            true
        }
    }
}

pub fn condition_is_true(conditions: &[Condition], kind: ConditionType) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == kind.as_str() && c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn transition_time_moves_only_when_status_flips() {
        let mut c = Vec::new();
        assert!(set_condition(
            &mut c,
            ConditionType::Running,
            true,
            ConditionReason::Started,
            "4/4 members",
            None,
            at(10)
        ));
        // Same status, new message: updated, but the transition time stays.
        assert!(set_condition(
            &mut c,
            ConditionType::Running,
            true,
            ConditionReason::Started,
            "3/4 members",
            None,
            at(20)
        ));
        assert_eq!(c[0].last_transition_time, at(10));
        assert_eq!(c[0].message, "3/4 members");
        // Nothing new: reported as unchanged so no write is made.
        assert!(!set_condition(
            &mut c,
            ConditionType::Running,
            true,
            ConditionReason::Started,
            "3/4 members",
            None,
            at(30)
        ));
        assert_eq!(c[0].last_transition_time, at(10));
        // A flip moves it.
        assert!(set_condition(
            &mut c,
            ConditionType::Running,
            false,
            ConditionReason::Suspended,
            "suspended",
            None,
            at(40)
        ));
        assert_eq!(c[0].last_transition_time, at(40));
        assert_eq!(c.len(), 1);
        assert!(!condition_is_true(&c, ConditionType::Running));
    }

    #[test]
    fn conditions_are_keyed_by_type() {
        let mut c = Vec::new();
        set_condition(
            &mut c,
            ConditionType::Created,
            true,
            ConditionReason::Planned,
            "",
            None,
            at(1),
        );
        set_condition(
            &mut c,
            ConditionType::Degraded,
            true,
            ConditionReason::MembersLost,
            "3/4",
            None,
            at(2),
        );
        set_condition(
            &mut c,
            ConditionType::Created,
            true,
            ConditionReason::Planned,
            "",
            None,
            at(3),
        );
        assert_eq!(c.len(), 2);
        assert!(condition_is_true(&c, ConditionType::Degraded));
    }
}
