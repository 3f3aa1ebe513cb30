//! Observer reads (the JSON API, the dashboard, `/metrics`) are paced to a rate, so that however
//! many people, dashboards and scrapers watch a job, serving them cannot take more than a bounded
//! share of the CPU that training (`murmur run`) or the control loop (the operator) needs.
//! The trainers' control traffic and the probes are never paced.
//!
//! A request reserves the next free slot, first come first served, and waits for it: a client
//! that loops on the API is slowed to the rate instead of spinning, so its own CPU use falls as
//! well. A request whose slot is more than [`MAX_WAIT`] away is refused with 429 and
//! `Retry-After` rather than queued without bound. (Token buckets such as `governor` answer
//! "not yet" without reserving, so waiting requests would race for each slot instead of
//! queueing; the reservation is the point here.)

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::time::Instant;

/// The longest a paced request waits for its slot before it is refused.
pub const MAX_WAIT: Duration = Duration::from_secs(1);

/// Observer reads served per second by default (`--status-reads-per-second`).
pub const DEFAULT_READS_PER_SECOND: u32 = 200;

pub struct Pacer {
    interval: Duration,
    /// The first slot not yet reserved.
    next: Mutex<Option<Instant>>,
}

impl Pacer {
    /// A pacer serving `per_second` requests a second; `None` for 0 (unpaced).
    pub fn new(per_second: u32) -> Option<Self> {
        (per_second > 0).then(|| Self {
            interval: Duration::from_secs(1) / per_second,
            next: Mutex::new(None),
        })
    }

    /// Reserve a slot for a request arriving at `now`: when it may be served, or `None` when
    /// that is more than [`MAX_WAIT`] away (nothing is reserved then).
    pub fn reserve(&self, now: Instant) -> Option<Instant> {
        let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
        let slot = next.map_or(now, |n| n.max(now));
        if slot - now > MAX_WAIT {
            return None;
        }
        *next = Some(slot + self.interval);
        Some(slot)
    }
}

/// The axum middleware: wait for a slot, or answer 429.
pub async fn paced(State(pacer): State<Arc<Pacer>>, request: Request, next: Next) -> Response {
    match pacer.reserve(Instant::now()) {
        Some(slot) => {
            tokio::time::sleep_until(slot).await;
            next.run(request).await
        }
        None => (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, MAX_WAIT.as_secs().to_string())],
            axum::Json(serde_json::json!({
                "error": "too many status reads at once: the status API is paced so that watching a job cannot slow it; retry later"
            })),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_means_unpaced() {
        assert!(Pacer::new(0).is_none());
    }

    #[test]
    fn an_idle_pacer_serves_at_once() {
        let p = Pacer::new(10).unwrap();
        let t = Instant::now();
        assert_eq!(p.reserve(t), Some(t));
        // Long after the last slot: at once again, with no credit saved up.
        let later = t + Duration::from_secs(5);
        assert_eq!(p.reserve(later), Some(later));
        assert_eq!(p.reserve(later), Some(later + Duration::from_millis(100)));
    }

    #[test]
    fn a_burst_is_spread_one_interval_apart_in_arrival_order() {
        let p = Pacer::new(100).unwrap();
        let t = Instant::now();
        let slots: Vec<_> = (0..50).map(|_| p.reserve(t).unwrap()).collect();
        for (i, slot) in slots.iter().enumerate() {
            assert_eq!(*slot, t + Duration::from_millis(10) * i as u32);
        }
    }

    #[test]
    fn a_request_that_would_wait_past_max_wait_is_refused_and_reserves_nothing() {
        let p = Pacer::new(10).unwrap();
        let t = Instant::now();
        // 10 per second: slots at t, t+0.1 … t+1.0 are within MAX_WAIT, the 12th is not.
        let served = (0..20).take_while(|_| p.reserve(t).is_some()).count();
        assert_eq!(served, 11);
        assert_eq!(p.reserve(t), None);
        // A refusal took no slot: once time moves on, the next free slot is the one after t+1.0.
        let later = t + Duration::from_millis(150);
        assert_eq!(p.reserve(later), Some(t + Duration::from_millis(1100)));
    }
}
