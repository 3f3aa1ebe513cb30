//! The label and annotation keys the operator puts on the objects it creates and reads back,
//! and the node labels it reads: one place that `observe`, `resources` and `scheduling` all
//! import from (none of them imports another for a key).

pub const LABEL_JOB: &str = "murmur.dev/job";
pub const LABEL_MEMBER: &str = "murmur.dev/member";
pub const LABEL_ATTEMPT: &str = "murmur.dev/attempt";
pub const LABEL_CLIQUE: &str = "murmur.dev/clique";
pub const ANNOTATION_CAPACITY: &str = "murmur.dev/capacity";
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// The operator's watches select on this label: only what it created.
pub const MANAGER: &str = "murmur-operator";
pub const MANAGED_SELECTOR: &str = "app.kubernetes.io/managed-by=murmur-operator";

/// The zone label of a node.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// The region label of a node.
pub const REGION_LABEL: &str = "topology.kubernetes.io/region";
