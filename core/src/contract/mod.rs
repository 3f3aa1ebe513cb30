//! The contract between the control plane (operator, `murmur run`) and the data plane (trainers).
//! Defined once here; both sides serialize exactly these types.

pub mod control;
pub mod document;
pub mod env;
pub mod reports;
pub mod view;
pub mod view_stream;

pub use control::{DropReason, PeerEvent};
pub use document::{DocumentEdge, DocumentError, DocumentMember, TopologyDocument};
pub use env::{EnvError, TrainerEnv};
pub use reports::{
    JoinReport, TERMINATION_LOG, TerminationMessage, TerminationOutcome, TrainerState,
    TrainerStatus,
};
pub use view::{MemberView, ViewBook, ViewNeighbour};
