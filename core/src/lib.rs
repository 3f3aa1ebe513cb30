//! murmur-core: the contract between murmur's control plane and data plane, and the pure
//! topology engine both use. No I/O beyond reading a manifest file the caller names.

pub mod api;
pub mod contract;
#[doc(hidden)]
pub mod fuzzing;
pub mod topology;
