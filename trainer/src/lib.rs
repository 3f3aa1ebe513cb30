//! murmur-trainer: the data plane. Everything here is shared by the in-process simulator and the
//! networked trainer. To train a model of your own, implement [`task::Task`] and call
//! [`run_task`] from your `main`.
// Two calls need `unsafe` (the allocator's thresholds, loading the CUDA driver); each is allowed
// where it stands.
#![deny(unsafe_code)]

pub mod algorithms;
pub mod backend;
pub mod cli;
pub mod compression;
pub mod data;
pub mod model;
pub mod runtime;
pub mod simulator;
pub mod task;
pub mod transport;

pub use cli::run_task;
