//! Which signed trainer posts to accept again: the pure rule behind the control endpoint's
//! `409`s and stale `400`s. A post is fresh when its time is within
//! [`control::MAX_CLOCK_SKEW_MS`] of the control plane's clock and its (attempt, sequence) is
//! above the last accepted from its member: a newer attempt starts over, an older one is refused.

use std::collections::BTreeMap;

use murmur_core::contract::control::{self, Envelope};

/// The newest (attempt, sequence) accepted per member of one job.
pub type Heard = BTreeMap<u32, (u32, u64)>;

/// Why a correctly signed post was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error(
        "stale: signed at {time_ms} ms, {skew_ms} ms from the control plane's clock (at most {} allowed)",
        control::MAX_CLOCK_SKEW_MS
    )]
    Stale { time_ms: u64, skew_ms: u64 },
    #[error(
        "replayed: member {member} attempt {attempt} is older than attempt {heard}, already heard"
    )]
    OlderAttempt {
        member: u32,
        attempt: u32,
        heard: u32,
    },
    #[error(
        "replayed or reordered: sequence {sequence} of member {member} attempt {attempt} is not above {last}, the last accepted"
    )]
    NotAbove {
        member: u32,
        attempt: u32,
        sequence: u64,
        last: u64,
    },
}

impl Refused {
    /// The metric outcome: `stale` (400) or `replayed` (409).
    pub fn outcome(&self) -> &'static str {
        match self {
            Refused::Stale { .. } => "stale",
            Refused::OlderAttempt { .. } | Refused::NotAbove { .. } => "replayed",
        }
    }
}

/// Whether a post's time is within the allowed skew of `now_ms`.
pub fn fresh(envelope: &Envelope, now_ms: u64) -> Result<(), Refused> {
    let skew_ms = envelope.time_ms.abs_diff(now_ms);
    if skew_ms > control::MAX_CLOCK_SKEW_MS {
        return Err(Refused::Stale {
            time_ms: envelope.time_ms,
            skew_ms,
        });
    }
    Ok(())
}

/// Accept `member`'s post at `now_ms` and remember it, or say why not (and remember nothing).
pub fn admit(
    heard: &mut Heard,
    member: u32,
    envelope: &Envelope,
    now_ms: u64,
) -> Result<(), Refused> {
    fresh(envelope, now_ms)?;
    let Envelope {
        attempt, sequence, ..
    } = *envelope;
    match heard.get(&member) {
        Some(&(last_attempt, _)) if attempt < last_attempt => {
            return Err(Refused::OlderAttempt {
                member,
                attempt,
                heard: last_attempt,
            });
        }
        Some(&(last_attempt, last)) if attempt == last_attempt && sequence <= last => {
            return Err(Refused::NotAbove {
                member,
                attempt,
                sequence,
                last,
            });
        }
        _ => {}
    }
    heard.insert(member, (attempt, sequence));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NOW: u64 = 1_800_000_000_000;

    fn at(attempt: u32, sequence: u64) -> Envelope {
        Envelope {
            attempt,
            sequence,
            time_ms: NOW,
        }
    }

    #[test]
    fn a_post_is_accepted_once_and_its_replay_refused() {
        let mut heard = Heard::new();
        assert_eq!(admit(&mut heard, 3, &at(0, 10), NOW), Ok(()));
        assert_eq!(
            admit(&mut heard, 3, &at(0, 10), NOW),
            Err(Refused::NotAbove {
                member: 3,
                attempt: 0,
                sequence: 10,
                last: 10
            })
        );
        // Another member's sequence is its own.
        assert_eq!(admit(&mut heard, 4, &at(0, 10), NOW), Ok(()));
    }

    #[test]
    fn a_newer_attempt_starts_over_and_the_older_is_refused() {
        let mut heard = Heard::new();
        admit(&mut heard, 1, &at(0, 500), NOW).unwrap();
        assert_eq!(admit(&mut heard, 1, &at(1, 5), NOW), Ok(()));
        let refused = admit(&mut heard, 1, &at(0, 501), NOW).unwrap_err();
        assert_eq!(refused.outcome(), "replayed");
        assert!(
            refused.to_string().contains("older than attempt 1"),
            "{refused}"
        );
    }

    #[test]
    fn a_post_signed_too_far_from_now_is_stale_either_way() {
        let mut heard = Heard::new();
        let skew = control::MAX_CLOCK_SKEW_MS;
        for time_ms in [NOW - skew - 1, NOW + skew + 1] {
            let envelope = Envelope {
                time_ms,
                ..at(0, 1)
            };
            let refused = admit(&mut heard, 1, &envelope, NOW).unwrap_err();
            assert_eq!(refused.outcome(), "stale");
        }
        assert!(heard.is_empty(), "a refused post is not remembered");
        for time_ms in [NOW - skew, NOW + skew] {
            let envelope = Envelope {
                time_ms,
                ..at(0, time_ms)
            };
            assert_eq!(admit(&mut heard, 1, &envelope, NOW), Ok(()));
        }
    }

    proptest! {
        /// Whatever arrives, what is accepted from a member increases strictly in (attempt,
        /// sequence), and nothing accepted is accepted again.
        #[test]
        fn accepted_posts_increase_and_never_repeat(
            posts in prop::collection::vec((0u32..3, 0u32..3, 0u64..20), 0..60)
        ) {
            let mut heard = Heard::new();
            let mut accepted: BTreeMap<u32, Vec<(u32, u64)>> = BTreeMap::new();
            for &(member, attempt, sequence) in &posts {
                if admit(&mut heard, member, &at(attempt, sequence), NOW).is_ok() {
                    accepted.entry(member).or_default().push((attempt, sequence));
                }
            }
            for list in accepted.values() {
                prop_assert!(list.windows(2).all(|w| w[0] < w[1]), "{list:?}");
            }
            for (&member, list) in &accepted {
                for &(attempt, sequence) in list {
                    prop_assert!(admit(&mut heard.clone(), member, &at(attempt, sequence), NOW).is_err());
                }
            }
        }
    }
}
