//! The environment a trainer process is started with, in a pod or as a local process.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::api::Backend;

/// Whether `name` is one of murmur's variables (`MURMUR_*`): the contract's, which a job's own
/// environment may not set.
pub fn is_murmurs(name: &str) -> bool {
    name.starts_with("MURMUR_")
}

pub const JOB: &str = "MURMUR_JOB";
pub const NAMESPACE: &str = "MURMUR_NAMESPACE";
pub const MEMBER_ID: &str = "MURMUR_MEMBER_ID";
pub const ATTEMPT: &str = "MURMUR_ATTEMPT";
pub const LISTEN_ADDRESS: &str = "MURMUR_LISTEN_ADDRESS";
pub const CONTROL_ENDPOINT: &str = "MURMUR_CONTROL_ENDPOINT";
pub const PEER_KEY_FILE: &str = "MURMUR_PEER_KEY_FILE";
pub const TOPOLOGY_FILE: &str = "MURMUR_TOPOLOGY_FILE";
pub const CHECKPOINT_DIR: &str = "MURMUR_CHECKPOINT_DIR";
pub const BACKEND: &str = "MURMUR_BACKEND";
pub const STATUS_ADDRESS: &str = "MURMUR_STATUS_ADDRESS";
pub const OUTPUT_DIR: &str = "MURMUR_OUTPUT_DIR";
pub const JOB_SPEC: &str = "MURMUR_JOB_SPEC";

/// Everything a trainer needs to find its job, its peers and its control plane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrainerEnv {
    pub job: String,
    pub namespace: String,
    pub member_id: u32,
    /// Which start of the member this process is (0 first): its control posts say so, and the
    /// control plane refuses posts from an attempt older than one it has heard.
    pub attempt: u32,
    /// `host:port` the trainer listens on for peers.
    pub listen_address: String,
    /// `host:port` of `/healthz`, `/readyz`, `/metrics` and `/status`; when unset, the peer
    /// port plus one on the same host.
    pub status_address: String,
    /// Base URL of the control plane (`http://host:port`); absent for bare-metal runs.
    pub control_endpoint: Option<String>,
    /// File holding the per-job HMAC key; never the key itself.
    pub peer_key_file: PathBuf,
    /// A topology document to follow instead of (or before) the control plane's.
    pub topology_file: Option<PathBuf>,
    pub checkpoint_dir: Option<PathBuf>,
    /// Where the lowest live member writes the final model (default: the checkpoint dir).
    pub output_dir: Option<PathBuf>,
    pub backend: Backend,
    /// The job's spec as JSON: pods and local processes train exactly what the manifest says.
    /// Bare-metal runs may pass `--manifest` to the trainer instead.
    pub job_spec: Option<String>,
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
            (ATTEMPT, self.attempt.to_string()),
            (LISTEN_ADDRESS, self.listen_address.clone()),
            (STATUS_ADDRESS, self.status_address.clone()),
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
        if let Some(path) = &self.output_dir {
            vars.push((OUTPUT_DIR, path.display().to_string()));
        }
        if let Some(spec) = &self.job_spec {
            vars.push((JOB_SPEC, spec.clone()));
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
        let attempt = match optional(ATTEMPT) {
            None => 0,
            Some(value) => value.parse().map_err(|_| EnvError::Invalid {
                name: ATTEMPT,
                value: value.clone(),
                reason: "expected a non-negative integer",
            })?,
        };
        let listen_address = required(LISTEN_ADDRESS)?;
        let Some(peer_port) = port_of(&listen_address) else {
            return Err(EnvError::Invalid {
                name: LISTEN_ADDRESS,
                value: listen_address,
                reason: "expected host:port",
            });
        };
        let status_address = match optional(STATUS_ADDRESS) {
            Some(address) if port_of(&address).is_some() => address,
            Some(address) => {
                return Err(EnvError::Invalid {
                    name: STATUS_ADDRESS,
                    value: address,
                    reason: "expected host:port",
                });
            }
            None => {
                let host = &listen_address[..listen_address.rfind(':').expect("has a port")];
                let port = peer_port.checked_add(1).ok_or(EnvError::Invalid {
                    name: LISTEN_ADDRESS,
                    value: listen_address.clone(),
                    reason: "port 65535 leaves no room for the default status port (set MURMUR_STATUS_ADDRESS)",
                })?;
                format!("{host}:{port}")
            }
        };
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
        // The control endpoint lives inside the cluster (or on loopback): plain HTTP, with
        // every trainer request signed by the job key.
        if let Some(url) = &control_endpoint
            && !url.starts_with("http://")
        {
            return Err(EnvError::Invalid {
                name: CONTROL_ENDPOINT,
                value: url.clone(),
                reason: "expected an http:// URL",
            });
        }
        Ok(Self {
            job: required(JOB)?,
            namespace: optional(NAMESPACE).unwrap_or_else(|| "default".to_string()),
            member_id,
            attempt,
            listen_address,
            status_address,
            control_endpoint,
            peer_key_file: required(PEER_KEY_FILE)?.into(),
            topology_file: optional(TOPOLOGY_FILE).map(PathBuf::from),
            checkpoint_dir: optional(CHECKPOINT_DIR).map(PathBuf::from),
            output_dir: optional(OUTPUT_DIR).map(PathBuf::from),
            backend,
            job_spec: optional(JOB_SPEC),
        })
    }

    /// Where the final model goes: the output dir, else the checkpoint dir.
    pub fn model_dir(&self) -> Option<&std::path::Path> {
        self.output_dir
            .as_deref()
            .or(self.checkpoint_dir.as_deref())
    }

    pub fn from_map(vars: &BTreeMap<String, String>) -> Result<Self, EnvError> {
        Self::from_lookup(|k| vars.get(k).cloned())
    }
}

/// The port of `host:port` (`[::1]:80` included), if it has one.
fn port_of(address: &str) -> Option<u16> {
    let (host, port) = address.rsplit_once(':')?;
    (!host.is_empty()).then_some(())?;
    port.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> TrainerEnv {
        TrainerEnv {
            job: "mnist".into(),
            namespace: "ml".into(),
            member_id: 7,
            attempt: 2,
            listen_address: "0.0.0.0:7070".into(),
            status_address: "0.0.0.0:7071".into(),
            control_endpoint: Some("http://murmur-operator.murmur-system:8080".into()),
            peer_key_file: "/var/run/murmur/peer-key".into(),
            topology_file: None,
            checkpoint_dir: Some("/checkpoints".into()),
            output_dir: None,
            backend: Backend::Cuda,
            job_spec: Some(r#"{"replicas":{"min":1,"target":2,"max":2}}"#.into()),
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
            (ATTEMPT, "first"),
            (LISTEN_ADDRESS, "7070"),
            (BACKEND, "tpu"),
            (CONTROL_ENDPOINT, "operator:8080"),
            (CONTROL_ENDPOINT, "https://operator:8443"),
            (STATUS_ADDRESS, "7071"),
        ] {
            let mut bad = vars.clone();
            bad.insert(name.into(), value.into());
            match TrainerEnv::from_map(&bad) {
                Err(EnvError::Invalid { name: n, .. }) => assert_eq!(n, name),
                other => panic!("{name}={value}: {other:?}"),
            }
        }
    }

    #[test]
    fn status_address_defaults_to_the_next_port() {
        let mut vars: BTreeMap<String, String> = sample()
            .to_vars()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        vars.remove(STATUS_ADDRESS);
        vars.insert(LISTEN_ADDRESS.into(), "[::1]:9000".into());
        assert_eq!(
            TrainerEnv::from_map(&vars).unwrap().status_address,
            "[::1]:9001"
        );
        vars.insert(LISTEN_ADDRESS.into(), "0.0.0.0:65535".into());
        assert!(matches!(
            TrainerEnv::from_map(&vars),
            Err(EnvError::Invalid {
                name: LISTEN_ADDRESS,
                ..
            })
        ));
    }
}
