//! The members' attempts: noting their progress, creating and replacing them, falling back to
//! on-demand, stopping them on suspend and retiring those the job no longer needs.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use murmur_core::api::{Capacity, DecentralizedTrainingJobSpec, JobPhase};
use murmur_core::topology::MemberId;

use super::{
    Action, CREATES_PER_PLAN, Event, EventKind, JobState, Observation, Reason, event, seconds_since,
};
use crate::member::{End, Lifecycle, NotStarting};

/// Lifecycle events of the current attempts: placed on a node, joined, waiting too long, kept
/// from starting.
pub(super) fn note_lifecycle(
    spec: &DecentralizedTrainingJobSpec,
    s: &mut JobState,
    observed: &Observation,
    now: Timestamp,
    actions: &mut Vec<Action>,
) {
    let pending_timeout = spec.recovery.pending_timeout.as_std().as_secs_f64();
    for (&id, r) in s.members.iter_mut() {
        let Some(m) = observed.live(id, r.attempt) else {
            continue;
        };
        if let Lifecycle::Pending { .. } = r.lifecycle
            && let Some(node) = &m.node
        {
            r.become_(Lifecycle::Scheduled);
            let capacity = if r.on_demand { " (on-demand)" } else { "" };
            actions.push(event(
                EventKind::Normal,
                Reason::Scheduled,
                Some((id, r.attempt)),
                format!(
                    "member {id} (attempt {}) runs on node {node}{capacity}",
                    r.attempt
                ),
            ));
        }
        if matches!(
            r.lifecycle,
            Lifecycle::Pending { .. } | Lifecycle::Scheduled
        ) && m.join.is_some()
        {
            r.become_(Lifecycle::Joined);
            actions.push(event(
                EventKind::Normal,
                Reason::Joined,
                Some((id, r.attempt)),
                format!("member {id} (attempt {}) sent its join report", r.attempt),
            ));
        }
        // Once per problem of an attempt; again if it comes back after the container started.
        let problem = m.not_starting.as_ref();
        let said = r.not_starting.as_ref().filter(|(a, _)| *a == r.attempt);
        if problem.map(NotStarting::kind) != said.map(|(_, kind)| kind.as_str()) {
            if let Some(p) = problem {
                actions.push(Action::Event(not_starting(id, r.attempt, p)));
            }
            r.not_starting = problem.map(|p| (r.attempt, p.kind().to_string()));
        }
        if r.lifecycle == Lifecycle::PENDING
            && m.node.is_none()
            && m.pending_since
                .is_some_and(|t| seconds_since(t, now) >= pending_timeout)
        {
            r.become_(Lifecycle::Pending { reported: true });
            actions.push(event(
                EventKind::Warning,
                Reason::PendingTooLong,
                Some((id, r.attempt)),
                format!(
                    "member {id} (attempt {}) has waited over {} for a node (recovery.pendingTimeout)",
                    r.attempt, spec.recovery.pending_timeout
                ),
            ));
        }
    }
}

/// What is said of a member's attempt that cannot start. Each problem is its own Kubernetes
/// Event (its kind is the action): a volume not mounted and then the image not pulled are two
/// pieces of news, not one twice.
pub fn not_starting(id: MemberId, attempt: u32, problem: &NotStarting) -> Event {
    Event {
        action: Some(problem.kind().to_string()),
        ..Event::warning(
            Reason::MemberNotStarting,
            Some((id, attempt)),
            format!("member {id} (attempt {attempt}) cannot start: {problem}"),
        )
    }
}

/// `suspend: true`: stop every member, keep the status and the members' records. The topology
/// goes with the members; resuming rebuilds it (with a newer version) from the new join reports.
pub(super) fn suspend(s: &mut JobState, observed: &Observation, actions: &mut Vec<Action>) {
    let mut stopped = 0;
    for (&id, r) in s.members.iter_mut() {
        if let Some(m) = observed.live(id, r.attempt)
            && r.lifecycle.is_active()
        {
            r.become_(Lifecycle::Retiring);
            stopped += 1;
            actions.push(Action::Stop {
                member: id,
                attempt: m.attempt,
            });
        }
    }
    if let Some(t) = s.topology.take() {
        s.last_version = s.last_version.max(t.version);
    }
    if s.phase != JobPhase::Suspended {
        actions.push(event(
            EventKind::Normal,
            Reason::Suspended,
            None,
            format!("the job is suspended: {stopped} members stopped, the status is kept"),
        ));
    }
}

/// A member that waited longer than `scheduling.fallbackToOnDemandAfter` for a spot node is
/// recreated without the spot requirement. Only that attempt: replacements try spot first again.
pub(super) fn fall_back(
    spec: &DecentralizedTrainingJobSpec,
    s: &mut JobState,
    observed: &Observation,
    now: Timestamp,
    actions: &mut Vec<Action>,
) {
    let Some(limit) = &spec.scheduling.fallback_to_on_demand_after else {
        return;
    };
    if spec.scheduling.capacity == Capacity::OnDemand {
        return;
    }
    for (&id, r) in s.members.iter_mut() {
        if r.on_demand || !matches!(r.lifecycle, Lifecycle::Pending { .. }) {
            continue;
        }
        let Some(m) = observed.live(id, r.attempt) else {
            continue;
        };
        // Waiting for a node: not placed, and never heard from.
        let waited = m.node.is_none()
            && m.join.is_none()
            && m.status.is_none()
            && m.pending_since
                .is_some_and(|t| seconds_since(t, now) >= limit.as_std().as_secs_f64());
        if !waited {
            continue;
        }
        // Its end is handled here and counts as nothing; the next attempt is created at once.
        r.become_(Lifecycle::Ended { how: End::FellBack });
        actions.push(Action::Stop {
            member: id,
            attempt: r.attempt,
        });
        actions.push(event(
            EventKind::Normal,
            Reason::FellBackToOnDemand,
            Some((id, r.attempt)),
            format!(
                "member {id} waited over {limit} for a spot node; attempt {} runs without the spot requirement",
                r.attempt + 1
            ),
        ));
    }
}

/// The members whose next attempt is due to be created: those of `0..target` with no live or
/// completed attempt, not given up on, past their backoff.
pub(super) fn creatable<'a>(
    spec: &DecentralizedTrainingJobSpec,
    s: &'a JobState,
    now: Timestamp,
) -> impl Iterator<Item = MemberId> + 'a {
    (0..spec.replicas.target).filter(move |id| {
        s.members.get(id).is_none_or(|r| {
            !(r.lifecycle.is_live() || r.lifecycle.is_completed() || r.given_up)
                && r.not_before.is_none_or(|t| t <= now)
        })
    })
}

/// Create the first attempt of every member, and a new one for each lost member: at most
/// [`CREATES_PER_PLAN`] of them, the lowest ids first.
pub(super) fn create_members(
    spec: &DecentralizedTrainingJobSpec,
    s: &mut JobState,
    now: Timestamp,
    actions: &mut Vec<Action>,
) {
    if s.phase.is_finished() {
        return;
    }
    let due: Vec<MemberId> = creatable(spec, s, now).take(CREATES_PER_PLAN).collect();
    for id in due {
        let record = s.members.entry(id).or_default();
        // A refused attempt never existed: it is tried again as it was.
        let again = record.lifecycle == (Lifecycle::Ended { how: End::Refused });
        let replacing = record.lifecycle != Lifecycle::New && !again;
        if replacing {
            record.attempt += 1;
        }
        let on_demand = match record.lifecycle {
            Lifecycle::Ended { how: End::FellBack } => true,
            Lifecycle::Ended { how: End::Refused } => record.on_demand,
            _ => false,
        };
        record.become_(Lifecycle::PENDING);
        record.on_demand = on_demand;
        record.not_before = None;
        let attempt = record.attempt;
        actions.push(Action::Create {
            member: id,
            attempt,
            on_demand,
            clique: record.clique.filter(|_| replacing),
            zone: record.zone.clone().filter(|_| replacing),
        });
        if replacing {
            actions.push(event(
                EventKind::Normal,
                Reason::Replaced,
                Some((id, attempt)),
                format!("member {id}: attempt {attempt} created"),
            ));
        }
    }
}

/// `replicas.target` lowered on a running job: the members numbered from it on are stopped (the
/// highest ids go, as a StatefulSet scales down), leave the topology, and count as nothing.
/// Raised again, their ids get new attempts.
pub(super) fn retire_beyond_target(
    spec: &DecentralizedTrainingJobSpec,
    s: &mut JobState,
    observed: &Observation,
    actions: &mut Vec<Action>,
) {
    for (&id, record) in s.members.range_mut(spec.replicas.target..) {
        if !record.lifecycle.is_active() {
            continue;
        }
        let attempt = record.attempt;
        record.become_(Lifecycle::Retiring);
        if observed.live(id, attempt).is_some() {
            actions.push(Action::Stop {
                member: id,
                attempt,
            });
        } else {
            // Nothing runs to stop.
            record.become_(Lifecycle::Ended { how: End::Retired });
        }
        actions.push(event(
            EventKind::Normal,
            Reason::MemberRetired,
            Some((id, attempt)),
            format!(
                "member {id} (attempt {attempt}) is not needed: replicas.target is {}",
                spec.replicas.target
            ),
        ));
    }
}

/// Once the job is finishing the topology is frozen: a member outside it (a replacement that
/// joined too late) would wait forever, so it is stopped.
pub(super) fn retire_outsiders(
    s: &mut JobState,
    observed: &Observation,
    actions: &mut Vec<Action>,
) {
    // Members whose current attempt is over (Some) or still running (None).
    let ended_attempts: BTreeMap<MemberId, Option<u32>> = s
        .members
        .iter()
        .map(|(&id, r)| {
            (
                id,
                observed.live(id, r.attempt).is_none().then_some(r.attempt),
            )
        })
        .collect();
    for (&id, record) in s.members.iter_mut() {
        let Some(m) = observed.live(id, record.attempt) else {
            continue;
        };
        let inside = s.topology.as_ref().is_some_and(|t| t.graph.contains(id));
        // Inside, but it never heard from a peer and every neighbour has finished or gone: no
        // one will send it state or say goodbye, so it would wait forever (seen under chaos: a
        // replacement that joined just before its neighbours completed).
        let never_heard = m.status.as_ref().is_some_and(|st| st.bytes_in == 0);
        let stranded = never_heard
            && s.topology.as_ref().is_some_and(|t| {
                t.graph.degree(id) > 0
                    && t.graph
                        .neighbours(id)
                        .all(|n| ended_attempts.get(&n).copied().flatten().is_some())
            });
        if (inside && !stranded) || !record.lifecycle.is_active() {
            continue;
        }
        record.become_(Lifecycle::Retiring);
        actions.push(Action::Stop {
            member: id,
            attempt: m.attempt,
        });
        actions.push(event(
            EventKind::Normal,
            Reason::MemberRetired,
            Some((id, m.attempt)),
            format!(
                "member {id} (attempt {}) is not needed: the job is finishing",
                m.attempt
            ),
        ));
    }
}
