//! `--chaos preempt`: a spot market in miniature. On a schedule, one training member gets a spot
//! notice (SIGTERM) or, with `--kill`, disappears at once (SIGKILL).

use std::time::Duration;

use nix::sys::signal::Signal;
use rand::SeedableRng;
use rand::seq::IndexedRandom;
use rand_chacha::ChaCha8Rng;

#[derive(Clone, Debug)]
pub struct Chaos {
    pub every: Duration,
    /// SIGKILL (no notice) rather than SIGTERM (a spot notice).
    pub kill: bool,
    /// Seeds the choice of victims.
    pub seed: u64,
    /// Strike only this long after the schedule starts (None: until the job ends).
    pub lasting: Option<Duration>,
    stop_at: Option<tokio::time::Instant>,
    rng: Option<ChaCha8Rng>,
}

impl Chaos {
    pub fn new(every: Duration, kill: bool, seed: u64) -> Self {
        Self {
            every,
            kill,
            seed,
            lasting: None,
            stop_at: None,
            rng: None,
        }
    }

    /// Strike for `lasting`, then leave the job in peace.
    pub fn lasting(mut self, lasting: Option<Duration>) -> Self {
        self.lasting = lasting;
        self
    }

    /// The first preemption comes one period after the start.
    pub fn schedule(&mut self) -> tokio::time::Interval {
        let now = tokio::time::Instant::now();
        self.stop_at = self.lasting.map(|d| now + d);
        let start = now + self.every;
        let mut interval = tokio::time::interval_at(start, self.every);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        interval
    }

    pub fn signal(&self) -> Signal {
        if self.kill {
            Signal::SIGKILL
        } else {
            Signal::SIGTERM
        }
    }

    /// Still striking (not past `lasting`)?
    pub fn striking(&self) -> bool {
        self.stop_at
            .is_none_or(|stop| tokio::time::Instant::now() < stop)
    }

    pub fn pick<T: Copy>(&mut self, candidates: &[T]) -> Option<T> {
        let seed = self.seed;
        let rng = self
            .rng
            .get_or_insert_with(|| ChaCha8Rng::seed_from_u64(seed));
        candidates.choose(rng).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn victims_follow_the_seed() {
        let picks = |seed| {
            let mut c = Chaos::new(Duration::from_secs(1), true, seed);
            (0..20)
                .map(|_| c.pick(&[0, 1, 2, 3, 4]).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(picks(7), picks(7));
        assert_ne!(picks(7), picks(8));
        let mut c = Chaos::new(Duration::from_secs(1), false, 0);
        assert_eq!(c.pick::<u32>(&[]), None);
        assert_eq!(c.signal(), Signal::SIGTERM);
    }

    #[tokio::test(start_paused = true)]
    async fn a_storm_ends_when_it_lasted_long_enough() {
        let mut forever = Chaos::new(Duration::from_secs(5), true, 0);
        let mut storm =
            Chaos::new(Duration::from_secs(5), true, 0).lasting(Some(Duration::from_secs(120)));
        let _ = (forever.schedule(), storm.schedule());
        tokio::time::advance(Duration::from_secs(119)).await;
        assert!(storm.striking() && forever.striking());
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(!storm.striking());
        assert!(forever.striking());
    }
}
