//! The objects a job owns, built from its spec (pure): a pod per member attempt, a headless
//! Service for stable member DNS, the peer-key Secret, the topology ConfigMap, the
//! PodDisruptionBudget and (optionally) the NetworkPolicy.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, HTTPGetAction,
    KeyToPath, PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec, Probe,
    ResourceRequirements, SeccompProfile, SecretVolumeSource, SecurityContext, Service,
    ServicePort, ServiceSpec, TopologySpreadConstraint, Volume, VolumeMount,
};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;
use murmur_core::api::{
    Backend, CheckpointVolumeKind, DEFAULT_TRAINER_CUDA_IMAGE, DEFAULT_TRAINER_IMAGE,
    DecentralizedTrainingJob, TopologyKind,
};
use murmur_core::contract::{TERMINATION_LOG, TrainerEnv, env};
use murmur_core::topology::MemberId;

pub use super::labels::{
    ANNOTATION_CAPACITY, LABEL_ATTEMPT, LABEL_CLIQUE, LABEL_JOB, LABEL_MEMBER,
};
use super::labels::{MANAGED_BY, MANAGER, ZONE_LABEL};
use super::{scheduling, template};

pub const PEER_PORT: i32 = 7070;
pub const STATUS_PORT: i32 = 7071;
pub use murmur_core::api::pod_template::{CHECKPOINT_DIR, KEY_DIR, TERMINATION_MESSAGE_PATH};
pub const KEY_ITEM: &str = "key";
/// Spot notices give at most 30 s; the trainer leaves at a round boundary and checkpoints in it.
pub const TERMINATION_GRACE_SECONDS: i64 = 30;
/// The non-root user the trainer image runs as (distroless `nonroot`).
pub const TRAINER_UID: i64 = 65_532;

/// ConfigMap keys: the document trainers follow, the planner's memory, the join reports.
pub use crate::driver::memory::{JOINS_KEY, STATE_KEY, TOPOLOGY_KEY};
/// Secret key holding the job's HMAC key (hex).
pub const SECRET_KEY: &str = "peer-key";

pub fn service_name(job: &str) -> String {
    format!("{job}-peers")
}
pub fn secret_name(job: &str) -> String {
    format!("{job}-peer-key")
}
pub fn network_policy_name(job: &str) -> String {
    format!("{job}-trainers")
}
pub fn disruption_budget_name(job: &str) -> String {
    format!("{job}-members")
}
pub fn config_map_name(job: &str) -> String {
    format!("{job}-topology")
}
pub fn pod_name(job: &str, member: MemberId, attempt: u32) -> String {
    format!("{job}-{member}-{attempt}")
}
/// Each attempt its own hostname (so its own DNS name): a terminating attempt and its
/// replacement never share one.
fn hostname(member: MemberId, attempt: u32) -> String {
    format!("member-{member}-{attempt}")
}

/// What the operator decides once for all jobs.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Server-side apply field manager.
    pub field_manager: String,
    /// Base URL trainers post to and follow their views from (the operator's Service).
    pub control_endpoint: String,
    pub cluster_domain: String,
    /// A node NotReady this long counts as lost: its members are preempted and replaced.
    pub node_lost_after: std::time::Duration,
    /// A pod the operator created, missing from its cache, is awaited this long at most before
    /// it counts as deleted. The wait ends sooner when the watch shows the pod or a re-list of
    /// pods begun after the create was answered lacks it, so this is only a backstop: a watch
    /// down after an API server restart stays behind for tens of seconds (client-go's
    /// expectations wait 5 minutes too).
    pub creation_grace: std::time::Duration,
    /// Re-plan at least this often (progress in the status, node timeouts).
    pub resync: std::time::Duration,
    /// A reconcile waits this long after it is asked for before it reads the caches, so what
    /// arrives together is handled together; a job's reconciles are at least this far apart.
    pub min_reconcile_interval: std::time::Duration,
    /// Images for jobs that name none, by backend.
    pub trainer_image: String,
    pub trainer_cuda_image: String,
    /// Give each job a NetworkPolicy fencing its trainers in (None: none).
    pub network_policies: Option<NetworkPolicySettings>,
}

/// Where the peers a trainer may reach besides its own job's live.
#[derive(Clone, Debug, PartialEq)]
pub struct NetworkPolicySettings {
    /// The operator's namespace: its control endpoint, and where status polls come from.
    pub operator_namespace: String,
    /// The port the operator listens on (its pods', behind its Service).
    pub operator_port: i32,
    /// Where cluster DNS runs.
    pub dns_namespace: String,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            field_manager: MANAGER.into(),
            control_endpoint: "http://murmur-operator.murmur-system.svc:8470".into(),
            cluster_domain: "cluster.local".into(),
            node_lost_after: std::time::Duration::from_secs(60),
            creation_grace: std::time::Duration::from_secs(300),
            resync: std::time::Duration::from_secs(30),
            min_reconcile_interval: std::time::Duration::from_millis(500),
            trainer_image: DEFAULT_TRAINER_IMAGE.into(),
            trainer_cuda_image: DEFAULT_TRAINER_CUDA_IMAGE.into(),
            network_policies: None,
        }
    }
}

/// Member attempts' peer addresses: each one's DNS name under the job's headless Service, the
/// common part formatted once (a reconcile formats every member's, 10 000 in a large job).
pub struct MemberAddresses {
    /// Everything after the pod's hostname.
    domain: String,
}

impl MemberAddresses {
    pub fn new(job: &DecentralizedTrainingJob, s: &Settings) -> Self {
        let domain = format!(
            ".{}.{}.svc.{}:{PEER_PORT}",
            service_name(&name(job)),
            namespace(job),
            s.cluster_domain
        );
        Self { domain }
    }

    pub fn of(&self, member: MemberId, attempt: u32) -> String {
        format!("{}{}", hostname(member, attempt), self.domain)
    }
}

pub fn name(job: &DecentralizedTrainingJob) -> String {
    job.metadata.name.clone().unwrap_or_default()
}
pub fn namespace(job: &DecentralizedTrainingJob) -> String {
    job.metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into())
}

fn owner(job: &DecentralizedTrainingJob) -> OwnerReference {
    job.controller_owner_ref(&())
        .expect("a job read from the API server has a name and uid")
}

fn labels(job: &DecentralizedTrainingJob, component: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY.into(), MANAGER.into()),
        ("app.kubernetes.io/name".into(), "murmur".into()),
        ("app.kubernetes.io/component".into(), component.into()),
        ("app.kubernetes.io/instance".into(), name(job)),
        (LABEL_JOB.into(), name(job)),
    ])
}

fn meta(job: &DecentralizedTrainingJob, name: String, component: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(namespace(job)),
        labels: Some(labels(job, component)),
        owner_references: Some(vec![owner(job)]),
        ..Default::default()
    }
}

/// Headless, and publishing not-ready members: a member's neighbours must reach it while it
/// joins (before its readiness probe passes).
pub fn service(job: &DecentralizedTrainingJob) -> Service {
    Service {
        metadata: meta(job, service_name(&name(job)), "peers"),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            publish_not_ready_addresses: Some(true),
            selector: Some(BTreeMap::from([
                (LABEL_JOB.into(), name(job)),
                (MANAGED_BY.into(), MANAGER.into()),
            ])),
            ports: Some(vec![
                ServicePort {
                    name: Some("peer".into()),
                    port: PEER_PORT,
                    target_port: Some(IntOrString::Int(PEER_PORT)),
                    ..Default::default()
                },
                ServicePort {
                    name: Some("status".into()),
                    port: STATUS_PORT,
                    target_port: Some(IntOrString::Int(STATUS_PORT)),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn secret(job: &DecentralizedTrainingJob, key_hex: &str) -> k8s_openapi::api::core::v1::Secret {
    k8s_openapi::api::core::v1::Secret {
        metadata: meta(job, secret_name(&name(job)), "peer-key"),
        type_: Some("Opaque".into()),
        immutable: Some(true),
        data: Some(BTreeMap::from([(
            SECRET_KEY.into(),
            ByteString(key_hex.as_bytes().to_vec()),
        )])),
        ..Default::default()
    }
}

pub use crate::driver::memory::PLAIN_BYTES as CONFIG_MAP_PLAIN_BYTES;
use crate::driver::memory::plain_bytes;

/// Suffix of a gzipped key in `binaryData`.
const GZIP_SUFFIX: &str = ".gz";

/// The job's memory as its ConfigMap: plain while small, gzipped past
/// [`CONFIG_MAP_PLAIN_BYTES`].
pub fn config_map(job: &DecentralizedTrainingJob, data: BTreeMap<String, String>) -> ConfigMap {
    let (data, binary_data) = if plain_bytes(&data) <= CONFIG_MAP_PLAIN_BYTES {
        (Some(data), None)
    } else {
        let packed = data
            .into_iter()
            .map(|(key, text)| (format!("{key}{GZIP_SUFFIX}"), ByteString(gzip(&text))))
            .collect();
        (None, Some(packed))
    };
    ConfigMap {
        metadata: meta(job, config_map_name(&name(job)), "topology"),
        data,
        binary_data,
        ..Default::default()
    }
}

/// What [`config_map`] stored, as plain text by key; a gzipped key that does not inflate to
/// UTF-8 is named.
pub fn config_map_data(cm: &ConfigMap) -> Result<BTreeMap<String, String>, (String, String)> {
    let mut data = cm.data.clone().unwrap_or_default();
    for (key, bytes) in cm.binary_data.iter().flatten() {
        let Some(plain_key) = key.strip_suffix(GZIP_SUFFIX) else {
            continue;
        };
        let text = gunzip(&bytes.0).map_err(|e| (key.clone(), e))?;
        data.insert(plain_key.to_string(), text);
    }
    Ok(data)
}

/// zlib's default level: for a 10 000-member memory it packs within 0.3% of the best level
/// (658 929 against 657 199 bytes) in 72 ms less a write; the fastest level took 771 352.
fn gzip(text: &str) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder
        .write_all(text.as_bytes())
        .and_then(|()| encoder.finish())
        .expect("gzip into memory")
}

fn gunzip(bytes: &[u8]) -> Result<String, String> {
    use std::io::Read;
    let mut text = String::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_string(&mut text)
        .map_err(|e| format!("not gzipped UTF-8: {e}"))?;
    Ok(text)
}

/// The job's trainers accept their own job's members on the peer port and the operator's
/// namespace on the status port, and reach only their own job's peer ports, the operator's
/// control endpoint and DNS. (A trainer of another job could not authenticate anyway: this keeps
/// it, or anything else in the cluster, from even connecting.)
pub fn network_policy(job: &DecentralizedTrainingJob, n: &NetworkPolicySettings) -> NetworkPolicy {
    let trainers = LabelSelector {
        match_labels: Some(BTreeMap::from([
            (LABEL_JOB.into(), name(job)),
            (MANAGED_BY.into(), MANAGER.into()),
        ])),
        ..Default::default()
    };
    let namespace = |ns: &str| NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                "kubernetes.io/metadata.name".into(),
                ns.into(),
            )])),
            ..Default::default()
        }),
        ..Default::default()
    };
    let same_job = NetworkPolicyPeer {
        pod_selector: Some(trainers.clone()),
        ..Default::default()
    };
    let port = |port: i32, protocol: &str| NetworkPolicyPort {
        port: Some(IntOrString::Int(port)),
        protocol: Some(protocol.into()),
        ..Default::default()
    };
    NetworkPolicy {
        metadata: meta(job, network_policy_name(&name(job)), "network-policy"),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(trainers),
            policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
            ingress: Some(vec![
                NetworkPolicyIngressRule {
                    from: Some(vec![same_job.clone()]),
                    ports: Some(vec![port(PEER_PORT, "TCP")]),
                },
                NetworkPolicyIngressRule {
                    from: Some(vec![namespace(&n.operator_namespace)]),
                    ports: Some(vec![port(STATUS_PORT, "TCP")]),
                },
            ]),
            egress: Some(vec![
                NetworkPolicyEgressRule {
                    to: Some(vec![same_job]),
                    ports: Some(vec![port(PEER_PORT, "TCP")]),
                },
                NetworkPolicyEgressRule {
                    to: Some(vec![namespace(&n.operator_namespace)]),
                    ports: Some(vec![port(n.operator_port, "TCP")]),
                },
                NetworkPolicyEgressRule {
                    to: Some(vec![namespace(&n.dns_namespace)]),
                    ports: Some(vec![port(53, "UDP"), port(53, "TCP")]),
                },
            ]),
        }),
    }
}

/// How many of a job's members voluntary disruptions (a drain, an autoscaler's consolidation,
/// an eviction) may take at once: the headroom between `replicas.target` and `replicas.min`, so
/// a drain never takes the job below what it needs to train. At least one: a budget of zero
/// would block every drain of a node that runs a member, and murmur replaces members anyway.
pub fn disruption_headroom(job: &DecentralizedTrainingJob) -> u32 {
    let replicas = &job.spec.replicas;
    replicas.target.saturating_sub(replicas.min).max(1)
}

/// The job's PodDisruptionBudget. It says `minAvailable` (target − headroom), not
/// `maxUnavailable`: the disruption controller can apply `maxUnavailable` only to pods whose
/// owner has a scale subresource, and allows no disruption at all otherwise.
pub fn disruption_budget(job: &DecentralizedTrainingJob) -> PodDisruptionBudget {
    let available = job
        .spec
        .replicas
        .target
        .saturating_sub(disruption_headroom(job));
    PodDisruptionBudget {
        metadata: meta(job, disruption_budget_name(&name(job)), "disruption-budget"),
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(
                i32::try_from(available).unwrap_or(i32::MAX),
            )),
            selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([
                    (LABEL_JOB.into(), name(job)),
                    (MANAGED_BY.into(), MANAGER.into()),
                ])),
                ..Default::default()
            }),
            // A member that is not Ready (still pulling, still joining) never holds up a drain.
            unhealthy_pod_eviction_policy: Some("AlwaysAllow".into()),
            ..Default::default()
        }),
        status: None,
    }
}

/// The image a job's trainers run: the spec's, else the one the job started with (its status
/// keeps it), else this operator's default for the backend.
pub fn trainer_image(job: &DecentralizedTrainingJob, s: &Settings) -> String {
    let spec = &job.spec;
    let pinned = job.status.as_ref().and_then(|st| st.trainer_image.clone());
    match (&spec.trainer.image, pinned, spec.trainer.backend) {
        (Some(image), _, _) => image.clone(),
        (None, Some(pinned), _) => pinned,
        (None, None, Backend::Cpu) => s.trainer_image.clone(),
        (None, None, Backend::Cuda) => s.trainer_cuda_image.clone(),
    }
}

/// One attempt of one member.
pub struct MemberPod<'a> {
    pub job: &'a DecentralizedTrainingJob,
    pub member: MemberId,
    pub attempt: u32,
    pub on_demand: bool,
    /// Its clique in the current topology, when it has one (a replacement).
    pub clique: Option<u32>,
    /// The zone that clique trains in, when the topology knows it.
    pub zone: Option<&'a str>,
}

pub fn pod(p: &MemberPod, s: &Settings) -> Pod {
    let job = p.job;
    let spec = &job.spec;
    let job_name = name(job);
    let (volumes, mounts) = volumes(job);
    let sched = template::scheduling(spec);
    let mut placement = scheduling::placement(&sched, p.on_demand);
    if let Some(clique) = p.clique
        && spec.scheduling.zone_aware()
    {
        // A replacement joins its clique's zone when it can: clique traffic stays in the zone.
        placement.affinity = Some(scheduling::prefer_clique_zone(
            placement.affinity,
            [
                (LABEL_JOB.to_string(), job_name.clone()),
                (LABEL_CLIQUE.to_string(), clique.to_string()),
            ],
            p.zone,
        ));
    }
    let zone_aware = sched.zone_aware()
        && matches!(
            spec.topology.kind,
            TopologyKind::DCliques | TopologyKind::ProxyClumps
        );
    let mut pod = Pod {
        metadata: pod_metadata(p),
        spec: Some(PodSpec {
            hostname: Some(hostname(p.member, p.attempt)),
            subdomain: Some(service_name(&job_name)),
            restart_policy: Some("Never".into()),
            termination_grace_period_seconds: Some(TERMINATION_GRACE_SECONDS),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            containers: vec![trainer_container(p, s, mounts)],
            volumes: Some(volumes),
            node_selector: (!sched.node_selector.is_empty()).then(|| sched.node_selector.clone()),
            affinity: placement.affinity,
            // Zone-aware cliques form inside zones, and an uneven split (11 and 9 members for
            // cliques of 5) forces a clique across: ask the scheduler to keep the zones even,
            // softly, so that spot capacity in one zone still takes what the other lacks.
            topology_spread_constraints: zone_aware.then(|| {
                vec![TopologySpreadConstraint {
                    max_skew: 1,
                    topology_key: ZONE_LABEL.into(),
                    when_unsatisfiable: "ScheduleAnyway".into(),
                    label_selector: Some(LabelSelector {
                        match_labels: Some(BTreeMap::from([(
                            LABEL_JOB.to_string(),
                            job_name.clone(),
                        )])),
                        match_expressions: None,
                    }),
                    ..Default::default()
                }]
            }),
            tolerations: (!placement.tolerations.is_empty()).then_some(placement.tolerations),
            priority_class_name: sched.priority_class_name,
            scheduler_name: sched.scheduler_name,
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(TRAINER_UID),
                run_as_group: Some(TRAINER_UID),
                fs_group: Some(TRAINER_UID),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    localhost_profile: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    };
    if let Some(t) = &spec.trainer.pod_template {
        template::merge(&mut pod, t);
    }
    pod
}

/// The pod's name, its member, attempt and clique labels, its capacity annotation, and its
/// Kueue pod group if the job names a queue.
fn pod_metadata(p: &MemberPod) -> ObjectMeta {
    let job_name = name(p.job);
    let mut metadata = meta(p.job, pod_name(&job_name, p.member, p.attempt), "trainer");
    let labels = metadata.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(LABEL_MEMBER.into(), p.member.to_string());
    labels.insert(LABEL_ATTEMPT.into(), p.attempt.to_string());
    if let Some(c) = p.clique {
        labels.insert(LABEL_CLIQUE.into(), c.to_string());
    }
    metadata.annotations = Some(BTreeMap::from([(
        ANNOTATION_CAPACITY.into(),
        if p.on_demand { "on-demand" } else { "spot" }.to_string(),
    )]));
    super::kueue::join_pod_group(p.job, &mut metadata);
    metadata
}

/// The trainer's environment: the user's variables, then the contract (whose `MURMUR_*`
/// names are murmur's alone) and where to write the termination message.
fn trainer_env(p: &MemberPod, s: &Settings) -> Vec<EnvVar> {
    let spec = &p.job.spec;
    let contract = TrainerEnv {
        job: name(p.job),
        namespace: namespace(p.job),
        member_id: p.member,
        attempt: p.attempt,
        listen_address: format!("0.0.0.0:{PEER_PORT}"),
        status_address: format!("0.0.0.0:{STATUS_PORT}"),
        control_endpoint: Some(s.control_endpoint.clone()),
        peer_key_file: format!("{KEY_DIR}/{KEY_ITEM}").into(),
        topology_file: None,
        checkpoint_dir: spec.checkpoint.as_ref().map(|_| CHECKPOINT_DIR.into()),
        output_dir: None,
        backend: spec.trainer.backend,
        job_spec: Some(spec.for_trainer()),
    };
    let mut env: Vec<EnvVar> = spec
        .trainer
        .env
        .iter()
        .filter(|e| !env::is_murmurs(&e.name))
        .cloned()
        .collect();
    env.extend(contract.to_vars().into_iter().map(|(k, v)| EnvVar {
        name: k.into(),
        value: Some(v),
        value_from: None,
    }));
    env.push(EnvVar {
        name: TERMINATION_LOG.into(),
        value: Some(TERMINATION_MESSAGE_PATH.into()),
        value_from: None,
    });
    env
}

/// CPU and memory requested and limited alike; GPUs as `nvidia.com/gpu` limits.
fn trainer_resources(job: &DecentralizedTrainingJob) -> ResourceRequirements {
    let mut limits = BTreeMap::new();
    let mut requests = BTreeMap::new();
    if let Some(r) = &job.spec.trainer.resources {
        for (name, q) in [("cpu", &r.cpu), ("memory", &r.memory)] {
            if let Some(q) = q {
                requests.insert(name.to_string(), q.clone());
                limits.insert(name.to_string(), q.clone());
            }
        }
        if let Some(gpus) = r.gpus.filter(|&g| g > 0) {
            limits.insert("nvidia.com/gpu".into(), Quantity(gpus.to_string()));
        }
    }
    ResourceRequirements {
        limits: (!limits.is_empty()).then_some(limits),
        requests: (!requests.is_empty()).then_some(requests),
        ..Default::default()
    }
}

/// The peer key (read-only), a writable `/tmp` (the root filesystem is read-only) and the
/// checkpoint volume, with where the trainer mounts them.
fn volumes(job: &DecentralizedTrainingJob) -> (Vec<Volume>, Vec<VolumeMount>) {
    let mut mounts = vec![
        VolumeMount {
            name: "peer-key".into(),
            mount_path: KEY_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        },
        VolumeMount {
            name: "tmp".into(),
            mount_path: "/tmp".into(),
            ..Default::default()
        },
    ];
    let mut volumes = vec![
        Volume {
            name: "peer-key".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret_name(&name(job))),
                default_mode: Some(0o400),
                items: Some(vec![KeyToPath {
                    key: SECRET_KEY.into(),
                    path: KEY_ITEM.into(),
                    ..Default::default()
                }]),
                optional: Some(false),
                ..Default::default()
            }),
            ..Default::default()
        },
        Volume {
            name: "tmp".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        },
    ];
    if let Some(c) = &job.spec.checkpoint {
        mounts.push(VolumeMount {
            name: "checkpoints".into(),
            mount_path: CHECKPOINT_DIR.into(),
            ..Default::default()
        });
        volumes.push(Volume {
            name: "checkpoints".into(),
            empty_dir: (c.volume.kind == CheckpointVolumeKind::EmptyDir)
                .then(EmptyDirVolumeSource::default),
            persistent_volume_claim: c.volume.claim_name.clone().map(|claim_name| {
                PersistentVolumeClaimVolumeSource {
                    claim_name,
                    read_only: Some(false),
                }
            }),
            ..Default::default()
        });
    }
    (volumes, mounts)
}

/// The one container: the trainer image for the job's backend, its ports, probes, resources
/// and a restricted security context.
fn trainer_container(p: &MemberPod, s: &Settings, mounts: Vec<VolumeMount>) -> Container {
    let probe = |path: &str, period: i32, failures: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("status".into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Default::default()
    };
    let port = |name: &str, container_port| ContainerPort {
        name: Some(name.into()),
        container_port,
        protocol: Some("TCP".into()),
        ..Default::default()
    };
    Container {
        name: "trainer".into(),
        image: Some(trainer_image(p.job, s)),
        args: Some(vec!["run".into()]),
        env: Some(trainer_env(p, s)),
        ports: Some(vec![port("peer", PEER_PORT), port("status", STATUS_PORT)]),
        readiness_probe: Some(probe("/readyz", 5, 3)),
        // Generous: a trainer busy in a long step must not be killed for a slow answer.
        liveness_probe: Some(probe("/healthz", 20, 6)),
        resources: Some(trainer_resources(p.job)),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            allow_privilege_escalation: Some(false),
            privileged: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: None,
            }),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                localhost_profile: None,
            }),
            ..Default::default()
        }),
        termination_message_path: Some(TERMINATION_MESSAGE_PATH.into()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        volume_mounts: Some(mounts),
        ..Default::default()
    }
}
