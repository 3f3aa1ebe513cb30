//! The in-process implementation of [`Exchange`]: mailboxes shared by all simulated members,
//! which may run on several threads. A member posts its payloads, wakes the recipients, and waits
//! until everyone it expects has posted for the same round; what it receives is keyed by sender
//! and round, so it does not depend on which thread ran first.
//!
//! Each member also keeps a virtual clock (in ticks; see [`super::TICKS_PER_STEP`]): its steps
//! advance it by the member's step duration, and a round ends, for each member, when the last
//! payload it waits for was sent — a synchronous round waits for its slowest participant.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

use murmur_core::topology::MemberId;

use crate::algorithms::{Exchange, Payload, Purpose};

type Key = (MemberId, u64, Purpose, MemberId); // (to, round, purpose, from)

#[derive(Default)]
pub struct Mailboxes {
    /// Each payload with its sender's clock when sent.
    letters: Mutex<BTreeMap<Key, (Payload, u64)>>,
    bells: Mutex<BTreeMap<MemberId, Arc<Notify>>>,
}

impl Mailboxes {
    fn bell(&self, member: MemberId) -> Arc<Notify> {
        self.bells
            .lock()
            .entry(member)
            .or_insert_with(|| Arc::new(Notify::new()))
            .clone()
    }
}

pub struct LocalExchange {
    pub me: MemberId,
    pub boxes: Arc<Mailboxes>,
    /// Virtual time at which this member is.
    pub clock: u64,
}

impl Exchange for LocalExchange {
    fn post_round(&mut self, round: u64, purpose: Purpose, outgoing: Vec<(MemberId, Payload)>) {
        for (to, payload) in outgoing {
            self.boxes
                .letters
                .lock()
                .insert((to, round, purpose, self.me), (payload, self.clock));
            // notify_one keeps a permit when nobody waits yet, so no wake-up is lost.
            self.boxes.bell(to).notify_one();
        }
    }

    async fn collect_round(
        &mut self,
        round: u64,
        purpose: Purpose,
        from: &[MemberId],
    ) -> Vec<(MemberId, Payload)> {
        let bell = self.boxes.bell(self.me);
        loop {
            // Registered before the check, so a letter posted in between still wakes us.
            let rung = bell.notified();
            {
                let mut letters = self.boxes.letters.lock();
                if from
                    .iter()
                    .all(|f| letters.contains_key(&(self.me, round, purpose, *f)))
                {
                    return from
                        .iter()
                        .map(|f| {
                            let (payload, sent_at) = letters
                                .remove(&(self.me, round, purpose, *f))
                                .expect("checked");
                            self.clock = self.clock.max(sent_at);
                            (*f, payload)
                        })
                        .collect();
                }
            }
            rung.await;
        }
    }
}
