//! Attempts that ended: exits the runtime saw (counted against the restart budgets, maybe
//! failing the job) and pods the API server refused, each with the backoff before the next try.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use murmur_core::api::conditions::{
    ConditionReason, ConditionType, condition_is_true, set_condition,
};
use murmur_core::api::{DecentralizedTrainingJobSpec, FailureAction, JobPhase};
use murmur_core::topology::MemberId;

use super::{
    Action, EventKind, JobState, MAX_BACKOFF_SECONDS, Observation, Preemption, Reason, after, event,
};
use crate::member::{End, Exit, Lifecycle};

/// A refused pod's next try waits this long, doubling with each refusal in a row.
pub const REFUSAL_BACKOFF_SECONDS: f64 = 5.0;
/// ... up to this.
pub const REFUSAL_BACKOFF_MAX_SECONDS: f64 = 300.0;

/// The API server's answers to the pods one plan created. `refused` (member, attempt, its
/// message) never existed: each ends `Refused` and is tried again after a backoff, while the
/// members that were admitted run (the job is `Degraded` until every member is). The
/// `PodsRejected` condition names the refusal, with an event when its message is new; once a
/// plan's pods are all admitted it clears. None when the answers change nothing: every pod
/// admitted, none of them refused before and no refusal still said. That is the common answer,
/// and at 10 000 members copying the state to find it out cost a reconcile 15 ms.
pub fn creates_answered(
    state: &JobState,
    accepted: &[(MemberId, u32)],
    refused: &[(MemberId, u32, String)],
    now: Timestamp,
) -> Option<(JobState, Vec<Action>)> {
    let refused_before = |&(id, attempt): &(MemberId, u32)| {
        state
            .members
            .get(&id)
            .is_some_and(|r| r.attempt == attempt && r.refusals > 0)
    };
    let clears = !accepted.is_empty()
        && refused.is_empty()
        && condition_is_true(&state.conditions, ConditionType::PodsRejected);
    if refused.is_empty() && !clears && !accepted.iter().any(refused_before) {
        return None;
    }
    let mut s = state.clone();
    let mut actions = Vec::new();
    for &(id, attempt) in accepted {
        if let Some(r) = s.members.get_mut(&id).filter(|r| r.attempt == attempt) {
            r.refusals = 0;
        }
    }
    for (id, attempt, _) in refused {
        let Some(r) = s.members.get_mut(id).filter(|r| r.attempt == *attempt) else {
            continue;
        };
        if !r.lifecycle.is_live() {
            continue;
        }
        r.become_(Lifecycle::Ended { how: End::Refused });
        r.refusals = r.refusals.saturating_add(1);
        let wait = (REFUSAL_BACKOFF_SECONDS * 2f64.powi(r.refusals.min(16) as i32 - 1))
            .min(REFUSAL_BACKOFF_MAX_SECONDS);
        r.not_before = Some(after(now, wait));
    }
    if let Some((_, _, why)) = refused.first() {
        let message = if refused.len() == 1 {
            why.clone()
        } else {
            format!("{} members' pods refused; the first: {why}", refused.len())
        };
        if set_condition(
            &mut s.conditions,
            ConditionType::PodsRejected,
            true,
            ConditionReason::PodsRejected,
            &message,
            None,
            Time(now),
        ) {
            actions.push(event(
                EventKind::Warning,
                Reason::PodsRejected,
                None,
                format!(
                    "the API server refuses members' pods; the others run, and these are retried with backoff: {message}"
                ),
            ));
        }
    } else if !accepted.is_empty() && condition_is_true(&s.conditions, ConditionType::PodsRejected)
    {
        set_condition(
            &mut s.conditions,
            ConditionType::PodsRejected,
            false,
            ConditionReason::PodsCreated,
            "the API server accepts the members' pods",
            None,
            Time(now),
        );
    }
    (s != *state).then_some((s, actions))
}

/// Handle every attempt that ended since the last plan.
pub(super) fn settle_ended_members(
    spec: &DecentralizedTrainingJobSpec,
    s: &mut JobState,
    observed: &Observation,
    now: Timestamp,
    actions: &mut Vec<Action>,
) {
    for (&id, m) in &observed.members {
        let Some(exit) = &m.exit else { continue };
        let record = s.members.entry(id).or_default();
        if record.attempt != m.attempt || !record.lifecycle.is_live() {
            continue;
        }
        if record.lifecycle == Lifecycle::Retiring {
            record.become_(Lifecycle::Ended { how: End::Retired });
            continue;
        }
        record.become_(Lifecycle::Ended { how: exit.end() });
        match exit {
            Exit::Completed => {
                actions.push(event(
                    EventKind::Normal,
                    Reason::MemberCompleted,
                    Some((id, m.attempt)),
                    format!("member {id} reached the stopping target"),
                ));
            }
            Exit::Preempted { reason } => {
                s.record_preemption(Preemption {
                    member: id,
                    attempt: m.attempt,
                    at: now,
                    reason: reason.clone(),
                });
                actions.push(event(
                    EventKind::Normal,
                    Reason::Preempted,
                    Some((id, m.attempt)),
                    format!("member {id} (attempt {}) preempted: {reason}", m.attempt),
                ));
            }
            Exit::Failed {
                reason,
                code,
                conditions,
            } => {
                let action = spec.recovery.action_for(*code, conditions);
                let counted = action != FailureAction::Ignore;
                if counted {
                    record.crashes += 1;
                    s.restarts += 1;
                } else {
                    record.ignored_crashes += 1;
                }
                let delay = (spec.recovery.backoff.as_std().as_secs_f64()
                    * 2f64.powi((record.crashes + record.ignored_crashes) as i32 - 1))
                .min(MAX_BACKOFF_SECONDS);
                record.not_before = Some(after(now, delay));
                let budget = spec.recovery.max_restarts_per_member;
                let given_up = counted && i64::from(record.crashes) > i64::from(budget);
                record.given_up |= given_up;
                let what = match (action, given_up) {
                    (FailureAction::Ignore, _) => {
                        "not counted (recovery.failurePolicy)".to_string()
                    }
                    (FailureAction::FailJob, _) => {
                        "it fails the job (recovery.failurePolicy)".into()
                    }
                    (_, true) => format!(
                        "past its restart budget (recovery.maxRestartsPerMember {budget}): not started again"
                    ),
                    _ => format!("restart {} of {budget} for this member", record.crashes),
                };
                actions.push(event(
                    EventKind::Warning,
                    Reason::MemberFailed,
                    Some((id, m.attempt)),
                    format!(
                        "member {id} (attempt {}) failed: {reason}; {what}",
                        m.attempt
                    ),
                ));
                let left = spec
                    .replicas
                    .target
                    .saturating_sub(s.members.values().filter(|r| r.given_up).count() as u32);
                let fail = match action {
                    FailureAction::FailJob => Some(format!(
                        "member {id} failed with {reason}, which recovery.failurePolicy says fails the job"
                    )),
                    _ if spec
                        .recovery
                        .max_restarts
                        .is_some_and(|max| i64::from(s.restarts) > i64::from(max)) =>
                    {
                        Some(format!(
                            "{} crash restarts exceed recovery.maxRestarts ({}); last: member {id}: {reason}",
                            s.restarts,
                            spec.recovery.max_restarts.unwrap_or_default()
                        ))
                    }
                    _ if given_up && left < spec.replicas.min => Some(format!(
                        "only {left} members may run, fewer than replicas.min ({}): the others are past recovery.maxRestartsPerMember ({budget}); last: member {id}: {reason}",
                        spec.replicas.min
                    )),
                    _ => None,
                };
                if let Some(message) = fail {
                    s.phase = JobPhase::Failed;
                    s.completed_at = Some(now);
                    s.message = Some(message);
                }
            }
        }
    }
    if s.phase == JobPhase::Failed {
        for (&id, m) in &observed.members {
            if m.is_live() {
                actions.push(Action::Stop {
                    member: id,
                    attempt: m.attempt,
                });
            }
        }
        actions.push(event(
            EventKind::Warning,
            Reason::Failed,
            None,
            s.message.clone().unwrap_or_default(),
        ));
    }
}
