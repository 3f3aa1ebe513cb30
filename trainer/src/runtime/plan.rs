//! What one member does, derived from the job spec alone: every member computes the same plan,
//! so they agree on steps, rounds and shards without talking.

use std::time::Duration;

use murmur_core::api::{AverageEvery, DecentralizedTrainingJobSpec, ModelKind, TopologyKind};

use crate::algorithms::{AutoPolicy, Averaging, MemberConfig, OuterConfig};
use crate::compression::Compression;
use crate::data::partition::Partition;

#[derive(Clone, Debug, PartialEq)]
pub struct MemberPlan {
    pub member: MemberConfig,
    pub model: ModelKind,
    pub partition: Partition,
    /// The training set is cut into this many shards (`replicas.target`); member `i` trains on
    /// shard `i mod shards`, so a replacement with the same id takes over the same data.
    pub shards: usize,
    pub steps: Option<u64>,
    pub epochs: Option<u32>,
    pub round_timeout: Duration,
    pub checkpoint_every: Option<u64>,
    pub topology: TopologyKind,
}

impl MemberPlan {
    pub fn from_spec(spec: &DecentralizedTrainingJobSpec) -> Self {
        let training = &spec.training;
        let outer = spec.algorithm.outer.as_ref().map(OuterConfig::from_spec);
        Self {
            member: MemberConfig {
                algorithm: spec.algorithm.kind,
                averaging: match (outer, spec.algorithm.average_every) {
                    // An outer step ends every round: the rounds come every localSteps steps.
                    (Some(outer), _) => Averaging::Every(outer.local_steps),
                    (None, AverageEvery::Steps(n)) => Averaging::Every(u64::from(n.max(1))),
                    (None, AverageEvery::Auto) => {
                        Averaging::Auto(AutoPolicy::from_spec(spec.algorithm.auto.as_ref()))
                    }
                },
                compression: Compression::from_spec(&spec.algorithm.compression),
                optimizer: training.optimizer.kind,
                momentum: training.optimizer.momentum.unwrap_or(0.0),
                learning_rate: training.learning_rate,
                batch_size: training.batch_size.max(1) as usize,
                seed: training.seed,
                group_size: spec.algorithm.group_size(),
                max_staleness: spec.algorithm.max_staleness(),
                outer,
                overlap: spec.algorithm.overlap,
            },
            model: training.model,
            partition: Partition::from_spec(&training.partition),
            shards: spec.replicas.target.max(1) as usize,
            steps: training.steps,
            epochs: training.epochs,
            round_timeout: spec.algorithm.round_timeout.as_std(),
            checkpoint_every: spec
                .checkpoint
                .as_ref()
                .map(|c| c.every_steps)
                .filter(|&n| n > 0),
            topology: spec.topology.kind,
        }
    }

    pub fn shard_of(&self, member: u32) -> usize {
        member as usize % self.shards
    }

    /// The stopping target in steps. Epochs count over the mean shard, so that every member
    /// stops at the same step whatever the size of its own shard.
    pub fn total_steps(&self, train_examples: usize) -> u64 {
        match (self.steps, self.epochs) {
            (Some(steps), _) => steps,
            (None, Some(epochs)) => {
                let per_shard = train_examples.div_ceil(self.shards) as u64;
                (u64::from(epochs) * per_shard)
                    .div_ceil(self.member.batch_size as u64)
                    .max(1)
            }
            (None, None) => 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use murmur_core::api::parse_manifest;

    fn spec(extra: &str) -> DecentralizedTrainingJobSpec {
        let text = format!(
            "apiVersion: murmur.dev/v1alpha1\nkind: DecentralizedTrainingJob\nmetadata: {{name: t}}\nspec:\n  replicas: {{min: 2, target: 4, max: 6}}\n  topology: {{kind: ring}}\n  algorithm: {{kind: dpsgd, roundTimeout: 2s}}\n  training:\n    model: mlp\n    dataset: {{source: embedded}}\n    partition: {{kind: iid}}\n    batchSize: 25\n{extra}"
        );
        parse_manifest(&text, "t.yaml").unwrap().spec
    }

    #[test]
    fn epochs_count_over_the_mean_shard() {
        let plan = MemberPlan::from_spec(&spec("    epochs: 2\n"));
        // 4000 examples in 4 shards of 1000: two epochs of batches of 25.
        assert_eq!(plan.total_steps(4000), 80);
        let plan = MemberPlan::from_spec(&spec("    steps: 7\n"));
        assert_eq!(plan.total_steps(4000), 7);
        assert_eq!(plan.round_timeout, Duration::from_secs(2));
        assert_eq!((plan.shard_of(1), plan.shard_of(5)), (1, 1));
    }
}
