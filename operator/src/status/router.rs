//! The status router: the JSON API, the trainers' control endpoint, `/metrics`, probes and the
//! dashboard. `murmur run` serves it locally and the operator in a cluster.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Router, middleware};
use murmur_core::contract::{JoinReport, PeerEvent, TrainerStatus, control};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::hub::{Hub, Inbound, JobHandle};
use super::pacer::{Pacer, paced};

const DASHBOARD: &str = include_str!("dashboard.html");

/// The router over `hub`. Observer reads are paced to `reads_per_second` (0: unpaced, see
/// [`pacer`](super::pacer)); the probes and the trainers' control traffic never are.
pub fn router(hub: Arc<Hub>, reads_per_second: u32) -> Router {
    let job = "/api/v1/namespaces/{namespace}/jobs/{name}";
    let mut observers = Router::new()
        .route("/", get(dashboard))
        .route("/metrics", get(metrics))
        .route("/api/v1/openapi.json", get(openapi))
        .route("/api/v1/jobs", get(list_jobs))
        .route(job, get(get_job))
        .route(&format!("{job}/events"), get(get_events))
        .route(&format!("{job}/series"), get(get_series));
    if let Some(pacer) = Pacer::new(reads_per_second) {
        observers = observers.route_layer(middleware::from_fn_with_state(Arc::new(pacer), paced));
    }
    let control = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        // Trainers long-poll their topology here (the dashboard reads it too).
        .route(&format!("{job}/topology"), get(get_topology))
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
    observers.merge(control).with_state(hub)
}

/// An error answer: `{"error": "..."}` with a status code.
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, axum::Json(serde_json::json!({"error": self.1}))).into_response()
    }
}

async fn readyz(State(hub): State<Arc<Hub>>) -> Response {
    if hub.is_standby() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "standby: not leading, or the caches are still listing\n",
        )
            .into_response()
    } else {
        "ok".into_response()
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

async fn metrics(State(hub): State<Arc<Hub>>) -> Response {
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

async fn list_jobs(State(hub): State<Arc<Hub>>) -> Response {
    let jobs: Vec<_> = hub
        .jobs()
        .iter()
        .filter_map(|j| j.view())
        .map(|v| v.summary())
        .collect();
    axum::Json(jobs).into_response()
}

async fn get_job(
    State(hub): State<Arc<Hub>>,
    Path((namespace, name)): Path<(String, String)>,
) -> Response {
    let job = match find(&hub, &namespace, &name) {
        Ok(j) => j,
        Err(r) => return r.into_response(),
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
async fn get_topology(
    State(hub): State<Arc<Hub>>,
    Path((namespace, name)): Path<(String, String)>,
    Query(q): Query<After>,
) -> Response {
    let job = match find(&hub, &namespace, &name) {
        Ok(j) => j,
        Err(r) => return r.into_response(),
    };
    let mut rx = job.topology();
    let hold = Duration::from_secs(control::LONG_POLL_HOLD_SECONDS);
    let deadline = tokio::time::Instant::now() + hold;
    loop {
        let current = rx.borrow_and_update().clone();
        match (current, q.after) {
            (Some(doc), None) => return axum::Json(doc).into_response(),
            (Some(doc), Some(after)) if doc.version > after => {
                return axum::Json(doc).into_response();
            }
            (None, None) => return StatusCode::NO_CONTENT.into_response(),
            _ => {}
        }
        match tokio::time::timeout_at(deadline, rx.changed()).await {
            Ok(Ok(())) => continue,
            _ => return StatusCode::NO_CONTENT.into_response(),
        }
    }
}

#[derive(Deserialize)]
struct From {
    from: Option<usize>,
}

async fn get_events(
    State(hub): State<Arc<Hub>>,
    Path((namespace, name)): Path<(String, String)>,
    Query(q): Query<From>,
) -> Response {
    match find(&hub, &namespace, &name) {
        Ok(job) => axum::Json(job.events(q.from.unwrap_or(0))).into_response(),
        Err(r) => r.into_response(),
    }
}

async fn get_series(
    State(hub): State<Arc<Hub>>,
    Path((namespace, name)): Path<(String, String)>,
    Query(q): Query<From>,
) -> Response {
    match find(&hub, &namespace, &name) {
        Ok(job) => axum::Json(job.series(q.from.unwrap_or(0))).into_response(),
        Err(r) => r.into_response(),
    }
}

/// Check a trainer's POST: the job exists, the body is signed with the job key, it parses, and
/// it speaks for the member in its path.
fn accept<T: TrainerPost>(
    hub: &Hub,
    (namespace, name, id): (String, String, u32),
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<(Arc<JobHandle>, T), ApiError> {
    let endpoint = T::ENDPOINT;
    let job = find(hub, &namespace, &name)
        .inspect_err(|_| hub.metrics.request(endpoint, "unknownJob"))?;
    let signed = headers
        .get(control::SIGNATURE_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|sig| control::verify(job.key(), body, sig));
    if !signed {
        hub.metrics.request(endpoint, "badSignature");
        return Err(error(
            StatusCode::UNAUTHORIZED,
            format!(
                "missing or wrong {} (hex HMAC-SHA256 of the body under the job key)",
                control::SIGNATURE_HEADER
            ),
        ));
    }
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
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match accept::<T>(&hub, path, &headers, &body) {
        Ok((job, message)) => delivered(&job, message.into_inbound()),
        Err(r) => r.into_response(),
    }
}
