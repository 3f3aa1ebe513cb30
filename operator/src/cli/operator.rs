//! `murmur operator`: the Kubernetes runtime, run in-cluster (or against a kubeconfig).

use clap::{Args, ValueEnum};
use murmur_core::api;
use tracing_subscriber::EnvFilter;

use super::CliError;
use crate::runtime::kube::{self, LeaseOptions, OperatorOptions, Settings};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum LogFormat {
    Json,
    Text,
}

#[derive(Args, Debug)]
pub struct OperatorArgs {
    /// The status API, dashboard, trainers' control endpoint and /metrics.
    #[arg(long, default_value = "0.0.0.0:8470", env = "MURMUR_OPERATOR_LISTEN")]
    pub listen: String,
    /// URL trainers reach the control endpoint at (the operator's Service).
    #[arg(
        long,
        default_value = "http://murmur-operator.murmur-system.svc:8470",
        env = "MURMUR_OPERATOR_CONTROL_ENDPOINT"
    )]
    pub control_endpoint: String,
    /// Jobs reconciled at once.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrency: u16,
    /// A node NotReady this long counts as lost: its members are replaced.
    #[arg(long, default_value = "60s")]
    pub node_lost_after: api::Duration,
    /// Re-plan every job at least this often.
    #[arg(long, default_value = "30s")]
    pub resync: api::Duration,
    /// The cluster's DNS domain, for members' stable addresses.
    #[arg(long, default_value = "cluster.local")]
    pub cluster_domain: String,
    /// Elect a leader on a Lease (run several replicas, one reconciles).
    #[arg(long, env = "MURMUR_OPERATOR_LEADER_ELECTION")]
    pub leader_election: bool,
    /// Namespace of the Lease (default: the pod's namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "murmur-system")]
    pub lease_namespace: String,
    /// Name of the Lease the replicas compete for.
    #[arg(long, default_value = "murmur-operator")]
    pub lease_name: String,
    /// This replica's identity in the Lease and in events (default: the pod's name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// JSON lines (for log collectors) or plain text.
    #[arg(long, value_enum, default_value = "json")]
    pub log_format: LogFormat,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct OperatorCliError(#[from] pub kube::OperatorError);

pub fn run(args: OperatorArgs) -> Result<(), CliError> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = match args.log_format {
        LogFormat::Json => logs.json().try_init(),
        LogFormat::Text => logs.try_init(),
    };
    let identity = args.identity.clone().unwrap_or_else(|| {
        format!(
            "murmur-operator-{}",
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_else(|_| std::process::id().to_string())
        )
    });
    let options = OperatorOptions {
        settings: Settings {
            control_endpoint: args.control_endpoint,
            cluster_domain: args.cluster_domain,
            node_lost_after: args.node_lost_after.as_std(),
            resync: args.resync.as_std(),
            ..Settings::default()
        },
        listen: args.listen,
        concurrency: args.concurrency,
        lease: args.leader_election.then(|| LeaseOptions {
            namespace: args.lease_namespace,
            name: args.lease_name,
            duration: std::time::Duration::from_secs(15),
        }),
        instance: identity,
    };
    let runtime = tokio::runtime::Runtime::new().map_err(CliError::Output)?;
    runtime
        .block_on(kube::run(options))
        .map_err(|e| CliError::Operator(OperatorCliError(e)))
}
