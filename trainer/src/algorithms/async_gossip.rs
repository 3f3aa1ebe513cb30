//! Asynchronous gossip (AD-PSGD, Lian et al. 2018): no rounds and no waiting. After a step a
//! member sends its model to one neighbour (a request) and trains on; whoever receives a request
//! answers with its own model (a reply) and moves halfway to the requester's; the requester,
//! when the reply comes, moves by half the difference between the reply and what it sent.
//!
//! Each side applies a difference, not an average of its *current* model, so the pair's sum is
//! exactly what it was, whatever the two did in between and however requests cross: the mean
//! of all models moves only with gradients. A reply to a request older than the staleness bound
//! is dropped and the request given up (its half of the exchange is then lost, which moves the
//! mean by a little; counted in [`GossipCounts::stale`]).

use std::collections::BTreeMap;

use murmur_core::topology::MemberId;

use super::Payload;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LetterKind {
    /// "Here is my model; answer with yours."
    Request,
    /// The answer, repeating the request's sequence number.
    Reply,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Letter {
    pub kind: LetterKind,
    /// The requester's sequence number.
    pub seq: u64,
    pub payload: Payload,
}

/// The only thing asynchronous gossip needs from a network: post and collect, never wait.
pub trait Mailbox {
    /// Queue `letter` for `to`. Never waits; a letter to a peer that is down is lost.
    fn post(&mut self, to: MemberId, letter: Letter);
    /// What has arrived since the last call, in arrival order.
    fn collect(&mut self) -> Vec<(MemberId, Letter)>;
}

/// A request waiting for its reply.
#[derive(Clone, Debug, PartialEq)]
struct Waiting {
    seq: u64,
    /// The requester's step when it sent the request.
    step: u64,
    /// The model as sent: the reply's difference is taken against it.
    sent: Vec<f32>,
}

/// What asynchronous gossip did, for reports and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GossipCounts {
    /// Requests sent.
    pub requested: u64,
    /// Requests answered (and mixed in).
    pub served: u64,
    /// Replies mixed in.
    pub settled: u64,
    /// Replies dropped: too late, for a request given up, or unasked for.
    pub stale: u64,
    /// Requests given up after the staleness bound without a reply.
    pub abandoned: u64,
}

/// The longest a neighbour that stopped answering is left alone, in steps.
const MAX_BACKOFF_STEPS: u64 = 64;

/// A neighbour that let requests lapse: asked again from `until`, after twice as long each time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Backoff {
    until: u64,
    steps: u64,
}

/// The requests in flight of one member: at most one per neighbour.
#[derive(Clone, Debug, Default)]
pub struct Requests {
    waiting: BTreeMap<MemberId, Waiting>,
    /// Neighbours whose last request lapsed: a dead peer soon costs not even a request.
    backoff: BTreeMap<MemberId, Backoff>,
    next_seq: u64,
    pub counts: GossipCounts,
}

impl Requests {
    /// The neighbours to ask at `step`: none in flight to them, none backing off, in
    /// `neighbours`' order.
    pub fn free(&self, step: u64, neighbours: impl IntoIterator<Item = MemberId>) -> Vec<MemberId> {
        neighbours
            .into_iter()
            .filter(|n| !self.waiting.contains_key(n))
            .filter(|n| self.backoff.get(n).is_none_or(|b| step >= b.until))
            .collect()
    }

    /// Record a request to `to` of `sent` at `step`; its sequence number.
    pub fn open(&mut self, to: MemberId, step: u64, sent: Vec<f32>) -> u64 {
        self.next_seq += 1;
        let seq = self.next_seq;
        self.waiting.insert(to, Waiting { seq, step, sent });
        self.counts.requested += 1;
        seq
    }

    /// A reply from `from` to request `seq`, arriving at `step`: the model the request sent,
    /// when the reply answers the request in flight to `from` within `max_staleness` steps.
    pub fn close(
        &mut self,
        from: MemberId,
        seq: u64,
        step: u64,
        max_staleness: u64,
    ) -> Option<Vec<f32>> {
        match self.waiting.get(&from) {
            Some(w) if w.seq == seq && step.saturating_sub(w.step) <= max_staleness => {
                self.counts.settled += 1;
                self.backoff.remove(&from);
                self.waiting.remove(&from).map(|w| w.sent)
            }
            _ => {
                self.counts.stale += 1;
                None
            }
        }
    }

    /// Give up requests older than `max_staleness` at `step` (their neighbour is left alone
    /// for a while, twice as long each time in a row, up to [`MAX_BACKOFF_STEPS`]), and those
    /// to members that are no longer neighbours.
    pub fn expire(&mut self, step: u64, max_staleness: u64, neighbours: &[MemberId]) {
        let before = self.waiting.len();
        let mut lapsed = Vec::new();
        self.waiting.retain(|to, w| {
            let fresh = step.saturating_sub(w.step) <= max_staleness;
            if !fresh {
                lapsed.push(*to);
            }
            fresh && neighbours.contains(to)
        });
        for to in lapsed {
            let steps = self
                .backoff
                .get(&to)
                .map_or(max_staleness.max(1), |b| b.steps * 2)
                .min(MAX_BACKOFF_STEPS);
            self.backoff.insert(
                to,
                Backoff {
                    until: step + steps,
                    steps,
                },
            );
        }
        self.backoff.retain(|to, _| neighbours.contains(to));
        self.counts.abandoned += (before - self.waiting.len()) as u64;
    }

    pub fn in_flight(&self) -> usize {
        self.waiting.len()
    }
}

/// The responder's move: halfway to the requester's model.
pub fn meet_halfway(own: &mut [f32], theirs: &[f32]) {
    for (x, t) in own.iter_mut().zip(theirs) {
        *x += 0.5 * (*t - *x);
    }
}

/// The requester's move when the reply comes: half the difference between the responder's
/// model and what the request sent, whatever this model has become since.
pub fn settle(own: &mut [f32], sent: &[f32], theirs: &[f32]) {
    for ((x, s), t) in own.iter_mut().zip(sent).zip(theirs) {
        *x += 0.5 * (*t - *s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_reply_settles_only_its_own_fresh_request() {
        let mut r = Requests::default();
        let seq = r.open(3, 10, vec![1.0]);
        assert_eq!(r.free(10, [1, 3, 5]), vec![1, 5]);
        assert_eq!(r.close(3, seq + 1, 11, 4), None, "another sequence number");
        assert_eq!(r.close(4, seq, 11, 4), None, "another member");
        assert_eq!(
            r.close(3, seq, 14, 4),
            Some(vec![1.0]),
            "four steps late: within the bound"
        );
        assert_eq!(r.close(3, seq, 14, 4), None, "settled once");
        let late = r.open(3, 20, vec![2.0]);
        assert_eq!(r.close(3, late, 25, 4), None, "past the bound");
        assert_eq!(r.counts.settled, 1);
        assert_eq!(r.counts.stale, 4);
    }

    #[test]
    fn requests_expire_after_the_bound_or_when_the_neighbour_goes() {
        let mut r = Requests::default();
        r.open(1, 0, vec![]);
        r.open(2, 5, vec![]);
        r.open(3, 5, vec![]);
        r.expire(8, 4, &[1, 2]);
        assert_eq!(r.counts.abandoned, 2);
        assert_eq!(r.in_flight(), 1);
        // Member 1 lapsed: left alone for 4 steps; member 3 is no neighbour any more.
        assert_eq!(r.free(8, [1, 2, 3]), vec![3]);
        assert_eq!(r.free(12, [1, 2, 3]), vec![1, 3]);
        // Lapsing again doubles the wait; an answer ends it.
        r.open(1, 12, vec![]);
        r.expire(17, 4, &[1, 2]);
        assert_eq!(r.free(24, [1]), Vec::<MemberId>::new());
        assert_eq!(r.free(25, [1]), vec![1]);
        let seq = r.open(1, 25, vec![]);
        assert!(r.close(1, seq, 26, 4).is_some());
        assert_eq!(r.free(26, [1]), vec![1]);
    }

    /// Letters waiting for one member: (from, kind, seq, model).
    type Inbox = std::collections::VecDeque<(usize, LetterKind, u64, Vec<f32>)>;

    /// One event of an interleaving: a member takes a local step (its model moves by `delta`),
    /// sends a request, or handles the oldest letter waiting for it.
    #[derive(Clone, Debug)]
    enum Event {
        Step { member: usize, delta: f32 },
        Request { from: usize, to: usize },
        Deliver { to: usize },
    }

    fn event(n: usize) -> impl Strategy<Value = Event> {
        prop_oneof![
            (0..n, -1.0f32..1.0).prop_map(|(member, delta)| Event::Step { member, delta }),
            (0..n, 0..n).prop_map(|(from, to)| Event::Request { from, to }),
            (0..n).prop_map(|to| Event::Deliver { to }),
        ]
    }

    /// `to` handles the oldest letter waiting for it: answers a request and meets it halfway,
    /// or settles a reply (no staleness bound here: every reply is settled).
    fn deliver(
        to: usize,
        step: u64,
        models: &mut [Vec<f32>],
        requests: &mut [Requests],
        inbox: &mut [Inbox],
    ) {
        let Some((from, kind, seq, theirs)) = inbox[to].pop_front() else {
            return;
        };
        match kind {
            LetterKind::Request => {
                let reply = models[to].clone();
                inbox[from].push_back((to, LetterKind::Reply, seq, reply));
                meet_halfway(&mut models[to], &theirs);
            }
            LetterKind::Reply => {
                let sent = requests[to].close(from as MemberId, seq, step, u64::MAX);
                let sent = sent.expect("one request per pair, answered once");
                settle(&mut models[to], &sent, &theirs);
            }
        }
    }

    proptest! {
        /// Whatever the interleaving of steps, requests and crossing replies, the sum of the
        /// models changes only by the local steps: pairwise averaging keeps the mean.
        #[test]
        fn the_mean_moves_only_with_local_steps(
            start in proptest::collection::vec(-10.0f32..10.0, 4),
            events in proptest::collection::vec(event(4), 0..200),
        ) {
            let n = start.len();
            let mut models: Vec<Vec<f32>> = start.iter().map(|&v| vec![v, -v]).collect();
            let mut requests: Vec<Requests> = vec![Requests::default(); n];
            let mut inbox: Vec<Inbox> = vec![Default::default(); n];
            let mut expected: f64 = start.iter().map(|&v| f64::from(v)).sum();
            for (step, e) in events.into_iter().enumerate() {
                let step = step as u64;
                match e {
                    Event::Step { member, delta } => {
                        models[member][0] += delta;
                        expected += f64::from(delta);
                    }
                    Event::Request { from, to } => {
                        if from != to && !requests[from].free(0, [to as MemberId]).is_empty() {
                            let sent = models[from].clone();
                            let seq = requests[from].open(to as MemberId, step, sent.clone());
                            inbox[to].push_back((from, LetterKind::Request, seq, sent));
                        }
                    }
                    Event::Deliver { to } => {
                        deliver(to, step, &mut models, &mut requests, &mut inbox);
                    }
                }
            }
            // Letters still in flight carry the rest of their exchanges: deliver them all (the
            // requests among them turn into replies, delivered in turn).
            while let Some(to) = (0..n).find(|&m| !inbox[m].is_empty()) {
                deliver(to, u64::MAX, &mut models, &mut requests, &mut inbox);
            }
            let sum: f64 = models.iter().map(|m| f64::from(m[0])).sum();
            let mirror: f64 = models.iter().map(|m| f64::from(m[1])).sum();
            prop_assert!((sum - expected).abs() < 1e-3, "sum {sum} expected {expected}");
            prop_assert!((mirror + start.iter().map(|&v| f64::from(v)).sum::<f64>()).abs() < 1e-3);
        }
    }
}
