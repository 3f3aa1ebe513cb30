//! The environment a trainer process is started with, in a pod or as a local process.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::api::Backend;

pub const JOB: &str = "MURMUR_JOB";
pub const NAMESPACE: &str = "MURMUR_NAMESPACE";
pub const MEMBER_ID: &str = "MURMUR_MEMBER_ID";
pub const LISTEN_ADDRESS: &str = "MURMUR_LISTEN_ADDRESS";
pub const CONTROL_ENDPOINT: &str = "MURMUR_CONTROL_ENDPOINT";
pub const PEER_KEY_FILE: &str = "MURMUR_PEER_KEY_FILE";
pub const TOPOLOGY_FILE: &str = "MURMUR_TOPOLOGY_FILE";
pub const CHECKPOINT_DIR: &str = "MURMUR_CHECKPOINT_DIR";
pub const BACKEND: &str = "MURMUR_BACKEND";

/// Everything a trainer needs to find its job, its peers and its control plane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrainerEnv {
    pub job: String,
    pub namespace: String,
    pub member_id: u32,
    /// `host:port` the trainer listens on for peers (and serves `/status`).
    pub listen_address: String,
    /// Base URL of the control plane (`http://host:port`); absent for bare-metal runs.
    pub control_endpoint: Option<String>,
    /// File holding the per-job HMAC key; never the key itself.
    pub peer_key_file: PathBuf,
    /// A topology document to follow instead of (or before) the control plane's.
    pub topology_file: Option<PathBuf>,
    pub checkpoint_dir: Option<PathBuf>,
    pub backend: Backend,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    #[error("environment variable {0} is required but not set")]
    Missing(&'static str),
    #[error("environment variable {name}={value:?}: {reason}")]
    Invalid {
        name: &'static str,
        value: String,
        reason: &'static str,
    },
}

impl TrainerEnv {
    /// The variables to set, in a stable order (pods and child processes get the same list).
    pub fn to_vars(&self) -> Vec<(&'static str, String)> {
        let mut vars = vec![
            (JOB, self.job.clone()),
            (NAMESPACE, self.namespace.clone()),
            (MEMBER_ID, self.member_id.to_string()),
            (LISTEN_ADDRESS, self.listen_address.clone()),
            (PEER_KEY_FILE, self.peer_key_file.display().to_string()),
            (
                BACKEND,
                match self.backend {
                    Backend::Cpu => "cpu",
                    Backend::Cuda => "cuda",
                }
                .to_string(),
            ),
        ];
        if let Some(url) = &self.control_endpoint {
            vars.push((CONTROL_ENDPOINT, url.clone()));
        }
        if let Some(path) = &self.topology_file {
            vars.push((TOPOLOGY_FILE, path.display().to_string()));
        }
        if let Some(path) = &self.checkpoint_dir {
            vars.push((CHECKPOINT_DIR, path.display().to_string()));
        }
        vars
    }

    /// Read the contract through `lookup` (pass `|k| std::env::var(k).ok()` in a process).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, EnvError> {
        let required = |name: &'static str| {
            lookup(name)
                .filter(|v| !v.is_empty())
                .ok_or(EnvError::Missing(name))
        };
        let optional = |name: &'static str| lookup(name).filter(|v| !v.is_empty());
        let member_id = required(MEMBER_ID)?;
        let member_id = member_id.parse().map_err(|_| EnvError::Invalid {
            name: MEMBER_ID,
            value: member_id.clone(),
            reason: "expected a non-negative integer",
        })?;
        let listen_address = required(LISTEN_ADDRESS)?;
        if !listen_address.contains(':') {
            return Err(EnvError::Invalid {
                name: LISTEN_ADDRESS,
                value: listen_address,
                reason: "expected host:port",
            });
        }
        let backend = match optional(BACKEND).as_deref() {
            None | Some("cpu") => Backend::Cpu,
            Some("cuda") => Backend::Cuda,
            Some(other) => {
                return Err(EnvError::Invalid {
                    name: BACKEND,
                    value: other.to_string(),
                    reason: "expected cpu or cuda",
                });
            }
        };
        let control_endpoint = optional(CONTROL_ENDPOINT);
        if let Some(url) = &control_endpoint
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return Err(EnvError::Invalid {
                name: CONTROL_ENDPOINT,
                value: url.clone(),
                reason: "expected an http:// or https:// URL",
            });
        }
        Ok(Self {
            job: required(JOB)?,
            namespace: optional(NAMESPACE).unwrap_or_else(|| "default".to_string()),
            member_id,
            listen_address,
            control_endpoint,
            peer_key_file: required(PEER_KEY_FILE)?.into(),
            topology_file: optional(TOPOLOGY_FILE).map(PathBuf::from),
            checkpoint_dir: optional(CHECKPOINT_DIR).map(PathBuf::from),
            backend,
        })
    }

    pub fn from_map(vars: &BTreeMap<String, String>) -> Result<Self, EnvError> {
        Self::from_lookup(|k| vars.get(k).cloned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> TrainerEnv {
        TrainerEnv {
            job: "mnist".into(),
            namespace: "ml".into(),
            member_id: 7,
            listen_address: "0.0.0.0:7070".into(),
            control_endpoint: Some("http://murmur-operator.murmur-system:8080".into()),
            peer_key_file: "/var/run/murmur/peer-key".into(),
            topology_file: None,
            checkpoint_dir: Some("/checkpoints".into()),
            backend: Backend::Cuda,
        }
    }

    #[test]
    fn round_trips_through_variables() {
        let env = sample();
        let vars: BTreeMap<String, String> = env
            .to_vars()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        assert_eq!(TrainerEnv::from_map(&vars).unwrap(), env);
    }

    #[test]
    fn names_the_missing_or_bad_variable() {
        let mut vars: BTreeMap<String, String> = sample()
            .to_vars()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        vars.remove(JOB);
        assert_eq!(TrainerEnv::from_map(&vars), Err(EnvError::Missing(JOB)));
        vars.insert(JOB.into(), "mnist".into());
        for (name, value) in [
            (MEMBER_ID, "-1"),
            (LISTEN_ADDRESS, "7070"),
            (BACKEND, "tpu"),
            (CONTROL_ENDPOINT, "operator:8080"),
        ] {
            let mut bad = vars.clone();
            bad.insert(name.into(), value.into());
            match TrainerEnv::from_map(&bad) {
                Err(EnvError::Invalid { name: n, .. }) => assert_eq!(n, name),
                other => panic!("{name}={value}: {other:?}"),
            }
        }
    }
}
