//! The bookkeeping of rounds, pure: what each peer delivered, skipped or announced, what we sent,
//! and which rounds are done. The TCP tasks feed it; [`Exchange`](crate::algorithms::Exchange)
//! asks it whom it still waits for. No I/O and no clock: both are the caller's.
//!
//! The rule that keeps rounds from stalling on a topology change: a member that receives a
//! payload it will not use, and did not send its own to that peer for the same round, answers
//! "skip". So a peer that still counts on us (it holds another weight for our edge, or another
//! Moshpit group) learns at once not to wait; only a silent, dead or partitioned peer costs a
//! round timeout.

use std::collections::{BTreeMap, BTreeSet};

use murmur_core::contract::DropReason;
use murmur_core::topology::MemberId;

use super::frame::Reject;
use crate::algorithms::Purpose;

/// Rounds ahead of our current one that a peer may deliver before its reader stops reading
/// (backpressure): memory is bounded by this many payloads per peer and purpose.
pub const WINDOW: u64 = 2;
/// Payloads more than this many rounds behind our last completed round are rejected as stale.
pub const STALE_ROUNDS: u64 = 16;

type Key = (Purpose, u64, MemberId);

struct Stored<R> {
    /// What the sender stamped on it (see [`Agreements`](super::Agreements)).
    agreement: u64,
    payload: Vec<u8>,
    /// Where to send "skip" if we do not use it.
    reply: R,
}

#[derive(Default)]
struct Peer {
    live_sessions: u32,
    ever_connected: bool,
    left: bool,
    /// Asked for our state mid-job and has not delivered a payload since: not waited for.
    joining: bool,
    /// Our last dial failed and it has not connected to us since.
    unreachable: bool,
    /// Highest round delivered per purpose in the current session (duplicates are replays).
    last_round: BTreeMap<Purpose, u64>,
}

/// Where a peer stands for one round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Its payload is here, with the agreement we hold with it.
    Ready,
    /// It will not contribute to this round.
    Excluded(DropReason),
    /// Nothing yet: keep waiting until the round timeout.
    Waiting,
}

/// What became of a delivered payload.
#[derive(Debug, PartialEq, Eq)]
pub enum Deposit<R> {
    Stored,
    /// For a round we already finished; `skip_to` is where to say "skip" if we never sent ours.
    Late {
        skip_to: Option<R>,
    },
    Rejected(Reject),
}

/// A closed round: the payloads to average, and the peers to tell "skip".
pub struct Completed<R> {
    pub delivered: Vec<(MemberId, Vec<u8>)>,
    pub skip_to: Vec<(MemberId, R)>,
}

pub struct RoundBook<R> {
    completed: BTreeMap<Purpose, u64>,
    /// The round an exchange is under way for: with auto averaging rounds are steps, and the
    /// next one may lie far beyond the last completed.
    begun: BTreeMap<Purpose, u64>,
    stored: BTreeMap<Key, Stored<R>>,
    skips: BTreeSet<Key>,
    sent: BTreeSet<Key>,
    peers: BTreeMap<MemberId, Peer>,
    /// Payloads held back for want of room (their peer is ahead of us), by peer.
    held: BTreeMap<MemberId, (Purpose, u64)>,
}

impl<R> Default for RoundBook<R> {
    fn default() -> Self {
        Self {
            completed: BTreeMap::new(),
            begun: BTreeMap::new(),
            stored: BTreeMap::new(),
            skips: BTreeSet::new(),
            sent: BTreeSet::new(),
            peers: BTreeMap::new(),
            held: BTreeMap::new(),
        }
    }
}

impl<R: Clone> RoundBook<R> {
    fn is_completed(&self, purpose: Purpose, round: u64) -> bool {
        self.completed.get(&purpose).is_some_and(|&c| round <= c)
    }

    /// Whether a payload for `round` may be stored now, or its reader must wait (backpressure).
    /// Before our first round we cannot tell ahead from behind (a replacement starts mid-job),
    /// so nothing is held back; senders queue only a few messages per peer anyway.
    pub fn has_room(&self, purpose: Purpose, round: u64) -> bool {
        self.current(purpose)
            .is_none_or(|current| round <= current + WINDOW)
    }

    /// The round we are at for `purpose`, once we have finished one.
    fn current(&self, purpose: Purpose) -> Option<u64> {
        self.completed.get(&purpose).map(|c| {
            let begun = self.begun.get(&purpose).copied().unwrap_or(0);
            (c + 1).max(begun)
        })
    }

    /// `peer`'s payload for `(purpose, round)` waits for room: the peer is ahead of us.
    pub fn hold(&mut self, peer: MemberId, purpose: Purpose, round: u64) {
        self.held.insert(peer, (purpose, round));
    }

    /// `peer`'s held payload found room (or its connection ended).
    pub fn release(&mut self, peer: MemberId) {
        self.held.remove(&peer);
    }

    /// Peers whose held payload is more than `gap` rounds past ours: so far ahead that rounds
    /// with them no longer meet (each side times out on the other), and only taking one's
    /// state brings us back in step.
    pub fn far_ahead(&self, gap: u64) -> Vec<MemberId> {
        self.held
            .iter()
            .filter(|(_, (purpose, round))| {
                self.current(*purpose)
                    .is_some_and(|current| *round > current + gap)
            })
            .map(|(&peer, _)| peer)
            .collect()
    }

    /// An exchange for `round` starts: payloads up to [`WINDOW`] rounds past it have room.
    pub fn begin(&mut self, purpose: Purpose, round: u64) {
        let b = self.begun.entry(purpose).or_insert(round);
        *b = (*b).max(round);
    }

    /// Whether a payload of ours for `(purpose, round)`, still queued (the peer was unreachable),
    /// is of no use any more: we are more than [`WINDOW`] rounds past it, so any peer that
    /// counted on it has long dropped us from that round. (A round we only just finished is
    /// still owed: a slower neighbour may be waiting for it.)
    pub fn is_outdated(&self, purpose: Purpose, round: u64) -> bool {
        self.completed
            .get(&purpose)
            .is_some_and(|&c| round + WINDOW < c)
    }

    pub fn session_opened(&mut self, peer: MemberId) {
        let p = self.peers.entry(peer).or_default();
        p.live_sessions += 1;
        p.ever_connected = true;
        p.left = false;
        p.joining = false;
        p.unreachable = false;
        p.last_round.clear();
    }

    /// Dialing `peer` failed (`false`) or connected (`true`).
    pub fn dialed(&mut self, peer: MemberId, connected: bool) {
        self.peers.entry(peer).or_default().unreachable = !connected;
    }

    /// `peer` asked for our state. Mid-job that means it is joining: until its first payload,
    /// rounds do not wait for it (they would wait a round timeout, holding up the very state
    /// reply it waits for). At the start of a job everyone asks everyone, and all are waited for.
    pub fn state_requested(&mut self, peer: MemberId) {
        if !self.completed.is_empty() {
            self.peers.entry(peer).or_default().joining = true;
        }
    }

    pub fn session_closed(&mut self, peer: MemberId) {
        let p = self.peers.entry(peer).or_default();
        p.live_sessions = p.live_sessions.saturating_sub(1);
        if p.live_sessions == 0 {
            self.held.remove(&peer);
        }
    }

    pub fn is_connected(&self, peer: MemberId) -> bool {
        self.peers.get(&peer).is_some_and(|p| p.live_sessions > 0)
    }

    /// Whether `peer` has sent us its payload (parameters or gradients) for round 0, which we
    /// have not closed: it is in its first round, waiting for ours.
    pub fn in_first_round(&self, peer: MemberId) -> bool {
        Purpose::ALL
            .iter()
            .any(|&purpose| self.stored.contains_key(&(purpose, 0, peer)))
    }

    /// Whether `peer` said it left, or our last dial to it failed, and it has not been back
    /// since: what we queue for it now may never be written.
    pub fn out_of_reach(&self, peer: MemberId) -> bool {
        self.peers
            .get(&peer)
            .is_some_and(|p| p.left || p.unreachable)
    }

    pub fn left(&mut self, peer: MemberId) {
        self.peers.entry(peer).or_default().left = true;
    }

    pub fn record_sent(&mut self, purpose: Purpose, round: u64, to: MemberId) {
        self.sent.insert((purpose, round, to));
    }

    pub fn unrecord_sent(&mut self, purpose: Purpose, round: u64, to: MemberId) {
        self.sent.remove(&(purpose, round, to));
    }

    pub fn skipped(&mut self, purpose: Purpose, round: u64, by: MemberId) {
        if !self.is_completed(purpose, round) {
            self.skips.insert((purpose, round, by));
        }
    }

    /// A complete payload from `from`. Call only once [`has_room`](Self::has_room) allows it.
    pub fn deposit(
        &mut self,
        from: MemberId,
        purpose: Purpose,
        round: u64,
        agreement: u64,
        payload: Vec<u8>,
        reply: R,
    ) -> Deposit<R> {
        let peer = self.peers.entry(from).or_default();
        if peer.last_round.get(&purpose).is_some_and(|&r| round <= r) {
            return Deposit::Rejected(Reject::Replayed);
        }
        peer.last_round.insert(purpose, round);
        peer.left = false;
        peer.joining = false;
        let completed = self.completed.get(&purpose).copied();
        if completed.is_some_and(|c| round + STALE_ROUNDS < c) {
            return Deposit::Rejected(Reject::Stale);
        }
        if completed.is_some_and(|c| round <= c) {
            let sent = self.sent.contains(&(purpose, round, from));
            return Deposit::Late {
                skip_to: (!sent).then_some(reply),
            };
        }
        self.stored.insert(
            (purpose, round, from),
            Stored {
                agreement,
                payload,
                reply,
            },
        );
        Deposit::Stored
    }

    /// Where `peer` stands in `(purpose, round)` for a member holding `agreement` with it.
    pub fn standing(
        &self,
        purpose: Purpose,
        round: u64,
        peer: MemberId,
        agreement: u64,
    ) -> Standing {
        if let Some(s) = self.stored.get(&(purpose, round, peer)) {
            return if s.agreement == agreement {
                Standing::Ready
            } else {
                Standing::Excluded(DropReason::VersionMismatch)
            };
        }
        if self.skips.contains(&(purpose, round, peer)) {
            return Standing::Excluded(DropReason::Skipped);
        }
        match self.peers.get(&peer) {
            Some(p) if p.left => Standing::Excluded(DropReason::Left),
            Some(p) if p.joining => Standing::Excluded(DropReason::Joining),
            Some(p) if p.ever_connected && p.live_sessions == 0 => {
                Standing::Excluded(DropReason::Disconnected)
            }
            // At the start members come up at their own pace and are waited for. Mid-job a
            // member listens before the topology names its address, so one we cannot dial is
            // gone (finished and exited, or lost with its node): waiting for it would cost
            // every round a timeout for as long as the topology names it.
            Some(p) if p.unreachable && !self.completed.is_empty() => {
                Standing::Excluded(DropReason::Unreachable)
            }
            _ => Standing::Waiting,
        }
    }

    /// Close `(purpose, round)`: hand out the payloads of `used` peers, forget everything up to
    /// this round, and return where to say "skip" (payloads we received but never answered).
    pub fn complete(&mut self, purpose: Purpose, round: u64, used: &[MemberId]) -> Completed<R> {
        let mut delivered = Vec::new();
        let mut skip_to = Vec::new();
        let done: Vec<Key> = self
            .stored
            .range((purpose, 0, 0)..=(purpose, round, MemberId::MAX))
            .map(|(k, _)| *k)
            .collect();
        for key in done {
            let stored = self.stored.remove(&key).expect("listed");
            let (_, r, from) = key;
            if r == round && used.contains(&from) {
                delivered.push((from, stored.payload));
            } else if !self.sent.contains(&key) {
                skip_to.push((from, stored.reply));
            }
        }
        let floor = round.saturating_sub(STALE_ROUNDS);
        self.sent.retain(|&(p, r, _)| p != purpose || r >= floor);
        self.skips.retain(|&(p, r, _)| p != purpose || r > round);
        let c = self.completed.entry(purpose).or_insert(round);
        *c = (*c).max(round);
        Completed { delivered, skip_to }
    }

    /// Payload bytes held, for tests of the memory bound.
    pub fn held_bytes(&self) -> usize {
        self.stored.values().map(|s| s.payload.len()).sum()
    }
}

/// Whether a round whose peers stand so must go on waiting (until the round timeout): one
/// may still deliver, or every neighbour vanished without a word. A member cut off from
/// all of them waits for one to come back or for the graph to be repaired: alone, it would
/// race ahead at the speed of compute, reach the stopping target with a model of its own,
/// and end the job's elastic phase for everyone. A peer that said it leaves, skips, or
/// follows another topology has spoken: no wait for it.
pub fn keeps_waiting(ready: usize, waiting: usize, excluded: &[DropReason]) -> bool {
    let vanished = |r: &DropReason| matches!(r, DropReason::Disconnected | DropReason::Unreachable);
    waiting > 0 || (ready == 0 && !excluded.is_empty() && excluded.iter().all(vanished))
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Purpose = Purpose::Parameters;

    #[test]
    fn a_round_completes_with_what_arrived() {
        let mut book = RoundBook::<u8>::default();
        book.session_opened(1);
        book.session_opened(2);
        book.record_sent(P, 0, 1);
        book.record_sent(P, 0, 2);
        assert_eq!(book.deposit(1, P, 0, 5, vec![1], 0), Deposit::Stored);
        assert_eq!(book.standing(P, 0, 1, 5), Standing::Ready);
        assert_eq!(book.standing(P, 0, 2, 5), Standing::Waiting);
        let done = book.complete(P, 0, &[1]);
        assert_eq!(done.delivered, vec![(1, vec![1])]);
        assert!(done.skip_to.is_empty());
        assert_eq!(book.held_bytes(), 0);
    }

    #[test]
    fn leaving_disconnecting_and_skipping_peers_are_not_waited_for() {
        let mut book = RoundBook::<u8>::default();
        for p in 1..=3 {
            book.session_opened(p);
        }
        book.left(1);
        book.session_closed(2);
        book.skipped(P, 4, 3);
        assert_eq!(
            book.standing(P, 4, 1, 0),
            Standing::Excluded(DropReason::Left)
        );
        assert_eq!(
            book.standing(P, 4, 2, 0),
            Standing::Excluded(DropReason::Disconnected)
        );
        assert_eq!(
            book.standing(P, 4, 3, 0),
            Standing::Excluded(DropReason::Skipped)
        );
        // Never connected yet: wait (it may still be starting).
        assert_eq!(book.standing(P, 4, 9, 0), Standing::Waiting);
        // A member that comes back is waited for again.
        book.session_opened(2);
        assert_eq!(book.standing(P, 4, 2, 0), Standing::Waiting);
    }

    #[test]
    fn a_peer_we_cannot_dial_is_waited_for_at_the_start_and_not_mid_job() {
        let mut book = RoundBook::<u8>::default();
        book.dialed(1, false);
        assert_eq!(book.standing(P, 0, 1, 0), Standing::Waiting);
        book.complete(P, 0, &[]);
        assert_eq!(
            book.standing(P, 1, 1, 0),
            Standing::Excluded(DropReason::Unreachable)
        );
        book.dialed(1, true);
        assert_eq!(book.standing(P, 1, 1, 0), Standing::Waiting);
        book.dialed(1, false);
        book.session_opened(1);
        assert_eq!(book.standing(P, 1, 1, 0), Standing::Waiting);
    }

    #[test]
    fn a_round_waits_while_someone_may_deliver_or_every_neighbour_vanished() {
        use DropReason::*;
        // (ready, waiting, excluded) -> keeps waiting
        let cases: &[(usize, usize, &[DropReason], bool)] = &[
            (0, 0, &[], false), // no neighbours: train alone
            (0, 1, &[], true),
            (1, 1, &[Disconnected], true),
            (1, 0, &[], false),
            (1, 0, &[Disconnected], false), // others are here: go on without the dead one
            (0, 0, &[Disconnected], true),  // cut off: wait for a neighbour or a repair
            (0, 0, &[Disconnected, Unreachable], true),
            (0, 0, &[Disconnected, Left], false), // someone said goodbye: not cut off
            (0, 0, &[Skipped], false),
            (0, 0, &[VersionMismatch, Disconnected], false),
            (0, 0, &[Joining], false),
            (0, 0, &[Timeout], false),
        ];
        for &(ready, waiting, excluded, expected) in cases {
            assert_eq!(
                keeps_waiting(ready, waiting, excluded),
                expected,
                "{ready} ready, {waiting} waiting, excluded {excluded:?}"
            );
        }
    }

    #[test]
    fn a_member_joining_mid_job_is_not_waited_for_until_it_delivers() {
        let mut book = RoundBook::<u8>::default();
        book.session_opened(1);
        // At the start everyone asks everyone for state: all are waited for.
        book.state_requested(1);
        assert_eq!(book.standing(P, 0, 1, 0), Standing::Waiting);
        book.complete(P, 0, &[]);
        // Mid-job, a state request means a replacement that is not training yet.
        book.state_requested(1);
        assert_eq!(
            book.standing(P, 1, 1, 0),
            Standing::Excluded(DropReason::Joining)
        );
        assert_eq!(book.deposit(1, P, 2, 0, vec![1], 0), Deposit::Stored);
        assert_eq!(book.standing(P, 2, 1, 0), Standing::Ready);
        assert_eq!(book.standing(P, 3, 1, 0), Standing::Waiting);
    }

    #[test]
    fn payloads_under_another_agreement_are_never_used() {
        let mut book = RoundBook::<u8>::default();
        book.record_sent(P, 3, 1);
        assert_eq!(book.deposit(1, P, 3, 8, vec![0; 4], 0), Deposit::Stored);
        assert_eq!(
            book.standing(P, 3, 1, 7),
            Standing::Excluded(DropReason::VersionMismatch)
        );
        let done = book.complete(P, 3, &[]);
        assert!(done.delivered.is_empty());
        assert!(
            done.skip_to.is_empty(),
            "we sent ours, so the peer is not waiting on us"
        );
    }

    #[test]
    fn unused_payloads_we_did_not_answer_get_a_skip() {
        let mut book = RoundBook::<&str>::default();
        // Peer 4 counts us as its neighbour; we do not count it.
        assert_eq!(book.deposit(4, P, 2, 1, vec![1], "to-4"), Deposit::Stored);
        assert_eq!(book.complete(P, 2, &[]).skip_to, vec![(4, "to-4")]);
        // Late payloads are answered at once, unless we had sent ours.
        assert_eq!(
            book.deposit(5, P, 1, 1, vec![1], "to-5"),
            Deposit::Late {
                skip_to: Some("to-5")
            }
        );
        book.record_sent(P, 2, 6);
        assert_eq!(
            book.deposit(6, P, 2, 1, vec![1], "to-6"),
            Deposit::Late { skip_to: None }
        );
    }

    #[test]
    fn replays_and_stale_rounds_are_rejected() {
        let mut book = RoundBook::<u8>::default();
        book.session_opened(1);
        assert_eq!(book.deposit(1, P, 5, 0, vec![], 0), Deposit::Stored);
        assert_eq!(
            book.deposit(1, P, 5, 0, vec![], 0),
            Deposit::Rejected(Reject::Replayed)
        );
        book.complete(P, 40, &[]);
        book.session_opened(2);
        assert_eq!(
            book.deposit(2, P, 40 - STALE_ROUNDS - 1, 0, vec![], 0),
            Deposit::Rejected(Reject::Stale)
        );
        // A new session (a replacement with the same id) starts a new sequence.
        book.session_opened(1);
        assert_eq!(book.deposit(1, P, 41, 0, vec![], 0), Deposit::Stored);
    }

    #[test]
    fn readers_may_run_only_a_window_ahead() {
        let mut book = RoundBook::<u8>::default();
        assert!(
            book.has_room(P, 1_000),
            "a fresh member may be joining mid-job"
        );
        book.complete(P, 10, &[]);
        assert!(book.has_room(P, 11 + WINDOW));
        assert!(!book.has_room(P, 12 + WINDOW));
        assert!(book.has_room(Purpose::Gradients, 0));
        assert!(book.is_outdated(P, 7) && !book.is_outdated(P, 8));
        // Auto averaging: the next round is a step far past the last completed one; the window
        // moves with the round under way.
        book.begin(P, 40);
        assert!(book.has_room(P, 40 + WINDOW));
        assert!(!book.has_room(P, 41 + WINDOW));
        book.begin(P, 30);
        assert!(book.has_room(P, 40 + WINDOW), "never moves back");
    }

    #[test]
    fn a_peer_is_far_ahead_when_its_held_payload_is_past_the_gap() {
        let mut book = RoundBook::<u8>::default();
        book.hold(1, P, 500);
        assert!(
            book.far_ahead(16).is_empty(),
            "before our first round: not known"
        );
        book.complete(P, 100, &[]);
        book.hold(2, P, 104);
        assert_eq!(
            book.far_ahead(16),
            vec![1],
            "4 rounds ahead is a wait, not a split"
        );
        book.hold(2, P, 118);
        assert_eq!(book.far_ahead(16), vec![1, 2]);
        book.release(1);
        assert_eq!(book.far_ahead(16), vec![2]);
        // We caught up: its payload has room again.
        book.begin(P, 118);
        assert!(book.far_ahead(16).is_empty());
    }
}
