//! The Kubernetes runtime (`murmur operator`): a kube-rs controller that reconciles each
//! DecentralizedTrainingJob into pods, a headless Service, the peer-key Secret and the topology
//! ConfigMap. `reconcile` gathers inputs from the watch caches, calls the pure [`decide`] (which
//! calls the same planner as `murmur run`) and performs the writes; the same status router as
//! `murmur run` serves the API, the dashboard and the trainers' control endpoint.

pub mod decide;
pub mod lease;
mod metrics;
pub mod observe;
pub mod preflight;
pub mod resources;
pub mod scheduling;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node, ObjectReference, Pod, Secret, Service};
use k8s_openapi::api::events::v1::Event as KubeEvent;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, predicates, watcher};
use kube::{Client, Resource, ResourceExt};
use murmur_core::api::DecentralizedTrainingJob;
use murmur_core::contract::TrainerStatus;
use murmur_core::topology::MemberId;
use tokio::sync::mpsc;

pub use decide::{Decision, Inputs, Persisted, decide};
pub use metrics::OperatorMetrics;
pub use resources::Settings;

use crate::planner;
use crate::status::{Hub, Inbound, JobEvent, JobHandle};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{action} {object}: {source}")]
    Kube {
        action: &'static str,
        object: String,
        source: kube::Error,
    },
    #[error(transparent)]
    Persisted(#[from] decide::PersistError),
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
            Error::Persisted(_) => "persisted_state",
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
}

impl Stores {
    /// Wait until every cache holds a complete list: before that, a missing Secret would get a
    /// new key and every node would look gone.
    pub async fn ready(&self) {
        let _ = futures::join!(
            self.pods.wait_until_ready(),
            self.services.wait_until_ready(),
            self.config_maps.wait_until_ready(),
            self.secrets.wait_until_ready(),
            self.nodes.wait_until_ready(),
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
    memory: Persisted,
    key_hex: String,
    handle: Arc<JobHandle>,
    statuses: BTreeMap<MemberId, (u32, TrainerStatus)>,
    created: BTreeMap<(MemberId, u32), Timestamp>,
    published_version: u64,
    /// The spec's validation result for a generation (CEL evaluation is not free).
    validated: Option<(Option<i64>, Option<String>)>,
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
    jobs: Mutex<HashMap<JobKey, Arc<Mutex<Live>>>>,
    /// Reconcile a job now (a trainer joined).
    trigger: mpsc::UnboundedSender<ObjectRef<DecentralizedTrainingJob>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Context {
    pub fn new(
        client: Client,
        stores: Stores,
        hub: Arc<Hub>,
        metrics: Arc<OperatorMetrics>,
        settings: Settings,
        instance: String,
    ) -> (
        Arc<Self>,
        mpsc::UnboundedReceiver<ObjectRef<DecentralizedTrainingJob>>,
    ) {
        let (trigger, triggered) = mpsc::unbounded_channel();
        let ctx = Arc::new(Self {
            client,
            stores,
            hub,
            metrics,
            settings,
            instance,
            clock: Arc::new(Timestamp::now),
            jobs: Mutex::default(),
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
            jobs: Mutex::new(lock(&self.jobs).clone()),
            trigger: self.trigger.clone(),
        })
    }

    /// The job's live record: created on its first reconcile in this process, from its
    /// ConfigMap and Secret when they exist (an operator restart), registering it with the hub.
    fn live(
        self: &Arc<Self>,
        job: &DecentralizedTrainingJob,
        pods: &[&Pod],
    ) -> Result<Arc<Mutex<Live>>, Error> {
        let key = (resources::namespace(job), resources::name(job));
        let uid = job.uid().unwrap_or_default();
        if let Some(live) = lock(&self.jobs).get(&key)
            && lock(live).uid == uid
        {
            return Ok(live.clone());
        }
        let config_map = self
            .stores
            .config_maps
            .get(&ObjectRef::new(&resources::config_map_name(&key.1)).within(&key.0));
        let memory = Persisted::load(job, config_map.as_deref(), pods)?;
        let secret = self
            .stores
            .secrets
            .get(&ObjectRef::new(&resources::secret_name(&key.1)).within(&key.0));
        let key_hex = secret
            .as_ref()
            .and_then(|s| s.data.as_ref()?.get(resources::SECRET_KEY).cloned())
            .and_then(|b| String::from_utf8(b.0).ok())
            .unwrap_or_else(super::new_job_key);
        let (handle, inbox) = self
            .hub
            .register(&key.0, &key.1, key_hex.clone().into_bytes());
        let live = Arc::new(Mutex::new(Live {
            uid,
            memory,
            key_hex,
            handle,
            statuses: BTreeMap::new(),
            created: BTreeMap::new(),
            published_version: 0,
            validated: None,
        }));
        lock(&self.jobs).insert(key.clone(), live.clone());
        tokio::spawn(listen(
            Arc::downgrade(self),
            Arc::downgrade(&live),
            key,
            inbox,
        ));
        Ok(live)
    }

    fn forget(&self, namespace: &str, name: &str) {
        lock(&self.jobs).remove(&(namespace.to_string(), name.to_string()));
        self.hub.forget(namespace, name);
        self.metrics.forget(namespace, name);
    }

    /// Forget jobs that are gone from the cluster (deleted without the operator seeing a
    /// deletion timestamp: there is no finalizer, so deletion never waits for the operator).
    pub fn forget_deleted(&self, exists: impl Fn(&str, &str) -> bool) -> usize {
        let gone: Vec<JobKey> = lock(&self.jobs)
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

/// What a job's trainers post: join reports go into the job's memory (and so into its
/// ConfigMap) and trigger a reconcile; statuses feed the status API.
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
        let mut l = lock(&live);
        let attempt_of = |l: &Live, id| l.memory.state.members.get(&id).map(|r| r.attempt);
        match message {
            Inbound::Join(report) => {
                let id = report.member_id;
                let Some(attempt) = attempt_of(&l, id) else {
                    continue;
                };
                l.memory
                    .joins
                    .insert(id, decide::StoredJoin { attempt, report });
                drop(l);
                let _ = ctx.trigger.send(ObjectRef::new(&key.1).within(&key.0));
            }
            Inbound::Status(status) => {
                let id = status.member_id;
                let Some(attempt) = attempt_of(&l, id) else {
                    continue;
                };
                let t = planner::seconds_since(l.memory.state.created_at, Timestamp::now());
                l.handle.sample(t, attempt, &status);
                // A member that starts training, pauses, leaves or finishes changes the job's
                // phase: reconcile now rather than at the next resync.
                let changed = l
                    .statuses
                    .get(&id)
                    .is_none_or(|(a, s)| *a != attempt || s.state != status.state);
                l.statuses.insert(id, (attempt, status));
                drop(l);
                if changed {
                    let _ = ctx.trigger.send(ObjectRef::new(&key.1).within(&key.0));
                }
            }
            Inbound::PeerEvent(e) => {
                tracing::debug!(namespace = %key.0, job = %key.1, member = e.member_id, peer = e.peer, reason = e.reason.as_str(), "peer event");
            }
        }
    }
}

/// One reconcile of one job.
pub async fn reconcile(
    job: Arc<DecentralizedTrainingJob>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let started = Instant::now();
    let result = reconcile_inner(&job, &ctx).await;
    let outcome = match &result {
        Ok(_) => "ok",
        Err(e) => e.kind(),
    };
    ctx.metrics
        .reconciled(started.elapsed().as_secs_f64(), outcome);
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
    ctx.stores.ready().await;
    let uid = job.uid().unwrap_or_default();
    let owned = |meta: &ObjectMeta| {
        meta.namespace.as_deref() == Some(namespace.as_str())
            && meta.owner_references.iter().flatten().any(|o| o.uid == uid)
    };
    let pods: Vec<Arc<Pod>> = ctx
        .stores
        .pods
        .state()
        .into_iter()
        .filter(|p| owned(&p.metadata))
        .collect();
    let pod_refs: Vec<&Pod> = pods.iter().map(|p| p.as_ref()).collect();
    let live = ctx.live(job, &pod_refs)?;
    let (memory, statuses, created, key_hex, problems) = {
        let mut l = lock(&live);
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
        (
            l.memory.clone(),
            l.statuses.clone(),
            l.created.clone(),
            l.key_hex.clone(),
            problems,
        )
    };
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
    let nodes = ctx.stores.nodes.clone();
    let node = move |n: &str| observe::node_state(nodes.get(&ObjectRef::new(n)).as_deref());
    let now = (ctx.clock)();
    let decision = decide(&Inputs {
        job,
        problems: problems.as_deref(),
        pods: &pod_refs,
        node: &node,
        service: service.as_deref(),
        secret: secret.as_deref(),
        config_map: config_map.as_deref(),
        network_policy: network_policy.as_deref(),
        memory: &memory,
        statuses: &statuses,
        created: &created,
        key_hex: &key_hex,
        settings: &ctx.settings,
        now,
    });
    execute(job, ctx, &live, decision, now).await
}

fn get<K>(store: &Store<K>, namespace: &str, name: String) -> Option<Arc<K>>
where
    K: kube::runtime::reflector::Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    store.get(&ObjectRef::new(&name).within(namespace))
}

/// Perform a decision's writes, then remember and publish it.
async fn execute(
    job: &DecentralizedTrainingJob,
    ctx: &Arc<Context>,
    live: &Arc<Mutex<Live>>,
    d: Decision,
    now: Timestamp,
) -> Result<Action, Error> {
    let namespace = resources::namespace(job);
    let name = resources::name(job);
    let apply = PatchParams::apply(&ctx.settings.field_manager).force();
    let client = &ctx.client;
    let m = &ctx.metrics;
    if let Some(service) = &d.service {
        apply_object(ctx, &namespace, service, "service").await?;
    }
    if let Some(secret) = &d.secret {
        apply_object(ctx, &namespace, secret, "secret").await?;
    }
    if let Some(policy) = &d.network_policy {
        apply_object(ctx, &namespace, policy, "networkpolicy").await?;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    for pod in &d.create {
        let object = pod.name_any();
        if let Some((member, attempt)) = observe::member_of(pod) {
            lock(live).created.insert((member, attempt), now);
        }
        pods.patch(&object, &apply, &Patch::Apply(pod))
            .await
            .map_err(kube_err("create Pod", object))?;
        m.wrote("pod", 1);
    }
    for (object, at_once) in &d.delete {
        let params = DeleteParams {
            grace_period_seconds: at_once.then_some(0),
            propagation_policy: Some(PropagationPolicy::Background),
            ..Default::default()
        };
        match pods.delete(object, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(kube_err("delete Pod", object.clone())(e)),
        }
        m.wrote("pod_delete", 1);
    }
    for (object, clique) in &d.relabel {
        let patch = serde_json::json!({
            "metadata": {"labels": {resources::LABEL_CLIQUE: clique.map(|c| c.to_string())}}
        });
        match pods
            .patch(object, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(kube_err("label Pod", object.clone())(e)),
        }
        m.wrote("pod_label", 1);
    }
    if let Some(config_map) = &d.config_map {
        apply_object(ctx, &namespace, config_map, "configmap").await?;
    }
    let jobs: Api<DecentralizedTrainingJob> = Api::namespaced(client.clone(), &namespace);
    if let Some(status) = &d.status {
        let patch = serde_json::json!({
            "apiVersion": DecentralizedTrainingJob::api_version(&()),
            "kind": DecentralizedTrainingJob::kind(&()),
            "status": status,
        });
        jobs.patch_status(&name, &apply, &Patch::Apply(&patch))
            .await
            .map_err(kube_err("apply status of", name.clone()))?;
        m.wrote("status", 1);
    }
    // Every write above succeeded: this is now the job's memory.
    let handle = {
        let mut l = lock(live);
        if let Some(memory) = &d.memory {
            l.memory.state = memory.state.clone();
        }
        // Drop expectations the cache has caught up with, or that are stale.
        let grace = ctx.settings.creation_grace.as_secs_f64();
        l.created
            .retain(|_, t| planner::seconds_since(*t, now) < grace);
        if let Some(doc) = &d.document
            && doc.version > l.published_version
        {
            l.published_version = doc.version;
            l.handle.set_topology(doc.clone());
        }
        l.handle.clone()
    };
    for note in &d.events {
        record_event(ctx, job, &handle, note, now).await;
    }
    if let Some(view) = d.view {
        ctx.metrics.observe(&view);
        ctx.hub.publish(&handle, view);
    }
    if d.delete_job {
        match jobs.delete(&name, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(kube_err("delete finished job", name)(e)),
        }
        m.wrote("job_delete", 1);
        return Ok(Action::await_change());
    }
    Ok(Action::requeue(d.requeue))
}

/// Server-side apply one of a job's objects (by its own name), counted as a write of `kind`.
async fn apply_object<K>(
    ctx: &Context,
    namespace: &str,
    object: &K,
    kind: &'static str,
) -> Result<(), Error>
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
    api.patch(&name, &apply, &Patch::Apply(object))
        .await
        .map_err(kube_err("apply", format!("{} {name}", K::kind(&()))))?;
    ctx.metrics.wrote(kind, 1);
    Ok(())
}

/// A Kubernetes Event (events.k8s.io/v1) on the job, naming the member's pod, and the same
/// event on the status API. An event that cannot be written is logged, never fatal.
async fn record_event(
    ctx: &Context,
    job: &DecentralizedTrainingJob,
    handle: &JobHandle,
    note: &decide::Note,
    now: Timestamp,
) {
    let namespace = resources::namespace(job);
    let type_ = note.kind.as_str();
    let created = job
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(now, |t| t.0);
    handle.push_event(JobEvent::new(
        note.kind,
        note.reason,
        note.member,
        note.message.clone(),
        created,
        now,
    ));
    static SEQUENCE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let sequence = SEQUENCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut message = note.message.clone();
    if message.len() > 1024 {
        let mut cut = 1021;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
        message.push_str("...");
    }
    let event = KubeEvent {
        metadata: ObjectMeta {
            name: Some(format!(
                "{}.{:x}{:04x}",
                resources::name(job),
                now.as_nanosecond(),
                sequence % 0x10000
            )),
            namespace: Some(namespace.clone()),
            ..Default::default()
        },
        event_time: Some(MicroTime(now)),
        action: Some(note.reason.into()),
        reason: Some(note.reason.into()),
        note: Some(message),
        type_: Some(type_.into()),
        regarding: Some(job.object_ref(&())),
        related: note.pod.as_ref().map(|pod| ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(pod.clone()),
            namespace: Some(namespace.clone()),
            ..Default::default()
        }),
        reporting_controller: Some("murmur.dev/operator".into()),
        reporting_instance: Some(ctx.instance.clone()),
        ..Default::default()
    };
    let api: Api<KubeEvent> = Api::namespaced(ctx.client.clone(), &namespace);
    match api.create(&PostParams::default(), &event).await {
        Ok(_) => ctx.metrics.wrote("event", 1),
        Err(e) => {
            ctx.metrics.error("event");
            tracing::warn!(namespace = %namespace, job = %resources::name(job), reason = note.reason, error = %e, "cannot record event");
        }
    }
}

pub fn error_policy(
    job: Arc<DecentralizedTrainingJob>,
    error: &Error,
    ctx: Arc<Context>,
) -> Action {
    ctx.metrics.error(error.kind());
    tracing::warn!(namespace = ?job.namespace(), job = %job.name_any(), error = %error, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

/// How the operator runs.
#[derive(Clone, Debug)]
pub struct OperatorOptions {
    pub settings: Settings,
    /// Where the status router (API, dashboard, control endpoint, metrics) listens.
    pub listen: String,
    /// Observer reads the status router serves per second (0: unpaced).
    pub reads_per_second: u32,
    /// Reconciles of different jobs in flight at once.
    pub concurrency: u16,
    /// Leader election; None runs without (a single replica).
    pub lease: Option<LeaseOptions>,
    pub instance: String,
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
    preflight::check(&client, options.settings.network_policies.is_some()).await?;

    let mut hub = Hub::default();
    let metrics = Arc::new(OperatorMetrics::register(&mut hub.metrics.registry));
    let hub = Arc::new(hub);
    // Not Ready until leading with complete caches: the Service then sends trainers' posts and
    // users to the replica that runs the jobs, not to a standby.
    hub.set_standby(true);
    let listener = tokio::net::TcpListener::bind(&options.listen)
        .await
        .map_err(|source| OperatorError::Bind {
            address: options.listen.clone(),
            source,
        })?;
    tracing::info!(address = %options.listen, "status API, dashboard and control endpoint listening");
    tokio::spawn(
        axum::serve(
            listener,
            crate::status::router(hub.clone(), options.reads_per_second),
        )
        .into_future(),
    );
    let ready_hub = hub.clone();

    let elector = options.lease.as_ref().map(|l| {
        lease::Elector::new(
            Api::namespaced(client.clone(), &l.namespace),
            &l.name,
            &options.instance,
            l.duration,
        )
    });
    if let Some(e) = &elector {
        e.acquire().await;
        tracing::info!(identity = e.identity(), "leading");
    }

    let managed = watcher::Config::default().labels(resources::MANAGED_SELECTOR);
    let (pods, pod_writer) = reflector::store();
    let (services, service_writer) = reflector::store();
    let (config_maps, config_map_writer) = reflector::store();
    let (secrets, secret_writer) = reflector::store();
    let (nodes, node_writer) = reflector::store();
    let (jobs, job_writer) = reflector::store();
    let (network_policies, network_policy_writer) = reflector::store();
    let with_policies = options.settings.network_policies.is_some();
    let stores = Stores {
        pods: pods.clone(),
        services,
        config_maps,
        secrets,
        nodes,
        network_policies: with_policies.then_some(network_policies),
    };
    let (ctx, triggered) = Context::new(
        client.clone(),
        stores,
        hub,
        metrics,
        options.settings.clone(),
        options.instance.clone(),
    );
    let all = |c: &Client| Api::<Pod>::all(c.clone());
    let pod_stream = watcher(all(&client), managed.clone())
        .default_backoff()
        .reflect(pod_writer)
        .applied_objects();
    let service_stream = watcher(Api::<Service>::all(client.clone()), managed.clone())
        .default_backoff()
        .reflect(service_writer)
        .applied_objects();
    let config_map_stream = watcher(Api::<ConfigMap>::all(client.clone()), managed.clone())
        .default_backoff()
        .reflect(config_map_writer)
        .applied_objects();
    let secret_stream = watcher(Api::<Secret>::all(client.clone()), managed.clone())
        .default_backoff()
        .reflect(secret_writer)
        .applied_objects();
    let network_policy_stream = with_policies.then(|| {
        watcher(Api::<NetworkPolicy>::all(client.clone()), managed)
            .default_backoff()
            .reflect(network_policy_writer)
            .applied_objects()
    });
    // A node that goes away or NotReady re-plans the jobs with members on it.
    let node_stream = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(node_writer)
        .touched_objects();
    let pods_for_nodes = pods.clone();
    let jobs_on_node = move |node: Node| {
        let node = node.name_any();
        let jobs: std::collections::HashSet<ObjectRef<DecentralizedTrainingJob>> = pods_for_nodes
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
    // Our own status writes change no generation: they do not wake the controller again.
    let job_stream = watcher(
        Api::<DecentralizedTrainingJob>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(job_writer)
    .applied_objects()
    .predicate_filter(predicates::generation, Default::default());
    let triggered = futures::stream::unfold(triggered, |mut rx| async move {
        rx.recv().await.map(|r| (r, rx))
    });

    // Leading (the elector returned above); Ready once every cache has listed.
    let stores = ctx.stores.clone();
    tokio::spawn(async move {
        stores.ready().await;
        ready_hub.set_standby(false);
        tracing::info!("caches synced: ready");
    });
    let sweep = {
        let (ctx, jobs) = (Arc::downgrade(&ctx), jobs.clone());
        let every = options.settings.resync;
        async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                let Some(ctx) = ctx.upgrade() else { return };
                ctx.forget_deleted(|ns, name| jobs.get(&ObjectRef::new(name).within(ns)).is_some());
            }
        }
    };
    tokio::spawn(sweep);
    let mut controller = Controller::for_stream(job_stream, jobs)
        .with_config(
            ControllerConfig::default()
                .concurrency(options.concurrency)
                .debounce(Duration::from_millis(500)),
        )
        .owns_stream(pod_stream)
        .owns_stream(service_stream)
        .owns_stream(config_map_stream)
        .owns_stream(secret_stream);
    if let Some(stream) = network_policy_stream {
        controller = controller.owns_stream(stream);
    }
    let controller = controller
        .watches_stream(node_stream, jobs_on_node)
        .reconcile_on(triggered)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "controller");
            }
        });
    match &elector {
        Some(e) => {
            tokio::select! {
                _ = controller => Ok(()),
                _ = e.keep() => Err(OperatorError::LostLease(e.identity().to_string())),
            }
        }
        None => {
            controller.await;
            Ok(())
        }
    }
}
