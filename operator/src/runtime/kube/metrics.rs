//! The operator's own Prometheus metrics, served on `/metrics` next to the status router's.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use murmur_core::api::MemberPhase;

use crate::status::view::JobView;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    pub namespace: String,
    pub job: String,
    pub phase: String,
}

const MEMBER_PHASES: [MemberPhase; 9] = [
    MemberPhase::Pending,
    MemberPhase::Joining,
    MemberPhase::Training,
    MemberPhase::Paused,
    MemberPhase::Leaving,
    MemberPhase::Retired,
    MemberPhase::Done,
    MemberPhase::Preempted,
    MemberPhase::Failed,
];

pub struct OperatorMetrics {
    reconciles: Family<OutcomeLabels, Counter>,
    errors: Family<KindLabels, Counter>,
    writes: Family<KindLabels, Counter>,
    duration: Histogram,
    cpu: Histogram,
    rounds: Family<OutcomeLabels, Counter>,
    round_duration: Histogram,
    members: Family<PhaseLabels, Gauge>,
}

impl OperatorMetrics {
    /// Create the metrics and register them (prefix `murmur_operator`).
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            reconciles: Family::default(),
            errors: Family::default(),
            writes: Family::default(),
            // 0.5 ms .. ~5.6 s, each bucket 1.5 times the last: fine enough for a p99.
            duration: Histogram::new(exponential_buckets(0.0005, 1.5, 24)),
            cpu: Histogram::new(exponential_buckets(0.0005, 1.5, 24)),
            rounds: Family::default(),
            // Up to ~86 s: a round that creates a burst of pods on a busy API server takes
            // seconds.
            round_duration: Histogram::new(exponential_buckets(0.0005, 1.5, 30)),
            members: Family::default(),
        };
        let r = registry.sub_registry_with_prefix("operator");
        r.register(
            "reconciles",
            "Reconciles of DecentralizedTrainingJobs, by outcome",
            m.reconciles.clone(),
        );
        r.register(
            "reconcile_errors",
            "Failed reconciles, by kind of error",
            m.errors.clone(),
        );
        r.register(
            "writes",
            "Writes to the API server, by kind of object",
            m.writes.clone(),
        );
        r.register(
            "reconcile_duration_seconds",
            "Time one reconcile takes to decide (its writes follow behind it)",
            m.duration.clone(),
        );
        r.register(
            "reconcile_cpu_seconds",
            "CPU time one reconcile's decision takes on its thread: its duration less the time \
             the thread waited (another process on the core, a lock)",
            m.cpu.clone(),
        );
        r.register(
            "write_rounds",
            "Rounds of a job's writes behind its reconciles, by outcome",
            m.rounds.clone(),
        );
        r.register(
            "write_round_duration_seconds",
            "Time one round of a job's writes takes (the API server's answers included)",
            m.round_duration.clone(),
        );
        r.register("members", "Members of each job by phase", m.members.clone());
        m
    }

    /// A reconcile took `seconds`, `cpu_seconds` of them on its thread's CPU.
    pub fn reconciled(&self, seconds: f64, cpu_seconds: f64, outcome: &str) {
        self.duration.observe(seconds);
        self.cpu.observe(cpu_seconds);
        self.reconciles
            .get_or_create(&OutcomeLabels {
                outcome: outcome.into(),
            })
            .inc();
    }

    pub fn wrote_round(&self, seconds: f64, outcome: &str) {
        self.round_duration.observe(seconds);
        self.rounds
            .get_or_create(&OutcomeLabels {
                outcome: outcome.into(),
            })
            .inc();
    }

    pub fn error(&self, kind: &str) {
        self.errors
            .get_or_create(&KindLabels { kind: kind.into() })
            .inc();
    }

    pub fn wrote(&self, kind: &str, n: usize) {
        if n > 0 {
            self.writes
                .get_or_create(&KindLabels { kind: kind.into() })
                .inc_by(n as u64);
        }
    }

    /// Members by phase, from the job's view (phases with no member read 0).
    pub fn observe(&self, view: &JobView) {
        for phase in MEMBER_PHASES {
            let n = view.members.iter().filter(|m| m.phase == phase).count();
            self.members
                .get_or_create(&PhaseLabels {
                    namespace: view.namespace.clone(),
                    job: view.name.clone(),
                    phase: format!("{phase:?}"),
                })
                .set(n as i64);
        }
    }

    /// A deleted job's series go away.
    pub fn forget(&self, namespace: &str, job: &str) {
        for phase in MEMBER_PHASES {
            self.members.remove(&PhaseLabels {
                namespace: namespace.into(),
                job: job.into(),
                phase: format!("{phase:?}"),
            });
        }
    }
}
