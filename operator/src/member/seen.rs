//! What users see of a member: its phase (the job's `status.members`, the status API) and its
//! health (the dashboard's colours), derived from its lifecycle first.

use murmur_core::api::MemberPhase;
use murmur_core::contract::TrainerState;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{End, Exit, Lifecycle, ObservedMember};

/// A member at a glance, for the dashboard's colours.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum Health {
    /// Training, and heard from its neighbours in its last round.
    Healthy,
    /// Live but not averaging: starting, joining, paused, or its last round heard no one.
    Degraded,
    /// Gone (preempted, crashed or retired) and not yet replaced.
    Down,
    /// Reached the stopping target.
    Done,
}

/// The phase and health of member `m` in `lifecycle`. An attempt the planner settled or is
/// retiring reads its lifecycle, whatever its trainer last said; a live one reads an exit the
/// planner has not settled yet (a finished job settles none), then its trainer's last state.
/// `in_topology`: the topology holds it; `alone`: it has no neighbours there.
pub fn seen(
    lifecycle: Lifecycle,
    m: &ObservedMember,
    in_topology: bool,
    alone: bool,
) -> (MemberPhase, Health) {
    match lifecycle {
        Lifecycle::Ended { how } => match how {
            End::Completed => (MemberPhase::Done, Health::Done),
            End::Preempted => (MemberPhase::Preempted, Health::Down),
            End::Failed => (MemberPhase::Failed, Health::Down),
            // Stopped as not needed, though a trainer that reached the target first is done.
            End::Retired | End::FellBack => match m.exit {
                Some(Exit::Completed) => (MemberPhase::Done, Health::Done),
                _ => (MemberPhase::Retired, Health::Down),
            },
            // Its pod never existed; the same attempt is created again after a backoff.
            End::Refused => (MemberPhase::Pending, Health::Degraded),
        },
        Lifecycle::Retiring => (MemberPhase::Leaving, Health::Degraded),
        Lifecycle::New | Lifecycle::Pending { .. } | Lifecycle::Scheduled | Lifecycle::Joined => {
            live(m, in_topology, alone)
        }
    }
}

fn live(m: &ObservedMember, in_topology: bool, alone: bool) -> (MemberPhase, Health) {
    let status = m.status.as_ref();
    match (&m.exit, status.map(|s| s.state)) {
        (Some(Exit::Completed), _) => (MemberPhase::Done, Health::Done),
        (Some(Exit::Preempted { .. }), _) => (MemberPhase::Preempted, Health::Down),
        (Some(Exit::Failed { .. }), _) => (MemberPhase::Failed, Health::Down),
        (None, None) if m.join.is_some() => (MemberPhase::Joining, Health::Degraded),
        (None, None) => (MemberPhase::Pending, Health::Degraded),
        (None, Some(TrainerState::Joining)) => (MemberPhase::Joining, Health::Degraded),
        (None, Some(TrainerState::Paused)) => (MemberPhase::Paused, Health::Degraded),
        (None, Some(TrainerState::Leaving)) => (MemberPhase::Leaving, Health::Degraded),
        (None, Some(TrainerState::Done)) => (MemberPhase::Done, Health::Done),
        (None, Some(TrainerState::Training)) => {
            let heard = status.is_some_and(|s| !s.neighbours_seen.is_empty());
            let health = if in_topology && (heard || alone) {
                Health::Healthy
            } else {
                Health::Degraded
            };
            (MemberPhase::Training, health)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use murmur_core::contract::{JoinReport, TrainerStatus};

    use super::*;

    const STATES: [Option<TrainerState>; 6] = [
        None,
        Some(TrainerState::Joining),
        Some(TrainerState::Training),
        Some(TrainerState::Paused),
        Some(TrainerState::Leaving),
        Some(TrainerState::Done),
    ];

    fn exits() -> [Option<Exit>; 4] {
        [
            None,
            Some(Exit::Completed),
            Some(Exit::Preempted {
                reason: "SIGTERM sent by murmur; left the job cleanly".into(),
            }),
            Some(Exit::Failed {
                reason: "exited with code 1".into(),
                code: Some(1),
                conditions: Vec::new(),
            }),
        ]
    }

    /// A member whose trainer last said `state` (having heard `neighbours`), joined or not.
    fn member(
        state: Option<TrainerState>,
        neighbours: Vec<u32>,
        joined: bool,
        exit: Option<Exit>,
    ) -> ObservedMember {
        ObservedMember {
            join: joined.then(|| {
                Arc::new(JoinReport {
                    member_id: 0,
                    label_histogram: vec![1; 10],
                    proxy_vector: None,
                })
            }),
            status: state.map(|s| {
                Arc::new(TrainerStatus {
                    neighbours_seen: neighbours,
                    ..TrainerStatus::new(0, s)
                })
            }),
            exit,
            ..Default::default()
        }
    }

    /// Whether the planner has settled nothing of the attempt yet (no wildcard: a new state
    /// must be placed here).
    fn unsettled(l: Lifecycle) -> bool {
        match l {
            Lifecycle::New
            | Lifecycle::Pending { .. }
            | Lifecycle::Scheduled
            | Lifecycle::Joined => true,
            Lifecycle::Retiring | Lifecycle::Ended { .. } => false,
        }
    }

    #[test]
    fn an_ended_or_retiring_member_reads_its_lifecycle_whatever_was_seen_of_it() {
        for lifecycle in Lifecycle::ALL {
            if unsettled(lifecycle) {
                continue;
            }
            for state in STATES {
                for exit in exits() {
                    let expected = match lifecycle {
                        Lifecycle::Ended { how } => match how {
                            End::Completed => (MemberPhase::Done, Health::Done),
                            End::Preempted => (MemberPhase::Preempted, Health::Down),
                            End::Failed => (MemberPhase::Failed, Health::Down),
                            // Retired, but its trainer reached the target before it stopped.
                            End::Retired | End::FellBack if exit == Some(Exit::Completed) => {
                                (MemberPhase::Done, Health::Done)
                            }
                            End::Retired | End::FellBack => (MemberPhase::Retired, Health::Down),
                            End::Refused => (MemberPhase::Pending, Health::Degraded),
                        },
                        Lifecycle::Retiring => (MemberPhase::Leaving, Health::Degraded),
                        _ => unreachable!("{lifecycle:?} is unsettled"),
                    };
                    for joined in [false, true] {
                        let m = member(state, vec![1], joined, exit.clone());
                        for (in_topology, alone) in [(true, false), (true, true), (false, false)] {
                            assert_eq!(
                                seen(lifecycle, &m, in_topology, alone),
                                expected,
                                "{lifecycle:?}, trainer {state:?}, exit {exit:?}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_live_member_reads_an_unsettled_exit_first_then_its_trainer() {
        let live: Vec<Lifecycle> = Lifecycle::ALL
            .into_iter()
            .filter(|&l| unsettled(l))
            .collect();
        assert_eq!(live.len(), 5, "New, Pending (twice), Scheduled, Joined");
        for lifecycle in live {
            let of =
                |m: &ObservedMember, in_topology, alone| seen(lifecycle, m, in_topology, alone);
            for state in STATES {
                let [_, completed, preempted, failed] = exits();
                let ended = |exit| of(&member(state, vec![1], true, exit), true, false);
                assert_eq!(ended(completed), (MemberPhase::Done, Health::Done));
                assert_eq!(ended(preempted), (MemberPhase::Preempted, Health::Down));
                assert_eq!(ended(failed), (MemberPhase::Failed, Health::Down));
            }
            let said = |state, joined| of(&member(Some(state), vec![1], joined, None), true, false);
            let nothing = |joined| of(&member(None, vec![], joined, None), true, false);
            assert_eq!(nothing(false), (MemberPhase::Pending, Health::Degraded));
            assert_eq!(nothing(true), (MemberPhase::Joining, Health::Degraded));
            assert_eq!(
                said(TrainerState::Joining, true),
                (MemberPhase::Joining, Health::Degraded)
            );
            assert_eq!(
                said(TrainerState::Paused, true),
                (MemberPhase::Paused, Health::Degraded)
            );
            assert_eq!(
                said(TrainerState::Leaving, true),
                (MemberPhase::Leaving, Health::Degraded)
            );
            assert_eq!(
                said(TrainerState::Done, true),
                (MemberPhase::Done, Health::Done)
            );
            // Training is healthy in the topology, having heard a neighbour or having none.
            let training = |neighbours, in_topology, alone| {
                of(
                    &member(Some(TrainerState::Training), neighbours, true, None),
                    in_topology,
                    alone,
                )
            };
            let healthy = (MemberPhase::Training, Health::Healthy);
            let degraded = (MemberPhase::Training, Health::Degraded);
            assert_eq!(training(vec![1], true, false), healthy);
            assert_eq!(training(vec![], true, true), healthy);
            assert_eq!(training(vec![], true, false), degraded);
            assert_eq!(training(vec![1], false, false), degraded);
        }
    }
}
