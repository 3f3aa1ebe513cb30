//! A member's pod as the pod cache holds it: the fields the operator reads, decoded straight from
//! the API server's JSON. k8s-openapi's `Pod` is about 2.4 kB before any of its strings even with
//! its spec and status emptied (every field of `PodSpec` and `PodStatus` is inline), and
//! decoding a whole pod allocates its containers, environment and volumes only to drop them.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::{ContainerState, Pod, PodSchedulingGate};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::Deserialize;

/// A pod, as much of it as the operator reads: identity, labels, annotations, owners and
/// timestamps; the node and scheduling gates; each container's name and image; the phase,
/// reason, message, conditions and each container's state.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct CachedPod {
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub spec: Option<CachedPodSpec>,
    pub status: Option<CachedPodStatus>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CachedPodSpec {
    pub node_name: Option<String>,
    pub scheduling_gates: Option<Vec<PodSchedulingGate>>,
    #[serde(default)]
    pub containers: Vec<CachedContainer>,
}

/// A container of the pod's spec: its image names it in a message before the kubelet does.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct CachedContainer {
    #[serde(default)]
    pub name: String,
    pub image: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CachedPodStatus {
    pub phase: Option<String>,
    pub reason: Option<String>,
    pub message: Option<String>,
    pub conditions: Option<Vec<CachedPodCondition>>,
    pub container_statuses: Option<Vec<CachedContainerStatus>>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct CachedPodCondition {
    #[serde(rename = "type", default)]
    pub type_: String,
    #[serde(default)]
    pub status: String,
    pub reason: Option<String>,
    pub message: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct CachedContainerStatus {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub image: String,
    pub state: Option<ContainerState>,
}

/// The pod's kind and API, so the cache watches `/api/v1/pods` as it would for `Pod`.
impl Resource for CachedPod {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        Pod::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        Pod::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        Pod::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        Pod::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl CachedPod {
    /// What the pod cache would hold of `pod`, a pod already decoded (the tests' and the
    /// benchmarks' pods).
    pub fn of(pod: &Pod) -> Self {
        let spec = pod.spec.as_ref().map(|s| CachedPodSpec {
            node_name: s.node_name.clone(),
            scheduling_gates: s.scheduling_gates.clone(),
            containers: s
                .containers
                .iter()
                .map(|c| CachedContainer {
                    name: c.name.clone(),
                    image: c.image.clone(),
                })
                .collect(),
        });
        let status = pod.status.as_ref().map(|s| CachedPodStatus {
            phase: s.phase.clone(),
            reason: s.reason.clone(),
            message: s.message.clone(),
            conditions: s.conditions.as_ref().map(|conditions| {
                conditions
                    .iter()
                    .map(|c| CachedPodCondition {
                        type_: c.type_.clone(),
                        status: c.status.clone(),
                        reason: c.reason.clone(),
                        message: c.message.clone(),
                    })
                    .collect()
            }),
            container_statuses: s.container_statuses.as_ref().map(|statuses| {
                statuses
                    .iter()
                    .map(|c| CachedContainerStatus {
                        name: c.name.clone(),
                        image: c.image.clone(),
                        state: c.state.clone(),
                    })
                    .collect()
            }),
        });
        CachedPod {
            metadata: pod.metadata.clone(),
            spec,
            status,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_pod_is_far_smaller_than_a_pod() {
        // What the cache saves per pod before any string: the reason for this type.
        assert!(std::mem::size_of::<CachedPod>() * 3 < std::mem::size_of::<Pod>());
    }

    #[test]
    fn decodes_what_the_api_server_sends_and_keeps_what_is_read() {
        let pod: CachedPod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "j-3-0", "namespace": "ml", "labels": {"a": "b"},
                         "managedFields": [{"manager": "kubelet"}]},
            "spec": {"nodeName": "n1", "schedulingGates": [{"name": "kueue"}],
                     "containers": [{"name": "trainer", "image": "murmur:1",
                                     "env": [{"name": "X", "value": "1"}]}],
                     "volumes": [{"name": "v", "emptyDir": {}}]},
            "status": {"phase": "Running", "podIP": "10.0.0.3",
                       "conditions": [{"type": "Ready", "status": "True",
                                       "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                       "containerStatuses": [{"name": "trainer", "image": "murmur:1",
                           "imageID": "sha256:x", "ready": true, "restartCount": 0,
                           "state": {"terminated": {"exitCode": 3, "reason": "Error"}}}]}
        }))
        .unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("j-3-0"));
        assert_eq!(pod.metadata.labels.as_ref().unwrap()["a"], "b");
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        assert_eq!(spec.scheduling_gates.as_ref().unwrap()[0].name, "kueue");
        assert_eq!(spec.containers[0].image.as_deref(), Some("murmur:1"));
        let status = pod.status.as_ref().unwrap();
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert_eq!(status.conditions.as_ref().unwrap()[0].type_, "Ready");
        let state = status.container_statuses.as_ref().unwrap()[0]
            .state
            .as_ref();
        assert_eq!(state.unwrap().terminated.as_ref().unwrap().exit_code, 3);
    }

    #[test]
    fn a_decoded_pod_is_cached_as_its_json_would_be() {
        let json = serde_json::json!({
            "metadata": {"name": "p", "labels": {"a": "b"}},
            "spec": {"nodeName": "n", "schedulingGates": [{"name": "g"}],
                     "containers": [{"name": "trainer", "image": "i", "args": ["x"]}]},
            "status": {"phase": "Pending", "reason": "r", "message": "m", "podIP": "10.0.0.1",
                       "conditions": [{"type": "DisruptionTarget", "status": "True",
                                       "reason": "EvictionByEvictionAPI", "message": "spot"}],
                       "containerStatuses": [{"name": "trainer", "image": "i", "imageID": "",
                           "ready": false, "restartCount": 2,
                           "state": {"waiting": {"reason": "ErrImagePull"}}}]}
        });
        let pod: Pod = serde_json::from_value(json.clone()).unwrap();
        let decoded: CachedPod = serde_json::from_value(json).unwrap();
        assert_eq!(CachedPod::of(&pod), decoded);
    }
}
