//! What a run starts from and how it ends: its setup and options, the peer key and job spec it
//! reads, its errors and outcome, and the allocator settings of the process.

use std::path::Path;
use std::time::Duration;

use murmur_core::api::DecentralizedTrainingJobSpec;
use murmur_core::contract::TrainerEnv;

use super::CheckpointError;
use crate::algorithms::MemberError;
use crate::data::DataError;

#[derive(Clone, Debug)]
pub struct RunOptions {
    /// SIGTERM to exit: finish the step, leave, checkpoint. GKE gives 30 s; we aim inside it.
    pub grace_period: Duration,
    /// Evaluate on the test split every this many steps (and at the end).
    pub eval_every: u64,
    /// How long a starting member waits for its neighbours before training without them.
    pub startup_timeout: Duration,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            grace_period: Duration::from_secs(20),
            eval_every: 25,
            startup_timeout: Duration::from_secs(30),
        }
    }
}

/// Everything a trainer process starts from.
pub struct RunSetup {
    pub env: TrainerEnv,
    pub spec: DecentralizedTrainingJobSpec,
    /// The per-job key (from the peer-key file). Never logged.
    pub key: Vec<u8>,
    pub options: RunOptions,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{file}: cannot read the peer key: {source}")]
    KeyFile {
        file: String,
        source: std::io::Error,
    },
    #[error("{file}: the peer key is empty")]
    EmptyKey { file: String },
    #[error("job spec: {0}")]
    Spec(String),
    #[error("no topology source: set MURMUR_TOPOLOGY_FILE or MURMUR_CONTROL_ENDPOINT")]
    NoTopologySource,
    #[error("cannot listen on {address}: {source}")]
    Bind {
        address: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Data(#[from] DataError),
    #[error(transparent)]
    Member(#[from] MemberError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("{file}: cannot write the final model: {message}")]
    FinalModel { file: String, message: String },
}

/// Keep freed large buffers in the heap instead of returning them to the kernel. A trainer
/// allocates model-sized buffers every round (received payloads, decoded parameters, averages);
/// with glibc's defaults each is a fresh mmap whose pages fault in one by one, which cost more
/// than the network copy itself (measured by benches/peer_exchange.rs: 0.14 s -> 0.09 s per
/// 10M-parameter exchange). Memory stays at its steady-state peak, which a trainer reaches in
/// its first round anyway. One arena for all threads: glibc's per-thread arenas grow in heaps
/// of at most 64 MB and serve anything larger with a fresh mmap whatever the threshold, so the
/// buffers a runtime worker thread allocated (received models) faulted in anew every round.
pub fn keep_freed_buffers() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: mallopt only sets allocator parameters; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 30);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Read the peer key: the file's bytes, less a trailing newline (`echo key > file`).
pub fn read_key(path: &Path) -> Result<Vec<u8>, RunError> {
    let file = path.display().to_string();
    let mut key = std::fs::read(path).map_err(|source| RunError::KeyFile {
        file: file.clone(),
        source,
    })?;
    while key.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        key.pop();
    }
    if key.is_empty() {
        return Err(RunError::EmptyKey { file });
    }
    Ok(key)
}

/// The job spec from `MURMUR_JOB_SPEC` (JSON), as the control plane passed it. The operator and
/// `murmur run` pass only a spec that passed the CRD's rules (`murmur_core::api::validate`, in
/// the operator's reconcile and in `murmur run`'s manifest loading), so it is not checked again
/// here: building the schema and parsing its CEL rules again took 150-170 ms of every trainer's
/// start, and a replacement's start is time its clique trains without it. A manifest given with
/// `--manifest` is checked in full.
pub fn spec_from_env(env: &TrainerEnv) -> Result<Option<DecentralizedTrainingJobSpec>, RunError> {
    let Some(text) = &env.job_spec else {
        return Ok(None);
    };
    let spec: DecentralizedTrainingJobSpec = serde_json::from_str(text).map_err(|e| {
        RunError::Spec(format!(
            "{} is not a valid spec: {e}",
            murmur_core::contract::env::JOB_SPEC
        ))
    })?;
    Ok(Some(spec))
}
