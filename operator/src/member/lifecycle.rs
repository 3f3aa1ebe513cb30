//! A member id's life, attempt after attempt, as one explicit state machine. The planner moves a
//! member only along the edges [`Lifecycle::allows`] lists (through [`MemberRecord::become_`]);
//! a property test drives random observations through the planner and checks every move.
//!
//! ```text
//!            create                 node seen            join report
//!   New ──────────────► Pending ─────────────► Scheduled ───────────► Joined
//!                        │  ▲ (PendingTooLong: reported)                │
//!                        │  └──────── join report (no node: processes) ─┤
//!                        │ fall back to on-demand                       │ job no longer needs it
//!                        ▼                                              ▼
//!     Ended(FellBack | Refused)     Pending/Scheduled/Joined ──► Retiring ──► Ended(Retired)
//!                                   Pending/Scheduled/Joined ──► Ended(Completed | Preempted | Failed)
//!   Ended(anything but Completed) ──── next attempt ────► Pending
//! ```

use serde::{Deserialize, Serialize};

/// How an attempt ended, as the planner settled it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum End {
    /// Reached the stopping target: this id is done for good.
    Completed,
    /// Spot reclaim, eviction, node loss: replaced, never counted as a failure.
    Preempted,
    /// Crashed: replaced after the backoff, counted against `recovery.maxRestarts`.
    Failed,
    /// Stopped because the job did not need it (finishing, suspended): counts as nothing.
    Retired,
    /// Stopped while waiting for a spot node: the next attempt runs on-demand.
    FellBack,
    /// The API server refused the attempt's pod (a quota, an admission policy): it never
    /// existed, counts as nothing, and the same attempt is created again after a backoff.
    Refused,
}

/// Where a member id's current attempt is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "is")]
pub enum Lifecycle {
    /// No attempt created yet.
    #[default]
    New,
    /// Created; neither on a node nor heard from. `reported`: `PendingTooLong` was said.
    Pending {
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        reported: bool,
    },
    /// Seen on a node (pods), no join report yet.
    Scheduled,
    /// Sent its join report.
    Joined,
    /// Asked to stop because the job no longer needs it; its end counts as nothing.
    Retiring,
    /// The attempt is over.
    Ended { how: End },
}

impl Lifecycle {
    pub const PENDING: Lifecycle = Lifecycle::Pending { reported: false };

    /// Every state, for exhaustive checks.
    pub const ALL: [Lifecycle; 12] = [
        Lifecycle::New,
        Lifecycle::Pending { reported: false },
        Lifecycle::Pending { reported: true },
        Lifecycle::Scheduled,
        Lifecycle::Joined,
        Lifecycle::Retiring,
        Lifecycle::Ended {
            how: End::Completed,
        },
        Lifecycle::Ended {
            how: End::Preempted,
        },
        Lifecycle::Ended { how: End::Failed },
        Lifecycle::Ended { how: End::Retired },
        Lifecycle::Ended { how: End::FellBack },
        Lifecycle::Ended { how: End::Refused },
    ];

    /// The attempt was created and its end is not settled yet.
    pub fn is_live(self) -> bool {
        matches!(
            self,
            Lifecycle::Pending { .. }
                | Lifecycle::Scheduled
                | Lifecycle::Joined
                | Lifecycle::Retiring
        )
    }

    /// Live and wanted: not being retired.
    pub fn is_active(self) -> bool {
        self.is_live() && self != Lifecycle::Retiring
    }

    /// Stopped by the planner itself (its end counts as nothing).
    pub fn is_retired(self) -> bool {
        matches!(
            self,
            Lifecycle::Retiring
                | Lifecycle::Ended {
                    how: End::Retired | End::FellBack
                }
        )
    }

    pub fn is_completed(self) -> bool {
        self == Lifecycle::Ended {
            how: End::Completed,
        }
    }

    /// One step of the state machine: the moves the planner may make.
    pub fn allows(self, next: Lifecycle) -> bool {
        use Lifecycle::*;
        match (self, next) {
            (New, Pending { reported: false }) => true,
            (Pending { reported: false }, Pending { reported: true }) => true,
            (Pending { .. }, Scheduled | Joined) => true,
            (Scheduled, Joined) => true,
            (Pending { .. } | Scheduled | Joined, Retiring) => true,
            (
                Pending { .. },
                Ended {
                    how: End::FellBack | End::Refused,
                },
            ) => true,
            (
                Pending { .. } | Scheduled | Joined,
                Ended {
                    how: End::Completed | End::Preempted | End::Failed,
                },
            ) => true,
            (Retiring, Ended { how: End::Retired }) => true,
            // A new attempt of the same id.
            (Ended { how }, Pending { reported: false }) => how != End::Completed,
            _ => false,
        }
    }

    /// Whether `next` can follow in any number of moves (one plan may make several).
    pub fn reaches(self, next: Lifecycle) -> bool {
        let mut seen = vec![self];
        let mut frontier = vec![self];
        while let Some(s) = frontier.pop() {
            for n in Lifecycle::ALL {
                if s.allows(n) && !seen.contains(&n) {
                    seen.push(n);
                    frontier.push(n);
                }
            }
        }
        seen.contains(&next)
    }
}

/// The control plane's memory of one member id.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MemberRecord {
    /// The newest attempt (0 for the first).
    #[serde(skip_serializing_if = "is_zero")]
    pub attempt: u32,
    pub lifecycle: Lifecycle,
    /// `attempt` runs without the spot requirement (an earlier one waited too long for a spot
    /// node). Only that attempt: replacements try spot first again.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub on_demand: bool,
    /// Crashes of this id (for the backoff).
    #[serde(skip_serializing_if = "is_zero")]
    pub crashes: u32,
    /// Crashes `recovery.failurePolicy` said not to count (for the backoff only).
    #[serde(skip_serializing_if = "is_zero")]
    pub ignored_crashes: u32,
    /// Past `recovery.maxRestartsPerMember`: this id is not started again.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub given_up: bool,
    /// Refusals of this attempt's pod in a row (for the backoff).
    #[serde(skip_serializing_if = "is_zero")]
    pub refusals: u32,
    /// No new attempt before this (crash or refusal backoff).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_before: Option<k8s_openapi::jiff::Timestamp>,
    /// The clique it was in when it left the topology: its next attempt asks for that clique's
    /// zone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clique: Option<u32>,
    /// The zone that clique trains in (zone-aware cliques): its next attempt asks for it by name,
    /// and a moved member that landed elsewhere anyway joins a clique of where it landed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// It was moved once to its clique's zone (never again: a move that lands in the same zone
    /// must not loop).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub relocated: bool,
    /// The attempt and kind of the start problem last reported ([`super::NotStarting::kind`]),
    /// so that a kubelet retrying says it once per attempt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_starting: Option<(u32, String)>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl MemberRecord {
    /// Move to `next`. A move the state machine does not allow is a planner bug: tests fail on
    /// it, and a release build keeps the current state rather than corrupt the record.
    pub fn become_(&mut self, next: Lifecycle) {
        if self.lifecycle.allows(next) {
            self.lifecycle = next;
        } else {
            debug_assert!(
                false,
                "member lifecycle: {:?} -> {next:?} is not allowed",
                self.lifecycle
            );
            tracing::error!(from = ?self.lifecycle, to = ?next, "planner bug: lifecycle move not allowed; ignored");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_but_completed_leads_back_to_a_new_attempt_and_completed_is_final() {
        for s in Lifecycle::ALL {
            let again = s.reaches(Lifecycle::PENDING);
            assert_eq!(
                again,
                s != Lifecycle::Ended {
                    how: End::Completed
                },
                "{s:?}"
            );
        }
        for s in Lifecycle::ALL {
            assert!(
                !Lifecycle::Ended {
                    how: End::Completed
                }
                .allows(s)
            );
            // Nothing returns to New.
            assert!(!s.allows(Lifecycle::New));
        }
        // A retiring member cannot be counted as anything but retired.
        assert!(!Lifecycle::Retiring.allows(Lifecycle::Ended {
            how: End::Preempted
        }));
        assert!(!Lifecycle::Retiring.allows(Lifecycle::Joined));
    }

    #[test]
    fn the_record_serializes_compactly() {
        let r = MemberRecord {
            attempt: 2,
            lifecycle: Lifecycle::Ended { how: End::FellBack },
            ..Default::default()
        };
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(
            text,
            r#"{"attempt":2,"lifecycle":{"is":"ended","how":"fellBack"}}"#
        );
        assert_eq!(serde_json::from_str::<MemberRecord>(&text).unwrap(), r);
        let pending = serde_json::to_string(&MemberRecord {
            lifecycle: Lifecycle::PENDING,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(pending, r#"{"lifecycle":{"is":"pending"}}"#);
    }
}
