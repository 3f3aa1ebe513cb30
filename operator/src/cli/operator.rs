//! `murmur operator`: the Kubernetes runtime, run in-cluster (or against a kubeconfig).

use clap::{Args, ValueEnum};
use murmur_core::api;
use murmur_core::api::traffic::Prices;
use tracing_subscriber::EnvFilter;

use super::CliError;
use crate::runtime::kube::resources::NetworkPolicySettings;
use crate::runtime::kube::{self, LeaseOptions, OperatorOptions, PodName, Settings};

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
    #[arg(long)]
    pub identity: Option<String>,
    /// The operator's own pod (in --lease-namespace), labelled murmur.dev/operator-leader while
    /// it leads; the chart's Service selects that label. Unset out of a cluster.
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// The trainer image for jobs that name none (cpu backend).
    #[arg(long, default_value = api::DEFAULT_TRAINER_IMAGE, env = "MURMUR_TRAINER_IMAGE")]
    pub trainer_image: String,
    /// The trainer image for jobs that name none (cuda backend).
    #[arg(long, default_value = api::DEFAULT_TRAINER_CUDA_IMAGE, env = "MURMUR_TRAINER_CUDA_IMAGE")]
    pub trainer_cuda_image: String,
    /// Give each job a NetworkPolicy: its trainers accept and reach only their own job's peers,
    /// the operator and DNS. Needs a CNI that enforces NetworkPolicy.
    #[arg(long)]
    pub network_policies: bool,
    /// Where cluster DNS runs (for --network-policies).
    #[arg(long, default_value = "kube-system")]
    pub dns_namespace: String,
    /// The operator's own namespace, which trainers may reach (for --network-policies; default:
    /// the Lease's namespace, i.e. the pod's).
    #[arg(long)]
    pub operator_namespace: Option<String>,
    /// Observer reads (status API, dashboard, /metrics) served per second, queued beyond that
    /// so that watching cannot slow training; 0 serves them unpaced. Trainers' control traffic
    /// and probes are never paced.
    #[arg(long, default_value_t = crate::status::pacer::DEFAULT_READS_PER_SECOND)]
    pub status_reads_per_second: u32,
    /// US dollars per GB (10^9 bytes) that members send within one zone: jobs'
    /// `status.traffic.costUsd` counts at these three prices.
    #[arg(long, default_value_t = Prices::LIST.within_zone_per_gb, value_parser = price)]
    pub price_within_zone_per_gb: f64,
    /// US dollars per GB sent between zones of one region.
    #[arg(long, default_value_t = Prices::LIST.cross_zone_per_gb, value_parser = price)]
    pub price_cross_zone_per_gb: f64,
    /// US dollars per GB sent between regions.
    #[arg(long, default_value_t = Prices::LIST.cross_region_per_gb, value_parser = price)]
    pub price_cross_region_per_gb: f64,
    /// Accept observers' bearer tokens only when issued for one of these audiences (repeat the
    /// flag; default: the API server's own audience). Trainers sign with their job's key.
    #[arg(long = "token-audience", value_name = "AUDIENCE")]
    pub token_audiences: Vec<String>,
    /// At start-up, wait this long for the CRD to be Established (it is not served before).
    #[arg(long, default_value = "2m")]
    pub crd_wait: api::Duration,
    /// JSON lines (for log collectors) or plain text.
    #[arg(long, value_enum, default_value = "json")]
    pub log_format: LogFormat,
}

#[derive(Debug, thiserror::Error)]
pub enum OperatorCliError {
    #[error("{0}")]
    Operator(#[from] kube::OperatorError),
    #[error("--listen {0}: expected HOST:PORT")]
    Listen(String),
}

/// A price flag: a finite amount of dollars, zero or more.
fn price(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("expected dollars per GB, 0 or more, got {text:?}")),
    }
}

/// The port of `--listen` (trainers reach the operator's pods on it).
fn listen_port(listen: &str) -> Result<i32, CliError> {
    listen
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse::<u16>().ok())
        .map(i32::from)
        .ok_or_else(|| CliError::Operator(OperatorCliError::Listen(listen.to_string())))
}

pub fn run(args: OperatorArgs) -> Result<(), CliError> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = match args.log_format {
        LogFormat::Json => logs.json().try_init(),
        LogFormat::Text => logs.try_init(),
    };
    let identity = args
        .identity
        .clone()
        .or(args.pod_name.clone())
        .unwrap_or_else(|| {
            format!(
                "murmur-operator-{}",
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .map(|h| h.trim().to_string())
                    .unwrap_or_else(|_| std::process::id().to_string())
            )
        });
    let network_policies = match args.network_policies {
        false => None,
        true => Some(NetworkPolicySettings {
            operator_namespace: args
                .operator_namespace
                .clone()
                .unwrap_or_else(|| args.lease_namespace.clone()),
            operator_port: listen_port(&args.listen)?,
            dns_namespace: args.dns_namespace.clone(),
        }),
    };
    let options = OperatorOptions {
        settings: Settings {
            control_endpoint: args.control_endpoint,
            cluster_domain: args.cluster_domain,
            node_lost_after: args.node_lost_after.as_std(),
            resync: args.resync.as_std(),
            trainer_image: args.trainer_image,
            trainer_cuda_image: args.trainer_cuda_image,
            network_policies,
            ..Settings::default()
        },
        listen: args.listen,
        reads_per_second: args.status_reads_per_second,
        prices: Prices {
            within_zone_per_gb: args.price_within_zone_per_gb,
            cross_zone_per_gb: args.price_cross_zone_per_gb,
            cross_region_per_gb: args.price_cross_region_per_gb,
        },
        token_audiences: args.token_audiences,
        concurrency: args.concurrency,
        pod: args.pod_name.map(|name| PodName {
            namespace: args.lease_namespace.clone(),
            name,
        }),
        lease: args.leader_election.then(|| LeaseOptions {
            namespace: args.lease_namespace,
            name: args.lease_name,
            duration: std::time::Duration::from_secs(15),
        }),
        instance: identity,
        crd_wait: args.crd_wait.as_std(),
    };
    let runtime = tokio::runtime::Runtime::new().map_err(CliError::Output)?;
    runtime
        .block_on(kube::run(options))
        .map_err(|e| CliError::Operator(OperatorCliError::Operator(e)))
}
