//! The status plane: the views a runtime publishes ([`view`]), where it publishes them ([`hub`]),
//! and the one axum router that serves them, the trainers' control endpoint and the dashboard
//! ([`router`]), with observer reads paced ([`pacer`]) and admitted by an [`access::Access`],
//! and trainers' posts admitted once ([`replay`]). `murmur run` serves it on loopback to its
//! local user; the operator serves the same router to whom the cluster allows.

pub mod access;
pub mod hub;
mod openapi;
pub mod pacer;
pub mod replay;
pub mod router;
pub mod view;

#[cfg(test)]
mod tests;

pub use hub::{Hub, Inbound, JobHandle, Role};
pub use router::router;
pub use view::{JobEvent, JobView, SeriesPoint};
