//! Leader election on a `coordination.k8s.io/v1` Lease: one operator replica reconciles, the
//! others wait to take over. Writes use the Lease's resourceVersion, so two candidates can never
//! both believe they won.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use parking_lot::Mutex;
use tokio::time::Instant;

/// Another holder's lease counts as expired once its record has stood unchanged for its whole
/// duration on the candidate's own monotonic clock (`stood_for`), never by comparing the
/// record's timestamps with this machine's wall clock, which may be skewed (client-go does the
/// same). A released lease (no holder) is free at once.
pub fn next_lease(
    current: Option<&LeaseSpec>,
    me: &str,
    now: Timestamp,
    duration: Duration,
    stood_for: Duration,
) -> Option<LeaseSpec> {
    let seconds = duration.as_secs().max(1) as i32;
    let mine = |acquired: Option<MicroTime>, transitions: i32| LeaseSpec {
        holder_identity: Some(me.to_string()),
        lease_duration_seconds: Some(seconds),
        acquire_time: acquired.or(Some(MicroTime(now))),
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(transitions),
        ..Default::default()
    };
    let Some(c) = current else {
        return Some(mine(None, 0));
    };
    let transitions = c.lease_transitions.unwrap_or(0);
    match c.holder_identity.as_deref() {
        Some(holder) if holder == me => Some(mine(c.acquire_time.clone(), transitions)),
        None | Some("") => Some(mine(None, transitions + 1)),
        Some(_) => {
            let valid_for = c.lease_duration_seconds.unwrap_or(seconds).max(1) as u64;
            (stood_for >= Duration::from_secs(valid_for)).then(|| mine(None, transitions + 1))
        }
    }
}

/// The lease as its holder leaves it on shutdown: no holder, so the next candidate takes it at
/// once instead of waiting out the duration.
pub fn released(current: &LeaseSpec, now: Timestamp) -> LeaseSpec {
    LeaseSpec {
        holder_identity: None,
        lease_duration_seconds: Some(1),
        renew_time: Some(MicroTime(now)),
        ..current.clone()
    }
}

/// What a candidate last saw of the lease: its resourceVersion and since when (on the
/// candidate's monotonic clock) it has seen that version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub version: String,
    pub since: Duration,
}

/// The candidate's view after reading `version` at `now`: a record seen before keeps the time
/// it was first seen; a changed one starts over.
pub fn observe(seen: Option<&Seen>, version: &str, now: Duration) -> Seen {
    match seen {
        Some(s) if s.version == version => s.clone(),
        _ => Seen {
            version: version.to_string(),
            since: now,
        },
    }
}

/// Whether this replica may write: it leads, and renewed its lease less than the renew
/// deadline ago. The deadline is shorter than the lease, so a leader whose renewals stall stops
/// writing before any other replica can take over. Without election, a replica always leads.
#[derive(Debug)]
pub struct Leadership {
    renew_deadline: Option<Duration>,
    renewed: Mutex<Option<Instant>>,
}

impl Leadership {
    pub fn unelected() -> Self {
        Self {
            renew_deadline: None,
            renewed: Mutex::new(None),
        }
    }

    pub fn elected(renew_deadline: Duration) -> Self {
        Self {
            renew_deadline: Some(renew_deadline),
            renewed: Mutex::new(None),
        }
    }

    fn renewed_at(&self, at: Instant) {
        *self.renewed.lock() = Some(at);
    }

    pub fn may_write(&self) -> bool {
        match self.renew_deadline {
            None => true,
            Some(deadline) => self.renewed.lock().is_some_and(|t| t.elapsed() < deadline),
        }
    }
}

/// Timings as client-go's defaults relate them: renew deadline two thirds of the lease, a try
/// about every seventh of it (15 s, 10 s, 2 s).
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub duration: Duration,
    pub renew_deadline: Duration,
    pub retry: Duration,
}

impl Timing {
    pub fn of(duration: Duration) -> Self {
        Self {
            duration,
            renew_deadline: duration * 2 / 3,
            retry: duration / 7,
        }
    }
}

pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    timing: Timing,
    origin: Instant,
    seen: Mutex<Option<Seen>>,
    leadership: Arc<Leadership>,
}

impl Elector {
    pub fn new(api: Api<Lease>, name: &str, identity: &str, duration: Duration) -> Self {
        let timing = Timing::of(duration);
        Self {
            api,
            name: name.into(),
            identity: identity.into(),
            timing,
            origin: Instant::now(),
            seen: Mutex::new(None),
            leadership: Arc::new(Leadership::elected(timing.renew_deadline)),
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The fence every write of this replica checks.
    pub fn leadership(&self) -> Arc<Leadership> {
        self.leadership.clone()
    }

    /// Take or renew the lease once; false while someone else holds it or on a lost race.
    pub async fn try_hold(&self) -> Result<bool, kube::Error> {
        let asked = Instant::now();
        let current = self.api.get_opt(&self.name).await?;
        let spec = current.as_ref().and_then(|l| l.spec.as_ref());
        let version = current
            .as_ref()
            .and_then(|l| l.metadata.resource_version.clone())
            .unwrap_or_default();
        let now = asked.duration_since(self.origin);
        let seen = {
            let mut seen = self.seen.lock();
            let s = observe(seen.as_ref(), &version, now);
            *seen = Some(s.clone());
            s
        };
        let stood_for = now.saturating_sub(seen.since);
        let Some(next) = next_lease(
            spec,
            &self.identity,
            Timestamp::now(),
            self.timing.duration,
            stood_for,
        ) else {
            return Ok(false);
        };
        let result = match current {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..Default::default()
                    },
                    spec: Some(next),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            Some(existing) => {
                // Replace carries the resourceVersion we read: a concurrent writer makes it 409.
                let lease = Lease {
                    metadata: existing.metadata,
                    spec: Some(next),
                };
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
            }
        };
        match result {
            Ok(_) => {
                // Valid from when we asked, not from when the answer came.
                self.leadership.renewed_at(asked);
                Ok(true)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// One try, given up after `within`.
    async fn try_within(&self, within: Duration) -> Result<bool, String> {
        match tokio::time::timeout(within, self.try_hold()).await {
            Ok(result) => result.map_err(|e| e.to_string()),
            Err(_) => Err(format!("no answer within {within:?}")),
        }
    }

    /// Wait until this replica leads.
    pub async fn acquire(&self) {
        let mut said = false;
        loop {
            match self
                .try_within(self.timing.retry.max(Duration::from_secs(1)))
                .await
            {
                Ok(true) => return,
                Ok(false) if !said => {
                    said = true;
                    tracing::info!(lease = %self.name, "another replica leads; waiting");
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(lease = %self.name, error = %e, "cannot read the lease"),
            }
            tokio::time::sleep(self.timing.retry).await;
        }
    }

    /// Renew every retry period; returns when leadership is lost: taken by another replica, or
    /// not renewed within the renew deadline (each try is cut off at what is left of it).
    pub async fn keep(&self) {
        let mut last = Instant::now();
        loop {
            tokio::time::sleep(self.timing.retry).await;
            let left = self.timing.renew_deadline.saturating_sub(last.elapsed());
            if left.is_zero() {
                return;
            }
            match self.try_within(left).await {
                Ok(true) => last = Instant::now(),
                Ok(false) => return,
                Err(e) => tracing::warn!(lease = %self.name, error = %e, "cannot renew the lease"),
            }
            if last.elapsed() >= self.timing.renew_deadline {
                return;
            }
        }
    }

    /// Leave the lease free for the next replica (on shutdown), if this replica still holds it.
    pub async fn release(&self) {
        let result = async {
            let Some(current) = self.api.get_opt(&self.name).await? else {
                return Ok(false);
            };
            let Some(spec) = current.spec.as_ref() else {
                return Ok(false);
            };
            if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
                return Ok(false);
            }
            let lease = Lease {
                spec: Some(released(spec, Timestamp::now())),
                metadata: current.metadata,
            };
            self.api
                .replace(&self.name, &PostParams::default(), &lease)
                .await
                .map(|_| true)
        };
        match tokio::time::timeout(self.timing.retry, result).await {
            Ok(Ok(true)) => tracing::info!(lease = %self.name, "lease released"),
            Ok(Ok(false)) => {}
            Ok(Err(e)) => {
                tracing::warn!(lease = %self.name, error = %e, "cannot release the lease")
            }
            Err(_) => tracing::warn!(lease = %self.name, "cannot release the lease: no answer"),
        }
    }
}

/// The label the leading replica puts on its own pod. The chart's Service selects it, so
/// trainers and users reach the replica that runs the jobs, while every replica can be Ready.
pub const LEADER_LABEL: &str = "murmur.dev/operator-leader";

/// This replica's own pod, labelled while it leads.
#[derive(Clone)]
pub struct LeaderLabel {
    api: Api<Pod>,
    pod: String,
}

impl LeaderLabel {
    pub fn new(api: Api<Pod>, pod: &str) -> Self {
        Self {
            api,
            pod: pod.into(),
        }
    }

    pub fn pod(&self) -> &str {
        &self.pod
    }

    pub async fn set(&self, leading: bool) -> Result<(), kube::Error> {
        // A merge patch's null removes the label.
        let patch = serde_json::json!({
            "metadata": {"labels": {LEADER_LABEL: leading.then_some("true")}}
        });
        self.api
            .patch(&self.pod, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = Duration::from_secs(15);

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn a_free_lease_is_taken() {
        let l = next_lease(None, "a", at(100), D, secs(0)).unwrap();
        assert_eq!(l.holder_identity.as_deref(), Some("a"));
        assert_eq!(l.lease_duration_seconds, Some(15));
        assert_eq!(l.lease_transitions, Some(0));
    }

    #[test]
    fn the_holder_renews_and_keeps_its_acquire_time() {
        let l = next_lease(None, "a", at(100), D, secs(0)).unwrap();
        let renewed = next_lease(Some(&l), "a", at(110), D, secs(0)).unwrap();
        assert_eq!(renewed.acquire_time, Some(MicroTime(at(100))));
        assert_eq!(renewed.renew_time, Some(MicroTime(at(110))));
        assert_eq!(renewed.lease_transitions, Some(0));
    }

    #[test]
    fn another_holder_is_waited_out_on_the_candidates_own_clock() {
        let l = next_lease(None, "a", at(100), D, secs(0)).unwrap();
        assert_eq!(next_lease(Some(&l), "b", at(114), D, secs(14)), None);
        let taken = next_lease(Some(&l), "b", at(115), D, secs(15)).unwrap();
        assert_eq!(taken.holder_identity.as_deref(), Some("b"));
        assert_eq!(taken.lease_transitions, Some(1));
        assert_eq!(taken.acquire_time, Some(MicroTime(at(115))));
    }

    #[test]
    fn a_skewed_wall_clock_neither_steals_nor_blocks_a_lease() {
        let l = next_lease(None, "a", at(100), D, secs(0)).unwrap();
        // b's wall clock is an hour ahead: the record's renewTime looks long expired, but b
        // has seen it unchanged for only a second.
        assert_eq!(next_lease(Some(&l), "b", at(3700), D, secs(1)), None);
        // b's wall clock is an hour behind: the lease looks valid for an hour, but it has stood
        // unchanged for its whole duration.
        assert!(next_lease(Some(&l), "b", at(-3500), D, secs(15)).is_some());
    }

    #[test]
    fn a_released_lease_is_taken_at_once() {
        let l = next_lease(None, "a", at(100), D, secs(0)).unwrap();
        let free = released(&l, at(105));
        assert_eq!(free.holder_identity, None);
        let taken = next_lease(Some(&free), "b", at(105), D, secs(0)).unwrap();
        assert_eq!(taken.holder_identity.as_deref(), Some("b"));
        assert_eq!(taken.lease_transitions, Some(1));
    }

    #[test]
    fn a_record_seen_again_keeps_its_first_sighting() {
        let first = observe(None, "7", secs(3));
        assert_eq!(first.since, secs(3));
        assert_eq!(observe(Some(&first), "7", secs(9)).since, secs(3));
        assert_eq!(observe(Some(&first), "8", secs(9)).since, secs(9));
    }

    #[test]
    fn client_go_timings() {
        let t = Timing::of(D);
        assert_eq!(t.renew_deadline, secs(10));
        assert!(t.retry >= secs(2) && t.retry < secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_stops_writing_at_its_renew_deadline() {
        let unelected = Leadership::unelected();
        assert!(unelected.may_write());
        let l = Leadership::elected(secs(10));
        assert!(!l.may_write(), "never renewed: not leading");
        l.renewed_at(Instant::now());
        tokio::time::advance(secs(9)).await;
        assert!(l.may_write());
        tokio::time::advance(secs(1)).await;
        assert!(!l.may_write(), "renew deadline passed");
        l.renewed_at(Instant::now());
        assert!(l.may_write());
    }
}
