//! One reconcile, decided without I/O: from the job, what the caches hold of its objects, and
//! the job driver's memory, to the driver's plan and the writes that bring the cluster to it.
//! The caller (`reconcile`) only gathers the inputs and hands the decision to the job's writer
//! (`writer`), which writes it behind the reconciles and persists the memory with
//! [`memory_write`] and the status with [`status_due`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use murmur_core::api::{DecentralizedTrainingJob, DecentralizedTrainingJobStatus, validate};
use murmur_core::contract::TopologyDocument;
use murmur_core::topology::MemberId;

use super::cached_pod::CachedPod;
use super::observe::{self, NodeState};
use super::resources::{self, Settings};
use crate::driver::{JobDriver, Memory, MemoryError, Plan};
use crate::member::{Exit, Lifecycle, NotStarting, ObservedMember};
use crate::planner::{self, Action};

/// A job's memory as the operator keeps it: from its ConfigMap when there is one, else fresh —
/// seeded from the pods it owns (an operator that lost its ConfigMap), and starting each member
/// after any `leftovers` (pods of an earlier job of the same name), so a new attempt never
/// reuses the name of a pod still around.
pub fn memory_of(
    job: &DecentralizedTrainingJob,
    config_map: Option<&ConfigMap>,
    pods: &[&CachedPod],
    leftovers: &[&CachedPod],
) -> Result<Memory, MemoryError> {
    if let Some(cm) = config_map {
        let source = format!(
            "ConfigMap {}/{}",
            cm.metadata.namespace.as_deref().unwrap_or_default(),
            cm.metadata.name.as_deref().unwrap_or_default()
        );
        let data = resources::config_map_data(cm).map_err(|(key, message)| MemoryError {
            origin: source.clone(),
            key: "binaryData",
            message: format!("{key}: {message}"),
        })?;
        return Memory::from_data(&source, &data);
    }
    let created = job
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or_else(Timestamp::now, |t| t.0);
    let mut memory = Memory::new(created);
    let state = Arc::make_mut(&mut memory.state);
    for pod in leftovers {
        if let Some((member, attempt)) = observe::member_of(*pod) {
            let record = state.members.entry(member).or_default();
            record.attempt = record.attempt.max(attempt + 1);
        }
    }
    for pod in pods {
        if let Some((member, attempt)) = observe::member_of(*pod) {
            let record = state.members.entry(member).or_default();
            if record.lifecycle == Lifecycle::New || attempt >= record.attempt {
                record.attempt = attempt;
                record.lifecycle = Lifecycle::PENDING;
            }
        }
    }
    Ok(memory)
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

/// A member attempt's pod to create, built only as its create is sent: a built pod is some
/// 25 KB, and while the API server is slow a large job's creates wait for its writer by the
/// thousand.
#[derive(Clone, Debug)]
pub struct NewPod {
    /// The job as the reconcile that decided the create saw it.
    pub job: Arc<DecentralizedTrainingJob>,
    pub member: MemberId,
    pub attempt: u32,
    pub on_demand: bool,
    /// Its clique in the current topology, when it has one (a replacement).
    pub clique: Option<u32>,
    /// The zone that clique trains in, when the topology knows it.
    pub zone: Option<String>,
}

impl NewPod {
    /// The member attempt it is.
    pub fn attempt(&self) -> (MemberId, u32) {
        (self.member, self.attempt)
    }

    pub fn name(&self) -> String {
        resources::pod_name(&resources::name(&self.job), self.member, self.attempt)
    }

    /// The pod, as the API server is sent it.
    pub fn build(&self, settings: &Settings) -> Pod {
        resources::pod(
            &resources::MemberPod {
                job: &self.job,
                member: self.member,
                attempt: self.attempt,
                on_demand: self.on_demand,
                clique: self.clique,
                zone: self.zone.as_deref(),
            },
            settings,
        )
    }
}

/// Everything one reconcile looks at.
pub struct Inputs<'a> {
    pub job: &'a Arc<DecentralizedTrainingJob>,
    /// [`problems`] of this job's spec.
    pub problems: Option<&'a str>,
    /// The job's pods that name a member attempt.
    pub pods: &'a [observe::JobPod<'a>],
    pub node: &'a dyn Fn(&str) -> NodeState,
    /// The newest Warning event that keeps a pod's containers from starting (a volume that
    /// cannot be mounted, a sandbox that cannot be made), as [`NotStarting`].
    pub start_event: &'a dyn Fn(&CachedPod) -> Option<NotStarting>,
    /// A node's zone and region labels, each when it has one.
    pub place: &'a dyn Fn(&str) -> observe::NodePlace,
    pub service: Option<&'a Service>,
    pub secret: Option<&'a Secret>,
    pub network_policy: Option<&'a NetworkPolicy>,
    pub disruption_budget: Option<&'a PodDisruptionBudget>,
    /// The job's driver: its memory and what its trainers posted.
    pub driver: &'a JobDriver,
    /// Pods this operator created and when the API server answered (the cache may not show
    /// them yet); `Timestamp::MAX` for a create its writer has not had answered yet.
    pub created: &'a BTreeMap<(MemberId, u32), Timestamp>,
    /// The job's key, for a Secret that does not exist yet.
    pub key_hex: &'a str,
    pub settings: &'a Settings,
    pub now: Timestamp,
}

/// The writes one reconcile makes: nothing here, and a memory and status the cluster already
/// holds, mean nothing to write. The memory and the status are compared with what the cluster
/// holds when they are written, since the writes of earlier decisions may still be under way.
#[derive(Debug)]
pub struct Decision {
    /// The driver's step: assumed at once, its memory persisted and its topology published
    /// once its creates are answered.
    pub plan: Plan,
    pub create: Vec<NewPod>,
    /// Pod names, and whether to delete at once (its node is gone: no kubelet will finish a
    /// graceful deletion).
    pub delete: Vec<(String, bool)>,
    /// Pods whose `murmur.dev/clique` label is behind the topology, and the clique it should say.
    pub relabel: Vec<(String, u32)>,
    pub service: Option<Service>,
    pub secret: Option<Secret>,
    /// The uid of a key Secret of the same name left by an earlier job of this name (orphaned
    /// or not yet collected): deleted before the new one is written, as it is immutable.
    pub replace_secret: Option<String>,
    pub network_policy: Option<NetworkPolicy>,
    pub disruption_budget: Option<PodDisruptionBudget>,
    /// Whether the plan's memory is the job's to persist (not while its spec is invalid: that
    /// plan only says so).
    pub persist: bool,
    /// Delete the job itself (`ttlSecondsAfterFinished` passed).
    pub delete_job: bool,
    pub requeue: Duration,
}

impl Decision {
    fn new(plan: Plan, settings: &Settings) -> Self {
        Self {
            plan,
            create: Vec::new(),
            delete: Vec::new(),
            relabel: Vec::new(),
            service: None,
            secret: None,
            replace_secret: None,
            network_policy: None,
            disruption_budget: None,
            persist: true,
            delete_job: false,
            requeue: settings.resync,
        }
    }

    /// Writes to the API server this decision makes besides its memory and status (events
    /// included).
    pub fn writes(&self) -> usize {
        self.create.len()
            + self.delete.len()
            + self.relabel.len()
            + usize::from(self.service.is_some())
            + usize::from(self.secret.is_some())
            + usize::from(self.replace_secret.is_some())
            + usize::from(self.network_policy.is_some())
            + usize::from(self.disruption_budget.is_some())
            + self.plan.events.len()
            + usize::from(self.delete_job)
    }

    /// This decision, not yet written, followed by `newer` (decided meanwhile, from the memory
    /// this one left): one decision that writes what both do. The newer plan, objects and
    /// relabels stand; the creates, deletes and events of both are made, in order.
    pub fn then(mut self, newer: Decision) -> Decision {
        let mut plan = newer.plan;
        let mut events = std::mem::take(&mut self.plan.events);
        events.append(&mut plan.events);
        plan.events = events;
        let mut create = self.create;
        // Through a set: both can hold hundreds of creates while the writer is behind.
        let mut named: std::collections::HashSet<(MemberId, u32)> =
            create.iter().map(NewPod::attempt).collect();
        for pod in newer.create {
            if named.insert(pod.attempt()) {
                create.push(pod);
            }
        }
        let mut delete = self.delete;
        for (pod, at_once) in newer.delete {
            match delete.iter_mut().find(|(p, _)| *p == pod) {
                Some((_, before)) => *before |= at_once,
                None => delete.push((pod, at_once)),
            }
        }
        Decision {
            plan,
            create,
            delete,
            relabel: newer.relabel,
            service: newer.service.or(self.service),
            secret: newer.secret.or(self.secret),
            replace_secret: newer.replace_secret.or(self.replace_secret),
            network_policy: newer.network_policy.or(self.network_policy),
            disruption_budget: newer.disruption_budget.or(self.disruption_budget),
            persist: newer.persist,
            delete_job: self.delete_job || newer.delete_job,
            requeue: newer.requeue,
        }
    }

    /// The pod an event is about: its member's attempt.
    pub fn pod_of(job: &str, event: &planner::Event) -> Option<String> {
        Some(resources::pod_name(job, event.member?, event.attempt?))
    }

    /// The events to record as Kubernetes Events. Of one reconcile's events of one type and
    /// reason, the first [`SIMILAR_EVENTS`] are recorded one by one and the rest as one event
    /// that names their members, as client-go's event aggregator combines similar events: a
    /// thousand members joining cost a dozen writes, not a thousand. The status API keeps
    /// every event.
    pub fn kube_events(&self) -> Vec<planner::Event> {
        let mut out = Vec::new();
        let mut rest: Vec<(planner::EventKind, planner::Reason, Vec<&planner::Event>)> = Vec::new();
        let mut seen: BTreeMap<(bool, &str), usize> = BTreeMap::new();
        for e in &self.plan.events {
            let key = (e.kind == planner::EventKind::Warning, e.reason.as_str());
            let n = seen.entry(key).or_default();
            *n += 1;
            if *n <= SIMILAR_EVENTS {
                out.push(e.clone());
            } else if let Some((_, _, more)) = rest
                .iter_mut()
                .find(|(k, r, _)| *k == e.kind && *r == e.reason)
            {
                more.push(e);
            } else {
                rest.push((e.kind, e.reason, vec![e]));
            }
        }
        for (kind, reason, more) in rest {
            let members: Vec<String> = more
                .iter()
                .filter_map(|e| e.member)
                .map(|m| m.to_string())
                .collect();
            out.push(planner::Event {
                kind,
                reason,
                member: None,
                attempt: None,
                action: None,
                message: format!(
                    "{} more {} events (the status API lists each); members {}",
                    more.len(),
                    reason.as_str(),
                    members.join(", ")
                ),
            });
        }
        out
    }
}

/// Similar events (one type, one reason) one reconcile records one by one; the rest as one.
pub const SIMILAR_EVENTS: usize = 10;

pub fn decide(i: &Inputs) -> Decision {
    let job = i.job;
    let addresses = resources::MemberAddresses::new(job, i.settings);
    let address = |id, attempt| Some(addresses.of(id, attempt));
    if let Some(problems) = i.problems {
        let plan = i
            .driver
            .plan(&job.spec, Some(problems), BTreeMap::new(), &address, i.now);
        let mut d = Decision::new(plan, i.settings);
        Arc::make_mut(&mut d.plan.view).status.observed_generation = job.metadata.generation;
        d.persist = false;
        return d;
    }
    let (seen, lost) = observe(i, &addresses);
    let plan = i.driver.plan(&job.spec, None, seen, &address, i.now);
    let mut d = Decision::new(plan, i.settings);
    children(i, &mut d);
    members(i, &mut d);
    delete_on_lost_nodes(&lost, &mut d);
    relabel(i, &mut d);
    status(i, &mut d);
    requeue(i, &mut d);
    d
}

/// What the job's ConfigMap needs to hold `memory`.
#[derive(Debug, PartialEq)]
pub enum MemoryWrite {
    /// It holds it, as this operator knows (it wrote or compared it, and the cache shows
    /// nothing newer).
    Known,
    /// Its text, at this resourceVersion, is `memory`'s: remember it for the next comparison.
    Holds(Option<String>),
    /// Write this.
    Write(Box<ConfigMap>),
}

/// What the job's ConfigMap (`cached`, as the watch shows it) needs to hold `memory`, whose
/// topology has `document`. `known`: the memory this operator knows the ConfigMap holds (it
/// wrote it, and the cache shows that write or nothing newer), compared in place of its text
/// (at 10 000 members, megabytes to serialize and inflate). A memory that differs from the
/// known one differs in text too, so it is written without inflating the ConfigMap to compare;
/// otherwise the text is compared, packed (gzip, for a large job) only when written.
pub fn memory_write(
    job: &DecentralizedTrainingJob,
    memory: &Memory,
    document: Option<&TopologyDocument>,
    cached: Option<&ConfigMap>,
    known: Option<&Memory>,
) -> MemoryWrite {
    let owner = resources::config_map(job, BTreeMap::new()).metadata;
    let current = cached.filter(|c| owned_by(&c.metadata, &owner));
    if known == Some(memory) {
        return MemoryWrite::Known;
    }
    let data = memory.data(document);
    match current {
        Some(c)
            if known.is_none() && resources::config_map_data(c).ok().as_ref() == Some(&data) =>
        {
            MemoryWrite::Holds(c.metadata.resource_version.clone())
        }
        _ => MemoryWrite::Write(Box::new(resources::config_map(job, data))),
    }
}

/// The API server's answers to creates, taken into a job's `state`: refused pods end `Refused`
/// and are tried again after a backoff while the admitted members run
/// ([`planner::creates_answered`]). The new state and the events the answers bring, or None
/// when they change nothing.
pub fn answer_state(
    state: &planner::JobState,
    accepted: &[(MemberId, u32)],
    refused: &[(MemberId, u32, String)],
    now: Timestamp,
) -> Option<(planner::JobState, Vec<planner::Event>)> {
    let (state, actions) = planner::creates_answered(state, accepted, refused, now)?;
    let events = actions
        .into_iter()
        .filter_map(|a| match a {
            Action::Event(e) => Some(e),
            _ => None,
        })
        .collect();
    Some((state, events))
}

/// [`answer_state`] for a plan not yet written: its memory, and the conditions of its status.
pub fn answer(
    plan: &mut Plan,
    accepted: &[(MemberId, u32)],
    refused: &[(MemberId, u32, String)],
    now: Timestamp,
) -> Option<Vec<planner::Event>> {
    let (state, events) = answer_state(&plan.memory.state, accepted, refused, now)?;
    plan.memory.state = Arc::new(state);
    Arc::make_mut(&mut plan.view).status.conditions =
        crate::status::view::status_conditions(&plan.memory.state);
    Some(events)
}

/// The children that must exist before any member starts: the headless Service, the key
/// Secret, the PodDisruptionBudget, the NetworkPolicy.
fn children(i: &Inputs, d: &mut Decision) {
    let service = resources::service(i.job);
    if i.service.is_none_or(|s| !same_service(s, &service)) {
        d.service = Some(service);
    }
    let secret = resources::secret(i.job, i.key_hex);
    let (ours, leftover) = match i.secret {
        Some(s) if owned_by(&s.metadata, &secret.metadata) => (Some(s), None),
        // The cache holds only murmur's Secrets: one not owned by this job is an earlier
        // job's of the same name.
        Some(s) => (None, s.metadata.uid.clone()),
        None => (None, None),
    };
    let has_key = ours
        .and_then(|s| s.data.as_ref())
        .is_some_and(|data| data.contains_key(resources::SECRET_KEY));
    if !has_key {
        d.replace_secret = leftover;
        d.secret = Some(secret);
    }
    let budget = resources::disruption_budget(i.job);
    if i.disruption_budget
        .is_none_or(|b| b.spec != budget.spec || !owned_by(&b.metadata, &budget.metadata))
    {
        d.disruption_budget = Some(budget);
    }
    if let Some(settings) = &i.settings.network_policies {
        let policy = resources::network_policy(i.job, settings);
        if i.network_policy
            .is_none_or(|p| p.spec != policy.spec || !owned_by(&p.metadata, &policy.metadata))
        {
            d.network_policy = Some(policy);
        }
    }
}

/// The planner's creates and stops, as pods.
fn members(i: &Inputs, d: &mut Decision) {
    let job = i.job;
    let name = resources::name(job);
    for action in &d.plan.actions {
        match *action {
            Action::Create {
                member,
                attempt,
                on_demand,
                clique,
                ref zone,
            } => {
                if let Some(m) = d.plan.observed.members.get_mut(&member) {
                    m.pending_since = Some(i.now);
                }
                d.create.push(NewPod {
                    job: job.clone(),
                    member,
                    attempt,
                    on_demand,
                    clique,
                    zone: zone.clone(),
                });
            }
            Action::Stop { member, attempt } => {
                // Even when the cache does not show it yet (a 404 is fine).
                let pod = resources::pod_name(&name, member, attempt);
                if !d.delete.iter().any(|(n, _)| n == &pod) {
                    d.delete.push((pod, false));
                }
            }
            Action::Event(_) => {}
        }
    }
}

/// Pods left behind on lost nodes: no kubelet will finish a graceful deletion.
fn delete_on_lost_nodes(lost: &[String], d: &mut Decision) {
    for pod_name in lost {
        d.delete.retain(|(n, _)| n != pod_name);
        d.delete.push((pod_name.clone(), true));
    }
}

/// Pods one reconcile relabels at most; the rest are the next reconcile's, a second later.
pub const RELABELS_PER_RECONCILE: usize = 500;

/// Clique labels follow the topology, so `kubectl get pods -l murmur.dev/clique=3` works. At
/// most [`RELABELS_PER_RECONCILE`] a reconcile: a new topology of thousands of members is
/// labelled over several, each short, so the job's next news is not kept waiting.
fn relabel(i: &Inputs, d: &mut Decision) {
    let state = &d.plan.memory.state;
    for &observe::JobPod {
        pod,
        member,
        attempt,
        clique: have,
    } in i.pods
    {
        let current = state
            .members
            .get(&member)
            .is_some_and(|r| r.attempt == attempt)
            && d.plan
                .observed
                .members
                .get(&member)
                .is_some_and(|m| m.is_live())
            && pod.metadata.deletion_timestamp.is_none();
        if !current {
            continue;
        }
        // Outside the topology (a replacement not joined yet) the label is the clique it was
        // created for: left as it is.
        let Some(want) = state.topology.as_ref().and_then(|t| t.clique_of(member)) else {
            continue;
        };
        if Some(want) != have
            && let Some(name) = &pod.metadata.name
            && !d.delete.iter().any(|(n, _)| n == name)
        {
            if d.relabel.len() == RELABELS_PER_RECONCILE {
                d.requeue = d.requeue.min(Duration::from_secs(1));
                break;
            }
            d.relabel.push((name.clone(), want));
        }
    }
}

/// The status subresource, and what the status API shows: the view with each member's pod
/// (written when [`status_due`]).
fn status(i: &Inputs, d: &mut Decision) {
    let name = resources::name(i.job);
    let state = &d.plan.memory.state;
    let view = Arc::make_mut(&mut d.plan.view);
    for m in &mut view.status.members {
        let attempt = state.members.get(&m.id).map_or(0, |r| r.attempt);
        m.pod = Some(resources::pod_name(&name, m.id, attempt));
    }
    view.status.observed_generation = i.job.metadata.generation;
    view.status.trainer_image = Some(resources::trainer_image(i.job, i.settings));
    // An operator that just started has heard from no trainer yet: the progress it knows is
    // nothing, not step 0. Keep what the status said until a trainer reports.
    if !i.driver.heard_from_trainers()
        && let Some(previous) = i.job.status.as_ref().and_then(|s| s.progress.clone())
    {
        view.status.progress = Some(previous);
    }
}

/// Whether to write `next` over `current`. Progress alone (steps, loss, accuracy, bytes) is
/// written at most every [`PROGRESS_REFRESH`] after the last write: it moves with every report,
/// and the status API shows it live. Anything else is written at once.
pub fn status_due(
    current: Option<&DecentralizedTrainingJobStatus>,
    next: &DecentralizedTrainingJobStatus,
    written: Option<Timestamp>,
    now: Timestamp,
) -> bool {
    let Some(current) = current else {
        return true;
    };
    if current == next {
        return false;
    }
    let progress_only = without_progress(current) == without_progress(next);
    let refreshed_lately =
        written.is_some_and(|t| planner::seconds_since(t, now) < PROGRESS_REFRESH.as_secs_f64());
    !(progress_only && refreshed_lately)
}

/// A status less what moves as training goes on.
fn without_progress(status: &DecentralizedTrainingJobStatus) -> DecentralizedTrainingJobStatus {
    let mut s = status.clone();
    s.progress = None;
    s.traffic = None;
    for m in &mut s.members {
        m.step = 0;
        m.cross_zone_bytes = None;
    }
    s
}

/// How often a running job's status (step, loss, accuracy: what `kubectl get dtj -w` shows) is
/// refreshed from its trainers' reports: about 6 writes a minute, whatever the job's size.
pub const PROGRESS_REFRESH: Duration = Duration::from_secs(10);

/// When to look again without news: a planner deadline, the finished job's TTL, or the next
/// progress refresh of a running job.
fn requeue(i: &Inputs, d: &mut Decision) {
    let state = &d.plan.memory.state;
    if state.phase == murmur_core::api::JobPhase::Running {
        d.requeue = d.requeue.min(PROGRESS_REFRESH);
    }
    let mut wake = planner::next_deadline(&i.job.spec, state, &d.plan.observed, i.now);
    if state.phase.is_finished()
        && let (Some(ttl), Some(done)) = (i.job.spec.ttl_seconds_after_finished, state.completed_at)
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
}

/// What the cluster shows of each member: its newest attempt's pod (or the pod just created),
/// and the pods lost with their nodes.
fn observe(
    i: &Inputs,
    addresses: &resources::MemberAddresses,
) -> (BTreeMap<MemberId, ObservedMember>, Vec<String>) {
    let mut newest: std::collections::HashMap<MemberId, (u32, &CachedPod)> =
        std::collections::HashMap::with_capacity(i.pods.len());
    for &observe::JobPod {
        pod,
        member,
        attempt,
        ..
    } in i.pods
    {
        if newest.get(&member).is_none_or(|(a, _)| attempt > *a) {
            newest.insert(member, (attempt, pod));
        }
    }
    let mut lost = Vec::new();
    // Collected in id order, which builds the map at once: inserted one by one, 10 000 members
    // (each a large value) were half of this function.
    let members = i
        .driver
        .state()
        .members
        .iter()
        .filter(|(_, record)| record.lifecycle != Lifecycle::New)
        .map(|(&id, record)| {
            let mut m = match newest.get(&id) {
                Some((attempt, pod)) if *attempt == record.attempt => {
                    let facts = observe::pod_facts(
                        pod,
                        i.node,
                        i.driver.last_state(id, record.attempt),
                        i.now,
                        i.settings.node_lost_after,
                    );
                    if facts.node_lost
                        && let Some(name) = &pod.metadata.name
                    {
                        lost.push(name.clone());
                    }
                    let mut m = facts.member;
                    (m.zone, m.region) = m.node.as_deref().map(i.place).unwrap_or_default();
                    m.not_starting = m.not_starting.or_else(|| {
                        observe::creating(pod)
                            .then(|| (i.start_event)(pod))
                            .flatten()
                    });
                    m
                }
                _ => match i.created.get(&(id, record.attempt)) {
                    // Just created, the cache not caught up; or its create not answered yet
                    // (`Timestamp::MAX`): pending from now.
                    Some(&t)
                        if planner::seconds_since(t, i.now)
                            < i.settings.creation_grace.as_secs_f64() =>
                    {
                        ObservedMember {
                            pending_since: Some(t.min(i.now)),
                            ..Default::default()
                        }
                    }
                    _ => ObservedMember {
                        exit: Some(Exit::Preempted {
                            reason: "pod deleted".into(),
                        }),
                        ..Default::default()
                    },
                },
            };
            m.attempt = record.attempt;
            m.address = Some(addresses.of(id, record.attempt));
            (id, m)
        })
        .collect();
    (members, lost)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::Hub;
    use std::sync::Arc;

    /// A decision whose plan carries `events` (by reason), creating member attempts' pods and
    /// deleting pods by name.
    fn decision(
        events: &[planner::Reason],
        create: &[(MemberId, u32)],
        delete: &[(&str, bool)],
    ) -> Decision {
        let job = murmur_core::api::parse_manifest(
            "apiVersion: murmur.dev/v1alpha1\nkind: DecentralizedTrainingJob\nmetadata: {name: j, namespace: ml}\nspec:\n  replicas: {min: 1, target: 2, max: 2}\n  training: {model: mlp, steps: 10}\n",
            "job.yaml",
        )
        .unwrap();
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let (driver, _inbox) = JobDriver::start(
            Arc::new(Hub::default()),
            "ml",
            "j",
            vec![0],
            Memory::new(now),
        );
        let mut plan = driver.plan(&job.spec, None, BTreeMap::new(), &|_, _| None, now);
        plan.events = events
            .iter()
            .map(|&reason| planner::Event {
                kind: planner::EventKind::Normal,
                reason,
                member: None,
                attempt: None,
                message: String::new(),
                action: None,
            })
            .collect();
        let mut d = Decision::new(plan, &Settings::default());
        let job = Arc::new(job);
        d.create = create
            .iter()
            .map(|&(member, attempt)| NewPod {
                job: job.clone(),
                member,
                attempt,
                on_demand: false,
                clique: None,
                zone: None,
            })
            .collect();
        d.delete = delete.iter().map(|(n, a)| (n.to_string(), *a)).collect();
        d
    }

    #[test]
    fn decisions_folded_make_both_writes_in_order_and_the_newer_plan_stands() {
        use planner::Reason::{Joined, Preempted};
        let mut older = decision(&[Joined], &[(0, 0), (1, 0)], &[("j-2-0", false)]);
        older.delete_job = true;
        older.service = Some(Service::default());
        let mut newer = decision(&[Preempted], &[(1, 0), (3, 0)], &[("j-2-0", true)]);
        newer.persist = false;
        newer.plan.step = 7;
        let d = older.then(newer);
        let names: Vec<_> = d.create.iter().map(NewPod::name).collect();
        assert_eq!(
            names,
            ["j-0-0", "j-1-0", "j-3-0"],
            "each pod once, in order"
        );
        assert_eq!(
            d.delete,
            [("j-2-0".to_string(), true)],
            "at once if either says so"
        );
        let reasons: Vec<_> = d.plan.events.iter().map(|e| e.reason).collect();
        assert_eq!(reasons, [Joined, Preempted]);
        assert_eq!(d.plan.step, 7);
        assert!(!d.persist);
        assert!(d.delete_job);
        assert!(d.service.is_some(), "an object not written yet still is");
    }
}
