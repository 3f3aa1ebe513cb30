//! What the status API serves, and the pure function that derives it from the planner's state
//! and the runtime's observation. Both runtimes publish these views; the router only serves them.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use murmur_core::api::{
    AlgorithmKind, Capacity, DecentralizedTrainingJobSpec, DecentralizedTrainingJobStatus,
    JobPhase, MemberCapacity, MemberPhase, MemberStatus, NamedMetric, Progress, Replicas,
    STATUS_MEMBERS_MAX, TopologyKind,
};
use murmur_core::topology::MemberId;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::member::{self, Health, ObservedMember};
use crate::planner::{Event, JobState, Observation, live_in_topology, seconds_since};

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MemberView {
    pub id: u32,
    pub attempt: u32,
    pub phase: MemberPhase,
    pub health: Health,
    pub in_topology: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Step, loss, accuracy, consensus distance (flattened), as the member last reported.
    #[serde(flatten)]
    pub progress: Progress,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clique: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clump: Option<u32>,
    pub neighbours_seen: Vec<u32>,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub rejected_frames: u64,
    /// Its node's zone (the dashboard colours members by it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// Model bytes it sent to members in other zones, when every zone involved is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cross_zone_bytes: Option<u64>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PreemptionView {
    pub member: u32,
    pub attempt: u32,
    pub time: Time,
    /// Seconds since the job was created.
    pub at_seconds: f64,
    pub reason: String,
}

/// `GET /api/v1/namespaces/{ns}/jobs/{name}`.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct JobView {
    pub namespace: String,
    pub name: String,
    pub topology_kind: TopologyKind,
    pub algorithm: AlgorithmKind,
    pub replicas: Replicas,
    /// Local steps each member trains, when the job stops on steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_steps: Option<u64>,
    /// What the job's status subresource holds.
    pub status: DecentralizedTrainingJobStatus,
    pub members: Vec<MemberView>,
    pub preemption_history: Vec<PreemptionView>,
    /// Why the job ended, or what it waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub elapsed_seconds: f64,
    /// The per-GB prices `status.traffic.costUsd` is counted at.
    pub prices: murmur_core::api::traffic::Prices,
}

/// `GET /api/v1/jobs`: one line per job.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct JobSummary {
    pub namespace: String,
    pub name: String,
    pub phase: JobPhase,
    pub members: String,
    pub step: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<f64>,
    /// The job's figure when its task is judged by another metric than accuracy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<NamedMetric>,
    pub preemptions: u32,
    pub topology_version: u64,
}

impl JobView {
    pub fn summary(&self) -> JobSummary {
        JobSummary {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            phase: self.status.phase.unwrap_or_default(),
            members: self.status.member_summary.clone().unwrap_or_default(),
            step: self.status.progress.as_ref().map_or(0, |p| p.step),
            accuracy: self.status.progress.as_ref().and_then(|p| p.accuracy),
            metric: self.status.progress.as_ref().and_then(|p| p.metric.clone()),
            preemptions: self.status.preemptions,
            topology_version: self.status.topology_version,
        }
    }
}

/// One sample of one member's progress (the dashboard's curves, the metrics CSV).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SeriesPoint {
    /// Seconds since the job was created.
    pub t: f64,
    pub member: u32,
    pub attempt: u32,
    /// Step, loss, accuracy, consensus distance (flattened).
    #[serde(flatten)]
    pub progress: Progress,
}

/// A job's [`Event`] as the status API keeps it: with when it happened.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct JobEvent {
    /// When it happened, to the microsecond (as a Kubernetes Event's `eventTime`).
    pub time: MicroTime,
    /// Seconds since the job was created.
    pub at_seconds: f64,
    #[serde(flatten)]
    pub event: Event,
}

impl JobEvent {
    /// An event of a job created at `created`, happening `now`.
    pub fn new(event: Event, created: Timestamp, now: Timestamp) -> Self {
        Self {
            time: MicroTime(now),
            at_seconds: seconds_since(created, now),
            event,
        }
    }
}

/// The job's conditions as the status holds them (whole seconds).
pub fn status_conditions(
    state: &JobState,
) -> Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    state
        .conditions
        .iter()
        .cloned()
        .map(|mut c| {
            c.last_transition_time = Time(whole_seconds(c.last_transition_time.0));
            c
        })
        .collect()
}

/// `t` without its fraction of a second, as the API server stores times.
pub fn whole_seconds(t: Timestamp) -> Timestamp {
    Timestamp::from_second(t.as_second()).unwrap_or(t)
}

fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    (n > 0).then(|| sum / n as f64)
}

/// The members `status.members` lists: all of them up to [`STATUS_MEMBERS_MAX`]; past it,
/// those that need a person's attention first (pending, joining, lost, failed, paused,
/// leaving), then the rest by id — in id order, with the count left out. `of`: a member's id
/// and phase (the status lists views of members, made into entries once chosen).
pub fn listed_members<T>(
    mut members: Vec<T>,
    of: impl Fn(&T) -> (MemberId, MemberPhase),
) -> (Vec<T>, u32) {
    if members.len() <= STATUS_MEMBERS_MAX {
        return (members, 0);
    }
    let routine = |phase| {
        matches!(
            phase,
            MemberPhase::Training | MemberPhase::Done | MemberPhase::Retired
        )
    };
    members.sort_by_key(|m| {
        let (id, phase) = of(m);
        (routine(phase), id)
    });
    let omitted = members.split_off(STATUS_MEMBERS_MAX);
    members.sort_by_key(|m| of(m).0);
    (members, omitted.len() as u32)
}

/// What `member` sent to members whose node is in another zone than its own. The peers' zones
/// are those of their current attempts: a peer replaced across zones counts where it is now.
pub(crate) fn cross_zone_bytes(member: &ObservedMember, observed: &Observation) -> Option<u64> {
    let own = member.zone.as_deref()?;
    let status = member.status.as_ref()?;
    Some(
        status
            .bytes_sent_to
            .iter()
            .filter(|(peer, _)| {
                observed
                    .members
                    .get(*peer)
                    .and_then(|p| p.zone.as_deref())
                    .is_some_and(|zone| zone != own)
            })
            .map(|(_, bytes)| bytes)
            .sum(),
    )
}

/// The job as the status API shows it.
pub fn job_view(
    namespace: &str,
    name: &str,
    spec: &DecentralizedTrainingJobSpec,
    state: &JobState,
    observed: &Observation,
    now: Timestamp,
) -> JobView {
    let topology = state.topology.as_ref();
    let mut members = Vec::new();
    for (&id, record) in &state.members {
        let Some(m) = observed
            .members
            .get(&id)
            .filter(|m| m.attempt == record.attempt)
        else {
            continue;
        };
        let status = m.status.as_ref();
        let in_topology = topology.is_some_and(|t| t.graph.contains(id));
        let alone = topology.is_some_and(|t| t.graph.degree(id) == 0);
        let (phase, health) = member::seen(record.lifecycle, m, in_topology, alone);
        members.push(MemberView {
            id,
            attempt: m.attempt,
            phase,
            health,
            in_topology,
            address: m.address.clone(),
            progress: status.map(|s| s.progress.clone()).unwrap_or_default(),
            clique: topology.and_then(|t| t.clique_of(id)),
            clump: topology.and_then(|t| t.clump_of(id)),
            neighbours_seen: status
                .map(|s| s.neighbours_seen.clone())
                .unwrap_or_default(),
            bytes_in: status.map_or(0, |s| s.bytes_in),
            bytes_out: status.map_or(0, |s| s.bytes_out),
            rejected_frames: status.map_or(0, |s| s.rejected_frames),
            zone: m.zone.clone(),
            cross_zone_bytes: cross_zone_bytes(m, observed),
        });
    }
    // Progress over the members still counting: live or finished.
    let counting: Vec<&MemberView> = members
        .iter()
        .filter(|m| m.health != Health::Down)
        .collect();
    let mut progress = Progress {
        step: counting.iter().map(|m| m.progress.step).max().unwrap_or(0),
        loss: mean(counting.iter().filter_map(|m| m.progress.loss)),
        consensus_distance: mean(
            counting
                .iter()
                .filter_map(|m| m.progress.consensus_distance),
        ),
        ..Progress::default()
    };
    if let Some(quality) = Progress::mean_quality(counting.iter().map(|m| &m.progress)) {
        progress.set_quality(quality);
    }
    let live = live_in_topology(state, observed);
    // The API server keeps whole seconds: a status carrying fractions would differ from what it
    // stored on every read, and be written again on every reconcile.
    let conditions = status_conditions(state);
    // Only the members the status lists are made into its entries.
    let (listed, members_omitted) = listed_members(members.iter().collect(), |m| (m.id, m.phase));
    let listed: Vec<MemberStatus> = listed
        .into_iter()
        .map(|m| {
            let on_demand = state.members.get(&m.id).is_some_and(|r| r.on_demand);
            let observed = observed.members.get(&m.id);
            MemberStatus {
                id: m.id,
                pod: None,
                node: observed.and_then(|o| o.node.clone()),
                capacity: Some(
                    if on_demand || spec.scheduling.capacity == Capacity::OnDemand {
                        MemberCapacity::OnDemand
                    } else {
                        MemberCapacity::Spot
                    },
                ),
                phase: m.phase,
                step: m.progress.step,
                joined_at: None,
                // Why it cannot start comes first: that is what blocks it now.
                message: observed
                    .and_then(|o| o.not_starting.as_ref())
                    .map(|p| format!("cannot start: {p}"))
                    .or_else(|| {
                        on_demand.then(|| {
                            "fell back to on-demand: no spot node within scheduling.fallbackToOnDemandAfter"
                                .to_string()
                        })
                    }),
                zone: m.zone.clone(),
                cross_zone_bytes: m.cross_zone_bytes,
            }
        })
        .collect();
    let status = DecentralizedTrainingJobStatus {
        phase: Some(state.phase),
        conditions,
        members: listed,
        members_omitted,
        member_summary: Some(format!("{live}/{}", spec.replicas.target)),
        topology_version: state.last_version,
        preemptions: state.preemption_count(),
        restarts: state.restarts,
        relocations: state.relocations,
        progress: Some(progress),
        // The driver, which counts the traffic, sets it.
        traffic: None,
        start_time: Some(Time(whole_seconds(state.created_at))),
        completion_time: state.completed_at.map(|t| Time(whole_seconds(t))),
        observed_generation: None,
        // The runtime that runs images says which (processes run none).
        trainer_image: None,
    };
    JobView {
        namespace: namespace.to_string(),
        name: name.to_string(),
        topology_kind: spec.topology.kind,
        algorithm: spec.algorithm.kind,
        replicas: spec.replicas.clone(),
        target_steps: spec.training.steps,
        status,
        members,
        preemption_history: state
            .preemptions
            .iter()
            .map(|p| PreemptionView {
                member: p.member,
                attempt: p.attempt,
                time: Time(p.at),
                at_seconds: seconds_since(state.created_at, p.at),
                reason: p.reason.clone(),
            })
            .collect(),
        message: state.message.clone(),
        elapsed_seconds: seconds_since(
            state.created_at,
            state.completed_at.unwrap_or(now).min(now),
        ),
        // The driver, which counts the traffic, sets its prices.
        prices: Default::default(),
    }
}
