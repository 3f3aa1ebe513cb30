//! Asynchronous gossip's step: letters through a [`Mailbox`], never waiting for anybody.

use burn::tensor::backend::AutodiffBackend;
use rand::Rng;

use murmur_core::topology::MemberId;

use super::{Member, MemberError, StepReport};
use crate::algorithms::async_gossip::{self, GossipCounts, Letter, LetterKind, Mailbox};
use crate::algorithms::cadence::Averaging;
use crate::algorithms::mixing::distance;
use crate::algorithms::{Neighbourhood, Payload, Purpose};
use crate::compression::Compression;
use crate::model;
use crate::task::Task;

impl<B: AutodiffBackend, T: Task> Member<B, T> {
    /// Asynchronous gossip's step: a local step; then answer the requests and settle the replies
    /// that have arrived, and (every `average_every` steps) send a request to one neighbour
    /// chosen at random among those without one in flight. Never waits for anybody.
    pub fn gossip_step<M: Mailbox>(
        &mut self,
        step: u64,
        hood: &Neighbourhood,
        mail: &mut M,
    ) -> Result<StepReport, MemberError> {
        self.gossip(step, hood, mail, true)
    }

    /// Asynchronous gossip after the last step: answer requests with this model, which no longer
    /// changes. Neighbours still training keep a partner to mix with, so a member that finishes
    /// late does not spend its last steps alone on its own shard; and the finished model does not
    /// follow them (a model that only mixes with one late member, training on its own classes,
    /// would become a copy of it: measured, that cost the late member 20 to 35 points). The
    /// pair's sum is no longer kept: training is over here. Returns how many requests were
    /// answered.
    pub fn gossip_serve<M: Mailbox>(
        &mut self,
        step: u64,
        hood: &Neighbourhood,
        mail: &mut M,
    ) -> Result<usize, MemberError> {
        Ok(self.gossip(step, hood, mail, false)?.heard_from)
    }

    fn gossip<M: Mailbox>(
        &mut self,
        step: u64,
        hood: &Neighbourhood,
        mail: &mut M,
        train: bool,
    ) -> Result<StepReport, MemberError> {
        let loss = if train { self.local_step() } else { f64::NAN };
        let mut model = self.model.take().expect("model present");
        let neighbours: Vec<MemberId> = hood.neighbours.iter().map(|(id, _)| *id).collect();
        let max_staleness = self.config.max_staleness;
        let letters = mail.collect();
        self.requests.expire(step, max_staleness, &neighbours);
        let every = match self.config.averaging {
            Averaging::Every(n) => n.max(1),
            Averaging::Auto(_) => 1,
        };
        let free = self.requests.free(step, neighbours.iter().copied());
        let ask = train && (step + 1).is_multiple_of(every) && !free.is_empty();
        let mut report = StepReport {
            loss,
            heard_from: 0,
            exchanged: ask || !letters.is_empty(),
            local_disagreement: None,
        };
        if !report.exchanged {
            self.model = Some(model);
            return Ok(report);
        }
        let mut own = std::mem::take(&mut self.scratch);
        let (exported, _) = model::export_into(model, &mut own);
        model = exported;
        let before = (!letters.is_empty()).then(|| own.clone());
        let compression = self.config.compression;
        for (from, letter) in letters {
            // A letter from a member that is not (or no longer) a neighbour is ignored: its
            // request goes unanswered and is given up at the other end.
            if !neighbours.contains(&from) {
                continue;
            }
            let Some((_, theirs, _)) = self
                .decode_all(
                    Purpose::Parameters,
                    compression,
                    vec![(from, letter.payload)],
                    false,
                )
                .pop()
            else {
                continue;
            };
            match letter.kind {
                LetterKind::Request => {
                    // The reply carries the model the move is taken from, so the pair's sum holds.
                    let payload = self.encode_for(from, compression, &own);
                    mail.post(
                        from,
                        Letter {
                            kind: LetterKind::Reply,
                            seq: letter.seq,
                            payload,
                        },
                    );
                    if train {
                        async_gossip::meet_halfway(&mut own, &theirs);
                    }
                    self.requests.counts.served += 1;
                    report.heard_from += 1;
                }
                LetterKind::Reply if train => {
                    if let Some(sent) = self.requests.close(from, letter.seq, step, max_staleness) {
                        async_gossip::settle(&mut own, &sent, &theirs);
                        report.heard_from += 1;
                    }
                }
                LetterKind::Reply => {}
            }
        }
        if ask {
            let to = free[self.rng.random_range(0..free.len())];
            let payload = self.encode_for(to, compression, &own);
            let seq = self.requests.open(to, step, own.clone());
            mail.post(
                to,
                Letter {
                    kind: LetterKind::Request,
                    seq,
                    payload,
                },
            );
        }
        if let Some(before) = before
            && report.heard_from > 0
        {
            report.local_disagreement = Some(distance(&before, &own));
        }
        model = model::import(model, &own, &self.layout)?;
        self.scratch = own;
        self.model = Some(model);
        Ok(report)
    }

    /// Parameters for one member (asynchronous gossip's letters carry no trailer).
    fn encode_for(&mut self, to: MemberId, compression: Compression, values: &[f32]) -> Payload {
        let (_, payload) = self
            .encode(&[to], Purpose::Parameters, compression, values, &[])
            .pop()
            .expect("one destination, one payload");
        payload
    }

    /// What asynchronous gossip has done so far.
    pub fn gossip_counts(&self) -> GossipCounts {
        self.requests.counts
    }
}
