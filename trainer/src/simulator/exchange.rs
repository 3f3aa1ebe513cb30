//! The in-process implementation of [`Exchange`]: mailboxes shared by all simulated members of one
//! single-threaded runtime. A member posts its payloads, wakes the recipients, and waits until
//! everyone it expects has posted for the same round.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use tokio::sync::Notify;

use murmur_core::topology::MemberId;

use crate::algorithms::{Exchange, Purpose};

type Key = (MemberId, u64, Purpose, MemberId); // (to, round, purpose, from)

#[derive(Default)]
pub struct Mailboxes {
    letters: RefCell<BTreeMap<Key, Vec<u8>>>,
    bells: RefCell<BTreeMap<MemberId, Rc<Notify>>>,
}

impl Mailboxes {
    fn bell(&self, member: MemberId) -> Rc<Notify> {
        self.bells
            .borrow_mut()
            .entry(member)
            .or_insert_with(|| Rc::new(Notify::new()))
            .clone()
    }
}

pub struct LocalExchange {
    pub me: MemberId,
    pub boxes: Rc<Mailboxes>,
}

impl Exchange for LocalExchange {
    async fn exchange(
        &mut self,
        round: u64,
        purpose: Purpose,
        outgoing: Vec<(MemberId, Vec<u8>)>,
        from: &[MemberId],
    ) -> Vec<(MemberId, Vec<u8>)> {
        for (to, payload) in outgoing {
            self.boxes
                .letters
                .borrow_mut()
                .insert((to, round, purpose, self.me), payload);
            // notify_one keeps a permit when nobody waits yet, so no wake-up is lost.
            self.boxes.bell(to).notify_one();
        }
        let bell = self.boxes.bell(self.me);
        loop {
            let complete = {
                let letters = self.boxes.letters.borrow();
                from.iter()
                    .all(|f| letters.contains_key(&(self.me, round, purpose, *f)))
            };
            if complete {
                let mut letters = self.boxes.letters.borrow_mut();
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
            bell.notified().await;
        }
    }
}
