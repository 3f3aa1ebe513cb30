//! The synchronous step: a local step, clique averaging's gradient round, and the averaging
//! round of D-PSGD, gossip, clique averaging and Moshpit, with its plan.

use std::collections::BTreeMap;

use burn::tensor::backend::AutodiffBackend;

use murmur_core::api::AlgorithmKind;
use murmur_core::topology::MemberId;

use super::{Member, MemberError, StepReport};
use crate::algorithms::cadence::{Averaging, Outcome};
use crate::algorithms::mixing::{
    distance, gossip_partner, mean, weighted_average_and_disagreement,
};
use crate::algorithms::{Exchange, Neighbourhood, Purpose};
use crate::compression::Decoded;
use crate::model;
use crate::task::Task;

impl<B: AutodiffBackend, T: Task> Member<B, T> {
    /// One local step, then (every `average_every` steps, or on the edges the cadence says are
    /// due) an averaging round. With `overlap`, the round's exchange runs while this member
    /// computes: posted before the step's gradient and collected after it, or (outer steps)
    /// posted at a boundary and collected `overlap_steps` local steps later.
    pub async fn step<E: Exchange>(
        &mut self,
        step: u64,
        hood: &Neighbourhood,
        ex: &mut E,
    ) -> Result<StepReport, MemberError> {
        let mut model = self.model.take().expect("model present");
        let mut report = StepReport {
            loss: 0.0,
            heard_from: 0,
            exchanged: false,
            local_disagreement: None,
        };
        let round = self.round_of(step);
        let overlap_steps = self.config.overlap && self.outer.is_none();
        if overlap_steps && let Some(round) = round {
            model = self.start_round(model, step, round, hood, ex);
        }
        let (loss_value, mut grads) = self.gradients(&model);
        report.loss = loss_value;

        if self.config.algorithm == AlgorithmKind::CliqueAveraging && !hood.clique_mates.is_empty()
        {
            // Clique averaging: the clique's mean gradient, before the momentum step, removes the
            // label skew of any one member.
            let own = model::export_gradients(&model, &grads)?;
            let received = self
                .share(
                    ex,
                    step,
                    Purpose::Gradients,
                    (&hood.clique_mates, &hood.clique_mates),
                    &own,
                    None,
                )
                .await;
            report.heard_from += received.len();
            report.exchanged = true;
            let refs: Vec<&[f32]> = received.iter().map(|(_, g, _)| &**g).collect();
            grads = model::gradients_from_flat(&model, &mean(&own, &refs), &self.layout)?;
        }
        let mut model = self.optim.step(self.config.learning_rate, model, grads);

        let overlap_outer = self.config.overlap && self.outer.is_some();
        if overlap_outer && self.pending.as_ref().is_some_and(|p| p.due <= step) {
            model = self.settle(model, ex, &mut report).await?;
        }
        if let Some(round) = round {
            if overlap_steps {
                model = self.settle(model, ex, &mut report).await?;
            } else if overlap_outer && self.last_step != Some(step) {
                // The round before, if still posted; this one travels during the next local
                // steps.
                model = self.settle(model, ex, &mut report).await?;
                model = self.start_round(model, step, round, hood, ex);
                // The local steps after a boundary start without momentum, as they do from an
                // anchor without overlap.
                self.optim.restart_momentum(self.config.momentum);
                let delay = self.config.outer.map_or(1, |c| c.overlap_steps);
                if let Some(p) = &mut self.pending {
                    p.due = step + delay;
                }
            } else {
                // The run's last round is exchanged at once: the model it ends with is an
                // anchor every round has moved.
                if overlap_outer {
                    model = self.settle(model, ex, &mut report).await?;
                }
                model = self
                    .round(model, step, round, hood, ex, &mut report)
                    .await?;
            }
        }
        self.model = Some(model);
        Ok(report)
    }

    /// The averaging round this step ends with, if any. Auto averaging labels a round by its
    /// step: at most one a step, and both ends of an edge agree on its steps. With outer steps
    /// the run's last step ends in a round too, so the model the run ends with is an anchor,
    /// not a member's drift on its own data.
    fn round_of(&self, step: u64) -> Option<u64> {
        match self.config.averaging {
            Averaging::Every(n) => ((step + 1).is_multiple_of(n.max(1))
                || (self.outer.is_some() && self.last_step == Some(step)))
            .then(|| step / n.max(1)),
            Averaging::Auto(_) => Some(step),
        }
    }

    /// A whole averaging round: send, wait for the neighbours, mix (with outer steps, move the
    /// anchor and start again from it).
    async fn round<E: Exchange>(
        &mut self,
        mut model: T::Model<B>,
        step: u64,
        round: u64,
        hood: &Neighbourhood,
        ex: &mut E,
        report: &mut StepReport,
    ) -> Result<T::Model<B>, MemberError> {
        let plan = self.averaging_plan(step, round, hood);
        // With outer steps, every round ends in an outer step, heard from anyone or not.
        if plan.from.is_empty() && self.outer.is_none() {
            return Ok(model);
        }
        // The scratch buffer keeps its pages between rounds: no page faults on every export.
        let mut own = std::mem::take(&mut self.scratch);
        let (exported, _) = model::export_into(model, &mut own);
        model = exported;
        let trailer = self
            .cadence
            .as_ref()
            .filter(|_| plan.paced)
            .map(|c| c.trailer(&plan.to));
        let received = if plan.to.is_empty() && plan.from.is_empty() {
            Vec::new()
        } else {
            report.exchanged = true;
            self.share(
                ex,
                round,
                Purpose::Parameters,
                (&plan.to, &plan.from),
                &own,
                trailer.as_deref(),
            )
            .await
        };
        report.heard_from += received.len();
        let (mixed, disagreement) = mix(&own, &plan, &received);
        if !received.is_empty() {
            report.local_disagreement = Some(disagreement);
        }
        if plan.paced {
            // Scored only on the edges I decide: the other end's gap comes in its trailer.
            let decides = |id: MemberId| self.cadence.as_ref().is_some_and(|c| c.decides(id));
            let (ids, values): (Vec<MemberId>, Vec<&[f32]>) = received
                .iter()
                .filter(|(id, _, _)| decides(*id))
                .map(|(id, x, _)| (*id, &**x))
                .unzip();
            let skews: BTreeMap<MemberId, f64> =
                ids.into_iter().zip(self.skews(&model, &values)).collect();
            let outcomes: Vec<(MemberId, Outcome)> = plan
                .from
                .iter()
                .map(|&id| {
                    let outcome = match received.iter().find(|(from, _, _)| *from == id) {
                        Some((_, _, announced)) => Outcome::Delivered {
                            announced: *announced,
                            skew: skews.get(&id).copied(),
                        },
                        None => Outcome::Missed,
                    };
                    (id, outcome)
                })
                .collect();
            if let Some(cadence) = &mut self.cadence {
                cadence.settle(step, &outcomes);
            }
        }
        let heard = !received.is_empty();
        drop(received);
        self.scratch = own;
        Ok(match (&mut self.outer, &self.config.outer) {
            // The next local steps start from the anchor (moved, unless the round heard from no
            // one it expected), with no momentum of their own: see `Optim::restart_momentum`.
            (Some(outer), Some(config)) => {
                outer.end_round(&mixed, config, !plan.from.is_empty(), heard);
                self.optim.restart_momentum(self.config.momentum);
                model::import(model, &outer.anchor, &self.layout)?
            }
            _ => model::import(model, &mixed, &self.layout)?,
        })
    }

    /// Send this round's parameters and go on computing: [`settle`](Self::settle) collects
    /// and mixes them later.
    fn start_round<E: Exchange>(
        &mut self,
        model: T::Model<B>,
        step: u64,
        round: u64,
        hood: &Neighbourhood,
        ex: &mut E,
    ) -> T::Model<B> {
        let plan = self.averaging_plan(step, round, hood);
        let (model, sent, _) = model::export(model);
        if !plan.to.is_empty() || !plan.from.is_empty() {
            self.post_share(ex, round, Purpose::Parameters, &plan.to, &sent, None);
        }
        self.pending = Some(Pending {
            round,
            due: step,
            plan,
            sent,
        });
        model
    }

    /// Collect the posted round and mix it into what was sent: the parameters become the mix
    /// (with outer steps, the anchor the mix moved) plus what this member learnt since it
    /// posted, `x ← m + (x − x_sent)`.
    async fn settle<E: Exchange>(
        &mut self,
        model: T::Model<B>,
        ex: &mut E,
        report: &mut StepReport,
    ) -> Result<T::Model<B>, MemberError> {
        let Some(Pending {
            round, plan, sent, ..
        }) = self.pending.take()
        else {
            return Ok(model);
        };
        let received = if plan.from.is_empty() {
            Vec::new()
        } else {
            report.exchanged = true;
            self.collect_share(ex, round, Purpose::Parameters, &plan.from, false)
                .await
        };
        report.heard_from += received.len();
        let (mixed, disagreement) = mix(&sent, &plan, &received);
        let heard = !received.is_empty();
        if heard {
            report.local_disagreement = Some(disagreement);
        }
        drop(received);
        if plan.from.is_empty() && self.outer.is_none() {
            return Ok(model);
        }
        let mut own = std::mem::take(&mut self.scratch);
        let (model, _) = model::export_into(model, &mut own);
        let target: &[f32] = match (&mut self.outer, &self.config.outer) {
            (Some(outer), Some(config)) => {
                outer.end_round(&mixed, config, !plan.from.is_empty(), heard);
                &outer.anchor
            }
            _ => &mixed,
        };
        for ((x, t), s) in own.iter_mut().zip(target).zip(&sent) {
            *x = t + (*x - s);
        }
        let model = model::import(model, &own, &self.layout)?;
        self.scratch = own;
        Ok(model)
    }

    /// Who to send to and hear from in this averaging round, and whether W's weights or a plain
    /// mean apply.
    fn averaging_plan(&mut self, step: u64, round: u64, hood: &Neighbourhood) -> AveragingPlan {
        let plain = |to: Vec<MemberId>, from: Vec<MemberId>| AveragingPlan {
            to,
            from,
            weights: Vec::new(),
            self_weight: 1.0,
            paced: false,
        };
        match self.config.algorithm {
            AlgorithmKind::Dpsgd | AlgorithmKind::CliqueAveraging => match hood.one_peer(round) {
                // Half mine, half my one in-peer's: a plain mean of the two.
                Some(p) => plain(vec![p.send_to], vec![p.receive_from]),
                None => {
                    let all = hood.neighbours.iter().map(|(id, _)| *id);
                    match &mut self.cadence {
                        None => {
                            let all: Vec<MemberId> = all.collect();
                            AveragingPlan {
                                to: all.clone(),
                                from: all,
                                weights: hood.neighbours.clone(),
                                self_weight: hood.self_weight,
                                paced: false,
                            }
                        }
                        Some(cadence) => {
                            let due = cadence.due(step, all);
                            // A skipped edge's weight stays here: W stays doubly stochastic.
                            let skipped: f64 = hood
                                .neighbours
                                .iter()
                                .filter(|(id, _)| !due.contains(id))
                                .map(|(_, w)| w)
                                .sum();
                            AveragingPlan {
                                to: due.clone(),
                                from: due,
                                weights: hood.neighbours.clone(),
                                self_weight: hood.self_weight + skipped,
                                paced: true,
                            }
                        }
                    }
                }
            },
            // Asynchronous gossip has no rounds (see `gossip_step`); if asked for one anyway it
            // behaves as gossip.
            AlgorithmKind::Gossip | AlgorithmKind::AsyncGossip => {
                let partner: Vec<MemberId> =
                    gossip_partner(&hood.edges, self.config.seed, round, self.id)
                        .into_iter()
                        .collect();
                plain(partner.clone(), partner)
            }
            AlgorithmKind::Moshpit => {
                let group = hood.moshpit_group(self.config.group_size, round);
                plain(group.clone(), group)
            }
        }
    }
}

/// One averaging round's plan.
pub(super) struct AveragingPlan {
    to: Vec<MemberId>,
    from: Vec<MemberId>,
    /// W's weights of the neighbours (with `self_weight` for W_ii); empty for a plain mean.
    weights: Vec<(MemberId, f64)>,
    self_weight: f64,
    /// The edges follow the cadence (auto averaging): payloads carry its trailer.
    paced: bool,
}

/// A round posted and not yet collected (overlap).
pub(super) struct Pending {
    round: u64,
    /// The step after whose local step it is collected.
    due: u64,
    plan: AveragingPlan,
    /// This member's parameters as it posted them.
    sent: Vec<f32>,
}

/// `own` mixed with what the neighbours delivered under `plan` (missing ones drop out and the
/// weights renormalise), and the local disagreement: the distance to the plain mean, computed
/// in the same pass.
fn mix(
    own: &[f32],
    plan: &AveragingPlan,
    received: &[(MemberId, Decoded, Option<u64>)],
) -> (Vec<f32>, f64) {
    if plan.weights.is_empty() {
        let refs: Vec<&[f32]> = received.iter().map(|(_, x, _)| &**x).collect();
        let mixed = mean(own, &refs);
        let disagreement = distance(own, &mixed);
        return (mixed, disagreement);
    }
    let weight = |id: MemberId| {
        plan.weights
            .iter()
            .find(|(n, _)| *n == id)
            .map_or(0.0, |(_, w)| *w)
    };
    let weighted: Vec<(f64, &[f32])> = received
        .iter()
        .map(|(id, x, _)| (weight(*id), &**x))
        .collect();
    weighted_average_and_disagreement(own, plan.self_weight, &weighted)
}
