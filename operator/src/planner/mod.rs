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
//!
//! Where each concern lives:
//! - this file: the state and observation types, [`Action`], and [`plan`] / [`reject`] /
//!   [`next_deadline`], which run the steps below in order;
//! - `ended`: attempts that ended — exits, restart budgets, refused pods ([`creates_answered`]);
//! - `members`: noting, creating, falling back, suspending and retiring members;
//! - `shaping`: building, repairing and relocating the topology;
//! - `conditions`: the job's phase and status conditions ([`live_in_topology`]);
//! - `event`: the events the planner emits.
//!
//! A member's record, lifecycle and exits, and what is observed of it, live in [`crate::member`].

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use murmur_core::api::conditions::{
    ConditionReason, ConditionType, condition_is_true, set_condition,
};
use murmur_core::api::{DecentralizedTrainingJobSpec, JobPhase};
use murmur_core::topology::{MemberId, Topology};
use serde::{Deserialize, Serialize};

use crate::member::{Lifecycle, MemberRecord, ObservedMember};

mod conditions;
mod ended;
mod event;
mod members;
mod shaping;
#[cfg(test)]
mod tests;

pub use conditions::live_in_topology;
pub use ended::{REFUSAL_BACKOFF_MAX_SECONDS, REFUSAL_BACKOFF_SECONDS, creates_answered};
pub use event::{Event, EventKind, Reason};
pub use members::not_starting;

use conditions::{phase, update_conditions};
use ended::settle_ended_members;
use members::{
    create_members, fall_back, note_lifecycle, retire_beyond_target, retire_outsiders, suspend,
};
use shaping::shape_topology;

/// How long to wait for the last join reports before building the topology from those in.
pub const JOIN_GRACE_SECONDS: f64 = 15.0;
/// Preemptions a job remembers one by one (the newest); older ones are counted.
pub const PREEMPTIONS_KEPT: usize = 100;
/// Crash backoff doubles per crash of the same member up to this.
pub const MAX_BACKOFF_SECONDS: f64 = 300.0;
/// Attempts one plan creates at most (a ReplicaSet's burst is 500 too): a 10 000-member job's
/// first plan would otherwise hold every pod in one decision and write them all in one
/// reconcile. The rest wait for the next plans, which [`next_deadline`] asks for at once.
pub const CREATES_PER_PLAN: usize = 500;

/// What a runtime sees of every member, with what their trainers posted.
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

    /// Each of `ids`, which must ascend, with its record and its current attempt as observed
    /// when it is live (what [`Observation::live`] gives for the record's attempt, 0 without a
    /// record). One pass along the three sorted maps: at 10 000 members a lookup per member in
    /// each of a plan's passes was a tenth of it.
    fn current<'o, 'r, I: Iterator<Item = MemberId> + 'r>(
        &'o self,
        ids: I,
        records: &'r BTreeMap<MemberId, MemberRecord>,
    ) -> impl Iterator<Item = Current<'r, 'o>> + use<'r, 'o, I> {
        let mut records = records.iter().peekable();
        let mut observed = self.members.iter().peekable();
        ids.map(move |id| {
            while records.next_if(|(r, _)| **r < id).is_some() {}
            while observed.next_if(|(o, _)| **o < id).is_some() {}
            let record = records.peek().filter(|(r, _)| **r == id).map(|(_, r)| *r);
            let attempt = record.map_or(0, |r| r.attempt);
            let live = observed
                .peek()
                .filter(|(o, m)| **o == id && m.attempt == attempt && m.is_live())
                .map(|(_, m)| *m);
            Current { id, record, live }
        })
    }

    /// [`Observation::current`] for every member with a record.
    fn recorded<'o, 'r>(
        &'o self,
        records: &'r BTreeMap<MemberId, MemberRecord>,
    ) -> impl Iterator<Item = Current<'r, 'o>> + use<'r, 'o> {
        self.current(records.keys().copied(), records)
    }
}

/// A member, its record and its current attempt as observed when live.
struct Current<'r, 'o> {
    id: MemberId,
    record: Option<&'r MemberRecord>,
    live: Option<&'o ObservedMember>,
}

impl Current<'_, '_> {
    fn attempt(&self) -> u32 {
        self.record.map_or(0, |r| r.attempt)
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
    /// Shared by the states of successive plans until a plan changes it: most change nothing,
    /// and at 10 000 members a plan with nothing new took 9.5 ms copying it, 3.8 ms sharing it.
    #[serde(default, with = "shared")]
    pub topology: Option<Arc<Topology>>,
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
    /// requirement; `clique`: the clique it trained in, whose zone it should prefer; `zone`:
    /// that zone, where the topology knows it.
    Create {
        member: MemberId,
        attempt: u32,
        on_demand: bool,
        clique: Option<u32>,
        zone: Option<String>,
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
        action: None,
    })
}

/// Seconds from `start` to `t` (millisecond resolution).
pub fn seconds_since(start: Timestamp, t: Timestamp) -> f64 {
    (t.as_millisecond() - start.as_millisecond()) as f64 / 1000.0
}

fn after(t: Timestamp, secs: f64) -> Timestamp {
    Timestamp::from_millisecond(t.as_millisecond() + (secs * 1000.0) as i64).unwrap_or(t)
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
    // More members to create than the last plan could: the next plan is due now.
    if !spec.suspend && !s.finishing() && members::creatable(spec, s, now).next().is_some() {
        deadlines.push(after(now, 0.001));
    }
    deadlines.into_iter().filter(|&t| t > now).min()
}

/// (De)serializes a shared value as the value itself.
pub(crate) mod shared_value {
    use std::sync::Arc;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<T: Serialize, S: Serializer>(
        value: &Arc<T>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        value.as_ref().serialize(serializer)
    }

    pub fn deserialize<'de, T: Deserialize<'de>, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Arc<T>, D::Error> {
        T::deserialize(deserializer).map(Arc::new)
    }
}

/// (De)serializes a shared value, when there is one, as the value itself.
mod shared {
    use std::sync::Arc;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<T: Serialize, S: Serializer>(
        value: &Option<Arc<T>>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        value.as_deref().serialize(serializer)
    }

    pub fn deserialize<'de, T: Deserialize<'de>, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Arc<T>>, D::Error> {
        Ok(Option::<T>::deserialize(deserializer)?.map(Arc::new))
    }
}
