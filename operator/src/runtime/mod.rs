//! The job driver's two backends: `local` runs members as child processes (`murmur run`),
//! `kube` as pods (`murmur operator`). Each only creates, stops and observes members and
//! persists the driver's memory.

pub mod kube;
pub mod local;

/// A fresh per-job HMAC key (32 random bytes, hex): what trainers sign with.
pub fn new_job_key() -> String {
    use rand::Rng;
    let bytes: [u8; 32] = rand::rng().random();
    hex::encode(bytes)
}
