//! The control endpoint a trainer talks to: paths, request bodies and their signature. The local
//! runtime and the operator serve these paths; the trainer is their only client.
//!
//! Reads (the topology long-poll) are open like the rest of the status API. Writes (join reports,
//! trainer status, peer events) carry an HMAC-SHA256 of the body keyed by the per-job peer key,
//! so nothing outside the job can steer its topology.

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// The header holding the hex HMAC-SHA256 of a request body.
pub const SIGNATURE_HEADER: &str = "x-murmur-signature";

/// How long the server may hold a topology long-poll before answering "no change" (204).
pub const LONG_POLL_HOLD_SECONDS: u64 = 25;

/// `/api/v1/namespaces/{ns}/jobs/{name}`
pub fn job_path(namespace: &str, job: &str) -> String {
    format!("/api/v1/namespaces/{namespace}/jobs/{job}")
}

/// Long-poll: `GET {topology_path}?after=V` answers 200 with a document newer than V, or 204
/// when none appeared within [`LONG_POLL_HOLD_SECONDS`].
pub fn topology_path(namespace: &str, job: &str) -> String {
    format!("{}/topology", job_path(namespace, job))
}

/// `POST` a [`JoinReport`](super::JoinReport), once on start.
pub fn join_path(namespace: &str, job: &str, member: u32) -> String {
    format!("{}/members/{member}/join", job_path(namespace, job))
}

/// `POST` a [`TrainerStatus`](super::TrainerStatus) when the trainer's state changes.
pub fn status_path(namespace: &str, job: &str, member: u32) -> String {
    format!("{}/members/{member}/status", job_path(namespace, job))
}

/// `POST` a [`PeerEvent`] when a neighbour is dropped from a round.
pub fn peer_events_path(namespace: &str, job: &str, member: u32) -> String {
    format!("{}/members/{member}/peer-events", job_path(namespace, job))
}

/// Why a neighbour's contribution was missing from a round.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum DropReason {
    /// It sent nothing within the round timeout.
    Timeout,
    /// Its connection closed (process gone, node lost).
    Disconnected,
    /// It announced it was leaving (spot notice, done).
    Left,
    /// It follows another topology version this round.
    VersionMismatch,
    /// It did not count us among its peers this round (another version, another group).
    Skipped,
    /// It is joining: it asked for our state and has not trained a round yet.
    Joining,
    /// Its payload did not decode.
    Undecodable,
}

impl DropReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::Timeout => "timeout",
            DropReason::Disconnected => "disconnected",
            DropReason::Left => "left",
            DropReason::VersionMismatch => "versionMismatch",
            DropReason::Skipped => "skipped",
            DropReason::Joining => "joining",
            DropReason::Undecodable => "undecodable",
        }
    }
}

/// A trainer tells the control plane that `peer` was missing from one of its rounds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PeerEvent {
    pub member_id: u32,
    pub peer: u32,
    pub round: u64,
    pub reason: DropReason,
    pub topology_version: u64,
}

/// Hex HMAC-SHA256 of `body` under the job key.
pub fn sign(key: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

/// Whether `signature` is the hex HMAC of `body` (compared in constant time).
pub fn verify(key: &[u8], body: &[u8], signature: &str) -> bool {
    let Ok(tag) = hex::decode(signature) else {
        return false;
    };
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(body);
    mac.verify_slice(&tag).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_verify_only_with_the_same_key_and_body() {
        let sig = sign(b"job key", b"{\"memberId\":1}");
        assert_eq!(sig.len(), 64);
        assert!(verify(b"job key", b"{\"memberId\":1}", &sig));
        assert!(!verify(b"job key", b"{\"memberId\":2}", &sig));
        assert!(!verify(b"other key", b"{\"memberId\":1}", &sig));
        assert!(!verify(b"job key", b"{\"memberId\":1}", &sig[..63]));
        assert!(!verify(b"job key", b"{\"memberId\":1}", "zz"));
        assert!(!verify(b"job key", b"{\"memberId\":1}", "é"));
    }

    #[test]
    fn paths_nest_under_the_job() {
        assert_eq!(
            topology_path("ml", "mnist"),
            "/api/v1/namespaces/ml/jobs/mnist/topology"
        );
        assert_eq!(
            join_path("ml", "mnist", 3),
            "/api/v1/namespaces/ml/jobs/mnist/members/3/join"
        );
    }
}
