//! Runtimes execute the planner's actions: `local` with child processes (`murmur run`); the
//! Kubernetes runtime (the operator) with pods.

pub mod local;
