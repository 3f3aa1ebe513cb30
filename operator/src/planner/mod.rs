//! The planner: one pure function from (job spec, what the control plane remembers, what it
//! observes now, the time) to the next remembered state and the actions to take. Both runtimes
//! call it — `murmur run` with child processes, the operator with pods — and execute its actions;
//! it does no I/O and reads no clock.
//!
//! Members have stable ids `0..replicas.target` (member `i` trains shard `i`); a lost member is
//! replaced under the same id by a new *attempt*. The topology holds the members that have sent
//! their join report: it is built (data-aware, from the reports alone) once every member has
//! joined, or once `min` have and [`JOIN_GRACE_SECONDS`] passed, and then repaired member by
//! member.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use murmur_core::api::conditions::{
    ConditionReason, ConditionType, KubeletReason, condition_is_true, set_condition,
};
use murmur_core::api::{
    AlgorithmKind, Capacity, DecentralizedTrainingJobSpec, FailureAction, JobPhase,
};
use murmur_core::contract::{JoinReport, TrainerStatus};
use murmur_core::topology::{self, BuildSpec, MemberId, MemberProfile, Topology};
use serde::{Deserialize, Serialize};

mod event;
mod lifecycle;
#[cfg(test)]
mod tests;

pub use event::{Event, EventKind, Reason};
pub use lifecycle::{End, Lifecycle, MemberRecord};

/// How long to wait for the last join reports before building the topology from those in.
pub const JOIN_GRACE_SECONDS: f64 = 15.0;
/// Preemptions a job remembers one by one (the newest); older ones are counted.
pub const PREEMPTIONS_KEPT: usize = 100;
/// Crash backoff doubles per crash of the same member up to this.
pub const MAX_BACKOFF_SECONDS: f64 = 300.0;

/// How a member's process or pod ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Exit {
    /// It reached the stopping target.
    Completed,
    /// Spot reclaim, eviction, node loss, or a spot notice it honoured. Never a failure.
    Preempted { reason: String },
    /// It crashed: counted as `recovery.failurePolicy` says (by default against the member's
    /// and the job's restart budgets). `code`: the trainer's exit code, if it exited with one;
    /// `conditions`: its pod's conditions (type, status), where pods run it.
    Failed {
        reason: String,
        code: Option<i32>,
        conditions: Vec<(String, String)>,
    },
}

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

/// What a runtime sees of one member: its newest attempt.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ObservedMember {
    pub attempt: u32,
    /// `host:port` of its peer listener, once known.
    pub address: Option<String>,
    pub join: Option<JoinReport>,
    /// The newest status it reported (posted, or read from its `/status`).
    pub status: Option<TrainerStatus>,
    /// Set once it ended.
    pub exit: Option<Exit>,
    /// The node it runs on, once scheduled (the operator; local processes leave it unset).
    pub node: Option<String>,
    /// That node's zone, when it has one: zone-aware cliques form inside zones.
    pub zone: Option<String>,
    /// Since when it has waited for a node (the operator; local processes never wait).
    pub pending_since: Option<Timestamp>,
    /// Why its container cannot start, while it cannot (pods only).
    pub not_starting: Option<NotStarting>,
    /// The scheduling gates that hold its pod back from scheduling, while they do (a queue's
    /// admission, such as Kueue's). A gated member waits for admission, not for a node.
    pub gated_by: Option<String>,
}

impl ObservedMember {
    pub fn is_live(&self) -> bool {
        self.exit.is_none()
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observation {
    pub members: BTreeMap<MemberId, ObservedMember>,
}

impl Observation {
    fn live(&self, id: MemberId, attempt: u32) -> Option<&ObservedMember> {
        self.members
            .get(&id)
            .filter(|m| m.attempt == attempt && m.is_live())
    }
}

/// One member lost to preemption.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Preemption {
    pub member: MemberId,
    pub attempt: u32,
    pub at: Timestamp,
    pub reason: String,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// What the control plane remembers between two plans (the operator keeps it in the job's
/// topology ConfigMap, so a restarted operator carries on where it stopped).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobState {
    pub phase: JobPhase,
    /// Why the job ended, or what it waits for.
    pub message: Option<String>,
    pub created_at: Timestamp,
    pub completed_at: Option<Timestamp>,
    pub topology: Option<Topology>,
    /// The newest topology version ever published: versions only grow, even across a rebuild.
    pub last_version: u64,
    pub members: BTreeMap<MemberId, MemberRecord>,
    /// The newest preemptions, at most [`PREEMPTIONS_KEPT`]: the job's memory (a ConfigMap)
    /// stays bounded however long a spot job runs.
    pub preemptions: Vec<Preemption>,
    /// Preemptions older than those kept, counted only.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub preemptions_dropped: u32,
    pub restarts: u32,
    /// Members moved to their clique's zone (zone-aware cliques).
    #[serde(default)]
    pub relocations: u32,
    pub conditions: Vec<Condition>,
}

impl JobState {
    pub fn new(now: Timestamp) -> Self {
        Self {
            phase: JobPhase::Pending,
            message: None,
            created_at: now,
            completed_at: None,
            topology: None,
            last_version: 0,
            members: BTreeMap::new(),
            preemptions: Vec::new(),
            preemptions_dropped: 0,
            restarts: 0,
            relocations: 0,
            conditions: Vec::new(),
        }
    }

    /// Every preemption the job survived, kept or not.
    pub fn preemption_count(&self) -> u32 {
        self.preemptions_dropped
            .saturating_add(u32::try_from(self.preemptions.len()).unwrap_or(u32::MAX))
    }

    /// Remember a preemption, dropping the oldest kept past [`PREEMPTIONS_KEPT`].
    pub fn record_preemption(&mut self, p: Preemption) {
        self.preemptions.push(p);
        let over = self.preemptions.len().saturating_sub(PREEMPTIONS_KEPT);
        if over > 0 {
            self.preemptions.drain(..over);
            self.preemptions_dropped = self.preemptions_dropped.saturating_add(over as u32);
        }
    }

    /// Whether any member reached the stopping target: from then on lost members are not
    /// replaced and the job ends when the last one exits.
    pub fn finishing(&self) -> bool {
        self.members.values().any(|r| r.lifecycle.is_completed())
    }
}

/// What a runtime must do.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Start `attempt` of member `member` (a process, a pod); `on_demand`: without the spot
    /// requirement; `clique`: the clique it trained in, whose zone it should prefer.
    Create {
        member: MemberId,
        attempt: u32,
        on_demand: bool,
        clique: Option<u32>,
    },
    /// Stop a live member (the job failed or is suspended, or it is not needed any more).
    Stop { member: MemberId, attempt: u32 },
    /// Record an event (Kubernetes Event, status API, terminal).
    Event(Event),
}

/// An event; `member`: the member id and the attempt it is about.
fn event(
    kind: EventKind,
    reason: Reason,
    member: Option<(MemberId, u32)>,
    message: String,
) -> Action {
    Action::Event(Event {
        kind,
        reason,
        member: member.map(|(id, _)| id),
        attempt: member.map(|(_, attempt)| attempt),
        message,
    })
}

/// Seconds from `start` to `t` (millisecond resolution).
pub fn seconds_since(start: Timestamp, t: Timestamp) -> f64 {
    (t.as_millisecond() - start.as_millisecond()) as f64 / 1000.0
}

fn after(t: Timestamp, secs: f64) -> Timestamp {
    Timestamp::from_millisecond(t.as_millisecond() + (secs * 1000.0) as i64).unwrap_or(t)
}

/// The graph a job asks for over `members`: a Moshpit grid for Moshpit averaging, else the
/// topology spec's family.
pub fn build_topology(
    spec: &DecentralizedTrainingJobSpec,
    members: &[MemberProfile],
) -> Result<Topology, topology::TopologyError> {
    match spec.algorithm.kind {
        AlgorithmKind::Moshpit => topology::moshpit(members, spec.algorithm.group_size()),
        _ => topology::build(
            &BuildSpec {
                zone_aware: spec.scheduling.zone_aware(),
                ..BuildSpec::from_spec(&spec.topology, spec.training.seed)
            },
            members,
        ),
    }
}

/// What the control plane knows of a member: its join report's summaries, and the zone of its
/// node.
pub fn profile(report: &JoinReport, zone: Option<String>) -> MemberProfile {
    MemberProfile {
        id: report.member_id,
        histogram: Some(report.label_histogram.iter().map(|&c| c as f64).collect()),
        proxy: report
            .proxy_vector
            .as_ref()
            .map(|v| v.iter().map(|&x| x as f64).collect()),
        zone,
    }
}

/// The next state and the actions that take the job there.
pub fn plan(
    spec: &DecentralizedTrainingJobSpec,
    state: &JobState,
    observed: &Observation,
    now: Timestamp,
) -> (JobState, Vec<Action>) {
    let mut s = state.clone();
    let mut actions = Vec::new();
    if s.phase.is_finished() {
        return (s, actions);
    }
    if s.conditions.is_empty() {
        set_condition(
            &mut s.conditions,
            ConditionType::Created,
            true,
            ConditionReason::Planned,
            &format!("{} members planned", spec.replicas.target),
            None,
            Time(now),
        );
    }
    if condition_is_true(&s.conditions, ConditionType::InvalidSpec) {
        set_condition(
            &mut s.conditions,
            ConditionType::InvalidSpec,
            false,
            ConditionReason::SpecValid,
            "the spec passes every validation rule",
            None,
            Time(now),
        );
        s.message = None;
    }
    settle_ended_members(spec, &mut s, observed, now, &mut actions);
    note_lifecycle(spec, &mut s, observed, now, &mut actions);
    if !s.phase.is_finished() {
        // Honoured in every phase. A job suspended once a member reached the stopping target
        // stops the rest; resumed, it has reached its target and ends (the ones stopped are
        // not restarted, as no lost member is once the job is finishing).
        let suspended = spec.suspend;
        if suspended {
            suspend(&mut s, observed, &mut actions);
        } else if s.finishing() {
            retire_outsiders(&mut s, observed, &mut actions);
        } else {
            if s.phase == JobPhase::Suspended {
                actions.push(event(
                    EventKind::Normal,
                    Reason::Resumed,
                    None,
                    "the job resumes: members restart from their peers or the checkpoint".into(),
                ));
            }
            fall_back(spec, &mut s, observed, now, &mut actions);
            retire_beyond_target(spec, &mut s, observed, &mut actions);
            shape_topology(spec, &mut s, observed, now, &mut actions);
            create_members(spec, &mut s, now, &mut actions);
        }
        s.phase = if suspended {
            JobPhase::Suspended
        } else {
            phase(spec, &s, observed)
        };
        if s.phase == JobPhase::Succeeded {
            s.completed_at = Some(now);
            s.message = Some("every member reached the stopping target or left".into());
            actions.push(event(
                EventKind::Normal,
                Reason::Succeeded,
                None,
                "the job reached its stopping target".into(),
            ));
        }
    }
    update_conditions(spec, &mut s, observed, now);
    (s, actions)
}

/// A spec that fails validation: no members are planned, and the `InvalidSpec` condition (and
/// one event, when it flips or its message changes) say what is wrong.
pub fn reject(state: &JobState, problems: &str, now: Timestamp) -> (JobState, Vec<Action>) {
    let mut s = state.clone();
    let mut actions = Vec::new();
    let changed = set_condition(
        &mut s.conditions,
        ConditionType::InvalidSpec,
        true,
        ConditionReason::InvalidSpec,
        problems,
        None,
        Time(now),
    );
    if changed {
        s.message = Some(format!("invalid spec: {problems}"));
        actions.push(event(
            EventKind::Warning,
            Reason::InvalidSpec,
            None,
            format!("no members are created until the spec is fixed: {problems}"),
        ));
    }
    (s, actions)
}

/// A refused pod's next try waits this long, doubling with each refusal in a row.
pub const REFUSAL_BACKOFF_SECONDS: f64 = 5.0;
/// ... up to this.
pub const REFUSAL_BACKOFF_MAX_SECONDS: f64 = 300.0;

/// The API server's answers to the pods one plan created. `refused` (member, attempt, its
/// message) never existed: each ends `Refused` and is tried again after a backoff, while the
/// members that were admitted run (the job is `Degraded` until every member is). The
/// `PodsRejected` condition names the refusal, with an event when its message is new; once a
/// plan's pods are all admitted it clears.
pub fn creates_answered(
    state: &JobState,
    accepted: &[(MemberId, u32)],
    refused: &[(MemberId, u32, String)],
    now: Timestamp,
) -> (JobState, Vec<Action>) {
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
    (s, actions)
}

/// The earliest moment after `now` at which planning again could change something without any
/// news (a backoff ends, the join grace ends, a pending member's timeout): runtimes wake then.
pub fn next_deadline(
    spec: &DecentralizedTrainingJobSpec,
    s: &JobState,
    observed: &Observation,
    now: Timestamp,
) -> Option<Timestamp> {
    if s.phase.is_finished() {
        return None;
    }
    let mut deadlines = Vec::new();
    for (&id, r) in &s.members {
        if let Some(t) = r.not_before {
            deadlines.push(t);
        }
        let Some(since) = observed
            .live(id, r.attempt)
            .filter(|m| m.node.is_none())
            .and_then(|m| m.pending_since)
        else {
            continue;
        };
        if r.lifecycle == Lifecycle::PENDING {
            deadlines.push(after(
                since,
                spec.recovery.pending_timeout.as_std().as_secs_f64(),
            ));
        }
        if let Some(fallback) = &spec.scheduling.fallback_to_on_demand_after
            && !r.on_demand
        {
            deadlines.push(after(since, fallback.as_std().as_secs_f64()));
        }
    }
    if s.topology.is_none() {
        deadlines.push(after(s.created_at, JOIN_GRACE_SECONDS));
    }
    deadlines.into_iter().filter(|&t| t > now).min()
}

/// Handle every attempt that ended since the last plan.
fn settle_ended_members(
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
        match exit {
            Exit::Completed => {
                record.become_(Lifecycle::Ended {
                    how: End::Completed,
                });
                actions.push(event(
                    EventKind::Normal,
                    Reason::MemberCompleted,
                    Some((id, m.attempt)),
                    format!("member {id} reached the stopping target"),
                ));
            }
            Exit::Preempted { reason } => {
                record.become_(Lifecycle::Ended {
                    how: End::Preempted,
                });
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
                record.become_(Lifecycle::Ended { how: End::Failed });
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

/// Lifecycle events of the current attempts: placed on a node, joined, waiting too long, kept
/// from starting.
fn note_lifecycle(
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
                actions.push(event(
                    EventKind::Warning,
                    Reason::MemberNotStarting,
                    Some((id, r.attempt)),
                    format!("member {id} (attempt {}) cannot start: {p}", r.attempt),
                ));
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

/// `suspend: true`: stop every member, keep the status and the members' records. The topology
/// goes with the members; resuming rebuilds it (with a newer version) from the new join reports.
fn suspend(s: &mut JobState, observed: &Observation, actions: &mut Vec<Action>) {
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
fn fall_back(
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

/// Build the topology once enough members joined; afterwards repair it member by member.
fn shape_topology(
    spec: &DecentralizedTrainingJobSpec,
    s: &mut JobState,
    observed: &Observation,
    now: Timestamp,
    actions: &mut Vec<Action>,
) {
    // Members with a live current attempt that has sent its join report.
    let joined: Vec<&JoinReport> = s
        .members
        .iter()
        .filter_map(|(&id, r)| observed.live(id, r.attempt))
        .filter_map(|m| m.join.as_ref())
        .collect();
    let zone = |id: MemberId| observed.members.get(&id).and_then(|m| m.zone.clone());
    let before = s.topology.as_ref().map(|t| t.version);
    match &mut s.topology {
        None => {
            let everyone = joined.len() >= spec.replicas.target as usize;
            let enough = joined.len() >= spec.replicas.min as usize
                && seconds_since(s.created_at, now) >= JOIN_GRACE_SECONDS;
            if !(everyone || enough) {
                return;
            }
            let profiles: Vec<MemberProfile> = joined
                .iter()
                .map(|j| profile(j, zone(j.member_id)))
                .collect();
            match build_topology(spec, &profiles) {
                Ok(mut t) => {
                    t.version = s.last_version + 1;
                    relocate(&mut t, &mut s.members, &mut s.relocations, actions);
                    s.topology = Some(t);
                }
                Err(e) => {
                    s.phase = JobPhase::Failed;
                    s.completed_at = Some(now);
                    s.message = Some(format!("cannot build the topology: {e}"));
                    actions.push(event(
                        EventKind::Warning,
                        Reason::Failed,
                        None,
                        s.message.clone().unwrap_or_default(),
                    ));
                    return;
                }
            }
        }
        Some(t) => {
            let gone: Vec<(MemberId, u32)> = t
                .graph
                .members()
                .filter_map(|id| {
                    let record = s.members.get(&id);
                    let attempt = record.map_or(0, |r| r.attempt);
                    let gone = observed.live(id, attempt).is_none()
                        || record.is_some_and(|r| r.lifecycle.is_retired());
                    gone.then_some((id, attempt))
                })
                .collect();
            for (id, attempt) in gone {
                if t.graph.member_count() == 1 {
                    // The last one: nothing to repair. Rebuilt when members rejoin.
                    s.last_version = t.version;
                    s.topology = None;
                    actions.push(event(
                        EventKind::Warning,
                        Reason::AllMembersLost,
                        None,
                        "every member is gone; the job resumes from checkpoints".into(),
                    ));
                    return;
                }
                if let Some(record) = s.members.get_mut(&id) {
                    record.clique = t.clique_of(id);
                }
                t.remove_member(id).expect("listed from the graph");
                actions.push(event(
                    EventKind::Normal,
                    Reason::Left,
                    Some((id, attempt)),
                    format!("member {id} left the topology; its neighbours were rewired"),
                ));
            }
            for report in joined {
                if !t.graph.contains(report.member_id) {
                    // A profile of the right length was checked when the report came in.
                    let _ = t.add_member(profile(report, zone(report.member_id)));
                }
            }
        }
    }
    if let Some(t) = &s.topology
        && before != Some(t.version)
    {
        s.last_version = t.version;
        actions.push(event(
            EventKind::Normal,
            Reason::TopologyChanged,
            None,
            format!(
                "topology version {}: {} members, {} edges",
                t.version,
                t.graph.member_count(),
                t.graph.edge_count()
            ),
        ));
    }
}

/// Zone-aware cliques cross zones where one zone's members cannot balance the labels. Before
/// anyone trains, the members outside their clique's zone leave the topology and stop; their next
/// attempt asks for the clique's zone and, once joined, refills the clique. Once per member.
fn relocate(
    t: &mut Topology,
    members: &mut BTreeMap<MemberId, MemberRecord>,
    relocations: &mut u32,
    actions: &mut Vec<Action>,
) {
    for m in topology::zones::misplaced(t) {
        let Some(record) = members.get_mut(&m.member) else {
            continue;
        };
        if record.relocated || !record.lifecycle.is_active() || t.graph.member_count() <= 1 {
            continue;
        }
        let from = t.profiles[&m.member].zone.clone().unwrap_or_default();
        t.remove_member(m.member).expect("listed from the topology");
        record.become_(Lifecycle::Retiring);
        record.relocated = true;
        record.clique = Some(m.clique);
        *relocations += 1;
        actions.push(Action::Stop {
            member: m.member,
            attempt: record.attempt,
        });
        actions.push(event(
            EventKind::Normal,
            Reason::Relocated,
            Some((m.member, record.attempt)),
            format!(
                "member {} moves from {from} to {}, where clique {} trains",
                m.member, m.zone, m.clique
            ),
        ));
    }
}

/// Create the first attempt of every member, and a new one for each lost member.
fn create_members(
    spec: &DecentralizedTrainingJobSpec,
    s: &mut JobState,
    now: Timestamp,
    actions: &mut Vec<Action>,
) {
    if s.phase.is_finished() {
        return;
    }
    for id in 0..spec.replicas.target {
        let record = s.members.entry(id).or_default();
        if record.lifecycle.is_live() || record.lifecycle.is_completed() || record.given_up {
            continue;
        }
        if record.not_before.is_some_and(|t| t > now) {
            continue;
        }
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
fn retire_beyond_target(
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
fn retire_outsiders(s: &mut JobState, observed: &Observation, actions: &mut Vec<Action>) {
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

/// Members live in the topology.
pub fn live_in_topology(s: &JobState, observed: &Observation) -> usize {
    let Some(t) = &s.topology else { return 0 };
    t.graph
        .members()
        .filter(|id| {
            let attempt = s.members.get(id).map_or(0, |r| r.attempt);
            observed.live(*id, attempt).is_some()
        })
        .count()
}

fn phase(spec: &DecentralizedTrainingJobSpec, s: &JobState, observed: &Observation) -> JobPhase {
    if s.phase.is_finished() {
        return s.phase;
    }
    let any_live = s
        .members
        .iter()
        .any(|(&id, r)| observed.live(id, r.attempt).is_some());
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

fn update_conditions(
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
    // Members whose containers cannot start: the first by id in the kubelet's words, and how
    // many more.
    let stuck: Vec<(MemberId, u32, &NotStarting)> = s
        .members
        .iter()
        .filter_map(|(&id, r)| {
            let m = observed.live(id, r.attempt)?;
            Some((id, r.attempt, m.not_starting.as_ref()?))
        })
        .collect();
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
    // Members held back by scheduling gates: the job waits in a queue for admission.
    let gated: Vec<&str> = s
        .members
        .iter()
        .filter_map(|(&id, r)| observed.live(id, r.attempt)?.gated_by.as_deref())
        .collect();
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
