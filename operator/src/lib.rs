//! `murmur`: the control plane — CLI, planner, status router, and the two runtimes that execute
//! plans: local processes (`murmur run`) and Kubernetes pods (`murmur operator`). Never depends
//! on burn: trainers are separate processes or pods.
// One exception, with its reason beside it: `murmur run` asks the kernel to stop its trainers
// when it dies (runtime/local).
#![deny(unsafe_code)]

pub mod cli;
pub mod driver;
pub mod member;
pub mod planner;
pub mod runtime;
pub mod status;
