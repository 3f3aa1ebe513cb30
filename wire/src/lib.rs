//! The trainers' peer wire format, with no model or network stack attached: frame headers,
//! per-session authentication and message assembly ([`frame`], pure), reading and writing them
//! on any byte stream with the handshake ([`session`]), and the counters both keep ([`Stats`]).
//! The trainer's transport (`murmur_trainer::transport`) runs it over TCP; the `frame` fuzz
//! target (`fuzz/`) drives it through [`fuzzing`].
#![forbid(unsafe_code)]

pub mod frame;
#[doc(hidden)]
pub mod fuzzing;
pub mod session;

use std::sync::atomic::{AtomicU64, Ordering};

use frame::Reject;

/// A transport's byte and refusal counters (the trainer exports them as metrics).
#[derive(Default)]
pub struct Stats {
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    rejected: [AtomicU64; Reject::ALL.len()],
}

impl Stats {
    pub fn add_in(&self, n: usize) {
        self.bytes_in.fetch_add(n as u64, Ordering::Relaxed);
    }
    pub fn add_out(&self, n: usize) {
        self.bytes_out.fetch_add(n as u64, Ordering::Relaxed);
    }
    pub fn reject(&self, reason: Reject) {
        let i = Reject::ALL
            .iter()
            .position(|r| *r == reason)
            .expect("listed");
        self.rejected[i].fetch_add(1, Ordering::Relaxed);
    }
    pub fn bytes_in(&self) -> u64 {
        self.bytes_in.load(Ordering::Relaxed)
    }
    pub fn bytes_out(&self) -> u64 {
        self.bytes_out.load(Ordering::Relaxed)
    }
    /// Rejected frames by reason.
    pub fn rejected(&self) -> Vec<(Reject, u64)> {
        Reject::ALL
            .iter()
            .zip(&self.rejected)
            .map(|(r, n)| (*r, n.load(Ordering::Relaxed)))
            .collect()
    }
    pub fn rejected_total(&self) -> u64 {
        self.rejected
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .sum()
    }
}
