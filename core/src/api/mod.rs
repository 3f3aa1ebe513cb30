//! The `DecentralizedTrainingJob` API: types, CEL rules, conditions, and the local loader.

pub mod conditions;
pub mod duration;
pub mod manifest;
pub mod spec;
pub mod status;

use kube::core::CustomResourceExt;

pub use duration::Duration;
pub use manifest::{ManifestError, Violation, load_manifest, parse_manifest, validate};
pub use spec::*;
pub use status::*;

/// The CRD as YAML, exactly as `crds/` holds it and `murmur crd` prints it.
pub fn crd_yaml() -> String {
    let crd = DecentralizedTrainingJob::crd();
    let yaml = serde_saphyr::to_string(&crd).expect("a CRD always serializes");
    format!(
        "# Generated from the Rust types by `murmur crd`; do not edit by hand.\n{}",
        yaml
    )
}

#[cfg(test)]
mod tests;
