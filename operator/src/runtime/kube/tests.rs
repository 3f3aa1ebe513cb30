//! The controller against a mocked API server (kube-rs `tower-test`): every request reconcile
//! makes is answered and logged, and a miniature cluster feeds what was written back into the
//! watch caches, so scenarios run reconcile after reconcile the way a cluster would.

use super::cached_pod::CachedPod;
use super::context::Live;
use super::observe::tests::exited as terminated;
use super::*;
use crate::planner;
use crate::status::{Hub, Inbound};
use http::{Request, Response};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret, Service};
use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus, PodCondition, PodStatus};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::client::Body;
use kube::runtime::controller::Action;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher::Event;
use kube::{Client, Resource};
use murmur_core::api::DecentralizedTrainingJob;
use murmur_core::api::{DecentralizedTrainingJobStatus, parse_manifest};
use murmur_core::contract::JoinReport;
use parking_lot::Mutex;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

const MANIFEST: &str = "\
apiVersion: murmur.dev/v1alpha1
kind: DecentralizedTrainingJob
metadata: {name: mnist, namespace: ml}
spec:
  replicas: {min: 2, target: 4, max: 4}
  topology: {kind: dCliques, cliqueSize: 2}
  algorithm: {kind: cliqueAveraging}
  training: {model: mlp, partition: {kind: classesPerMember, k: 5}, steps: 100}
  trainer: {backend: cuda, resources: {gpus: 1, cpu: '2', memory: 4Gi}, env: [{name: EXTRA, value: x}, {name: MURMUR_JOB, value: hijack}]}
  scheduling:
    capacity: spot
    fallbackToOnDemandAfter: 120s
    nodeSelector: {pool: training}
  recovery: {maxRestarts: 2, backoff: 10s}
  checkpoint: {everySteps: 50}
";

#[derive(Clone, Debug)]
struct Call {
    method: String,
    path: String,
    query: String,
    content_type: String,
    body: Value,
    /// The status code it was answered with.
    code: u16,
}

type Permission = (String, String, String);

impl Call {
    fn permissions(&self) -> Vec<Permission> {
        preflight::permissions_of(&self.method, &self.path, &self.query, &self.content_type)
    }
}

/// Everything the operator declares it may do, network policies included.
fn declared() -> std::collections::BTreeSet<Permission> {
    preflight::PERMISSIONS
        .iter()
        .chain(preflight::NETWORK_POLICY_PERMISSIONS)
        .map(|(v, g, r)| (v.to_string(), g.to_string(), r.to_string()))
        .collect()
}

impl Call {
    fn is(&self, method: &str, path_contains: &str) -> bool {
        self.method == method && self.path.contains(path_contains)
    }
}

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

/// A miniature cluster around the controller.
struct Cluster {
    ctx: Arc<Context>,
    log: Arc<Mutex<Vec<Call>>>,
    seen: usize,
    now: Arc<Mutex<Timestamp>>,
    job: DecentralizedTrainingJob,
    shared_job: Arc<Mutex<Value>>,
    pods: Writer<CachedPod>,
    services: Writer<Service>,
    config_maps: Writer<ConfigMap>,
    secrets: Writer<Secret>,
    nodes: Writer<Node>,
    network_policies: Writer<NetworkPolicy>,
    disruption_budgets: Writer<PodDisruptionBudget>,
    pod_objects: BTreeMap<String, Pod>,
    labels: Arc<LabelWrites>,
    behind: Arc<Behind>,
}

/// How the mock API server answers the operator's clique label patches.
#[derive(Default)]
struct LabelWrites {
    /// Refuse each with this status code.
    refuse: Mutex<Option<u16>>,
    /// Held (write-locked by a test): each waits for it before it is answered.
    gate: tokio::sync::RwLock<()>,
}

/// How the mock API server answers the writes behind the reconciles that a test holds, refuses
/// or fails.
#[derive(Default)]
struct Behind {
    /// Held (write-locked by a test): pod creates wait for it before they are answered.
    creates: tokio::sync::RwLock<()>,
    /// Held likewise: applies of the job's ConfigMap.
    config_maps: tokio::sync::RwLock<()>,
    /// Pods whose creates are refused, as a ResourceQuota refuses them.
    refused: Mutex<std::collections::BTreeSet<String>>,
    /// Pod creates still to be answered with an internal error.
    failing: Mutex<u32>,
}

fn job(manifest: &str) -> DecentralizedTrainingJob {
    let mut job = parse_manifest(manifest, "job.yaml").unwrap();
    job.metadata.uid = Some("uid-1".into());
    job.metadata.generation = Some(1);
    job.metadata.creation_timestamp = Some(Time(at(0)));
    job
}

fn content_type(request: &Request<Body>) -> String {
    request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

/// A request as the mock API server sees it.
async fn read_call(request: Request<Body>) -> Call {
    let method = request.method().to_string();
    let path = request.uri().path().to_string();
    let query = request.uri().query().unwrap_or_default().to_string();
    let content_type = content_type(&request);
    let bytes = request.into_body().collect_bytes().await.unwrap();
    Call {
        method,
        path,
        query,
        content_type,
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        code: 200,
    }
}

/// A Status object, as the API server answers a refused request.
fn failure(code: u16, reason: &str, message: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code, "reason": reason, "message": message, "metadata": {}})
}

/// What the API server answers a successful write with.
fn answer(call: &Call, shared_job: &Mutex<Value>) -> Value {
    let (method, path, query, body) = (&call.method, &call.path, &call.query, &call.body);
    if method == "DELETE" {
        json!({"apiVersion": "v1", "kind": "Status", "status": "Success", "metadata": {}})
    } else if method == "PATCH" && path.contains("/events/") {
        // A repeated warning's series: the real server answers with the whole Event.
        json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": path.rsplit('/').next()}, "eventTime": "2023-11-14T22:13:20.000000Z", "series": body["series"]})
    } else if method == "PATCH" && !query.contains("force=true") {
        // A merge patch: the real server answers with the whole object.
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": path.rsplit('/').next()}})
    } else if path.ends_with("/status") {
        let mut job = shared_job.lock().clone();
        job["status"] = body["status"].clone();
        job
    } else if path.contains("/configmaps/") {
        let mut applied = body.clone();
        applied["metadata"]["resourceVersion"] = json!(resource_version(body));
        applied
    } else {
        body.clone()
    }
}

fn respond(send: tower_test::mock::SendResponse<Response<Body>>, code: u16, body: &Value) {
    send.send_response(
        Response::builder()
            .status(code)
            .body(Body::from(serde_json::to_vec(body).unwrap()))
            .unwrap(),
    );
}

/// The resourceVersion the mock API server gives an object it stores: one per content.
fn resource_version(object: &Value) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    object.to_string().hash(&mut h);
    h.finish().to_string()
}

/// Answer every request as an API server would for a successful write, and log it.
fn serve(
    mut handle: tower_test::mock::Handle<Request<Body>, Response<Body>>,
    log: Arc<Mutex<Vec<Call>>>,
    shared_job: Arc<Mutex<Value>>,
    labels: Arc<LabelWrites>,
    behind: Arc<Behind>,
) {
    tokio::spawn(async move {
        while let Some((request, send)) = handle.next_request().await {
            let mut call = read_call(request).await;
            let create = call.is("POST", "/pods");
            if create || call.is("PATCH", "/configmaps/") {
                let (behind, log, shared_job) = (behind.clone(), log.clone(), shared_job.clone());
                // Answered on its own, so a held one holds nothing else.
                tokio::spawn(async move {
                    let _open = if create {
                        behind.creates.read().await
                    } else {
                        behind.config_maps.read().await
                    };
                    let pod = call.body["metadata"]["name"].as_str().unwrap_or_default();
                    let (code, body) = if create && behind.refused.lock().contains(pod) {
                        let why = format!(
                            "pods \"{pod}\" is forbidden: exceeded quota: pods, requested: pods=1, used: pods=2, limited: pods=2"
                        );
                        (403, failure(403, "Forbidden", &why))
                    } else if create && *behind.failing.lock() > 0 {
                        *behind.failing.lock() -= 1;
                        (
                            500,
                            failure(500, "InternalError", "etcdserver: request timed out"),
                        )
                    } else {
                        (200, answer(&call, &shared_job))
                    };
                    call.code = code;
                    log.lock().push(call);
                    respond(send, code, &body);
                });
                continue;
            }
            if call.is("PATCH", "/pods/") && !call.query.contains("force") {
                let (labels, log, shared_job) = (labels.clone(), log.clone(), shared_job.clone());
                // Answered on its own, so a held one holds nothing else.
                tokio::spawn(async move {
                    let _open = labels.gate.read().await;
                    let refuse = *labels.refuse.lock();
                    let (code, body) = match refuse {
                        Some(code) => (code, failure(code, "InternalError", "refused by the test")),
                        None => (200, answer(&call, &shared_job)),
                    };
                    call.code = code;
                    log.lock().push(call);
                    respond(send, code, &body);
                });
                continue;
            }
            let response = answer(&call, &shared_job);
            log.lock().push(call);
            respond(send, 200, &response);
        }
    });
}

impl Cluster {
    fn new(manifest: &str) -> Self {
        Self::with_settings(manifest, Settings::default())
    }

    fn with_settings(manifest: &str, settings: Settings) -> Self {
        // Reconciles back to back, as each test drives them (spacing has a test of its own).
        let settings = Settings {
            min_reconcile_interval: Duration::ZERO,
            ..settings
        };
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let log = Arc::new(Mutex::new(Vec::new()));
        let job = job(manifest);
        let shared_job = Arc::new(Mutex::new(serde_json::to_value(&job).unwrap()));
        let labels = Arc::new(LabelWrites::default());
        let behind = Arc::new(Behind::default());
        serve(
            handle,
            log.clone(),
            shared_job.clone(),
            labels.clone(),
            behind.clone(),
        );
        let (pods, mut pod_writer) = reflector::store();
        let (services, mut service_writer) = reflector::store();
        let (config_maps, mut config_map_writer) = reflector::store();
        let (secrets, mut secret_writer) = reflector::store();
        let (nodes, mut node_writer) = reflector::store();
        let (network_policies, mut network_policy_writer) = reflector::store();
        let (disruption_budgets, mut disruption_budget_writer) = reflector::store();
        // Every cache has listed (empty) before the first reconcile.
        synced(&mut pod_writer);
        synced(&mut service_writer);
        synced(&mut config_map_writer);
        synced(&mut secret_writer);
        synced(&mut node_writer);
        synced(&mut network_policy_writer);
        synced(&mut disruption_budget_writer);
        node_writer.apply_watcher_event(&Event::Apply(node("node-a", "True", at(0))));
        let stores = Stores {
            pods,
            services,
            config_maps,
            secrets,
            nodes,
            network_policies: Some(network_policies),
            disruption_budgets,
            start_events: Default::default(),
            listed: Default::default(),
        };
        let mut hub = Hub::default();
        let metrics = Arc::new(OperatorMetrics::register(&mut hub.metrics.registry));
        let (ctx, _triggered) = Context::new(
            client,
            stores,
            Arc::new(hub),
            metrics,
            settings,
            "test".into(),
            Arc::new(lease::Leadership::unelected()),
        );
        let now = Arc::new(Mutex::new(at(1)));
        let clock = now.clone();
        let ctx = Arc::new(Context {
            client: ctx.client.clone(),
            stores: ctx.stores.clone(),
            hub: ctx.hub.clone(),
            metrics: ctx.metrics.clone(),
            settings: ctx.settings.clone(),
            instance: ctx.instance.clone(),
            clock: Arc::new(move || *clock.lock()),
            leadership: ctx.leadership.clone(),
            events: ctx.events.clone(),
            jobs: Mutex::default(),
            retries: Mutex::default(),
            trigger: ctx.trigger.clone(),
        });
        Self {
            ctx,
            log,
            seen: 0,
            now,
            job,
            shared_job,
            pods: pod_writer,
            services: service_writer,
            config_maps: config_map_writer,
            secrets: secret_writer,
            nodes: node_writer,
            network_policies: network_policy_writer,
            disruption_budgets: disruption_budget_writer,
            pod_objects: BTreeMap::new(),
            labels,
            behind,
        }
    }

    /// A new operator process: empty memory, a new status hub, the same caches.
    fn restart_operator(&mut self) {
        self.ctx = Arc::new(Context {
            client: self.ctx.client.clone(),
            stores: self.ctx.stores.clone(),
            hub: Arc::new(Hub::default()),
            metrics: self.ctx.metrics.clone(),
            settings: self.ctx.settings.clone(),
            instance: "restarted".into(),
            clock: self.ctx.clock.clone(),
            leadership: self.ctx.leadership.clone(),
            events: self.ctx.events.clone(),
            jobs: Mutex::default(),
            retries: Mutex::default(),
            trigger: self.ctx.trigger.clone(),
        });
    }

    /// A new operator process (empty memory) with its settings edited, as after an upgrade.
    fn with_settings_now(&mut self, edit: impl FnOnce(&mut Settings)) {
        self.restart_operator();
        let mut settings = self.ctx.settings.clone();
        edit(&mut settings);
        self.ctx = Arc::new(Context {
            client: self.ctx.client.clone(),
            stores: self.ctx.stores.clone(),
            hub: self.ctx.hub.clone(),
            metrics: self.ctx.metrics.clone(),
            settings,
            instance: self.ctx.instance.clone(),
            clock: self.ctx.clock.clone(),
            leadership: self.ctx.leadership.clone(),
            events: self.ctx.events.clone(),
            jobs: Mutex::default(),
            retries: Mutex::default(),
            trigger: self.ctx.trigger.clone(),
        });
    }

    fn advance(&self, secs: i64) {
        let mut now = self.now.lock();
        *now = Timestamp::from_second(now.as_second() + secs).unwrap();
    }

    fn now(&self) -> Timestamp {
        *self.now.lock()
    }

    /// One reconcile; returns its action and every request it and its writes behind it made,
    /// which the cluster then carries out (objects appear in the caches, status lands on the
    /// job).
    async fn reconcile(&mut self) -> (Action, Vec<Call>) {
        *self.shared_job.lock() = serde_json::to_value(&self.job).unwrap();
        let action = reconcile(Arc::new(self.job.clone()), self.ctx.clone())
            .await
            .expect("reconcile");
        self.written().await;
        let calls: Vec<Call> = self.log.lock()[self.seen..].to_vec();
        self.seen += calls.len();
        let declared = declared();
        for call in &calls {
            for permission in call.permissions() {
                assert!(
                    declared.contains(&permission),
                    "{} {} needs {permission:?}, which preflight::PERMISSIONS (and the chart's RBAC) lack",
                    call.method,
                    call.path
                );
            }
            self.carry_out(call);
        }
        (action, calls)
    }

    /// Wait until the job's writes behind its reconciles, and its clique labels, are written.
    async fn written(&self) {
        let (namespace, name) = (resources::namespace(&self.job), resources::name(&self.job));
        self.ctx.writes_settled(&namespace, &name).await;
        self.ctx.labels_written(&(namespace, name)).await;
    }

    fn carry_out(&mut self, call: &Call) {
        if call.code >= 300 {
            return;
        }
        let object = call.path.rsplit('/').next().unwrap_or_default().to_string();
        match (call.method.as_str(), call.path.as_str()) {
            ("PATCH", p) if p.ends_with("/status") => {
                self.job.status =
                    Some(serde_json::from_value(call.body["status"].clone()).unwrap());
            }
            ("PATCH", p) if p.contains("/pods/") => {
                // A merge patch of labels.
                let labels = call.body["metadata"]["labels"].as_object().unwrap().clone();
                self.edit_pod(&object, |pod| {
                    let current = pod.metadata.labels.get_or_insert_with(BTreeMap::new);
                    for (k, v) in labels {
                        match v.as_str() {
                            Some(v) => current.insert(k, v.to_string()),
                            None => current.remove(&k),
                        };
                    }
                });
            }
            ("POST", p) if p.ends_with("/pods") => {
                let mut pod: Pod = serde_json::from_value(call.body.clone()).unwrap();
                pod.metadata.creation_timestamp = Some(Time(self.now()));
                pod.status = Some(PodStatus {
                    phase: Some("Pending".into()),
                    ..Default::default()
                });
                self.put_pod(pod);
            }
            ("DELETE", p) if p.contains("/pods/") => {
                self.delete_pod(&object);
            }
            ("PATCH", p) if p.contains("/services/") => {
                let mut s: Service = serde_json::from_value(call.body.clone()).unwrap();
                // The API server's defaults.
                for port in s.spec.as_mut().unwrap().ports.iter_mut().flatten() {
                    port.protocol = Some("TCP".into());
                }
                self.services.apply_watcher_event(&Event::Apply(s));
            }
            ("PATCH", p) if p.contains("/secrets/") => {
                let s: Secret = serde_json::from_value(call.body.clone()).unwrap();
                self.secrets.apply_watcher_event(&Event::Apply(s));
            }
            ("DELETE", p) if p.contains("/secrets/") => {
                let gone = self
                    .ctx
                    .stores
                    .secrets
                    .state()
                    .into_iter()
                    .find(|s| s.metadata.name.as_deref() == Some(&object));
                if let Some(secret) = gone {
                    self.secrets
                        .apply_watcher_event(&Event::Delete((*secret).clone()));
                }
            }
            ("PATCH", p) if p.contains("/configmaps/") => {
                let mut c: ConfigMap = serde_json::from_value(call.body.clone()).unwrap();
                c.metadata.resource_version = Some(resource_version(&call.body));
                self.config_maps.apply_watcher_event(&Event::Apply(c));
            }
            ("PATCH", p) if p.contains("/networkpolicies/") => {
                let n: NetworkPolicy = serde_json::from_value(call.body.clone()).unwrap();
                self.network_policies.apply_watcher_event(&Event::Apply(n));
            }
            ("PATCH", p) if p.contains("/poddisruptionbudgets/") => {
                let b: PodDisruptionBudget = serde_json::from_value(call.body.clone()).unwrap();
                self.disruption_budgets
                    .apply_watcher_event(&Event::Apply(b));
            }
            _ => {}
        }
    }

    /// The pod as the API server holds it; the cache gets what the operator's watch keeps.
    fn put_pod(&mut self, pod: Pod) {
        let mut cached = CachedPod::of(&pod);
        super::observe::keep_what_is_read_of_pod(&mut cached);
        self.pods.apply_watcher_event(&Event::Apply(cached));
        self.pod_objects
            .insert(pod.metadata.name.clone().unwrap(), pod);
    }

    /// The pod is deleted: gone from the API server and, through the watch, from the cache.
    fn delete_pod(&mut self, name: &str) -> Option<Pod> {
        let pod = self.pod_objects.remove(name)?;
        self.pods
            .apply_watcher_event(&Event::Delete(CachedPod::of(&pod)));
        Some(pod)
    }

    fn edit_pod(&mut self, name: &str, edit: impl FnOnce(&mut Pod)) {
        let mut pod = self.pod_objects[name].clone();
        edit(&mut pod);
        self.put_pod(pod);
    }

    /// Every pod without a node lands on node-a and runs.
    fn schedule_all(&mut self) {
        let names: Vec<String> = self.pod_objects.keys().cloned().collect();
        for name in names {
            self.edit_pod(&name, |p| {
                let spec = p.spec.as_mut().unwrap();
                if spec.node_name.is_none() {
                    spec.node_name = Some("node-a".into());
                    p.status.as_mut().unwrap().phase = Some("Running".into());
                }
            });
        }
    }

    fn live(&self) -> Arc<Mutex<Live>> {
        self.ctx.jobs.lock()[&("ml".to_string(), "mnist".to_string())].clone()
    }

    /// Members post their join reports; wait until the operator took them in.
    async fn join(&mut self, members: &[u32]) {
        let handle = self.ctx.hub.job("ml", "mnist").expect("registered");
        for &id in members {
            let mut histogram = vec![0u64; 10];
            for c in 0..5 {
                histogram[(id as usize % 2) * 5 + c] = 40;
            }
            assert!(handle.deliver(Inbound::Join(JoinReport {
                member_id: id,
                label_histogram: histogram,
                proxy_vector: None,
            })));
        }
        for _ in 0..1000 {
            let attempts: BTreeMap<u32, u32> = {
                let live = self.live();
                let l = live.lock();
                l.driver
                    .memory()
                    .joins
                    .iter()
                    .map(|(id, j)| (*id, j.attempt))
                    .collect()
            };
            let current = |id: &u32| {
                let live = self.live();
                let l = live.lock();
                l.driver.memory().state.members.get(id).map(|r| r.attempt)
            };
            if members
                .iter()
                .all(|id| attempts.get(id).copied() == current(id))
            {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("joins never arrived");
    }

    /// Four members created, scheduled, joined: the topology is built.
    async fn running() -> Self {
        let mut c = Cluster::new(MANIFEST);
        c.reconcile().await;
        c.schedule_all();
        c.join(&[0, 1, 2, 3]).await;
        c.reconcile().await;
        c
    }

    fn status(&self) -> &DecentralizedTrainingJobStatus {
        self.job.status.as_ref().unwrap()
    }

    fn condition(&self, kind: &str) -> Option<(String, String)> {
        self.status()
            .conditions
            .iter()
            .find(|c| c.type_ == kind)
            .map(|c| (c.status.clone(), c.reason.clone()))
    }

    /// The version of the topology document in the ConfigMap, once there is one.
    fn published_version(&self) -> Option<u64> {
        let config_map = self
            .ctx
            .stores
            .config_maps
            .get(&ObjectRef::new("mnist-topology").within("ml"))?;
        let text = config_map
            .data
            .as_ref()?
            .get(resources::TOPOLOGY_KEY)?
            .clone();
        let doc: Value = serde_json::from_str(&text).ok()?;
        doc["version"].as_u64()
    }

    fn topology_version(&self) -> u64 {
        let config_map = self
            .ctx
            .stores
            .config_maps
            .get(&ObjectRef::new("mnist-topology").within("ml"))
            .unwrap();
        let doc: Value =
            serde_json::from_str(&config_map.data.as_ref().unwrap()[resources::TOPOLOGY_KEY])
                .unwrap();
        doc["version"].as_u64().unwrap()
    }
}

fn synced<K>(writer: &mut Writer<K>)
where
    K: kube::runtime::reflector::Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    writer.apply_watcher_event(&Event::Init);
    writer.apply_watcher_event(&Event::InitDone);
}

fn node(name: &str, ready: &str, since: Timestamp) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: ready.into(),
                last_transition_time: Some(Time(since)),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The one object of its kind that `calls` applied, at `path`, owned by the job.
fn applied_once<K: serde::de::DeserializeOwned + Resource>(calls: &[Call], path: &str) -> K {
    let kind = path.rsplit('/').nth(1).unwrap();
    let applied: Vec<&Call> = calls
        .iter()
        .filter(|c| c.path.contains(&format!("/{kind}/")))
        .collect();
    assert_eq!(applied.len(), 1, "{calls:#?}");
    assert_eq!(applied[0].path, path);
    let object: K = serde_json::from_value(applied[0].body.clone()).unwrap();
    assert_eq!(
        object.meta().owner_references.as_ref().unwrap()[0].uid,
        "uid-1"
    );
    object
}

fn pods_created(calls: &[Call]) -> Vec<String> {
    calls
        .iter()
        .filter(|c| c.method == "POST" && c.path.ends_with("/pods"))
        .map(|c| c.body["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

/// The reasons of the Events a reconcile created (a repeated warning is a patch of an earlier
/// one's series instead).
fn events(calls: &[Call]) -> Vec<String> {
    calls
        .iter()
        .filter(|c| c.is("POST", "/events"))
        .map(|c| c.body["reason"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn an_earlier_jobs_key_secret_of_the_same_name_is_replaced_not_inherited() {
    let mut c = Cluster::new(MANIFEST);
    // Left by a job of the same name, deleted with its children orphaned.
    let mut earlier = resources::secret(&c.job, &"ab".repeat(32));
    earlier.metadata.uid = Some("uid-earlier".into());
    earlier.metadata.owner_references = None;
    c.secrets.apply_watcher_event(&Event::Apply(earlier));
    let (_, calls) = c.reconcile().await;
    let delete = calls
        .iter()
        .position(|c| c.is("DELETE", "/secrets/mnist-peer-key"))
        .expect("the earlier job's Secret is deleted");
    assert_eq!(
        calls[delete].body["preconditions"]["uid"], "uid-earlier",
        "only that Secret, not one written since"
    );
    let apply = calls
        .iter()
        .position(|c| c.is("PATCH", "/secrets/mnist-peer-key"))
        .expect("a new key is written");
    assert!(delete < apply);
    assert_ne!(
        calls[apply].body["data"]["peer-key"],
        serde_json::to_value(k8s_openapi::ByteString("ab".repeat(32).into_bytes())).unwrap()
    );
    // Once it is this job's own, it is left alone.
    let (_, calls) = c.reconcile().await;
    assert!(
        !calls.iter().any(|c| c.path.contains("/secrets/")),
        "{calls:?}"
    );
}

#[tokio::test]
async fn a_new_job_gets_its_service_secret_budget_config_map_and_one_pod_per_member() {
    let mut c = Cluster::new(MANIFEST);
    let (action, calls) = c.reconcile().await;
    let paths: Vec<String> = calls
        .iter()
        .map(|c| format!("{} {}", c.method, c.path))
        .collect();
    assert_eq!(
        paths,
        vec![
            "PATCH /api/v1/namespaces/ml/services/mnist-peers",
            "PATCH /api/v1/namespaces/ml/secrets/mnist-peer-key",
            "PATCH /apis/policy/v1/namespaces/ml/poddisruptionbudgets/mnist-members",
            // Created, never applied: an attempt's pod is immutable (the real API server
            // refused an apply onto an existing one whose spec had been edited).
            "POST /api/v1/namespaces/ml/pods",
            "POST /api/v1/namespaces/ml/pods",
            "POST /api/v1/namespaces/ml/pods",
            "POST /api/v1/namespaces/ml/pods",
            "PATCH /api/v1/namespaces/ml/configmaps/mnist-topology",
            "PATCH /apis/murmur.dev/v1alpha1/namespaces/ml/decentralizedtrainingjobs/mnist/status",
        ],
        "{paths:#?}"
    );
    // murmur's field manager everywhere; server-side apply for all but the pods.
    for call in &calls {
        assert!(
            call.query.contains("fieldManager=murmur-operator"),
            "{}",
            call.query
        );
        if call.method == "PATCH" {
            assert!(call.query.contains("force=true"), "{}", call.query);
        }
    }
    // Every object is owned by the job.
    for call in &calls[..8] {
        let owner = &call.body["metadata"]["ownerReferences"][0];
        assert_eq!(owner["uid"], "uid-1", "{}", call.path);
        assert_eq!(owner["controller"], true);
        assert_eq!(owner["kind"], "DecentralizedTrainingJob");
    }
    let service = &calls[0].body["spec"];
    assert_eq!(service["clusterIP"], "None");
    assert_eq!(service["publishNotReadyAddresses"], true);
    assert!(calls[1].body["data"]["peer-key"].as_str().unwrap().len() > 40);

    let pod: Pod = serde_json::from_value(calls[4].body.clone()).unwrap();
    let labels = pod.metadata.labels.as_ref().unwrap();
    assert_eq!(labels[resources::LABEL_JOB], "mnist");
    assert_eq!(labels[resources::LABEL_MEMBER], "1");
    assert_eq!(labels[resources::LABEL_ATTEMPT], "0");
    let spec = pod.spec.as_ref().unwrap();
    // The attempt's own name (a replacement and a terminating attempt never share one).
    assert_eq!(spec.hostname.as_deref(), Some("member-1-0"));
    assert_eq!(spec.subdomain.as_deref(), Some("mnist-peers"));
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    assert_eq!(spec.termination_grace_period_seconds, Some(30));
    assert_eq!(spec.automount_service_account_token, Some(false));
    assert_eq!(spec.node_selector.as_ref().unwrap()["pool"], "training");
    let terms = &spec
        .affinity
        .as_ref()
        .unwrap()
        .node_affinity
        .as_ref()
        .unwrap()
        .required_during_scheduling_ignored_during_execution
        .as_ref()
        .unwrap()
        .node_selector_terms;
    assert_eq!(terms.len(), scheduling::SPOT_LABELS.len());
    assert!(spec.tolerations.as_ref().unwrap().len() >= 3);
    let container = &spec.containers[0];
    let env: BTreeMap<&str, &str> = container
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.as_str(), e.value.as_deref().unwrap_or("")))
        .collect();
    assert_eq!(
        env["MURMUR_JOB"], "mnist",
        "the contract wins over user env"
    );
    assert_eq!(env["EXTRA"], "x");
    // The job names no image: the operator's default for its backend.
    assert_eq!(
        container.image.as_deref(),
        Some(murmur_core::api::DEFAULT_TRAINER_CUDA_IMAGE)
    );
    assert_eq!(env["MURMUR_MEMBER_ID"], "1");
    assert_eq!(env["MURMUR_LISTEN_ADDRESS"], "0.0.0.0:7070");
    assert_eq!(env["MURMUR_BACKEND"], "cuda");
    assert_eq!(env["MURMUR_PEER_KEY_FILE"], "/var/run/murmur/peer-key/key");
    assert_eq!(env["MURMUR_CHECKPOINT_DIR"], resources::CHECKPOINT_DIR);
    assert_eq!(env["MURMUR_TERMINATION_LOG"], "/dev/termination-log");
    assert!(env["MURMUR_CONTROL_ENDPOINT"].starts_with("http://"));
    let spec_json: Value = serde_json::from_str(env["MURMUR_JOB_SPEC"]).unwrap();
    assert_eq!(spec_json["replicas"]["target"], 4);
    assert_eq!(
        container
            .resources
            .as_ref()
            .unwrap()
            .limits
            .as_ref()
            .unwrap()["nvidia.com/gpu"]
            .0,
        "1"
    );
    assert_eq!(
        container
            .readiness_probe
            .as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap()
            .path
            .as_deref(),
        Some("/readyz")
    );
    let security = container.security_context.as_ref().unwrap();
    assert_eq!(security.run_as_non_root, Some(true));
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert_eq!(
        security.capabilities.as_ref().unwrap().drop.as_deref(),
        Some(&["ALL".to_string()][..])
    );
    assert_eq!(
        security.seccomp_profile.as_ref().unwrap().type_,
        "RuntimeDefault"
    );
    let ports: Vec<i32> = container
        .ports
        .iter()
        .flatten()
        .map(|p| p.container_port)
        .collect();
    assert_eq!(ports, vec![7070, 7071]);

    let status = c.status();
    assert_eq!(status.phase, Some(murmur_core::api::JobPhase::Pending));
    assert_eq!(status.observed_generation, Some(1));
    assert_eq!(c.condition("Created").unwrap().0, "True");
    // The join grace is the next deadline.
    assert_eq!(action, Action::requeue(Duration::from_secs(14)));
}

#[tokio::test]
async fn a_job_names_its_trainer_image_or_gets_the_operators_for_its_backend() {
    let settings = Settings {
        trainer_image: "registry.example/trainer:cpu".into(),
        trainer_cuda_image: "registry.example/trainer:cuda".into(),
        ..Settings::default()
    };
    let image = |manifest: String| {
        let job = job(&manifest);
        let pod = resources::pod(
            &resources::MemberPod {
                job: &job,
                member: 0,
                attempt: 0,
                on_demand: false,
                clique: None,
                zone: None,
            },
            &settings,
        );
        pod.spec.unwrap().containers[0].image.clone().unwrap()
    };
    assert_eq!(image(MANIFEST.into()), "registry.example/trainer:cuda");
    assert_eq!(
        image(MANIFEST.replace("backend: cuda, ", "")),
        "registry.example/trainer:cpu"
    );
    assert_eq!(
        image(MANIFEST.replace("backend: cuda, ", "image: mine:1, ")),
        "mine:1"
    );
}

#[test]
fn a_job_that_names_a_kueue_queue_runs_its_members_as_one_pod_group() {
    use super::kueue;
    let metadata = |manifest: String, member, attempt, on_demand| {
        let job = job(&manifest);
        let pod = resources::pod(
            &resources::MemberPod {
                job: &job,
                member,
                attempt,
                on_demand,
                clique: None,
                zone: None,
            },
            &Settings::default(),
        );
        (
            pod.metadata.labels.unwrap(),
            pod.metadata.annotations.unwrap(),
        )
    };
    // No queue: nothing of Kueue's.
    let (labels, annotations) = metadata(MANIFEST.into(), 0, 0, false);
    assert!(
        labels
            .keys()
            .chain(annotations.keys())
            .all(|k| !k.starts_with("kueue.x-k8s.io/")),
        "{labels:?} {annotations:?}"
    );
    let queued = MANIFEST.replace(
        "metadata: {name: mnist, namespace: ml}",
        "metadata: {name: mnist, namespace: ml, labels: {kueue.x-k8s.io/queue-name: team, kueue.x-k8s.io/priority-class: low}}",
    );
    let (labels, annotations) = metadata(queued.clone(), 0, 0, false);
    assert_eq!(labels[kueue::QUEUE_LABEL], "team");
    assert_eq!(labels[kueue::PRIORITY_CLASS_LABEL], "low");
    assert_eq!(labels[kueue::POD_GROUP_LABEL], "mnist-uid1");
    // The gang is the target; every member, replacement or on-demand fallback, is one role.
    assert_eq!(annotations[kueue::TOTAL_COUNT_ANNOTATION], "4");
    let (labels2, annotations2) = metadata(queued, 3, 2, true);
    assert_eq!(
        labels2[kueue::POD_GROUP_LABEL],
        labels[kueue::POD_GROUP_LABEL]
    );
    assert_eq!(
        annotations2[kueue::ROLE_HASH_ANNOTATION],
        annotations[kueue::ROLE_HASH_ANNOTATION]
    );
    // The longest name a job may have still makes a label value.
    let long = "j".repeat(52);
    let (labels, _) = metadata(
        MANIFEST.replace(
            "metadata: {name: mnist, namespace: ml}",
            &format!("metadata: {{name: {long}, namespace: ml, labels: {{kueue.x-k8s.io/queue-name: team}}}}"),
        ),
        0,
        0,
        false,
    );
    let group = &labels[kueue::POD_GROUP_LABEL];
    assert_eq!(group, &format!("{long}-uid1"));
}

#[tokio::test]
async fn a_replacement_prefers_the_zone_of_its_clique_unless_zone_awareness_is_off() {
    // Member 3's pod of `manifest`, a replacement in `clique` when there is one, whose zone the
    // topology knows or not.
    let pod_of = |manifest: &str, clique: Option<u32>, zone: Option<&str>| {
        let job = job(manifest);
        let pod = resources::pod(
            &resources::MemberPod {
                job: &job,
                member: 3,
                attempt: u32::from(clique.is_some()),
                on_demand: false,
                clique,
                zone,
            },
            &Settings::default(),
        );
        pod.spec.unwrap()
    };
    let pod_spec = |manifest: &str, clique| pod_of(manifest, clique, None);
    let affinity = |manifest: String, clique| pod_spec(&manifest, clique).affinity.unwrap();
    let a = affinity(MANIFEST.into(), Some(1));
    let terms = a
        .pod_affinity
        .unwrap()
        .preferred_during_scheduling_ignored_during_execution
        .unwrap();
    assert_eq!(terms.len(), 1);
    let term = &terms[0].pod_affinity_term;
    assert_eq!(term.topology_key, "topology.kubernetes.io/zone");
    assert_eq!(
        term.label_selector.as_ref().unwrap().match_labels,
        Some(BTreeMap::from([
            (resources::LABEL_JOB.to_string(), "mnist".to_string()),
            (resources::LABEL_CLIQUE.to_string(), "1".to_string()),
        ]))
    );
    // The spot requirement is kept beside it.
    let node = a.node_affinity.unwrap();
    assert!(
        node.required_during_scheduling_ignored_during_execution
            .is_some()
    );
    let preferred = |n: &k8s_openapi::api::core::v1::NodeAffinity| {
        n.preferred_during_scheduling_ignored_during_execution
            .clone()
            .unwrap_or_default()
    };
    assert!(preferred(&node).is_empty(), "no zone known, none named");
    // Where the topology knows the clique's zone, the pod prefers it by name as well, as
    // strongly as a preference can.
    let named = pod_of(MANIFEST, Some(1), Some("zone-b")).affinity.unwrap();
    assert_eq!(
        named
            .pod_affinity
            .unwrap()
            .preferred_during_scheduling_ignored_during_execution,
        Some(terms.clone())
    );
    let node = named.node_affinity.unwrap();
    assert!(
        node.required_during_scheduling_ignored_during_execution
            .is_some()
    );
    let by_name = preferred(&node);
    assert_eq!(by_name.len(), 1);
    assert_eq!(by_name[0].weight, 100);
    let wanted = &by_name[0].preference.match_expressions.as_ref().unwrap()[0];
    assert_eq!(
        (wanted.key.as_str(), wanted.operator.as_str()),
        ("topology.kubernetes.io/zone", "In")
    );
    assert_eq!(wanted.values, Some(vec!["zone-b".to_string()]));
    // A first attempt has no clique yet; zoneAware: false asks for nothing.
    assert!(affinity(MANIFEST.into(), None).pod_affinity.is_none());
    let off = MANIFEST.replace("capacity: spot", "capacity: spot\n    zoneAware: false");
    assert!(affinity(off.clone(), Some(1)).pod_affinity.is_none());
    // Every pod of a zone-aware clique job asks, softly, for zones of even size.
    let spread = |manifest: &str| pod_spec(manifest, None).topology_spread_constraints;
    let constraints = spread(MANIFEST).expect("a zone spread");
    assert_eq!(constraints[0].topology_key, "topology.kubernetes.io/zone");
    assert_eq!(constraints[0].max_skew, 1);
    assert_eq!(constraints[0].when_unsatisfiable, "ScheduleAnyway");
    assert!(spread(&off).is_none());
}

#[tokio::test]
async fn members_outside_their_cliques_zone_are_moved_there_once_and_ask_for_its_zone() {
    let mut c = Cluster::new(MANIFEST);
    for zone in ["a", "b"] {
        let mut n = node(&format!("node-{zone}"), "True", at(0));
        n.metadata.labels = Some(BTreeMap::from([(
            observe::ZONE_LABEL.to_string(),
            format!("zone-{zone}"),
        )]));
        c.nodes.apply_watcher_event(&Event::Apply(n));
    }
    c.reconcile().await;
    // Even members (classes 0-4) run in zone a, odd ones (5-9) in zone b: every balanced clique
    // of two spans the zones.
    for id in 0..4u32 {
        c.edit_pod(&format!("mnist-{id}-0"), |p| {
            let zone = if id.is_multiple_of(2) { "a" } else { "b" };
            p.spec.as_mut().unwrap().node_name = Some(format!("node-{zone}"));
            p.status.as_mut().unwrap().phase = Some("Running".into());
        });
    }
    c.reconcile().await;
    c.join(&[0, 1, 2, 3]).await;
    let (_, calls) = c.reconcile().await;
    let deleted: Vec<String> = calls
        .iter()
        .filter(|c| c.is("DELETE", "/pods/"))
        .map(|c| c.path.rsplit('/').next().unwrap().to_string())
        .collect();
    assert_eq!(deleted.len(), 2, "one member of each clique moves");
    assert_eq!(
        events(&calls).iter().filter(|r| *r == "Relocated").count(),
        2
    );
    let status = c.status();
    assert_eq!(
        (status.relocations, status.preemptions, status.restarts),
        (2, 0, 0)
    );
    // The first topology goes without the movers: no one waits for them.
    let handle = c.ctx.hub.job("ml", "mnist").unwrap();
    let doc = handle.topology().borrow().clone().unwrap();
    assert_eq!(doc.members.len(), 2);
    // Their pods are gone: new attempts, each asking for the zone of the clique it left.
    let (_, calls) = c.reconcile().await;
    let mut created = pods_created(&calls);
    created.sort();
    let mut expected: Vec<String> = deleted.iter().map(|p| p.replace("-0", "-1")).collect();
    expected.sort();
    assert_eq!(created, expected);
    for name in &created {
        let pod = &c.pod_objects[name];
        let clique = &pod.metadata.labels.as_ref().unwrap()[resources::LABEL_CLIQUE];
        assert!(
            doc.members
                .iter()
                .any(|m| m.clique.map(|c| c.to_string()).as_ref() == Some(clique)),
            "{name} asks for clique {clique}, which is not in the topology"
        );
        let terms = pod
            .spec
            .as_ref()
            .unwrap()
            .affinity
            .as_ref()
            .unwrap()
            .pod_affinity
            .as_ref()
            .unwrap()
            .preferred_during_scheduling_ignored_during_execution
            .clone()
            .unwrap();
        assert_eq!(
            terms[0]
                .pod_affinity_term
                .label_selector
                .as_ref()
                .unwrap()
                .match_labels
                .as_ref()
                .unwrap()[resources::LABEL_CLIQUE],
            *clique
        );
        // And that clique's zone by name: the other one than where it ran.
        let member: u32 = name.split('-').nth(1).unwrap().parse().unwrap();
        let away = if member.is_multiple_of(2) {
            "zone-b"
        } else {
            "zone-a"
        };
        let by_name = pod.spec.as_ref().unwrap().affinity.as_ref().unwrap();
        let by_name = by_name
            .node_affinity
            .as_ref()
            .and_then(|n| {
                n.preferred_during_scheduling_ignored_during_execution
                    .clone()
            })
            .unwrap_or_default();
        assert!(
            by_name.iter().any(
                |t| t.preference.match_expressions.as_ref().unwrap()[0].values
                    == Some(vec![away.to_string()])
            ),
            "{name} should name {away}: {by_name:?}"
        );
    }
    // They land in their cliques' zones and join: every clique inside one zone, nobody moves
    // again.
    for name in &created {
        let clique =
            c.pod_objects[name].metadata.labels.as_ref().unwrap()[resources::LABEL_CLIQUE].clone();
        let mate = doc
            .members
            .iter()
            .find(|m| m.clique.map(|c| c.to_string()) == Some(clique.clone()))
            .unwrap()
            .id;
        let zone = if mate.is_multiple_of(2) { "a" } else { "b" };
        c.edit_pod(name, |p| {
            p.spec.as_mut().unwrap().node_name = Some(format!("node-{zone}"));
            p.status.as_mut().unwrap().phase = Some("Running".into());
        });
    }
    let movers: Vec<u32> = created
        .iter()
        .map(|n| n.split('-').nth(1).unwrap().parse().unwrap())
        .collect();
    c.join(&movers).await;
    let (_, calls) = c.reconcile().await;
    assert!(!calls.iter().any(|c| c.is("DELETE", "/pods/")));
    let doc = handle.topology().borrow().clone().unwrap();
    assert_eq!(doc.members.len(), 4);
    assert_eq!(c.status().relocations, 2);
    let zone_of = |id: u32| {
        c.status()
            .members
            .iter()
            .find(|m| m.id == id)
            .and_then(|m| m.zone.clone())
    };
    for m in &doc.members {
        for o in &doc.members {
            if m.id != o.id && m.clique == o.clique {
                assert_eq!(
                    zone_of(m.id),
                    zone_of(o.id),
                    "{} and {} span zones",
                    m.id,
                    o.id
                );
                assert_ne!(
                    m.id % 2,
                    o.id % 2,
                    "{} and {} hold the same classes",
                    m.id,
                    o.id
                );
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn reconciles_of_a_job_are_spaced_and_never_starved() {
    let mut c = Cluster::running().await;
    c.with_settings_now(|s| s.min_reconcile_interval = Duration::from_millis(500));
    let started = tokio::time::Instant::now();
    // Asked for again and again, back to back: each runs 500 ms after it was asked, so they
    // are spaced by that and none waits longer (a debounce restarted by each request would
    // never have run).
    for n in 1..=4u32 {
        c.reconcile().await;
        assert_eq!(started.elapsed(), n * Duration::from_millis(500));
    }
    // What changed while it waited is what it decides on: a pod deleted during the wait is
    // replaced by that very reconcile.
    let pod = c.pod_objects.remove("mnist-0-0").unwrap();
    let deleted = pod.clone();
    let pods = c.ctx.stores.pods.clone();
    let reconcile = {
        let job = Arc::new(c.job.clone());
        let ctx = c.ctx.clone();
        tokio::spawn(async move { reconcile(job, ctx).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    c.pods
        .apply_watcher_event(&Event::Delete(CachedPod::of(&deleted)));
    assert!(
        pods.get(&ObjectRef::new("mnist-0-0").within("ml"))
            .is_none()
    );
    reconcile.await.unwrap().unwrap();
    c.written().await;
    let created: Vec<String> = c.log.lock()[c.seen..]
        .iter()
        .filter(|call| call.method == "POST" && call.path.ends_with("/pods"))
        .map(|call| call.body["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(created, vec!["mnist-0-1"], "{pod:?}");
}

#[tokio::test]
async fn a_failing_reconcile_is_retried_ever_later_and_soon_again_after_a_success() {
    let mut c = Cluster::running().await;
    let key = (resources::namespace(&c.job), resources::name(&c.job));
    // Doubling from a second, up to two minutes, each with up to as much again of jitter.
    for failures in 0..10u32 {
        let delay = c.ctx.retry_delay(key.clone());
        let base = (RETRY_FIRST * 2u32.pow(failures)).min(RETRY_MAX);
        assert!(
            base <= delay && delay < 2 * base,
            "failure {failures}: {delay:?} is not within [{base:?}, {:?})",
            2 * base
        );
    }
    // Another job's failures are its own.
    let other = (key.0.clone(), "other".to_string());
    assert!(c.ctx.retry_delay(other) < 2 * RETRY_FIRST);
    c.reconcile().await;
    assert!(c.ctx.retry_delay(key) < 2 * RETRY_FIRST);
}

#[tokio::test]
async fn each_job_has_a_disruption_budget_of_its_headroom_written_once() {
    let mut c = Cluster::new(MANIFEST);
    let (_, calls) = c.reconcile().await;
    let budget: PodDisruptionBudget = applied_once(
        &calls,
        "/apis/policy/v1/namespaces/ml/poddisruptionbudgets/mnist-members",
    );
    let spec = budget.spec.unwrap();
    let r = &c.job.spec.replicas;
    assert!(r.target > r.min, "the manifest has headroom");
    // With every member up, a drain may take target − min of them.
    assert_eq!(spec.min_available, Some(IntOrString::Int(r.min as i32)));
    assert_eq!(spec.max_unavailable, None, "needs a scale subresource");
    assert_eq!(
        spec.unhealthy_pod_eviction_policy.as_deref(),
        Some("AlwaysAllow")
    );
    let selector = spec.selector.unwrap().match_labels.unwrap();
    assert_eq!(selector[resources::LABEL_JOB], "mnist");
    // Every member pod is selected by it.
    for call in calls
        .iter()
        .filter(|c| c.method == "POST" && c.path.ends_with("/pods"))
    {
        let labels = &call.body["metadata"]["labels"];
        for (k, v) in &selector {
            assert_eq!(labels[k], json!(v), "{labels}");
        }
    }
    // Written once: an unchanged budget is not applied again.
    let (_, calls) = c.reconcile().await;
    assert!(
        !calls
            .iter()
            .any(|c| c.path.contains("/poddisruptionbudgets/"))
    );
}

#[test]
fn a_job_without_headroom_still_lets_drains_take_one_member_at_a_time() {
    let mut job = job(MANIFEST);
    job.spec.replicas.min = job.spec.replicas.target;
    let spec = resources::disruption_budget(&job).spec.unwrap();
    assert_eq!(
        spec.min_available,
        Some(IntOrString::Int(job.spec.replicas.target as i32 - 1))
    );
    job.spec.replicas.target = 1;
    job.spec.replicas.min = 1;
    let spec = resources::disruption_budget(&job).spec.unwrap();
    assert_eq!(spec.min_available, Some(IntOrString::Int(0)));
}

/// A NetworkPolicy rule's peers and ports (ingress `from` or egress `to`).
type PolicyRule = (
    Option<Vec<k8s_openapi::api::networking::v1::NetworkPolicyPeer>>,
    Option<Vec<k8s_openapi::api::networking::v1::NetworkPolicyPort>>,
);

#[tokio::test]
async fn with_network_policies_each_job_fences_its_trainers_in_once() {
    let settings = Settings {
        network_policies: Some(resources::NetworkPolicySettings {
            operator_namespace: "murmur-system".into(),
            operator_port: 8470,
            dns_namespace: "kube-system".into(),
        }),
        ..Settings::default()
    };
    let mut c = Cluster::with_settings(MANIFEST, settings);
    let (_, calls) = c.reconcile().await;
    let policy: NetworkPolicy = applied_once(
        &calls,
        "/apis/networking.k8s.io/v1/namespaces/ml/networkpolicies/mnist-trainers",
    );
    let spec = policy.spec.unwrap();
    // It selects exactly the labels every member pod carries.
    let selected = spec
        .pod_selector
        .as_ref()
        .unwrap()
        .match_labels
        .clone()
        .unwrap();
    let pod = &c.pod_objects["mnist-0-0"];
    for (k, v) in &selected {
        assert_eq!(pod.metadata.labels.as_ref().unwrap().get(k), Some(v), "{k}");
    }
    assert_eq!(selected[resources::LABEL_JOB], "mnist");
    let ports = |rules: Vec<PolicyRule>| {
        rules
            .into_iter()
            .map(|(peers, ports)| {
                let peer = &peers.unwrap()[0];
                let who = match (&peer.pod_selector, &peer.namespace_selector) {
                    (Some(p), None) if p.match_labels.as_ref() == Some(&selected) => {
                        "same job".to_string()
                    }
                    (None, Some(n)) => {
                        n.match_labels.as_ref().unwrap()["kubernetes.io/metadata.name"].clone()
                    }
                    other => panic!("unexpected peer {other:?}"),
                };
                let ports: Vec<String> = ports
                    .unwrap()
                    .iter()
                    .map(|p| {
                        format!(
                            "{:?}/{}",
                            p.port.as_ref().unwrap(),
                            p.protocol.as_deref().unwrap()
                        )
                    })
                    .collect();
                format!("{who}: {}", ports.join(","))
            })
            .collect::<Vec<_>>()
    };
    let ingress = ports(
        spec.ingress
            .unwrap()
            .into_iter()
            .map(|r| (r.from, r.ports))
            .collect(),
    );
    let egress = ports(
        spec.egress
            .unwrap()
            .into_iter()
            .map(|r| (r.to, r.ports))
            .collect(),
    );
    assert_eq!(
        ingress,
        ["same job: Int(7070)/TCP", "murmur-system: Int(7071)/TCP"]
    );
    assert_eq!(
        egress,
        [
            "same job: Int(7070)/TCP",
            "murmur-system: Int(8470)/TCP",
            "kube-system: Int(53)/UDP,Int(53)/TCP"
        ]
    );
    assert_eq!(spec.policy_types.unwrap(), ["Ingress", "Egress"]);
    // In the cache now: not written again.
    c.schedule_all();
    c.join(&[0, 1, 2, 3]).await;
    let (_, calls) = c.reconcile().await;
    assert!(!calls.iter().any(|c| c.path.contains("/networkpolicies/")));
    let (_, calls) = c.reconcile().await;
    assert!(calls.is_empty(), "{calls:#?}");
}

#[tokio::test]
async fn the_memory_is_compared_with_what_the_config_map_holds_at_its_resource_version() {
    let mut c = Cluster::running().await;
    let key = ObjectRef::new("mnist-topology").within("ml");
    let written = c.ctx.stores.config_maps.get(&key).unwrap();
    // Someone else's edit (a new resourceVersion): the memory is written back.
    let mut edited = (*written).clone();
    edited
        .data
        .as_mut()
        .unwrap()
        .insert(resources::STATE_KEY.into(), "{\"edited\": true}".into());
    edited.metadata.resource_version = Some("edited".into());
    c.config_maps
        .apply_watcher_event(&Event::Apply(edited.clone()));
    let (_, calls) = c.reconcile().await;
    assert_eq!(
        calls
            .iter()
            .filter(|c| c.is("PATCH", "/configmaps/"))
            .count(),
        1,
        "{calls:#?}"
    );
    assert_eq!(
        c.ctx.stores.config_maps.get(&key).unwrap().data,
        written.data
    );
    // At the resourceVersion it wrote, the operator knows what the ConfigMap holds without
    // reading its text back (here the text is made to differ, which a real server never shows).
    let mut same_version = (*c.ctx.stores.config_maps.get(&key).unwrap()).clone();
    same_version.data = edited.data.clone();
    c.config_maps
        .apply_watcher_event(&Event::Apply(same_version));
    let (_, calls) = c.reconcile().await;
    assert!(calls.is_empty(), "{calls:#?}");
}

#[tokio::test]
async fn an_unchanged_job_costs_no_request_at_all() {
    let mut c = Cluster::running().await;
    let (_, calls) = c.reconcile().await;
    assert!(calls.is_empty(), "{calls:#?}");
    c.advance(5);
    let (_, calls) = c.reconcile().await;
    assert!(calls.is_empty(), "{calls:#?}");
}

/// A reconcile that the test drives without the cluster carrying out its calls: it returns
/// once it has decided, whatever the API server is doing.
async fn decided(c: &Cluster) -> Action {
    tokio::time::timeout(
        Duration::from_secs(10),
        reconcile(Arc::new(c.job.clone()), c.ctx.clone()),
    )
    .await
    .expect("the reconcile waited on the API server")
    .expect("reconcile")
}

/// Let the other tasks run, without time passing, until `done` (a few thousand turns at most).
async fn yielded_until(done: impl Fn() -> bool) {
    for _ in 0..10_000 {
        if done() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("never came to pass without time passing");
}

/// Wait until the job's writer has taken everything decided into a round (held, say).
async fn round_taken(c: &Cluster) {
    yielded_until(|| c.live().lock().behind.pending.is_none()).await;
}

/// The job's memory as the last ConfigMap written holds it.
fn memory_written(c: &Cluster) -> crate::driver::Memory {
    let call = c
        .log
        .lock()
        .iter()
        .rev()
        .find(|call| call.is("PATCH", "/configmaps/") && call.code < 300)
        .cloned()
        .expect("the memory is written");
    let config_map: ConfigMap = serde_json::from_value(call.body).unwrap();
    memory_of(&c.job, Some(&config_map), &[], &[]).unwrap()
}

#[tokio::test]
async fn a_reconcile_decides_without_waiting_for_its_writes_and_the_memory_waits_for_its_creates() {
    let mut c = Cluster::new(MANIFEST);
    let behind = c.behind.clone();
    let held = behind.creates.write().await;
    decided(&c).await;
    // Assumed: the next plan starts from the four members created.
    assert_eq!(
        c.live()
            .lock()
            .driver
            .state()
            .members
            .values()
            .filter(|r| r.lifecycle == crate::member::Lifecycle::PENDING)
            .count(),
        4
    );
    // Another reconcile while they are held creates none of them again: they are awaited.
    round_taken(&c).await;
    decided(&c).await;
    assert!(
        c.live()
            .lock()
            .behind
            .pending
            .as_ref()
            .unwrap()
            .1
            .create
            .is_empty(),
        "created again"
    );
    tokio::task::yield_now().await;
    let log = c.log.lock().clone();
    assert!(!log.iter().any(|call| call.is("POST", "/pods")), "{log:#?}");
    assert!(
        !log.iter().any(|call| call.is("PATCH", "/configmaps/")),
        "the memory names attempts whose creates are not answered: {log:#?}"
    );
    drop(held);
    let (_, calls) = c.reconcile().await;
    let creates: Vec<usize> = (0..calls.len())
        .filter(|&n| calls[n].is("POST", "/pods"))
        .collect();
    let names: std::collections::BTreeSet<&str> = creates
        .iter()
        .map(|&n| calls[n].body["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(creates.len(), 4, "each pod once: {calls:#?}");
    assert_eq!(names.len(), 4);
    let memory = (0..calls.len())
        .filter(|&n| calls[n].is("PATCH", "/configmaps/"))
        .collect::<Vec<_>>();
    assert_eq!(memory.len(), 1, "the reconciles' writes folded: {calls:#?}");
    assert!(memory[0] > *creates.last().unwrap(), "{calls:#?}");
    let record = &memory_written(&c).state.members[&3];
    assert_eq!(record.lifecycle, crate::member::Lifecycle::PENDING);
    assert_eq!(
        calls
            .iter()
            .filter(|call| call.path.ends_with("/status"))
            .count(),
        1
    );
}

#[tokio::test]
async fn a_topology_is_published_once_the_memory_holding_it_is_written() {
    let mut c = Cluster::new(MANIFEST);
    c.reconcile().await;
    c.schedule_all();
    c.reconcile().await;
    let handle = c.ctx.hub.job("ml", "mnist").unwrap();
    let behind = c.behind.clone();
    let held = behind.config_maps.write().await;
    c.join(&[0, 1, 2, 3]).await;
    decided(&c).await;
    tokio::task::yield_now().await;
    let planned = c
        .live()
        .lock()
        .driver
        .state()
        .topology
        .as_ref()
        .map(|t| t.version);
    assert_eq!(planned, Some(1));
    assert!(
        handle.topology().borrow().is_none(),
        "a trainer could hold a version no restarted operator knows"
    );
    drop(held);
    c.written().await;
    assert_eq!(
        handle.topology().borrow().as_ref().map(|d| d.version),
        Some(1)
    );
}

#[tokio::test]
async fn refused_creates_are_answered_into_the_memory_the_status_and_what_was_decided_meanwhile() {
    let mut c = Cluster::new(MANIFEST);
    let behind = c.behind.clone();
    behind
        .refused
        .lock()
        .extend(["mnist-2-0".to_string(), "mnist-3-0".to_string()]);
    let held = behind.creates.write().await;
    decided(&c).await;
    // Decided while the creates are held: it is written after them, and must not forget what
    // their answers say.
    round_taken(&c).await;
    c.advance(1);
    decided(&c).await;
    drop(held);
    c.written().await;
    let memory = memory_written(&c);
    for id in [2, 3] {
        let record = &memory.state.members[&id];
        assert_eq!(record.refusals, 1, "member {id}: {record:?}");
        assert!(record.not_before.is_some());
    }
    assert_eq!(memory.state.members[&0].refusals, 0);
    c.reconcile().await;
    assert_eq!(c.condition("PodsRejected").unwrap().0, "True");
    assert_eq!(c.status().preemptions, 0, "a refused pod was never deleted");
    // Until the backoff passes, nothing is tried again; then the refused members are.
    behind.refused.lock().clear();
    let (_, calls) = c.reconcile().await;
    assert!(
        !calls.iter().any(|call| call.is("POST", "/pods")),
        "{calls:#?}"
    );
    c.advance(10);
    let (_, calls) = c.reconcile().await;
    let created: Vec<&str> = calls
        .iter()
        .filter(|call| call.is("POST", "/pods"))
        .map(|call| call.body["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(created.len(), 2, "{created:?}");
    assert_eq!(c.status().preemptions, 0);
}

#[tokio::test(start_paused = true)]
async fn a_failed_round_of_writes_is_tried_again_later_and_fails_no_reconcile() {
    let mut c = Cluster::new(MANIFEST);
    *c.behind.failing.lock() = 1;
    // The reconcile succeeds: the error is the writer's, which tries again after a delay.
    let (_, calls) = c.reconcile().await;
    let creates: Vec<&Call> = calls
        .iter()
        .filter(|call| call.is("POST", "/pods"))
        .collect();
    assert_eq!(creates[0].code, 500);
    assert_eq!(
        creates.len(),
        5,
        "the failed one again, then the rest: {creates:#?}"
    );
    let names: std::collections::BTreeSet<&str> = creates[1..]
        .iter()
        .map(|call| call.body["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 4);
    assert_eq!(c.live().lock().behind.failures, 0, "the retry succeeded");
    assert_eq!(memory_written(&c).state.members.len(), 4);
    assert_eq!(c.pod_objects.len(), 4);
}

#[tokio::test(start_paused = true)]
async fn news_is_written_at_once_by_a_writer_waiting_after_a_failure() {
    let mut c = Cluster::new(MANIFEST);
    *c.behind.failing.lock() = 2;
    decided(&c).await;
    let failed = |c: &Cluster| {
        c.log
            .lock()
            .iter()
            .filter(|call| call.is("POST", "/pods") && call.code == 500)
            .count()
    };
    yielded_until(|| c.live().lock().behind.failures == 1).await;
    // Waiting its delay (at least a second): news from a reconcile has it try again now, as
    // news reconciled a job at once whatever its failed reconciles' delay.
    let waiting = tokio::time::Instant::now();
    assert_eq!(failed(&c), 1);
    decided(&c).await;
    yielded_until(|| failed(&c) == 2).await;
    assert_eq!(waiting.elapsed(), Duration::ZERO, "it waited out its delay");
    c.written().await;
    assert_eq!(c.live().lock().behind.failures, 0);
    let (_, calls) = c.reconcile().await;
    assert_eq!(
        calls
            .iter()
            .filter(|call| call.is("POST", "/pods") && call.code == 200)
            .count(),
        4
    );
}

#[tokio::test]
async fn clique_labels_are_written_off_the_reconciles_path_and_retried_when_refused() {
    let mut c = Cluster::new(MANIFEST);
    c.reconcile().await;
    c.schedule_all();
    c.reconcile().await;
    let key = (resources::namespace(&c.job), resources::name(&c.job));
    let is_label = |call: &Call| call.is("PATCH", "/pods/") && !call.query.contains("force");
    // The label patches are held: the reconcile that publishes the topology returns without
    // them, its memory and status written.
    let labels = c.labels.clone();
    let held = labels.gate.write().await;
    c.join(&[0, 1, 2, 3]).await;
    tokio::time::timeout(
        Duration::from_secs(10),
        reconcile(Arc::new(c.job.clone()), c.ctx.clone()),
    )
    .await
    .expect("the reconcile waited for its labels")
    .expect("reconcile");
    c.ctx.writes_settled("ml", "mnist").await;
    assert_eq!(
        c.live()
            .lock()
            .driver
            .memory()
            .state
            .topology
            .as_ref()
            .map(|t| t.version),
        Some(1)
    );
    assert!(
        c.log
            .lock()
            .iter()
            .any(|call| call.path.ends_with("/status"))
    );
    assert!(
        !c.log.lock().iter().any(is_label),
        "no label was answered yet"
    );
    // While they are in flight, another reconcile sends them not again. One that wants a label
    // other than the one sent (as if the topology changed since) leaves it to a reconcile asked
    // for when they are done.
    reconcile(Arc::new(c.job.clone()), c.ctx.clone())
        .await
        .expect("reconcile");
    assert!(!c.live().lock().labels_waiting);
    if let Some((_, (clique, _))) = c.live().lock().labels_sent.iter_mut().next() {
        *clique += 100;
    }
    reconcile(Arc::new(c.job.clone()), c.ctx.clone())
        .await
        .expect("reconcile");
    assert!(c.live().lock().labels_waiting);
    // Refused once released: the reconcile had not waited for them, so the refusal fails no
    // reconcile; it is counted for the delay before the next try.
    *labels.refuse.lock() = Some(500);
    drop(held);
    c.ctx.labels_written(&key).await;
    let refused = c.log.lock().iter().filter(|call| is_label(call)).count();
    assert_eq!(refused, 4, "each pod's label once");
    assert_eq!(c.live().lock().label_failures, 1);
    assert!(
        !c.live().lock().labels_waiting,
        "the retry asks for the reconcile"
    );
    // A reconcile whose calls the cluster does not carry out (its caches stay as they were):
    // how many labels it sent.
    let labels_sent = async |c: &Cluster| {
        let from = c.log.lock().len();
        reconcile(Arc::new(c.job.clone()), c.ctx.clone())
            .await
            .expect("reconcile");
        c.ctx.labels_written(&key).await;
        c.log.lock()[from..]
            .iter()
            .filter(|call| is_label(call))
            .count()
    };
    // Answered now: the next reconcile labels every pod, and the failures are forgotten.
    *labels.refuse.lock() = None;
    assert_eq!(labels_sent(&c).await, 4);
    assert_eq!(c.live().lock().label_failures, 0);
    // Until the cache shows those labels, a reconcile does not send them again.
    assert_eq!(labels_sent(&c).await, 0);
    // Shown (the cluster carries out the calls so far), they are not sent again either.
    c.reconcile().await;
    let (_, calls) = c.reconcile().await;
    assert!(
        calls.iter().all(|call| !is_label(call)),
        "labelled once: {calls:#?}"
    );
}

#[tokio::test]
async fn joined_members_get_a_data_aware_topology_in_the_config_map_and_events() {
    let mut c = Cluster::new(MANIFEST);
    c.reconcile().await;
    c.schedule_all();
    let (_, calls) = c.reconcile().await;
    assert_eq!(events(&calls), vec!["Scheduled"; 4]);
    c.join(&[0, 1, 2, 3]).await;
    let (_, calls) = c.reconcile().await;
    let reasons = events(&calls);
    assert_eq!(reasons.iter().filter(|r| *r == "Joined").count(), 4);
    assert!(reasons.contains(&"TopologyChanged".to_string()));
    assert_eq!(c.topology_version(), 1);
    // Pods are labelled with their clique.
    let relabelled: Vec<&Call> = calls
        .iter()
        .filter(|c| c.is("PATCH", "/pods/") && !c.query.contains("force"))
        .collect();
    assert_eq!(relabelled.len(), 4);
    let config_map = c
        .ctx
        .stores
        .config_maps
        .get(&ObjectRef::new("mnist-topology").within("ml"))
        .unwrap();
    let doc: murmur_core::contract::TopologyDocument =
        serde_json::from_str(&config_map.data.as_ref().unwrap()[resources::TOPOLOGY_KEY]).unwrap();
    assert_eq!(doc.members.len(), 4);
    assert_eq!(
        doc.members[2].address.as_deref(),
        Some("member-2-0.mnist-peers.ml.svc.cluster.local:7070")
    );
    // Cliques pair a member of each kind: every clique holds all ten classes.
    for m in &doc.members {
        let mates: Vec<u32> = doc
            .members
            .iter()
            .filter(|o| o.clique == m.clique)
            .map(|o| o.id)
            .collect();
        assert_eq!(mates.len(), 2);
        assert_ne!(mates[0] % 2, mates[1] % 2);
        let pod = &c.pod_objects[&format!("mnist-{}-0", m.id)];
        assert_eq!(
            pod.metadata.labels.as_ref().unwrap()[resources::LABEL_CLIQUE],
            m.clique.unwrap().to_string()
        );
    }
    // Trainers long-poll the same document from the operator.
    let handle = c.ctx.hub.job("ml", "mnist").unwrap();
    assert_eq!(handle.topology().borrow().as_ref().unwrap().version, 1);
    assert_eq!(c.status().phase, Some(murmur_core::api::JobPhase::Running));
    assert_eq!(c.status().member_summary.as_deref(), Some("4/4"));
}

#[tokio::test]
async fn a_preempted_pod_is_replaced_at_once_the_topology_repaired_and_nothing_counts_as_a_restart()
{
    for reason in observe::DISRUPTION_REASONS {
        let mut c = Cluster::running().await;
        c.advance(30);
        c.edit_pod("mnist-1-0", |p| {
            p.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
                type_: "DisruptionTarget".into(),
                status: "True".into(),
                reason: Some(reason.to_string()),
                message: Some("spot capacity reclaimed".into()),
                ..Default::default()
            }]);
        });
        let (action, calls) = c.reconcile().await;
        assert_eq!(pods_created(&calls), vec!["mnist-1-1"], "{reason}");
        let reasons = events(&calls);
        for expected in ["Preempted", "Left", "TopologyChanged", "Replaced"] {
            assert!(
                reasons.contains(&expected.to_string()),
                "{reason}: {reasons:?}"
            );
        }
        // The preemption event names the pod it is about.
        let preempted = calls
            .iter()
            .find(|c| c.is("POST", "/events") && c.body["reason"] == "Preempted")
            .unwrap();
        // The pod that was lost, not its replacement (this asserted the replacement's name
        // until the real control plane test asked for the preempted pod).
        assert_eq!(preempted.body["related"]["name"], "mnist-1-0");
        assert_eq!(preempted.body["regarding"]["name"], "mnist");
        assert!(preempted.body["note"].as_str().unwrap().contains(reason));
        assert_eq!(c.topology_version(), 2);
        let status = c.status();
        assert_eq!(status.preemptions, 1);
        assert_eq!(status.restarts, 0);
        assert_eq!(status.phase, Some(murmur_core::api::JobPhase::Degraded));
        assert_eq!(c.condition("Degraded").unwrap().0, "True");
        // The replacement's pod carries the next attempt; the old pod is left to its kubelet.
        assert!(!calls.iter().any(|c| c.method == "DELETE"));
        assert_eq!(action, Action::requeue(Duration::from_secs(30)));
        // It joins: back in the topology, Running again.
        c.schedule_all();
        c.join(&[1]).await;
        let (action, _) = c.reconcile().await;
        assert_eq!(c.topology_version(), 3);
        assert_eq!(c.status().phase, Some(murmur_core::api::JobPhase::Running));
        // A running job's status follows its trainers' progress: looked at again within
        // PROGRESS_REFRESH.
        assert_eq!(action, Action::requeue(super::decide::PROGRESS_REFRESH));
    }
}

#[tokio::test]
async fn a_replacement_after_an_operator_upgrade_runs_the_image_its_job_started_with() {
    let mut c = Cluster::running().await;
    let started_with = Settings::default().trainer_cuda_image;
    assert_eq!(
        c.status().trainer_image.as_deref(),
        Some(started_with.as_str()),
        "the status says which image the job runs"
    );
    // The operator is upgraded: its default image changes.
    c.with_settings_now(|s| {
        s.trainer_cuda_image = "registry.example/murmur-trainer:2.0-cuda".into();
    });
    c.advance(30);
    c.delete_pod("mnist-0-0").unwrap();
    let (_, calls) = c.reconcile().await;
    assert_eq!(pods_created(&calls), vec!["mnist-0-1"]);
    let replacement: Pod = serde_json::from_value(
        calls
            .iter()
            .find(|c| c.method == "POST")
            .unwrap()
            .body
            .clone(),
    )
    .unwrap();
    assert_eq!(
        replacement.spec.unwrap().containers[0].image.as_deref(),
        Some(started_with.as_str()),
        "the replacement runs what its peers run"
    );
    assert_eq!(
        c.status().trainer_image.as_deref(),
        Some(started_with.as_str())
    );
}

#[tokio::test]
async fn a_deleted_pod_and_a_lost_node_are_preemptions_too() {
    let mut c = Cluster::running().await;
    c.advance(30);
    // Someone deletes a pod (kubectl, a drain): it vanishes from the cache.
    c.delete_pod("mnist-0-0").unwrap();
    let (_, calls) = c.reconcile().await;
    assert_eq!(pods_created(&calls), vec!["mnist-0-1"]);
    assert_eq!(c.status().preemptions, 1);

    // node-a stops reporting: after the timeout its pods are preempted, force-deleted (no
    // kubelet will finish a graceful deletion) and replaced.
    c.schedule_all();
    c.join(&[0]).await;
    c.reconcile().await;
    c.advance(10);
    let down_since = c.now();
    c.nodes
        .apply_watcher_event(&Event::Apply(node("node-a", "Unknown", down_since)));
    let (_, calls) = c.reconcile().await;
    assert!(pods_created(&calls).is_empty(), "not before the timeout");
    c.advance(61);
    let (_, calls) = c.reconcile().await;
    assert_eq!(pods_created(&calls).len(), 4);
    let forced: Vec<&Call> = calls.iter().filter(|c| c.method == "DELETE").collect();
    assert_eq!(forced.len(), 4);
    for call in forced {
        assert_eq!(call.body["gracePeriodSeconds"], 0, "{:?}", call.body);
    }
    assert_eq!(c.status().preemptions, 5);
    assert_eq!(c.status().restarts, 0);
}

#[tokio::test]
async fn the_pod_cache_keeps_what_the_operator_reads_of_a_pod() {
    let c = Cluster::running().await;
    let pod = &c.pod_objects["mnist-0-0"];
    let cached = c
        .ctx
        .stores
        .pods
        .get(&ObjectRef::new("mnist-0-0").within("ml"))
        .unwrap();
    assert_eq!(cached.metadata.labels, pod.metadata.labels);
    assert_eq!(
        cached.metadata.owner_references,
        pod.metadata.owner_references
    );
    let (spec, cached_spec) = (pod.spec.as_ref().unwrap(), cached.spec.as_ref().unwrap());
    assert_eq!(cached_spec.node_name, spec.node_name);
    let cached_images: Vec<_> = cached_spec
        .containers
        .iter()
        .map(|c| (&c.name, &c.image))
        .collect();
    let images: Vec<_> = spec
        .containers
        .iter()
        .map(|c| (&c.name, &c.image))
        .collect();
    assert_eq!(cached_images, images);
    assert_eq!(
        cached.status.as_ref().unwrap().phase,
        pod.status.as_ref().unwrap().phase
    );
}

#[tokio::test]
async fn a_created_pod_the_watch_has_not_shown_is_awaited_until_pods_are_listed_again() {
    let mut c = Cluster::running().await;
    c.advance(30);
    c.delete_pod("mnist-2-0").unwrap();
    let (_, calls) = c.reconcile().await;
    assert_eq!(pods_created(&calls), vec!["mnist-2-1"]);
    // The pod watch is down (an API server restart): the cache never shows the replacement.
    c.delete_pod("mnist-2-1").unwrap();
    let answered = c.now();
    // Well past the watch's usual lag, the member is still awaited, not replaced again.
    c.advance(45);
    let (_, calls) = c.reconcile().await;
    assert!(
        pods_created(&calls).is_empty(),
        "replaced while awaited: {:?}",
        pods_created(&calls)
    );
    // A re-list begun before the create was answered proves nothing.
    c.ctx
        .pods_listed(Timestamp::from_second(answered.as_second() - 1).unwrap());
    let (_, calls) = c.reconcile().await;
    assert!(pods_created(&calls).is_empty(), "an older list settled it");
    assert_eq!(c.status().preemptions, 1);
    // One begun after it, lacking the pod: the pod is gone, and the member is replaced.
    c.ctx.pods_listed(c.now());
    let (_, calls) = c.reconcile().await;
    assert_eq!(pods_created(&calls), vec!["mnist-2-2"]);
    assert_eq!(c.status().preemptions, 2);
}

#[tokio::test]
async fn a_pod_a_relist_brings_is_awaited_until_the_list_is_the_cache() {
    let mut c = Cluster::running().await;
    c.advance(30);
    c.delete_pod("mnist-2-0").unwrap();
    let (_, calls) = c.reconcile().await;
    assert_eq!(pods_created(&calls), vec!["mnist-2-1"]);
    // The watch went down before it showed the replacement, and the pods are listed again.
    let mut replacement = CachedPod::of(&c.pod_objects["mnist-2-1"]);
    c.pods
        .apply_watcher_event(&Event::Delete(replacement.clone()));
    super::observe::keep_what_is_read_of_pod(&mut replacement);
    c.advance(5);
    let mut listing = None;
    let mut event = |c: &mut Cluster, e: Event<CachedPod>| {
        c.pods.apply_watcher_event(&e);
        watch::settle_awaited_pods(&c.ctx, &mut listing, &e);
    };
    event(&mut c, Event::Init);
    let listed: Vec<CachedPod> = c
        .ctx
        .stores
        .pods
        .state()
        .iter()
        .map(|p| (**p).clone())
        .chain([replacement])
        .collect();
    for pod in listed {
        event(&mut c, Event::InitApply(pod));
    }
    // Mid-list the cache still holds what it held before, without the replacement.
    let mid_list = ObjectRef::new("mnist-2-1").within("ml");
    assert!(c.ctx.stores.pods.get(&mid_list).is_none());
    let (_, calls) = c.reconcile().await;
    assert!(
        pods_created(&calls).is_empty(),
        "replaced beside its pod mid-list: {:?}",
        pods_created(&calls)
    );
    event(&mut c, Event::InitDone);
    assert!(c.ctx.stores.pods.get(&mid_list).is_some());
    let (_, calls) = c.reconcile().await;
    assert!(
        pods_created(&calls).is_empty(),
        "{:?}",
        pods_created(&calls)
    );
    assert_eq!(c.status().preemptions, 1);
}

#[tokio::test]
async fn a_crash_loop_backs_off_counts_restarts_and_fails_the_job_past_max_restarts() {
    let mut c = Cluster::running().await;
    let crash = |c: &mut Cluster, pod: &str| {
        c.edit_pod(pod, |p| {
            let s = p.status.as_mut().unwrap();
            s.phase = Some("Failed".into());
            s.container_statuses = Some(vec![terminated(101, "Error", None)]);
        });
    };
    crash(&mut c, "mnist-2-0");
    let (action, calls) = c.reconcile().await;
    assert!(pods_created(&calls).is_empty(), "backoff first");
    assert_eq!(events(&calls)[0], "MemberFailed");
    assert_eq!(c.status().restarts, 1);
    assert_eq!(action, Action::requeue(Duration::from_secs(10)));
    c.advance(10);
    let (_, calls) = c.reconcile().await;
    assert_eq!(pods_created(&calls), vec!["mnist-2-1"]);
    // Second crash: twice the wait.
    c.schedule_all();
    crash(&mut c, "mnist-2-1");
    let (action, _) = c.reconcile().await;
    assert_eq!(action, Action::requeue(Duration::from_secs(20)));
    c.advance(20);
    c.reconcile().await;
    c.schedule_all();
    crash(&mut c, "mnist-2-2");
    let (_, calls) = c.reconcile().await;
    // Three crashes > maxRestarts (2): the job fails and its live members are stopped.
    assert_eq!(c.status().phase, Some(murmur_core::api::JobPhase::Failed));
    assert_eq!(c.status().restarts, 3);
    let (status, reason) = c.condition("Failed").unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Failed"));
    let deleted: Vec<&str> = calls
        .iter()
        .filter(|c| c.method == "DELETE")
        .map(|c| c.path.rsplit('/').next().unwrap())
        .collect();
    assert_eq!(deleted, vec!["mnist-0-0", "mnist-1-0", "mnist-3-0"]);
    assert!(events(&calls).contains(&"Failed".to_string()));
}

#[tokio::test]
async fn an_invalid_spec_sets_invalid_spec_and_creates_nothing() {
    // The CRD would refuse it; an operator must not trust that (an older CRD, a direct write).
    let mut bad = job(MANIFEST);
    bad.spec.replicas.min = 5;
    let mut c = Cluster::new(MANIFEST);
    c.job = bad;
    let (_, calls) = c.reconcile().await;
    assert!(pods_created(&calls).is_empty());
    assert!(!calls.iter().any(|c| c.path.contains("/services/")));
    assert_eq!(events(&calls), vec!["InvalidSpec"]);
    let (status, reason) = c.condition("InvalidSpec").unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("True", "InvalidSpec"));
    let message = &c
        .status()
        .conditions
        .iter()
        .find(|c| c.type_ == "InvalidSpec")
        .unwrap()
        .message;
    assert!(message.contains("min <= target <= max"), "{message}");
    // Said once.
    let (_, calls) = c.reconcile().await;
    assert!(calls.is_empty(), "{calls:#?}");
    // Fixed: members are created and the condition flips.
    c.job.spec.replicas.min = 2;
    c.job.metadata.generation = Some(2);
    let (_, calls) = c.reconcile().await;
    assert_eq!(pods_created(&calls).len(), 4);
    assert_eq!(c.condition("InvalidSpec").unwrap().0, "False");
}

#[tokio::test]
async fn suspend_removes_the_pods_keeps_the_status_and_resume_starts_new_attempts() {
    let mut c = Cluster::running().await;
    c.job.spec.suspend = true;
    c.job.metadata.generation = Some(2);
    let (_, calls) = c.reconcile().await;
    let deleted = calls.iter().filter(|c| c.method == "DELETE").count();
    assert_eq!(deleted, 4);
    assert!(events(&calls).contains(&"Suspended".to_string()));
    assert_eq!(
        c.status().phase,
        Some(murmur_core::api::JobPhase::Suspended)
    );
    assert_eq!(c.condition("Suspended").unwrap().0, "True");
    // Pods gone (the cluster carried the deletes out): nothing is replaced while suspended.
    let (_, calls) = c.reconcile().await;
    assert!(pods_created(&calls).is_empty());
    assert_eq!(c.status().preemptions, 0);
    let (_, calls) = c.reconcile().await;
    assert!(calls.is_empty(), "{calls:#?}");
    c.job.spec.suspend = false;
    c.job.metadata.generation = Some(3);
    let (_, calls) = c.reconcile().await;
    assert_eq!(
        pods_created(&calls),
        vec!["mnist-0-1", "mnist-1-1", "mnist-2-1", "mnist-3-1"]
    );
    assert!(events(&calls).contains(&"Resumed".to_string()));
    c.schedule_all();
    c.join(&[0, 1, 2, 3]).await;
    c.reconcile().await;
    assert_eq!(
        c.topology_version(),
        2,
        "a newer version than before the suspend"
    );
    assert_eq!(c.condition("Suspended").unwrap().0, "False");
}

#[tokio::test]
async fn a_member_without_a_spot_node_falls_back_to_on_demand() {
    let mut c = Cluster::new(MANIFEST);
    c.reconcile().await;
    // Members 1..3 find spot nodes; member 0 waits.
    for name in ["mnist-1-0", "mnist-2-0", "mnist-3-0"] {
        c.edit_pod(name, |p| {
            p.spec.as_mut().unwrap().node_name = Some("node-a".into());
        });
    }
    c.reconcile().await;
    c.advance(120);
    let (_, calls) = c.reconcile().await;
    assert_eq!(pods_created(&calls), vec!["mnist-0-1"]);
    assert!(calls.iter().any(|c| c.is("DELETE", "/pods/mnist-0-0")));
    assert!(events(&calls).contains(&"FellBackToOnDemand".to_string()));
    let pod = &c.pod_objects["mnist-0-1"];
    assert!(
        pod.spec.as_ref().unwrap().affinity.is_none(),
        "no spot requirement"
    );
    assert_eq!(
        pod.metadata.annotations.as_ref().unwrap()[resources::ANNOTATION_CAPACITY],
        "on-demand"
    );
    let member = &c.status().members[0];
    assert_eq!(
        member.capacity,
        Some(murmur_core::api::MemberCapacity::OnDemand)
    );
    assert!(member.message.as_deref().unwrap().contains("fell back"));
    assert_eq!(c.status().preemptions, 0);
    assert_eq!(c.status().restarts, 0);
}

/// Member `id` of the running job reports `progress` to the operator, which takes it in.
async fn report(c: &Cluster, id: u32, progress: murmur_core::api::Progress) {
    let handle = c.ctx.hub.job("ml", "mnist").expect("registered");
    assert!(
        handle.deliver(Inbound::Status(murmur_core::contract::TrainerStatus {
            progress,
            topology_version: 1,
            ..murmur_core::contract::TrainerStatus::new(
                id,
                murmur_core::contract::TrainerState::Training,
            )
        }))
    );
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
}

fn at_step(step: u64) -> murmur_core::api::Progress {
    murmur_core::api::Progress {
        step,
        ..Default::default()
    }
}

#[tokio::test]
async fn a_restarted_operator_keeps_the_progress_until_a_trainer_reports_again() {
    let mut c = Cluster::running().await;
    for id in 0..4 {
        let progress = murmur_core::api::Progress {
            step: 120,
            loss: Some(0.3),
            accuracy: Some(0.8),
            metric: None,
            consensus_distance: None,
        };
        report(&c, id, progress).await;
    }
    c.advance(5);
    c.reconcile().await;
    assert_eq!(c.status().progress.as_ref().unwrap().step, 120);
    // The new operator has heard from nobody: step 0 would read as a job started over.
    c.restart_operator();
    c.advance(5);
    c.reconcile().await;
    let progress = c.status().progress.clone().unwrap();
    assert_eq!((progress.step, progress.accuracy), (120, Some(0.8)));
}

#[tokio::test]
async fn a_restarted_operator_never_shows_the_step_going_back() {
    let mut c = Cluster::running().await;
    report(&c, 0, at_step(90)).await;
    report(&c, 1, at_step(120)).await;
    c.advance(5);
    c.reconcile().await;
    assert_eq!(c.status().progress.as_ref().unwrap().step, 120);
    // Member 1, the one ahead, is lost during the leader change: the new operator hears only
    // from the members behind it. The job got to step 120 all the same.
    c.restart_operator();
    c.advance(5);
    c.reconcile().await;
    report(&c, 0, at_step(100)).await;
    c.advance(60);
    c.reconcile().await;
    assert_eq!(c.status().progress.as_ref().unwrap().step, 120);
}

#[tokio::test]
async fn a_restarted_operator_carries_on_with_the_same_topology_and_writes_nothing() {
    let mut c = Cluster::running().await;
    c.advance(30);
    c.edit_pod("mnist-3-0", |p| {
        p.metadata.deletion_timestamp = Some(Time(at(30)));
    });
    c.reconcile().await;
    let version = c.topology_version();
    let document = c.live().lock().driver.handle().topology().borrow().clone();
    c.restart_operator();
    let (_, calls) = c.reconcile().await;
    assert!(calls.is_empty(), "{calls:#?}");
    assert_eq!(c.topology_version(), version);
    let republished = c.live().lock().driver.handle().topology().borrow().clone();
    assert_eq!(
        republished, document,
        "trainers long-poll the same document"
    );
    assert_eq!(c.status().preemptions, 1);
    // Its memory holds the same attempts: the replacement joins as before.
    c.schedule_all();
    c.join(&[3]).await;
    c.reconcile().await;
    assert_eq!(c.topology_version(), version + 1);
}

#[tokio::test]
async fn completion_comes_from_the_trainers_termination_message_and_ttl_deletes_the_job() {
    let manifest = format!("{MANIFEST}  ttlSecondsAfterFinished: 60\n");
    let mut c = Cluster::new(&manifest);
    c.reconcile().await;
    c.schedule_all();
    c.join(&[0, 1, 2, 3]).await;
    c.reconcile().await;
    let done = r#"{"outcome":"done","step":100}"#;
    for name in ["mnist-0-0", "mnist-1-0", "mnist-2-0", "mnist-3-0"] {
        c.edit_pod(name, |p| {
            let s = p.status.as_mut().unwrap();
            s.phase = Some("Succeeded".into());
            s.container_statuses = Some(vec![terminated(0, "Completed", Some(done))]);
        });
    }
    c.advance(100);
    let (action, calls) = c.reconcile().await;
    assert_eq!(
        c.status().phase,
        Some(murmur_core::api::JobPhase::Succeeded)
    );
    assert!(events(&calls).contains(&"Succeeded".to_string()));
    assert_eq!(c.condition("Succeeded").unwrap().0, "True");
    assert!(pods_created(&calls).is_empty());
    assert_eq!(action, Action::requeue(Duration::from_secs(30)));
    c.advance(60);
    let (action, calls) = c.reconcile().await;
    assert!(
        calls
            .iter()
            .any(|c| c.is("DELETE", "/decentralizedtrainingjobs/mnist"))
    );
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn a_job_being_deleted_is_forgotten_without_a_write() {
    let mut c = Cluster::running().await;
    assert!(c.ctx.hub.job("ml", "mnist").is_some());
    c.job.metadata.deletion_timestamp = Some(Time(at(50)));
    let (action, calls) = c.reconcile().await;
    assert!(calls.is_empty(), "{calls:#?}");
    assert_eq!(action, Action::await_change());
    assert!(c.ctx.hub.job("ml", "mnist").is_none());
    assert!(c.ctx.jobs.lock().is_empty());
}

#[tokio::test]
async fn a_job_deleted_behind_the_operators_back_is_forgotten_by_the_sweep() {
    let c = Cluster::running().await;
    assert_eq!(c.ctx.forget_deleted(|_, _| true), 0);
    assert!(c.ctx.hub.job("ml", "mnist").is_some());
    assert_eq!(
        c.ctx
            .forget_deleted(|ns, name| (ns, name) != ("ml", "mnist")),
        1
    );
    assert!(c.ctx.hub.job("ml", "mnist").is_none());
    assert!(c.ctx.jobs.lock().is_empty());
}

#[tokio::test]
async fn the_lease_is_taken_with_optimistic_concurrency() {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let elector = lease::Elector::new(
        Api::namespaced(client, "murmur-system"),
        "murmur-operator",
        "replica-a",
        Duration::from_secs(15),
    );
    let server = tokio::spawn(async move {
        // GET: a lease another replica released.
        let (request, send) = handle.next_request().await.unwrap();
        assert_eq!(request.method(), "GET");
        assert_eq!(
            request.uri().path(),
            "/apis/coordination.k8s.io/v1/namespaces/murmur-system/leases/murmur-operator"
        );
        let stale = json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "murmur-operator", "namespace": "murmur-system", "resourceVersion": "41"},
            "spec": {"holderIdentity": "", "leaseDurationSeconds": 1,
                     "renewTime": "2020-01-01T00:00:00.000000Z", "leaseTransitions": 3}
        });
        send.send_response(
            Response::builder()
                .body(Body::from(serde_json::to_vec(&stale).unwrap()))
                .unwrap(),
        );
        // PUT: must carry the resourceVersion it read.
        let (request, send) = handle.next_request().await.unwrap();
        assert_eq!(request.method(), "PUT");
        let body: Value =
            serde_json::from_slice(&request.into_body().collect_bytes().await.unwrap()).unwrap();
        assert_eq!(body["metadata"]["resourceVersion"], "41");
        assert_eq!(body["spec"]["holderIdentity"], "replica-a");
        assert_eq!(body["spec"]["leaseTransitions"], 4);
        send.send_response(
            Response::builder()
                .body(Body::from(serde_json::to_vec(&body).unwrap()))
                .unwrap(),
        );
        // A second attempt loses the race: 409.
        let (_, send) = handle.next_request().await.unwrap();
        let mut mine = stale.clone();
        mine["spec"]["holderIdentity"] = json!("replica-a");
        send.send_response(
            Response::builder()
                .body(Body::from(serde_json::to_vec(&mine).unwrap()))
                .unwrap(),
        );
        let (_, send) = handle.next_request().await.unwrap();
        let conflict = json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                              "reason": "Conflict", "code": 409, "message": "the object has been modified"});
        send.send_response(
            Response::builder()
                .status(409)
                .body(Body::from(serde_json::to_vec(&conflict).unwrap()))
                .unwrap(),
        );
    });
    assert!(elector.try_hold().await.unwrap());
    assert!(
        !elector.try_hold().await.unwrap(),
        "a conflict is not leadership"
    );
    server.await.unwrap();
}

/// What can happen to a member's pod.
#[derive(Clone, Debug)]
enum PodEvent {
    Schedule(u32),
    Join(u32),
    Disrupt(u32, usize),
    Crash(u32),
    Delete(u32),
    Complete(u32),
    NodeDown,
    NodeUp,
    Wait(u8),
    /// The operator process restarts (a new leader, a crash, an upgrade).
    RestartOperator,
}

fn pod_event() -> impl proptest::strategy::Strategy<Value = PodEvent> {
    use proptest::prelude::*;
    prop_oneof![
        3 => (0..4u32).prop_map(PodEvent::Schedule),
        3 => (0..4u32).prop_map(PodEvent::Join),
        2 => (0..4u32, 0..observe::DISRUPTION_REASONS.len()).prop_map(|(m, r)| PodEvent::Disrupt(m, r)),
        1 => (0..4u32).prop_map(PodEvent::Crash),
        1 => (0..4u32).prop_map(PodEvent::Delete),
        1 => (0..4u32).prop_map(PodEvent::Complete),
        1 => Just(PodEvent::NodeDown),
        1 => Just(PodEvent::NodeUp),
        2 => any::<u8>().prop_map(PodEvent::Wait),
        1 => Just(PodEvent::RestartOperator),
    ]
}

impl Cluster {
    /// The pod of a member's newest attempt.
    fn newest(&self, member: u32) -> Option<String> {
        self.pod_objects
            .values()
            .filter_map(|p| observe::member_of(p).map(|k| (k, p)))
            .filter(|((m, _), _)| *m == member)
            .max_by_key(|((_, a), _)| *a)
            .and_then(|(_, p)| p.metadata.name.clone())
    }

    fn end_pod(&mut self, name: &str, code: i32, message: Option<&str>) {
        self.edit_pod(name, |p| {
            let s = p.status.as_mut().unwrap();
            if s.container_statuses.is_none() {
                s.phase = Some(if code == 0 { "Succeeded" } else { "Failed" }.into());
                s.container_statuses = Some(vec![terminated(code, "Error", message)]);
            }
        });
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]
    /// Whatever happens to pods and nodes, the controller keeps its promises.
    #[test]
    fn invariants_hold_under_any_sequence_of_pod_events(events in proptest::collection::vec(pod_event(), 1..40)) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            let mut c = Cluster::new(MANIFEST);
            c.reconcile().await;
            let mut crashes = 0u32;
            let mut newest_version = 0;
            for event in events {
                let before = c.live().lock().driver.memory().state.clone();
                let existing: std::collections::BTreeSet<String> = c.pod_objects.keys().cloned().collect();
                let restarting = matches!(event, PodEvent::RestartOperator);
                match event {
                    PodEvent::Schedule(m) => if let Some(p) = c.newest(m) {
                        c.edit_pod(&p, |p| {
                            let spec = p.spec.as_mut().unwrap();
                            if spec.node_name.is_none() && p.status.as_ref().unwrap().phase.as_deref() == Some("Pending") {
                                spec.node_name = Some("node-a".into());
                                p.status.as_mut().unwrap().phase = Some("Running".into());
                            }
                        });
                    },
                    PodEvent::Join(m) => {
                        let running = c.newest(m).is_some_and(|p| c.pod_objects[&p].status.as_ref().unwrap().phase.as_deref() == Some("Running"));
                        let known = c.live().lock().driver.memory().state.members.contains_key(&m);
                        if running && known { c.join(&[m]).await; }
                    }
                    PodEvent::Disrupt(m, r) => if let Some(p) = c.newest(m) {
                        c.edit_pod(&p, |p| {
                            p.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
                                type_: "DisruptionTarget".into(),
                                status: "True".into(),
                                reason: Some(observe::DISRUPTION_REASONS[r].into()),
                                ..Default::default()
                            }]);
                        });
                    },
                    PodEvent::Crash(m) => if let Some(p) = c.newest(m) {
                        let pod = &c.pod_objects[&p];
                        // Only a container that runs can crash.
                        if pod.spec.as_ref().unwrap().node_name.is_some() {
                            let fresh = pod.status.as_ref().unwrap().container_statuses.is_none()
                                && pod.status.as_ref().unwrap().conditions.is_none();
                            let current = observe::member_of(pod).map(|(_, a)| a)
                                == c.live().lock().driver.memory().state.members.get(&m).map(|r| r.attempt);
                            let finished = c.job.status.as_ref().and_then(|s| s.phase).is_some_and(|p| p.is_finished());
                            let node_lost = match c.ctx.stores.nodes.get(&ObjectRef::new("node-a")).map(|n| observe::node_state(Some(&n))) {
                                Some(observe::NodeState::NotReady { since }) => planner::seconds_since(since, c.now()) >= 60.0,
                                _ => false,
                            };
                            if fresh && current && !finished && !node_lost { crashes += 1; }
                            c.end_pod(&p, 1, None);
                        }
                    },
                    PodEvent::Delete(m) => if let Some(p) = c.newest(m) {
                        c.delete_pod(&p).unwrap();
                    },
                    PodEvent::Complete(m) => if let Some(p) = c.newest(m) {
                        c.end_pod(&p, 0, Some(r#"{"outcome":"done","step":100}"#));
                    },
                    PodEvent::NodeDown => {
                        let since = c.now();
                        c.nodes.apply_watcher_event(&Event::Apply(node("node-a", "False", since)));
                    }
                    PodEvent::NodeUp => {
                        let since = c.now();
                        c.nodes.apply_watcher_event(&Event::Apply(node("node-a", "True", since)));
                    }
                    PodEvent::Wait(s) => c.advance(i64::from(s)),
                    PodEvent::RestartOperator => c.restart_operator(),
                }
                // The cluster carries out each round of writes (deleted pods vanish): it settles
                // within a few reconciles, and then deciding again writes nothing.
                let mut calls = Vec::new();
                let mut settled = false;
                for _ in 0..4 {
                    let (_, round) = c.reconcile().await;
                    if round.is_empty() {
                        settled = true;
                        break;
                    }
                    calls.extend(round);
                }
                proptest::prop_assert!(settled, "still writing after 4 reconciles: {:#?}", calls);
                let status = c.status().clone();
                let state = c.live().lock().driver.memory().state.clone();
                let created = pods_created(&calls);
                // No pod is created twice, whoever creates it.
                for name in &created {
                    proptest::prop_assert!(!existing.contains(name), "{} created again", name);
                }
                // A restarted operator rebuilds its state from the cluster: it loses no member
                // and forgets no attempt. (It may act at once on what its predecessor was still
                // giving the cache time for, like a pod deleted right after its creation.)
                if restarting {
                    for (id, record) in &before.members {
                        let now = state.members.get(id);
                        proptest::prop_assert!(now.is_some_and(|r| r.attempt >= record.attempt), "member {} lost or went back: {:?} -> {:?}", id, record, now);
                    }
                }
                // The topology version trainers see never goes backwards.
                if let Some(version) = c.published_version() {
                    proptest::prop_assert!(version >= newest_version, "version {} after {}", version, newest_version);
                    newest_version = version;
                }
                // Never two creations of one pod name.
                let mut unique = created.clone();
                unique.sort();
                unique.dedup();
                proptest::prop_assert_eq!(unique.len(), created.len());
                // Restarts are the crashes of current attempts; preemptions never add to them.
                proptest::prop_assert!(status.restarts <= crashes, "{} restarts, {} crashes", status.restarts, crashes);
                proptest::prop_assert_eq!(status.restarts, state.restarts);
                proptest::prop_assert_eq!(status.preemptions as usize, state.preemptions.len());
                // The topology holds only members whose current attempt joined.
                if let Some(t) = &state.topology && !state.finishing() {
                    for id in t.graph.members() {
                        let joined = c.live().lock().driver.memory().joins.get(&id).map(|j| j.attempt);
                        proptest::prop_assert_eq!(joined, Some(state.members[&id].attempt), "member {}", id);
                    }
                    proptest::prop_assert!(t.graph.is_connected());
                }
            }
            Ok(())
        })?;
    }
}

/// Our CRD as the API server reports it, with these (type, status) conditions.
#[test]
fn a_crd_serves_jobs_only_once_established_with_its_names_accepted() {
    let crd = |conditions| serde_json::from_value(crd_with_conditions(conditions)).unwrap();
    assert_eq!(
        preflight::crd_not_ready(&crd(&[("NamesAccepted", "True"), ("Established", "True")])),
        None
    );
    let why = preflight::crd_not_ready(&crd(&[
        ("NamesAccepted", "False"),
        ("Established", "False"),
    ]))
    .unwrap();
    assert!(
        why.contains("NamesAccepted=False: NameConflict: \"dtj\" is already in use"),
        "{why}"
    );
    let why = preflight::crd_not_ready(&crd(&[])).unwrap();
    assert!(why.contains("Established is not reported yet"), "{why}");
    let mut other: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition =
        crd(&[("NamesAccepted", "True"), ("Established", "True")]);
    other.spec.versions[0].served = false;
    let why = preflight::crd_not_ready(&other).unwrap();
    assert!(why.contains("does not serve version v1alpha1"), "{why}");
}

fn crd_with_conditions(conditions: &[(&str, &str)]) -> Value {
    let mut crd = serde_json::to_value(murmur_core::api::crd()).unwrap();
    let conditions: Vec<Value> = conditions
        .iter()
        .map(|(t, s)| {
            json!({"type": t, "status": s, "reason": if *s == "True" { "Ok" } else { "NameConflict" },
                   "message": if *s == "True" { "ok" } else { "\"dtj\" is already in use" }})
        })
        .collect();
    crd["status"] = json!({"conditions": conditions});
    crd
}

/// An API server for the startup check: DecentralizedTrainingJobs answer `jobs` (and the CRD
/// is Established unless that is 404); access reviews allow everything but `denied`
/// ((verb, resource) pairs).
fn preflight_server(jobs: u16, denied: &'static [(&'static str, &'static str)]) -> Client {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    tokio::spawn(async move {
        while let Some((request, send)) = handle.next_request().await {
            let path = request.uri().path().to_string();
            let bytes = request.into_body().collect_bytes().await.unwrap();
            let (code, body) = if path.contains("/customresourcedefinitions/") {
                if jobs == 404 {
                    (
                        404,
                        json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": 404, "reason": "NotFound"}),
                    )
                } else {
                    (
                        200,
                        crd_with_conditions(&[("NamesAccepted", "True"), ("Established", "True")]),
                    )
                }
            } else if path.ends_with("/decentralizedtrainingjobs") {
                let body = if jobs == 200 {
                    json!({"apiVersion": "murmur.dev/v1alpha1", "kind": "DecentralizedTrainingJobList", "metadata": {}, "items": []})
                } else {
                    json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": jobs, "reason": "NotFound", "message": "the server could not find the requested resource"})
                };
                (jobs, body)
            } else {
                let mut review: Value = serde_json::from_slice(&bytes).unwrap();
                let attributes = &review["spec"]["resourceAttributes"];
                let verb = attributes["verb"].as_str().unwrap().to_string();
                let resource = attributes["resource"].as_str().unwrap().to_string();
                // As the chart grants it: the Lease in the operator's namespace only.
                let lease_elsewhere = resource == "leases"
                    && attributes["namespace"].as_str() != Some("murmur-system");
                let allowed =
                    !lease_elsewhere && !denied.iter().any(|(v, r)| *v == verb && *r == resource);
                review["status"] = json!({"allowed": allowed});
                (200, review)
            };
            send.send_response(
                Response::builder()
                    .status(code)
                    .body(Body::from(serde_json::to_vec(&body).unwrap()))
                    .unwrap(),
            );
        }
    });
    Client::new(service, "default")
}

const WAIT: Duration = Duration::from_secs(5);

#[tokio::test]
async fn the_startup_check_names_a_missing_crd_and_every_missing_permission() {
    let e = preflight::check(
        &preflight_server(404, &[]),
        false,
        Some("murmur-system"),
        WAIT,
    )
    .await
    .unwrap_err();
    assert!(matches!(e, preflight::PreflightError::CrdMissing));
    assert!(e.to_string().contains("kubectl apply -f crds/"), "{e}");

    let denied = &[("watch", "nodes"), ("create", "events")];
    let e = preflight::check(
        &preflight_server(200, denied),
        false,
        Some("murmur-system"),
        WAIT,
    )
    .await
    .unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("watch nodes, create events.events.k8s.io"),
        "{text}"
    );
    preflight::check(
        &preflight_server(200, &[]),
        false,
        Some("murmur-system"),
        WAIT,
    )
    .await
    .unwrap();
    // Without leader election the Lease is not checked; with it, in its own namespace only
    // (checked cluster-wide, a namespaced Role never passed: found against a real API server).
    preflight::check(&preflight_server(200, &[]), false, None, WAIT)
        .await
        .unwrap();
    let e = preflight::check(&preflight_server(200, &[]), false, Some("elsewhere"), WAIT)
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("get leases.coordination.k8s.io"),
        "{e}"
    );
    // With per-job NetworkPolicies, their verbs are checked too.
    let denied = &[("create", "networkpolicies")];
    preflight::check(
        &preflight_server(200, denied),
        false,
        Some("murmur-system"),
        WAIT,
    )
    .await
    .unwrap();
    let e = preflight::check(
        &preflight_server(200, denied),
        true,
        Some("murmur-system"),
        WAIT,
    )
    .await
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("create networkpolicies.networking.k8s.io"),
        "{e}"
    );
}

/// A bare API server for the whole operator (`run_with`): lists are empty, watches stay open,
/// access reviews allow, the Lease is stored (and reads as long expired, so another replica
/// takes it over), writes echo. Every request's permissions are collected; `watched` says when
/// every watch the operator starts has arrived.
fn bare_api_server(
    permissions: Arc<Mutex<std::collections::BTreeSet<Permission>>>,
    watched: tokio::sync::oneshot::Sender<()>,
    lease_holder: Option<&'static str>,
) -> Client {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    tokio::spawn(async move {
        let mut watched = Some(watched);
        let mut held = Vec::new();
        // `lease_holder`'s, just renewed: another replica leads.
        let mut lease: Option<Value> = lease_holder.map(|holder| {
            json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": "murmur-operator", "namespace": "murmur-system", "resourceVersion": "3"},
                "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                         "renewTime": Timestamp::now().to_string()},
            })
        });
        while let Some((request, send)) = handle.next_request().await {
            let call = read_call(request).await;
            let (method, body) = (&call.method, &call.body);
            let needs = call.permissions();
            let watches = {
                let mut p = permissions.lock();
                p.extend(needs.iter().cloned());
                p.iter().filter(|(v, _, _)| v == "watch").count()
            };
            if needs.iter().any(|(v, _, _)| v == "watch") {
                // Jobs, pods, services, config maps, secrets, nodes, network policies,
                // disruption budgets.
                if watches == 8
                    && let Some(tx) = watched.take()
                {
                    let _ = tx.send(());
                }
                held.push(send);
                continue;
            }
            let (code, answer) = match (method.as_str(), needs.first()) {
                ("GET", Some((verb, _, _))) if verb == "list" => (
                    200,
                    json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"}, "items": []}),
                ),
                ("GET", Some((_, _, r))) if r == "customresourcedefinitions" => (
                    200,
                    crd_with_conditions(&[("NamesAccepted", "True"), ("Established", "True")]),
                ),
                ("GET", Some((_, _, r))) if r == "leases" => match &lease {
                    Some(l) => (200, l.clone()),
                    None => (
                        404,
                        json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404}),
                    ),
                },
                (_, Some((_, _, r))) if r == "leases" => {
                    let mut l = body.clone();
                    l["metadata"]["resourceVersion"] = json!("7");
                    l["spec"]["renewTime"] = json!("2020-01-01T00:00:00.000000Z");
                    lease = Some(l.clone());
                    (200, l)
                }
                (_, Some((_, _, r)))
                    if r == "selfsubjectaccessreviews" || r == "subjectaccessreviews" =>
                {
                    let mut review = body.clone();
                    review["status"] = json!({"allowed": true});
                    (201, review)
                }
                (_, Some((_, _, r))) if r == "tokenreviews" => {
                    let mut review = body.clone();
                    review["status"] =
                        json!({"authenticated": true, "user": {"username": "observer"}});
                    (201, review)
                }
                // The operator labels its own pod while it leads (a merge patch).
                ("PATCH", Some((_, _, r))) if r == "pods" => (
                    200,
                    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "murmur-operator-a"}}),
                ),
                _ => (200, body.clone()),
            };
            send.send_response(
                Response::builder()
                    .status(code)
                    .body(Body::from(serde_json::to_vec(&answer).unwrap()))
                    .unwrap(),
            );
        }
        drop(held);
    });
    Client::new(service, "default")
}

/// A free port, and the options of replica "replica-a" in pod "murmur-operator-a", electing
/// itself on the Lease "murmur-operator" and serving on that port.
fn replica_a() -> (u16, OperatorOptions) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let options = OperatorOptions {
        settings: Settings::default(),
        listen: format!("127.0.0.1:{port}"),
        reads_per_second: crate::status::pacer::DEFAULT_READS_PER_SECOND,
        prices: Default::default(),
        token_audiences: Vec::new(),
        concurrency: 2,
        lease: Some(LeaseOptions {
            namespace: "murmur-system".into(),
            name: "murmur-operator".into(),
            duration: Duration::from_secs(15),
        }),
        instance: "replica-a".into(),
        crd_wait: WAIT,
        pod: Some(PodName {
            namespace: "murmur-system".into(),
            name: "murmur-operator-a".into(),
        }),
    };
    (port, options)
}

#[tokio::test]
async fn a_standby_told_to_stop_leaves_at_once_without_taking_the_lease() {
    // A rolling update stops the standby while the leader still leads: it must not wait for
    // the lease (and then lead while its pod terminates, holding the lease when killed).
    let (watched_tx, _watched) = tokio::sync::oneshot::channel();
    let client = bare_api_server(Arc::default(), watched_tx, Some("replica-b"));
    let (port, options) = replica_a();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let operator = tokio::spawn(run_with(client.clone(), options, async move {
        let _ = stopped.await;
    }));
    let mut standby = false;
    for _ in 0..200 {
        if let Ok(answer) = reqwest::get(format!("http://127.0.0.1:{port}/readyz")).await {
            standby = answer.text().await.unwrap_or_default() == "standby: another replica leads\n";
            if standby {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(standby, "never waited as a standby");
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), operator)
        .await
        .expect("the standby left at once")
        .unwrap()
        .expect("a clean exit");
    let lease: k8s_openapi::api::coordination::v1::Lease = Api::namespaced(client, "murmur-system")
        .get("murmur-operator")
        .await
        .unwrap();
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some("replica-b")
    );
}

#[tokio::test]
async fn the_operator_uses_exactly_the_permissions_it_declares() {
    let used = Arc::new(Mutex::new(std::collections::BTreeSet::new()));
    let network_policies = Some(resources::NetworkPolicySettings {
        operator_namespace: "murmur-system".into(),
        operator_port: 8470,
        dns_namespace: "kube-system".into(),
    });

    // The whole operator: startup check, lease, every watch, then a graceful shutdown.
    let (watched_tx, watched_rx) = tokio::sync::oneshot::channel();
    let client = bare_api_server(used.clone(), watched_tx, None);
    let (port, mut options) = replica_a();
    options.settings.network_policies = network_policies.clone();
    // Once every watch is up and the caches have listed, the replica leads.
    let became_ready = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ready = became_ready.clone();
    let shutdown = async move {
        let _ = watched_rx.await;
        for _ in 0..200 {
            let answer = match reqwest::get(format!("http://127.0.0.1:{port}/readyz")).await {
                Ok(a) => a.text().await.unwrap_or_default(),
                Err(_) => String::new(),
            };
            if answer == "leading\n" {
                ready.store(true, std::sync::atomic::Ordering::Relaxed);
                // An observer's read: its token and its access reviewed by the API server.
                let metrics = reqwest::Client::new()
                    .get(format!("http://127.0.0.1:{port}/metrics"))
                    .bearer_auth("observer-token")
                    .send()
                    .await
                    .unwrap();
                assert_eq!(metrics.status(), 200);
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(
        Duration::from_secs(60),
        run_with(client.clone(), options, shutdown),
    )
    .await
    .expect("every watch started and the operator shut down")
    .expect("the operator ran");
    assert!(became_ready.load(std::sync::atomic::Ordering::Relaxed));
    // Another replica takes the Lease the first released on shutdown at once: an update.
    let other = lease::Elector::new(
        Api::namespaced(client, "murmur-system"),
        "murmur-operator",
        "replica-b",
        Duration::from_secs(15),
    );
    assert!(other.try_hold().await.unwrap());

    // A job's whole life against the miniature cluster: every write reconcile can make.
    let manifest = format!("{MANIFEST}  ttlSecondsAfterFinished: 60\n");
    let mut c = Cluster::with_settings(
        &manifest,
        Settings {
            network_policies,
            ..Settings::default()
        },
    );
    // An earlier job's key Secret of the same name is deleted.
    let mut earlier = resources::secret(&c.job, "00");
    earlier.metadata.uid = Some("uid-earlier".into());
    earlier.metadata.owner_references = None;
    c.secrets.apply_watcher_event(&Event::Apply(earlier));
    c.reconcile().await;
    c.schedule_all();
    c.join(&[0, 1, 2, 3]).await;
    c.reconcile().await;
    c.advance(10);
    c.nodes
        .apply_watcher_event(&Event::Apply(node("node-a", "Unknown", c.now())));
    c.advance(61);
    c.reconcile().await;
    c.nodes
        .apply_watcher_event(&Event::Apply(node("node-a", "True", c.now())));
    c.schedule_all();
    // The replacements join: a second TopologyChanged.
    c.join(&[0, 1, 2, 3]).await;
    c.reconcile().await;
    let done = r#"{"outcome":"done","step":100}"#;
    for name in ["mnist-0-1", "mnist-1-1", "mnist-2-1", "mnist-3-1"] {
        c.edit_pod(name, |p| {
            let s = p.status.as_mut().unwrap();
            s.phase = Some("Succeeded".into());
            s.container_statuses = Some(vec![terminated(0, "Completed", Some(done))]);
        });
    }
    c.reconcile().await;
    c.advance(61);
    c.reconcile().await;
    // A warning said again within minutes (a quota that refuses pods again after it let some
    // in): a series of its Event.
    let again = planner::Event::warning(planner::Reason::PodsRejected, None, "quota".into());
    for _ in 0..2 {
        writes::record_event(&c.ctx, &c.job, &again, None).await;
    }
    let calls = c.log.lock().clone();
    used.lock().extend(calls.iter().flat_map(Call::permissions));

    let used = used.lock().clone();
    // Access reviews are every account's right (system:basic-user); they need no grant.
    let used: std::collections::BTreeSet<Permission> = used
        .into_iter()
        .filter(|(_, _, r)| r != "selfsubjectaccessreviews")
        .collect();
    let declared = declared();
    let unused: Vec<_> = declared.difference(&used).collect();
    let undeclared: Vec<_> = used.difference(&declared).collect();
    assert!(
        unused.is_empty() && undeclared.is_empty(),
        "declared but never used: {unused:?}; used but not declared: {undeclared:?}"
    );
}

/// Log lines, for searching.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn the_job_key_never_leaves_its_secret() {
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);

    let mut c = Cluster::running().await;
    c.advance(30);
    c.delete_pod("mnist-2-0").unwrap();
    c.reconcile().await;
    let key = c.live().lock().key_hex.clone();
    assert_eq!(key.len(), 64);
    // The forms it could leak in: as written, and base64 as a Secret carries it.
    let encoded = serde_json::to_value(k8s_openapi::ByteString(key.as_bytes().to_vec())).unwrap();
    let forms = [key.clone(), encoded.as_str().unwrap().to_string()];
    let leaks = |text: &str| forms.iter().any(|f| text.contains(f.as_str()));

    let calls = c.log.lock().clone();
    let (secret, others): (Vec<&Call>, Vec<&Call>) =
        calls.iter().partition(|c| c.path.contains("/secrets/"));
    assert!(
        secret.iter().any(|c| leaks(&c.body.to_string())),
        "the search finds the key where it belongs"
    );
    for call in others {
        assert!(
            !leaks(&call.body.to_string()),
            "{} {} carries the key",
            call.method,
            call.path
        );
    }

    // The status API and metrics, as an observer allowed to read everything sees them.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(
        axum::serve(
            listener,
            crate::status::router(
                c.ctx.hub.clone(),
                Arc::new(crate::status::access::LocalUser),
                crate::status::pacer::DEFAULT_READS_PER_SECOND,
            ),
        )
        .into_future(),
    );
    let job = "/api/v1/namespaces/ml/jobs/mnist";
    for path in [
        "/api/v1/jobs".to_string(),
        job.into(),
        format!("{job}/events"),
        format!("{job}/series"),
        format!("{job}/topology"),
        "/metrics".into(),
        "/".into(),
    ] {
        let text = reqwest::get(format!("{base}{path}"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(!text.is_empty() || path.ends_with("topology"), "{path}");
        assert!(!leaks(&text), "{path} shows the key");
    }

    let logs = String::from_utf8(logs.0.lock().clone()).unwrap();
    assert!(logs.contains("TRACE"), "logs were captured at every level");
    assert!(!leaks(&logs), "the logs show the key");
}

#[test]
fn a_large_memory_is_gzipped_into_its_config_map_and_reads_back_the_same() {
    let job = job(MANIFEST);
    let small = BTreeMap::from([("state.json".to_string(), "{}".to_string())]);
    let cm = resources::config_map(&job, small.clone());
    assert_eq!(
        cm.data.as_ref(),
        Some(&small),
        "small: plain, kubectl-readable"
    );
    assert!(cm.binary_data.is_none());
    assert_eq!(resources::config_map_data(&cm).unwrap(), small);

    // Past the plain limit every key is gzipped, and reads back unchanged.
    let joins: String = (0..40_000)
        .map(|i| format!("{{\"member\":{i},\"histogram\":[0,480,0,17,0,0,0,0,0,0]}},"))
        .collect();
    let large = BTreeMap::from([
        ("joins.json".to_string(), joins),
        ("state.json".to_string(), "{}".to_string()),
    ]);
    assert!(large["joins.json"].len() > resources::CONFIG_MAP_PLAIN_BYTES);
    let cm = resources::config_map(&job, large.clone());
    assert!(cm.data.is_none());
    let packed = cm.binary_data.as_ref().unwrap();
    assert_eq!(
        packed.keys().collect::<Vec<_>>(),
        ["joins.json.gz", "state.json.gz"]
    );
    assert!(packed["joins.json.gz"].0.len() < large["joins.json"].len() / 5);
    assert_eq!(resources::config_map_data(&cm).unwrap(), large);

    // A key that is not gzip is named, as the job's memory error.
    let mut broken = cm.clone();
    broken.metadata.namespace = Some("ml".into());
    broken.binary_data.as_mut().unwrap().insert(
        "state.json.gz".into(),
        k8s_openapi::ByteString(b"not gzip".to_vec()),
    );
    let e = memory_of(&job, Some(&broken), &[], &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("ConfigMap ml/mnist-topology"), "{e}");
    assert!(e.contains("state.json.gz: not gzipped UTF-8"), "{e}");
}

/// Progress alone is written now and then, whatever the size of the job; a change of phase,
/// condition or membership at once.
#[test]
fn progress_alone_is_written_at_most_every_refresh() {
    use super::decide::{PROGRESS_REFRESH, status_due};
    use murmur_core::api::{DecentralizedTrainingJobStatus, JobPhase, MemberStatus, Progress};
    let at = |s: i64| Timestamp::from_second(1_800_000_000 + s).unwrap();
    let current = DecentralizedTrainingJobStatus {
        phase: Some(JobPhase::Running),
        progress: Some(Progress {
            step: 100,
            ..Progress::default()
        }),
        members: vec![MemberStatus {
            id: 0,
            step: 100,
            ..MemberStatus::default()
        }],
        ..DecentralizedTrainingJobStatus::default()
    };
    let mut moved = current.clone();
    moved.progress.as_mut().unwrap().step = 150;
    moved.members[0].step = 150;
    let refresh = PROGRESS_REFRESH.as_secs() as i64;
    assert!(!status_due(Some(&current), &current, None, at(0)));
    assert!(status_due(None, &current, Some(at(0)), at(1)));
    assert!(!status_due(
        Some(&current),
        &moved,
        Some(at(0)),
        at(refresh - 1)
    ));
    assert!(status_due(Some(&current), &moved, Some(at(0)), at(refresh)));
    assert!(status_due(Some(&current), &moved, None, at(0)));
    let mut failed = moved.clone();
    failed.phase = Some(JobPhase::Failed);
    assert!(status_due(Some(&current), &failed, Some(at(0)), at(1)));
}

/// A large wave of one kind of event costs a dozen Kubernetes Events: the first ten one by
/// one, the rest as one naming their members.
#[tokio::test]
async fn similar_events_beyond_ten_are_recorded_as_one() {
    let manifest = MANIFEST.replace(
        "replicas: {min: 2, target: 4, max: 4}",
        "replicas: {min: 20, target: 25, max: 25}",
    );
    let mut c = Cluster::new(&manifest);
    c.reconcile().await;
    c.schedule_all();
    let (_, calls) = c.reconcile().await;
    assert_eq!(events(&calls), vec!["Scheduled"; 11]);
    let combined = calls
        .iter()
        .filter(|c| c.is("POST", "/events"))
        .map(|c| c.body["note"].as_str().unwrap().to_string())
        .next_back()
        .unwrap();
    assert!(
        combined.starts_with("15 more Scheduled events (the status API lists each); members "),
        "{combined}"
    );
}

#[tokio::test]
async fn a_large_job_is_created_and_labelled_a_burst_per_reconcile() {
    let target = planner::CREATES_PER_PLAN + decide::RELABELS_PER_RECONCILE / 2;
    let manifest = MANIFEST.replace(
        "replicas: {min: 2, target: 4, max: 4}",
        &format!("replicas: {{min: {target}, target: {target}, max: {target}}}"),
    );
    let mut c = Cluster::new(&manifest);
    let (again, calls) = c.reconcile().await;
    assert_eq!(pods_created(&calls).len(), planner::CREATES_PER_PLAN);
    assert_eq!(
        again,
        Action::requeue(Duration::from_secs(1)),
        "the rest at once"
    );
    let (_, calls) = c.reconcile().await;
    assert_eq!(
        pods_created(&calls).len(),
        target - planner::CREATES_PER_PLAN
    );
    c.schedule_all();
    c.reconcile().await;
    c.join(&(0..target as u32).collect::<Vec<_>>()).await;
    let labelled = |calls: &[Call]| {
        calls
            .iter()
            .filter(|c| c.is("PATCH", "/pods/") && !c.query.contains("force"))
            .count()
    };
    let (again, calls) = c.reconcile().await;
    let handle = c.ctx.hub.job("ml", "mnist").unwrap();
    let published = handle.topology().borrow().as_ref().map(|t| t.version);
    assert_eq!(published, Some(1), "published with the first labels");
    assert_eq!(labelled(&calls), decide::RELABELS_PER_RECONCILE);
    assert_eq!(again, Action::requeue(Duration::from_secs(1)));
    let (_, calls) = c.reconcile().await;
    assert_eq!(labelled(&calls), target - decide::RELABELS_PER_RECONCILE);
    let (_, calls) = c.reconcile().await;
    assert_eq!(labelled(&calls), 0);
}

/// A member whose pod cannot start for one reason and then another (a volume not mounted yet,
/// then its image not pulled) gets an Event for each, each with its own note and its problem's
/// kind as the action. The same problem said again is a repeat: a series of its first Event.
#[tokio::test]
async fn each_problem_a_member_cannot_start_for_is_an_event_of_its_own() {
    let c = Cluster::new(MANIFEST);
    let problem = |reason: &str, message: &str| crate::member::NotStarting {
        reason: reason.into(),
        message: message.into(),
    };
    let said = |p| planner::not_starting(0, 0, &p);
    let pod = || Some("mnist-0-0".to_string());
    for p in [
        problem("FailedMount", "failed to sync secret cache"),
        problem("ErrImagePull", "pull access denied"),
        problem("ErrImagePull", "pull access denied"),
    ] {
        writes::record_event(&c.ctx, &c.job, &said(p), pod()).await;
    }
    let calls: Vec<Call> = c.log.lock().to_vec();
    // (method, the action of a new Event or the Event a series patches, and its count).
    let written: Vec<(String, String)> = calls
        .iter()
        .filter(|c| c.is("POST", "/events") || c.is("PATCH", "/events/"))
        .map(|c| match c.method.as_str() {
            "POST" => (
                c.body["action"].as_str().unwrap().to_string(),
                c.body["metadata"]["name"].as_str().unwrap().to_string(),
            ),
            _ => (
                format!("series {}", c.body["series"]["count"]),
                c.path.rsplit('/').next().unwrap().to_string(),
            ),
        })
        .collect();
    let actions: Vec<&str> = written.iter().map(|(a, _)| a.as_str()).collect();
    assert_eq!(actions, ["FailedMount", "ErrImagePull", "series 2"]);
    // The same problem again: a series of the second Event.
    assert_eq!(written[2].1, written[1].1);
    let notes: Vec<&str> = calls
        .iter()
        .filter(|c| c.is("POST", "/events"))
        .filter_map(|c| c.body["note"].as_str())
        .collect();
    assert!(notes[1].contains("pull access denied"), "{notes:?}");
}
