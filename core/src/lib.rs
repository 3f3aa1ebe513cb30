//! murmur-core: the contract between murmur's control plane and data plane, and the pure
//! topology engine both use. No I/O beyond reading a manifest file the caller names.
#![forbid(unsafe_code)]

pub mod api;
pub mod assets;
pub mod contract;
#[doc(hidden)]
pub mod fuzzing;
pub mod topology;
