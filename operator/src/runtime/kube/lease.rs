//! Leader election on a `coordination.k8s.io/v1` Lease: one operator replica reconciles, the
//! others wait to take over. Writes use the Lease's resourceVersion, so two candidates can never
//! both believe they won.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};

/// The Lease to write when `me` may hold it now, or None while another holder's lease is valid.
pub fn next_lease(
    current: Option<&LeaseSpec>,
    me: &str,
    now: Timestamp,
    duration: Duration,
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
            let renewed = c
                .renew_time
                .as_ref()
                .or(c.acquire_time.as_ref())
                .map_or(Timestamp::UNIX_EPOCH, |t| t.0);
            let valid_for = i64::from(c.lease_duration_seconds.unwrap_or(seconds));
            let expires = renewed.as_second().saturating_add(valid_for);
            (now.as_second() >= expires).then(|| mine(None, transitions + 1))
        }
    }
}

pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
}

impl Elector {
    pub fn new(api: Api<Lease>, name: &str, identity: &str, duration: Duration) -> Self {
        Self {
            api,
            name: name.into(),
            identity: identity.into(),
            duration,
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Take or renew the lease once; false while someone else holds it or on a lost race.
    pub async fn try_hold(&self) -> Result<bool, kube::Error> {
        let current = self.api.get_opt(&self.name).await?;
        let spec = current.as_ref().and_then(|l| l.spec.as_ref());
        let Some(next) = next_lease(spec, &self.identity, Timestamp::now(), self.duration) else {
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
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Wait until this replica leads.
    pub async fn acquire(&self) {
        let retry = self.duration / 3;
        loop {
            match self.try_hold().await {
                Ok(true) => return,
                Ok(false) => tracing::info!(lease = %self.name, "another replica leads; waiting"),
                Err(e) => tracing::warn!(lease = %self.name, error = %e, "cannot read the lease"),
            }
            tokio::time::sleep(retry).await;
        }
    }

    /// Renew every third of the lease; returns when leadership is lost (not renewed for a whole
    /// lease duration, or taken by another replica).
    pub async fn keep(&self) {
        let every = self.duration / 3;
        let mut last = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(every).await;
            match self.try_hold().await {
                Ok(true) => last = tokio::time::Instant::now(),
                Ok(false) => return,
                Err(e) => tracing::warn!(lease = %self.name, error = %e, "cannot renew the lease"),
            }
            if last.elapsed() >= self.duration {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = Duration::from_secs(15);

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    #[test]
    fn a_free_lease_is_taken() {
        let l = next_lease(None, "a", at(100), D).unwrap();
        assert_eq!(l.holder_identity.as_deref(), Some("a"));
        assert_eq!(l.lease_duration_seconds, Some(15));
        assert_eq!(l.lease_transitions, Some(0));
    }

    #[test]
    fn the_holder_renews_and_keeps_its_acquire_time() {
        let l = next_lease(None, "a", at(100), D).unwrap();
        let renewed = next_lease(Some(&l), "a", at(110), D).unwrap();
        assert_eq!(renewed.acquire_time, Some(MicroTime(at(100))));
        assert_eq!(renewed.renew_time, Some(MicroTime(at(110))));
        assert_eq!(renewed.lease_transitions, Some(0));
    }

    #[test]
    fn another_holder_is_waited_out_then_replaced() {
        let l = next_lease(None, "a", at(100), D).unwrap();
        assert_eq!(next_lease(Some(&l), "b", at(114), D), None);
        let taken = next_lease(Some(&l), "b", at(115), D).unwrap();
        assert_eq!(taken.holder_identity.as_deref(), Some("b"));
        assert_eq!(taken.lease_transitions, Some(1));
        assert_eq!(taken.acquire_time, Some(MicroTime(at(115))));
    }
}
