//! A member of a job: a stable id `0..replicas.target` (member `i` trains shard `i`). A member
//! lost is replaced under the same id by a new *attempt* (a process, a pod); the control plane
//! remembers each id's newest attempt and where it stands in its [`Lifecycle`].
//!
//! How an attempt's end is read, from the rawest word to the settled one:
//!
//! ```text
//!   the OS or the kubelet: an exit code or a signal     Termination
//!   + what else is known (termination message, …)   →   Ending   (raw)
//!   classify                                         →   Exit     (Completed | Preempted | Failed)
//!   the planner settles it in the lifecycle          →   End      (also Retired, FellBack, Refused)
//! ```
//!
//! | file        | holds                                                                   |
//! |-------------|-------------------------------------------------------------------------|
//! | `lifecycle` | [`End`], [`Lifecycle`] (the state machine), [`MemberRecord`] (memory)   |
//! | `observed`  | [`ObservedMember`] (what is seen of an attempt now), [`NotStarting`]    |
//! | `exit`      | [`Termination`], [`Ending`], [`classify`], [`Exit`]                     |
//! | `seen`      | [`seen()`]: what users see, its [`MemberPhase`] and [`Health`]          |
//!
//! [`MemberPhase`]: murmur_core::api::MemberPhase

pub mod exit;
pub mod lifecycle;
pub mod observed;
pub mod seen;

pub use exit::{Ending, Exit, Termination, classify};
pub use lifecycle::{End, Lifecycle, MemberRecord};
pub use observed::{NotStarting, ObservedMember};
pub use seen::{Health, seen};
