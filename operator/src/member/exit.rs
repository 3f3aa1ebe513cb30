//! How a member's trainer ended, in the planner's terms — reaching the target, preemption (never
//! a failure) or a crash — decided once for both runtimes: a process `murmur run` reaped, or a
//! container whose pod the operator reads. Both read the trainer's termination message first
//! (`MURMUR_TERMINATION_LOG`), so a member that completed is never taken for one that left on a
//! spot notice, however its last status post raced its exit.

use murmur_core::contract::{TerminationMessage, TerminationOutcome, TrainerState};
use serde::{Deserialize, Serialize};

use super::End;

/// How a member's process or pod ended, classified ([`classify`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Exit {
    /// It reached the stopping target.
    Completed,
    /// Spot reclaim, eviction, node loss, or a spot notice it honoured. Never a failure.
    Preempted { reason: String },
    /// It crashed: counted as `recovery.failurePolicy` says (by default against the member's
    /// and the job's restart budgets). `code`: the trainer's exit code, if it exited with one;
    /// `conditions`: its pod's conditions (type, status), where pods run it.
    Failed {
        reason: String,
        code: Option<i32>,
        conditions: Vec<(String, String)>,
    },
}

impl Exit {
    /// The end the planner settles an attempt with that ended so, unless it was retiring.
    pub fn end(&self) -> End {
        match self {
            Exit::Completed => End::Completed,
            Exit::Preempted { .. } => End::Preempted,
            Exit::Failed { .. } => End::Failed,
        }
    }
}

/// What the OS (or the kubelet) says: an exit code, or the signal that ended the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Termination {
    Code(i32),
    Signal(i32),
}

impl From<std::process::ExitStatus> for Termination {
    fn from(status: std::process::ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(code), _) => Termination::Code(code),
            (None, Some(signal)) => Termination::Signal(signal),
            (None, None) => Termination::Code(-1),
        }
    }
}

/// Everything known about one ended trainer, unclassified.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Ending {
    pub ended: Option<Termination>,
    /// What the trainer wrote to its termination log, if anything (parse it with [`said`]).
    pub said: Option<TerminationMessage>,
    /// The newest state it reported (for a trainer too old to write a termination message).
    pub last: Option<TrainerState>,
    /// It was stopped from outside, and why: the pod's `DisruptionTarget` condition, a node
    /// that gave up on it, a signal murmur itself sent. A preemption whatever the exit.
    pub cause: Option<String>,
    /// The runtime's word for a crash (the container's `OOMKilled`, `Error`).
    pub detail: Option<String>,
    /// The pod's conditions (type, status), where a pod ran it.
    pub conditions: Vec<(String, String)>,
}

/// The trainer's termination message (`{"outcome": "done", "step": 400}`), if `text` is one.
pub fn said(text: &str) -> Option<TerminationMessage> {
    serde_json::from_str::<TerminationMessage>(text.trim()).ok()
}

pub fn signal_name(signal: i32) -> String {
    use nix::sys::signal::Signal;
    match Signal::try_from(signal) {
        Ok(s) => s.as_str().to_string(),
        Err(_) => format!("signal {signal}"),
    }
}

/// Why the trainer said it failed, if it did.
fn failure(e: &Ending) -> Option<&str> {
    e.said
        .as_ref()
        .filter(|m| m.outcome == TerminationOutcome::Failed)?
        .message
        .as_deref()
}

/// Classify an ended trainer.
pub fn classify(e: &Ending) -> Exit {
    use nix::sys::signal::Signal::{SIGHUP, SIGINT, SIGKILL, SIGTERM};
    let preempted = |fallback: &str| Exit::Preempted {
        reason: e.cause.clone().unwrap_or_else(|| fallback.to_string()),
    };
    match e.ended.unwrap_or(Termination::Code(-1)) {
        Termination::Code(0) => match (e.said.as_ref().map(|m| m.outcome), e.last) {
            (Some(TerminationOutcome::Done), _) | (None, Some(TrainerState::Done)) => {
                Exit::Completed
            }
            (Some(TerminationOutcome::Left), _) => {
                preempted("left the job on a stop signal (a spot notice)")
            }
            (None | Some(TerminationOutcome::Failed), _) => {
                preempted("exited before the stopping target (a spot notice)")
            }
        },
        _ if e.cause.is_some() => preempted(""),
        // Stopped from outside without a chance to leave: the local picture of node loss.
        Termination::Signal(s)
            if [SIGKILL, SIGTERM, SIGINT, SIGHUP]
                .iter()
                .any(|&sig| sig as i32 == s) =>
        {
            Exit::Preempted {
                reason: format!("{} from outside murmur (node loss)", signal_name(s)),
            }
        }
        Termination::Signal(s) => Exit::Failed {
            reason: format!("crashed with {}", signal_name(s)),
            code: None,
            conditions: e.conditions.clone(),
        },
        Termination::Code(code) => Exit::Failed {
            reason: match (failure(e), &e.detail) {
                (Some(why), _) => format!("exited with code {code}: {why}"),
                (None, Some(detail)) => format!("exit code {code} ({detail})"),
                (None, None) => format!("exited with code {code}"),
            },
            code: Some(code),
            conditions: e.conditions.clone(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::signal::Signal::{SIGKILL, SIGSEGV, SIGTERM};

    fn ended(
        ended: Termination,
        said: Option<TerminationOutcome>,
        last: Option<TrainerState>,
    ) -> Ending {
        Ending {
            ended: Some(ended),
            said: said.map(|outcome| TerminationMessage {
                outcome,
                step: 0,
                message: None,
            }),
            last,
            ..Default::default()
        }
    }

    fn by_murmur(mut e: Ending, signal: nix::sys::signal::Signal) -> Ending {
        e.cause = Some(format!("{} sent by murmur", signal_name(signal as i32)));
        e
    }

    #[test]
    fn only_a_trainer_that_said_or_reported_done_completed() {
        assert_eq!(
            classify(&ended(Termination::Code(0), None, Some(TrainerState::Done))),
            Exit::Completed
        );
        // The termination message wins over a last status that lagged behind.
        assert_eq!(
            classify(&ended(
                Termination::Code(0),
                Some(TerminationOutcome::Done),
                Some(TrainerState::Training)
            )),
            Exit::Completed
        );
        assert!(matches!(
            classify(&by_murmur(ended(Termination::Code(0), Some(TerminationOutcome::Left), Some(TrainerState::Leaving)), SIGTERM)),
            Exit::Preempted { reason } if reason.contains("SIGTERM sent by murmur")
        ));
        assert!(matches!(
            classify(&ended(Termination::Code(0), None, Some(TrainerState::Training))),
            Exit::Preempted { reason } if reason.contains("spot notice")
        ));
        assert!(matches!(
            classify(&ended(Termination::Code(0), Some(TerminationOutcome::Left), None)),
            Exit::Preempted { reason } if reason.contains("spot notice")
        ));
    }

    #[test]
    fn kills_are_preemptions_and_crashes_are_failures() {
        assert!(matches!(
            classify(&by_murmur(ended(Termination::Signal(SIGKILL as i32), None, None), SIGKILL)),
            Exit::Preempted { reason } if reason.contains("SIGKILL sent by murmur")
        ));
        assert!(matches!(
            classify(&ended(Termination::Signal(SIGKILL as i32), None, Some(TrainerState::Training))),
            Exit::Preempted { reason } if reason.contains("node loss")
        ));
        assert!(matches!(
            classify(&ended(Termination::Signal(SIGSEGV as i32), None, Some(TrainerState::Training))),
            Exit::Failed { reason, .. } if reason == "crashed with SIGSEGV"
        ));
        assert!(matches!(
            classify(&ended(Termination::Code(2), None, None)),
            Exit::Failed { reason, .. } if reason == "exited with code 2"
        ));
        let oom = Ending {
            detail: Some("OOMKilled".into()),
            ..ended(Termination::Code(137), None, None)
        };
        assert!(
            matches!(classify(&oom), Exit::Failed { reason, .. } if reason == "exit code 137 (OOMKilled)")
        );
        // Exit code 0 after reporting done is success even if murmur had signalled it.
        assert_eq!(
            classify(&by_murmur(
                ended(Termination::Code(0), None, Some(TrainerState::Done)),
                SIGTERM
            )),
            Exit::Completed
        );
        // A disrupted pod is preempted whatever its exit code.
        let disrupted = Ending {
            cause: Some("EvictionByEvictionAPI".into()),
            ..ended(Termination::Code(143), None, None)
        };
        assert_eq!(
            classify(&disrupted),
            Exit::Preempted {
                reason: "EvictionByEvictionAPI".into()
            }
        );
    }

    #[test]
    fn each_exit_settles_as_its_end() {
        assert_eq!(Exit::Completed.end(), End::Completed);
        let preempted = Exit::Preempted {
            reason: "spot".into(),
        };
        assert_eq!(preempted.end(), End::Preempted);
        let failed = Exit::Failed {
            reason: "exited with code 1".into(),
            code: Some(1),
            conditions: Vec::new(),
        };
        assert_eq!(failed.end(), End::Failed);
    }

    #[test]
    fn a_trainer_that_says_why_it_failed_is_failed_for_that_reason() {
        let text = r#"{"outcome":"failed","step":0,"message":"/data/mnist: cannot read train-images-idx3-ubyte: No such file or directory"}"#;
        let e = Ending {
            ended: Some(Termination::Code(2)),
            said: said(text),
            detail: Some("Error".into()),
            ..Default::default()
        };
        assert_eq!(
            classify(&e),
            Exit::Failed {
                reason: "exited with code 2: /data/mnist: cannot read train-images-idx3-ubyte: No such file or directory".into(),
                code: Some(2),
                conditions: Vec::new(),
            }
        );
    }

    #[test]
    fn a_termination_message_is_read_leniently_and_anything_else_says_nothing() {
        assert_eq!(
            said("{\"outcome\":\"done\",\"step\":400}\n").map(|m| m.outcome),
            Some(TerminationOutcome::Done)
        );
        assert_eq!(said("panicked at ..."), None);
        assert_eq!(said(""), None);
    }
}
