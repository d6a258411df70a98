//! Retrying a pending sync: bounded exponential backoff.
//!
//! A sync that fails for a transient reason (see [`crate::Error::is_transient`]) is
//! *pending*: it is tried again after `initial`, then after `initial * multiplier`, and
//! so on, never waiting more than `max_delay`, at most `max_attempts` times in all.
//! Progress (a sync that moved anything before failing) resets the count: a long
//! transfer over a flaky link is not given up because it needed many connections.
//! When the attempts run out the sync is reported failed; the changes stay in the
//! replica's database, and the next change or reconnection starts a new pending sync.

use std::time::Duration;

/// How a pending sync is retried. The defaults are the reference system's: 1 s, doubling,
/// at most 60 s, 5 attempts, no jitter.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryPolicy {
    pub initial: Duration,
    pub multiplier: f64,
    pub max_delay: Duration,
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    /// Each delay is drawn from `[delay * (1 - jitter), delay]`; 0 keeps it exact.
    pub jitter: f64,
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy {
            initial: Duration::from_secs(1),
            multiplier: 2.0,
            max_delay: Duration::from_secs(60),
            max_attempts: 5,
            jitter: 0.0,
        }
    }
}

impl RetryPolicy {
    /// Checks the numbers make sense; the error says which does not.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_attempts == 0 {
            return Err("max attempts must be at least 1".into());
        }
        if !(self.multiplier >= 1.0 && self.multiplier.is_finite()) {
            return Err(format!(
                "multiplier {} must be a number >= 1",
                self.multiplier
            ));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(format!("jitter {} must be within 0..=1", self.jitter));
        }
        if self.max_delay < self.initial {
            return Err("max delay must be at least the initial delay".into());
        }
        Ok(())
    }
}

/// The state of one pending sync's retries.
#[derive(Clone, Debug)]
pub struct Backoff {
    policy: RetryPolicy,
    /// Failed attempts since the last progress.
    failures: u32,
    /// State of the jitter's random sequence (xorshift; seeded, so a simulation replays).
    rng: u64,
}

/// What to do after a failed attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Try again after this long.
    RetryAfter(Duration),
    /// The attempts are spent: report the sync failed.
    GiveUp,
}

impl Backoff {
    pub fn new(policy: RetryPolicy, seed: u64) -> Backoff {
        Backoff {
            policy,
            failures: 0,
            rng: seed | 1,
        }
    }

    /// Failed attempts counted so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// The sync moved something: the next failure starts the count over.
    pub fn progress(&mut self) {
        self.failures = 0;
    }

    /// An attempt failed: when to try again, if at all.
    pub fn failed(&mut self) -> Next {
        self.failures += 1;
        if self.failures >= self.policy.max_attempts {
            return Next::GiveUp;
        }
        let exponent = (self.failures - 1) as i32;
        let delay = self.policy.initial.as_secs_f64() * self.policy.multiplier.powi(exponent);
        let delay = delay.min(self.policy.max_delay.as_secs_f64());
        let delay = if self.policy.jitter > 0.0 {
            delay * (1.0 - self.policy.jitter * self.next_unit())
        } else {
            delay
        };
        Next::RetryAfter(Duration::from_secs_f64(delay.max(0.0)))
    }

    /// A number in [0, 1).
    fn next_unit(&mut self) -> f64 {
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delays(backoff: &mut Backoff) -> Vec<Next> {
        (0..6).map(|_| backoff.failed()).collect()
    }

    #[test]
    fn the_default_doubles_from_one_second_and_gives_up_after_five_attempts() {
        let mut backoff = Backoff::new(RetryPolicy::default(), 1);
        let secs = |s| Next::RetryAfter(Duration::from_secs(s));
        assert_eq!(
            delays(&mut backoff),
            vec![
                secs(1),
                secs(2),
                secs(4),
                secs(8),
                Next::GiveUp,
                Next::GiveUp
            ]
        );
    }

    #[test]
    fn delays_stop_growing_at_the_maximum() {
        let policy = RetryPolicy {
            max_attempts: 10,
            max_delay: Duration::from_secs(5),
            ..RetryPolicy::default()
        };
        let mut backoff = Backoff::new(policy, 1);
        let all: Vec<Next> = (0..9).map(|_| backoff.failed()).collect();
        assert_eq!(all[8], Next::RetryAfter(Duration::from_secs(5)));
        assert_eq!(backoff.failed(), Next::GiveUp);
    }

    #[test]
    fn progress_resets_the_count() {
        let mut backoff = Backoff::new(RetryPolicy::default(), 1);
        for _ in 0..4 {
            backoff.failed();
        }
        backoff.progress();
        assert_eq!(backoff.failed(), Next::RetryAfter(Duration::from_secs(1)));
    }

    #[test]
    fn jitter_stays_within_its_band_and_replays_from_its_seed() {
        let policy = RetryPolicy {
            jitter: 0.5,
            max_attempts: 100,
            ..RetryPolicy::default()
        };
        let (mut a, mut b) = (Backoff::new(policy, 7), Backoff::new(policy, 7));
        for _ in 0..50 {
            let (x, y) = (a.failed(), b.failed());
            assert_eq!(x, y);
            let Next::RetryAfter(d) = x else { panic!() };
            assert!(d <= Duration::from_secs(60) && d >= Duration::from_millis(500));
        }
    }

    #[test]
    fn nonsense_policies_are_refused() {
        let bad = [
            RetryPolicy {
                max_attempts: 0,
                ..RetryPolicy::default()
            },
            RetryPolicy {
                multiplier: 0.5,
                ..RetryPolicy::default()
            },
            RetryPolicy {
                jitter: 2.0,
                ..RetryPolicy::default()
            },
            RetryPolicy {
                max_delay: Duration::ZERO,
                ..RetryPolicy::default()
            },
        ];
        for policy in bad {
            assert!(policy.validate().is_err(), "{policy:?}");
        }
        assert!(RetryPolicy::default().validate().is_ok());
    }
}
