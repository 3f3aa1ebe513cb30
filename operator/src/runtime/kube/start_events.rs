//! What keeps pods' containers from starting where no field of the pod says it: a volume that
//! cannot be mounted, a sandbox that cannot be made. The kubelet says so only in Warning events
//! about the pod; this index keeps the newest such event per pod (its reason and message, not the
//! whole object), fed by a watch of pods' Warning events.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Event;
use kube::runtime::watcher;
use parking_lot::Mutex;

use super::cached_pod::CachedPod;
use super::observe::START_EVENT_REASONS;
use crate::member::NotStarting;

/// The field selector of the watch that feeds the index: Warning events about pods.
pub const FIELD_SELECTOR: &str = "involvedObject.kind=Pod,type=Warning";

/// Pod uid → the event (its name) and what it says.
#[derive(Clone, Default)]
pub struct StartEvents(Arc<Mutex<HashMap<String, (String, NotStarting)>>>);

impl StartEvents {
    /// Take one watch event in. Returns the event, when it is one of interest, so that the job
    /// of the pod it is about can be woken.
    pub fn apply<E>(&self, event: &watcher::Event<Event>) -> Option<Result<Event, E>> {
        let mut index = self.0.lock();
        match event {
            watcher::Event::Init => {
                index.clear();
                None
            }
            watcher::Event::InitDone => None,
            watcher::Event::InitApply(e) | watcher::Event::Apply(e) => {
                let reason = e.reason.as_deref()?;
                if !START_EVENT_REASONS.contains(&reason) {
                    return None;
                }
                let pod = &e.involved_object;
                let problem = NotStarting {
                    reason: reason.to_string(),
                    message: e.message.clone().unwrap_or_default(),
                };
                let name = e.metadata.name.clone().unwrap_or_default();
                index.insert(pod.uid.clone()?, (name, problem));
                Some(Ok(e.clone()))
            }
            watcher::Event::Delete(e) => {
                let uid = e.involved_object.uid.as_deref()?;
                if index
                    .get(uid)
                    .is_some_and(|(name, _)| e.metadata.name.as_ref() == Some(name))
                {
                    index.remove(uid);
                }
                None
            }
        }
    }

    /// The newest event of interest about `pod`.
    pub fn get(&self, pod: &CachedPod) -> Option<NotStarting> {
        let uid = pod.metadata.uid.as_deref()?;
        self.0.lock().get(uid).map(|(_, p)| p.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn event(name: &str, uid: &str, reason: &str, message: &str) -> Event {
        Event {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                kind: Some("Pod".into()),
                namespace: Some("ml".into()),
                name: Some(format!("pod-{uid}")),
                uid: Some(uid.into()),
                ..Default::default()
            },
            reason: Some(reason.into()),
            message: Some(message.into()),
            type_: Some("Warning".into()),
            ..Default::default()
        }
    }

    fn pod(uid: &str) -> CachedPod {
        CachedPod {
            metadata: ObjectMeta {
                uid: Some(uid.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// What [`StartEvents::apply`] hands on to wake a job, if anything.
    fn apply(index: &StartEvents, event: watcher::Event<Event>) -> Option<Event> {
        index.apply::<()>(&event).map(Result::unwrap)
    }

    #[test]
    fn the_newest_event_that_blocks_a_start_is_kept_per_pod() {
        let index = StartEvents::default();
        let probe = event("e0", "u1", "Unhealthy", "Readiness probe failed");
        assert_eq!(
            apply(&index, watcher::Event::Apply(probe)),
            None,
            "not a start problem"
        );
        assert_eq!(index.get(&pod("u1")), None);

        let mount = event(
            "e1",
            "u1",
            "FailedMount",
            "MountVolume.SetUp failed for volume \"data\"",
        );
        assert_eq!(
            apply(&index, watcher::Event::Apply(mount.clone())),
            Some(mount.clone()),
            "handed on: its pod's job wakes"
        );
        assert_eq!(
            index.get(&pod("u1")),
            Some(NotStarting {
                reason: "FailedMount".into(),
                message: "MountVolume.SetUp failed for volume \"data\"".into(),
            })
        );
        assert_eq!(index.get(&pod("u2")), None, "another pod");

        let sandbox = event(
            "e2",
            "u1",
            "FailedCreatePodSandBox",
            "failed to setup network",
        );
        apply(&index, watcher::Event::Apply(sandbox.clone()));
        assert_eq!(
            index.get(&pod("u1")).unwrap().reason,
            "FailedCreatePodSandBox"
        );
        // An older event expiring leaves the newer one; the newer one's expiry clears it.
        assert_eq!(apply(&index, watcher::Event::Delete(mount)), None);
        assert!(index.get(&pod("u1")).is_some());
        apply(&index, watcher::Event::Delete(sandbox));
        assert_eq!(index.get(&pod("u1")), None);
    }

    #[test]
    fn a_relist_starts_afresh() {
        let index = StartEvents::default();
        apply(
            &index,
            watcher::Event::Apply(event("e1", "u1", "FailedMount", "x")),
        );
        apply(&index, watcher::Event::Init);
        assert_eq!(index.get(&pod("u1")), None);
        apply(
            &index,
            watcher::Event::InitApply(event("e1", "u1", "FailedMount", "x")),
        );
        apply(&index, watcher::Event::InitDone);
        assert!(index.get(&pod("u1")).is_some());
    }
}
