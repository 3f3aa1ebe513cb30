//! How a local trainer process ended, in the planner's terms: reaching the target, preemption
//! (never a failure), or a crash.

use murmur_core::contract::TrainerState;

use crate::planner::Exit;

/// What the OS told us: an exit code, or the signal that ended the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    Code(i32),
    Signal(i32),
}

impl From<std::process::ExitStatus> for Ended {
    fn from(status: std::process::ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(code), _) => Ended::Code(code),
            (None, Some(signal)) => Ended::Signal(signal),
            (None, None) => Ended::Code(-1),
        }
    }
}

pub fn signal_name(signal: i32) -> String {
    match signal {
        libc::SIGKILL => "SIGKILL".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGINT => "SIGINT".into(),
        libc::SIGHUP => "SIGHUP".into(),
        libc::SIGSEGV => "SIGSEGV".into(),
        libc::SIGABRT => "SIGABRT".into(),
        other => format!("signal {other}"),
    }
}

/// Classify an ended process. `last_state` is the newest state it reported; `sent` is the
/// signal murmur itself sent it (chaos, or stopping the job), if any.
pub fn classify(ended: Ended, last_state: Option<TrainerState>, sent: Option<i32>) -> Exit {
    let by_us = |s: i32| format!("{} sent by murmur", signal_name(s));
    match ended {
        Ended::Code(0) if last_state == Some(TrainerState::Done) => Exit::Completed,
        // A clean exit before the target: it honoured a spot notice and left the job.
        Ended::Code(0) => Exit::Preempted {
            reason: match sent {
                Some(s) => format!("{}; left the job cleanly", by_us(s)),
                None => "left the job before the target (spot notice)".into(),
            },
        },
        Ended::Signal(s) if sent == Some(s) => Exit::Preempted { reason: by_us(s) },
        // Stopped from outside without a chance to leave: the local picture of node loss.
        Ended::Signal(s @ (libc::SIGKILL | libc::SIGTERM | libc::SIGINT | libc::SIGHUP)) => {
            Exit::Preempted {
                reason: format!("{} from outside murmur (node loss)", signal_name(s)),
            }
        }
        Ended::Signal(s) => Exit::Failed {
            reason: format!("crashed with {}", signal_name(s)),
        },
        Ended::Code(code) => Exit::Failed {
            reason: format!("exited with code {code}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_trainer_that_reported_done_completed() {
        assert_eq!(
            classify(Ended::Code(0), Some(TrainerState::Done), None),
            Exit::Completed
        );
        assert!(matches!(
            classify(Ended::Code(0), Some(TrainerState::Leaving), Some(libc::SIGTERM)),
            Exit::Preempted { reason } if reason.contains("SIGTERM sent by murmur")
        ));
        assert!(matches!(
            classify(Ended::Code(0), Some(TrainerState::Training), None),
            Exit::Preempted { reason } if reason.contains("spot notice")
        ));
    }

    #[test]
    fn kills_are_preemptions_and_crashes_are_failures() {
        assert!(matches!(
            classify(Ended::Signal(libc::SIGKILL), None, Some(libc::SIGKILL)),
            Exit::Preempted { reason } if reason.contains("SIGKILL sent by murmur")
        ));
        assert!(matches!(
            classify(Ended::Signal(libc::SIGKILL), Some(TrainerState::Training), None),
            Exit::Preempted { reason } if reason.contains("node loss")
        ));
        assert!(matches!(
            classify(Ended::Signal(libc::SIGSEGV), Some(TrainerState::Training), None),
            Exit::Failed { reason } if reason == "crashed with SIGSEGV"
        ));
        assert!(matches!(
            classify(Ended::Code(2), None, None),
            Exit::Failed { reason } if reason == "exited with code 2"
        ));
        // Exit code 0 after reporting done is success even if murmur had signalled it.
        assert_eq!(
            classify(
                Ended::Code(0),
                Some(TrainerState::Done),
                Some(libc::SIGTERM)
            ),
            Exit::Completed
        );
    }
}
