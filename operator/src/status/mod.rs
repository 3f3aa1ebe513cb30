//! The status plane: the views a runtime publishes ([`view`]), where it publishes them ([`hub`]),
//! and the one axum router that serves them, the trainers' control endpoint and the dashboard
//! ([`router`]), with observer reads paced ([`pacer`]). `murmur run` serves it on loopback; the
//! operator serves the same router.

pub mod hub;
mod openapi;
pub mod pacer;
pub mod router;
pub mod view;

#[cfg(test)]
mod tests;

pub use hub::{Hub, Inbound, JobHandle};
pub use router::router;
pub use view::{JobEvent, JobView, SeriesPoint};
