//! The topology document: what trainers follow. Served by the long-poll endpoint, stored in the
//! topology ConfigMap, or read from a file. Weights are the planned mixing matrix W: symmetric, so
//! one weight per edge plus each member's self weight describes it completely.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopologyDocument {
    /// Grows by one with every change; trainers apply a newer version at a round boundary.
    pub version: u64,
    /// Graph family, for people reading the document (`ring`, `dCliques`, ...).
    pub kind: String,
    /// The furthest step any member had reported when this version was made. Above a joining
    /// member's own step, the job is under way: the joiner must take its state from a member
    /// that has trained, even where every neighbour of its own is as new as itself (a whole
    /// clique replaced at once).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub step: u64,
    pub members: Vec<DocumentMember>,
    pub edges: Vec<DocumentEdge>,
}

pub(super) fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DocumentMember {
    pub id: u32,
    /// `host:port` of the member's peer listener, once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clique: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clump: Option<u32>,
    /// W_ii.
    pub self_weight: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DocumentEdge {
    pub a: u32,
    pub b: u32,
    /// W_ab = W_ba.
    pub weight: f64,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DocumentError {
    #[error("topology document is not valid JSON: {0}")]
    Json(String),
    #[error("topology document: {field}: {message}")]
    Invalid { field: String, message: String },
}

/// Rows of W must sum to 1 within this tolerance (weights travel as decimal text).
pub const ROW_SUM_TOLERANCE: f64 = 1e-6;

impl TopologyDocument {
    /// Parse and check a document; anything inconsistent is an error naming the field.
    pub fn parse(text: &str) -> Result<Self, DocumentError> {
        let doc: Self =
            serde_json::from_str(text).map_err(|e| DocumentError::Json(e.to_string()))?;
        doc.check()?;
        Ok(doc)
    }

    pub fn check(&self) -> Result<(), DocumentError> {
        let invalid = |field: String, message: String| DocumentError::Invalid { field, message };
        let mut row_sums = BTreeMap::new();
        for (i, m) in self.members.iter().enumerate() {
            if !(0.0..=1.0).contains(&m.self_weight) {
                return Err(invalid(
                    format!("members[{i}].selfWeight"),
                    format!("{} is not in [0, 1]", m.self_weight),
                ));
            }
            if row_sums.insert(m.id, m.self_weight).is_some() {
                return Err(invalid(
                    format!("members[{i}].id"),
                    format!("member {} appears twice", m.id),
                ));
            }
        }
        let mut seen = BTreeSet::new();
        for (i, e) in self.edges.iter().enumerate() {
            for (end, id) in [("a", e.a), ("b", e.b)] {
                if !row_sums.contains_key(&id) {
                    return Err(invalid(
                        format!("edges[{i}].{end}"),
                        format!("member {id} is not in members"),
                    ));
                }
            }
            if e.a == e.b {
                return Err(invalid(
                    format!("edges[{i}]"),
                    format!("self-loop on member {}", e.a),
                ));
            }
            if !seen.insert((e.a.min(e.b), e.a.max(e.b))) {
                return Err(invalid(
                    format!("edges[{i}]"),
                    format!("edge {}-{} appears twice", e.a, e.b),
                ));
            }
            if !(e.weight > 0.0 && e.weight <= 1.0) {
                return Err(invalid(
                    format!("edges[{i}].weight"),
                    format!("{} is not in (0, 1]", e.weight),
                ));
            }
            *row_sums.get_mut(&e.a).expect("checked") += e.weight;
            *row_sums.get_mut(&e.b).expect("checked") += e.weight;
        }
        for (i, m) in self.members.iter().enumerate() {
            let sum = row_sums[&m.id];
            if (sum - 1.0).abs() > ROW_SUM_TOLERANCE {
                return Err(invalid(
                    format!("members[{i}]"),
                    format!("weights of member {} sum to {sum}, not 1", m.id),
                ));
            }
        }
        Ok(())
    }

    /// Neighbours of `id` with their weights, and its self weight.
    pub fn mixing_row(&self, id: u32) -> Option<(f64, Vec<(u32, f64)>)> {
        let me = self.members.iter().find(|m| m.id == id)?;
        let neighbours = self
            .edges
            .iter()
            .filter_map(|e| match (e.a == id, e.b == id) {
                (true, _) => Some((e.b, e.weight)),
                (_, true) => Some((e.a, e.weight)),
                _ => None,
            })
            .collect();
        Some((me.self_weight, neighbours))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn triangle() -> TopologyDocument {
        let third = 1.0 / 3.0;
        TopologyDocument {
            version: 3,
            kind: "ring".into(),
            step: 0,
            members: (0..3)
                .map(|id| DocumentMember {
                    id,
                    address: None,
                    clique: None,
                    clump: None,
                    self_weight: third,
                })
                .collect(),
            edges: vec![
                DocumentEdge {
                    a: 0,
                    b: 1,
                    weight: third,
                },
                DocumentEdge {
                    a: 1,
                    b: 2,
                    weight: third,
                },
                DocumentEdge {
                    a: 2,
                    b: 0,
                    weight: third,
                },
            ],
        }
    }

    #[test]
    fn a_consistent_document_round_trips() {
        let doc = triangle();
        let text = serde_json::to_string(&doc).unwrap();
        assert_eq!(TopologyDocument::parse(&text).unwrap(), doc);
        let (me, row) = doc.mixing_row(1).unwrap();
        assert!((me - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(
            row.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
            vec![0, 2]
        );
    }

    #[test]
    fn inconsistencies_name_the_field() {
        type Mutation = Box<dyn Fn(&mut TopologyDocument)>;
        let cases: Vec<(Mutation, &str)> = vec![
            (Box::new(|d| d.edges[0].b = 9), "edges[0].b"),
            (Box::new(|d| d.edges[1].b = 1), "edges[1]"),
            (
                Box::new(|d| {
                    d.edges[2] = DocumentEdge {
                        a: 1,
                        b: 0,
                        weight: 1.0 / 3.0,
                    }
                }),
                "edges[2]",
            ),
            (Box::new(|d| d.edges[0].weight = -0.5), "edges[0].weight"),
            (
                Box::new(|d| d.edges[0].weight = f64::NAN),
                "edges[0].weight",
            ),
            (Box::new(|d| d.members[1].id = 0), "members[1].id"),
            (Box::new(|d| d.members[2].self_weight = 0.5), "members[2]"),
            (
                Box::new(|d| d.members[2].self_weight = 1.5),
                "members[2].selfWeight",
            ),
        ];
        for (mutate, field) in cases {
            let mut doc = triangle();
            mutate(&mut doc);
            match doc.check() {
                Err(DocumentError::Invalid { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: {other:?}"),
            }
        }
        assert!(matches!(
            TopologyDocument::parse("{"),
            Err(DocumentError::Json(_))
        ));
    }
}
