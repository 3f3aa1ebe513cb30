//! What a member's pod says about it (pure): where it runs, since when it waits for a node, why
//! its container cannot start, and how it ended — completed, preempted (never a failure) or
//! crashed.

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use murmur_core::contract::TrainerState;
use murmur_core::topology::MemberId;

pub use super::labels::ZONE_LABEL;
use super::labels::{LABEL_ATTEMPT, LABEL_MEMBER};
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

/// The member id and attempt in a pod's labels.
pub fn member_of(pod: &Pod) -> Option<(MemberId, u32)> {
    let labels = pod.metadata.labels.as_ref()?;
    Some((
        labels.get(LABEL_MEMBER)?.parse().ok()?,
        labels.get(LABEL_ATTEMPT)?.parse().ok()?,
    ))
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

/// A node's zone, when it carries the label.
pub fn zone(node: Option<&Node>) -> Option<String> {
    node?.metadata.labels.as_ref()?.get(ZONE_LABEL).cloned()
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

/// What the operator reads of a member's Pod, the rest dropped before it is cached: the trainer's
/// environment, volumes, affinity and the kubelet's bookkeeping were 37 KiB a pod, most of the
/// operator's memory at 1 000 members. Kept: identity, labels, annotations, owners, timestamps;
/// the node; the phase, reason, message, conditions and each container's state and image (the
/// spec's, where the kubelet has not said it yet).
pub fn keep_what_is_read_of_pod(pod: &mut Pod) {
    use k8s_openapi::api::core::v1::{ContainerStatus, PodCondition, PodSpec, PodStatus};
    let m = &mut pod.metadata;
    m.managed_fields = None;
    m.generate_name = None;
    m.finalizers = None;
    let spec = pod.spec.take().unwrap_or_default();
    let image_of = |name: &str| {
        spec.containers
            .iter()
            .find(|c| c.name == name)
            .and_then(|c| c.image.clone())
            .unwrap_or_default()
    };
    if let Some(status) = pod.status.take() {
        pod.status = Some(PodStatus {
            phase: status.phase,
            reason: status.reason,
            message: status.message,
            conditions: status.conditions.map(|conditions| {
                conditions
                    .into_iter()
                    .map(|c| PodCondition {
                        type_: c.type_,
                        status: c.status,
                        reason: c.reason,
                        message: c.message,
                        ..Default::default()
                    })
                    .collect()
            }),
            container_statuses: status.container_statuses.map(|statuses| {
                statuses
                    .into_iter()
                    .map(|c| ContainerStatus {
                        image: if c.image.is_empty() {
                            image_of(&c.name)
                        } else {
                            c.image
                        },
                        name: c.name,
                        state: c.state,
                        ..Default::default()
                    })
                    .collect()
            }),
            ..Default::default()
        });
    }
    // Containers are 2 KiB each as types, even empty.
    pod.spec = Some(PodSpec {
        node_name: spec.node_name,
        scheduling_gates: spec.scheduling_gates,
        ..Default::default()
    });
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
fn trainer_status(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::ContainerStatus> {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.iter().find(|c| c.name == "trainer").or(c.first()))
}

/// Whether the pod is on a node with its container still being created: the moment a volume
/// that cannot be mounted or a sandbox that cannot be made holds it (they say so in events).
pub fn creating(pod: &Pod) -> bool {
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
fn waiting_problem(pod: &Pod) -> Option<NotStarting> {
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
fn spec_image<'a>(pod: &'a Pod, name: &str) -> Option<&'a str> {
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == name)?
        .image
        .as_deref()
}

/// The names of the scheduling gates on the pod, comma-separated, if it has any.
fn scheduling_gates(pod: &Pod) -> Option<String> {
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
    pod: &Pod,
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
fn exit(pod: &Pod, last: Option<TrainerState>) -> Option<Exit> {
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
pub(super) mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus,
        PodCondition, PodSpec, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    const LOST_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

    /// A node as a kubelet reports it: Ready since `since`, heartbeat at `beat`, with the bulk
    /// a real status carries.
    fn reported(since: i64, beat: i64) -> Node {
        use k8s_openapi::api::core::v1::{ContainerImage, NodeCondition, NodeStatus};
        let condition = |type_: &str, status: &str| NodeCondition {
            type_: type_.into(),
            status: status.into(),
            last_transition_time: Some(Time(Timestamp::from_second(since).unwrap())),
            last_heartbeat_time: Some(Time(Timestamp::from_second(beat).unwrap())),
            ..Default::default()
        };
        let mut node = Node::default();
        node.metadata.name = Some("spot-1".into());
        node.metadata.labels = Some([(ZONE_LABEL.to_string(), "zone-a".to_string())].into());
        node.status = Some(NodeStatus {
            conditions: Some(vec![
                condition("MemoryPressure", "False"),
                condition("Ready", "True"),
            ]),
            images: Some(vec![
                ContainerImage {
                    names: Some(vec!["registry.example/a-large-image:1".into()]),
                    size_bytes: Some(1 << 30),
                };
                50
            ]),
            ..Default::default()
        });
        node
    }

    #[test]
    fn a_cached_node_keeps_only_what_the_operator_reads() {
        let mut node = reported(100, 200);
        let before = serde_json::to_vec(&node).unwrap().len();
        keep_what_is_read_of_node(&mut node);
        let after = serde_json::to_vec(&node).unwrap().len();
        assert!(after * 10 < before, "{before} bytes cached as {after}");
        assert_eq!(node_state(Some(&node)), NodeState::Ready);
        assert_eq!(zone(Some(&node)).as_deref(), Some("zone-a"));
        let conditions = node.status.unwrap().conditions.unwrap();
        assert_eq!(conditions.len(), 1, "Ready only");
    }

    #[test]
    fn a_heartbeat_is_no_news_and_a_readiness_change_is() {
        let news = |mut n: Node| {
            keep_what_is_read_of_node(&mut n);
            node_news(&n)
        };
        let base = news(reported(100, 200));
        assert_eq!(news(reported(100, 210)), base, "a heartbeat");
        let mut not_ready = reported(100, 210);
        not_ready
            .status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap()[1]
            .status = "False".into();
        assert_ne!(news(not_ready), base);
        let mut relabelled = reported(100, 210);
        relabelled
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("karpenter.sh/capacity-type".into(), "spot".into());
        assert_ne!(news(relabelled), base);
        let mut tainted = reported(100, 210);
        tainted.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            taints: Some(vec![k8s_openapi::api::core::v1::Taint {
                key: "example.com/reclaimed".into(),
                effect: "NoExecute".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        assert_ne!(news(tainted), base);
    }

    #[test]
    fn a_nodes_zone_is_its_well_known_label() {
        let mut node = Node::default();
        assert_eq!(zone(Some(&node)), None);
        node.metadata.labels = Some(
            [(ZONE_LABEL.to_string(), "europe-west4-a".to_string())]
                .into_iter()
                .collect(),
        );
        assert_eq!(zone(Some(&node)).as_deref(), Some("europe-west4-a"));
        assert_eq!(zone(None), None, "a node gone from the cache");
    }

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn running() -> Pod {
        Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                creation_timestamp: Some(Time(at(100))),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some("n1".into()),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some("Running".into()),
                ..Default::default()
            }),
        }
    }

    /// The trainer container, exited.
    pub(in crate::runtime::kube) fn exited(
        code: i32,
        reason: &str,
        message: Option<&str>,
    ) -> ContainerStatus {
        ContainerStatus {
            name: "trainer".into(),
            state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: code,
                    reason: Some(reason.into()),
                    message: message.map(Into::into),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn terminated(phase: &str, code: i32, reason: &str, message: Option<&str>) -> Pod {
        let mut pod = running();
        let status = pod.status.as_mut().unwrap();
        status.phase = Some(phase.into());
        status.container_statuses = Some(vec![exited(code, reason, message)]);
        pod
    }

    fn disrupted(mut pod: Pod, reason: &str) -> Pod {
        pod.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
            type_: "DisruptionTarget".into(),
            status: "True".into(),
            reason: Some(reason.into()),
            message: Some("spot".into()),
            ..Default::default()
        }]);
        pod
    }

    /// The facts of `pod`, read as the cache holds it: trimmed, with the same facts as whole.
    fn facts(pod: &Pod, node: NodeState, last: Option<TrainerState>) -> PodFacts {
        let whole = pod_facts(pod, |_| node, last, at(1000), LOST_AFTER);
        let cached = cached(pod);
        assert_eq!(
            pod_facts(&cached, |_| node, last, at(1000), LOST_AFTER),
            whole
        );
        assert_eq!(creating(&cached), creating(pod));
        assert_eq!(member_of(&cached), member_of(pod));
        whole
    }

    fn cached(pod: &Pod) -> Pod {
        let mut cached = pod.clone();
        keep_what_is_read_of_pod(&mut cached);
        cached
    }

    fn exit(pod: &Pod) -> Option<Exit> {
        facts(pod, NodeState::Ready, None).member.exit
    }

    fn is_preemption(e: &Option<Exit>) -> bool {
        matches!(e, Some(Exit::Preempted { .. }))
    }

    #[test]
    fn a_running_pod_on_a_ready_node_is_live() {
        let f = facts(&running(), NodeState::Ready, None);
        assert_eq!(f.member.exit, None);
        assert_eq!(f.member.node.as_deref(), Some("n1"));
        assert_eq!(f.member.pending_since, None);
    }

    #[test]
    fn an_unscheduled_pod_waits_since_its_creation() {
        let mut pod = running();
        pod.spec.as_mut().unwrap().node_name = None;
        pod.status.as_mut().unwrap().phase = Some("Pending".into());
        let f = facts(&pod, NodeState::Ready, None);
        assert_eq!(
            (f.member.exit, f.member.node, f.member.pending_since),
            (None, None, Some(at(100)))
        );
    }

    #[test]
    fn every_disruption_reason_is_a_preemption_even_while_the_pod_still_runs() {
        for reason in DISRUPTION_REASONS {
            let e = exit(&disrupted(running(), reason));
            let Some(Exit::Preempted { reason: why }) = e else {
                panic!("{reason}: {e:?}")
            };
            assert!(why.starts_with(reason), "{why}");
            // ...and whatever code the trainer exited with afterwards.
            for code in [0, 1, 137, 143] {
                let e = exit(&disrupted(
                    terminated("Failed", code, "Error", None),
                    reason,
                ));
                assert!(is_preemption(&e), "{reason} exit {code}: {e:?}");
            }
        }
    }

    #[test]
    fn node_shutdown_and_eviction_are_preemptions() {
        for reason in ["Terminated", "Shutdown", "Evicted", "NodeLost", "OutOfcpu"] {
            let mut pod = terminated("Failed", 143, "Error", None);
            pod.status.as_mut().unwrap().reason = Some(reason.into());
            pod.status.as_mut().unwrap().message =
                Some("Pod was terminated in response to imminent node shutdown.".into());
            assert!(is_preemption(&exit(&pod)), "{reason}");
            // Failed before the container ever ran.
            let mut pod = running();
            pod.status.as_mut().unwrap().phase = Some("Failed".into());
            pod.status.as_mut().unwrap().reason = Some(reason.into());
            assert!(is_preemption(&exit(&pod)), "{reason} before running");
        }
    }

    #[test]
    fn a_deleted_pod_and_a_lost_node_are_preemptions() {
        let mut pod = running();
        pod.metadata.deletion_timestamp = Some(Time(at(900)));
        assert_eq!(
            exit(&pod),
            Some(Exit::Preempted {
                reason: "pod deleted".into()
            })
        );
        // Lost with its node only when the node is: the pod's own deletion is not.
        assert!(!facts(&pod, NodeState::Gone, None).node_lost);
        let f = facts(&running(), NodeState::Gone, None);
        assert_eq!(
            f.member.exit,
            Some(Exit::Preempted {
                reason: "node n1 is gone".into()
            })
        );
        assert!(f.node_lost);
        // NotReady: only beyond the timeout.
        let briefly = NodeState::NotReady { since: at(950) };
        let f = facts(&running(), briefly, None);
        assert_eq!((f.member.exit, f.node_lost), (None, false));
        let long = NodeState::NotReady { since: at(900) };
        let f = facts(&running(), long, None);
        assert_eq!(
            f.member.exit,
            Some(Exit::Preempted {
                reason: "node n1 not ready for 100 s".into()
            })
        );
        assert!(f.node_lost);
        // The kubelet's own word that the node went away is the pod's: the kubelet is there.
        let mut pod = terminated("Failed", 143, "Error", None);
        pod.status.as_mut().unwrap().reason = Some("NodeLost".into());
        assert!(!facts(&pod, NodeState::Ready, None).node_lost);
    }

    #[test]
    fn a_pod_held_by_a_scheduling_gate_waits_for_admission_not_for_a_node() {
        use k8s_openapi::api::core::v1::PodSchedulingGate;
        let mut pod = running();
        pod.spec = Some(PodSpec {
            scheduling_gates: Some(vec![PodSchedulingGate {
                name: "kueue.x-k8s.io/admission".into(),
            }]),
            ..Default::default()
        });
        pod.status.as_mut().unwrap().phase = Some("Pending".into());
        let f = facts(&pod, NodeState::Ready, None);
        assert_eq!(
            f.member.gated_by.as_deref(),
            Some("kueue.x-k8s.io/admission")
        );
        assert_eq!((f.member.pending_since, f.member.exit), (None, None));
        // Ungated, it waits for a node since its creation.
        pod.spec.as_mut().unwrap().scheduling_gates = Some(vec![]);
        let f = facts(&pod, NodeState::Ready, None);
        assert_eq!(
            (f.member.gated_by, f.member.pending_since),
            (None, Some(at(100)))
        );
    }

    #[test]
    fn a_pod_kueue_evicts_is_a_preemption_in_kueues_words() {
        let mut pod = running();
        pod.metadata.deletion_timestamp = Some(Time(at(900)));
        pod.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
            type_: "TerminationTarget".into(),
            status: "True".into(),
            reason: Some("WorkloadEvictedDueToPreempted".into()),
            message: Some("Preempted to accommodate a workload".into()),
            ..Default::default()
        }]);
        let why = "WorkloadEvictedDueToPreempted: Preempted to accommodate a workload";
        assert_eq!(exit(&pod), Some(Exit::Preempted { reason: why.into() }));
        // Stopped by the kubelet afterwards, while Kueue's finalizer keeps the pod.
        let mut stopped = terminated("Failed", 143, "Error", None);
        stopped.metadata = pod.metadata.clone();
        stopped.status.as_mut().unwrap().conditions = pod.status.unwrap().conditions;
        assert_eq!(exit(&stopped), Some(Exit::Preempted { reason: why.into() }));
    }

    #[test]
    fn a_container_killed_because_its_pod_was_deleted_is_a_preemption() {
        for code in [137, 143] {
            let mut pod = terminated("Failed", code, "Error", None);
            pod.metadata.deletion_timestamp = Some(Time(at(900)));
            assert_eq!(
                exit(&pod),
                Some(Exit::Preempted {
                    reason: "pod deleted".into()
                }),
                "{code}"
            );
        }
        // Any other code is the trainer's own failure, deleted or not.
        let mut pod = terminated("Failed", 1, "Error", None);
        pod.metadata.deletion_timestamp = Some(Time(at(900)));
        assert!(matches!(
            exit(&pod),
            Some(Exit::Failed { code: Some(1), .. })
        ));
    }

    #[test]
    fn a_crash_is_a_failure_with_its_exit_code() {
        let e = exit(&terminated("Failed", 101, "Error", None));
        assert!(
            matches!(&e, Some(Exit::Failed { reason, code: Some(101), .. }) if reason == "exit code 101 (Error)"),
            "{e:?}"
        );
        let e = exit(&terminated("Failed", 137, "OOMKilled", None));
        assert!(
            matches!(&e, Some(Exit::Failed { reason, code: Some(137), .. }) if reason == "exit code 137 (OOMKilled)"),
            "{e:?}"
        );
    }

    #[test]
    fn a_clean_exit_is_completion_only_when_the_trainer_says_done() {
        let done = r#"{"outcome":"done","step":400}"#;
        let left = r#"{"outcome":"left","step":120}"#;
        assert_eq!(
            exit(&terminated("Succeeded", 0, "Completed", Some(done))),
            Some(Exit::Completed)
        );
        assert!(is_preemption(&exit(&terminated(
            "Succeeded",
            0,
            "Completed",
            Some(left)
        ))));
        // No message (an older trainer): its last status decides.
        let pod = terminated("Succeeded", 0, "Completed", None);
        assert!(is_preemption(&exit(&pod)));
        let f = facts(&pod, NodeState::Ready, Some(TrainerState::Done));
        assert_eq!(f.member.exit, Some(Exit::Completed));
    }

    #[test]
    fn a_container_that_cannot_start_says_why() {
        let mut pod = running();
        pod.status.as_mut().unwrap().container_statuses = Some(vec![ContainerStatus {
            name: "trainer".into(),
            state: Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("ImagePullBackOff".into()),
                    message: Some("pull access denied".into()),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }]);
        let f = facts(&pod, NodeState::Ready, None);
        assert_eq!(
            f.member.not_starting,
            Some(NotStarting {
                reason: "ImagePullBackOff".into(),
                message: "pull access denied".into(),
            })
        );
        assert_eq!(f.member.exit, None);
        assert!(!creating(&pod), "past creating: it says why it waits");
    }

    #[test]
    fn an_image_problem_names_the_image() {
        let mut pod = running();
        pod.spec.as_mut().unwrap().containers = vec![k8s_openapi::api::core::v1::Container {
            name: "trainer".into(),
            image: Some("registry.invalid/murmur-trainer:9".into()),
            ..Default::default()
        }];
        let waiting = |reason: &str, message: &str| {
            Some(vec![ContainerStatus {
                name: "trainer".into(),
                state: Some(ContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some(reason.into()),
                        message: Some(message.into()),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }])
        };
        // The kubelet's message names it: left as it is.
        let kubelets = r#"Back-off pulling image "registry.invalid/murmur-trainer:9""#;
        pod.status.as_mut().unwrap().container_statuses = waiting("ImagePullBackOff", kubelets);
        assert_eq!(
            facts(&pod, NodeState::Ready, None)
                .member
                .not_starting
                .unwrap()
                .message,
            kubelets
        );
        // It does not: the image is said.
        pod.status.as_mut().unwrap().container_statuses = waiting("ErrImagePull", "not found");
        assert_eq!(
            facts(&pod, NodeState::Ready, None)
                .member
                .not_starting
                .unwrap()
                .message,
            r#"image "registry.invalid/murmur-trainer:9": not found"#
        );
        // Not about the image: nothing added.
        pod.status.as_mut().unwrap().container_statuses =
            waiting("CreateContainerConfigError", "secret \"k\" not found");
        assert_eq!(
            facts(&pod, NodeState::Ready, None)
                .member
                .not_starting
                .unwrap()
                .message,
            "secret \"k\" not found"
        );
    }

    #[test]
    fn a_pod_on_a_node_without_a_running_container_is_creating() {
        let mut pod = running();
        pod.spec.as_mut().unwrap().node_name = Some("n1".into());
        let status = pod.status.as_mut().unwrap();
        status.phase = Some("Pending".into());
        status.container_statuses = None;
        assert!(creating(&pod), "no container status yet");
        pod.status.as_mut().unwrap().container_statuses = Some(vec![ContainerStatus {
            name: "trainer".into(),
            state: Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("ContainerCreating".into()),
                    message: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }]);
        assert!(creating(&pod));
        pod.spec.as_mut().unwrap().node_name = None;
        assert!(!creating(&pod), "not on a node: the scheduler's business");
    }

    #[test]
    fn a_crash_says_the_kubelets_reason_and_the_last_line_of_its_message() {
        assert_eq!(crash_detail(None, None), "Error");
        assert_eq!(crash_detail(Some("OOMKilled"), Some("")), "OOMKilled");
        assert_eq!(
            crash_detail(
                Some("StartError"),
                Some("failed to create task: exec: \"run\": executable file not found in $PATH\n")
            ),
            "StartError: failed to create task: exec: \"run\": executable file not found in $PATH"
        );
        assert_eq!(
            crash_detail(Some("Error"), Some("line one\nthe last line\n\n")),
            "Error: the last line"
        );
        let long = "é".repeat(400);
        let d = crash_detail(Some("Error"), Some(&long));
        assert!(
            d.ends_with('…') && d.len() <= "Error: ".len() + 300 + '…'.len_utf8(),
            "{d}"
        );
    }

    #[test]
    fn node_readiness_comes_from_its_ready_condition() {
        use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
        let node = |status: &str| Node {
            status: Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: status.into(),
                    last_transition_time: Some(Time(at(5))),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(node_state(Some(&node("True"))), NodeState::Ready);
        assert_eq!(
            node_state(Some(&node("Unknown"))),
            NodeState::NotReady { since: at(5) }
        );
        assert_eq!(node_state(None), NodeState::Gone);
    }
}
