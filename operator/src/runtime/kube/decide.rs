//! One reconcile, decided without I/O: from the job, what the caches hold of its objects, and
//! what the operator remembers, to the writes that bring the cluster to the plan. The caller
//! (`reconcile`) only gathers the inputs and performs the writes.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use murmur_core::api::{DecentralizedTrainingJob, DecentralizedTrainingJobStatus, validate};
use murmur_core::contract::{JoinReport, TopologyDocument, TrainerStatus};
use murmur_core::topology::MemberId;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

use super::observe::{self, NodeState};
use super::resources::{self, JOINS_KEY, STATE_KEY, Settings, TOPOLOGY_KEY};
use crate::planner::{self, Action, EventKind, Exit, JobState, Observation, ObservedMember};
use crate::status::view::{self, JobView};

/// A join report and the attempt that sent it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoredJoin {
    pub attempt: u32,
    pub report: JoinReport,
}

/// What the operator keeps in the topology ConfigMap: enough for a restarted operator to carry
/// on with the same members, attempts, counters and data-aware topology.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Persisted {
    pub state: JobState,
    pub joins: BTreeMap<MemberId, StoredJoin>,
}

#[derive(Debug, thiserror::Error)]
#[error("ConfigMap {config_map} key {key}: {message}")]
pub struct PersistError {
    pub config_map: String,
    pub key: &'static str,
    pub message: String,
}

impl Persisted {
    /// A job's memory: from its ConfigMap when there is one, else fresh — seeded from any pods
    /// that exist, so a new attempt never reuses the name of a pod still around.
    pub fn load(
        job: &DecentralizedTrainingJob,
        config_map: Option<&ConfigMap>,
        pods: &[&Pod],
    ) -> Result<Self, PersistError> {
        if let Some(cm) = config_map {
            let data = cm.data.clone().unwrap_or_default();
            let name = cm.metadata.name.clone().unwrap_or_default();
            let field = |key: &'static str| {
                data.get(key).ok_or_else(|| PersistError {
                    config_map: name.clone(),
                    key,
                    message: "missing".into(),
                })
            };
            let parse = |key: &'static str, text: &str| PersistError {
                config_map: name.clone(),
                key,
                message: format!("not what the operator wrote: {text}"),
            };
            let state = serde_json::from_str(field(STATE_KEY)?)
                .map_err(|e| parse(STATE_KEY, &e.to_string()))?;
            let joins = serde_json::from_str(field(JOINS_KEY)?)
                .map_err(|e| parse(JOINS_KEY, &e.to_string()))?;
            return Ok(Self { state, joins });
        }
        let created = job
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or_else(Timestamp::now, |t| t.0);
        let mut state = JobState::new(created);
        for pod in pods {
            if let Some((member, attempt)) = observe::member_of(pod) {
                let record = state.members.entry(member).or_default();
                if !record.created || attempt >= record.attempt {
                    record.attempt = attempt;
                    record.created = true;
                }
            }
        }
        Ok(Self {
            state,
            joins: BTreeMap::new(),
        })
    }

    fn data(&self, document: Option<&TopologyDocument>) -> BTreeMap<String, String> {
        let mut data = BTreeMap::from([
            (
                STATE_KEY.to_string(),
                serde_json::to_string(&self.state).expect("state serializes"),
            ),
            (
                JOINS_KEY.to_string(),
                serde_json::to_string(&self.joins).expect("joins serialize"),
            ),
        ]);
        if let Some(doc) = document {
            data.insert(
                TOPOLOGY_KEY.to_string(),
                serde_json::to_string(doc).expect("a document serializes"),
            );
        }
        data
    }
}

/// Why a job's spec is invalid (every broken rule, with its field), or None when it is valid.
/// Validation evaluates the CRD's CEL rules: callers cache it per generation.
pub fn problems(job: &DecentralizedTrainingJob) -> Option<String> {
    validate(job).err().map(|violations| {
        violations
            .iter()
            .map(|v| format!("{}: {}", v.field.trim_start_matches('.'), v.message))
            .collect::<Vec<_>>()
            .join("; ")
    })
}

/// Everything one reconcile looks at.
pub struct Inputs<'a> {
    pub job: &'a DecentralizedTrainingJob,
    /// [`problems`] of this job's spec.
    pub problems: Option<&'a str>,
    pub pods: &'a [&'a Pod],
    pub node: &'a dyn Fn(&str) -> NodeState,
    pub service: Option<&'a Service>,
    pub secret: Option<&'a Secret>,
    pub config_map: Option<&'a ConfigMap>,
    pub network_policy: Option<&'a NetworkPolicy>,
    pub memory: &'a Persisted,
    /// The newest status each member's current attempt posted.
    pub statuses: &'a BTreeMap<MemberId, (u32, TrainerStatus)>,
    /// Pods this operator created and when (the cache may not show them yet).
    pub created: &'a BTreeMap<(MemberId, u32), Timestamp>,
    /// The job's key, for a Secret that does not exist yet.
    pub key_hex: &'a str,
    pub settings: &'a Settings,
    pub now: Timestamp,
}

/// An event to record, on the job and (for a member) naming its pod.
#[derive(Clone, Debug, PartialEq)]
pub struct Note {
    pub kind: EventKind,
    pub reason: &'static str,
    pub member: Option<MemberId>,
    pub pod: Option<String>,
    pub message: String,
}

/// The writes one reconcile makes. Nothing here means nothing to write.
#[derive(Debug, Default)]
pub struct Decision {
    pub memory: Option<Persisted>,
    pub observed: Observation,
    pub create: Vec<Pod>,
    /// Pod names, and whether to delete at once (its node is gone: no kubelet will finish a
    /// graceful deletion).
    pub delete: Vec<(String, bool)>,
    /// Pods whose `murmur.dev/clique` label is behind the topology (None: remove it).
    pub relabel: Vec<(String, Option<u32>)>,
    pub service: Option<Service>,
    pub secret: Option<Secret>,
    pub config_map: Option<ConfigMap>,
    pub network_policy: Option<NetworkPolicy>,
    pub status: Option<DecentralizedTrainingJobStatus>,
    pub events: Vec<Note>,
    pub document: Option<TopologyDocument>,
    pub view: Option<JobView>,
    /// Delete the job itself (`ttlSecondsAfterFinished` passed).
    pub delete_job: bool,
    pub requeue: Duration,
}

impl Decision {
    /// Writes to the API server this decision makes (events included).
    pub fn writes(&self) -> usize {
        self.create.len()
            + self.delete.len()
            + self.relabel.len()
            + usize::from(self.service.is_some())
            + usize::from(self.secret.is_some())
            + usize::from(self.config_map.is_some())
            + usize::from(self.network_policy.is_some())
            + usize::from(self.status.is_some())
            + self.events.len()
            + usize::from(self.delete_job)
    }
}

pub fn decide(i: &Inputs) -> Decision {
    let job = i.job;
    let name = resources::name(job);
    let mut d = Decision {
        requeue: i.settings.resync,
        ..Default::default()
    };
    if let Some(problems) = i.problems {
        let (state, actions) = planner::reject(&i.memory.state, problems, i.now);
        collect_events(&mut d, &actions, &name, &state);
        let view = view::job_view(
            &resources::namespace(job),
            &name,
            &job.spec,
            &state,
            &Observation::default(),
            i.now,
        );
        let mut status = view.status.clone();
        status.observed_generation = job.metadata.generation;
        if job.status.as_ref() != Some(&status) {
            d.status = Some(status);
        }
        if state != i.memory.state {
            d.memory = Some(Persisted {
                state,
                joins: i.memory.joins.clone(),
            });
        }
        d.view = Some(view);
        return d;
    }

    // Children that must exist before any member starts.
    let service = resources::service(job);
    if i.service.is_none_or(|s| !same_service(s, &service)) {
        d.service = Some(service);
    }
    let has_key = i
        .secret
        .and_then(|s| s.data.as_ref())
        .is_some_and(|data| data.contains_key(resources::SECRET_KEY));
    if !has_key {
        d.secret = Some(resources::secret(job, i.key_hex));
    }
    if let Some(settings) = &i.settings.network_policies {
        let policy = resources::network_policy(job, settings);
        if i.network_policy
            .is_none_or(|p| p.spec != policy.spec || !owned_by(&p.metadata, &policy.metadata))
        {
            d.network_policy = Some(policy);
        }
    }

    // Observe, plan.
    let (observed, facts) = observe(i);
    let (state, actions) = planner::plan(&job.spec, &i.memory.state, &observed, i.now);
    let mut observed = observed;
    for action in &actions {
        match *action {
            Action::Create {
                member,
                attempt,
                on_demand,
            } => {
                // What the cluster will show of it once the write lands.
                observed.members.insert(
                    member,
                    ObservedMember {
                        attempt,
                        address: Some(resources::member_address(job, member, i.settings)),
                        pending_since: Some(i.now),
                        ..Default::default()
                    },
                );
                d.create.push(resources::pod(
                    &resources::MemberPod {
                        job,
                        member,
                        attempt,
                        on_demand,
                        clique: state.topology.as_ref().and_then(|t| t.clique_of(member)),
                    },
                    i.settings,
                ));
            }
            Action::Stop { member, attempt } => {
                // Even when the cache does not show it yet (a 404 is fine).
                let pod = resources::pod_name(&name, member, attempt);
                if !d.delete.iter().any(|(n, _)| n == &pod) {
                    d.delete.push((pod, false));
                }
            }
            Action::Event { .. } => {}
        }
    }
    collect_events(&mut d, &actions, &name, &state);
    // Pods left behind on lost nodes: no kubelet will finish a graceful deletion.
    for pod in i.pods {
        let Some(pod_name) = pod.metadata.name.clone() else {
            continue;
        };
        let lost_node = matches!(
            facts.get(&pod_name),
            Some(Some(Exit::Preempted { reason })) if reason.starts_with("node ")
        );
        if lost_node && pod.metadata.deletion_timestamp.is_none() {
            d.delete.retain(|(n, _)| n != &pod_name);
            d.delete.push((pod_name, true));
        }
    }

    // Clique labels follow the topology, so `kubectl get pods -l murmur.dev/clique=3` works.
    for pod in i.pods {
        let Some((member, attempt)) = observe::member_of(pod) else {
            continue;
        };
        let current = state
            .members
            .get(&member)
            .is_some_and(|r| r.attempt == attempt)
            && observed.members.get(&member).is_some_and(|m| m.is_live())
            && pod.metadata.deletion_timestamp.is_none();
        if !current {
            continue;
        }
        let want = state.topology.as_ref().and_then(|t| t.clique_of(member));
        let have = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(resources::LABEL_CLIQUE))
            .and_then(|c| c.parse().ok());
        if want != have
            && let Some(name) = &pod.metadata.name
            && !d.delete.iter().any(|(n, _)| n == name)
        {
            d.relabel.push((name.clone(), want));
        }
    }

    // The topology document, with the members' stable addresses.
    let document = state
        .topology
        .as_ref()
        .map(|t| t.to_document(|id| Some(resources::member_address(job, id, i.settings))));
    let memory = Persisted {
        state,
        joins: i.memory.joins.clone(),
    };
    let data = memory.data(document.as_ref());
    if i.config_map.and_then(|c| c.data.as_ref()) != Some(&data) {
        d.config_map = Some(resources::config_map(job, data));
    }

    // Status, and what the status API shows.
    let mut view = view::job_view(
        &resources::namespace(job),
        &name,
        &job.spec,
        &memory.state,
        &observed,
        i.now,
    );
    let by_name: HashMap<&str, &Pod> = i
        .pods
        .iter()
        .filter_map(|p| Some((p.metadata.name.as_deref()?, *p)))
        .collect();
    for m in &mut view.status.members {
        let attempt = memory.state.members.get(&m.id).map_or(0, |r| r.attempt);
        let pod = resources::pod_name(&name, m.id, attempt);
        if let Some(waiting) = by_name.get(pod.as_str()).and_then(|p| waiting_of(p)) {
            m.message = Some(waiting);
        }
        m.pod = Some(pod);
    }
    view.status.observed_generation = job.metadata.generation;
    if job.status.as_ref() != Some(&view.status) {
        d.status = Some(view.status.clone());
    }

    // When to look again without news.
    let mut wake = planner::next_deadline(&job.spec, &memory.state, &observed, i.now);
    if memory.state.phase.is_finished()
        && let (Some(ttl), Some(done)) = (
            job.spec.ttl_seconds_after_finished,
            memory.state.completed_at,
        )
    {
        let expires =
            Timestamp::from_second(done.as_second().saturating_add(ttl)).unwrap_or(Timestamp::MAX);
        if expires <= i.now {
            d.delete_job = true;
        } else {
            wake = Some(wake.map_or(expires, |w| w.min(expires)));
        }
    }
    if let Some(w) = wake {
        let secs = planner::seconds_since(i.now, w).max(1.0);
        d.requeue = d.requeue.min(Duration::from_secs_f64(secs));
    }
    if memory != *i.memory {
        d.memory = Some(memory);
    }
    d.document = document;
    d.observed = observed;
    d.view = Some(view);
    d
}

fn waiting_of(pod: &Pod) -> Option<String> {
    observe::pod_facts(
        pod,
        |_| NodeState::Ready,
        None,
        Timestamp::UNIX_EPOCH,
        Duration::MAX,
    )
    .waiting
}

/// What the runtime sees of each member: its newest attempt's pod (or the pod it just created).
fn observe(i: &Inputs) -> (Observation, BTreeMap<String, Option<Exit>>) {
    let job = i.job;
    let mut newest: BTreeMap<MemberId, (u32, &Pod)> = BTreeMap::new();
    let mut facts_by_pod = BTreeMap::new();
    for pod in i.pods {
        let Some((member, attempt)) = observe::member_of(pod) else {
            continue;
        };
        if newest.get(&member).is_none_or(|(a, _)| attempt > *a) {
            newest.insert(member, (attempt, *pod));
        }
    }
    let mut observed = Observation::default();
    for (&id, record) in &i.memory.state.members {
        if !record.created {
            continue;
        }
        let status = i
            .statuses
            .get(&id)
            .filter(|(a, _)| *a == record.attempt)
            .map(|(_, s)| s.clone());
        let join = i
            .memory
            .joins
            .get(&id)
            .filter(|j| j.attempt == record.attempt)
            .map(|j| j.report.clone());
        let mut m = ObservedMember {
            attempt: record.attempt,
            address: Some(resources::member_address(job, id, i.settings)),
            join,
            ..Default::default()
        };
        match newest.get(&id) {
            Some((attempt, pod)) if *attempt == record.attempt => {
                let facts = observe::pod_facts(
                    pod,
                    i.node,
                    status.as_ref().map(|s| s.state),
                    i.now,
                    i.settings.node_lost_after,
                );
                facts_by_pod.insert(
                    pod.metadata.name.clone().unwrap_or_default(),
                    facts.exit.clone(),
                );
                m.node = facts.node;
                m.pending_since = facts.pending_since;
                m.exit = facts.exit;
            }
            _ => match i.created.get(&(id, record.attempt)) {
                // Just created: the cache has not caught up.
                Some(&t)
                    if planner::seconds_since(t, i.now)
                        < i.settings.creation_grace.as_secs_f64() =>
                {
                    m.pending_since = Some(t);
                }
                _ => {
                    m.exit = Some(Exit::Preempted {
                        reason: "pod deleted".into(),
                    })
                }
            },
        }
        m.status = status;
        observed.members.insert(id, m);
    }
    (observed, facts_by_pod)
}

fn collect_events(d: &mut Decision, actions: &[Action], job: &str, state: &JobState) {
    for action in actions {
        if let Action::Event {
            kind,
            reason,
            member,
            message,
        } = action
        {
            let pod = member.map(|m| {
                let attempt = state.members.get(&m).map_or(0, |r| r.attempt);
                resources::pod_name(job, m, attempt)
            });
            d.events.push(Note {
                kind: *kind,
                reason,
                member: *member,
                pod,
                message: message.clone(),
            });
        }
    }
}

/// `current` carries every owner reference `desired` sets (the job's uid).
fn owned_by(current: &ObjectMeta, desired: &ObjectMeta) -> bool {
    current.owner_references.as_ref().is_some_and(|o| {
        desired
            .owner_references
            .iter()
            .flatten()
            .all(|d| o.iter().any(|c| c.uid == d.uid))
    })
}

/// The fields murmur sets on its Service, compared with what the cluster holds (which the API
/// server fills with defaults).
fn same_service(current: &Service, desired: &Service) -> bool {
    let (Some(c), Some(d)) = (&current.spec, &desired.spec) else {
        return false;
    };
    let ports = |s: &k8s_openapi::api::core::v1::ServiceSpec| {
        s.ports
            .iter()
            .flatten()
            .map(|p| (p.name.clone(), p.port, p.target_port.clone()))
            .collect::<Vec<_>>()
    };
    owned_by(&current.metadata, &desired.metadata)
        && c.cluster_ip == d.cluster_ip
        && c.publish_not_ready_addresses == d.publish_not_ready_addresses
        && c.selector == d.selector
        && ports(c) == ports(d)
}
