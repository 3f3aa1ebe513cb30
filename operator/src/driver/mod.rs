//! The job driver: the one owner of a job's life, whatever runs its members. It holds the
//! planner's memory and what the trainers post (join reports, statuses), plans, and publishes
//! the topology document, the events and the status view on the status hub. The runtimes under
//! it only create, stop and observe members — `runtime::local` as processes, `runtime::kube` as
//! pods, each seen as an [`ObservedMember`] whose end [`crate::member::classify`] reads — and
//! persist its [`Memory`] (files; the job's ConfigMap).
//!
//! A step is two calls: [`JobDriver::plan`] decides (pure: nothing changes), the runtime carries
//! the plan out, and [`JobDriver::commit`] makes it the job's memory and publishes it. A runtime
//! whose writes fail does not commit, and plans again from the same memory.

pub mod memory;

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use murmur_core::api::DecentralizedTrainingJobSpec;
use murmur_core::api::traffic::{Place, Traffic, locality};
use murmur_core::contract::{TopologyDocument, TrainerState, TrainerStatus};
use murmur_core::topology::{MemberId, Topology};
use tokio::sync::mpsc;

pub use memory::{Memory, MemoryError, StoredJoin};

use crate::member::ObservedMember;
use crate::planner::{self, Action, Event, JobState, Observation};
use crate::status::{Hub, Inbound, JobEvent, JobHandle, JobView, view};

/// One planning step, decided but not yet carried out.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The job's memory once the step is carried out.
    pub memory: Memory,
    /// What the runtime must do: create and stop members.
    pub actions: Vec<Action>,
    pub events: Vec<Event>,
    /// What the planner saw, with the members this step creates as they will show.
    pub observed: Observation,
    /// The topology document, with every member's peer address (step 0: see `step`).
    pub document: Option<Arc<TopologyDocument>>,
    /// How far the job has come, published with a new document for joiners.
    pub step: u64,
    /// The status view (a runtime may add what only it knows before committing, through
    /// `Arc::make_mut`): shared with the status API once published, not copied.
    pub view: Arc<JobView>,
}

pub struct JobDriver {
    namespace: String,
    name: String,
    memory: Memory,
    /// The newest status of each member, with the attempt that posted it.
    statuses: BTreeMap<MemberId, (u32, Arc<TrainerStatus>)>,
    /// Bytes each attempt sent to its peers, from its newest status.
    bytes_out: BTreeMap<(MemberId, u32), u64>,
    /// Model bytes sent to date by locality, each status's new bytes counted where sender and
    /// peer ran then.
    traffic: Traffic,
    /// Each member's zone and region, as the runtime last saw its current attempt.
    places: BTreeMap<MemberId, (Option<String>, Option<String>)>,
    /// Attempts that ran before this driver started (a restarted operator): their first status
    /// only sets where their count stands, already in the traffic the job's status held.
    counted_before: std::collections::BTreeSet<(MemberId, u32)>,
    /// The furthest step any attempt reported: the job's step never goes back when the member
    /// ahead is lost (its neighbours averaged with it; the job got that far).
    furthest_step: u64,
    hub: Arc<Hub>,
    handle: Arc<JobHandle>,
    /// The newest topology version handed to the hub.
    published_version: u64,
    /// The last document built, kept while its topology version and addresses stay the same:
    /// most plans change neither, and at 10 000 members building one (mixing weights,
    /// addresses) was an eighth of a reconcile.
    document: parking_lot::Mutex<Option<KeptDocument>>,
}

struct KeptDocument {
    version: u64,
    addresses: Vec<Option<String>>,
    document: Arc<TopologyDocument>,
}

impl JobDriver {
    /// Drive a job from `memory`, serving it on `hub`: its trainers' posts (signed with `key`)
    /// arrive on the returned inbox, for [`JobDriver::receive`].
    pub fn start(
        hub: Arc<Hub>,
        namespace: &str,
        name: &str,
        key: Vec<u8>,
        memory: Memory,
    ) -> (Self, mpsc::UnboundedReceiver<Inbound>) {
        let (handle, inbox) = hub.register(namespace, name, key);
        let driver = Self {
            namespace: namespace.to_string(),
            name: name.to_string(),
            memory,
            statuses: BTreeMap::new(),
            bytes_out: BTreeMap::new(),
            traffic: Traffic::default(),
            places: BTreeMap::new(),
            counted_before: Default::default(),
            furthest_step: 0,
            hub,
            handle,
            published_version: 0,
            document: parking_lot::Mutex::new(None),
        };
        (driver, inbox)
    }

    /// Carry on from the step the job's status last showed (a restarted operator reads it
    /// back): the job's step never goes back below it, even if the member that got there is
    /// lost before it reports to this driver.
    pub fn resume_step(&mut self, step: u64) {
        self.furthest_step = self.furthest_step.max(step);
    }

    /// Carry on from the traffic the job's status last showed (a restarted operator reads it
    /// back). What the attempts running now sent before is in it: their next statuses count only
    /// what they send after their first.
    pub fn resume_traffic(&mut self, traffic: Traffic) {
        self.traffic = traffic;
        self.counted_before = self
            .memory
            .state
            .members
            .iter()
            .map(|(&id, r)| (id, r.attempt))
            .collect();
    }

    /// Model bytes sent to date, by locality, and their cost.
    pub fn traffic(&self) -> &Traffic {
        &self.traffic
    }

    /// Whether any trainer's status reached this driver (a restarted operator has heard none).
    pub fn heard_from_trainers(&self) -> bool {
        !self.statuses.is_empty()
    }

    pub fn memory(&self) -> &Memory {
        &self.memory
    }

    pub fn state(&self) -> &JobState {
        &self.memory.state
    }

    pub fn handle(&self) -> &Arc<JobHandle> {
        &self.handle
    }

    /// Seconds since the job was created, at `now`.
    pub fn seconds(&self, now: Timestamp) -> f64 {
        planner::seconds_since(self.memory.state.created_at, now)
    }

    /// Bytes every trainer sent to its peers, all attempts together.
    pub fn bytes_exchanged(&self) -> u64 {
        self.bytes_out.values().sum()
    }

    fn attempt_of(&self, member: MemberId) -> Option<u32> {
        self.memory.state.members.get(&member).map(|r| r.attempt)
    }

    /// Take what a trainer posted (already authenticated). True when the job should be planned
    /// now: a join report, or a member whose state changed (it started training, paused, left
    /// or finished).
    pub fn receive(&mut self, message: Inbound, now: Timestamp) -> bool {
        match message {
            Inbound::Join(report) => {
                let id = report.member_id;
                // A member no committed plan knows yet runs its first attempt: the plan that
                // created it is still being carried out (its pod started and posted before the
                // last pods of a large job were created). Dropped, the join would leave the
                // member out of the first topology and unbalance its clique.
                let attempt = self.attempt_of(id).unwrap_or(0);
                let report = report.kept();
                self.memory.joins.insert(
                    id,
                    StoredJoin {
                        attempt,
                        report: Arc::new(report),
                    },
                );
                true
            }
            Inbound::Status(status) => {
                let id = status.member_id;
                let Some(attempt) = self.attempt_of(id) else {
                    return false;
                };
                self.take_status(id, attempt, status, now)
            }
            Inbound::PeerEvent(e) => {
                tracing::debug!(
                    member = e.member_id,
                    peer = e.peer,
                    reason = e.reason.as_str(),
                    "peer event"
                );
                false
            }
        }
    }

    /// A status of a member's attempt (posted, or read from its `/status`): a progress sample
    /// for the curves, and what the planner sees of it. True when its state changed.
    pub fn take_status(
        &mut self,
        member: MemberId,
        attempt: u32,
        status: TrainerStatus,
        now: Timestamp,
    ) -> bool {
        self.bytes_out.insert((member, attempt), status.bytes_out);
        self.count_traffic(member, attempt, &status);
        self.furthest_step = self.furthest_step.max(status.progress.step);
        self.handle.sample(self.seconds(now), attempt, &status);
        let changed = self
            .statuses
            .get(&member)
            .is_none_or(|(a, s)| *a != attempt || s.state != status.state);
        if self
            .statuses
            .get(&member)
            .is_none_or(|(a, _)| *a <= attempt)
        {
            self.statuses.insert(member, (attempt, Arc::new(status)));
        }
        changed
    }

    /// Add what `status` says its attempt sent since its previous status, by where the two
    /// ends run now. A status older than the newest attempt's counts nothing (its bytes would be
    /// counted twice).
    fn count_traffic(&mut self, member: MemberId, attempt: u32, status: &TrainerStatus) {
        let previous = match self.statuses.get(&member) {
            Some((a, _)) if *a > attempt => return,
            Some((a, s)) if *a == attempt => Some(&s.bytes_sent_to),
            _ => None,
        };
        if previous.is_none() && self.counted_before.remove(&(member, attempt)) {
            return;
        }
        let place = |id: MemberId| {
            self.places
                .get(&id)
                .map_or(Place::default(), |(z, r)| Place {
                    zone: z.as_deref(),
                    region: r.as_deref(),
                })
        };
        for (&peer, &bytes) in &status.bytes_sent_to {
            let before = previous.and_then(|p| p.get(&peer)).copied().unwrap_or(0);
            let new = bytes.saturating_sub(before);
            if new > 0 {
                let at = locality(place(member), place(peer));
                self.traffic.add(at, new, &self.hub.prices);
            }
        }
    }

    /// The state a member's attempt last reported.
    pub fn last_state(&self, member: MemberId, attempt: u32) -> Option<TrainerState> {
        self.statuses
            .get(&member)
            .filter(|(a, _)| *a == attempt)
            .map(|(_, s)| s.state)
    }

    /// What the planner sees: the members as the runtime sees them, each with the join report
    /// and status of the same attempt (whatever the runtime set there).
    pub fn observation(&self, mut members: BTreeMap<MemberId, ObservedMember>) -> Observation {
        for (id, m) in &mut members {
            m.join = self
                .memory
                .joins
                .get(id)
                .filter(|j| j.attempt == m.attempt)
                .map(|j| j.report.clone());
            m.status = self
                .statuses
                .get(id)
                .filter(|(a, _)| *a == m.attempt)
                .map(|(_, s)| s.clone());
        }
        Observation { members }
    }

    /// Decide the next step from `members` as the runtime sees them. `problems`: why the spec is
    /// invalid, if it is (nothing is planned then). `address`: a member attempt's peer address,
    /// for the topology document (and for members this step creates).
    pub fn plan(
        &self,
        spec: &DecentralizedTrainingJobSpec,
        problems: Option<&str>,
        members: BTreeMap<MemberId, ObservedMember>,
        address: &dyn Fn(MemberId, u32) -> Option<String>,
        now: Timestamp,
    ) -> Plan {
        let mut observed = self.observation(members);
        let (state, actions) = match problems {
            Some(problems) => {
                observed = Observation::default();
                planner::reject(&self.memory.state, problems, now)
            }
            None => planner::plan(spec, &self.memory.state, &observed, now),
        };
        let mut events = Vec::new();
        let mut work = Vec::new();
        for action in actions {
            match action {
                Action::Event(e) => events.push(e),
                Action::Create {
                    member, attempt, ..
                } => {
                    // What the runtime will show of it once created.
                    observed.members.insert(
                        member,
                        ObservedMember {
                            attempt,
                            address: address(member, attempt),
                            ..Default::default()
                        },
                    );
                    work.push(action);
                }
                Action::Stop { .. } => work.push(action),
            }
        }
        let document = state.topology.as_ref().map(|t| {
            self.document_of(t, |id| {
                address(id, state.members.get(&id).map_or(0, |r| r.attempt))
            })
        });
        let view = self.job_view(spec, &state, &observed, now);
        Plan {
            memory: Memory {
                state: Arc::new(state),
                joins: self.memory.joins.clone(),
            },
            actions: work,
            events,
            observed,
            document,
            // How far the job has come, for joiners: published once per version, with it.
            step: self.furthest_step,
            view: Arc::new(view),
        }
    }

    /// The document of `topology` with each member's `address`: the one kept when neither
    /// changed since it was built.
    fn document_of(
        &self,
        topology: &Topology,
        address: impl Fn(MemberId) -> Option<String>,
    ) -> Arc<TopologyDocument> {
        let addresses: Vec<Option<String>> = topology.graph.members().map(&address).collect();
        let mut kept = self.document.lock();
        if let Some(k) = kept.as_ref()
            && k.version == topology.version
            && k.addresses == addresses
        {
            return k.document.clone();
        }
        let document = Arc::new(topology.to_document(address));
        *kept = Some(KeptDocument {
            version: topology.version,
            addresses,
            document: document.clone(),
        });
        document
    }

    /// The runtime carried `plan` out: it is the job's memory now. Publishes its topology
    /// document (a newer version only), its events and its view.
    pub fn commit(&mut self, plan: &Plan, now: Timestamp) {
        self.assume(plan, now);
        self.publish_topology(plan.document.as_deref(), plan.step);
    }

    /// `plan` is the job's memory from now on, while a runtime that writes behind carries it
    /// out: the next plan starts from it. Publishes its events and its view, not its topology
    /// document: trainers must never hold a version that a restarted control plane, reading
    /// the memory it persisted, could issue again with other content
    /// ([`JobDriver::publish_topology`] once the memory holding it is persisted).
    pub fn assume(&mut self, plan: &Plan, now: Timestamp) {
        // Join reports that arrived while the plan was carried out are kept.
        self.memory.state = plan.memory.state.clone();
        self.places = plan
            .observed
            .members
            .iter()
            .map(|(&id, m)| (id, (m.zone.clone(), m.region.clone())))
            .collect();
        for event in &plan.events {
            self.record(event.clone(), now);
        }
        self.hub.publish(&self.handle, plan.view.clone());
    }

    /// Publish a plan's topology document (a newer version only), with how far the job has
    /// come for joiners.
    pub fn publish_topology(&mut self, document: Option<&TopologyDocument>, step: u64) {
        if let Some(doc) = document
            && doc.version > self.published_version
        {
            self.published_version = doc.version;
            self.handle.set_topology(TopologyDocument {
                step,
                ..doc.clone()
            });
        }
    }

    /// Amend the job's memory outside a plan: what the runtime learnt carrying one out (the
    /// API server refused some of its pods). Its events are recorded for the status API.
    pub fn amend(&mut self, state: JobState, events: &[Event], now: Timestamp) {
        self.memory.state = Arc::new(state);
        for event in events {
            self.record(event.clone(), now);
        }
    }

    /// Keep an event for the status API (the runtime prints it or writes it to the cluster).
    pub fn record(&self, event: Event, now: Timestamp) {
        self.handle
            .push_event(JobEvent::new(event, self.memory.state.created_at, now));
    }

    /// The status view of the job as it stands, with `members` as the runtime sees them now.
    pub fn view(
        &self,
        spec: &DecentralizedTrainingJobSpec,
        members: BTreeMap<MemberId, ObservedMember>,
        now: Timestamp,
    ) -> JobView {
        self.job_view(spec, &self.memory.state, &self.observation(members), now)
    }

    /// The status view, its step no lower than the furthest any attempt reported.
    fn job_view(
        &self,
        spec: &DecentralizedTrainingJobSpec,
        state: &JobState,
        observed: &Observation,
        now: Timestamp,
    ) -> JobView {
        let mut v = view::job_view(&self.namespace, &self.name, spec, state, observed, now);
        if let Some(p) = v.status.progress.as_mut() {
            p.step = p.step.max(self.furthest_step);
        }
        v.status.traffic = (self.traffic.total_bytes() > 0).then(|| self.traffic.clone());
        v.prices = self.hub.prices;
        v
    }

    /// Publish a view outside a step (the runtime's last word on a job that ended).
    pub fn publish(&self, view: JobView) {
        self.hub.publish(&self.handle, view);
    }
}

#[cfg(test)]
mod tests;
