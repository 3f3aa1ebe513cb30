//! The job driver's memory: what must survive the control plane's own restart. The planner's
//! state and the trainers' join reports (a data-aware topology is rebuilt from them), with the
//! topology document trainers follow. The operator keeps the three in the job's ConfigMap and
//! reads them back with [`Memory::from_data`] when it restarts; `murmur run` writes files of the
//! same names for people and tools to read, and never restarts a job from them.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use murmur_core::contract::{JoinReport, TopologyDocument};
use murmur_core::topology::MemberId;
use serde::{Deserialize, Serialize};

use crate::planner::JobState;

/// Keys (ConfigMap) and file names (`murmur run`): the document trainers follow, the
/// planner's memory, the join reports.
pub const TOPOLOGY_KEY: &str = "topology.json";
pub const STATE_KEY: &str = "state.json";
pub const JOINS_KEY: &str = "joins.json";

/// A join report and the attempt that sent it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoredJoin {
    pub attempt: u32,
    /// Shared with the observations of every plan.
    #[serde(with = "crate::planner::shared_value")]
    pub report: Arc<JoinReport>,
}

#[derive(Clone, Debug)]
pub struct Memory {
    /// Shared, not copied, between the driver and the plans its runtime is still writing: at
    /// 10 000 members a copy and its drop were about 7% of a steady reconcile.
    pub state: Arc<JobState>,
    pub joins: BTreeMap<MemberId, StoredJoin>,
}

#[derive(Debug, thiserror::Error)]
#[error("{origin} key {key}: {message}")]
pub struct MemoryError {
    /// Where it was read from (the ConfigMap, a folder).
    pub origin: String,
    pub key: &'static str,
    pub message: String,
}

impl PartialEq for Memory {
    /// A state shared with the other memory is the same without comparing its members.
    fn eq(&self, other: &Self) -> bool {
        (Arc::ptr_eq(&self.state, &other.state) || self.state == other.state)
            && self.joins == other.joins
    }
}

impl Memory {
    /// A job seen for the first time, created at `created`.
    pub fn new(created: Timestamp) -> Self {
        Self {
            state: Arc::new(JobState::new(created)),
            joins: BTreeMap::new(),
        }
    }

    /// Read what [`Memory::data`] wrote; `source` names where it came from, for the error.
    pub fn from_data(source: &str, data: &BTreeMap<String, String>) -> Result<Self, MemoryError> {
        let field = |key: &'static str| {
            data.get(key).ok_or_else(|| MemoryError {
                origin: source.to_string(),
                key,
                message: "missing".into(),
            })
        };
        let parse = |key: &'static str, text: String| MemoryError {
            origin: source.to_string(),
            key,
            message: format!("not what murmur wrote: {text}"),
        };
        let state = serde_json::from_str::<JobState>(field(STATE_KEY)?)
            .map_err(|e| parse(STATE_KEY, e.to_string()))?;
        let joins =
            serde_json::from_str(field(JOINS_KEY)?).map_err(|e| parse(JOINS_KEY, e.to_string()))?;
        Ok(Self {
            state: Arc::new(state),
            joins,
        })
    }

    /// The memory as text under its keys, with the document trainers follow when there is one
    /// and the whole stays plain: a person reads it with kubectl. A larger job's memory is
    /// gzipped, and its document left out: it is derived from the state (the status API
    /// serves it), and with it 10 000 members of D-Cliques took 1.25 MB, past a ConfigMap's
    /// 1 MiB.
    pub fn data(&self, document: Option<&TopologyDocument>) -> BTreeMap<String, String> {
        let mut data = BTreeMap::from([
            (
                STATE_KEY.to_string(),
                serde_json::to_string(&*self.state).expect("state serializes"),
            ),
            (
                JOINS_KEY.to_string(),
                serde_json::to_string(&self.joins).expect("joins serialize"),
            ),
        ]);
        if let Some(doc) = document
            && plain_bytes(&data) <= PLAIN_BYTES
        {
            // Without the job's step, which moves with every report: kept, it would rewrite
            // the ConfigMap as training goes on. Joiners read it from the served topology.
            let text = if doc.step == 0 {
                serde_json::to_string(doc)
            } else {
                serde_json::to_string(&TopologyDocument {
                    step: 0,
                    ..doc.clone()
                })
            };
            data.insert(
                TOPOLOGY_KEY.to_string(),
                text.expect("a document serializes"),
            );
            if plain_bytes(&data) > PLAIN_BYTES {
                data.remove(TOPOLOGY_KEY);
            }
        }
        data
    }
}

/// Up to this many bytes the memory is kept as plain JSON (readable with `kubectl get cm`);
/// beyond, each key is gzipped into `binaryData` as `<key>.gz`. The API server refuses a
/// ConfigMap over 1 MiB: plain JSON passed it at about 1 500 members (measured, 3 000 was
/// 2.2 MB); gzipped, without the document, 10 000 members (the CRD's most) fit.
pub const PLAIN_BYTES: usize = 512 * 1024;

/// The bytes of `data` as plain text, keys included (what [`PLAIN_BYTES`] bounds).
pub fn plain_bytes(data: &BTreeMap<String, String>) -> usize {
    data.iter().map(|(k, v)| k.len() + v.len()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_round_trips_and_a_bad_key_is_named() {
        let mut m = Memory::new(Timestamp::from_second(1_800_000_000).unwrap());
        m.joins.insert(
            2,
            StoredJoin {
                attempt: 1,
                report: Arc::new(JoinReport {
                    member_id: 2,
                    label_histogram: vec![1, 2],
                    proxy_vector: None,
                }),
            },
        );
        let data = m.data(None);
        assert_eq!(Memory::from_data("cm", &data).unwrap(), m);
        let mut broken = data.clone();
        broken.insert(STATE_KEY.into(), "{".into());
        let e = Memory::from_data("ConfigMap ml/x-topology", &broken).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("ConfigMap ml/x-topology key state.json: not what murmur wrote"),
            "{e}"
        );
        broken.remove(JOINS_KEY);
        broken.insert(STATE_KEY.into(), data[STATE_KEY].clone());
        assert_eq!(
            Memory::from_data("cm", &broken).unwrap_err().message,
            "missing"
        );
    }
}
