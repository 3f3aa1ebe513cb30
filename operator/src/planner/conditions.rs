//! The job's phase and its status conditions, derived from the state and the observation.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use murmur_core::api::conditions::{
    ConditionReason, ConditionType, KubeletReason, condition_is_true, set_condition,
};
use murmur_core::api::{DecentralizedTrainingJobSpec, JobPhase};
use murmur_core::topology::MemberId;

use super::{JobState, Observation};
use crate::member::NotStarting;

/// Members live in the topology.
pub fn live_in_topology(s: &JobState, observed: &Observation) -> usize {
    let Some(t) = &s.topology else { return 0 };
    observed
        .current(t.graph.members(), &s.members)
        .filter(|c| c.live.is_some())
        .count()
}

pub(super) fn phase(
    spec: &DecentralizedTrainingJobSpec,
    s: &JobState,
    observed: &Observation,
) -> JobPhase {
    if s.phase.is_finished() {
        return s.phase;
    }
    let any_live = observed.recorded(&s.members).any(|c| c.live.is_some());
    if s.finishing() {
        return if any_live {
            JobPhase::Running
        } else {
            JobPhase::Succeeded
        };
    }
    if s.topology.is_none() {
        return JobPhase::Pending;
    }
    if live_in_topology(s, observed) >= spec.replicas.target as usize {
        JobPhase::Running
    } else {
        JobPhase::Degraded
    }
}

pub(super) fn update_conditions(
    spec: &DecentralizedTrainingJobSpec,
    s: &mut JobState,
    observed: &Observation,
    now: Timestamp,
) {
    let live = live_in_topology(s, observed);
    let target = spec.replicas.target;
    let members = format!("{live}/{target} members in the topology");
    let running = matches!(s.phase, JobPhase::Running | JobPhase::Degraded);
    let (reason, message) = match s.phase {
        JobPhase::Pending => (
            ConditionReason::WaitingForJoins,
            "waiting for members' join reports",
        ),
        JobPhase::Succeeded => (ConditionReason::Completed, "finished"),
        JobPhase::Suspended => (ConditionReason::Suspended, "suspended: no members run"),
        JobPhase::Failed => (ConditionReason::Failed, "failed"),
        _ => (ConditionReason::Training, members.as_str()),
    };
    // Members whose containers cannot start (the first by id in the kubelet's words, and how
    // many more), and members held back by scheduling gates (the job waits in a queue for
    // admission).
    let mut stuck: Vec<(MemberId, u32, &NotStarting)> = Vec::new();
    let mut gated: Vec<&str> = Vec::new();
    for c in observed.recorded(&s.members) {
        let Some(m) = c.live else { continue };
        if let Some(problem) = &m.not_starting {
            stuck.push((c.id, c.attempt(), problem));
        }
        if let Some(gate) = &m.gated_by {
            gated.push(gate);
        }
    }
    let not_starting = stuck.first().map(|(id, attempt, first)| {
        let more = match stuck.len() - 1 {
            0 => String::new(),
            n => format!("; {n} more members cannot start"),
        };
        (
            ConditionReason::Kubelet(KubeletReason::new(&first.reason)),
            format!("member {id} (attempt {attempt}): {first}{more}"),
        )
    });
    let t = Time(now);
    let c = &mut s.conditions;
    if let Some(gates) = gated.first() {
        set_condition(
            c,
            ConditionType::Queued,
            true,
            ConditionReason::WaitingForAdmission,
            &match gated.len() {
                1 => format!("1 member waits for admission: held by scheduling gate {gates}"),
                n => format!("{n} members wait for admission: held by scheduling gate {gates}"),
            },
            None,
            t.clone(),
        );
    } else if condition_is_true(c, ConditionType::Queued) {
        set_condition(
            c,
            ConditionType::Queued,
            false,
            ConditionReason::Admitted,
            "no member's pod is held by a scheduling gate",
            None,
            t.clone(),
        );
    }
    match not_starting {
        Some((reason, message)) => {
            set_condition(
                c,
                ConditionType::MembersNotStarting,
                true,
                reason,
                &message,
                None,
                t.clone(),
            );
        }
        None if condition_is_true(c, ConditionType::MembersNotStarting) => {
            set_condition(
                c,
                ConditionType::MembersNotStarting,
                false,
                ConditionReason::Started,
                "no member's container is kept from starting",
                None,
                t.clone(),
            );
        }
        None => {}
    }
    set_condition(
        c,
        ConditionType::Running,
        running,
        reason,
        message,
        None,
        t.clone(),
    );
    let degraded = s.phase == JobPhase::Degraded;
    let why = if live < spec.replicas.min as usize {
        ConditionReason::BelowMinimum
    } else {
        ConditionReason::MembersLost
    };
    set_condition(
        c,
        ConditionType::Degraded,
        degraded,
        if degraded {
            why
        } else {
            ConditionReason::AllMembersLive
        },
        &members,
        None,
        t.clone(),
    );
    let suspended = s.phase == JobPhase::Suspended;
    if suspended
        || c.iter()
            .any(|c| c.type_ == ConditionType::Suspended.as_str())
    {
        set_condition(
            c,
            ConditionType::Suspended,
            suspended,
            if suspended {
                ConditionReason::Suspended
            } else {
                ConditionReason::Resumed
            },
            if suspended {
                "spec.suspend is true: members are stopped, the status is kept"
            } else {
                "spec.suspend is false"
            },
            None,
            t.clone(),
        );
    }
    if s.phase == JobPhase::Succeeded {
        set_condition(
            c,
            ConditionType::Succeeded,
            true,
            ConditionReason::Completed,
            "every member finished",
            None,
            t.clone(),
        );
    }
    if s.phase == JobPhase::Failed {
        let message = s.message.clone().unwrap_or_default();
        set_condition(
            c,
            ConditionType::Failed,
            true,
            ConditionReason::Failed,
            &message,
            None,
            t,
        );
    }
}
