//! The `DecentralizedTrainingJob` API: types, CEL rules, conditions, and the local loader.

pub mod conditions;
pub mod duration;
pub mod manifest;
pub mod pod_template;
pub mod recovery;
pub mod reference;
pub mod scheduling;
pub mod spec;
pub mod status;
pub mod traffic;

use kube::core::CustomResourceExt;

pub use duration::Duration;
pub use manifest::{
    ManifestError, Violation, decode_job, load_manifest, parse_manifest, validate, validate_update,
};
pub use pod_template::PodTemplate;
pub use recovery::*;
pub use scheduling::*;
pub use spec::*;
pub use status::*;

/// The CustomResourceDefinition the cluster gets: the types' schema with every integer bounded
/// by its width. The API server ignores `format`, so without bounds it stores an `int32` of five
/// billion, which the operator then cannot decode (and a failed decode of one object stopped the
/// job watch for every job). It knows only `int32` and `int64` for integers and warns on every
/// apply of any other, so unsigned widths become `int64` with their bounds.
pub fn crd()
-> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    let mut crd = serde_json::to_value(DecentralizedTrainingJob::crd()).expect("a CRD serializes");
    bound_integers(&mut crd);
    serde_json::from_value(crd).expect("a bounded CRD is a CRD")
}

/// Give every `integer` schema the `minimum` and `maximum` of its width (a tighter bound already
/// there stays), and an unsigned one the format `int64`, which holds it.
fn bound_integers(schema: &mut serde_json::Value) {
    use serde_json::{Value, json};
    match schema {
        Value::Object(map) => {
            let range = match map.get("format").and_then(Value::as_str) {
                Some("int32") => Some((i64::from(i32::MIN), Some(i64::from(i32::MAX)))),
                Some("uint32") => Some((0, Some(i64::from(u32::MAX)))),
                // int64's own maximum bounds the rest.
                Some("uint64") => Some((0, None)),
                _ => None,
            };
            if let Some((low, high)) = range
                && map.get("type").and_then(Value::as_str) == Some("integer")
            {
                if map.get("format").and_then(Value::as_str) != Some("int32") {
                    map.insert("format".into(), json!("int64"));
                }
                let minimum = map.get("minimum").and_then(Value::as_f64);
                let maximum = map.get("maximum").and_then(Value::as_f64);
                if minimum.is_none_or(|e| e < low as f64) {
                    map.insert("minimum".into(), json!(low));
                }
                if let Some(high) = high
                    && maximum.is_none_or(|e| e > high as f64)
                {
                    map.insert("maximum".into(), json!(high));
                }
            }
            map.values_mut().for_each(bound_integers);
        }
        Value::Array(items) => items.iter_mut().for_each(bound_integers),
        _ => {}
    }
}

/// The CRD as YAML, exactly as `crds/` holds it and `murmur crd` prints it.
pub fn crd_yaml() -> String {
    let crd = crd();
    let yaml = serde_saphyr::to_string(&crd).expect("a CRD always serializes");
    format!(
        "# Generated from the Rust types by `murmur crd`; do not edit by hand.\n{}",
        yaml
    )
}

#[cfg(test)]
mod tests;
