//! The status router: the JSON API, the trainers' control endpoint, `/metrics`, probes and the
//! dashboard. `murmur run` serves it locally and the operator in a cluster.
//!
//! Who may reach what:
//! - the probes (`/healthz`, `/readyz`) are open;
//! - observers (dashboard, job API, `/metrics`) carry a bearer token, and see a job only when
//!   the [`Access`] allows `get` on it (the job list holds only those);
//! - trainers sign every request with their job's key ([`control`]); a replayed post is refused;
//! - the topology is served to its job's trainers (signed request) or to an observer who may
//!   read the job, and is signed with the job key either way.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use axum::body::Bytes;
use axum::extract::{FromRef, Path, Query, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router, middleware};
use hyper_util::rt::TokioIo;
use murmur_core::contract::control::Envelope;
use murmur_core::contract::{
    JoinReport, MemberView, PeerEvent, TrainerStatus, control, view_stream,
};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::access::{self, Access, Action, Caller};
use super::hub::{Hub, Inbound, JobHandle, Role};
use super::pacer::{Pacer, paced};

const DASHBOARD: &str = include_str!("dashboard.html");

/// What every handler may reach: the jobs, and who may read them.
#[derive(Clone)]
struct Served {
    hub: Arc<Hub>,
    access: Arc<dyn Access>,
}

impl FromRef<Served> for Arc<Hub> {
    fn from_ref(served: &Served) -> Self {
        served.hub.clone()
    }
}

impl FromRef<Served> for Arc<dyn Access> {
    fn from_ref(served: &Served) -> Self {
        served.access.clone()
    }
}

/// The router over `hub`, its observers admitted by `access`. Observer reads are paced to
/// `reads_per_second` (0: unpaced, see [`pacer`](super::pacer)) before they are authenticated,
/// so that no one can make it ask the cluster about tokens faster; the probes and the trainers'
/// control traffic are never paced.
pub fn router(hub: Arc<Hub>, access: Arc<dyn Access>, reads_per_second: u32) -> Router {
    let served = Served { hub, access };
    let job = "/api/v1/namespaces/{namespace}/jobs/{name}";
    let mut observers = Router::new()
        .route("/", get(dashboard))
        .route("/metrics", get(metrics))
        .route("/api/v1/openapi.json", get(openapi))
        .route("/api/v1/jobs", get(list_jobs))
        .route(job, get(get_job))
        .route(&format!("{job}/events"), get(get_events))
        .route(&format!("{job}/series"), get(get_series))
        .route_layer(middleware::from_fn_with_state(
            served.access.clone(),
            access::authenticated,
        ));
    if let Some(pacer) = Pacer::new(reads_per_second) {
        observers = observers.route_layer(middleware::from_fn_with_state(Arc::new(pacer), paced));
    }
    let control = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        // Trainers that follow the whole document long-poll it here (the dashboard reads it too).
        .route(&format!("{job}/topology"), get(get_topology))
        // Each trainer follows its own view on a view stream (or long-polls it): a change wakes
        // only the members it touches.
        .route(&format!("{job}/members/{{id}}/topology"), get(get_view))
        .route(
            &format!("{job}/members/{{id}}/join"),
            post(post_from_trainer::<JoinReport>),
        )
        .route(
            &format!("{job}/members/{{id}}/status"),
            post(post_from_trainer::<TrainerStatus>),
        )
        .route(
            &format!("{job}/members/{{id}}/peer-events"),
            post(post_from_trainer::<PeerEvent>),
        );
    observers.merge(control).with_state(served)
}

/// An error answer: `{"error": "..."}` with a status code.
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, axum::Json(serde_json::json!({"error": self.1}))).into_response()
    }
}

async fn readyz(State(hub): State<Arc<Hub>>) -> Response {
    match hub.role() {
        Role::Leading => "leading\n".into_response(),
        Role::Standby => "standby: another replica leads\n".into_response(),
        Role::Starting => (StatusCode::SERVICE_UNAVAILABLE, "starting\n").into_response(),
    }
}

fn error(code: StatusCode, message: impl Into<String>) -> ApiError {
    ApiError(code, message.into())
}

fn find(hub: &Hub, namespace: &str, name: &str) -> Result<Arc<JobHandle>, ApiError> {
    hub.job(namespace, name).ok_or_else(|| {
        error(
            StatusCode::NOT_FOUND,
            format!("no job {namespace}/{name} here"),
        )
    })
}

async fn dashboard() -> Html<&'static str> {
    Html(DASHBOARD)
}

async fn metrics(State(served): State<Served>, Extension(caller): Extension<Caller>) -> Response {
    if let Err(denied) = access::authorize(&*served.access, &caller, &Action::GetMetrics).await {
        return denied.into_response();
    }
    let hub = &served.hub;
    let mut text = String::new();
    if prometheus_client::encoding::text::encode(&mut text, &hub.metrics.registry).is_err() {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

async fn openapi() -> axum::Json<serde_json::Value> {
    axum::Json(super::openapi::document())
}

/// The jobs `caller` may read (each asked about at once; the answers are cached).
async fn list_jobs(State(served): State<Served>, Extension(caller): Extension<Caller>) -> Response {
    let views: Vec<_> = served.hub.jobs().iter().filter_map(|j| j.view()).collect();
    let allowed = futures::future::join_all(views.iter().map(|v| {
        let action = Action::GetJob {
            namespace: v.namespace.clone(),
            name: v.name.clone(),
        };
        let (access, caller) = (&served.access, &caller);
        async move { access.allows(caller, &action).await }
    }))
    .await;
    let mut jobs = Vec::new();
    for (view, allowed) in views.iter().zip(allowed) {
        match allowed {
            Ok(true) => jobs.push(view.summary()),
            Ok(false) => {}
            Err(denied) => return denied.into_response(),
        }
    }
    axum::Json(jobs).into_response()
}

/// The job at `namespace/name`, if it exists and `caller` may read it. Whether it may is asked
/// first: a caller who may not learns nothing, not even whether it exists.
async fn readable(
    served: &Served,
    caller: &Caller,
    namespace: &str,
    name: &str,
) -> Result<Arc<JobHandle>, Response> {
    let action = Action::GetJob {
        namespace: namespace.to_string(),
        name: name.to_string(),
    };
    access::authorize(&*served.access, caller, &action)
        .await
        .map_err(IntoResponse::into_response)?;
    find(&served.hub, namespace, name).map_err(IntoResponse::into_response)
}

async fn get_job(
    State(served): State<Served>,
    Extension(caller): Extension<Caller>,
    Path((namespace, name)): Path<(String, String)>,
) -> Response {
    let job = match readable(&served, &caller, &namespace, &name).await {
        Ok(j) => j,
        Err(r) => return r,
    };
    // Serialized once per change, not per request: watchers poll this far more often than it
    // changes.
    match job.view_json() {
        Some(json) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
        None => error(StatusCode::SERVICE_UNAVAILABLE, "the job is starting").into_response(),
    }
}

#[derive(Deserialize)]
struct After {
    after: Option<u64>,
}

/// Without `after`: the current document (204 before there is one). With `after=V`: held until
/// a newer document appears (200) or for [`control::LONG_POLL_HOLD_SECONDS`] (204).
///
/// Served to a trainer of the job (a request signed with its key; the long-poll is not
/// sequenced, since a trainer's posts go on meanwhile, but its time must be fresh) or to an
/// observer who may read the job. The document is signed with the job key in
/// [`control::SIGNATURE_HEADER`]; trainers follow no other.
async fn get_topology(
    State(served): State<Served>,
    Path((namespace, name)): Path<(String, String)>,
    Query(q): Query<After>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let target = (namespace.as_str(), name.as_str(), "document");
    serve_topology(&served, target, (uri, headers), q.after, |job| {
        (job.topology(), |doc| doc.version)
    })
    .await
}

/// Member `id`'s own view, long-polled and signed as [`get_topology`] serves the document, or
/// streamed to it over the upgraded connection where it asks for [`view_stream::PROTOCOL`].
async fn get_view(
    State(served): State<Served>,
    Path((namespace, name, id)): Path<(String, String, u32)>,
    Query(q): Query<After>,
    request: Request,
) -> Response {
    let (mut parts, _) = request.into_parts();
    let target = (namespace.as_str(), name.as_str(), "view");
    if wants_view_stream(&parts.headers) {
        let Some(upgrade) = parts.extensions.remove::<hyper::upgrade::OnUpgrade>() else {
            return error(
                StatusCode::BAD_REQUEST,
                "this connection cannot be upgraded to a view stream",
            )
            .into_response();
        };
        return open_view_stream(&served, target, parts, (id, q.after), upgrade).await;
    }
    serve_topology(
        &served,
        target,
        (parts.uri, parts.headers),
        q.after,
        |job| (job.member_view(id), |view| view.version),
    )
    .await
}

/// Whether a view request asks to be upgraded to the view stream.
fn wants_view_stream(headers: &HeaderMap) -> bool {
    let has = |name, token: &str| {
        headers.get_all(name).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        })
    };
    has(header::CONNECTION, "upgrade") && has(header::UPGRADE, view_stream::PROTOCOL)
}

/// Answer a view stream's request: 101 once it is the job's trainer (or an observer who may
/// read the job), then the member's views on the upgraded connection until either side ends it.
async fn open_view_stream(
    served: &Served,
    (namespace, name, _): (&str, &str, &str),
    parts: axum::http::request::Parts,
    (id, after): (u32, Option<u64>),
    upgrade: hyper::upgrade::OnUpgrade,
) -> Response {
    let job = match topology_reader(served, namespace, name, &parts.uri, &parts.headers).await {
        Ok(job) => job,
        Err(r) => return r,
    };
    let stream = ViewStream {
        hub: served.hub.clone(),
        // Not the job's handle: a deleted job's views end, and its streams with them.
        key: job.key().to_vec(),
        target: (namespace.to_string(), name.to_string()),
        path: parts.uri.path().to_string(),
        views: job.member_view(id),
        quiet: Duration::from_secs(control::LONG_POLL_HOLD_SECONDS),
    };
    drop((job, parts));
    tokio::spawn(async move {
        if let Ok(upgraded) = upgrade.await {
            stream.run(TokioIo::new(upgraded), after).await;
        }
    });
    (
        StatusCode::SWITCHING_PROTOCOLS,
        [
            (header::CONNECTION, "upgrade"),
            (header::UPGRADE, view_stream::PROTOCOL),
        ],
    )
        .into_response()
}

/// One member's view stream: what it needs once its request is gone.
pub(super) struct ViewStream {
    pub(super) hub: Arc<Hub>,
    pub(super) key: Vec<u8>,
    /// The job's namespace and name.
    pub(super) target: (String, String),
    /// The view's path, which its frames' signatures cover.
    pub(super) path: String,
    pub(super) views: watch::Receiver<Option<Arc<MemberView>>>,
    /// How long the stream stays silent before it says it is alive.
    pub(super) quiet: Duration,
}

/// Refuse a trainer's request to a replica that does not lead: its views no longer change and
/// no reconcile reads its posts. The trainer tries again, and reaches the leader.
fn leading(hub: &Hub, endpoint: &'static str) -> Result<(), ApiError> {
    if hub.role() == Role::Leading {
        return Ok(());
    }
    hub.metrics.request(endpoint, "notLeading");
    Err(error(
        StatusCode::SERVICE_UNAVAILABLE,
        "this operator replica does not lead: try again (the Service sends you to the leader)",
    ))
}

/// What woke a view stream.
enum Woken {
    Changed,
    Quiet,
    Ended,
}

impl ViewStream {
    /// Write each view newer than `after` (every view where `after` is absent) as it appears,
    /// and [`view_stream::ALIVE`] after each `quiet` spell. Ends when the member's views end
    /// (the job is gone), the trainer sends anything or closes, or a write is not taken within
    /// `quiet`.
    pub(super) async fn run(
        mut self,
        mut io: impl AsyncRead + AsyncWrite + Unpin,
        mut after: Option<u64>,
    ) {
        let hold = self.quiet;
        let mut heard = [0u8; 16];
        let mut roles = self.hub.roles();
        loop {
            let newer = self
                .views
                .borrow_and_update()
                .as_ref()
                .filter(|view| after.is_none_or(|a| view.version > a))
                .cloned();
            if let Some(view) = newer {
                after = Some(view.version);
                let body = serde_json::to_vec(&*view).expect("a view serializes");
                let (namespace, name) = &self.target;
                self.hub.metrics.served(namespace, name, "view", body.len());
                let signature = control::topology_signature(&self.key, &self.path, &body);
                let frame = view_stream::frame(&signature, &body);
                if !matches!(
                    tokio::time::timeout(hold, io.write_all(&frame)).await,
                    Ok(Ok(()))
                ) {
                    return;
                }
            }
            let woken = tokio::select! {
                changed = self.views.changed() => match changed {
                    Ok(()) => Woken::Changed,
                    Err(_) => Woken::Ended,
                },
                _ = io.read(&mut heard) => Woken::Ended,
                // A replica that stops leading: the trainer opens its stream again, at the leader.
                _ = roles.wait_for(|r| *r != Role::Leading) => Woken::Ended,
                () = tokio::time::sleep(hold) => Woken::Quiet,
            };
            match woken {
                Woken::Changed => {}
                Woken::Ended => return,
                Woken::Quiet => {
                    let alive = tokio::time::timeout(hold, io.write_all(view_stream::ALIVE));
                    if !matches!(alive.await, Ok(Ok(()))) {
                        return;
                    }
                }
            }
        }
    }
}

/// Version-numbered values of a job's topology (`form`: the document, or a member's view),
/// shared by every reader, and how to tell their versions.
type Followed<T> = (watch::Receiver<Option<Arc<T>>>, fn(&T) -> u64);

/// A topology read: the job for a trainer or observer, then what `follow` picks from it,
/// long-polled past `after`, signed; its bytes counted by form.
async fn serve_topology<T: serde::Serialize>(
    served: &Served,
    (namespace, name, form): (&str, &str, &str),
    (uri, headers): (Uri, HeaderMap),
    after: Option<u64>,
    follow: impl FnOnce(&JobHandle) -> Followed<T>,
) -> Response {
    let job = match topology_reader(served, namespace, name, &uri, &headers).await {
        Ok(job) => job,
        Err(r) => return r,
    };
    // The request's URI and headers share the connection's read buffer: dropped before the
    // long wait, that buffer is free while every member's poll is held (8 KiB a member).
    let path = uri.path().to_string();
    drop((uri, headers));
    let (rx, version) = follow(&job);
    let answer = long_poll(rx, after, version).await;
    signed_answer(
        served,
        &job,
        (namespace, name, form),
        &path,
        answer.as_deref(),
    )
}

/// The job, if the request is a trainer's (signed with the job key, and fresh) or comes from
/// an observer who may read it.
async fn topology_reader(
    served: &Served,
    namespace: &str,
    name: &str,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<Arc<JobHandle>, Response> {
    if headers.contains_key(control::SIGNATURE_HEADER) {
        leading(&served.hub, "topology").map_err(IntoResponse::into_response)?;
        let job = find(&served.hub, namespace, name).map_err(IntoResponse::into_response)?;
        return match trainer_read(&job, uri.path(), headers) {
            Ok(()) => Ok(job),
            Err(r) => {
                served.hub.metrics.request("topology", r.outcome);
                Err(r.error.into_response())
            }
        };
    }
    let caller = served
        .access
        .authenticate(access::bearer_token(headers))
        .await
        .map_err(IntoResponse::into_response)?;
    readable(served, &caller, namespace, name).await
}

/// The current value (`after` absent), or the first whose version is above `after`, waiting at
/// most [`control::LONG_POLL_HOLD_SECONDS`]; `None` when there is nothing to send.
async fn long_poll<T>(
    mut rx: watch::Receiver<Option<Arc<T>>>,
    after: Option<u64>,
    version: impl Fn(&T) -> u64,
) -> Option<Arc<T>> {
    let hold = Duration::from_secs(control::LONG_POLL_HOLD_SECONDS);
    let deadline = tokio::time::Instant::now() + hold;
    loop {
        let current = rx.borrow_and_update().clone();
        match (current, after) {
            (Some(value), None) => return Some(value),
            (Some(value), Some(after)) if version(&*value) > after => return Some(value),
            (None, None) => return None,
            _ => {}
        }
        match tokio::time::timeout_at(deadline, rx.changed()).await {
            Ok(Ok(())) => continue,
            _ => return None,
        }
    }
}

/// `value` as JSON signed with the job key (its bytes counted by form), or 204.
fn signed_answer<T: serde::Serialize>(
    served: &Served,
    job: &JobHandle,
    (namespace, name, form): (&str, &str, &str),
    path: &str,
    value: Option<T>,
) -> Response {
    let Some(value) = value else {
        return StatusCode::NO_CONTENT.into_response();
    };
    let body = serde_json::to_vec(&value).expect("a topology serializes");
    served.hub.metrics.served(namespace, name, form, body.len());
    signed(job.key(), path, body)
}

/// A topology document or view as JSON, with its signature under the job key.
fn signed(key: &[u8], path: &str, body: Vec<u8>) -> Response {
    let signature = control::topology_signature(key, path, &body);
    (
        [
            (header::CONTENT_TYPE, "application/json".to_string()),
            (
                header::HeaderName::from_static(control::SIGNATURE_HEADER),
                signature,
            ),
        ],
        body,
    )
        .into_response()
}

#[derive(Deserialize)]
struct From {
    from: Option<usize>,
}

async fn get_events(
    State(served): State<Served>,
    Extension(caller): Extension<Caller>,
    Path((namespace, name)): Path<(String, String)>,
    Query(q): Query<From>,
) -> Response {
    match readable(&served, &caller, &namespace, &name).await {
        Ok(job) => with_next(job.events(q.from.unwrap_or(0))),
        Err(r) => r,
    }
}

async fn get_series(
    State(served): State<Served>,
    Extension(caller): Extension<Caller>,
    Path((namespace, name)): Path<(String, String)>,
    Query(q): Query<From>,
) -> Response {
    match readable(&served, &caller, &namespace, &name).await {
        Ok(job) => with_next(job.series(q.from.unwrap_or(0))),
        Err(r) => r,
    }
}

/// Where a reader of a bounded log asks from next time (the log drops its oldest entries).
pub const NEXT_HEADER: &str = "x-murmur-next";

/// A page of a bounded log as JSON, with the index to ask `from` next.
fn with_next<T: serde::Serialize>((items, next): (Vec<T>, usize)) -> Response {
    ([(NEXT_HEADER, next.to_string())], axum::Json(items)).into_response()
}

/// A refused trainer request: the answer, and the metric outcome it counts as.
struct Refusal {
    error: ApiError,
    outcome: &'static str,
}

fn refusal(code: StatusCode, outcome: &'static str, message: impl Into<String>) -> Refusal {
    Refusal {
        error: error(code, message),
        outcome,
    }
}

/// Unix milliseconds now, on the control plane's clock.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Check a trainer request's envelope and signature under the job key (`body` empty for a GET).
fn signed_by_trainer(
    job: &JobHandle,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Envelope, Refusal> {
    let header = |name: &str| headers.get(name)?.to_str().ok();
    control::check_request(job.key(), method.as_str(), path, header, body).map_err(|e| match e {
        control::RequestError::Envelope(_) => {
            refusal(StatusCode::BAD_REQUEST, "badEnvelope", e.to_string())
        }
        control::RequestError::Signature => {
            refusal(StatusCode::UNAUTHORIZED, "badSignature", e.to_string())
        }
    })
}

/// A trainer's topology read: signed by the job key, and fresh.
fn trainer_read(job: &JobHandle, path: &str, headers: &HeaderMap) -> Result<(), Refusal> {
    let envelope = signed_by_trainer(job, &Method::GET, path, headers, &[])?;
    super::replay::fresh(&envelope, now_ms())
        .map_err(|r| refusal(StatusCode::BAD_REQUEST, r.outcome(), r.to_string()))
}

/// Check a trainer's POST: the job exists, the request is signed with the job key, it parses,
/// it speaks for the member in its path, and it was not accepted before (nor a later one).
fn accept<T: TrainerPost>(
    hub: &Hub,
    (namespace, name, id): (String, String, u32),
    path: &str,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<(Arc<JobHandle>, T), ApiError> {
    let endpoint = T::ENDPOINT;
    leading(hub, endpoint)?;
    let job = find(hub, &namespace, &name)
        .inspect_err(|_| hub.metrics.request(endpoint, "unknownJob"))?;
    let envelope = signed_by_trainer(&job, &Method::POST, path, headers, body).map_err(|r| {
        hub.metrics.request(endpoint, r.outcome);
        r.error
    })?;
    let value: T = serde_json::from_slice(body).map_err(|e| {
        hub.metrics.request(endpoint, "badBody");
        error(StatusCode::BAD_REQUEST, format!("{endpoint} body: {e}"))
    })?;
    if value.member() != id {
        hub.metrics.request(endpoint, "badBody");
        return Err(error(
            StatusCode::BAD_REQUEST,
            format!(
                "{endpoint} body: memberId {} does not match member {id} in the path",
                value.member()
            ),
        ));
    }
    job.admit(id, &envelope, now_ms()).map_err(|refused| {
        hub.metrics.request(endpoint, refused.outcome());
        let code = match refused {
            super::replay::Refused::Stale { .. } => StatusCode::BAD_REQUEST,
            _ => StatusCode::CONFLICT,
        };
        error(code, format!("{endpoint}: {refused}"))
    })?;
    hub.metrics.request(endpoint, "accepted");
    Ok((job, value))
}

fn delivered(job: &JobHandle, message: Inbound) -> Response {
    if job.deliver(message) {
        StatusCode::NO_CONTENT.into_response()
    } else {
        error(StatusCode::GONE, "the job is no longer running").into_response()
    }
}

/// What trainers post: where it goes, whom it speaks for, and what the runtime receives.
trait TrainerPost: DeserializeOwned {
    /// The metric label of the endpoint.
    const ENDPOINT: &'static str;
    fn member(&self) -> u32;
    fn into_inbound(self) -> Inbound;
}

impl TrainerPost for JoinReport {
    const ENDPOINT: &'static str = "join";
    fn member(&self) -> u32 {
        self.member_id
    }
    fn into_inbound(self) -> Inbound {
        Inbound::Join(self)
    }
}

impl TrainerPost for TrainerStatus {
    const ENDPOINT: &'static str = "status";
    fn member(&self) -> u32 {
        self.member_id
    }
    fn into_inbound(self) -> Inbound {
        Inbound::Status(self)
    }
}

impl TrainerPost for PeerEvent {
    const ENDPOINT: &'static str = "peerEvents";
    fn member(&self) -> u32 {
        self.member_id
    }
    fn into_inbound(self) -> Inbound {
        Inbound::PeerEvent(self)
    }
}

async fn post_from_trainer<T: TrainerPost>(
    State(hub): State<Arc<Hub>>,
    Path(path): Path<(String, String, u32)>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut answer = match accept::<T>(&hub, path, uri.path(), &headers, &body) {
        Ok((job, message)) => delivered(&job, message.into_inbound()),
        Err(r) => r.into_response(),
    };
    // A trainer posts once in seconds: answered, its connection is closed rather than held idle
    // at hyper's buffers (16 to 24 KiB) for the 4 s a trainer's client keeps it.
    answer.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    answer
}
