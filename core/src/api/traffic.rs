//! What a job's model traffic costs: each byte a member sends is within a zone, across zones or
//! across regions, by where the two nodes run, and a cloud bills each at its own rate.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where a member runs, as its node's labels say (`topology.kubernetes.io/zone` and `/region`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Place<'a> {
    pub zone: Option<&'a str>,
    pub region: Option<&'a str>,
}

/// How far a byte travels between two members, for the bill.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Locality {
    WithinZone,
    CrossZone,
    CrossRegion,
    /// A zone is not known (local processes, unlabelled nodes): not priced.
    Unplaced,
}

/// Regions that differ cross regions whatever the zones say; otherwise two known zones are the
/// same zone or cross zones; anything else is unplaced.
pub fn locality(from: Place<'_>, to: Place<'_>) -> Locality {
    if let (Some(a), Some(b)) = (from.region, to.region)
        && a != b
    {
        return Locality::CrossRegion;
    }
    match (from.zone, to.zone) {
        (Some(a), Some(b)) if a == b => Locality::WithinZone,
        (Some(_), Some(_)) => Locality::CrossZone,
        _ => Locality::Unplaced,
    }
}

/// US dollars per GB (10^9 bytes) sent, by locality.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Prices {
    pub within_zone_per_gb: f64,
    pub cross_zone_per_gb: f64,
    pub cross_region_per_gb: f64,
}

impl Prices {
    /// Public list prices: traffic inside a zone is free on AWS, Google Cloud and Azure; across
    /// zones of a region Google Cloud bills $0.01/GB and AWS $0.01/GB each way; between regions
    /// of one continent both bill about $0.02/GB.
    pub const LIST: Prices = Prices {
        within_zone_per_gb: 0.0,
        cross_zone_per_gb: 0.01,
        cross_region_per_gb: 0.02,
    };

    /// What `bytes` sent at `locality` cost (nothing when unplaced).
    pub fn cost(&self, locality: Locality, bytes: u64) -> f64 {
        let per_gb = match locality {
            Locality::WithinZone => self.within_zone_per_gb,
            Locality::CrossZone => self.cross_zone_per_gb,
            Locality::CrossRegion => self.cross_region_per_gb,
            Locality::Unplaced => 0.0,
        };
        per_gb * bytes as f64 / 1e9
    }
}

impl Default for Prices {
    fn default() -> Self {
        Self::LIST
    }
}

/// Model bytes the job's members sent to one another, all attempts together, by locality, and
/// what they cost.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Traffic {
    #[serde(default)]
    pub within_zone_bytes: u64,
    #[serde(default)]
    pub cross_zone_bytes: u64,
    #[serde(default)]
    pub cross_region_bytes: u64,
    /// Sent where a zone is not known (local processes, unlabelled nodes): not priced.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unplaced_bytes: u64,
    /// What the placed bytes cost at the operator's price table, in US dollars.
    #[serde(default)]
    pub cost_usd: f64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl Traffic {
    /// Count `bytes` sent at `locality`, priced at `prices`.
    pub fn add(&mut self, locality: Locality, bytes: u64, prices: &Prices) {
        let total = match locality {
            Locality::WithinZone => &mut self.within_zone_bytes,
            Locality::CrossZone => &mut self.cross_zone_bytes,
            Locality::CrossRegion => &mut self.cross_region_bytes,
            Locality::Unplaced => &mut self.unplaced_bytes,
        };
        *total += bytes;
        self.cost_usd += prices.cost(locality, bytes);
    }

    pub fn total_bytes(&self) -> u64 {
        self.within_zone_bytes
            + self.cross_zone_bytes
            + self.cross_region_bytes
            + self.unplaced_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at<'a>(zone: Option<&'a str>, region: Option<&'a str>) -> Place<'a> {
        Place { zone, region }
    }

    #[test]
    fn a_byte_is_within_a_zone_across_zones_or_across_regions_by_the_labels() {
        let a1 = at(Some("us-east-1a"), Some("us-east-1"));
        let b1 = at(Some("us-east-1b"), Some("us-east-1"));
        let a2 = at(Some("us-west-2a"), Some("us-west-2"));
        assert_eq!(locality(a1, a1), Locality::WithinZone);
        assert_eq!(locality(a1, b1), Locality::CrossZone);
        assert_eq!(locality(a1, a2), Locality::CrossRegion);
        assert_eq!(locality(a2, a1), Locality::CrossRegion);
        // Zones without regions: the zone alone decides.
        assert_eq!(
            locality(at(Some("z1"), None), at(Some("z2"), None)),
            Locality::CrossZone
        );
        // Regions that differ cross regions even where a zone is not known.
        assert_eq!(
            locality(at(None, Some("r1")), at(Some("z"), Some("r2"))),
            Locality::CrossRegion
        );
        // A zone not known, regions equal or unknown: not placed.
        assert_eq!(
            locality(at(None, Some("r1")), at(Some("z"), Some("r1"))),
            Locality::Unplaced
        );
        assert_eq!(locality(Place::default(), a1), Locality::Unplaced);
    }

    #[test]
    fn traffic_adds_bytes_by_locality_and_prices_only_the_placed_ones() {
        let prices = Prices::LIST;
        let mut t = Traffic::default();
        t.add(Locality::WithinZone, 5_000_000_000, &prices);
        t.add(Locality::CrossZone, 2_000_000_000, &prices);
        t.add(Locality::CrossRegion, 1_000_000_000, &prices);
        t.add(Locality::Unplaced, 7, &prices);
        assert_eq!(t.within_zone_bytes, 5_000_000_000);
        assert_eq!(t.cross_zone_bytes, 2_000_000_000);
        assert_eq!(t.cross_region_bytes, 1_000_000_000);
        assert_eq!(t.unplaced_bytes, 7);
        assert_eq!(t.total_bytes(), 8_000_000_007);
        // 2 GB at $0.01 and 1 GB at $0.02; within the zone and unplaced are free.
        assert!((t.cost_usd - 0.04).abs() < 1e-12, "{}", t.cost_usd);
        let own = Prices {
            within_zone_per_gb: 0.001,
            ..prices
        };
        assert!((own.cost(Locality::WithinZone, 3_000_000_000) - 0.003).abs() < 1e-12);
    }
}
