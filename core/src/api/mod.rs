//! The `DecentralizedTrainingJob` API: types, CEL rules, conditions, and the local loader.

pub mod conditions;
pub mod duration;
pub mod manifest;
pub mod spec;
pub mod status;

use kube::core::CustomResourceExt;

pub use duration::Duration;
pub use manifest::{
    ManifestError, Violation, load_manifest, parse_manifest, validate, validate_update,
};
pub use spec::*;
pub use status::*;

/// The CustomResourceDefinition the cluster gets.
pub fn crd()
-> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    DecentralizedTrainingJob::crd()
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
