//! Runtimes execute the planner's actions: `local` with child processes (`murmur run`); `kube`
//! with pods (`murmur operator`).

pub mod kube;
pub mod local;
