//! `DecentralizedTrainingJob` (`murmur.dev/v1alpha1`): what a user asks for.
//!
//! Variants that carry parameters are flat objects (`{kind: dirichlet, alpha: 0.1}`) rather than
//! Rust enums with data: Kubernetes structural schemas cannot mix unit and struct variants, and a
//! flat object lets every CEL rule name the exact field it checks.
//!
//! Every rule here and in `scheduling`, `recovery` and `pod_template` is emitted into the CRD as
//! `x-kubernetes-validations` and evaluated by the same CEL engine when a manifest is loaded
//! outside a cluster (`api::manifest`).

use k8s_openapi::api::core::v1::EnvVar;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::duration::Duration;
use super::recovery::{CheckpointSpec, RecoverySpec};
use super::scheduling::SchedulingSpec;
use super::status::DecentralizedTrainingJobStatus;

pub const GROUP: &str = "murmur.dev";
pub const VERSION: &str = "v1alpha1";

// clippy reads the repeated `type_ = ...` inside separate printcolumn(...) entries as duplicates.
#[allow(clippy::duplicated_attributes)]
/// Spec of a decentralized training job: elastic members that average parameters only with
/// their neighbours in a communication graph, scheduled on spot capacity.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "murmur.dev",
    version = "v1alpha1",
    kind = "DecentralizedTrainingJob",
    plural = "decentralizedtrainingjobs",
    shortname = "dtj",
    category = "murmur",
    namespaced,
    status = "DecentralizedTrainingJobStatus",
    derive = "PartialEq",
    doc = "A decentralized (parameter-server-free) training job on spot capacity.",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Members",
        type_ = "string",
        json_path = ".status.memberSummary",
        description = "ready/target members"
    ),
    printcolumn(name = "Topology", type_ = "string", json_path = ".spec.topology.kind"),
    printcolumn(name = "Step", type_ = "integer", json_path = ".status.progress.step"),
    printcolumn(
        name = "Preemptions",
        type_ = "integer",
        json_path = ".status.preemptions"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    cel
)]
#[x_kube(
    validation = Rule::new("string(self.algorithm.averageEvery) != 'auto' || self.topology.kind != 'exponentialOnePeer'").message("algorithm.averageEvery auto does not apply to topology.kind exponentialOnePeer (one peer a round already)").field_path(".algorithm.averageEvery"),
    validation = Rule::new("self.algorithm.kind != 'cliqueAveraging' || self.topology.kind in ['dCliques', 'proxyClumps']").message("algorithm.kind cliqueAveraging needs topology.kind dCliques or proxyClumps").field_path(".algorithm.kind"),
    validation = Rule::new("self.trainer.backend != 'cuda' || (has(self.trainer.resources) && has(self.trainer.resources.gpus) && self.trainer.resources.gpus >= 1)").message("trainer.backend cuda needs trainer.resources.gpus >= 1").field_path(".trainer.backend"),
    validation = Rule::new("self.topology.kind != 'fullyConnected' || self.algorithm.kind == 'moshpit' || self.replicas.max <= 256").message("topology.kind fullyConnected takes at most 256 members (replicas.max): every member averages with every other, so each member's view and each round grow with the job; exponential, exponentialOnePeer and dCliques scale, and moshpit averages in groups whatever the topology").field_path(".replicas.max"),
    validation = Rule::new("!has(self.topology.cliqueSize) || self.topology.cliqueSize <= self.replicas.max").message("topology.cliqueSize must not exceed replicas.max").field_path(".topology.cliqueSize"),
    validation = Rule::new("!has(self.training.dataset) || self.training.dataset.source != 'text' || !(self.topology.kind in ['dCliques', 'proxyClumps'])").message("topology.kind dCliques and proxyClumps group members by the classes they hold, and training.dataset.source text has none").field_path(".topology.kind"),
    validation = Rule::new("!has(self.algorithm.outer) || !has(self.training.steps) || self.algorithm.outer.localSteps <= self.training.steps").message("algorithm.outer.localSteps must not exceed training.steps").field_path(".algorithm.outer.localSteps"),
)]
#[serde(rename_all = "camelCase")]
pub struct DecentralizedTrainingJobSpec {
    /// Elastic membership: training runs while at least `min` members are live.
    pub replicas: Replicas,
    /// Communication graph between members.
    #[serde(default)]
    pub topology: TopologySpec,
    /// How members average with their neighbours.
    #[serde(default)]
    pub algorithm: AlgorithmSpec,
    /// Model, data, partitioning, optimizer and stopping target.
    pub training: TrainingSpec,
    /// The trainer container.
    #[serde(default)]
    pub trainer: TrainerSpec,
    /// Where members run (spot, on-demand) and scheduler hints.
    #[serde(default)]
    pub scheduling: SchedulingSpec,
    /// Crash handling; preemptions never count here.
    #[serde(default)]
    pub recovery: RecoverySpec,
    /// Periodic checkpoints, used when every member is lost at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointSpec>,
    /// Remove all members and keep the status; resuming restarts from peers or the checkpoint.
    /// Honoured in every phase: a job suspended after a member reached the stopping target
    /// ends when resumed.
    #[serde(default)]
    pub suspend: bool,
    /// Delete the job this long after it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0").message("ttlSecondsAfterFinished must be >= 0"))]
    pub ttl_seconds_after_finished: Option<i64>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(
    validation = Rule::new("self.min >= 1").message("replicas.min must be >= 1").field_path(".min"),
    validation = Rule::new("self.min <= self.target && self.target <= self.max").message("replicas must satisfy min <= target <= max").field_path(".target"),
    validation = Rule::new("self.max <= 10000").message("replicas.max must be <= 10000").field_path(".max"),
)]
pub struct Replicas {
    pub min: u32,
    pub target: u32,
    pub max: u32,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[serde(rename_all = "camelCase")]
pub enum TopologyKind {
    #[default]
    Ring,
    FullyConnected,
    Exponential,
    /// One peer per round at distance 2^k in member order, k cycling (Ying et al. 2021): a round
    /// costs one message per member, and with n a power of two log2(n) rounds give the exact
    /// average. D-PSGD and clique averaging follow the schedule; gossip and Moshpit use the
    /// union graph (the exponential graph).
    ExponentialOnePeer,
    DCliques,
    ProxyClumps,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "camelCase")]
pub enum InterClique {
    Ring,
    #[default]
    SmallWorld,
    Fractal,
    FullyConnected,
}

/// proxyClumps: how a clique is composed from the clumps of similar members.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "camelCase")]
pub enum CliqueMix {
    /// One member from every clump: each clique sees every kind of data (the point of clumps).
    #[default]
    Heterogeneous,
    /// Cliques cut from one clump each, on the same ring of cliques of the same sizes: the
    /// control of the proxy-clumps paper (arXiv 2212.08743), for experiments.
    Homogeneous,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.cliqueSize) || self.cliqueSize >= 2").message("topology.cliqueSize must be >= 2").field_path(".cliqueSize"),
    validation = Rule::new("!has(self.clumps) || self.clumps >= 1").message("topology.clumps must be >= 1").field_path(".clumps"),
    validation = Rule::new("self.kind == 'dCliques' || !has(self.cliqueSize)").message("topology.cliqueSize applies only to kind dCliques").field_path(".kind"),
    validation = Rule::new("self.kind in ['dCliques', 'proxyClumps'] || !has(self.interClique)").message("topology.interClique applies only to kinds dCliques and proxyClumps").field_path(".kind"),
    validation = Rule::new("self.kind == 'proxyClumps' || (!has(self.clumps) && !has(self.cliqueMix))").message("topology.clumps and topology.cliqueMix apply only to kind proxyClumps").field_path(".kind"),
)]
pub struct TopologySpec {
    /// Graph family.
    #[x_kube(validation = Rule::new("self == oldSelf").message("topology.kind is immutable"))]
    pub kind: TopologyKind,
    /// dCliques: members per clique (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clique_size: Option<u32>,
    /// dCliques and proxyClumps: how cliques are linked (default smallWorld).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inter_clique: Option<InterClique>,
    /// proxyClumps: number of clumps (default ceil(log2 n)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clumps: Option<u32>,
    /// proxyClumps: heterogeneous cliques (default), or the homogeneous control.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clique_mix: Option<CliqueMix>,
}

impl TopologySpec {
    pub const DEFAULT_CLIQUE_SIZE: u32 = 10;
}

#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[serde(rename_all = "camelCase")]
pub enum AlgorithmKind {
    #[default]
    Dpsgd,
    Gossip,
    CliqueAveraging,
    Moshpit,
    /// Asynchronous gossip (AD-PSGD, Lian et al. 2018): no rounds. After each step a member
    /// sends its model to one neighbour and goes on; whoever receives it answers with its own
    /// model and both move halfway, so the pair's sum is kept. A slow or dead neighbour holds
    /// nobody up: its replies come late or never, and late ones are dropped.
    AsyncGossip,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("string(self.averageEvery) == 'auto' || string(self.averageEvery).matches('^[1-9][0-9]{0,8}$')").message("algorithm.averageEvery must be a whole number of steps from 1 to 999999999, or auto").field_path(".averageEvery"),
    validation = Rule::new("string(self.averageEvery) != 'auto' || self.kind in ['dpsgd', 'cliqueAveraging']").message("algorithm.averageEvery auto needs kind dpsgd or cliqueAveraging").field_path(".averageEvery"),
    validation = Rule::new("string(self.averageEvery) == 'auto' || !has(self.auto)").message("algorithm.auto applies only to averageEvery auto").field_path(".auto"),
    validation = Rule::new("!has(self.groupSize) || self.groupSize >= 2").message("algorithm.groupSize must be >= 2").field_path(".groupSize"),
    validation = Rule::new("self.kind == 'moshpit' || !has(self.groupSize)").message("algorithm.groupSize applies only to kind moshpit").field_path(".groupSize"),
    validation = Rule::new("!has(self.maxStaleness) || (self.maxStaleness >= 1 && self.maxStaleness <= 1000)").message("algorithm.maxStaleness must be from 1 to 1000").field_path(".maxStaleness"),
    validation = Rule::new("self.kind == 'asyncGossip' || !has(self.maxStaleness)").message("algorithm.maxStaleness applies only to kind asyncGossip").field_path(".maxStaleness"),
    validation = Rule::new("self.kind != 'asyncGossip' || !has(self.compression) || self.compression.kind != 'topK'").message("algorithm.compression topK does not apply to kind asyncGossip (requests and replies cross on different connections, so per-link estimates cannot stay in step): use int8 or fp16").field_path(".compression.kind"),
    validation = Rule::new("!has(self.outer) || self.kind != 'asyncGossip'").message("algorithm.outer does not apply to kind asyncGossip (it has no rounds)").field_path(".outer"),
    validation = Rule::new("!has(self.outer) || string(self.averageEvery) == '1'").message("algorithm.averageEvery does not apply with algorithm.outer (outer.localSteps sets the rounds)").field_path(".averageEvery"),
    validation = Rule::new("has(self.outer) == has(oldSelf.outer)").message("algorithm.outer is immutable").field_path(".outer"),
    validation = Rule::new("!has(self.overlap) || !self.overlap || self.kind != 'asyncGossip'").message("algorithm.overlap does not apply to kind asyncGossip (it never waits for a round)").field_path(".overlap"),
    validation = Rule::new("!has(self.overlap) || !self.overlap || string(self.averageEvery) != 'auto'").message("algorithm.overlap does not apply with averageEvery auto (the cadence scores a round before the next step)").field_path(".overlap"),
)]
pub struct AlgorithmSpec {
    #[x_kube(validation = Rule::new("self == oldSelf").message("algorithm.kind is immutable"))]
    pub kind: AlgorithmKind,
    /// Local steps between averaging rounds, or `auto`: each edge averages at its own pace, more
    /// often while a neighbour's model scores differently on local data, less while the two
    /// agree (D-PSGD and clique averaging).
    #[serde(default)]
    pub average_every: AverageEvery,
    /// averageEvery auto: its bounds and target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto: Option<AutoAverageSpec>,
    /// What is sent to neighbours.
    #[serde(default)]
    pub compression: CompressionSpec,
    /// A neighbour silent for this long is dropped for the round.
    #[serde(default = "default_round_timeout")]
    pub round_timeout: Duration,
    /// moshpit: members per averaging group (grid side).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_size: Option<u32>,
    /// asyncGossip: a neighbour's reply to a request older than this many of the requester's
    /// own steps is dropped, and the request given up (default 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_staleness: Option<u32>,
    /// Outer steps (DiLoCo, SlowMo): `localSteps` optimizer steps on local data, then one
    /// averaging round whose mix moves an anchor copy of the parameters by an outer optimizer
    /// step; the next local steps start from the anchor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("algorithm.outer is immutable"))]
    pub outer: Option<OuterSpec>,
    /// Exchange while computing. With `outer`, a round's payloads travel during the next
    /// `localSteps` and its mix is applied one round late, the local steps made meanwhile kept
    /// (Streaming DiLoCo's overlap); the run's last round is exchanged at once. Without,
    /// a round's parameters are sent before the step's gradient is computed and mixed after it
    /// (D-PSGD's original order: x ← Σ W x − η·∇f(x)). Replacements take a change mid-run.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub overlap: bool,
}

impl AlgorithmSpec {
    /// Moshpit's grid side when `groupSize` is not set.
    pub const DEFAULT_GROUP_SIZE: u32 = 4;
    /// asyncGossip's staleness bound when `maxStaleness` is not set.
    pub const DEFAULT_MAX_STALENESS: u32 = 8;

    pub fn max_staleness(&self) -> u64 {
        u64::from(self.max_staleness.unwrap_or(Self::DEFAULT_MAX_STALENESS))
    }

    pub fn group_size(&self) -> usize {
        self.group_size.unwrap_or(Self::DEFAULT_GROUP_SIZE) as usize
    }
}

fn default_round_timeout() -> Duration {
    Duration::from_secs(5)
}

impl Default for AlgorithmSpec {
    fn default() -> Self {
        Self {
            kind: AlgorithmKind::default(),
            average_every: AverageEvery::default(),
            auto: None,
            compression: CompressionSpec::default(),
            round_timeout: default_round_timeout(),
            group_size: None,
            max_staleness: None,
            outer: None,
            overlap: false,
        }
    }
}

/// `averageEvery`: a number of steps, or `auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AverageEvery {
    Steps(u32),
    Auto,
}

impl Default for AverageEvery {
    fn default() -> Self {
        AverageEvery::Steps(1)
    }
}

impl Serialize for AverageEvery {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            AverageEvery::Steps(n) => s.serialize_u32(*n),
            AverageEvery::Auto => s.serialize_str("auto"),
        }
    }
}

impl<'de> Deserialize<'de> for AverageEvery {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        const EXPECTED: &str = "a number of steps (1 or more) or \"auto\"";
        impl serde::de::Visitor<'_> for Visitor {
            type Value = AverageEvery;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(EXPECTED)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
                // 0 decodes, so that the CRD's rule refuses it with the API server's message.
                u32::try_from(v)
                    .ok()
                    .map(AverageEvery::Steps)
                    .ok_or_else(|| E::custom(format!("{v} is not {EXPECTED}")))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::custom(format!("{v} is not {EXPECTED}"))),
                }
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                // The CRD's rule accepts a number written as a string, so this does too.
                match v {
                    "auto" => Ok(AverageEvery::Auto),
                    _ => match v.parse::<u64>() {
                        Ok(n) => self.visit_u64(n),
                        Err(_) => Err(E::custom(format!("{v:?} is not {EXPECTED}"))),
                    },
                }
            }
        }
        d.deserialize_any(Visitor)
    }
}

impl JsonSchema for AverageEvery {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "AverageEvery".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        // The one union a structural schema allows; the values are checked by the CEL rule on
        // the algorithm.
        schemars::json_schema!({
            "x-kubernetes-int-or-string": true,
            // kube marks optional int-or-string fields nullable; a null here would keep the
            // API server from applying the default.
            "nullable": false,
            "default": 1,
            "description": "Local steps between averaging rounds (1 or more), or auto."
        })
    }
}

/// `algorithm.auto`: how `averageEvery: auto` paces each edge.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.maxEvery) || (self.maxEvery >= 1 && self.maxEvery <= 1000)").message("algorithm.auto.maxEvery must be from 1 to 1000").field_path(".maxEvery"),
    validation = Rule::new("!has(self.targetSkew) || (self.targetSkew > 0.0 && self.targetSkew <= 10.0)").message("algorithm.auto.targetSkew must be in (0, 10]").field_path(".targetSkew"),
)]
pub struct AutoAverageSpec {
    /// The longest gap, in steps, between two averagings on one edge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_every: Option<u32>,
    /// The loss gap |L(x_j) − L(x_i)|, in nats on the deciding member's mini-batch, that two
    /// neighbours' models should reach by each averaging: their edge's gap is the one predicted
    /// to end there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_skew: Option<f64>,
}

/// `algorithm.outer`: the outer optimizer and how many local steps it waits for.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.localSteps >= 1 && self.localSteps <= 100000").message("algorithm.outer.localSteps must be from 1 to 100000").field_path(".localSteps"),
    validation = Rule::new("!has(self.learningRate) || (self.learningRate > 0.0 && self.learningRate <= 10.0)").message("algorithm.outer.learningRate must be in (0, 10]").field_path(".learningRate"),
    validation = Rule::new("!has(self.momentum) || (self.momentum >= 0.0 && self.momentum < 1.0)").message("algorithm.outer.momentum must be in [0, 1)").field_path(".momentum"),
    validation = Rule::new("!has(self.overlapSteps) || (self.overlapSteps >= 1 && self.overlapSteps <= self.localSteps)").message("algorithm.outer.overlapSteps must be from 1 to localSteps").field_path(".overlapSteps"),
)]
pub struct OuterSpec {
    /// Optimizer steps on local data between two outer steps.
    pub local_steps: u32,
    /// The outer optimizer: `nesterov` (DiLoCo's) or `sgd` with heavy-ball momentum (SlowMo's).
    #[serde(default)]
    pub optimizer: OuterOptimizerKind,
    /// The outer learning rate (default 0.7, DiLoCo's). With `sgd`, 1 and momentum 0 (and SGD
    /// without momentum inside), an outer step is plain averaging every `localSteps` steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learning_rate: Option<f64>,
    /// The outer momentum (default 0.9).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub momentum: Option<f64>,
    /// With `algorithm.overlap`: the local steps a round's exchange runs beside before its mix
    /// is applied (default 1). `localSteps` delays it a whole round, as Streaming DiLoCo's
    /// overlap does; on the D-Cliques example that cost 2 points, and 1 cost 0.3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap_steps: Option<u32>,
}

impl OuterSpec {
    pub const DEFAULT_LEARNING_RATE: f64 = 0.7;
    pub const DEFAULT_MOMENTUM: f64 = 0.9;

    pub fn learning_rate(&self) -> f64 {
        self.learning_rate.unwrap_or(Self::DEFAULT_LEARNING_RATE)
    }

    pub fn momentum(&self) -> f64 {
        self.momentum.unwrap_or(Self::DEFAULT_MOMENTUM)
    }

    pub fn overlap_steps(&self) -> u64 {
        u64::from(
            self.overlap_steps
                .unwrap_or(1)
                .clamp(1, self.local_steps.max(1)),
        )
    }
}

#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[serde(rename_all = "camelCase")]
pub enum OuterOptimizerKind {
    /// Nesterov momentum (DiLoCo).
    #[default]
    Nesterov,
    /// Heavy-ball momentum (SlowMo).
    Sgd,
}

impl AutoAverageSpec {
    pub const DEFAULT_MAX_EVERY: u32 = 16;
    /// Chosen by measurement (docs/claims.md, "Adaptive averaging"): equal accuracy on the D-Cliques
    /// example at 0.001; 0.003 already cost up to 0.2 points.
    pub const DEFAULT_TARGET_SKEW: f64 = 0.001;
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[serde(rename_all = "camelCase")]
pub enum CompressionKind {
    #[default]
    None,
    Fp16,
    Int8,
    /// 4-bit values with a scale per 256, error feedback as int8: an eighth of f32's bytes.
    Int4,
    TopK,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[x_kube(
    validation = Rule::new("self.kind != 'topK' || has(self.ratio)").message("compression.ratio is required for kind topK").field_path(".ratio"),
    validation = Rule::new("self.kind == 'topK' || !has(self.ratio)").message("compression.ratio applies only to kind topK").field_path(".ratio"),
    validation = Rule::new("!has(self.ratio) || (self.ratio > 0.0 && self.ratio <= 1.0)").message("compression.ratio must be in (0, 1]").field_path(".ratio"),
)]
pub struct CompressionSpec {
    pub kind: CompressionKind,
    /// topK: fraction of coordinates sent each round, in (0, 1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
}

#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[serde(rename_all = "camelCase")]
pub enum ModelKind {
    #[cfg_attr(
        feature = "cli",
        value(name = "logistic", alias = "logistic-regression")
    )]
    LogisticRegression,
    #[default]
    Mlp,
    GnLenet,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.steps) != has(self.epochs)").message("set exactly one of training.steps or training.epochs").field_path(".steps"),
    validation = Rule::new("!has(self.steps) || self.steps >= 1").message("training.steps must be >= 1").field_path(".steps"),
    validation = Rule::new("!has(self.epochs) || self.epochs >= 1").message("training.epochs must be >= 1").field_path(".epochs"),
    validation = Rule::new("self.batchSize >= 1 && self.batchSize <= 65536").message("training.batchSize must be in [1, 65536]").field_path(".batchSize"),
    validation = Rule::new("self.learningRate > 0.0 && self.learningRate <= 10.0").message("training.learningRate must be in (0, 10]").field_path(".learningRate"),
    validation = Rule::new("self.model != 'gnLenet' || !has(self.dataset) || !has(self.dataset.shape) || self.dataset.shape == [28, 28] || self.dataset.shape == [1, 28, 28]").message("training.model gnLenet reads 28x28 images: training.dataset.shape must be [28, 28] (or use logisticRegression or mlp, which take any shape)").field_path(".dataset.shape"),
    validation = Rule::new("!has(self.dataset) || self.dataset.source != 'text' || self.partition.kind == 'iid'").message("training.partition: shards, dirichlet and classesPerMember deal examples out by class, and training.dataset.source text has none: use iid").field_path(".partition.kind"),
)]
pub struct TrainingSpec {
    /// The built-in model. A trainer of a task of its own (`trainer.image`) ignores it.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message("training.model is immutable"))]
    pub model: ModelKind,
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message("training.dataset is immutable"))]
    pub dataset: DatasetSpec,
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message("training.partition is immutable"))]
    pub partition: PartitionSpec,
    /// Seeds partitioning, initialisation and sampling, so members never move data.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message("training.seed is immutable"))]
    pub seed: u64,
    #[serde(default = "default_batch_size")]
    pub batch_size: u32,
    #[serde(default)]
    pub optimizer: OptimizerSpec,
    #[serde(default = "default_learning_rate")]
    pub learning_rate: f64,
    /// Stop after this many local steps per member...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<u64>,
    /// ...or after this many passes over each member's shard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epochs: Option<u32>,
}

fn default_batch_size() -> u32 {
    32
}
fn default_learning_rate() -> f64 {
    0.05
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[serde(rename_all = "camelCase")]
pub enum DatasetSource {
    /// The MNIST sample compiled into the trainer (5 000 images).
    #[default]
    Embedded,
    /// IDX files (plain or gzip) in `path`: MNIST's, or examples of any `shape`.
    Idx,
    /// CSV files in `path`: per line a label, then the example's values (784 pixels for MNIST, or
    /// as many as `shape` holds).
    Csv,
    /// A class-per-folder tree of PNG or JPEG images in `path` (`<class>/<image>`), for a
    /// trainer of a task of its own (the built-in models read MNIST: embedded, idx or csv).
    ImageFolder,
    /// UTF-8 text for next-token tasks: the file `path`, or the files in the directory `path`
    /// (name order, links skipped), for a trainer of a task of its own. Text has no classes, so partitions are iid
    /// and topologies are not built from classes.
    Text,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[x_kube(
    validation = Rule::new("!has(self.shape) || self.source in ['idx', 'csv']").message("training.dataset.shape applies to idx and csv files (the others carry their own)").field_path(".shape"),
    validation = Rule::new("!has(self.shape) || (size(self.shape) >= 1 && size(self.shape) <= 4 && self.shape.all(d, d >= 1))").message("training.dataset.shape must have 1 to 4 dimensions, each at least 1").field_path(".shape"),
    validation = Rule::new("self.source == 'embedded' || (has(self.path) && self.path != '')").message("training.dataset.path is required unless source is embedded").field_path(".path"),
    validation = Rule::new("self.source != 'embedded' || !has(self.path)").message("training.dataset.path does not apply to the embedded dataset").field_path(".path"),
)]
pub struct DatasetSpec {
    pub source: DatasetSource,
    /// Directory on a mounted volume holding the files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub path: Option<String>,
    /// One example's shape, for idx and csv files: `[28, 28]` (MNIST, the default), `[3, 32, 32]`
    /// (RGB images), `[13]` (a row of features). The files are checked against it. The built-in
    /// models take any shape, flattened, except `gnLenet`, which reads 28×28 images.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4))]
    pub shape: Option<Vec<u32>>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[serde(rename_all = "camelCase")]
pub enum PartitionKind {
    #[default]
    Iid,
    Shards,
    Dirichlet,
    ClassesPerMember,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.kind != 'shards' || (has(self.perMember) && self.perMember >= 1)").message("partition.perMember >= 1 is required for kind shards").field_path(".perMember"),
    validation = Rule::new("self.kind != 'dirichlet' || (has(self.alpha) && self.alpha > 0.0)").message("partition.alpha > 0 is required for kind dirichlet").field_path(".alpha"),
    validation = Rule::new("self.kind != 'classesPerMember' || (has(self.k) && self.k >= 1)").message("partition.k >= 1 is required for kind classesPerMember").field_path(".k"),
    validation = Rule::new("(self.kind == 'shards') == has(self.perMember) && (self.kind == 'dirichlet') == has(self.alpha) && (self.kind == 'classesPerMember') == has(self.k)").message("partition fields must match partition.kind (shards: perMember, dirichlet: alpha, classesPerMember: k)").field_path(".kind"),
)]
pub struct PartitionSpec {
    pub kind: PartitionKind,
    /// shards: shards of sorted data per member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_member: Option<u32>,
    /// dirichlet: concentration; smaller is more skewed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alpha: Option<f64>,
    /// classesPerMember: distinct classes per member (1 is the D-Cliques setting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k: Option<u32>,
}

#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[serde(rename_all = "camelCase")]
pub enum OptimizerKind {
    #[default]
    Sgd,
    Adam,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[x_kube(
    validation = Rule::new("!has(self.momentum) || (self.momentum >= 0.0 && self.momentum < 1.0)").message("optimizer.momentum must be in [0, 1)").field_path(".momentum"),
    validation = Rule::new("self.kind == 'sgd' || !has(self.momentum)").message("optimizer.momentum applies only to kind sgd").field_path(".momentum"),
)]
pub struct OptimizerSpec {
    pub kind: OptimizerKind,
    /// sgd: momentum coefficient (default 0.9).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub momentum: Option<f64>,
}

#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[serde(rename_all = "camelCase")]
pub enum Backend {
    #[default]
    Cpu,
    Cuda,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TrainerSpec {
    /// The trainer image. Default: the operator's (`--trainer-image`, or `--trainer-cuda-image`
    /// for the cuda backend; the chart's `trainer.image` and `trainer.cudaImage`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<TrainerResources>,
    /// Extra environment for the trainer container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    #[serde(default)]
    pub backend: Backend,
    /// What the members' pods get besides murmur's own: labels and annotations, volumes, the
    /// trainer container's mounts, env, envFrom and resources, placement, service account,
    /// pull secrets, security context, init and sidecar containers. The operator only;
    /// `murmur run` takes its env and its hostPath volumes mounted at their own path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template: Option<super::pod_template::PodTemplate>,
}

/// The operator's default trainer images; images/trainer.Dockerfile builds them, the chart
/// passes its own.
pub const DEFAULT_TRAINER_IMAGE: &str = "ghcr.io/murmur-dev/murmur-trainer:0.1.0";
pub const DEFAULT_TRAINER_CUDA_IMAGE: &str = "ghcr.io/murmur-dev/murmur-trainer:0.1.0-cuda";

impl Default for TrainerSpec {
    fn default() -> Self {
        Self {
            image: None,
            resources: None,
            env: Vec::new(),
            backend: Backend::Cpu,
            pod_template: None,
        }
    }
}

/// A Kubernetes quantity (`500m`, `2`, `1.5Gi`, `1e3`), as the API server parses them: checked in
/// the CRD, or a bad one would pass the job and fail only when its pods are created.
pub const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[x_kube(validation = Rule::new("!has(self.gpus) || self.gpus <= 16").message("trainer.resources.gpus must be <= 16").field_path(".gpus"))]
pub struct TrainerResources {
    /// CPU request and limit, e.g. "2" or "500m".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = QUANTITY_PATTERN))]
    pub cpu: Option<Quantity>,
    /// Memory request and limit, e.g. "2Gi".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = QUANTITY_PATTERN))]
    pub memory: Option<Quantity>,
    /// GPUs per member, requested as `nvidia.com/gpu`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
}

impl TrainerResources {
    /// The CPU limit in cores (`500m` is 0.5), when one is set and reads as a quantity.
    pub fn cpu_cores(&self) -> Option<f64> {
        quantity_value(&self.cpu.as_ref()?.0)
    }
}

/// The value of a Kubernetes quantity: a decimal number with an optional SI (`m`, `k`, `M`, …),
/// binary (`Ki`, `Mi`, …) or exponent (`e3`) suffix. None when it is not one.
pub fn quantity_value(text: &str) -> Option<f64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let scale = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        exponent => 10f64.powi(exponent.strip_prefix(['e', 'E'])?.parse().ok()?),
    };
    Some(number * scale)
}

#[cfg(test)]
mod quantity_tests {
    use super::quantity_value;

    #[test]
    fn quantities_read_as_kubernetes_reads_them() {
        for (text, value) in [
            ("500m", 0.5),
            ("2", 2.0),
            ("1.5", 1.5),
            ("1e3", 1000.0),
            ("2k", 2000.0),
            ("1Gi", 1073741824.0),
            ("250M", 2.5e8),
        ] {
            assert_eq!(quantity_value(text), Some(value), "{text}");
        }
        for bad in ["", "m", "two", "1x", "1e", "1.5Qi"] {
            assert_eq!(quantity_value(bad), None, "{bad}");
        }
    }
}
