//! Time, injected: the store asks a [`Clock`] instead of the system, so tests can pin it.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::types::TimestampNs;

/// A source of "now" for timestamps.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> TimestampNs;
}

/// The system's real-time clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> TimestampNs {
        system_now()
    }
}

/// Nanoseconds since the epoch by the system clock.
pub fn system_now() -> TimestampNs {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_nanos()).unwrap_or(i64::MAX),
    }
}

/// A clock that only moves when told to; every reading advances it by one nanosecond so
/// successive changes stay ordered.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicI64,
}

impl ManualClock {
    pub fn new(start: TimestampNs) -> ManualClock {
        ManualClock {
            now: AtomicI64::new(start),
        }
    }

    pub fn advance(&self, ns: i64) {
        self.now.fetch_add(ns, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> TimestampNs {
        self.now.fetch_add(1, Ordering::SeqCst)
    }
}
