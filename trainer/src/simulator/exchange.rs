//! The in-process implementation of [`Exchange`]: mailboxes shared by all simulated members,
//! which may run on several threads. A member posts its payloads, wakes the recipients, and waits
//! until everyone it expects has posted for the same round; what it receives is keyed by sender
//! and round, so it does not depend on which thread ran first.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

use murmur_core::topology::MemberId;

use crate::algorithms::{Exchange, Payload, Purpose};

type Key = (MemberId, u64, Purpose, MemberId); // (to, round, purpose, from)

#[derive(Default)]
pub struct Mailboxes {
    letters: Mutex<BTreeMap<Key, Payload>>,
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
}

impl Exchange for LocalExchange {
    async fn exchange(
        &mut self,
        round: u64,
        purpose: Purpose,
        outgoing: Vec<(MemberId, Payload)>,
        from: &[MemberId],
    ) -> Vec<(MemberId, Payload)> {
        for (to, payload) in outgoing {
            self.boxes
                .letters
                .lock()
                .insert((to, round, purpose, self.me), payload);
            // notify_one keeps a permit when nobody waits yet, so no wake-up is lost.
            self.boxes.bell(to).notify_one();
        }
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
                            (
                                *f,
                                letters
                                    .remove(&(self.me, round, purpose, *f))
                                    .expect("checked"),
                            )
                        })
                        .collect();
                }
            }
            rung.await;
        }
    }
}
