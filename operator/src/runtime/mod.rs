//! Runtimes execute the planner's actions: `local` with child processes (`murmur run`); `kube`
//! with pods (`murmur operator`).

pub mod kube;
pub mod local;

/// A fresh per-job HMAC key (32 random bytes, hex): what trainers sign with.
pub fn new_job_key() -> String {
    use rand::Rng;
    let bytes: [u8; 32] = rand::rng().random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
