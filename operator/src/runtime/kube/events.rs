//! The Kubernetes Events (events.k8s.io/v1) the operator writes. Each piece of news is an Event
//! of its own, with its own note. A warning said again with the same note within
//! [`REPEAT_WINDOW`] is a repeat: the first Event becomes a series and its count goes up, so a
//! problem retried every few seconds is one line in `kubectl events`, not hundreds.
//!
//! Not kube-runtime's `Recorder`: it keys a series on the type, reason, action and objects
//! without the note (a job's second `TopologyChanged` would show as the first one's note with a
//! count), and it keeps every Event it writes for six minutes (1.5 MB at 1 000 members, two a
//! member). Here only warnings are remembered, at most [`REMEMBERED`] of them.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use murmur_core::api::DecentralizedTrainingJob;
use parking_lot::Mutex;

use super::writes::REPORTING_CONTROLLER;
use crate::planner::EventKind;

/// How long a warning's Event takes repeats into its series (client-go's and kube-runtime's
/// six minutes).
pub const REPEAT_WINDOW: SignedDuration = SignedDuration::from_mins(6);

/// The most warnings remembered for repeats; past it the oldest is forgotten (its next repeat is
/// a new Event).
pub const REMEMBERED: usize = 512;

/// One Event to write: what it says, regarding which object, and the pod it names.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NewEvent {
    /// `Normal` news or a `Warning` of a problem.
    pub type_: EventKind,
    pub reason: String,
    pub action: String,
    pub note: String,
    pub regarding: Reference,
    pub related: Option<Reference>,
}

/// An object an Event regards or names.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Reference {
    pub api_version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
}

impl Reference {
    /// A DecentralizedTrainingJob, from its metadata (decoded or not).
    pub fn job(meta: &ObjectMeta) -> Self {
        Self {
            api_version: DecentralizedTrainingJob::api_version(&()).into(),
            kind: DecentralizedTrainingJob::kind(&()).into(),
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone(),
        }
    }

    fn object_reference(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some(self.api_version.clone()),
            kind: Some(self.kind.clone()),
            namespace: Some(self.namespace.clone()),
            name: Some(self.name.clone()),
            uid: self.uid.clone(),
            ..Default::default()
        }
    }
}

/// A warning's Event as written: its name, how often it was said and when last.
#[derive(Clone, Debug)]
struct Remembered {
    name: String,
    count: i32,
    last: Timestamp,
}

#[derive(Default)]
struct Memory {
    warnings: HashMap<NewEvent, Remembered>,
    /// The last Event name's time in nanoseconds: two Events in the same nanosecond still get
    /// names of their own.
    last_name: i128,
}

/// Writes Events for one operator process (`reportingInstance`).
#[derive(Clone)]
pub struct EventWriter {
    client: Client,
    instance: String,
    memory: Arc<Mutex<Memory>>,
}

/// What writing an Event did: a new Event or a count on an earlier one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Published {
    /// A new Event.
    Created,
    /// A repeat: the series of an earlier Event, with this count.
    Repeated(i32),
}

impl EventWriter {
    pub fn new(client: Client, instance: String) -> Self {
        Self {
            client,
            instance,
            memory: Arc::default(),
        }
    }

    /// Write `event` at `now`: a new Event, or the series of the warning it repeats.
    pub async fn publish(
        &self,
        event: &NewEvent,
        now: Timestamp,
    ) -> Result<Published, kube::Error> {
        let api: Api<Event> = Api::namespaced(self.client.clone(), &event.regarding.namespace);
        let repeat = match event.type_ {
            EventKind::Warning => self.repeat_of(event, now),
            EventKind::Normal => None,
        };
        if let Some((name, count)) = repeat {
            let series = EventSeries {
                count,
                last_observed_time: MicroTime(now),
            };
            let patch = serde_json::json!({ "series": series });
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return Ok(Published::Repeated(count)),
                // Deleted meanwhile (by hand, or by the API server's event TTL): said anew.
                Err(kube::Error::Api(e)) if e.code == 404 => {
                    self.memory.lock().warnings.remove(event);
                }
                Err(e) => return Err(e),
            }
        }
        let name = self.new_name(&event.regarding.name, now);
        let written = api
            .create(&PostParams::default(), &self.event(event, &name, now))
            .await?;
        if event.type_ == EventKind::Warning {
            let name = written.metadata.name.unwrap_or(name);
            self.remember(event, name, now);
        }
        Ok(Published::Created)
    }

    /// The name and next count of the Event `event` repeats, if it is one (and counts it).
    fn repeat_of(&self, event: &NewEvent, now: Timestamp) -> Option<(String, i32)> {
        let mut memory = self.memory.lock();
        let said = memory.warnings.get_mut(event)?;
        if said.last + REPEAT_WINDOW <= now {
            memory.warnings.remove(event);
            return None;
        }
        said.count += 1;
        said.last = now;
        Some((said.name.clone(), said.count))
    }

    fn remember(&self, event: &NewEvent, name: String, now: Timestamp) {
        let mut memory = self.memory.lock();
        memory.warnings.retain(|_, w| w.last + REPEAT_WINDOW > now);
        if memory.warnings.len() >= REMEMBERED
            && let Some(oldest) = memory
                .warnings
                .iter()
                .min_by_key(|(_, w)| w.last)
                .map(|(k, _)| k.clone())
        {
            memory.warnings.remove(&oldest);
        }
        memory.warnings.insert(
            event.clone(),
            Remembered {
                name,
                count: 1,
                last: now,
            },
        );
    }

    /// `<regarding>.<nanoseconds in hex>`, as client-go names Events, never the same twice.
    fn new_name(&self, regarding: &str, now: Timestamp) -> String {
        let mut memory = self.memory.lock();
        let nanos = now.as_nanosecond().max(memory.last_name + 1);
        memory.last_name = nanos;
        format!("{regarding}.{nanos:x}")
    }

    fn event(&self, event: &NewEvent, name: &str, now: Timestamp) -> Event {
        Event {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(event.regarding.namespace.clone()),
                ..Default::default()
            },
            event_time: Some(MicroTime(now)),
            type_: Some(event.type_.as_str().into()),
            reason: Some(event.reason.clone()),
            action: Some(event.action.clone()),
            note: Some(event.note.clone()),
            regarding: Some(event.regarding.object_reference()),
            related: event.related.as_ref().map(Reference::object_reference),
            reporting_controller: Some(REPORTING_CONTROLLER.into()),
            reporting_instance: Some(self.instance.clone()),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Response};
    use kube::client::Body;
    use serde_json::Value;

    /// (method, path, body) of each request the mock API server answered.
    type Calls = Arc<Mutex<Vec<(String, String, Value)>>>;

    /// An API server that takes every write and answers with what it was sent.
    fn server() -> (EventWriter, Calls) {
        server_without(Arc::default())
    }

    /// [`server`], where the Events named in `gone` do not exist (a patch of one is 404).
    fn server_without(gone: Arc<Mutex<Vec<String>>>) -> (EventWriter, Calls) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let calls: Calls = Arc::default();
        let log = calls.clone();
        tokio::spawn(async move {
            while let Some((request, send)) = handle.next_request().await {
                let method = request.method().to_string();
                let path = request.uri().path().to_string();
                let bytes = request.into_body().collect_bytes().await.unwrap();
                let body: Value = serde_json::from_slice(&bytes).unwrap();
                log.lock()
                    .push((method.clone(), path.clone(), body.clone()));
                let name = path.rsplit('/').next().unwrap_or_default().to_string();
                let (code, answer) = if method == "PATCH" && gone.lock().contains(&name) {
                    let status = serde_json::json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": 404, "reason": "NotFound", "message": format!("events.events.k8s.io \"{name}\" not found"), "metadata": {}});
                    (404, status)
                } else {
                    let mut answer = body;
                    answer["apiVersion"] = "events.k8s.io/v1".into();
                    answer["kind"] = "Event".into();
                    answer["metadata"]["name"] = "answered".into();
                    (200, answer)
                };
                send.send_response(
                    Response::builder()
                        .status(code)
                        .body(Body::from(serde_json::to_vec(&answer).unwrap()))
                        .unwrap(),
                );
            }
        });
        let writer = EventWriter::new(Client::new(service, "default"), "test".into());
        (writer, calls)
    }

    fn job() -> Reference {
        Reference {
            api_version: "murmur.dev/v1alpha1".into(),
            kind: "DecentralizedTrainingJob".into(),
            namespace: "ns".into(),
            name: "mnist".into(),
            uid: Some("uid-1".into()),
        }
    }

    fn said(type_: EventKind, reason: &str, note: &str) -> NewEvent {
        NewEvent {
            type_,
            reason: reason.into(),
            action: reason.into(),
            note: note.into(),
            regarding: job(),
            related: None,
        }
    }

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + second).unwrap()
    }

    /// (method, note or series count) of each write.
    fn written(calls: &Calls) -> Vec<(String, String)> {
        calls
            .lock()
            .iter()
            .map(|(method, _, body)| {
                let what = match method.as_str() {
                    "POST" => body["note"].as_str().unwrap().to_string(),
                    _ => body["series"]["count"].to_string(),
                };
                (method.clone(), what)
            })
            .collect()
    }

    fn w(method: &str, what: &str) -> (String, String) {
        (method.into(), what.into())
    }

    #[tokio::test]
    async fn news_is_an_event_of_its_own_and_a_warning_said_again_is_a_series() {
        let (writer, calls) = server();
        let normal = |note| said(EventKind::Normal, "TopologyChanged", note);
        let warning = |note| said(EventKind::Warning, "PodsRejected", note);
        let steps = [
            (normal("topology version 1"), Published::Created),
            (normal("topology version 2"), Published::Created),
            // News said twice is written twice: only problems repeat.
            (normal("topology version 2"), Published::Created),
            (warning("quota exceeded"), Published::Created),
            (warning("quota exceeded"), Published::Repeated(2)),
            (warning("quota exceeded"), Published::Repeated(3)),
            // Another note is another problem, whatever the reason says.
            (warning("no such priority class"), Published::Created),
        ];
        for (second, (event, expected)) in steps.into_iter().enumerate() {
            let published = writer.publish(&event, at(second as i64)).await.unwrap();
            assert_eq!(published, expected, "{event:?}");
        }
        assert_eq!(
            written(&calls),
            [
                w("POST", "topology version 1"),
                w("POST", "topology version 2"),
                w("POST", "topology version 2"),
                w("POST", "quota exceeded"),
                w("PATCH", "2"),
                w("PATCH", "3"),
                w("POST", "no such priority class"),
            ]
        );
        let calls = calls.lock();
        // The series goes to the Event the API server named.
        assert_eq!(
            calls[4].1,
            "/apis/events.k8s.io/v1/namespaces/ns/events/answered"
        );
        assert_eq!(
            calls[5].2["series"]["lastObservedTime"],
            "2023-11-14T22:13:25.000000Z"
        );
        // Each new Event says who wrote it, about what, and has a name of its own.
        let first = &calls[0].2;
        assert_eq!(first["reportingController"], REPORTING_CONTROLLER);
        assert_eq!(first["reportingInstance"], "test");
        assert_eq!(first["regarding"]["name"], "mnist");
        assert_eq!(first["regarding"]["uid"], "uid-1");
        assert_eq!(first["type"], "Normal");
        let names: std::collections::BTreeSet<&str> = calls
            .iter()
            .filter(|(method, ..)| method == "POST")
            .map(|(_, _, body)| body["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names.len(), 5, "{names:?}");
    }

    #[tokio::test]
    async fn events_written_in_the_same_instant_have_names_of_their_own() {
        let (writer, calls) = server();
        for note in ["a", "b", "c"] {
            writer
                .publish(&said(EventKind::Normal, "Joined", note), at(0))
                .await
                .unwrap();
        }
        let names: Vec<String> = calls
            .lock()
            .iter()
            .map(|(_, _, body)| body["metadata"]["name"].as_str().unwrap().to_string())
            .collect();
        assert!(names.iter().all(|n| n.starts_with("mnist.")), "{names:?}");
        assert_eq!(
            names
                .iter()
                .collect::<std::collections::BTreeSet<_>>()
                .len(),
            3,
            "{names:?}"
        );
    }

    #[tokio::test]
    async fn a_warning_said_again_after_the_window_is_a_new_event() {
        let (writer, calls) = server();
        let warning = said(EventKind::Warning, "PodsRejected", "quota exceeded");
        let window = REPEAT_WINDOW.as_secs();
        for second in [0, window - 1, 2 * window - 2] {
            writer.publish(&warning, at(second)).await.unwrap();
        }
        assert_eq!(
            written(&calls),
            [
                w("POST", "quota exceeded"),
                // Within the window of the last time it was said, not of the first.
                w("PATCH", "2"),
                w("PATCH", "3"),
            ]
        );
        writer.publish(&warning, at(3 * window)).await.unwrap();
        assert_eq!(written(&calls)[3], w("POST", "quota exceeded"));
    }

    #[tokio::test]
    async fn only_the_newest_warnings_are_remembered() {
        let (writer, calls) = server();
        let warning = |i: usize| said(EventKind::Warning, "Preempted", &format!("member {i}"));
        // A tenth of a second apart: which is oldest is never a tie.
        let at =
            |i: usize| Timestamp::from_millisecond(1_700_000_000_000 + 100 * i as i64).unwrap();
        for i in 0..=REMEMBERED {
            writer.publish(&warning(i), at(i)).await.unwrap();
        }
        assert_eq!(writer.memory.lock().warnings.len(), REMEMBERED);
        let later = at(REMEMBERED + 1);
        assert_eq!(
            writer.publish(&warning(REMEMBERED), later).await.unwrap(),
            Published::Repeated(2)
        );
        // The oldest was forgotten: its repeat is a new Event.
        assert_eq!(
            writer.publish(&warning(0), later).await.unwrap(),
            Published::Created
        );
        assert_eq!(calls.lock().len(), REMEMBERED + 3);
        // News is never remembered.
        writer
            .publish(&said(EventKind::Normal, "Joined", "member 1"), later)
            .await
            .unwrap();
        assert_eq!(writer.memory.lock().warnings.len(), REMEMBERED);
    }

    #[tokio::test]
    async fn a_repeat_of_an_event_deleted_meanwhile_is_a_new_event() {
        let gone: Arc<Mutex<Vec<String>>> = Arc::default();
        let (writer, calls) = server_without(gone.clone());
        let warning = said(EventKind::Warning, "PodsRejected", "quota exceeded");
        writer.publish(&warning, at(0)).await.unwrap();
        gone.lock().push("answered".into());
        assert_eq!(
            writer.publish(&warning, at(1)).await.unwrap(),
            Published::Created
        );
        gone.lock().clear();
        // The new Event is the one its repeats count on.
        assert_eq!(
            writer.publish(&warning, at(2)).await.unwrap(),
            Published::Repeated(2)
        );
        assert_eq!(
            written(&calls),
            [
                w("POST", "quota exceeded"),
                w("PATCH", "2"),
                w("POST", "quota exceeded"),
                w("PATCH", "2"),
            ]
        );
    }
}
