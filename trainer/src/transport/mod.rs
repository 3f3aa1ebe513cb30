//! Peers over TCP: the networked implementation of [`Exchange`]. No parameter server and no
//! coordinator: every member listens, dials the peers it sends to, and averages what arrives.
//!
//! Each connection carries one dialer's messages (hello, parameters, gradients, leave, state
//! requests) one way and the acceptor's answers (skip, state reply) the other. Every frame is
//! authenticated ([`frame`]); memory is bounded by [`book::WINDOW`] rounds of payloads per peer
//! on the receiving side, beyond which readers stop reading (TCP backpressure), and by a small
//! queue per peer on the sending side, which drops its oldest message when full (a peer that is
//! down for a while gets our latest rounds when it returns, not the first ones it missed).
//!
//! Where each concern lives:
//! - here: [`Transport`] and its config, what it hands the trainer (state requests and replies,
//!   drops, [`Agreements`]), and its [`Exchange`] and [`Mailbox`] implementations;
//! - `sessions.rs`: the frame kind of each purpose, the per-peer send queue, and the TCP
//!   session tasks (accepting, dialing, writing a peer's queue, reading its answers);
//! - [`book`]: the round book, which says who delivered, skipped or left, and which rounds
//!   are done;
//! - [`frame`] and [`session`]: the wire format and handshake, from `murmur-wire`.

pub mod book;
mod sessions;

pub use murmur_wire::{Stats, frame, session};

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};

use murmur_core::contract::DropReason;
use murmur_core::topology::MemberId;

use crate::algorithms::{Exchange, Letter, LetterKind, Mailbox, Payload, Purpose};
use book::{RoundBook, Standing};
use frame::Kind;
use sessions::{Outgoing, SendQueue, dial, payload_kind, payload_purpose, serve_incoming};

#[derive(Clone, Debug)]
pub struct TransportConfig {
    /// [`frame::job_id`] of this job.
    pub job: u64,
    pub me: MemberId,
    pub key: Vec<u8>,
    /// [`crate::model::Layout::fingerprint`]: peers with another model shape are refused.
    pub layout_fingerprint: u64,
    /// Largest message accepted: a full uncompressed parameter buffer and a little more.
    pub max_message: u64,
    pub round_timeout: Duration,
}

type ReplyTx = mpsc::Sender<Outgoing>;

/// A joining member asks for our parameters; answer with [`StateRequest::reply`].
pub struct StateRequest {
    pub from: MemberId,
    /// The requester's own step: a state no further on is of no use to it.
    pub step: u64,
    reply: ReplyTx,
}

/// What each peer's payloads must carry for us to mix them, and what ours carry to it. Members
/// that follow their views agree on the weight of their shared edge
/// ([`edge_agreement`](murmur_core::contract::view::edge_agreement)), so W stays symmetric
/// while views change one member at a time; members that follow the whole document agree on
/// its version.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Agreements {
    pub by_peer: BTreeMap<MemberId, u64>,
    /// For every peer not in `by_peer`.
    pub others: u64,
}

impl Agreements {
    /// The same agreement with every peer (a whole document's version).
    pub fn all(value: u64) -> Self {
        Self {
            by_peer: BTreeMap::new(),
            others: value,
        }
    }

    pub fn with(&self, peer: MemberId) -> u64 {
        self.by_peer.get(&peer).copied().unwrap_or(self.others)
    }
}

/// A neighbour's parameters and step, for a joining member.
#[derive(Clone, Debug, PartialEq)]
pub struct StateReply {
    pub from: MemberId,
    pub step: u64,
    /// The agreement it stamped on the reply (see [`Agreements`]).
    pub agreement: u64,
    pub parameters: Vec<f32>,
    /// Its optimizer state (a burn record; empty when it sent none).
    pub optimizer: Vec<u8>,
}

impl StateReply {
    /// The reply frame's payload: the parameter count (u64), the parameters (f32), then the
    /// optimizer state to the end.
    pub fn encode(parameters: &[f32], optimizer: &[u8]) -> Vec<u8> {
        let mut payload = Vec::with_capacity(8 + 4 * parameters.len() + optimizer.len());
        payload.extend_from_slice(&(parameters.len() as u64).to_le_bytes());
        payload.extend(parameters.iter().flat_map(|v| v.to_le_bytes()));
        payload.extend_from_slice(optimizer);
        payload
    }

    /// Parameters and optimizer state from a reply's payload; None when the count does not fit.
    pub fn decode(payload: &[u8]) -> Option<(Vec<f32>, Vec<u8>)> {
        let (count, rest) = payload.split_first_chunk::<8>()?;
        let bytes = usize::try_from(u64::from_le_bytes(*count))
            .ok()?
            .checked_mul(4)?;
        if bytes > rest.len() {
            return None;
        }
        let (parameters, optimizer) = rest.split_at(bytes);
        let parameters = parameters
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect();
        Some((parameters, optimizer.to_vec()))
    }
}

/// A neighbour missing from one of our rounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dropped {
    pub peer: MemberId,
    pub purpose: Purpose,
    pub round: u64,
    pub reason: DropReason,
}

struct Dialer {
    address: String,
    queue: Arc<SendQueue>,
    task: JoinHandle<()>,
    /// Cuts a re-dial backoff short: the peer just connected to us, so it is up again.
    kick: Arc<Notify>,
}

struct Shared {
    config: TransportConfig,
    agreements: Mutex<Agreements>,
    book: Mutex<RoundBook<ReplyTx>>,
    /// The agreements each posted round was sent under, until it is collected: a topology
    /// applied in between changes neither whom it waits for nor how their frames are judged.
    posted: Mutex<BTreeMap<(Purpose, u64), Agreements>>,
    /// Rung on every change a waiting round or the trainer loop may care about.
    changed: Notify,
    stats: Stats,
    state_requests: Mutex<Vec<StateRequest>>,
    state_replies: Mutex<Vec<StateReply>>,
    dialers: Mutex<BTreeMap<MemberId, Dialer>>,
    addresses: Mutex<BTreeMap<MemberId, String>>,
    drops: Mutex<Vec<Dropped>>,
    /// Accepted connections, so that [`Transport::close`] can cut them.
    sessions: Mutex<Vec<tokio::task::AbortHandle>>,
    /// Asynchronous gossip: letters waiting for the trainer's next step, in arrival order, at
    /// most one of each kind per peer (a newer one replaces it: a member has one request in
    /// flight per neighbour, so only the newest can still be answered or settled).
    letters: Mutex<Vec<(MemberId, Letter)>>,
    /// Where to answer each peer's gossip requests: the connection they came in on.
    reply_to: Mutex<BTreeMap<MemberId, ReplyTx>>,
    /// The furthest step a peer said, as it left, that the job ended at (0: none has).
    job_ended: AtomicU64,
}

impl Shared {
    fn agreement(&self, peer: MemberId) -> u64 {
        self.agreements.lock().with(peer)
    }

    fn deliver(&self, from: MemberId, letter: Letter) {
        let mut letters = self.letters.lock();
        letters.retain(|(peer, l)| !(*peer == from && l.kind == letter.kind));
        letters.push((from, letter));
    }
}

/// The TCP peer transport of one member.
#[derive(Clone)]
pub struct Transport {
    shared: Arc<Shared>,
    local_addr: SocketAddr,
    accept_task: Arc<JoinHandle<()>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        for (_, d) in std::mem::take(&mut *self.dialers.lock()) {
            d.task.abort();
        }
    }
}

impl Transport {
    /// Listen on `address` and start accepting peers.
    pub async fn bind(address: &str, config: TransportConfig) -> std::io::Result<Transport> {
        let listener = TcpListener::bind(address).await?;
        let local_addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            config,
            agreements: Mutex::default(),
            book: Mutex::new(RoundBook::default()),
            posted: Mutex::new(BTreeMap::new()),
            changed: Notify::new(),
            stats: Stats::default(),
            state_requests: Mutex::new(Vec::new()),
            state_replies: Mutex::new(Vec::new()),
            dialers: Mutex::new(BTreeMap::new()),
            addresses: Mutex::new(BTreeMap::new()),
            drops: Mutex::new(Vec::new()),
            sessions: Mutex::new(Vec::new()),
            letters: Mutex::new(Vec::new()),
            reply_to: Mutex::new(BTreeMap::new()),
            job_ended: AtomicU64::new(0),
        });
        let weak = Arc::downgrade(&shared);
        let accept_task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let Some(shared) = weak.upgrade() else { return };
                let session = tokio::spawn(serve_incoming(shared.clone(), stream));
                let mut sessions = shared.sessions.lock();
                sessions.retain(|s| !s.is_finished());
                sessions.push(session.abort_handle());
            }
        });
        Ok(Transport {
            shared,
            local_addr,
            accept_task: Arc::new(accept_task),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    pub fn me(&self) -> MemberId {
        self.shared.config.me
    }

    /// Follow a topology: stamp each peer's agreement on what we send it, and re-dial members
    /// whose address changed (a replacement on another node). Call at a round boundary only.
    pub fn set_topology(&self, agreements: Agreements, addresses: BTreeMap<MemberId, String>) {
        *self.shared.agreements.lock() = agreements;
        let mut moved = Vec::new();
        self.shared.dialers.lock().retain(|&id, d| {
            let keep = addresses.get(&id) == Some(&d.address);
            if !keep {
                d.task.abort();
                moved.push(id);
            }
            keep
        });
        *self.shared.addresses.lock() = addresses;
        // A new address is not known to fail.
        let mut book = self.shared.book.lock();
        for id in moved {
            book.dialed(id, true);
        }
    }

    /// Learn the addresses of members outside the topology followed (to ask them for state);
    /// the next [`set_topology`](Self::set_topology) forgets them.
    pub fn learn_addresses(&self, more: impl IntoIterator<Item = (MemberId, String)>) {
        let mut addresses = self.shared.addresses.lock();
        for (id, address) in more {
            addresses.entry(id).or_insert(address);
        }
    }

    /// Dial `peers` now (rather than on the first message), so they hear our hello early.
    pub fn connect(&self, peers: &[MemberId]) {
        for &p in peers {
            self.queue(p);
        }
    }

    fn queue(&self, peer: MemberId) -> Option<Arc<SendQueue>> {
        let mut dialers = self.shared.dialers.lock();
        if let Some(d) = dialers.get(&peer)
            && !d.task.is_finished()
        {
            return Some(d.queue.clone());
        }
        let address = self.shared.addresses.lock().get(&peer)?.clone();
        let queue = Arc::new(SendQueue::default());
        let kick = Arc::new(Notify::new());
        let task = tokio::spawn(dial(
            Arc::downgrade(&self.shared),
            peer,
            address.clone(),
            queue.clone(),
            kick.clone(),
        ));
        dialers.insert(
            peer,
            Dialer {
                address,
                queue: queue.clone(),
                task,
                kick,
            },
        );
        Some(queue)
    }

    /// Queue a message for `to`; false when `to` has no address. A payload pushed out of a full
    /// queue is no longer counted as sent, so its peer is answered "skip" if it asks.
    fn send(&self, to: MemberId, kind: Kind, round: u64, payload: impl Into<Payload>) -> bool {
        let Some(queue) = self.queue(to) else {
            return false;
        };
        let agreement = self.shared.agreement(to);
        let evicted = queue.push(Outgoing::new(kind, round, agreement, payload));
        if let Some(old) = evicted
            && let Some(purpose) = payload_purpose(old.kind)
        {
            self.shared
                .book
                .lock()
                .unrecord_sent(purpose, old.round, to);
        }
        true
    }

    /// The step the job ended at, where a peer that left said it did: it reached the stopping
    /// target, or ended because a peer of its own had.
    pub fn job_ended(&self) -> Option<u64> {
        match self.shared.job_ended.load(Ordering::Relaxed) {
            0 => None,
            step => Some(step),
        }
    }

    /// Whether `peer` said it left, or our last dial to it failed, and it has not been back
    /// since: it will not answer what we ask it now.
    pub fn out_of_reach(&self, peer: MemberId) -> bool {
        self.shared.book.lock().out_of_reach(peer)
    }

    /// Members with a live connection to us.
    pub fn connected_peers(&self) -> BTreeSet<MemberId> {
        self.peers_where(book::RoundBook::is_connected)
    }

    /// Members that have sent us their payload for round 0, which we have not closed (see
    /// [`RoundBook::in_first_round`](book::RoundBook::in_first_round)).
    pub fn peers_in_first_round(&self) -> BTreeSet<MemberId> {
        self.peers_where(book::RoundBook::in_first_round)
    }

    /// The peers of the topology for which `test` holds in the round book.
    fn peers_where(
        &self,
        test: impl Fn(&book::RoundBook<ReplyTx>, MemberId) -> bool,
    ) -> BTreeSet<MemberId> {
        let book = self.shared.book.lock();
        self.shared
            .addresses
            .lock()
            .keys()
            .copied()
            .filter(|&p| test(&book, p))
            .collect()
    }

    /// Wait until something arrives or changes (a payload, a request, a connection).
    pub async fn changed(&self, deadline: Instant) {
        let _ = tokio::time::timeout_at(deadline, self.shared.changed.notified()).await;
    }

    pub fn take_drops(&self) -> Vec<Dropped> {
        std::mem::take(&mut *self.shared.drops.lock())
    }

    pub fn take_state_requests(&self) -> Vec<StateRequest> {
        std::mem::take(&mut *self.shared.state_requests.lock())
    }

    pub fn take_state_replies(&self) -> Vec<StateReply> {
        std::mem::take(&mut *self.shared.state_replies.lock())
    }

    /// Neighbours so far ahead of us (more than `gap` rounds) that rounds with them no longer
    /// meet: their payloads wait for room we will not have for a long while.
    pub fn far_ahead(&self, gap: u64) -> Vec<MemberId> {
        self.shared.book.lock().far_ahead(gap)
    }

    /// Our next parameter round is `round`: we took the state of a member further on. Payloads
    /// up to the window past it have room, and a neighbour is far ahead only if it is past it.
    /// Without this, the round we last completed stands for ours until our next one begins, and
    /// with local steps between rounds each of them finds the neighbour we just caught up with
    /// far ahead again.
    pub fn skip_to(&self, round: u64) {
        self.shared.book.lock().begin(Purpose::Parameters, round);
        self.shared.changed.notify_waiters();
    }

    /// Ask `peer` for its state; `step` is ours, so that a peer no further on answers with
    /// its step alone.
    pub fn request_state(&self, peer: MemberId, step: u64) -> bool {
        self.send(peer, Kind::StateRequest, step, Vec::new())
    }

    /// Answer a state request with our step, parameters and optimizer state.
    pub fn reply_state(
        &self,
        request: StateRequest,
        step: u64,
        parameters: &[f32],
        optimizer: &[u8],
    ) {
        let mut payload = StateReply::encode(parameters, optimizer);
        if payload.len() as u64 > self.shared.config.max_message {
            // The joiner would refuse it whole: the parameters alone still get it going.
            tracing::warn!(
                bytes = payload.len(),
                "the optimizer state does not fit a message; sending the parameters alone"
            );
            payload = StateReply::encode(parameters, &[]);
        }
        let _ = request.reply.try_send(Outgoing::new(
            Kind::StateReply,
            step,
            self.shared.agreement(request.from),
            payload,
        ));
    }

    /// Tell every peer we dialed that nothing more will come, and wait (at most `within`) until
    /// everything queued, the leave included, is written — except to a peer that has left
    /// itself, or that our last dial could not reach: the first needs nothing more from us, and
    /// with either one's listener gone the queue would only wait out `within` (5 s at the end
    /// of every run whose neighbours finished first). `ended`: the step the job ended at, when
    /// we leave because it did (the leave's round carries it; 0 is a leave mid-job), so that a
    /// neighbour still short of it ends too: see [`job_ended`](Self::job_ended).
    pub async fn leave(&self, ended: Option<u64>, within: Duration) {
        let queues: Vec<(MemberId, Arc<SendQueue>)> = self
            .shared
            .dialers
            .lock()
            .iter()
            .map(|(peer, d)| (*peer, d.queue.clone()))
            .collect();
        let mut written = Vec::new();
        for (peer, q) in queues {
            let (tx, rx) = oneshot::channel();
            q.push(Outgoing {
                written: Some(tx),
                ..Outgoing::new(Kind::Leave, ended.unwrap_or(0), 0, Vec::new())
            });
            written.push((peer, rx));
        }
        let _ = timeout(within, async {
            for (peer, mut rx) in written {
                loop {
                    let changed = self.shared.changed.notified();
                    tokio::pin!(changed);
                    changed.as_mut().enable();
                    if self.out_of_reach(peer) {
                        break;
                    }
                    tokio::select! {
                        _ = &mut rx => break,
                        _ = changed => {}
                    }
                }
            }
        })
        .await;
    }
}

impl Transport {
    /// Stop listening and cut every connection at once, as if the process died.
    pub fn close(&self) {
        self.accept_task.abort();
        for s in std::mem::take(&mut *self.shared.sessions.lock()) {
            s.abort();
        }
        for (_, d) in std::mem::take(&mut *self.shared.dialers.lock()) {
            d.task.abort();
        }
    }
}

impl Drop for Transport {
    fn drop(&mut self) {
        if Arc::strong_count(&self.accept_task) == 1 {
            self.accept_task.abort();
        }
    }
}

impl Exchange for Transport {
    fn post_round(&mut self, round: u64, purpose: Purpose, outgoing: Vec<(MemberId, Payload)>) {
        let agreements = self.shared.agreements.lock().clone();
        let mut posted = self.shared.posted.lock();
        // A round posted and never collected (its member took a neighbour's state) goes once
        // it is out of the book's window.
        posted.retain(|&(p, r), _| p != purpose || r + book::WINDOW >= round);
        posted.insert((purpose, round), agreements);
        drop(posted);
        self.shared.book.lock().begin(purpose, round);
        // Readers held back by the window may have room now.
        self.shared.changed.notify_waiters();
        for (to, payload) in outgoing {
            // Recorded before it can arrive, so a quick answer finds it; undone if not queued.
            self.shared.book.lock().record_sent(purpose, round, to);
            if !self.send(to, payload_kind(purpose), round, payload) {
                self.shared.book.lock().unrecord_sent(purpose, round, to);
            }
        }
    }

    async fn collect_round(
        &mut self,
        round: u64,
        purpose: Purpose,
        from: &[MemberId],
    ) -> Vec<(MemberId, Payload)> {
        let posted = self.shared.posted.lock().remove(&(purpose, round));
        let agreements = posted.unwrap_or_else(|| self.shared.agreements.lock().clone());
        // Counted from the collect: a round posted long before (overlap) still gets its time.
        let deadline = Instant::now() + self.shared.config.round_timeout;
        let (used, excluded) = loop {
            // Register for the next change before looking, so none is missed in between.
            let notified = self.shared.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let mut ready = Vec::new();
            let mut waiting = Vec::new();
            let mut excluded = BTreeMap::new();
            {
                let book = self.shared.book.lock();
                for &p in from {
                    match book.standing(purpose, round, p, agreements.with(p)) {
                        Standing::Ready => ready.push(p),
                        Standing::Excluded(reason) => {
                            excluded.insert(p, reason);
                        }
                        Standing::Waiting => waiting.push(p),
                    }
                }
            }
            let reasons: Vec<DropReason> = excluded.values().copied().collect();
            if !book::keeps_waiting(ready.len(), waiting.len(), &reasons)
                || Instant::now() >= deadline
            {
                for p in waiting {
                    excluded.insert(p, DropReason::Timeout);
                }
                break (ready, excluded);
            }
            let _ = tokio::time::timeout_at(deadline, notified).await;
        };
        let done = self.shared.book.lock().complete(purpose, round, &used);
        // Readers held back by the window may go on.
        self.shared.changed.notify_waiters();
        for (to, reply) in done.skip_to {
            let _ = reply.try_send(Outgoing::skip(purpose, round, agreements.with(to)));
        }
        self.shared
            .drops
            .lock()
            .extend(excluded.into_iter().map(|(peer, reason)| Dropped {
                peer,
                purpose,
                round,
                reason,
            }));
        done.delivered
            .into_iter()
            .map(|(from, payload)| (from, Payload::new(payload)))
            .collect()
    }
}

/// Asynchronous gossip over TCP: nothing here waits. A request goes to the peer's send queue
/// (its dialer writes it when it can; a queue that is full drops its oldest message), a reply
/// goes back on the connection its request came in on, or nowhere if that one is gone. A slow
/// or dead peer therefore costs a queued message, never time: the round book is not involved.
impl Mailbox for Transport {
    fn post(&mut self, to: MemberId, letter: Letter) {
        match letter.kind {
            LetterKind::Request => {
                self.send(to, Kind::GossipRequest, letter.seq, letter.payload);
            }
            LetterKind::Reply => {
                let reply = self.shared.reply_to.lock().get(&to).cloned();
                if let Some(reply) = reply {
                    let _ = reply.try_send(Outgoing::new(
                        Kind::GossipReply,
                        letter.seq,
                        self.shared.agreement(to),
                        letter.payload,
                    ));
                }
            }
        }
    }

    fn collect(&mut self) -> Vec<(MemberId, Letter)> {
        std::mem::take(&mut *self.shared.letters.lock())
    }
}

#[cfg(test)]
mod tests;
