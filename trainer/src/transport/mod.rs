//! Peers over TCP: the networked implementation of [`Exchange`]. No parameter server and no
//! coordinator: every member listens, dials the peers it sends to, and averages what arrives.
//!
//! Each connection carries one dialer's messages (hello, parameters, gradients, leave, state
//! requests) one way and the acceptor's answers (skip, state reply) the other. Every frame is
//! authenticated ([`frame`]); memory is bounded by [`book::WINDOW`] rounds of payloads per peer
//! on the receiving side, beyond which readers stop reading (TCP backpressure), and by a small
//! queue per peer on the sending side, which drops its oldest message when full (a peer that is
//! down for a while gets our latest rounds when it returns, not the first ones it missed).

pub mod book;

pub use murmur_wire::{Stats, frame, session};

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};

use murmur_core::contract::DropReason;
use murmur_core::topology::MemberId;

use crate::algorithms::{Exchange, Letter, LetterKind, Mailbox, Payload, Purpose};
use book::{Deposit, RoundBook, Standing};
use frame::{Assembler, Hello, Kind, Reject, SessionCipher};
use session::{ReadError, read_message, template, write_message};

/// The frame kind that carries a payload of `purpose`.
fn payload_kind(purpose: Purpose) -> Kind {
    match purpose {
        Purpose::Parameters => Kind::Parameters,
        Purpose::Gradients => Kind::Gradients,
    }
}

/// The frame kind that says "not using yours, do not wait for mine" for `purpose`.
fn skip_kind(purpose: Purpose) -> Kind {
    match purpose {
        Purpose::Parameters => Kind::SkipParameters,
        Purpose::Gradients => Kind::SkipGradients,
    }
}

/// The inverse of [`payload_kind`].
fn payload_purpose(kind: Kind) -> Option<Purpose> {
    Purpose::ALL.into_iter().find(|p| payload_kind(*p) == kind)
}

/// The inverse of [`skip_kind`].
fn skip_purpose(kind: Kind) -> Option<Purpose> {
    Purpose::ALL.into_iter().find(|p| skip_kind(*p) == kind)
}

/// Messages queued per peer on the sending side (newest win: see [`SendQueue`]).
const SEND_QUEUE: usize = 4;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

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

struct Outgoing {
    kind: Kind,
    round: u64,
    agreement: u64,
    payload: Payload,
    /// Told once the message is written (leave waits on it before the process exits).
    written: Option<oneshot::Sender<()>>,
}

impl Outgoing {
    fn new(kind: Kind, round: u64, agreement: u64, payload: impl Into<Payload>) -> Self {
        Self {
            kind,
            round,
            agreement,
            payload: payload.into(),
            written: None,
        }
    }

    /// "Your payload for this round was not used: do not wait for mine."
    fn skip(purpose: Purpose, round: u64, agreement: u64) -> Self {
        Self::new(skip_kind(purpose), round, agreement, Vec::new())
    }
}

type ReplyTx = mpsc::Sender<Outgoing>;

/// What waits to be written to one peer. Bounded, and when full the *oldest* message goes: while
/// a peer is unreachable (restarting after a preemption), what matters on its return is our
/// latest rounds, not the first few it missed.
#[derive(Default)]
struct SendQueue {
    items: Mutex<std::collections::VecDeque<Outgoing>>,
    ready: Notify,
}

impl SendQueue {
    /// Queue `m`; returns the message evicted to make room, if any.
    fn push(&self, m: Outgoing) -> Option<Outgoing> {
        let mut items = self.items.lock();
        let evicted = (items.len() >= SEND_QUEUE)
            .then(|| items.pop_front())
            .flatten();
        items.push_back(m);
        drop(items);
        self.ready.notify_one();
        evicted
    }

    async fn pop(&self) -> Outgoing {
        loop {
            let ready = self.ready.notified();
            tokio::pin!(ready);
            ready.as_mut().enable();
            if let Some(m) = self.items.lock().pop_front() {
                return m;
            }
            ready.await;
        }
    }
}

/// A joining member asks for our parameters; answer with [`StateRequest::reply`].
pub struct StateRequest {
    pub from: MemberId,
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

    /// Members with a live connection to us.
    pub fn connected_peers(&self) -> BTreeSet<MemberId> {
        let book = self.shared.book.lock();
        self.shared
            .addresses
            .lock()
            .keys()
            .copied()
            .filter(|&p| book.is_connected(p))
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

    /// Ask `peer` for its parameters and step.
    pub fn request_state(&self, peer: MemberId) -> bool {
        self.send(peer, Kind::StateRequest, 0, Vec::new())
    }

    /// Answer a state request with our step and parameters.
    pub fn reply_state(&self, request: StateRequest, step: u64, parameters: &[f32]) {
        let payload: Vec<u8> = parameters.iter().flat_map(|v| v.to_le_bytes()).collect();
        let _ = request.reply.try_send(Outgoing::new(
            Kind::StateReply,
            step,
            self.shared.agreement(request.from),
            payload,
        ));
    }

    /// Tell every peer we dialed that nothing more will come, and wait (at most `within`) until
    /// everything queued, the leave included, is written.
    pub async fn leave(&self, within: Duration) {
        let queues: Vec<Arc<SendQueue>> = self
            .shared
            .dialers
            .lock()
            .values()
            .map(|d| d.queue.clone())
            .collect();
        let mut written = Vec::new();
        for q in queues {
            let (tx, rx) = oneshot::channel();
            q.push(Outgoing {
                written: Some(tx),
                ..Outgoing::new(Kind::Leave, 0, 0, Vec::new())
            });
            written.push(rx);
        }
        let _ = timeout(within, async {
            for rx in written {
                let _ = rx.await;
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
    async fn exchange(
        &mut self,
        round: u64,
        purpose: Purpose,
        outgoing: Vec<(MemberId, Payload)>,
        from: &[MemberId],
    ) -> Vec<(MemberId, Payload)> {
        let agreements = self.shared.agreements.lock().clone();
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

/// The next message from `peer` on a session, or `None` once the session is over: closed, or
/// cut after a refused frame (counted under its reason).
async fn next_from<R: tokio::io::AsyncRead + Unpin>(
    shared: &Shared,
    peer: MemberId,
    reader: &mut R,
    opener: &mut SessionCipher,
    assembler: &mut Assembler,
) -> Option<frame::Message> {
    let config = &shared.config;
    let message = read_message(
        reader,
        opener,
        assembler,
        config.job,
        config.max_message,
        &shared.stats,
    )
    .await;
    match message {
        Ok(m) if m.sender != peer => shared.stats.reject(Reject::WrongSender),
        Ok(m) => return Some(m),
        Err(ReadError::Rejected(r)) => shared.stats.reject(r),
        Err(_) => {}
    }
    None
}

/// One accepted connection: challenge, hello, then the dialer's messages until it closes.
async fn serve_incoming(shared: Arc<Shared>, stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let (mut reader, mut writer) = stream.into_split();
    let config = &shared.config;
    let nonce = session::fresh_nonce();
    if session::send_challenge(&mut writer, &nonce).await.is_err() {
        return;
    }
    let mut opener = SessionCipher::new(&config.key, nonce);
    let mut assembler = Assembler::default();
    // Until the hello checks out, nothing bigger than a hello is read.
    let first = timeout(
        HANDSHAKE_TIMEOUT,
        read_message(
            &mut reader,
            &mut opener,
            &mut assembler,
            config.job,
            Hello::LEN as u64,
            &shared.stats,
        ),
    )
    .await;
    let hello_message = match first {
        Ok(Ok(m)) if m.kind == Kind::Hello => m,
        Ok(Ok(_)) => return shared.stats.reject(Reject::Malformed),
        Ok(Err(ReadError::Rejected(Reject::UnsupportedVersion))) => {
            tracing::warn!(
                ours = frame::PROTOCOL_VERSION,
                "refused a peer that speaks another murmur wire protocol version: every member \
                 of a job must run the same murmur release"
            );
            return shared.stats.reject(Reject::UnsupportedVersion);
        }
        Ok(Err(ReadError::Rejected(r))) => return shared.stats.reject(r),
        _ => return,
    };
    let hello = match Hello::decode(&hello_message.payload) {
        Ok(h) => h,
        Err(r) => return shared.stats.reject(r),
    };
    if hello.layout_fingerprint != config.layout_fingerprint {
        return shared.stats.reject(Reject::ShapeMismatch);
    }
    let peer = hello_message.sender;

    // Answers (skip, state reply) go back on this connection, sealed with the dialer's nonce.
    let (reply_tx, mut reply_rx) = mpsc::channel::<Outgoing>(SEND_QUEUE);
    let mut sealer = SessionCipher::new(&config.key, hello.nonce);
    let stats_owner = shared.clone();
    let (job, me) = (config.job, config.me);
    let replier = tokio::spawn(async move {
        while let Some(m) = reply_rx.recv().await {
            let t = template(m.kind, job, me, m.agreement, m.round);
            if write_message(&mut writer, &mut sealer, t, &m.payload, &stats_owner.stats)
                .await
                .is_err()
            {
                return;
            }
        }
    });

    shared.book.lock().session_opened(peer);
    if let Some(d) = shared.dialers.lock().get(&peer) {
        d.kick.notify_one();
    }
    shared.changed.notify_waiters();
    while let Some(message) =
        next_from(&shared, peer, &mut reader, &mut opener, &mut assembler).await
    {
        match message.kind {
            Kind::Parameters | Kind::Gradients => {
                let purpose = payload_purpose(message.kind).expect("a payload kind");
                // Backpressure: a peer far ahead waits in its TCP window, not in our memory
                // (and the trainer learns how far ahead it is: `far_ahead`).
                loop {
                    let notified = shared.changed.notified();
                    tokio::pin!(notified);
                    notified.as_mut().enable();
                    let room = {
                        let mut book = shared.book.lock();
                        let room = book.has_room(purpose, message.round);
                        if room {
                            book.release(peer);
                        } else {
                            book.hold(peer, purpose, message.round);
                        }
                        room
                    };
                    if room {
                        break;
                    }
                    notified.await;
                }
                let deposit = shared.book.lock().deposit(
                    peer,
                    purpose,
                    message.round,
                    message.agreement,
                    message.payload,
                    reply_tx.clone(),
                );
                match deposit {
                    Deposit::Stored => shared.changed.notify_waiters(),
                    Deposit::Late { skip_to: Some(tx) } => {
                        let agreement = shared.agreement(peer);
                        let _ = tx.try_send(Outgoing::skip(purpose, message.round, agreement));
                    }
                    Deposit::Late { skip_to: None } => {}
                    Deposit::Rejected(r) => shared.stats.reject(r),
                }
            }
            Kind::Leave => {
                shared.book.lock().left(peer);
                shared.changed.notify_waiters();
            }
            Kind::StateRequest => {
                shared.book.lock().state_requested(peer);
                shared.state_requests.lock().push(StateRequest {
                    from: peer,
                    reply: reply_tx.clone(),
                });
                shared.changed.notify_waiters();
            }
            Kind::GossipRequest => {
                shared.reply_to.lock().insert(peer, reply_tx.clone());
                shared.deliver(
                    peer,
                    Letter {
                        kind: LetterKind::Request,
                        seq: message.round,
                        payload: Payload::new(message.payload),
                    },
                );
            }
            Kind::Hello
            | Kind::StateReply
            | Kind::SkipParameters
            | Kind::SkipGradients
            | Kind::GossipReply => {
                shared.stats.reject(Reject::Malformed);
                break;
            }
        }
    }
    shared.book.lock().session_closed(peer);
    shared.changed.notify_waiters();
    // Let queued answers go out, then stop.
    drop(reply_tx);
    let _ = timeout(HANDSHAKE_TIMEOUT, replier).await;
}

/// Keep a connection to `peer` up and write its queue to it, re-dialing with backoff.
async fn dial(
    shared: std::sync::Weak<Shared>,
    peer: MemberId,
    address: String,
    queue: Arc<SendQueue>,
    kick: Arc<Notify>,
) {
    // 50 ms, doubling up to MAX_BACKOFF, for as long as the peer is in the topology (the
    // dialer is aborted when it leaves); a connection from the peer cuts a wait short.
    let redial = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(50))
        .with_max_delay(MAX_BACKOFF)
        .with_factor(2.0)
        .without_max_times();
    let wait = move |pause: Duration| {
        let kick = kick.clone();
        async move {
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = kick.notified() => {}
            }
        }
    };
    loop {
        let connect = || async {
            match timeout(CONNECT_TIMEOUT, TcpStream::connect(&address)).await {
                Ok(connected) => connected,
                Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
            }
        };
        let dial_failed = |_: &std::io::Error, _: Duration| {
            if let Some(shared) = shared.upgrade() {
                shared.book.lock().dialed(peer, false);
                shared.changed.notify_waiters();
            }
        };
        let stream = connect
            .retry(redial)
            .sleep(wait.clone())
            .when(|_| shared.strong_count() > 0)
            .notify(dial_failed)
            .await;
        let (Ok(stream), Some(shared)) = (stream, shared.upgrade()) else {
            return;
        };
        shared.book.lock().dialed(peer, true);
        run_outgoing(&shared, peer, stream, &queue).await;
    }
}

/// One outgoing connection, until it breaks (the dialer then re-dials). The dialer task is
/// aborted when its peer leaves the topology or the transport closes.
async fn run_outgoing(shared: &Arc<Shared>, peer: MemberId, stream: TcpStream, queue: &SendQueue) {
    let _ = stream.set_nodelay(true);
    let (mut reader, mut writer) = stream.into_split();
    let config = &shared.config;
    let challenge = match timeout(HANDSHAKE_TIMEOUT, session::read_challenge(&mut reader)).await {
        Ok(Ok(challenge)) => challenge,
        Ok(Err(refused @ ReadError::PeerVersion { .. })) => {
            shared.stats.reject(Reject::UnsupportedVersion);
            tracing::warn!(%peer, "{refused}: every member of a job must run the same murmur release");
            return;
        }
        _ => return,
    };
    let mut sealer = SessionCipher::new(&config.key, challenge);
    let my_nonce = session::fresh_nonce();
    let hello = Hello {
        nonce: my_nonce,
        layout_fingerprint: config.layout_fingerprint,
    };
    let t = template(
        Kind::Hello,
        config.job,
        config.me,
        shared.agreement(peer),
        0,
    );
    if write_message(&mut writer, &mut sealer, t, &hello.encode(), &shared.stats)
        .await
        .is_err()
    {
        return;
    }

    // The acceptor's answers: skips and state replies.
    let answers = {
        let shared = shared.clone();
        let mut opener = SessionCipher::new(&config.key, my_nonce);
        tokio::spawn(async move {
            let mut assembler = Assembler::default();
            while let Some(message) =
                next_from(&shared, peer, &mut reader, &mut opener, &mut assembler).await
            {
                match message.kind {
                    Kind::SkipParameters | Kind::SkipGradients => {
                        let purpose = skip_purpose(message.kind).expect("a skip kind");
                        shared.book.lock().skipped(purpose, message.round, peer);
                    }
                    Kind::StateReply if message.payload.len().is_multiple_of(4) => {
                        let parameters = message
                            .payload
                            .chunks_exact(4)
                            .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
                            .collect();
                        shared.state_replies.lock().push(StateReply {
                            from: peer,
                            step: message.round,
                            agreement: message.agreement,
                            parameters,
                        });
                    }
                    Kind::GossipReply => shared.deliver(
                        peer,
                        Letter {
                            kind: LetterKind::Reply,
                            seq: message.round,
                            payload: Payload::new(message.payload),
                        },
                    ),
                    _ => return shared.stats.reject(Reject::Malformed),
                }
                shared.changed.notify_waiters();
            }
        })
    };
    tokio::pin!(answers);
    loop {
        tokio::select! {
            m = queue.pop() => {
                // Queued while the peer was unreachable, for a round long finished.
                if let Some(purpose) = payload_purpose(m.kind)
                    && shared.book.lock().is_outdated(purpose, m.round)
                {
                    continue;
                }
                let t = template(m.kind, config.job, config.me, m.agreement, m.round);
                if write_message(&mut writer, &mut sealer, t, &m.payload, &shared.stats).await.is_err() {
                    answers.abort();
                    return;
                }
                if let Some(done) = m.written {
                    let _ = done.send(());
                }
            }
            _ = &mut answers => return,
        }
    }
}

#[cfg(test)]
mod tests;
