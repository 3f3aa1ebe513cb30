//! The Kubernetes runtime (`murmur operator`): a kube-rs controller that reconciles each
//! DecentralizedTrainingJob into pods, a headless Service, the peer-key Secret and the topology
//! ConfigMap. `reconcile` gathers inputs from the watch caches, calls the pure [`decide`] (which
//! calls the same planner as `murmur run`) and hands the writes to the job's writer, which makes
//! them behind the reconciles; the same status router as `murmur run` serves the API, the
//! dashboard and the trainers' control endpoint.
//!
//! Where each concern lives:
//! - `error.rs`: the error a reconcile ends with (`Error`) and its kind.
//! - `context.rs`: the watch caches (`Stores`) and the per-job registry (`Context`).
//! - `cached_pod.rs`: a member's pod as the pod cache holds it (what the operator reads).
//! - `reconcile.rs`: one reconcile of one job, and the trainers' posts that ask for one.
//! - `writer.rs`: a job's writes behind its reconciles, in rounds, in the order that keeps its
//!   memory true.
//! - `writes.rs`: pod writes, applies, Kubernetes Events, and the retry of a failed reconcile.
//! - `process.rs`: the operator process (`run`, `run_with`) and its status router.
//! - `watch.rs`: the watches that fill the caches and wake reconciles, decoding jobs leniently.
//! - `labels.rs`: the label and annotation keys on the operator's objects and nodes.

pub mod access;
pub mod cached_pod;
mod context;
pub mod decide;
mod error;
mod events;
pub mod kueue;
pub mod labels;
pub mod lease;
mod metrics;
pub mod observe;
pub mod preflight;
mod process;
mod reconcile;
pub mod resources;
pub mod scheduling;
pub mod start_events;
pub mod template;
mod watch;
mod writer;
mod writes;

#[cfg(test)]
mod tests;

pub use context::{Context, Stores};
pub use decide::{Decision, Inputs, decide, memory_of};
pub use error::Error;
pub use metrics::OperatorMetrics;
pub use process::{LeaseOptions, OperatorError, OperatorOptions, PodName, run, run_with};
pub use reconcile::reconcile;
pub use resources::Settings;
pub use writes::{REPORTING_CONTROLLER, RETRY_FIRST, RETRY_MAX, error_policy};
