//! The TCP side of the transport: the frame kind of each purpose, the per-peer send queue, and
//! the tasks that run a session (an accepted connection, a dialer and its outgoing connection).

use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use tokio::net::TcpStream;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::timeout;

use murmur_core::topology::MemberId;

use super::book::Deposit;
use super::frame::{self, Assembler, Hello, Kind, Reject, SessionCipher};
use super::session::{self, ReadError, read_message, template, write_message};
use super::{Shared, StateReply, StateRequest};
use crate::algorithms::{Letter, LetterKind, Payload, Purpose};

/// The frame kind that carries a payload of `purpose`.
pub(super) fn payload_kind(purpose: Purpose) -> Kind {
    match purpose {
        Purpose::Parameters => Kind::Parameters,
        Purpose::Gradients => Kind::Gradients,
    }
}

/// The frame kind that says "not using yours, do not wait for mine" for `purpose`.
pub(super) fn skip_kind(purpose: Purpose) -> Kind {
    match purpose {
        Purpose::Parameters => Kind::SkipParameters,
        Purpose::Gradients => Kind::SkipGradients,
    }
}

/// The inverse of [`payload_kind`].
pub(super) fn payload_purpose(kind: Kind) -> Option<Purpose> {
    Purpose::ALL.into_iter().find(|p| payload_kind(*p) == kind)
}

/// The inverse of [`skip_kind`].
pub(super) fn skip_purpose(kind: Kind) -> Option<Purpose> {
    Purpose::ALL.into_iter().find(|p| skip_kind(*p) == kind)
}

/// Messages queued per peer on the sending side (newest win: see [`SendQueue`]).
const SEND_QUEUE: usize = 4;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

pub(super) struct Outgoing {
    pub(super) kind: Kind,
    pub(super) round: u64,
    pub(super) agreement: u64,
    pub(super) payload: Payload,
    /// Told once the message is written (leave waits on it before the process exits).
    pub(super) written: Option<oneshot::Sender<()>>,
}

impl Outgoing {
    pub(super) fn new(kind: Kind, round: u64, agreement: u64, payload: impl Into<Payload>) -> Self {
        Self {
            kind,
            round,
            agreement,
            payload: payload.into(),
            written: None,
        }
    }

    /// "Your payload for this round was not used: do not wait for mine."
    pub(super) fn skip(purpose: Purpose, round: u64, agreement: u64) -> Self {
        Self::new(skip_kind(purpose), round, agreement, Vec::new())
    }
}

/// What waits to be written to one peer. Bounded, and when full the *oldest* message of the new
/// one's kind goes (the oldest of all where none shares it): while a peer is unreachable
/// (restarting after a preemption), what matters on its return is our latest rounds, not the
/// first few it missed, and an overlapped parameter round waiting behind the gradient rounds of
/// the steps that followed it is still that kind's latest.
#[derive(Default)]
pub(super) struct SendQueue {
    items: Mutex<std::collections::VecDeque<Outgoing>>,
    ready: Notify,
}

impl SendQueue {
    /// Queue `m`; returns the message evicted to make room, if any.
    pub(super) fn push(&self, m: Outgoing) -> Option<Outgoing> {
        let mut items = self.items.lock();
        let evicted = (items.len() >= SEND_QUEUE)
            .then(|| {
                let at = items.iter().position(|o| o.kind == m.kind).unwrap_or(0);
                items.remove(at)
            })
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
pub(super) async fn serve_incoming(shared: Arc<Shared>, stream: TcpStream) {
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
                // Its round: the step the job ended at, when that is why it leaves.
                shared
                    .job_ended
                    .fetch_max(message.round, std::sync::atomic::Ordering::Relaxed);
                shared.changed.notify_waiters();
            }
            Kind::StateRequest => {
                shared.book.lock().state_requested(peer);
                shared.state_requests.lock().push(StateRequest {
                    from: peer,
                    step: message.round,
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
pub(super) async fn dial(
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
                    Kind::StateReply => {
                        let Some((parameters, optimizer)) = StateReply::decode(&message.payload)
                        else {
                            return shared.stats.reject(Reject::Malformed);
                        };
                        shared.state_replies.lock().push(StateReply {
                            from: peer,
                            step: message.round,
                            agreement: message.agreement,
                            parameters,
                            optimizer,
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
mod queue_tests {
    use super::*;

    fn message(kind: Kind, round: u64) -> Outgoing {
        Outgoing::new(kind, round, 0, Vec::new())
    }

    #[test]
    fn a_full_queue_evicts_the_oldest_message_of_the_new_ones_kind() {
        let q = SendQueue::default();
        let params = payload_kind(Purpose::Parameters);
        let grads = payload_kind(Purpose::Gradients);
        assert!(q.push(message(params, 0)).is_none());
        for round in 0..3 {
            assert!(q.push(message(grads, round)).is_none());
        }
        // A fourth gradient round: the oldest gradient round goes, the parameters stay.
        let evicted = q.push(message(grads, 3)).expect("full");
        assert_eq!((evicted.kind, evicted.round), (grads, 0));
        // A kind with nothing queued evicts the oldest message of all.
        let evicted = q.push(message(Kind::GossipRequest, 9)).expect("full");
        assert_eq!((evicted.kind, evicted.round), (params, 0));
        let kept: Vec<(Kind, u64)> = q.items.lock().iter().map(|o| (o.kind, o.round)).collect();
        assert_eq!(
            kept,
            [(grads, 1), (grads, 2), (grads, 3), (Kind::GossipRequest, 9)]
        );
    }
}
