//! The jobs a status router serves. A runtime registers each job it runs, publishes its view,
//! topology document, events and progress samples here, and receives what the job's trainers
//! post (already authenticated) through the job's inbox.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use axum::body::Bytes;
use murmur_core::contract::{
    JoinReport, MemberView, PeerEvent, TopologyDocument, TrainerStatus, ViewBook,
};
use parking_lot::{Mutex, RwLock};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, watch};

use super::replay::{Heard, Refused};
use super::view::{JobEvent, JobView, SeriesPoint};
use crate::member::Health;
use murmur_core::contract::control::Envelope;

/// What a job's trainers told the control plane.
#[derive(Clone, Debug, PartialEq)]
pub enum Inbound {
    Join(JoinReport),
    Status(TrainerStatus),
    PeerEvent(PeerEvent),
}

/// Events a job's status API keeps (the newest; Kubernetes Events keep them all in a cluster).
pub const EVENTS_KEPT: usize = 5_000;
/// Progress samples a job's status API keeps (the newest): at most a few MB per job however
/// many members post for however long.
pub const SERIES_KEPT: usize = 20_000;

/// An append-only log that keeps its newest `cap` entries. Indexes count every entry ever
/// pushed, so a reader that asks `from` the index it was last given never sees one twice.
#[derive(Debug)]
pub struct Bounded<T> {
    first: usize,
    items: std::collections::VecDeque<T>,
    cap: usize,
}

impl<T: Clone> Bounded<T> {
    pub fn new(cap: usize) -> Self {
        Self {
            first: 0,
            items: std::collections::VecDeque::new(),
            cap: cap.max(1),
        }
    }

    pub fn push(&mut self, item: T) {
        if self.items.len() == self.cap {
            self.items.pop_front();
            self.first += 1;
        } else if self.items.len() == self.items.capacity() {
            // Doubling, but never past `cap`: a full series of 20 000 samples held 32 768
            // slots.
            let len = self.items.len();
            self.items
                .reserve_exact((len * 2).max(8).min(self.cap) - len);
        }
        self.items.push_back(item);
    }

    /// The entries it has room for without growing.
    #[cfg(test)]
    pub(super) fn room(&self) -> usize {
        self.items.capacity()
    }

    /// The entries kept from index `from` on (from the oldest kept, if `from` is older), and
    /// the index after the last.
    pub fn since(&self, from: usize) -> (Vec<T>, usize) {
        let skip = from.saturating_sub(self.first);
        let items: Vec<T> = self.items.iter().skip(skip).cloned().collect();
        (items, self.first + self.items.len())
    }
}

/// Each member's view of the topology, and a channel per member whose trainer follows it.
#[derive(Default)]
struct ViewBoard {
    book: ViewBook,
    channels: HashMap<u32, watch::Sender<Option<Arc<MemberView>>>>,
}

impl ViewBoard {
    fn follow(&mut self, doc: &TopologyDocument) {
        let changes = self.book.follow(doc);
        for view in changes.changed {
            let id = view.member;
            let view = Some(view);
            match self.channels.get(&id) {
                Some(channel) => {
                    channel.send_replace(view);
                }
                None => {
                    self.channels.insert(id, watch::Sender::new(view));
                }
            }
        }
        // Followers the topology leaves out hear so, to pause and report their join again.
        for (&id, channel) in &self.channels {
            if self.book.view(id).is_none() {
                channel.send_replace(Some(Arc::new(MemberView::outside(doc, id))));
            }
        }
    }
}

/// A member attempt's (step, quality), as last sampled.
type Sample = (u64, Option<f64>);

/// A published view and its JSON, serialized once when first read: a reconcile publishes a
/// view each time, and nobody may read it before the next.
struct Published {
    view: Arc<JobView>,
    json: std::sync::OnceLock<Option<Bytes>>,
}

/// One job's published state.
pub struct JobHandle {
    key: Vec<u8>,
    view: watch::Sender<Option<Arc<Published>>>,
    topology: watch::Sender<Option<Arc<TopologyDocument>>>,
    views: Mutex<ViewBoard>,
    events: Mutex<Bounded<JobEvent>>,
    series: Mutex<Bounded<SeriesPoint>>,
    /// The newest (step, quality) sampled per member attempt, so the series holds changes only.
    sampled: Mutex<BTreeMap<(u32, u32), Sample>>,
    /// The newest signed post accepted per member, so a replayed one is refused.
    heard: Mutex<Heard>,
    inbox: mpsc::UnboundedSender<Inbound>,
}

impl JobHandle {
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    pub fn view(&self) -> Option<Arc<JobView>> {
        self.view.borrow().as_ref().map(|p| p.view.clone())
    }

    /// The view as JSON (`None` before the first view, or if it cannot be serialized).
    pub fn view_json(&self) -> Option<Bytes> {
        let published = self.view.borrow().clone()?;
        published
            .json
            .get_or_init(|| match serde_json::to_vec(&*published.view) {
                Ok(json) => Some(json.into()),
                Err(e) => {
                    tracing::error!(job = %published.view.name, error = %e, "cannot serialize the job's view");
                    None
                }
            })
            .clone()
    }

    pub fn topology(&self) -> watch::Receiver<Option<Arc<TopologyDocument>>> {
        self.topology.subscribe()
    }

    /// Member `id`'s view of the topology, as it changes: `None` before the first document, an
    /// `outside` view while the topology leaves the member out.
    pub fn member_view(&self, id: u32) -> watch::Receiver<Option<Arc<MemberView>>> {
        let mut board = self.views.lock();
        let outside = match (&*self.topology.borrow(), board.book.view(id)) {
            (Some(doc), None) => Some(Arc::new(MemberView::outside(doc, id))),
            _ => None,
        };
        board
            .channels
            .entry(id)
            .or_insert_with(|| watch::Sender::new(outside))
            .subscribe()
    }

    /// Publish a topology document; older or equal versions are ignored. Only the members
    /// whose view changed are woken.
    pub fn set_topology(&self, doc: TopologyDocument) {
        let mut board = self.views.lock();
        let doc = Arc::new(doc);
        let newer = self.topology.send_if_modified(|current| {
            if current.as_ref().is_some_and(|c| c.version >= doc.version) {
                return false;
            }
            *current = Some(doc.clone());
            true
        });
        if newer {
            board.follow(&doc);
        }
    }

    pub fn push_event(&self, event: JobEvent) {
        self.events.lock().push(event);
    }

    /// The events kept from index `from` on, and the index after them.
    pub fn events(&self, from: usize) -> (Vec<JobEvent>, usize) {
        self.events.lock().since(from)
    }

    pub fn record(&self, point: SeriesPoint) {
        self.series.lock().push(point);
    }

    /// Record a member attempt's status as a progress sample at `t` seconds, unless its step
    /// and accuracy are what was last sampled (trainers repeat their status).
    pub fn sample(&self, t: f64, attempt: u32, status: &TrainerStatus) {
        let p = &status.progress;
        let key = (status.member_id, attempt);
        let sample = (p.step, p.quality().map(|q| q.value));
        if self.sampled.lock().insert(key, sample) == Some(sample) {
            return;
        }
        self.record(SeriesPoint {
            t,
            member: status.member_id,
            attempt,
            progress: p.clone(),
        });
    }

    /// The samples kept from index `from` on, and the index after them.
    pub fn series(&self, from: usize) -> (Vec<SeriesPoint>, usize) {
        self.series.lock().since(from)
    }

    /// Accept a correctly signed post from `member` now, once (see [`replay`](super::replay)).
    pub fn admit(&self, member: u32, envelope: &Envelope, now_ms: u64) -> Result<(), Refused> {
        super::replay::admit(&mut self.heard.lock(), member, envelope, now_ms)
    }

    /// Hand a trainer's message to the runtime (the router calls it once a post is verified).
    pub fn deliver(&self, message: Inbound) -> bool {
        self.inbox.send(message).is_ok()
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobLabels {
    pub namespace: String,
    pub job: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ServedLabels {
    pub namespace: String,
    pub job: String,
    /// `view` (a member's own view) or `document` (the whole graph).
    pub form: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QualityLabels {
    pub namespace: String,
    pub job: String,
    /// What the job's task is judged by: `accuracy`, `perplexity`, or a task's own.
    pub metric: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub endpoint: String,
    pub outcome: String,
}

/// The router's Prometheus metrics (prefix `murmur`).
pub struct Metrics {
    pub registry: Registry,
    members: Family<JobLabels, Gauge>,
    target: Family<JobLabels, Gauge>,
    step: Family<JobLabels, Gauge>,
    accuracy: Family<JobLabels, Gauge<f64, AtomicU64>>,
    quality: Family<QualityLabels, Gauge<f64, AtomicU64>>,
    topology_version: Family<JobLabels, Gauge>,
    preemptions: Family<JobLabels, Gauge>,
    restarts: Family<JobLabels, Gauge>,
    pub requests: Family<RequestLabels, Counter>,
    pub topology_bytes: Family<ServedLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("murmur");
        let m = Self {
            registry: Registry::default(),
            members: Family::default(),
            target: Family::default(),
            step: Family::default(),
            accuracy: Family::default(),
            quality: Family::default(),
            topology_version: Family::default(),
            preemptions: Family::default(),
            restarts: Family::default(),
            requests: Family::default(),
            topology_bytes: Family::default(),
        };
        registry.register(
            "job_members",
            "Members live in the job's topology",
            m.members.clone(),
        );
        registry.register("job_target_members", "replicas.target", m.target.clone());
        registry.register("job_step", "Most advanced member's step", m.step.clone());
        registry.register(
            "job_accuracy",
            "Mean test accuracy of the members",
            m.accuracy.clone(),
        );
        registry.register(
            "job_quality",
            "Mean test figure of the members, by the metric their task is judged by",
            m.quality.clone(),
        );
        registry.register(
            "job_topology_version",
            "Newest topology version",
            m.topology_version.clone(),
        );
        registry.register(
            "job_preemptions",
            "Members lost to preemption (never counted as restarts)",
            m.preemptions.clone(),
        );
        registry.register(
            "job_restarts",
            "Crash restarts, counted against recovery.maxRestarts",
            m.restarts.clone(),
        );
        registry.register(
            "control_requests",
            "Requests from trainers to the control endpoint, by outcome",
            m.requests.clone(),
        );
        registry.register(
            "topology_served_bytes",
            "Topology bytes served to trainers and observers, by form (view or document)",
            m.topology_bytes.clone(),
        );
        Self { registry, ..m }
    }
}

impl Metrics {
    fn observe(&self, view: &JobView) {
        let labels = JobLabels {
            namespace: view.namespace.clone(),
            job: view.name.clone(),
        };
        let live = view
            .members
            .iter()
            .filter(|m| m.in_topology && m.health != Health::Down)
            .count();
        let progress = view.status.progress.clone().unwrap_or_default();
        self.members.get_or_create(&labels).set(live as i64);
        self.target
            .get_or_create(&labels)
            .set(i64::from(view.replicas.target));
        self.step.get_or_create(&labels).set(progress.step as i64);
        // Only for tasks judged by accuracy: a language model's job has no accuracy, not 0.
        if let Some(accuracy) = progress.accuracy {
            self.accuracy.get_or_create(&labels).set(accuracy);
        }
        if let Some(quality) = progress.quality() {
            self.quality
                .get_or_create(&QualityLabels {
                    namespace: view.namespace.clone(),
                    job: view.name.clone(),
                    metric: quality.name,
                })
                .set(quality.value);
        }
        self.topology_version
            .get_or_create(&labels)
            .set(view.status.topology_version as i64);
        self.preemptions
            .get_or_create(&labels)
            .set(i64::from(view.status.preemptions));
        self.restarts
            .get_or_create(&labels)
            .set(i64::from(view.status.restarts));
    }

    pub fn served(&self, namespace: &str, job: &str, form: &str, bytes: usize) {
        self.topology_bytes
            .get_or_create(&ServedLabels {
                namespace: namespace.to_string(),
                job: job.to_string(),
                form: form.to_string(),
            })
            .inc_by(bytes as u64);
    }

    pub fn request(&self, endpoint: &str, outcome: &str) {
        self.requests
            .get_or_create(&RequestLabels {
                endpoint: endpoint.to_string(),
                outcome: outcome.to_string(),
            })
            .inc();
    }
}

#[derive(Default)]
pub struct Hub {
    jobs: RwLock<BTreeMap<(String, String), Arc<JobHandle>>>,
    pub metrics: Metrics,
    /// What model traffic costs, by locality: every job's `status.traffic` is priced at it.
    pub(crate) prices: murmur_core::api::traffic::Prices,
    /// What this process serves, as `/readyz` says; view streams end when it stops leading.
    role: watch::Sender<Role>,
}

/// What an operator replica (or `murmur run`, which always leads) serves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Role {
    /// Runs the jobs, its caches complete: the operator's Service selects it.
    #[default]
    Leading,
    /// Up, not leading: waiting to lead, or done leading (told to stop, or its lease lost).
    /// Ready (so a rolling update can replace the leader), but the Service does not select it,
    /// and trainers that still reach it are refused, to go to the leader.
    Standby,
    /// Still starting: not Ready.
    Starting,
}

impl Hub {
    /// A hub whose jobs' traffic is priced at `prices`.
    pub fn with_prices(prices: murmur_core::api::traffic::Prices) -> Self {
        Self {
            prices,
            ..Self::default()
        }
    }

    pub fn set_role(&self, role: Role) {
        self.role.send_replace(role);
    }

    pub fn role(&self) -> Role {
        *self.role.borrow()
    }

    /// The role as it changes.
    pub(super) fn roles(&self) -> watch::Receiver<Role> {
        self.role.subscribe()
    }

    /// Serve a job; its trainers' posts (signed with `key`) arrive on the returned inbox.
    pub fn register(
        &self,
        namespace: &str,
        name: &str,
        key: Vec<u8>,
    ) -> (Arc<JobHandle>, mpsc::UnboundedReceiver<Inbound>) {
        let (inbox, rx) = mpsc::unbounded_channel();
        let handle = Arc::new(JobHandle {
            key,
            view: watch::channel(None).0,
            topology: watch::channel(None).0,
            views: Mutex::default(),
            events: Mutex::new(Bounded::new(EVENTS_KEPT)),
            series: Mutex::new(Bounded::new(SERIES_KEPT)),
            sampled: Mutex::default(),
            heard: Mutex::default(),
            inbox,
        });
        self.jobs
            .write()
            .insert((namespace.to_string(), name.to_string()), handle.clone());
        (handle, rx)
    }

    /// Stop serving a job (it was deleted).
    pub fn forget(&self, namespace: &str, name: &str) {
        self.jobs
            .write()
            .remove(&(namespace.to_string(), name.to_string()));
    }

    pub fn job(&self, namespace: &str, name: &str) -> Option<Arc<JobHandle>> {
        self.jobs
            .read()
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    pub fn jobs(&self) -> Vec<Arc<JobHandle>> {
        self.jobs.read().values().cloned().collect()
    }

    /// Publish a job's view (and its metrics). A view that cannot be written as JSON (it never
    /// should) is logged and the previous one stays.
    pub fn publish(&self, job: &JobHandle, view: impl Into<Arc<JobView>>) {
        let view = view.into();
        self.metrics.observe(&view);
        job.view.send_replace(Some(Arc::new(Published {
            view,
            json: std::sync::OnceLock::new(),
        })));
    }
}
