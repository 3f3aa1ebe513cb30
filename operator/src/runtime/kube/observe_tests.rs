//! Tests of `observe.rs`, kept beside it.

use super::*;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus, Pod,
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
    assert_eq!(place(Some(&node)).0.as_deref(), Some("zone-a"));
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
fn a_nodes_zone_and_region_are_its_well_known_labels() {
    let mut node = Node::default();
    assert_eq!(place(Some(&node)), (None, None));
    node.metadata.labels = Some(
        [(ZONE_LABEL.to_string(), "europe-west4-a".to_string())]
            .into_iter()
            .collect(),
    );
    assert_eq!(place(Some(&node)), (Some("europe-west4-a".into()), None));
    node.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(REGION_LABEL.to_string(), "europe-west4".to_string());
    assert_eq!(
        place(Some(&node)),
        (Some("europe-west4-a".into()), Some("europe-west4".into()))
    );
    assert_eq!(place(None), (None, None), "a node gone from the cache");
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

/// The facts of `pod` as the API server holds it, read as the pod cache holds it.
fn facts(pod: &Pod, node: NodeState, last: Option<TrainerState>) -> PodFacts {
    pod_facts(&cached(pod), |_| node, last, at(1000), LOST_AFTER)
}

/// The pod as the pod cache holds it.
fn cached(pod: &Pod) -> CachedPod {
    let mut cached = CachedPod::of(pod);
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
    assert!(
        !creating(&cached(&pod)),
        "past creating: it says why it waits"
    );
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
    assert!(creating(&cached(&pod)), "no container status yet");
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
    assert!(creating(&cached(&pod)));
    pod.spec.as_mut().unwrap().node_name = None;
    assert!(
        !creating(&cached(&pod)),
        "not on a node: the scheduler's business"
    );
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

/// A pod of member `member`'s `attempt`, in clique `clique` when it has one.
fn member_pod(name: &str, member: u32, attempt: u32, clique: Option<u32>) -> Arc<CachedPod> {
    let mut labels: std::collections::BTreeMap<String, String> = [
        (LABEL_MEMBER.to_string(), member.to_string()),
        (LABEL_ATTEMPT.to_string(), attempt.to_string()),
    ]
    .into();
    if let Some(c) = clique {
        labels.insert(LABEL_CLIQUE.to_string(), c.to_string());
    }
    let mut pod = CachedPod::default();
    pod.metadata.name = Some(name.into());
    pod.metadata.labels = Some(labels);
    Arc::new(pod)
}

#[test]
fn a_jobs_pods_are_read_once_for_each_version_of_each_pod() {
    let ours = |p: &CachedPod| {
        p.metadata
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with("j-"))
    };
    let read = std::cell::Cell::new(0);
    let counted = |p: &CachedPod| {
        read.set(read.get() + 1);
        ours(p)
    };
    let named = |pods: &[NamedPod]| -> Vec<(String, u32, u32, Option<u32>)> {
        JobPodIndex::job_pods(pods)
            .iter()
            .map(|p| {
                let name = p.pod.metadata.name.clone().unwrap_or_default();
                (name, p.member, p.attempt, p.clique)
            })
            .collect()
    };
    let a = member_pod("j-0-0", 0, 0, None);
    let b = member_pod("j-1-2", 1, 2, Some(4));
    let other = member_pod("k-0-0", 0, 0, None);
    let mut unlabelled = CachedPod::default();
    unlabelled.metadata.name = Some("j-x".into());
    let unlabelled = Arc::new(unlabelled);
    let mut index = JobPodIndex::default();
    let cache = vec![a.clone(), other.clone(), b.clone(), unlabelled.clone()];
    let first = index.read(cache.clone(), counted);
    assert_eq!(
        named(&first),
        [
            ("j-0-0".to_string(), 0, 0, None),
            ("j-1-2".to_string(), 1, 2, Some(4))
        ],
        "the job's pods that name a member attempt, in the cache's order"
    );
    assert_eq!(read.get(), 4, "every pod read the first time");
    let again = index.read(cache, counted);
    assert_eq!(named(&again), named(&first));
    assert_eq!(read.get(), 4, "the same pods are not read again");
    // The cache shows a newer version of one pod (labelled with its clique) and drops another.
    let a_labelled = member_pod("j-0-0", 0, 0, Some(3));
    let next = index.read(vec![a_labelled, other, unlabelled], counted);
    assert_eq!(named(&next), [("j-0-0".to_string(), 0, 0, Some(3))]);
    assert_eq!(read.get(), 5, "only the newer version is read");
    assert_eq!(index.seen.len(), 3, "a pod the cache dropped is forgotten");
}

#[test]
fn a_deleted_node_is_marked_so_and_other_events_pass_unchanged() {
    use kube::runtime::watcher::Event;
    let at = Timestamp::from_second(300).unwrap();
    let Event::Delete(deleted) = mark_deleted_node(Event::Delete(reported(100, 200)), at) else {
        panic!("still a deletion");
    };
    assert_eq!(deleted.metadata.deletion_timestamp, Some(Time(at)));
    assert_ne!(node_news(&deleted), node_news(&reported(100, 200)));
    // One deleted gracefully keeps the time the API server gave it.
    let mut going = reported(100, 200);
    going.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(250).unwrap()));
    let Event::Delete(kept) = mark_deleted_node(Event::Delete(going.clone()), at) else {
        panic!("still a deletion");
    };
    assert_eq!(kept, going);
    let Event::Apply(applied) = mark_deleted_node(Event::Apply(reported(100, 200)), at) else {
        panic!("still an apply");
    };
    assert_eq!(applied, reported(100, 200));
}
