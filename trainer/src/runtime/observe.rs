//! What a trainer shows: `/healthz`, `/readyz`, `/metrics` (Prometheus text) and `/status` (the
//! contract's [`TrainerStatus`]), served by axum on the status address.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use murmur_core::contract::{DropReason, TrainerStatus};

use crate::transport::{Stats, Transport};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MetricLabel {
    metric: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

pub struct Metrics {
    steps: Counter,
    rounds: Counter,
    loss: Gauge<f64, AtomicU64>,
    accuracy: Gauge<f64, AtomicU64>,
    quality: Family<MetricLabel, Gauge<f64, AtomicU64>>,
    topology_version: Gauge,
    bytes_in: Counter,
    bytes_out: Counter,
    dropped_peers: Family<ReasonLabel, Counter>,
    rejected_frames: Family<ReasonLabel, Counter>,
    round_seconds: Histogram,
}

/// The trainer's state as the outside sees it; updated by the training loop, read by HTTP.
pub struct Observed {
    pub status: Mutex<TrainerStatus>,
    ready: AtomicBool,
    metrics: Metrics,
    registry: Registry,
    /// Transport counters already folded into the metrics (they only grow).
    folded: Mutex<(u64, u64, Vec<u64>)>,
}

impl Observed {
    pub fn new(initial: TrainerStatus) -> Arc<Self> {
        let metrics = Metrics {
            steps: Counter::default(),
            rounds: Counter::default(),
            loss: Gauge::default(),
            accuracy: Gauge::default(),
            quality: Family::default(),
            topology_version: Gauge::default(),
            bytes_in: Counter::default(),
            bytes_out: Counter::default(),
            dropped_peers: Family::default(),
            rejected_frames: Family::default(),
            // 1 ms to ~33 s.
            round_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
        };
        let mut registry = Registry::with_prefix("murmur_trainer");
        let m = &metrics;
        registry.register("steps", "Local training steps taken", m.steps.clone());
        registry.register("rounds", "Averaging rounds completed", m.rounds.clone());
        registry.register("loss", "Training loss of the last step", m.loss.clone());
        registry.register(
            "accuracy",
            "Test accuracy at the last evaluation",
            m.accuracy.clone(),
        );
        registry.register(
            "quality",
            "The task's test metric at the last evaluation, by name",
            m.quality.clone(),
        );
        registry.register(
            "topology_version",
            "Topology version followed",
            m.topology_version.clone(),
        );
        registry.register("bytes_in", "Bytes received from peers", m.bytes_in.clone());
        registry.register("bytes_out", "Bytes sent to peers", m.bytes_out.clone());
        registry.register(
            "dropped_peers",
            "Neighbours missing from a round, by reason",
            m.dropped_peers.clone(),
        );
        registry.register(
            "rejected_frames",
            "Frames refused, by reason",
            m.rejected_frames.clone(),
        );
        registry.register(
            "round_seconds",
            "Time the training loop waited for peers per averaging round (what overlap does not hide)",
            m.round_seconds.clone(),
        );
        Arc::new(Self {
            status: Mutex::new(initial),
            ready: AtomicBool::new(false),
            metrics,
            registry,
            folded: Mutex::new((0, 0, Vec::new())),
        })
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    pub fn update(&self, f: impl FnOnce(&mut TrainerStatus)) {
        let mut status = self.status.lock();
        f(&mut status);
        self.metrics
            .topology_version
            .set(status.topology_version as i64);
        if let Some(loss) = status.progress.loss {
            self.metrics.loss.set(loss);
        }
        if let Some(accuracy) = status.progress.accuracy {
            self.metrics.accuracy.set(accuracy);
        }
        if let Some(q) = status.progress.quality() {
            self.metrics
                .quality
                .get_or_create(&MetricLabel { metric: q.name })
                .set(q.value);
        }
    }

    pub fn snapshot(&self) -> TrainerStatus {
        self.status.lock().clone()
    }

    pub fn stepped(&self) {
        self.metrics.steps.inc();
    }

    pub fn round(&self, seconds: f64) {
        self.metrics.rounds.inc();
        self.metrics.round_seconds.observe(seconds);
    }

    pub fn dropped(&self, reason: DropReason) {
        self.metrics
            .dropped_peers
            .get_or_create(&ReasonLabel {
                reason: reason.as_str().to_string(),
            })
            .inc();
    }

    /// Fold the transport's counters into the metrics and the status.
    pub fn refresh(&self, stats: &Stats) {
        let mut folded = self.folded.lock();
        let (bytes_in, bytes_out) = (stats.bytes_in(), stats.bytes_out());
        self.metrics
            .bytes_in
            .inc_by(bytes_in.saturating_sub(folded.0));
        self.metrics
            .bytes_out
            .inc_by(bytes_out.saturating_sub(folded.1));
        let rejected = stats.rejected();
        folded.2.resize(rejected.len(), 0);
        for ((reason, n), seen) in rejected.iter().zip(folded.2.iter_mut()) {
            if *n > *seen {
                self.metrics
                    .rejected_frames
                    .get_or_create(&ReasonLabel {
                        reason: reason.as_str().to_string(),
                    })
                    .inc_by(*n - *seen);
                *seen = *n;
            }
        }
        *folded = (bytes_in, bytes_out, std::mem::take(&mut folded.2));
        drop(folded);
        self.update(|s| {
            s.bytes_in = bytes_in;
            s.bytes_out = bytes_out;
            s.rejected_frames = stats.rejected_total();
        });
    }

    fn encode_metrics(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String");
        text
    }
}

struct AppState {
    observed: Arc<Observed>,
    transport: Transport,
}

pub fn router(observed: Arc<Observed>, transport: Transport) -> Router {
    let state = Arc::new(AppState {
        observed,
        transport,
    });
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/status", get(status))
        .with_state(state)
}

async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    if state.observed.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: waiting for a topology and parameters\n",
        )
            .into_response()
    }
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    state.observed.refresh(state.transport.stats());
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.observed.encode_metrics(),
    )
        .into_response()
}

async fn status(State(state): State<Arc<AppState>>) -> Response {
    state.observed.refresh(state.transport.stats());
    axum::Json(state.observed.snapshot()).into_response()
}
