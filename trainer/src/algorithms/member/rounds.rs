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
use crate::model;
use crate::task::Task;

impl<B: AutodiffBackend, T: Task> Member<B, T> {
    /// One local step, then (every `average_every` steps, or on the edges the cadence says are
    /// due) an averaging round.
    pub async fn step<E: Exchange>(
        &mut self,
        step: u64,
        hood: &Neighbourhood,
        ex: &mut E,
    ) -> Result<StepReport, MemberError> {
        let model = self.model.take().expect("model present");
        let (loss_value, mut grads) = self.gradients(&model);
        let mut heard_from = 0;
        let mut exchanged = false;
        let mut local_disagreement = None;

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
            heard_from += received.len();
            exchanged = true;
            let refs: Vec<&[f32]> = received.iter().map(|(_, g, _)| &**g).collect();
            grads = model::gradients_from_flat(&model, &mean(&own, &refs), &self.layout)?;
        }
        let mut model = self.optim.step(self.config.learning_rate, model, grads);

        // Auto averaging labels a round by its step: at most one a step, and both ends of an
        // edge agree on its steps.
        // With outer steps the run's last step ends in a round too, so the model the run ends
        // with is an anchor, not a member's drift on its own data.
        let round = match self.config.averaging {
            Averaging::Every(n) => ((step + 1).is_multiple_of(n.max(1))
                || (self.outer.is_some() && self.last_step == Some(step)))
            .then(|| step / n.max(1)),
            Averaging::Auto(_) => Some(step),
        };
        let plan = round.map(|round| (round, self.averaging_plan(step, round, hood)));
        // With outer steps, every round ends in an outer step, heard from anyone or not.
        if let Some((round, plan)) = plan
            && (!plan.from.is_empty() || self.outer.is_some())
        {
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
                exchanged = true;
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
            heard_from += received.len();
            // The local disagreement is the distance to the plain mean of what was averaged;
            // computed in the same pass over the received models as the mix itself.
            let (mixed, disagreement) = if plan.weighted {
                let weight = |id: MemberId| {
                    hood.neighbours
                        .iter()
                        .find(|(n, _)| *n == id)
                        .map_or(0.0, |(_, w)| *w)
                };
                let weighted: Vec<(f64, &[f32])> = received
                    .iter()
                    .map(|(id, x, _)| (weight(*id), &**x))
                    .collect();
                weighted_average_and_disagreement(&own, plan.self_weight, &weighted)
            } else {
                let refs: Vec<&[f32]> = received.iter().map(|(_, x, _)| &**x).collect();
                let mixed = mean(&own, &refs);
                let disagreement = distance(&own, &mixed);
                (mixed, disagreement)
            };
            if !received.is_empty() {
                local_disagreement = Some(disagreement);
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
            drop(received);
            self.scratch = own;
            model = match (&mut self.outer, &self.config.outer) {
                // The next local steps start from the anchor the outer step moved, with no
                // momentum of their own: see `Optim::restart_momentum`.
                (Some(outer), Some(config)) => {
                    outer.step(&mixed, config);
                    self.optim.restart_momentum(self.config.momentum);
                    model::import(model, &outer.anchor, &self.layout)?
                }
                _ => model::import(model, &mixed, &self.layout)?,
            };
        }
        self.model = Some(model);
        Ok(StepReport {
            loss: loss_value,
            heard_from,
            exchanged,
            local_disagreement,
        })
    }

    /// Who to send to and hear from in this averaging round, and whether W's weights or a plain
    /// mean apply.
    fn averaging_plan(&mut self, step: u64, round: u64, hood: &Neighbourhood) -> AveragingPlan {
        let plain = |to: Vec<MemberId>, from: Vec<MemberId>| AveragingPlan {
            to,
            from,
            weighted: false,
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
                                weighted: true,
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
                                weighted: true,
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
struct AveragingPlan {
    to: Vec<MemberId>,
    from: Vec<MemberId>,
    /// W's weights (with `self_weight` for W_ii) rather than a plain mean.
    weighted: bool,
    self_weight: f64,
    /// The edges follow the cadence (auto averaging): payloads carry its trailer.
    paced: bool,
}
