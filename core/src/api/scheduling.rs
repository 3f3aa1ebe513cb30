//! `spec.scheduling`: where members run (spot or on-demand capacity, the cluster's own
//! placement terms, zone-aware cliques).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, Toleration};
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::duration::Duration;

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[serde(rename_all = "camelCase")]
pub enum Capacity {
    /// Spot nodes only (required node affinity).
    Spot,
    /// Spot nodes when available (preferred node affinity).
    #[default]
    PreferSpot,
    /// No spot affinity.
    OnDemand,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.capacity != 'onDemand' || !has(self.fallbackToOnDemandAfter)").message("scheduling.fallbackToOnDemandAfter needs capacity spot or preferSpot").field_path(".fallbackToOnDemandAfter"))]
pub struct SchedulingSpec {
    pub capacity: Capacity,
    /// A member Pending longer than this is recreated without the spot requirement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_to_on_demand_after: Option<Duration>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_name: Option<String>,
    /// Form each clique inside one zone (the `topology.kubernetes.io/zone` label of the members'
    /// nodes), so clique traffic, which flows every round, stays in its zone and only bridges
    /// cross. Where labels force a clique across zones, its outsiders are moved once, before
    /// training, to the clique's zone (`status.relocations`); a replacement prefers its clique's
    /// zone. dCliques and proxyClumps; default on, and nodes without the label change nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone_aware: Option<bool>,
}

impl SchedulingSpec {
    /// `zoneAware` with its default (on).
    pub fn zone_aware(&self) -> bool {
        self.zone_aware.unwrap_or(true)
    }
}
