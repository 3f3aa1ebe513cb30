//! The control endpoint a trainer talks to: paths, request bodies and their signature. The local
//! runtime and the operator serve these paths; the trainer is their only client.
//!
//! Every request a trainer makes is signed with the per-job peer key: an HMAC-SHA256 over the
//! method, the path, an [`Envelope`] (attempt, sequence number, time) and the body. Nothing
//! outside the job can steer its topology or learn its members' addresses, and a captured post
//! sent again is refused: its sequence number is not above the last one heard (see
//! [`Envelope`]). The topology document the control plane answers with is signed with the same
//! key ([`topology_signature`]), and a trainer follows only a document that verifies.

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// The header holding the hex HMAC-SHA256 of a request body.
pub const SIGNATURE_HEADER: &str = "x-murmur-signature";

/// The header holding the member's attempt (decimal).
pub const ATTEMPT_HEADER: &str = "x-murmur-attempt";

/// The header holding the request's sequence number (decimal, increasing per member attempt).
pub const SEQUENCE_HEADER: &str = "x-murmur-sequence";

/// The header holding when the request was signed (Unix milliseconds).
pub const TIME_HEADER: &str = "x-murmur-time";

/// How far a signed request's time may be from the control plane's clock. Beyond it the request
/// is stale: it bounds how long a capture stays useful to someone replaying it to a control
/// plane that has forgotten the sequence numbers it heard (after a restart).
pub const MAX_CLOCK_SKEW_MS: u64 = 300_000;

/// How long the server may hold a topology long-poll before answering "no change" (204).
pub const LONG_POLL_HOLD_SECONDS: u64 = 25;

/// The control endpoint closes a connection that waits this long for a request (an idle HTTP
/// connection costs the server buffers; every trainer holds its view stream besides). Clients drop
/// their idle connections sooner, so no request meets a connection being closed.
pub const CONNECTION_IDLE_SECONDS: u64 = 5;

/// `/api/v1/namespaces/{ns}/jobs/{name}`
pub fn job_path(namespace: &str, job: &str) -> String {
    format!("/api/v1/namespaces/{namespace}/jobs/{job}")
}

/// Long-poll: `GET {topology_path}?after=V` answers 200 with a document newer than V, or 204
/// when none appeared within [`LONG_POLL_HOLD_SECONDS`].
pub fn topology_path(namespace: &str, job: &str) -> String {
    format!("{}/topology", job_path(namespace, job))
}

/// One member's [`MemberView`](super::MemberView): `GET {view_path}?after=V` is long-polled as
/// [`topology_path`] is, and a change that does not touch the member does not wake it; trainers
/// ask for it as a [`view_stream`](super::view_stream) instead, pushed on one held connection.
pub fn view_path(namespace: &str, job: &str, member: u32) -> String {
    format!("{}/members/{member}/topology", job_path(namespace, job))
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
    /// Mid-job, it never connected and dialing it fails (gone before we met, a stale address).
    Unreachable,
    /// It announced it was leaving (spot notice, done).
    Left,
    /// It follows another topology this round: another weight for our shared edge, or
    /// another version of the whole document.
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
            DropReason::Unreachable => "unreachable",
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

/// What a signed request says about itself besides its path and body, in three headers.
///
/// `sequence` increases with every request a member attempt signs; trainers start it at the
/// Unix time in microseconds, so a restarted process of the same attempt still counts up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Envelope {
    pub attempt: u32,
    pub sequence: u64,
    /// Unix milliseconds when it was signed.
    pub time_ms: u64,
}

/// A request whose envelope headers are missing or malformed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("header {header}: {reason}")]
pub struct EnvelopeError {
    pub header: &'static str,
    pub reason: &'static str,
}

impl Envelope {
    /// The headers that carry it.
    pub fn headers(&self) -> [(&'static str, String); 3] {
        [
            (ATTEMPT_HEADER, self.attempt.to_string()),
            (SEQUENCE_HEADER, self.sequence.to_string()),
            (TIME_HEADER, self.time_ms.to_string()),
        ]
    }

    /// Read it from a request's headers (`header` answers a header's value, if any).
    pub fn from_headers<'a>(
        header: impl Fn(&str) -> Option<&'a str>,
    ) -> Result<Self, EnvelopeError> {
        let number = |name: &'static str| -> Result<u64, EnvelopeError> {
            let value = header(name).ok_or(EnvelopeError {
                header: name,
                reason: "missing",
            })?;
            value.parse().map_err(|_| EnvelopeError {
                header: name,
                reason: "expected a non-negative integer",
            })
        };
        Ok(Self {
            attempt: u32::try_from(number(ATTEMPT_HEADER)?).map_err(|_| EnvelopeError {
                header: ATTEMPT_HEADER,
                reason: "expected at most 4294967295",
            })?,
            sequence: number(SEQUENCE_HEADER)?,
            time_ms: number(TIME_HEADER)?,
        })
    }
}

fn mac(key: &[u8]) -> Hmac<Sha256> {
    Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length")
}

/// What a request's signature covers: method, path (without the query) and envelope, one per
/// line, then the body. The path binds it to one job, member and endpoint.
fn request_mac(
    key: &[u8],
    method: &str,
    path: &str,
    envelope: &Envelope,
    body: &[u8],
) -> Hmac<Sha256> {
    let mut mac = mac(key);
    mac.update(
        format!(
            "{method} {path}\n{}\n{}\n{}\n",
            envelope.attempt, envelope.sequence, envelope.time_ms
        )
        .as_bytes(),
    );
    mac.update(body);
    mac
}

/// Hex HMAC-SHA256 of a trainer's request under the job key.
pub fn sign_request(
    key: &[u8],
    method: &str,
    path: &str,
    envelope: &Envelope,
    body: &[u8],
) -> String {
    hex::encode(
        request_mac(key, method, path, envelope, body)
            .finalize()
            .into_bytes(),
    )
}

/// Whether `signature` is [`sign_request`]'s for this request (compared in constant time).
pub fn verify_request(
    key: &[u8],
    method: &str,
    path: &str,
    envelope: &Envelope,
    body: &[u8],
    signature: &str,
) -> bool {
    hex::decode(signature).is_ok_and(|tag| {
        request_mac(key, method, path, envelope, body)
            .verify_slice(&tag)
            .is_ok()
    })
}

/// The headers that sign a trainer's request: its envelope and [`SIGNATURE_HEADER`].
pub fn signed_headers(
    key: &[u8],
    method: &str,
    path: &str,
    envelope: &Envelope,
    body: &[u8],
) -> [(&'static str, String); 4] {
    let [a, b, c] = envelope.headers();
    let signature = sign_request(key, method, path, envelope, body);
    [a, b, c, (SIGNATURE_HEADER, signature)]
}

/// Why a trainer's request is not taken as signed by its job.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error(transparent)]
    Envelope(#[from] EnvelopeError),
    #[error(
        "missing or wrong {SIGNATURE_HEADER} (hex HMAC-SHA256 under the job key of the method, \
         path, envelope and body)"
    )]
    Signature,
}

/// The envelope of a request signed with the job key (`header` answers a header's value).
pub fn check_request<'a>(
    key: &[u8],
    method: &str,
    path: &str,
    header: impl Fn(&str) -> Option<&'a str>,
    body: &[u8],
) -> Result<Envelope, RequestError> {
    let signature = header(SIGNATURE_HEADER).ok_or(RequestError::Signature)?;
    let envelope = Envelope::from_headers(&header)?;
    if !verify_request(key, method, path, &envelope, body, signature) {
        return Err(RequestError::Signature);
    }
    Ok(envelope)
}

/// What a topology answer's signature covers: a line no request can start with, the job's
/// topology path, then the document as sent.
fn topology_mac(key: &[u8], path: &str, body: &[u8]) -> Hmac<Sha256> {
    let mut mac = mac(key);
    mac.update(format!("TOPOLOGY {path}\n").as_bytes());
    mac.update(body);
    mac
}

/// Hex HMAC-SHA256 of a topology document served for the job at `path` (its
/// [`topology_path`]), sent in [`SIGNATURE_HEADER`].
pub fn topology_signature(key: &[u8], path: &str, body: &[u8]) -> String {
    hex::encode(topology_mac(key, path, body).finalize().into_bytes())
}

/// Whether a served topology document is the job's (compared in constant time).
pub fn verify_topology(key: &[u8], path: &str, body: &[u8], signature: &str) -> bool {
    hex::decode(signature).is_ok_and(|tag| topology_mac(key, path, body).verify_slice(&tag).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENVELOPE: Envelope = Envelope {
        attempt: 1,
        sequence: 7,
        time_ms: 1_700_000_000_000,
    };

    #[test]
    fn request_signatures_cover_key_method_path_envelope_and_body() {
        let (key, path, body) = (
            b"job key",
            "/api/v1/namespaces/ml/jobs/j/members/1/status",
            b"{}",
        );
        let sig = sign_request(key, "POST", path, &ENVELOPE, body);
        assert_eq!(sig.len(), 64);
        assert!(verify_request(key, "POST", path, &ENVELOPE, body, &sig));
        assert!(!verify_request(
            b"other key",
            "POST",
            path,
            &ENVELOPE,
            body,
            &sig
        ));
        assert!(!verify_request(key, "GET", path, &ENVELOPE, body, &sig));
        let other_member = "/api/v1/namespaces/ml/jobs/j/members/2/status";
        assert!(!verify_request(
            key,
            "POST",
            other_member,
            &ENVELOPE,
            body,
            &sig
        ));
        for changed in [
            Envelope {
                attempt: 2,
                ..ENVELOPE
            },
            Envelope {
                sequence: 8,
                ..ENVELOPE
            },
            Envelope {
                time_ms: 1,
                ..ENVELOPE
            },
        ] {
            assert!(!verify_request(key, "POST", path, &changed, body, &sig));
        }
        assert!(!verify_request(key, "POST", path, &ENVELOPE, b"{ }", &sig));
        assert!(!verify_request(
            key,
            "POST",
            path,
            &ENVELOPE,
            body,
            &sig[..63]
        ));
        assert!(!verify_request(key, "POST", path, &ENVELOPE, body, "zz"));
        assert!(!verify_request(key, "POST", path, &ENVELOPE, body, "é"));
    }

    #[test]
    fn a_request_with_signed_headers_checks_and_any_change_is_named() {
        let path = status_path("ml", "j", 1);
        let headers = signed_headers(b"k", "POST", &path, &ENVELOPE, b"{}");
        let lookup = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(
            check_request(b"k", "POST", &path, lookup, b"{}"),
            Ok(ENVELOPE)
        );
        assert_eq!(
            check_request(b"x", "POST", &path, lookup, b"{}"),
            Err(RequestError::Signature)
        );
        let unsigned = |name: &str| (name != SIGNATURE_HEADER).then(|| lookup(name)).flatten();
        assert_eq!(
            check_request(b"k", "POST", &path, unsigned, b"{}"),
            Err(RequestError::Signature)
        );
        let no_time = |name: &str| (name != TIME_HEADER).then(|| lookup(name)).flatten();
        assert!(matches!(
            check_request(b"k", "POST", &path, no_time, b"{}"),
            Err(RequestError::Envelope(EnvelopeError {
                header: TIME_HEADER,
                ..
            }))
        ));
    }

    #[test]
    fn a_topology_signature_is_no_request_signature() {
        let path = topology_path("ml", "j");
        let sig = topology_signature(b"k", &path, b"{}");
        assert!(verify_topology(b"k", &path, b"{}", &sig));
        assert!(!verify_topology(b"other", &path, b"{}", &sig));
        assert!(!verify_topology(
            b"k",
            &topology_path("ml", "other"),
            b"{}",
            &sig
        ));
        assert!(!verify_topology(b"k", &path, b"{ }", &sig));
        assert!(!verify_request(
            b"k", "TOPOLOGY", &path, &ENVELOPE, b"{}", &sig
        ));
    }

    #[test]
    fn envelopes_round_trip_through_headers_and_name_the_bad_one() {
        let headers = ENVELOPE.headers();
        let lookup = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(Envelope::from_headers(lookup), Ok(ENVELOPE));
        for (bad, value) in [
            (ATTEMPT_HEADER, Some("-1")),
            (SEQUENCE_HEADER, None),
            (TIME_HEADER, Some("soon")),
        ] {
            let lookup = |name: &str| {
                if name == bad { value } else { lookup(name) }
            };
            assert_eq!(Envelope::from_headers(lookup).unwrap_err().header, bad);
        }
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
