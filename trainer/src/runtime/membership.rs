//! Following the topology and moving state between members: applying a new topology, waiting
//! for one, the joiner's state fetch, catching up with neighbours far ahead, answering joiners.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use burn::tensor::backend::AutodiffBackend;

use murmur_core::contract::view::edge_agreement;
use murmur_core::contract::{TopologyDocument, TrainerState};
use murmur_core::topology::MemberId;

use super::{RunError, Trainer};
use crate::algorithms::cadence::Averaging;
use crate::algorithms::{Neighbourhood, mixing};
use crate::task::Task;
use crate::transport::{Agreements, StateReply, StateRequest};

/// How often a member that the topology leaves out posts its join again while it waits. A
/// leader that took the last one may have stopped leading before it kept it; its successor then
/// serves the same version, and no newer view would come to answer with a join.
const JOIN_AGAIN: Duration = Duration::from_secs(5);

/// How many members beyond its neighbourhood a joiner asks for state at a time.
const STATE_ASK_BATCH: usize = 8;

/// How many rounds a neighbour may be ahead before we take its state: past this, our payloads
/// are stale to it and its are out of our window, so rounds with it no longer meet.
const CATCH_UP_ROUNDS: u64 = crate::transport::book::STALE_ROUNDS;

/// The members of `doc` other than `me` and its `neighbours`, in the order a joiner asks them
/// for state: ids just above its own first, wrapping around, so that joiners spread their asks.
fn beyond_neighbourhood(
    doc: &TopologyDocument,
    me: MemberId,
    neighbours: &[MemberId],
) -> Vec<MemberId> {
    let mut ids: Vec<MemberId> = doc
        .members
        .iter()
        .map(|m| m.id)
        .filter(|&id| id != me && !neighbours.contains(&id))
        .collect();
    ids.sort_by_key(|&id| (id < me, id));
    ids
}

impl<B: AutodiffBackend, T: Task> Trainer<B, T> {
    /// Answer joining members with our step and parameters; one as far on as we are gets our
    /// step alone (members starting together all ask, and a state at step 0 is of no use). So
    /// does everyone while we have trained alone within the first round: our state is then the
    /// shared initial model fitted to our own classes, and a member starting with us begins from
    /// the initial model as we did, whichever of its request and our start came first. Past the
    /// first round (it timed out on every neighbour) we are ahead, and a late starter takes our
    /// state to keep in step.
    pub(super) fn serve_state_requests(&mut self) {
        let first_round = match self.plan.member.averaging {
            Averaging::Every(n) => n,
            Averaging::Auto(policy) => policy.max_every,
        };
        let alone = self.trained_alone && self.step < first_round;
        let (behind, level): (Vec<StateRequest>, Vec<StateRequest>) = self
            .transport
            .take_state_requests()
            .into_iter()
            .partition(|r| r.step < self.step && !alone);
        for request in level {
            self.transport.reply_state(request, self.step, &[], &[]);
        }
        if behind.is_empty() {
            return;
        }
        let parameters = self.member.transferable_state();
        let optimizer = self.member.optimizer_state().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot record the optimizer state; sending parameters only");
            Vec::new()
        });
        for request in behind {
            tracing::info!(
                peer = request.from,
                step = self.step,
                "sending state to a joining member"
            );
            self.transport
                .reply_state(request, self.step, &parameters, &optimizer);
        }
    }

    /// Follow the newest topology, if it includes us. Called at round boundaries only.
    pub(super) fn apply_topology(&mut self) -> bool {
        let latest = self.topology.borrow_and_update().clone();
        let Some(followed) = latest else {
            return self.hood.is_some();
        };
        if self
            .followed
            .as_ref()
            .is_some_and(|f| f.view.version == followed.view.version)
        {
            return self.hood.is_some();
        }
        let me = self.env.member_id;
        let view = &followed.view;
        let mut addresses: BTreeMap<MemberId, String> = view
            .neighbours
            .iter()
            .filter_map(|n| Some((n.id, n.address.clone()?)))
            .collect();
        let agreements = match &followed.document {
            Some(doc) if self.whole => {
                addresses.extend(
                    doc.members
                        .iter()
                        .filter(|m| m.id != me)
                        .filter_map(|m| Some((m.id, m.address.clone()?))),
                );
                Agreements::all(doc.version)
            }
            _ => Agreements {
                by_peer: view
                    .neighbours
                    .iter()
                    .map(|n| (n.id, edge_agreement(n.weight)))
                    .collect(),
                others: 0,
            },
        };
        self.transport.set_topology(agreements, addresses);
        let whole = followed.document.as_ref().filter(|_| self.whole);
        self.hood = Neighbourhood::from_view(view, whole);
        match &self.hood {
            Some(hood) => {
                let neighbours: Vec<MemberId> = hood.neighbours.iter().map(|(id, _)| *id).collect();
                self.transport.connect(&neighbours);
                tracing::info!(version = view.version, ?neighbours, "following topology");
            }
            None => {
                tracing::warn!(
                    version = view.version,
                    "this member is not in the topology; pausing"
                );
                self.join_again();
            }
        }
        let version = view.version;
        self.observed.update(|s| s.topology_version = version);
        self.followed = Some(followed);
        self.hood.is_some()
    }

    /// Post this member's join report again (the operator that took the last one may not have
    /// kept it), without waiting for the answer.
    fn join_again(&mut self) {
        if let (Some(c), Some(report)) = (self.control.clone(), self.join.clone()) {
            self.joined_at = Instant::now();
            tokio::spawn(async move { c.post_retrying(&c.join_path(), &report, 3).await });
        }
    }

    /// The neighbours of the topology followed, with the addresses it gives them.
    fn neighbour_addresses(&self) -> BTreeMap<MemberId, Option<String>> {
        self.followed
            .as_ref()
            .map(|f| {
                f.view
                    .neighbours
                    .iter()
                    .map(|n| (n.id, n.address.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The version of the topology followed (0 before the first).
    pub(super) fn topology_version(&self) -> u64 {
        self.followed.as_ref().map_or(0, |f| f.view.version)
    }

    /// Whether the job has come further than this member: the step the topology carries is
    /// ahead of ours.
    pub(super) fn job_ahead(&self) -> bool {
        self.followed
            .as_ref()
            .is_some_and(|f| f.view.step > self.step)
    }

    /// The members beyond our neighbourhood, nearest last, for a joiner whose neighbours have
    /// not trained: read from the whole document (fetched once for this, when only the view is
    /// followed), their addresses handed to the transport.
    async fn members_beyond(&self, neighbours: &[MemberId]) -> Vec<MemberId> {
        let held = self.followed.as_ref().and_then(|f| f.document.clone());
        let doc = match (held, &self.control) {
            (Some(doc), _) => doc,
            (None, Some(c)) => match c.document_after(0).await {
                Ok(Some(doc)) => doc,
                Ok(None) => return Vec::new(),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the whole topology to find members beyond the neighbourhood");
                    return Vec::new();
                }
            },
            (None, None) => return Vec::new(),
        };
        let me = self.env.member_id;
        self.transport.learn_addresses(
            doc.members
                .iter()
                .filter(|m| m.id != me)
                .filter_map(|m| Some((m.id, m.address.clone()?))),
        );
        let mut beyond = beyond_neighbourhood(&doc, me, neighbours);
        beyond.reverse(); // popped from the back: nearest first
        beyond
    }

    /// Wait (serving state requests) until a topology that includes us arrives.
    pub(super) async fn wait_for_topology(&mut self) -> bool {
        loop {
            if self.stop.raised() {
                return false;
            }
            if self.apply_topology() {
                return true;
            }
            // Left out of a topology the control plane serves: it may not have kept our join.
            if self.followed.is_some() && self.joined_at.elapsed() >= JOIN_AGAIN {
                self.join_again();
            }
            self.serve_state_requests();
            let stopped = self.stop.bell.notified();
            tokio::select! {
                _ = self.topology.changed() => {}
                _ = stopped => {}
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
    }

    /// Ask the neighbours for their state; adopt the most advanced one if it is ahead of ours.
    /// Starting members meet here too: it returns once every neighbour is connected and has
    /// answered (or, starting afresh, sent its first round), or one is ahead (we are joining a
    /// running job), or the startup timeout passes.
    /// When the topology says the job is under way and no neighbour has trained (a whole clique
    /// replaced at once), the members beyond the neighbourhood are asked, a few at a time, until
    /// one is ahead.
    pub(super) async fn fetch_state(&mut self, timeout: Duration) -> Result<(), RunError> {
        let mut at = self.neighbour_addresses();
        let under_way = self.job_ahead();
        // Starting a job afresh, a neighbour that sent its first round's payload has met
        // everyone it waits for, and in that round it answers no state request: it waits for
        // ours (the two of us would wait out a round timeout, each for the other). A member
        // resumed from a checkpoint still waits for its neighbours' state.
        let afresh = !under_way && self.step == 0;
        if under_way {
            // Said at once, with nothing heard yet: a replacement whose neighbours all finish
            // before they answer it is retired by the control plane on this status, rather than
            // waiting out the timeout for members that will never answer.
            self.set_state(TrainerState::Joining);
        }
        let mut beyond: Option<Vec<MemberId>> = None;
        for &n in at.keys() {
            self.transport.request_state(n, self.step);
        }
        let mut asked_beyond: Vec<MemberId> = Vec::new();
        let deadline = Instant::now() + timeout;
        let mut replies: Vec<StateReply> = Vec::new();
        // Neighbours whose connection was up since we asked them, and those seen down after.
        let (mut seen_up, mut seen_down) = (BTreeSet::new(), BTreeSet::new());
        loop {
            self.serve_state_requests();
            replies.extend(self.transport.take_state_replies());
            // A neighbour replaced while we wait is a new process that never saw our request,
            // at the address the next topology brings: follow the topology here too, and ask
            // again whoever moved or connected anew (what its predecessor answered without a
            // state no longer counts).
            if !self.apply_topology() {
                break;
            }
            let connected = self.transport.connected_peers();
            let now = self.neighbour_addresses();
            for (&n, address) in &now {
                let moved = at.get(&n) != Some(address);
                let back = seen_down.contains(&n) && connected.contains(&n);
                if connected.contains(&n) {
                    seen_up.insert(n);
                } else if seen_up.contains(&n) {
                    seen_down.insert(n);
                }
                if moved || back {
                    replies.retain(|r| r.from != n || !r.parameters.is_empty());
                    self.transport.request_state(n, self.step);
                    seen_up.remove(&n);
                    seen_down.remove(&n);
                }
            }
            at = now;
            let neighbours: Vec<MemberId> = at.keys().copied().collect();
            let first_round = if afresh {
                self.transport.peers_in_first_round()
            } else {
                BTreeSet::new()
            };
            let replied = |n: &MemberId| replies.iter().any(|r| r.from == *n);
            // A member beyond that is gone (finished, or preempted with our neighbours) will
            // never answer: the next batch is asked rather than the timeout waited out.
            let beyond_answered = |n: &MemberId| replied(n) || self.transport.out_of_reach(*n);
            let everyone = neighbours
                .iter()
                .all(|n| connected.contains(n) && (replied(n) || first_round.contains(n)))
                && asked_beyond.iter().all(beyond_answered);
            // A step alone (a neighbour that has trained alone) is an answer, not a state.
            let ahead = replies
                .iter()
                .any(|r| r.step > self.step && !r.parameters.is_empty());
            if ahead || self.stop.raised() || (everyone && !under_way) {
                break;
            }
            if everyone {
                if beyond.is_none() {
                    beyond = Some(self.members_beyond(&neighbours).await);
                }
                let beyond = beyond.as_mut().expect("just found");
                if beyond.is_empty() {
                    tracing::warn!("the job is under way, but no member within reach has trained");
                    break;
                }
                let batch: Vec<MemberId> =
                    (0..STATE_ASK_BATCH).map_while(|_| beyond.pop()).collect();
                tracing::info!(
                    ?batch,
                    "no neighbour has trained yet; asking members beyond them"
                );
                for &n in &batch {
                    self.transport.request_state(n, self.step);
                }
                asked_beyond.extend(batch);
                continue;
            }
            if Instant::now() >= deadline {
                tracing::warn!(
                    ?neighbours,
                    ?connected,
                    "not every neighbour showed up in time; starting without them"
                );
                break;
            }
            self.transport
                .changed(tokio::time::Instant::now() + Duration::from_millis(200))
                .await;
        }
        if let Some((peer, step)) = self.adopt_best(&replies)? {
            match self.member.outer_state() {
                // The outer momentum's size: zero had it not come along.
                Some(outer) => tracing::info!(
                    peer,
                    step,
                    outer_momentum_norm = outer
                        .momentum
                        .iter()
                        .map(|v| f64::from(*v).powi(2))
                        .sum::<f64>()
                        .sqrt(),
                    "state transferred from a neighbour"
                ),
                None => tracing::info!(peer, step, "state transferred from a neighbour"),
            }
        }
        Ok(())
    }

    /// Take the state of the most advanced of `replies`, if it is ahead of ours: its peer and
    /// step.
    fn adopt_best(&mut self, replies: &[StateReply]) -> Result<Option<(MemberId, u64)>, RunError> {
        let Some(best) = replies
            .iter()
            .filter(|r| r.step > self.step && r.parameters.len() == self.member.transferable_len())
            .max_by_key(|r| r.step)
        else {
            return Ok(None);
        };
        self.member.set_transferable_state(&best.parameters)?;
        // Its optimizer state too: a fresh Adam's first steps move every parameter by the whole
        // learning rate, and averaging spreads that jolt to the neighbours.
        if !best.optimizer.is_empty()
            && let Err(e) = self.member.set_optimizer_state(best.optimizer.clone())
        {
            tracing::warn!(peer = best.from, error = %e, "its optimizer state does not fit ours; keeping our own");
        }
        self.jump_to(best.step);
        Ok(Some((best.from, best.step)))
    }

    /// Rounds with neighbours far ahead of us no longer meet: we wait a round timeout for each
    /// of their payloads, they for ours, and neither side ever catches up (a member that fell
    /// behind while a neighbour of it was lost, or while it was starved of CPU). Average our
    /// parameters with theirs and go on at the most advanced one's step, in step with them.
    /// Unlike a joiner's, our parameters are trained and are kept in the mean: a neighbour is
    /// far ahead because it trained faster, not better (the remnant of a clique that a node's
    /// death halved races ahead on the few labels it holds).
    pub(super) async fn catch_up(&mut self) -> Result<(), RunError> {
        let ahead = self.transport.far_ahead(CATCH_UP_ROUNDS);
        if ahead.is_empty() {
            return Ok(());
        }
        for &peer in &ahead {
            self.transport.request_state(peer, self.step);
        }
        let deadline = Instant::now() + self.plan.round_timeout;
        let mut replies: Vec<StateReply> = Vec::new();
        loop {
            self.serve_state_requests();
            replies.extend(self.transport.take_state_replies());
            let answered = ahead.iter().all(|p| replies.iter().any(|r| r.from == *p));
            if answered || self.stop.raised() || Instant::now() >= deadline {
                break;
            }
            self.transport
                .changed(tokio::time::Instant::now() + Duration::from_millis(200))
                .await;
        }
        let ahead: Vec<&StateReply> = replies
            .iter()
            .filter(|r| r.step > self.step && r.parameters.len() == self.member.transferable_len())
            .collect();
        let Some(step) = ahead.iter().map(|r| r.step).max() else {
            return Ok(());
        };
        let theirs: Vec<&[f32]> = ahead.iter().map(|r| r.parameters.as_slice()).collect();
        // With outer steps, anchors and outer momenta are averaged alike.
        let merged = mixing::mean(&self.member.transferable_state(), &theirs);
        self.member.set_transferable_state(&merged)?;
        let peers: Vec<MemberId> = ahead.iter().map(|r| r.from).collect();
        tracing::info!(
            ?peers,
            step,
            behind = step - self.step,
            "caught up with a neighbour far ahead"
        );
        self.jump_to(step);
        Ok(())
    }

    /// Go on from `step`, a state taken from a member further on: the transport judges rounds
    /// from the one that step is in.
    fn jump_to(&mut self, step: u64) {
        self.step = step;
        self.trained_alone = false;
        let round = match self.plan.member.averaging {
            Averaging::Every(n) => step / n.max(1),
            Averaging::Auto(_) => step,
        };
        self.transport.skip_to(round);
    }
}
