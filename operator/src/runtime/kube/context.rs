//! The watch caches reconcile reads and what the operator process holds of each job between
//! reconciles.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Node, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use murmur_core::api::{DecentralizedTrainingJob, DecentralizedTrainingJobStatus};
use murmur_core::topology::MemberId;
use parking_lot::Mutex;
use tokio::sync::mpsc;

use super::cached_pod::CachedPod;
use super::error::Error;
use super::events::EventWriter;
use super::labels::LABEL_JOB;
use super::reconcile::listen;
use super::writes::{RETRY_MAX, retry_delays};
use super::{OperatorMetrics, Settings, decide, lease, observe, resources, start_events, writer};
use crate::driver::JobDriver;
use crate::status::Hub;

/// The watch caches reconcile reads (it never lists: an unchanged job costs no request).
#[derive(Clone)]
pub struct Stores {
    pub pods: Store<CachedPod>,
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
pub(super) struct Live {
    uid: String,
    /// The job's driver: memory, trainers' posts, publishing.
    pub(super) driver: JobDriver,
    pub(super) key_hex: String,
    /// Pods created and when their creates were answered (`Timestamp::MAX` until then).
    pub(super) created: BTreeMap<(MemberId, u32), Timestamp>,
    /// The spec's validation result for a generation (CEL evaluation is not free).
    pub(super) validated: Option<(Option<i64>, Option<String>)>,
    /// When the job's status was last written, and what (progress alone is written now and
    /// then).
    pub(super) status_written: Option<(Timestamp, DecentralizedTrainingJobStatus)>,
    /// The memory the job's ConfigMap holds, as this operator last wrote or compared it.
    pub(super) config_map_memory: Option<writer::KnownMemory>,
    /// The job's writes, behind its reconciles.
    pub(super) behind: writer::Behind,
    /// The clique labels being written for this job, off the reconcile's path; one at a time.
    pub(super) labelling: Option<tokio::task::JoinHandle<()>>,
    /// Label writes that failed in a row: the next is tried after a doubling delay.
    pub(super) label_failures: u32,
    /// A reconcile left labels to a later one while a labelling ran: that one is asked for
    /// when the labelling ends.
    pub(super) labels_waiting: bool,
    /// Clique labels sent (pod -> clique, when) that the pod cache has not shown yet: not sent
    /// again meanwhile.
    pub(super) labels_sent: HashMap<String, (u32, Timestamp)>,
    /// The job's pods among the cache's, read once for each version of each pod.
    pub(super) pods: observe::JobPodIndex,
}

pub(super) type JobKey = (String, String);

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
    /// Writes the job's Kubernetes Events (a repeated warning as a series).
    pub(super) events: EventWriter,
    pub(super) jobs: Mutex<HashMap<JobKey, Arc<Mutex<Live>>>>,
    /// The delays before the next retries of jobs whose last reconcile failed.
    pub(super) retries: Mutex<HashMap<JobKey, backon::ExponentialBackoff>>,
    /// Reconcile a job now (a trainer joined).
    pub(super) trigger: mpsc::UnboundedSender<ObjectRef<DecentralizedTrainingJob>>,
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
        let events = EventWriter::new(client.clone(), instance.clone());
        let ctx = Arc::new(Self {
            client,
            stores,
            hub,
            metrics,
            settings,
            instance,
            clock: Arc::new(Timestamp::now),
            leadership,
            events,
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
            events: self.events.clone(),
            jobs: Mutex::new(self.jobs.lock().clone()),
            retries: Mutex::default(),
            trigger: self.trigger.clone(),
        })
    }

    /// The job's live record: created on its first reconcile in this process, from the
    /// ConfigMap and Secret it owns when there are (an operator restart) — never from objects of
    /// another job of the same name (one deleted and created again) — and with attempts that
    /// follow any leftovers (`cached_pods`: the job's pods and other pods of its name, read only
    /// when the record is created), so no pod name is taken twice; registered
    /// with the hub.
    pub(super) fn live(
        self: &Arc<Self>,
        job: &DecentralizedTrainingJob,
        cached_pods: impl FnOnce() -> (Vec<Arc<CachedPod>>, Vec<Arc<CachedPod>>),
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
        let (pods, leftovers) = cached_pods();
        let pods: Vec<&CachedPod> = pods.iter().map(|p| p.as_ref()).collect();
        let leftovers: Vec<&CachedPod> = leftovers.iter().map(|p| p.as_ref()).collect();
        let memory = decide::memory_of(job, config_map.as_deref(), &pods, &leftovers)?;
        let secret = self
            .stores
            .secrets
            .get(&ObjectRef::new(&resources::secret_name(&key.1)).within(&key.0))
            .filter(|s| ours(&s.metadata));
        let key_hex = secret
            .as_ref()
            .and_then(|s| s.data.as_ref()?.get(resources::SECRET_KEY).cloned())
            .and_then(|b| String::from_utf8(b.0).ok())
            .unwrap_or_else(crate::runtime::new_job_key);
        let (mut driver, inbox) = JobDriver::start(
            self.hub.clone(),
            &key.0,
            &key.1,
            key_hex.clone().into_bytes(),
            memory,
        );
        if let Some(progress) = job.status.as_ref().and_then(|s| s.progress.as_ref()) {
            driver.resume_step(progress.step);
        }
        if let Some(traffic) = job.status.as_ref().and_then(|s| s.traffic.clone()) {
            driver.resume_traffic(traffic);
        }
        let live = Arc::new(Mutex::new(Live {
            uid,
            driver,
            key_hex,
            created: BTreeMap::new(),
            validated: None,
            status_written: None,
            config_map_memory: None,
            behind: Default::default(),
            labelling: None,
            label_failures: 0,
            labels_waiting: false,
            labels_sent: HashMap::new(),
            pods: Default::default(),
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
    pub(super) fn pod_seen(&self, pod: &CachedPod) {
        let (Some(key), Some(job)) = (observe::member_of(pod), pod.labels().get(LABEL_JOB)) else {
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
    pub(super) fn pods_listed(&self, since: Timestamp) {
        let jobs: Vec<Arc<Mutex<Live>>> = self.jobs.lock().values().cloned().collect();
        for live in jobs {
            live.lock().created.retain(|_, t| *t >= since);
        }
    }

    /// Wait until everything decided for the job is written (or given up on: it was forgotten).
    pub async fn writes_settled(&self, namespace: &str, name: &str) {
        let live = self
            .jobs
            .lock()
            .get(&(namespace.to_string(), name.to_string()))
            .cloned();
        if let Some(live) = live {
            writer::settled(&live).await;
        }
    }

    /// Wait until every job's writes are done, for at most `within` (a replica that stops
    /// writes what it decided before it lets go of its lease).
    pub async fn all_writes_settled(&self, within: Duration) {
        let jobs: Vec<Arc<Mutex<Live>>> = self.jobs.lock().values().cloned().collect();
        let all = futures::future::join_all(jobs.iter().map(|live| writer::settled(live)));
        if tokio::time::timeout(within, all).await.is_err() {
            tracing::warn!(?within, "stopping with writes still under way");
        }
    }

    /// Wait until the job's clique labels in flight are written (or given up on).
    #[cfg(test)]
    pub(super) async fn labels_written(&self, job: &JobKey) {
        let task = self
            .jobs
            .lock()
            .get(job)
            .and_then(|live| live.lock().labelling.take());
        if let Some(task) = task {
            let _ = task.await;
        }
    }

    /// How long to wait before retrying the job's reconcile, which has just failed.
    pub(super) fn retry_delay(&self, job: JobKey) -> Duration {
        self.retries
            .lock()
            .entry(job)
            .or_insert_with(retry_delays)
            .next()
            .unwrap_or(RETRY_MAX)
    }

    /// The job's reconcile succeeded: its next failure is retried soon again.
    pub(super) fn succeeded(&self, job: &JobKey) {
        self.retries.lock().remove(job);
    }

    pub(super) fn forget(&self, namespace: &str, name: &str) {
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
