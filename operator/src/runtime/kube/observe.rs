//! What a member's pod says about it (pure): where it runs, since when it waits for a node, why
//! its container cannot start, and how it ended — completed, preempted (never a failure) or
//! crashed.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use murmur_core::contract::TrainerState;
use murmur_core::topology::MemberId;

use super::cached_pod::{CachedContainerStatus, CachedPod};
use super::labels::{LABEL_ATTEMPT, LABEL_CLIQUE, LABEL_MEMBER};
pub use super::labels::{REGION_LABEL, ZONE_LABEL};
use crate::member::{Ending, Exit, NotStarting, ObservedMember, Termination, classify, exit};
use crate::planner::seconds_since;

/// Reasons of the `DisruptionTarget` pod condition: the pod is going away for reasons outside
/// the trainer — a preemption, whatever the exit code.
pub const DISRUPTION_REASONS: &[&str] = &[
    "PreemptionByScheduler",
    "DeletionByTaintManager",
    "EvictionByEvictionAPI",
    "DeletionByPodGC",
    "TerminationByKubelet",
];

/// Pod conditions that say the pod is going away from outside: Kubernetes' `DisruptionTarget`,
/// and Kueue's `TerminationTarget` on the pods of a workload it evicts (preempted by a workload
/// of higher priority, or its queue stopped).
const DISRUPTION_CONDITIONS: &[&str] = &["DisruptionTarget", "TerminationTarget"];

/// Exit codes of a container killed by SIGTERM or SIGKILL.
const KILLED_EXIT_CODES: &[i32] = &[128 + 15, 128 + 9];

/// Pod-level `status.reason`s for pods the node gave up on (node shutdown, kubelet eviction,
/// admission after a node change).
const NODE_REASONS: &[&str] = &[
    "Evicted",
    "Shutdown",
    "NodeShutdown",
    "Terminated",
    "NodeLost",
    "Preempting",
    "OutOfcpu",
    "OutOfmemory",
    "OutOfpods",
    "UnexpectedAdmissionError",
    "NodeAffinity",
];

/// The member id and attempt in a pod's labels (a cached pod's, or a whole one's).
pub fn member_of(pod: &impl kube::Resource) -> Option<(MemberId, u32)> {
    let labels = pod.meta().labels.as_ref()?;
    Some((
        labels.get(LABEL_MEMBER)?.parse().ok()?,
        labels.get(LABEL_ATTEMPT)?.parse().ok()?,
    ))
}

/// A pod of the job's, with the member attempt and the clique its labels name.
#[derive(Clone, Copy, Debug)]
pub struct JobPod<'a> {
    pub pod: &'a CachedPod,
    pub member: MemberId,
    pub attempt: u32,
    /// Its clique label, when it has one that is a number.
    pub clique: Option<u32>,
}

impl<'a> JobPod<'a> {
    /// The pod, when its labels name a member attempt.
    pub fn of(pod: &'a CachedPod) -> Option<Self> {
        let (member, attempt) = member_of(pod)?;
        let clique = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_CLIQUE))
            .and_then(|c| c.parse().ok());
        Some(JobPod {
            pod,
            member,
            attempt,
            clique,
        })
    }
}

/// The pods that name a member attempt, their labels read once: a reconcile of a 10 000-member
/// job looks at each pod several times, and reading its labels was a tenth of it.
pub fn job_pods<'a>(pods: &[&'a CachedPod]) -> Vec<JobPod<'a>> {
    pods.iter().filter_map(|&pod| JobPod::of(pod)).collect()
}

/// A job's pods among the pod cache's, read once for each version of each pod: the cache hands
/// out the same `Arc` until a pod changes, so a reconcile reads the namespace, labels and
/// owners of the pods that changed since the last one only (reading all 10 000 was a third of
/// a steady reconcile).
#[derive(Default)]
pub struct JobPodIndex {
    /// By the address of each pod the cache held at the last read. A weak reference keeps the
    /// address from being taken by another pod while it is here, and not the pod itself: a pod
    /// the cache let go of is freed there, not by the next reconcile.
    seen: HashMap<usize, (Weak<CachedPod>, Option<Named>)>,
}

/// A job's pod and what its labels name.
pub struct NamedPod(Arc<CachedPod>, Named);

/// What a job's pod's labels name: [`JobPod`] without the pod.
#[derive(Clone, Copy, Debug)]
struct Named {
    member: MemberId,
    attempt: u32,
    clique: Option<u32>,
}

impl JobPodIndex {
    /// The job's pods among `cache` (every pod the cache holds), in its order, that name a
    /// member attempt, with what their labels name ([`JobPodIndex::job_pods`]). `ours`: whether
    /// a pod is the job's, asked of pods not seen before.
    pub fn read(
        &mut self,
        cache: Vec<Arc<CachedPod>>,
        ours: impl Fn(&CachedPod) -> bool,
    ) -> Vec<NamedPod> {
        let mut seen = HashMap::with_capacity(cache.len());
        let mut out = Vec::new();
        for pod in cache {
            let at = Arc::as_ptr(&pod) as usize;
            let named = match self.seen.remove(&at) {
                Some((_, named)) => named,
                None => ours(&pod)
                    .then(|| JobPod::of(&pod))
                    .flatten()
                    .map(|p| Named {
                        member: p.member,
                        attempt: p.attempt,
                        clique: p.clique,
                    }),
            };
            seen.insert(at, (Arc::downgrade(&pod), named));
            if let Some(named) = named {
                out.push(NamedPod(pod, named));
            }
        }
        self.seen = seen;
        out
    }

    /// The [`JobPod`]s of what [`JobPodIndex::read`] gave.
    pub fn job_pods(pods: &[NamedPod]) -> Vec<JobPod<'_>> {
        pods.iter()
            .map(|NamedPod(pod, n)| JobPod {
                pod,
                member: n.member,
                attempt: n.attempt,
                clique: n.clique,
            })
            .collect()
    }
}

/// What the operator knows of the node a pod is bound to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum NodeState {
    Ready,
    /// `Ready` is not True since this time.
    NotReady {
        since: Timestamp,
    },
    /// Not in the (synced) node cache: deleted.
    Gone,
}

/// A node's zone and region labels, each when it carries it.
pub type NodePlace = (Option<String>, Option<String>);

/// A node's zone and region, each when it carries the label.
pub fn place(node: Option<&Node>) -> NodePlace {
    let labels = node.and_then(|n| n.metadata.labels.as_ref());
    let label = |key: &str| labels.and_then(|l| l.get(key).cloned());
    (label(ZONE_LABEL), label(REGION_LABEL))
}

/// What the operator reads of a Node (its readiness, labels and taints), the rest dropped before
/// it is cached: at 10 000 nodes the images, addresses and capacities alone are most of the
/// operator's memory.
pub fn keep_what_is_read_of_node(node: &mut Node) {
    node.metadata.managed_fields = None;
    node.metadata.annotations = None;
    if let Some(status) = &mut node.status {
        let ready = status
            .conditions
            .take()
            .into_iter()
            .flatten()
            .filter(|c| c.type_ == "Ready")
            .map(|mut c| {
                // Changes every heartbeat; nothing reads it.
                c.last_heartbeat_time = None;
                c
            })
            .collect();
        *status = k8s_openapi::api::core::v1::NodeStatus {
            conditions: Some(ready),
            ..Default::default()
        };
    }
}

/// What the operator drops of a member's pod before it is cached, beyond what [`CachedPod`]
/// leaves undecoded: metadata nothing reads.
pub fn keep_what_is_read_of_pod(pod: &mut CachedPod) {
    let m = &mut pod.metadata;
    m.managed_fields = None;
    m.generate_name = None;
    m.finalizers = None;
}

/// A hash of what, changed, can change a plan: readiness (and since when), labels (zone,
/// capacity type), taints, being deleted. Node updates that leave it alone wake no job.
pub fn node_news(node: &Node) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    match node_state(Some(node)) {
        NodeState::Ready => 0u8.hash(&mut h),
        NodeState::NotReady { since } => (1u8, since.as_millisecond()).hash(&mut h),
        NodeState::Gone => 2u8.hash(&mut h),
    }
    node.metadata.labels.hash(&mut h);
    node.metadata.deletion_timestamp.is_some().hash(&mut h);
    if let Some(taints) = node.spec.as_ref().and_then(|s| s.taints.as_ref()) {
        for t in taints {
            (&t.key, &t.value, &t.effect).hash(&mut h);
        }
    }
    Some(h.finish())
}

/// A Node's delete event carries its last state, still Ready when the machine vanished at once
/// and with no deletion timestamp (a Node has no finalizers): to [`node_news`] that is no change,
/// and the jobs on it would learn of the loss only at their next reconcile (seen 11 and 19 s
/// later, the survivors training on without the lost members' classes all the while). Marked as
/// deleted `at`, it is news.
pub fn mark_deleted_node(
    event: kube::runtime::watcher::Event<Node>,
    at: Timestamp,
) -> kube::runtime::watcher::Event<Node> {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kube::runtime::watcher::Event;
    match event {
        Event::Delete(mut node) => {
            node.metadata.deletion_timestamp.get_or_insert(Time(at));
            Event::Delete(node)
        }
        other => other,
    }
}

pub fn node_state(node: Option<&Node>) -> NodeState {
    let Some(node) = node else {
        return NodeState::Gone;
    };
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
    match ready {
        Some(c) if c.status == "True" => NodeState::Ready,
        Some(c) => NodeState::NotReady {
            since: c
                .last_transition_time
                .as_ref()
                .map_or(Timestamp::UNIX_EPOCH, |t| t.0),
        },
        // A node that never reported is not ready, since it was created.
        None => NodeState::NotReady {
            since: node
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or(Timestamp::UNIX_EPOCH, |t| t.0),
        },
    }
}

/// What one pod tells the planner.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodFacts {
    /// Its member as the pod shows it: `node`, `pending_since` (none while gated: a gated pod
    /// waits for admission, not for a node), `exit`, `not_starting` and `gated_by` (Kueue's
    /// admission gate until its queue admits the pod group). The caller sets the rest.
    pub member: ObservedMember,
    /// Its exit is its node's: gone, or not ready for longer than `node_lost_after`. No kubelet
    /// will finish a graceful deletion of it.
    pub node_lost: bool,
}

/// Waiting reasons of a container that is starting as it should.
const STARTING: &[&str] = &["ContainerCreating", "PodInitializing"];

/// Waiting reasons that are about the image: the message says which image where the kubelet's
/// own does not.
const IMAGE_REASONS: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "RegistryUnavailable",
    "SignatureValidationFailed",
];

/// Warning events (`reason`s) about a pod that keep its containers from starting, which no
/// field of the pod's status carries: the volumes and the sandbox.
pub const START_EVENT_REASONS: &[&str] = &[
    "FailedMount",
    "FailedAttachVolume",
    "FailedMapVolume",
    "FailedCreatePodSandBox",
];

/// The trainer container's status (or the first container's).
fn trainer_status(pod: &CachedPod) -> Option<&CachedContainerStatus> {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.iter().find(|c| c.name == "trainer").or(c.first()))
}

/// Whether the pod is on a node with its container still being created: the moment a volume
/// that cannot be mounted or a sandbox that cannot be made holds it (they say so in events).
pub fn creating(pod: &CachedPod) -> bool {
    let on_node = pod.spec.as_ref().is_some_and(|s| s.node_name.is_some());
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    on_node
        && pod.metadata.deletion_timestamp.is_none()
        && matches!(phase, None | Some("Pending"))
        && trainer_status(pod)
            .and_then(|c| c.state.as_ref())
            .is_none_or(|s| {
                s.running.is_none()
                    && s.terminated.is_none()
                    && s.waiting
                        .as_ref()
                        .and_then(|w| w.reason.as_deref())
                        .is_none_or(|r| STARTING.contains(&r))
            })
}

/// Why the pod's container waits other than to start normally, in the kubelet's words.
fn waiting_problem(pod: &CachedPod) -> Option<NotStarting> {
    let container = trainer_status(pod)?;
    let waiting = container.state.as_ref()?.waiting.as_ref()?;
    let reason = waiting.reason.clone()?;
    if STARTING.contains(&reason.as_str()) {
        return None;
    }
    let mut message = waiting.message.clone().unwrap_or_default();
    let image = Some(container.image.as_str())
        .filter(|i| !i.is_empty())
        .or_else(|| spec_image(pod, &container.name));
    if let Some(image) = image
        && IMAGE_REASONS.contains(&reason.as_str())
        && !message.contains(image)
    {
        message = format!("image {image:?}: {message}")
            .trim_end_matches(": ")
            .to_string();
    }
    Some(NotStarting { reason, message })
}

/// The image the pod's spec names for container `name`.
fn spec_image<'a>(pod: &'a CachedPod, name: &str) -> Option<&'a str> {
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == name)?
        .image
        .as_deref()
}

/// The names of the scheduling gates on the pod, comma-separated, if it has any.
fn scheduling_gates(pod: &CachedPod) -> Option<String> {
    let gates = pod.spec.as_ref()?.scheduling_gates.as_ref()?;
    (!gates.is_empty()).then(|| {
        gates
            .iter()
            .map(|g| g.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    })
}

/// Read a pod. `node` is what the cache says of the node it is bound to; `last` is the state
/// the trainer last reported (used when no termination message was written).
pub fn pod_facts(
    pod: &CachedPod,
    node: impl Fn(&str) -> NodeState,
    last: Option<TrainerState>,
    now: Timestamp,
    node_lost_after: std::time::Duration,
) -> PodFacts {
    let node_name = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    let gated_by = scheduling_gates(pod);
    let mut member = ObservedMember {
        node: node_name.clone(),
        pending_since: (node_name.is_none() && gated_by.is_none()).then(|| {
            pod.metadata
                .creation_timestamp
                .as_ref()
                .map_or(now, |t| t.0)
        }),
        exit: exit(pod, last),
        not_starting: waiting_problem(pod),
        gated_by,
        ..Default::default()
    };
    let mut node_lost = false;
    if member.exit.is_none()
        && let Some(name) = node_name.as_deref()
    {
        member.exit = lost_node(name, node(name), now, node_lost_after);
        node_lost = member.exit.is_some();
    }
    PodFacts { member, node_lost }
}

/// How a pod ended, from the pod alone (its node's state aside).
fn exit(pod: &CachedPod, last: Option<TrainerState>) -> Option<Exit> {
    let status = pod.status.as_ref();
    let preempted = |reason: String| Some(Exit::Preempted { reason });
    let disruption = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| {
            c.iter()
                .find(|c| DISRUPTION_CONDITIONS.contains(&c.type_.as_str()) && c.status == "True")
        })
        .map(|c| {
            let reason = c.reason.clone().unwrap_or_else(|| c.type_.clone());
            match &c.message {
                Some(m) if !m.is_empty() => format!("{reason}: {m}"),
                _ => reason,
            }
        });
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    let terminated = trainer_status(pod)
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.as_ref());
    let node_reason = status
        .and_then(|s| s.reason.as_deref())
        .filter(|r| NODE_REASONS.contains(r))
        .map(|r| {
            let message = status.and_then(|s| s.message.as_deref()).unwrap_or("");
            format!("{r}: {message}").trim_end_matches(": ").to_string()
        });

    if let Some(t) = terminated {
        let said = t.message.as_deref().and_then(exit::said);
        // Killed by the kubelet (SIGTERM, then SIGKILL) because its pod was deleted.
        let deleted = (pod.metadata.deletion_timestamp.is_some()
            && KILLED_EXIT_CODES.contains(&t.exit_code))
        .then(|| "pod deleted".to_string());
        let said_nothing = said.is_none();
        return Some(classify(&Ending {
            ended: Some(Termination::Code(t.exit_code)),
            said,
            last,
            cause: disruption.or(node_reason).or(deleted),
            detail: Some(crash_detail(
                t.reason.as_deref(),
                t.message.as_deref().filter(|_| said_nothing),
            )),
            conditions: status
                .and_then(|s| s.conditions.as_ref())
                .into_iter()
                .flatten()
                .map(|c| (c.type_.clone(), c.status.clone()))
                .collect(),
        }));
    }
    if phase == "Failed" || phase == "Succeeded" {
        // Ended without its container ever finishing: the node gave up on it.
        return preempted(
            disruption
                .or(node_reason)
                .unwrap_or_else(|| format!("pod {phase} before the trainer ran")),
        );
    }
    if let Some(why) = disruption {
        return preempted(why);
    }
    if pod.metadata.deletion_timestamp.is_some() {
        return preempted("pod deleted".into());
    }
    if let Some(why) = node_reason {
        return preempted(why);
    }
    None
}

/// A pod on node `name` is lost with it: the node is gone, or not ready for `after`.
fn lost_node(
    name: &str,
    state: NodeState,
    now: Timestamp,
    after: std::time::Duration,
) -> Option<Exit> {
    match state {
        NodeState::Ready => None,
        NodeState::Gone => Some(Exit::Preempted {
            reason: format!("node {name} is gone"),
        }),
        NodeState::NotReady { since } => {
            let down = seconds_since(since, now);
            (down >= after.as_secs_f64()).then(|| Exit::Preempted {
                reason: format!("node {name} not ready for {down:.0} s"),
            })
        }
    }
}

/// The kubelet's word for a container that ended badly: its reason (`Error`, `OOMKilled`,
/// `StartError`, `ContainerCannotRun`) and the last line of its message (the runtime's error,
/// or the container's last log line under `FallbackToLogsOnError`), cut to a readable length.
fn crash_detail(reason: Option<&str>, message: Option<&str>) -> String {
    const MAX: usize = 300;
    let reason = reason.unwrap_or("Error");
    let Some(line) = message.and_then(|m| m.lines().rev().map(str::trim).find(|l| !l.is_empty()))
    else {
        return reason.to_string();
    };
    let mut line = line.to_string();
    if line.len() > MAX {
        let cut = (0..=MAX)
            .rev()
            .find(|&i| line.is_char_boundary(i))
            .unwrap_or(0);
        line.truncate(cut);
        line.push('…');
    }
    format!("{reason}: {line}")
}

#[cfg(test)]
#[path = "observe_tests.rs"]
pub(super) mod tests;
