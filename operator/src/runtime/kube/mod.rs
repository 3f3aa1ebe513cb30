//! The Kubernetes runtime (`murmur operator`): a kube-rs controller that reconciles each
//! DecentralizedTrainingJob into pods, a headless Service, the peer-key Secret and the topology
//! ConfigMap. `reconcile` gathers inputs from the watch caches, calls the pure [`decide`] (which
//! calls the same planner as `murmur run`) and performs the writes; the same status router as
//! `murmur run` serves the API, the dashboard and the trainers' control endpoint.

pub mod access;
pub mod decide;
pub mod kueue;
pub mod lease;
mod metrics;
pub mod observe;
pub mod preflight;
pub mod resources;
pub mod scheduling;
pub mod start_events;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::Retryable;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Node, ObjectReference, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{Event as KubeEventSpec, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, predicates, watcher};
use kube::{Client, Resource, ResourceExt};
use murmur_core::api::DecentralizedTrainingJob;
use murmur_core::topology::MemberId;
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tracing::Instrument;

pub use decide::{Decision, Inputs, decide, memory_of};
pub use metrics::OperatorMetrics;
pub use resources::Settings;

use crate::driver::{JobDriver, Memory};
use crate::planner;
use crate::status::{Hub, Inbound, Role};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{action} {object}: {source}")]
    Kube {
        action: &'static str,
        object: String,
        source: kube::Error,
    },
    #[error(transparent)]
    Memory(#[from] crate::driver::MemoryError),
    #[error("not writing: this replica's lease was not renewed within its renew deadline")]
    NotLeading,
}

impl Error {
    /// For the errors-by-kind metric.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Kube { source, .. } => match source {
                kube::Error::Api(e) if e.code == 409 => "conflict",
                kube::Error::Api(e) if e.code == 403 => "forbidden",
                kube::Error::Api(e) if e.code == 422 => "invalid",
                kube::Error::Api(_) => "api",
                _ => "transport",
            },
            Error::Memory(_) => "persisted_state",
            Error::NotLeading => "not_leading",
        }
    }
}

fn kube_err(action: &'static str, object: String) -> impl FnOnce(kube::Error) -> Error {
    move |source| Error::Kube {
        action,
        object,
        source,
    }
}

/// The watch caches reconcile reads (it never lists: an unchanged job costs no request).
#[derive(Clone)]
pub struct Stores {
    pub pods: Store<Pod>,
    pub services: Store<Service>,
    pub config_maps: Store<ConfigMap>,
    pub secrets: Store<Secret>,
    pub nodes: Store<Node>,
    /// Filled only with `--network-policies` (otherwise never listed, never waited for).
    pub network_policies: Option<Store<NetworkPolicy>>,
    pub disruption_budgets: Store<PodDisruptionBudget>,
    /// What keeps pods from starting that only events say (never waited for: an empty index
    /// only means nothing is reported yet).
    pub start_events: start_events::StartEvents,
    /// Set once every cache above has listed. One task waits on the stores for everyone: a
    /// store wakes only the last task that polled its readiness, so a second waiter (a
    /// reconcile beside the start-up task) left the other waiting forever.
    pub listed: Arc<tokio::sync::OnceCell<()>>,
}

impl Stores {
    /// Wait until every cache holds a complete list: before that, a missing Secret would get a
    /// new key and every node would look gone.
    pub async fn ready(&self) {
        self.listed.get_or_init(|| self.wait_for_lists()).await;
    }

    async fn wait_for_lists(&self) {
        async fn listed<K>(what: &str, store: &Store<K>)
        where
            K: kube::runtime::reflector::Lookup + Clone + 'static,
            K::DynamicType: Eq + std::hash::Hash + Clone,
        {
            let _ = store.wait_until_ready().await;
            tracing::debug!(cache = what, "listed");
        }
        let _ = futures::join!(
            listed("pods", &self.pods),
            listed("services", &self.services),
            listed("configmaps", &self.config_maps),
            listed("secrets", &self.secrets),
            listed("nodes", &self.nodes),
            listed("poddisruptionbudgets", &self.disruption_budgets),
            async {
                if let Some(store) = &self.network_policies {
                    let _ = store.wait_until_ready().await;
                }
            },
        );
    }
}

/// What this operator process holds of one job between reconciles.
struct Live {
    uid: String,
    /// The job's driver: memory, trainers' posts, publishing.
    driver: JobDriver,
    key_hex: String,
    created: BTreeMap<(MemberId, u32), Timestamp>,
    /// The spec's validation result for a generation (CEL evaluation is not free).
    validated: Option<(Option<i64>, Option<String>)>,
    /// When the job's status was last written (progress alone is written now and then).
    status_written: Option<Timestamp>,
    /// The memory the job's ConfigMap holds at a resourceVersion, as this operator last wrote
    /// or compared it.
    config_map_memory: Option<(String, Memory)>,
}

type JobKey = (String, String);

pub struct Context {
    pub client: Client,
    pub stores: Stores,
    pub hub: Arc<Hub>,
    pub metrics: Arc<OperatorMetrics>,
    pub settings: Settings,
    /// `reportingInstance` of the events this operator writes.
    pub instance: String,
    /// The time (tests move it by hand).
    pub clock: Arc<dyn Fn() -> Timestamp + Send + Sync>,
    /// Checked before every write: a replica that may have lost its lease writes nothing.
    pub leadership: Arc<lease::Leadership>,
    /// Writes the job's Kubernetes Events (series and deduplication included).
    recorder: Recorder,
    jobs: Mutex<HashMap<JobKey, Arc<Mutex<Live>>>>,
    /// The delays before the next retries of jobs whose last reconcile failed.
    retries: Mutex<HashMap<JobKey, backon::ExponentialBackoff>>,
    /// Reconcile a job now (a trainer joined).
    trigger: mpsc::UnboundedSender<ObjectRef<DecentralizedTrainingJob>>,
}

impl Context {
    pub fn new(
        client: Client,
        stores: Stores,
        hub: Arc<Hub>,
        metrics: Arc<OperatorMetrics>,
        settings: Settings,
        instance: String,
        leadership: Arc<lease::Leadership>,
    ) -> (
        Arc<Self>,
        mpsc::UnboundedReceiver<ObjectRef<DecentralizedTrainingJob>>,
    ) {
        let (trigger, triggered) = mpsc::unbounded_channel();
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: REPORTING_CONTROLLER.into(),
                instance: Some(instance.clone()),
            },
        );
        let ctx = Arc::new(Self {
            client,
            stores,
            hub,
            metrics,
            settings,
            instance,
            clock: Arc::new(Timestamp::now),
            leadership,
            recorder,
            jobs: Mutex::default(),
            retries: Mutex::default(),
            trigger,
        });
        (ctx, triggered)
    }

    /// The same operator process (its memory of jobs) reading other caches.
    pub fn with_stores(&self, stores: Stores) -> Arc<Self> {
        Arc::new(Self {
            client: self.client.clone(),
            stores,
            hub: self.hub.clone(),
            metrics: self.metrics.clone(),
            settings: self.settings.clone(),
            instance: self.instance.clone(),
            clock: self.clock.clone(),
            leadership: self.leadership.clone(),
            recorder: self.recorder.clone(),
            jobs: Mutex::new(self.jobs.lock().clone()),
            retries: Mutex::default(),
            trigger: self.trigger.clone(),
        })
    }

    /// The job's live record: created on its first reconcile in this process, from its
    /// ConfigMap and Secret when they exist (an operator restart), registering it with the hub.
    /// The job's live record: created on its first reconcile in this process, from the
    /// ConfigMap and Secret it owns when there are (an operator restart) — never from objects of
    /// another job of the same name (one deleted and created again) — and with attempts that
    /// follow any `leftovers` (pods of such a job), so no pod name is taken twice.
    fn live(
        self: &Arc<Self>,
        job: &DecentralizedTrainingJob,
        pods: &[&Pod],
        leftovers: &[&Pod],
    ) -> Result<Arc<Mutex<Live>>, Error> {
        let key = (resources::namespace(job), resources::name(job));
        let uid = job.uid().unwrap_or_default();
        if let Some(live) = self.jobs.lock().get(&key)
            && live.lock().uid == uid
        {
            return Ok(live.clone());
        }
        let ours = |meta: &ObjectMeta| meta.owner_references.iter().flatten().any(|o| o.uid == uid);
        let config_map = self
            .stores
            .config_maps
            .get(&ObjectRef::new(&resources::config_map_name(&key.1)).within(&key.0))
            .filter(|c| ours(&c.metadata));
        let memory = decide::memory_of(job, config_map.as_deref(), pods, leftovers)?;
        let secret = self
            .stores
            .secrets
            .get(&ObjectRef::new(&resources::secret_name(&key.1)).within(&key.0))
            .filter(|s| ours(&s.metadata));
        let key_hex = secret
            .as_ref()
            .and_then(|s| s.data.as_ref()?.get(resources::SECRET_KEY).cloned())
            .and_then(|b| String::from_utf8(b.0).ok())
            .unwrap_or_else(super::new_job_key);
        let (driver, inbox) = JobDriver::start(
            self.hub.clone(),
            &key.0,
            &key.1,
            key_hex.clone().into_bytes(),
            memory,
        );
        let live = Arc::new(Mutex::new(Live {
            uid,
            driver,
            key_hex,
            created: BTreeMap::new(),
            validated: None,
            status_written: None,
            config_map_memory: None,
        }));
        self.jobs.lock().insert(key.clone(), live.clone());
        tokio::spawn(listen(
            Arc::downgrade(self),
            Arc::downgrade(&live),
            key,
            inbox,
        ));
        Ok(live)
    }

    /// The pod watch showed `pod`: its creation is no longer awaited.
    fn pod_seen(&self, pod: &Pod) {
        let (Some(key), Some(job)) = (
            observe::member_of(pod),
            pod.labels().get(resources::LABEL_JOB),
        ) else {
            return;
        };
        let job = (pod.namespace().unwrap_or_default(), job.clone());
        if let Some(live) = self.jobs.lock().get(&job) {
            live.lock().created.remove(&key);
        }
    }

    /// The pod cache was listed again, the list begun at `since`: a pod created before that
    /// which the list lacks is gone (a pod created and deleted while the watch was down), so
    /// its creation is no longer awaited either.
    fn pods_listed(&self, since: Timestamp) {
        let jobs: Vec<Arc<Mutex<Live>>> = self.jobs.lock().values().cloned().collect();
        for live in jobs {
            live.lock().created.retain(|_, t| *t >= since);
        }
    }

    /// How long to wait before retrying the job's reconcile, which has just failed.
    fn retry_delay(&self, job: JobKey) -> Duration {
        self.retries
            .lock()
            .entry(job)
            .or_insert_with(retry_delays)
            .next()
            .unwrap_or(RETRY_MAX)
    }

    /// The job's reconcile succeeded: its next failure is retried soon again.
    fn succeeded(&self, job: &JobKey) {
        self.retries.lock().remove(job);
    }

    fn forget(&self, namespace: &str, name: &str) {
        self.jobs
            .lock()
            .remove(&(namespace.to_string(), name.to_string()));
        self.succeeded(&(namespace.to_string(), name.to_string()));
        self.hub.forget(namespace, name);
        self.metrics.forget(namespace, name);
    }

    /// Forget jobs that are gone from the cluster (deleted without the operator seeing a
    /// deletion timestamp: there is no finalizer, so deletion never waits for the operator).
    pub fn forget_deleted(&self, exists: impl Fn(&str, &str) -> bool) -> usize {
        let gone: Vec<JobKey> = self
            .jobs
            .lock()
            .keys()
            .filter(|(ns, name)| !exists(ns, name))
            .cloned()
            .collect();
        for (ns, name) in &gone {
            self.forget(ns, name);
        }
        gone.len()
    }
}

/// What a job's trainers post goes to its driver; a post that changes the job (a join report,
/// a member's new state) reconciles it now rather than at the next resync.
async fn listen(
    ctx: std::sync::Weak<Context>,
    live: std::sync::Weak<Mutex<Live>>,
    key: JobKey,
    mut inbox: mpsc::UnboundedReceiver<Inbound>,
) {
    while let Some(message) = inbox.recv().await {
        let (Some(ctx), Some(live)) = (ctx.upgrade(), live.upgrade()) else {
            return;
        };
        let now = (ctx.clock)();
        if live.lock().driver.receive(message, now) {
            let _ = ctx.trigger.send(ObjectRef::new(&key.1).within(&key.0));
        }
    }
}

/// One reconcile of one job, in a span naming it (logs group by job).
pub async fn reconcile(
    job: Arc<DecentralizedTrainingJob>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let span = tracing::info_span!(
        "reconcile",
        namespace = %resources::namespace(&job),
        job = %resources::name(&job)
    );
    if job.metadata.deletion_timestamp.is_none() {
        ctx.stores.ready().await;
        // A reconcile waits `min_reconcile_interval` after it was asked for, then reads the
        // caches: what arrives together (a join wave, a node's pods) is handled together, and a
        // job's reconciles are at least that far apart, since requests meanwhile wait as one
        // (the controller keeps one pending per job). Unlike a debounce, which every new
        // trigger restarted, a stream of triggers never holds it off.
        let delay = ctx.settings.min_reconcile_interval;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
    }
    // The work, not the wait before it.
    let started = Instant::now();
    tracing::debug!(parent: &span, "reconciling");
    let result = reconcile_inner(&job, &ctx).instrument(span).await;
    let outcome = match &result {
        Ok(_) => "ok",
        Err(e) => e.kind(),
    };
    let seconds = started.elapsed().as_secs_f64();
    ctx.metrics.reconciled(seconds, outcome);
    if result.is_ok() {
        ctx.succeeded(&(resources::namespace(&job), resources::name(&job)));
    }
    tracing::debug!(seconds, outcome, "reconciled");
    result
}

async fn reconcile_inner(
    job: &DecentralizedTrainingJob,
    ctx: &Arc<Context>,
) -> Result<Action, Error> {
    let namespace = resources::namespace(job);
    let name = resources::name(job);
    if job.metadata.deletion_timestamp.is_some() {
        // Owner references take the pods, Service, Secret and ConfigMap with it.
        ctx.forget(&namespace, &name);
        return Ok(Action::await_change());
    }
    let uid = job.uid().unwrap_or_default();
    let owned = |meta: &ObjectMeta| {
        meta.namespace.as_deref() == Some(namespace.as_str())
            && meta.owner_references.iter().flatten().any(|o| o.uid == uid)
    };
    let (pods, others): (Vec<Arc<Pod>>, Vec<Arc<Pod>>) = ctx
        .stores
        .pods
        .state()
        .into_iter()
        .filter(|p| {
            p.metadata.namespace.as_deref() == Some(namespace.as_str())
                && p.labels().get(resources::LABEL_JOB) == Some(&name)
        })
        .partition(|p| owned(&p.metadata));
    let pod_refs: Vec<&Pod> = pods.iter().map(|p| p.as_ref()).collect();
    let leftovers: Vec<&Pod> = others.iter().map(|p| p.as_ref()).collect();
    let live = ctx.live(job, &pod_refs, &leftovers)?;
    let service = get(
        &ctx.stores.services,
        &namespace,
        resources::service_name(&name),
    );
    let secret = get(
        &ctx.stores.secrets,
        &namespace,
        resources::secret_name(&name),
    );
    let config_map = get(
        &ctx.stores.config_maps,
        &namespace,
        resources::config_map_name(&name),
    );
    let network_policy = ctx
        .stores
        .network_policies
        .as_ref()
        .and_then(|store| get(store, &namespace, resources::network_policy_name(&name)));
    let disruption_budget = get(
        &ctx.stores.disruption_budgets,
        &namespace,
        resources::disruption_budget_name(&name),
    );
    let nodes = ctx.stores.nodes.clone();
    let zones = nodes.clone();
    let node = move |n: &str| observe::node_state(nodes.get(&ObjectRef::new(n)).as_deref());
    let zone = move |n: &str| observe::zone(zones.get(&ObjectRef::new(n)).as_deref());
    let start_event = |p: &Pod| ctx.stores.start_events.get(p);
    let now = (ctx.clock)();
    let decision = {
        let mut l = live.lock();
        let generation = job.metadata.generation;
        let problems = match &l.validated {
            Some((g, p)) if *g == generation && generation.is_some() => p.clone(),
            _ => {
                let p = decide::problems(job);
                l.validated = Some((generation, p.clone()));
                p
            }
        };
        // A pod the cache has shown is no longer expected: from now on its absence is a
        // deletion.
        let seen: std::collections::BTreeSet<(MemberId, u32)> = pod_refs
            .iter()
            .filter_map(|p| observe::member_of(p))
            .collect();
        l.created.retain(|k, _| !seen.contains(k));
        decide(&Inputs {
            job,
            problems: problems.as_deref(),
            pods: &pod_refs,
            node: &node,
            start_event: &start_event,
            zone: &zone,
            service: service.as_deref(),
            secret: secret.as_deref(),
            config_map: config_map.as_deref(),
            config_map_memory: l
                .config_map_memory
                .as_ref()
                .filter(|(version, _)| {
                    config_map
                        .as_ref()
                        .and_then(|c| c.metadata.resource_version.as_ref())
                        == Some(version)
                })
                .map(|(_, memory)| memory),
            network_policy: network_policy.as_deref(),
            disruption_budget: disruption_budget.as_deref(),
            driver: &l.driver,
            created: &l.created,
            key_hex: &l.key_hex,
            settings: &ctx.settings,
            status_written: l.status_written,
            now,
        })
    };
    execute(job, ctx, &live, decision, now).await
}

fn get<K>(store: &Store<K>, namespace: &str, name: String) -> Option<Arc<K>>
where
    K: kube::runtime::reflector::Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    store.get(&ObjectRef::new(&name).within(namespace))
}

/// Perform a decision's writes, then commit the driver's plan and record its events.
async fn execute(
    job: &DecentralizedTrainingJob,
    ctx: &Arc<Context>,
    live: &Arc<Mutex<Live>>,
    mut d: Decision,
    now: Timestamp,
) -> Result<Action, Error> {
    if !ctx.leadership.may_write() {
        return Err(Error::NotLeading);
    }
    let namespace = resources::namespace(job);
    let name = resources::name(job);
    if let Some(service) = &d.service {
        apply_object(ctx, &namespace, service, "service").await?;
    }
    if let Some(uid) = &d.replace_secret {
        let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
        let name = resources::secret_name(&name);
        let only_that_one = DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match secrets.delete(&name, &only_that_one).await {
            Ok(_) => ctx.metrics.wrote("secret", 1),
            // Gone already, or replaced since: nothing of the earlier job's is left to remove.
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(e) => return Err(kube_err("delete the earlier job's", name)(e)),
        }
    }
    if let Some(secret) = &d.secret {
        apply_object(ctx, &namespace, secret, "secret").await?;
    }
    if let Some(policy) = &d.network_policy {
        apply_object(ctx, &namespace, policy, "networkpolicy").await?;
    }
    if let Some(budget) = &d.disruption_budget {
        apply_object(ctx, &namespace, budget, "poddisruptionbudget").await?;
    }
    let (accepted, refused) = write_pods(ctx, &namespace, live, &d, now).await?;
    if !d.create.is_empty() {
        if !refused.is_empty() {
            tracing::warn!(
                refused = refused.len(),
                admitted = accepted.len(),
                reason = %refused[0].2,
                "the API server refuses members' pods; the admitted ones run"
            );
        }
        d.answered(job, &accepted, &refused, now);
    }
    let mut config_map_holds = d.config_map_holds.clone();
    if let Some(config_map) = &d.config_map {
        let written = apply_object(ctx, &namespace, config_map, "configmap").await?;
        config_map_holds = written.metadata.resource_version;
    }
    if let Some(status) = &d.status {
        apply_status(ctx, job, status).await?;
    }
    // Every write above succeeded: this is now the job's memory.
    {
        let mut l = live.lock();
        // Drop expectations the cache has caught up with, or that are stale.
        let grace = ctx.settings.creation_grace.as_secs_f64();
        l.created
            .retain(|_, t| planner::seconds_since(*t, now) < grace);
        l.driver.commit(&d.plan, now);
        if let Some(version) = config_map_holds {
            l.config_map_memory = Some((version, d.plan.memory.clone()));
        }
        if d.status.is_some() {
            l.status_written = Some(now);
        }
    }
    ctx.metrics.observe(&d.plan.view);
    for event in &d.kube_events() {
        let pod = Decision::pod_of(&name, event);
        record_event(ctx, job, event, pod).await;
    }
    if d.delete_job {
        let jobs: Api<DecentralizedTrainingJob> = Api::namespaced(ctx.client.clone(), &namespace);
        match jobs.delete(&name, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(kube_err("delete finished job", name)(e)),
        }
        ctx.metrics.wrote("job_delete", 1);
        return Ok(Action::await_change());
    }
    Ok(Action::requeue(d.requeue))
}

/// Pods created at once, at most: the batches double from one up to this.
const CREATE_BATCH_MAX: usize = 64;

/// The decision's pod writes: create, delete, relabel. Creates go in batches that double from
/// one (as Kubernetes' Job controller starts pods), so a quota or an admission policy that
/// refuses them costs one request, not one per member: after a batch with a refusal the rest
/// are not tried, and count as refused with it. Returns the admitted and the refused
/// (member, attempt[, why]); an error other than a refusal ends the reconcile (kube's client
/// has already retried 429s and 503s with backoff).
async fn write_pods(
    ctx: &Context,
    namespace: &str,
    live: &Mutex<Live>,
    d: &Decision,
    now: Timestamp,
) -> Result<(Vec<(MemberId, u32)>, Vec<(MemberId, u32, String)>), Error> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let m = &ctx.metrics;
    // Created, never applied: an attempt's pod is immutable, and an apply onto one that exists
    // (this reconcile planned it again after a later write failed) with a spec edited meanwhile
    // is a 422 forever. One that exists already is the one this attempt wants.
    let create = PostParams {
        field_manager: Some(ctx.settings.field_manager.clone()),
        ..Default::default()
    };
    let mut accepted = Vec::new();
    let mut refused: Vec<(MemberId, u32, String)> = Vec::new();
    let mut failed = None;
    let mut queue = d
        .create
        .iter()
        .filter_map(|p| Some((observe::member_of(p)?, p)));
    let mut batch = 1;
    while refused.is_empty() && failed.is_none() {
        let chunk: Vec<((MemberId, u32), &Pod)> = queue.by_ref().take(batch).collect();
        if chunk.is_empty() {
            break;
        }
        // Awaited from before the request (the watch may show the pod before the answer
        // comes), and stamped with the answer's time: only a re-list begun after the create
        // was answered can prove the pod gone.
        {
            let mut l = live.lock();
            for (key, _) in &chunk {
                l.created.insert(*key, Timestamp::MAX);
            }
        }
        let answers =
            futures::future::join_all(chunk.iter().map(|(key, pod)| async {
                (*key, pod.name_any(), pods.create(&create, pod).await)
            }))
            .await;
        {
            let answered = (ctx.clock)().max(now);
            let mut l = live.lock();
            for (key, _) in &chunk {
                if let Some(t) = l.created.get_mut(key) {
                    *t = answered;
                }
            }
        }
        for ((member, attempt), object, answer) in answers {
            match answer {
                Ok(_) => {
                    m.wrote("pod", 1);
                    accepted.push((member, attempt));
                }
                Err(kube::Error::Api(e)) if e.code == 409 => accepted.push((member, attempt)),
                Err(kube::Error::Api(e)) if matches!(e.code, 400 | 403 | 422) => {
                    live.lock().created.remove(&(member, attempt));
                    refused.push((member, attempt, format!("{object}: {}", e.message)));
                }
                Err(e) => failed = Some(kube_err("create Pod", object)(e)),
            }
        }
        batch = (batch * 2).min(CREATE_BATCH_MAX);
    }
    if let Some(e) = failed {
        return Err(e);
    }
    if let Some((_, _, why)) = refused.first().cloned() {
        for ((member, attempt), pod) in queue {
            refused.push((
                member,
                attempt,
                format!("{}: not tried after {why}", pod.name_any()),
            ));
        }
    }
    let mut deletes = Vec::new();
    for (object, at_once) in &d.delete {
        let params = DeleteParams {
            grace_period_seconds: at_once.then_some(0),
            propagation_policy: Some(PropagationPolicy::Background),
            ..Default::default()
        };
        let (pods, object) = (pods.clone(), object.clone());
        deletes.push(async move {
            match pods.delete(&object, &params).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
                Err(e) => Err(kube_err("delete Pod", object)(e)),
            }
        });
    }
    m.wrote("pod_delete", at_most_at_once(deletes).await?);
    let mut relabels = Vec::new();
    for (object, clique) in &d.relabel {
        let patch = serde_json::json!({
            "metadata": {"labels": {resources::LABEL_CLIQUE: clique.to_string()}}
        });
        let (pods, object) = (pods.clone(), object.clone());
        relabels.push(async move {
            match pods
                .patch(&object, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
                Err(e) => Err(kube_err("label Pod", object)(e)),
            }
        });
    }
    m.wrote("pod_label", at_most_at_once(relabels).await?);
    Ok((accepted, refused))
}

/// Pod writes in flight at once when many are due (deletes, relabels).
const WRITES_AT_ONCE: usize = 32;

/// Run `writes`, [`WRITES_AT_ONCE`] at a time: how many wrote something (false: nothing to
/// write, e.g. a 404), or the first error once all are done.
async fn at_most_at_once<F>(writes: Vec<F>) -> Result<usize, Error>
where
    F: std::future::Future<Output = Result<bool, Error>>,
{
    use futures::StreamExt;
    let results: Vec<Result<bool, Error>> = futures::stream::iter(writes)
        .buffer_unordered(WRITES_AT_ONCE)
        .collect()
        .await;
    let mut wrote = 0;
    for r in results {
        wrote += usize::from(r?);
    }
    Ok(wrote)
}

/// Server-side apply one of a job's objects (by its own name), counted as a write of `kind`.
async fn apply_object<K>(
    ctx: &Context,
    namespace: &str,
    object: &K,
    kind: &'static str,
) -> Result<K, Error>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned,
{
    let api: Api<K> = Api::namespaced(ctx.client.clone(), namespace);
    let name = object.meta().name.clone().unwrap_or_default();
    let apply = PatchParams::apply(&ctx.settings.field_manager).force();
    let applied = api
        .patch(&name, &apply, &Patch::Apply(object))
        .await
        .map_err(kube_err("apply", format!("{} {name}", K::kind(&()))))?;
    ctx.metrics.wrote(kind, 1);
    Ok(applied)
}

/// Server-side apply of the job's status (its own subresource).
async fn apply_status(
    ctx: &Context,
    job: &DecentralizedTrainingJob,
    status: &murmur_core::api::DecentralizedTrainingJobStatus,
) -> Result<(), Error> {
    let name = resources::name(job);
    let jobs: Api<DecentralizedTrainingJob> =
        Api::namespaced(ctx.client.clone(), &resources::namespace(job));
    let patch = serde_json::json!({
        "apiVersion": DecentralizedTrainingJob::api_version(&()),
        "kind": DecentralizedTrainingJob::kind(&()),
        "status": status,
    });
    let apply = PatchParams::apply(&ctx.settings.field_manager).force();
    jobs.patch_status(&name, &apply, &Patch::Apply(&patch))
        .await
        .map_err(kube_err("apply status of", name))?;
    ctx.metrics.wrote("status", 1);
    Ok(())
}

/// The `reportingController` of every Event the operator writes.
pub const REPORTING_CONTROLLER: &str = "murmur.dev/operator";

/// A job's event as a Kubernetes Event (events.k8s.io/v1) regarding the job and naming the
/// member's pod, through kube-runtime's recorder (a repeat within minutes becomes a series).
/// An event that cannot be written is logged, never fatal: the status API has it already.
async fn record_event(
    ctx: &Context,
    job: &DecentralizedTrainingJob,
    event: &planner::Event,
    pod: Option<String>,
) {
    let namespace = resources::namespace(job);
    let mut note = event.message.clone();
    // The API server refuses notes over 1 kB.
    if note.len() > 1024 {
        let mut cut = 1021;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
        note.push_str("...");
    }
    let reason = event.reason.as_str().to_string();
    let kube_event = KubeEventSpec {
        type_: match event.kind {
            planner::EventKind::Normal => EventType::Normal,
            planner::EventKind::Warning => EventType::Warning,
        },
        action: reason.clone(),
        reason,
        note: Some(note),
        secondary: pod.map(|pod| ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(pod),
            namespace: Some(namespace.clone()),
            ..Default::default()
        }),
    };
    match ctx
        .recorder
        .publish(&kube_event, &job.object_ref(&()))
        .await
    {
        Ok(()) => ctx.metrics.wrote("event", 1),
        Err(e) => {
            ctx.metrics.error("event");
            tracing::warn!(reason = event.reason.as_str(), error = %e, "cannot record event");
        }
    }
}

/// A failed reconcile is retried after a delay that doubles from [`RETRY_FIRST`] with each
/// failure in a row, up to [`RETRY_MAX`] (with jitter), as controller-runtime's rate limiter
/// does; a reconcile that succeeds starts the job's sequence again. Any change to the job or
/// its objects still reconciles it at once.
pub fn error_policy(
    job: Arc<DecentralizedTrainingJob>,
    error: &Error,
    ctx: Arc<Context>,
) -> Action {
    ctx.metrics.error(error.kind());
    let delay = ctx.retry_delay((resources::namespace(&job), resources::name(&job)));
    tracing::warn!(namespace = ?job.namespace(), job = %job.name_any(), error = %error, retry_in = ?delay, "reconcile failed; retrying");
    Action::requeue(delay)
}

/// The first retry of a failed reconcile.
pub const RETRY_FIRST: Duration = Duration::from_secs(1);
/// The longest wait between retries of a job that keeps failing.
pub const RETRY_MAX: Duration = Duration::from_secs(120);

fn retry_delays() -> backon::ExponentialBackoff {
    use backon::BackoffBuilder;
    backon::ExponentialBuilder::default()
        .with_min_delay(RETRY_FIRST)
        .with_max_delay(RETRY_MAX)
        .with_jitter()
        .without_max_times()
        .build()
}

/// How the operator runs.
#[derive(Clone, Debug)]
pub struct OperatorOptions {
    pub settings: Settings,
    /// Where the status router (API, dashboard, control endpoint, metrics) listens.
    pub listen: String,
    /// Observer reads the status router serves per second (0: unpaced).
    pub reads_per_second: u32,
    /// Observers' tokens must be issued for one of these audiences (empty: the API server's).
    pub token_audiences: Vec<String>,
    /// Reconciles of different jobs in flight at once.
    pub concurrency: u16,
    /// Leader election; None runs without (a single replica).
    pub lease: Option<LeaseOptions>,
    pub instance: String,
    /// How long to wait at start-up for the CRD to be Established.
    pub crd_wait: Duration,
    /// The operator's own pod, when it runs in one: labelled while it leads.
    pub pod: Option<PodName>,
}

#[derive(Clone, Debug)]
pub struct PodName {
    pub namespace: String,
    pub name: String,
}

#[derive(Clone, Debug)]
pub struct LeaseOptions {
    pub namespace: String,
    pub name: String,
    pub duration: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error("no Kubernetes configuration (in-cluster service account or kubeconfig): {0}")]
    Config(#[source] kube::Error),
    #[error(transparent)]
    Preflight(#[from] preflight::PreflightError),
    #[error("cannot listen on {address}: {source}")]
    Bind {
        address: String,
        source: std::io::Error,
    },
    #[error("lost the leader lease {0}; exiting so another replica takes over")]
    LostLease(String),
    #[error("cannot label the operator's pod {pod}: {source}")]
    Label { pod: String, source: kube::Error },
}

/// Run the operator until SIGTERM / Ctrl-C (or until it loses its lease).
pub async fn run(options: OperatorOptions) -> Result<(), OperatorError> {
    let client = Client::try_default().await.map_err(OperatorError::Config)?;
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("a SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutting down: finishing reconciles in flight");
    };
    run_with(client, options, shutdown).await
}

/// The operator against `client` until `shutdown` completes.
pub async fn run_with(
    client: Client,
    options: OperatorOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), OperatorError> {
    preflight::check(
        &client,
        options.settings.network_policies.is_some(),
        options.lease.as_ref().map(|l| l.namespace.as_str()),
        options.crd_wait,
    )
    .await?;
    let (hub, metrics) = serve_status(&client, &options).await?;
    // A restarted container keeps its pod's labels: it says it leads only once it does again.
    let label = options.pod.as_ref().map(|pod| {
        lease::LeaderLabel::new(Api::namespaced(client.clone(), &pod.namespace), &pod.name)
    });
    if let Some(label) = &label {
        label
            .set(false)
            .await
            .map_err(|source| OperatorError::Label {
                pod: label.pod().to_string(),
                source,
            })?;
    }

    let elector = options.lease.as_ref().map(|l| {
        lease::Elector::new(
            Api::namespaced(client.clone(), &l.namespace),
            &l.name,
            &options.instance,
            l.duration,
        )
    });
    let leadership = match &elector {
        Some(e) => {
            // Ready while waiting: a rolling update of the operator replaces the leader only
            // once its successor is Ready.
            hub.set_role(Role::Standby);
            e.acquire().await;
            tracing::info!(identity = e.identity(), "leading");
            e.leadership()
        }
        None => Arc::new(lease::Leadership::unelected()),
    };

    let with_policies = options.settings.network_policies.is_some();
    let (stores, writers) = Writers::new(with_policies);
    let jobs = stores.jobs.clone();
    let (ctx, triggered) = Context::new(
        client.clone(),
        stores.stores,
        hub.clone(),
        metrics,
        options.settings.clone(),
        options.instance.clone(),
        leadership,
    );
    // Leading; the Service selects this replica once every cache has listed.
    let caches = ctx.stores.clone();
    let leader_label = label.clone();
    tokio::spawn(async move {
        caches.ready().await;
        if let Some(label) = &leader_label {
            let labelled = || label.set(true);
            let _ = labelled
                .retry(backon::ExponentialBuilder::default().without_max_times())
                .notify(|e, _| tracing::warn!(error = %e, "cannot label this pod as the leader"))
                .await;
        }
        hub.set_role(Role::Leading);
        tracing::info!("caches synced: leading");
    });
    tokio::spawn(sweep_deleted_jobs(
        Arc::downgrade(&ctx),
        jobs.clone(),
        options.settings.resync,
    ));
    let controller = controller(&client, writers, jobs, &ctx, options.concurrency)
        .reconcile_on(futures::stream::unfold(triggered, |mut rx| async move {
            rx.recv().await.map(|r| (r, rx))
        }))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "controller");
            }
        });
    let lost = match &elector {
        Some(e) => {
            tokio::select! {
                _ = controller => false,
                _ = e.keep() => true,
            }
        }
        None => {
            controller.await;
            false
        }
    };
    // Stop being selected by the Service before the next leader can take over.
    if let Some(label) = &label {
        let cleared = tokio::time::timeout(Duration::from_secs(2), label.set(false)).await;
        if !matches!(cleared, Ok(Ok(()))) {
            tracing::warn!("cannot take the leader label off this pod");
        }
    }
    match &elector {
        Some(e) if lost => Err(OperatorError::LostLease(e.identity().to_string())),
        Some(e) => {
            e.release().await;
            Ok(())
        }
        None => Ok(()),
    }
}

/// The status router (API, dashboard, control endpoint, metrics) on `options.listen`, not
/// Ready until it knows whether it leads. The Service selects the leader's pod by its label
/// ([`lease::LeaderLabel`]), so trainers' posts and users reach the replica that runs the jobs.
/// Observers are whom the cluster says they are, and read what RBAC lets them `get`
/// ([`access`]).
async fn serve_status(
    client: &Client,
    options: &OperatorOptions,
) -> Result<(Arc<Hub>, Arc<OperatorMetrics>), OperatorError> {
    let mut hub = Hub::default();
    let metrics = Arc::new(OperatorMetrics::register(&mut hub.metrics.registry));
    let hub = Arc::new(hub);
    hub.set_role(Role::Starting);
    let listener = crate::status::listen(&options.listen)
        .await
        .map_err(|source| OperatorError::Bind {
            address: options.listen.clone(),
            source,
        })?;
    tracing::info!(address = %options.listen, "status API, dashboard and control endpoint listening");
    tokio::spawn(crate::status::serve(
        listener,
        crate::status::router(
            hub.clone(),
            Arc::new(access::ClusterAccess::new(
                client.clone(),
                options.token_audiences.clone(),
            )),
            options.reads_per_second,
        ),
    ));
    Ok((hub, metrics))
}

/// The watch caches and the writers that fill them.
struct Writers {
    pods: reflector::store::Writer<Pod>,
    services: reflector::store::Writer<Service>,
    config_maps: reflector::store::Writer<ConfigMap>,
    secrets: reflector::store::Writer<Secret>,
    nodes: reflector::store::Writer<Node>,
    jobs: reflector::store::Writer<DecentralizedTrainingJob>,
    network_policies: Option<reflector::store::Writer<NetworkPolicy>>,
    disruption_budgets: reflector::store::Writer<PodDisruptionBudget>,
}

struct AllStores {
    stores: Stores,
    jobs: Store<DecentralizedTrainingJob>,
}

impl Writers {
    fn new(with_policies: bool) -> (AllStores, Self) {
        let (pods, pod_writer) = reflector::store();
        let (services, service_writer) = reflector::store();
        let (config_maps, config_map_writer) = reflector::store();
        let (secrets, secret_writer) = reflector::store();
        let (nodes, node_writer) = reflector::store();
        let (jobs, job_writer) = reflector::store();
        let (network_policies, network_policy_writer) = reflector::store();
        let (disruption_budgets, disruption_budget_writer) = reflector::store();
        let stores = AllStores {
            stores: Stores {
                pods,
                services,
                config_maps,
                secrets,
                nodes,
                network_policies: with_policies.then_some(network_policies),
                disruption_budgets,
                start_events: Default::default(),
                listed: Default::default(),
            },
            jobs,
        };
        let writers = Self {
            pods: pod_writer,
            services: service_writer,
            config_maps: config_map_writer,
            secrets: secret_writer,
            nodes: node_writer,
            jobs: job_writer,
            network_policies: with_policies.then_some(network_policy_writer),
            disruption_budgets: disruption_budget_writer,
        };
        (stores, writers)
    }
}

/// The controller over every watch: jobs (only spec changes wake it: its own status writes
/// change no generation), the objects it owns, and nodes (a node that goes away or NotReady
/// re-plans the jobs with members on it).
fn controller(
    client: &Client,
    w: Writers,
    jobs: Store<DecentralizedTrainingJob>,
    ctx: &Arc<Context>,
    concurrency: u16,
) -> Controller<DecentralizedTrainingJob> {
    let managed = watcher::Config::default().labels(resources::MANAGED_SELECTOR);
    let job_stream = decoded_jobs(client, &jobs, ctx)
        .reflect(w.jobs)
        .applied_objects()
        .predicate_filter(predicates::generation, Default::default());
    let mut controller = Controller::for_stream(job_stream, jobs)
        .with_config(ControllerConfig::default().concurrency(concurrency))
        .owns_stream({
            // A pod the watch has shown is no longer an expectation, even if it is gone before
            // any reconcile saw it in the cache (a force deletion right after creation).
            // A re-list (after the watch was down long enough to lose its place) settles the
            // rest: what it lacks is gone.
            let seen = Arc::downgrade(ctx);
            let listed = Arc::downgrade(ctx);
            let mut listing_since = None;
            owned_with(
                client,
                &managed,
                w.pods,
                observe::keep_what_is_read_of_pod,
                move |event| {
                    let Some(ctx) = listed.upgrade() else { return };
                    match event {
                        watcher::Event::Init => listing_since = Some((ctx.clock)()),
                        watcher::Event::InitDone => {
                            if let Some(since) = listing_since.take() {
                                ctx.pods_listed(since);
                            }
                        }
                        _ => {}
                    }
                },
            )
            .inspect_ok(move |pod| {
                if let Some(ctx) = seen.upgrade() {
                    ctx.pod_seen(pod);
                }
            })
        })
        .owns_stream(owned(client, &managed, w.services))
        .owns_stream(owned(client, &managed, w.config_maps))
        .owns_stream(owned(client, &managed, w.secrets))
        .owns_stream(owned(client, &managed, w.disruption_budgets));
    if let Some(writer) = w.network_policies {
        controller = controller.owns_stream(owned(client, &managed, writer));
    }
    // Nodes cached as what the operator reads of them, and only a change of that wakes the
    // jobs on a node: a kubelet's heartbeat (every node, every few seconds) does not.
    let node_stream = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .modify(observe::keep_what_is_read_of_node)
        .reflect(w.nodes)
        .touched_objects()
        .predicate_filter(observe::node_news, Default::default());
    let pods = ctx.stores.pods.clone();
    // A pod's event of interest wakes the pod's job.
    let job_of_event = move |event: k8s_openapi::api::core::v1::Event| {
        let pod = &event.involved_object;
        let namespace = pod.namespace.as_deref()?;
        let pod = pods.get(&ObjectRef::new(pod.name.as_deref()?).within(namespace))?;
        let job = pod.labels().get(resources::LABEL_JOB)?;
        Some(ObjectRef::new(job).within(namespace))
    };
    let index = ctx.stores.start_events.clone();
    let start_event_stream = watcher(
        Api::<k8s_openapi::api::core::v1::Event>::all(client.clone()),
        watcher::Config::default().fields(start_events::FIELD_SELECTOR),
    )
    .default_backoff()
    .filter_map(move |event| {
        futures::future::ready(match event {
            Ok(e) => index.apply(&e),
            Err(e) => Some(Err(e)),
        })
    });
    controller = controller.watches_stream(start_event_stream, job_of_event);
    let pods = ctx.stores.pods.clone();
    let jobs_on_node = move |node: Node| {
        let node = node.name_any();
        let jobs: std::collections::HashSet<ObjectRef<DecentralizedTrainingJob>> = pods
            .state()
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&node))
            .filter_map(|p| {
                let job = p.labels().get(resources::LABEL_JOB)?;
                Some(ObjectRef::new(job).within(&p.namespace()?))
            })
            .collect();
        jobs
    };
    controller.watches_stream(node_stream, jobs_on_node)
}

/// The jobs as watch events, each decoded on its own: the watch reads them untyped, so one job
/// stored under a looser (older) CRD that the types cannot decode costs only itself — an event
/// and a log name it and its field, and the operator leaves it alone (were it known before, it
/// is dropped as if deleted) — instead of failing the whole list and every job's reconcile.
fn decoded_jobs(
    client: &Client,
    jobs: &Store<DecentralizedTrainingJob>,
    ctx: &Context,
) -> impl futures::Stream<Item = Result<watcher::Event<DecentralizedTrainingJob>, watcher::Error>>
+ Send
+ 'static {
    use kube::core::{ApiResource, DynamicObject};
    let resource = ApiResource::erase::<DecentralizedTrainingJob>(&());
    let api = Api::<DynamicObject>::all_with(client.clone(), &resource);
    let known = jobs.clone();
    let recorder = ctx.recorder.clone();
    let reported = Arc::new(Mutex::new(std::collections::HashSet::<String>::new()));
    watcher(api, watcher::Config::default())
        .default_backoff()
        .filter_map(move |event| {
            let decoded = event.map(|event| {
                decode_event(event, &known, &|object, error| {
                    report_undecodable(&recorder, &reported, object, error)
                })
            });
            futures::future::ready(decoded.transpose())
        })
}

/// One watch event of untyped jobs, typed: an object that does not decode is reported and
/// either left out or, when the cache knew it, turned into its deletion.
fn decode_event(
    event: watcher::Event<kube::core::DynamicObject>,
    known: &Store<DecentralizedTrainingJob>,
    report: &dyn Fn(&kube::core::DynamicObject, &murmur_core::api::ManifestError),
) -> Option<watcher::Event<DecentralizedTrainingJob>> {
    use watcher::Event as E;
    // Decoded, or reported and None.
    let decode = |object: &kube::core::DynamicObject| {
        let origin = format!(
            "{}/{}",
            object.metadata.namespace.as_deref().unwrap_or_default(),
            object.metadata.name.as_deref().unwrap_or_default()
        );
        let value = serde_json::to_value(object).unwrap_or_default();
        murmur_core::api::decode_job(value, &origin)
            .map_err(|e| report(object, &e))
            .ok()
    };
    // What the cache knew of it: dropped as if deleted once it cannot be read.
    let previous = |object: &kube::core::DynamicObject| {
        let name = object.metadata.name.as_deref()?;
        let namespace = object.metadata.namespace.as_deref()?;
        known
            .get(&ObjectRef::new(name).within(namespace))
            .map(|k| E::Delete(k.as_ref().clone()))
    };
    match event {
        E::Init => Some(E::Init),
        E::InitDone => Some(E::InitDone),
        E::InitApply(o) => decode(&o).map(E::InitApply),
        E::Apply(o) => decode(&o).map(E::Apply).or_else(|| previous(&o)),
        E::Delete(o) => decode(&o).map(E::Delete).or_else(|| previous(&o)),
    }
}

/// Say once per object version that it cannot be decoded: a log line and a Warning Event
/// regarding it, naming the field.
fn report_undecodable(
    recorder: &Recorder,
    reported: &Mutex<std::collections::HashSet<String>>,
    object: &kube::core::DynamicObject,
    error: &murmur_core::api::ManifestError,
) {
    let version = format!(
        "{}/{}",
        object.metadata.uid.as_deref().unwrap_or_default(),
        object
            .metadata
            .resource_version
            .as_deref()
            .unwrap_or_default()
    );
    if !reported.lock().insert(version) {
        return;
    }
    tracing::warn!(error = %error, "a DecentralizedTrainingJob cannot be decoded; leaving it alone");
    let reference = ObjectReference {
        api_version: Some(DecentralizedTrainingJob::api_version(&()).to_string()),
        kind: Some(DecentralizedTrainingJob::kind(&()).to_string()),
        name: object.metadata.name.clone(),
        namespace: object.metadata.namespace.clone(),
        uid: object.metadata.uid.clone(),
        ..Default::default()
    };
    let event = KubeEventSpec {
        type_: EventType::Warning,
        reason: planner::Reason::Undecodable.as_str().into(),
        action: planner::Reason::Undecodable.as_str().into(),
        note: Some(format!(
            "the operator cannot read this job, so it leaves it alone: {error}; fix the field or recreate the job"
        )),
        secondary: None,
    };
    let recorder = recorder.clone();
    tokio::spawn(async move {
        if let Err(e) = recorder.publish(&event, &reference).await {
            tracing::warn!(error = %e, "cannot record the Undecodable event");
        }
    });
}

/// A kind of object the operator owns and watches.
trait OwnedKind:
    Resource<DynamicType = ()>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + Send
    + Sync
    + 'static
{
}

impl<K> OwnedKind for K where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static
{
}

/// The watch of one kind of object the operator owns, filling its cache.
fn owned<K: OwnedKind>(
    client: &Client,
    managed: &watcher::Config,
    writer: reflector::store::Writer<K>,
) -> impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static {
    owned_with(client, managed, writer, |_| {}, |_| {})
}

/// [`owned`], with each object trimmed to what is read (managed fields are always dropped),
/// and `on_event` shown each watch event before the cache applies it.
fn owned_with<K: OwnedKind>(
    client: &Client,
    managed: &watcher::Config,
    writer: reflector::store::Writer<K>,
    mut trim: impl FnMut(&mut K) + Send + 'static,
    mut on_event: impl FnMut(&watcher::Event<K>) + Send + 'static,
) -> impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static {
    // Touched, not applied: a deleted (or force-deleted) child wakes its job at once; with
    // applied objects only, it waited for the next resync.
    watcher(Api::<K>::all(client.clone()), managed.clone())
        .default_backoff()
        .modify(move |o| {
            o.meta_mut().managed_fields = None;
            trim(o);
        })
        .inspect_ok(move |event| on_event(event))
        .reflect(writer)
        .touched_objects()
}

/// Forget jobs deleted behind the operator's back, once per resync.
async fn sweep_deleted_jobs(
    ctx: std::sync::Weak<Context>,
    jobs: Store<DecentralizedTrainingJob>,
    every: Duration,
) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let Some(ctx) = ctx.upgrade() else { return };
        ctx.forget_deleted(|ns, name| jobs.get(&ObjectRef::new(name).within(ns)).is_some());
    }
}
