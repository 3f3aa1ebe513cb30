//! One implementation of each decentralized algorithm — D-PSGD, gossip, clique averaging and
//! Moshpit — written once against the small [`Exchange`] interface, and asynchronous gossip
//! against the smaller [`Mailbox`]. The simulator runs them over in-process mailboxes; the
//! networked trainer runs the very same code over TCP.

pub mod async_gossip;
pub mod cadence;
mod member;
pub mod mixing;
mod neighbourhood;
pub mod outer;
pub mod sgd;

use murmur_core::topology::MemberId;

pub use async_gossip::{GossipCounts, Letter, LetterKind, Mailbox};
pub use cadence::{AutoPolicy, Averaging};
pub use member::{Member, MemberConfig, MemberError, Optim, StepReport};
pub use neighbourhood::Neighbourhood;
pub use outer::{Outer, OuterConfig};

/// Why a payload is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Purpose {
    /// Parameters for an averaging round.
    Parameters,
    /// Gradients for clique averaging.
    Gradients,
}

impl Purpose {
    pub const ALL: [Purpose; 2] = [Purpose::Parameters, Purpose::Gradients];
}

/// A payload as the exchange carries it: shared, so one encoding sent to several neighbours is
/// one buffer, not a copy per neighbour.
pub type Payload = std::sync::Arc<Vec<u8>>;

/// The only thing the algorithms need from a network: a round is posted, then collected. In
/// between, the network delivers while the member computes (overlap); `exchange` does both at
/// once.
#[allow(async_fn_in_trait)]
pub trait Exchange {
    /// Send each payload in `outgoing` to its member for `(round, purpose)`, and start taking
    /// what peers send for it. Returns at once.
    fn post_round(&mut self, round: u64, purpose: Purpose, outgoing: Vec<(MemberId, Payload)>);

    /// What every member in `from` sent for a posted `(round, purpose)`. A member that does not
    /// deliver in time (left, was preempted, timed out) is absent from the result; callers
    /// renormalise over who answered.
    async fn collect_round(
        &mut self,
        round: u64,
        purpose: Purpose,
        from: &[MemberId],
    ) -> Vec<(MemberId, Payload)>;

    /// [`post_round`](Self::post_round), then [`collect_round`](Self::collect_round).
    async fn exchange(
        &mut self,
        round: u64,
        purpose: Purpose,
        outgoing: Vec<(MemberId, Payload)>,
        from: &[MemberId],
    ) -> Vec<(MemberId, Payload)> {
        self.post_round(round, purpose, outgoing);
        self.collect_round(round, purpose, from).await
    }
}
