//! The write gate: how a consumer of the change log that falls behind (a replica's sync
//! loop, when local writers outrun the link) holds writers back instead of letting its
//! backlog grow without bound.
//!
//! The store does not decide how many writers pass; whoever consumes the log does
//! ([`WriteGate::set_room`], [`WriteGate::open`]), from `Workspace::backlog`. What the
//! store does is make every operation that adds to the tree pass the gate first:
//! creating a node (file, directory, symlink, device, link), opening a file for
//! writing, copying a range, allocating, setting an extended attribute. Removals,
//! renames, reads and writes through handles already open do not wait: removing is how
//! a user makes room, and a write(2) of an open file is the kernel's writeback, which
//! must never stall. So the backlog stays within the consumer's bound plus what files
//! already open for writing add before they are closed.
//!
//! The consumer gives the gate *room*: how many more operations may pass before it
//! measures again. Each operation adds at most one node, so with room = bound minus
//! the backlog measured, the backlog cannot pass the bound between measurements. A
//! writer that finds no room waits, up to [`WriteGate::wait_max`]; if there is still
//! none then (the consumer is not draining: its link is down), the operation fails with
//! ENOSPC naming the reason, rather than hang forever.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::base::lock;
use crate::error::{Error, Result};

/// Lets a bounded number of writers through, or all of them.
#[derive(Debug)]
pub struct WriteGate {
    state: Mutex<GateState>,
    opened: Condvar,
}

#[derive(Debug)]
struct GateState {
    /// How many more operations may pass; `None`: any number.
    room: Option<u64>,
    /// Why writers wait, for the error one gets after waiting too long.
    reason: &'static str,
    wait_max: Duration,
    /// Writers waiting now, and that waited in all.
    waiting: u64,
    waited: u64,
}

impl Default for WriteGate {
    fn default() -> WriteGate {
        WriteGate {
            state: Mutex::new(GateState {
                room: None,
                reason: "",
                wait_max: Duration::from_secs(60),
                waiting: 0,
                waited: 0,
            }),
            opened: Condvar::new(),
        }
    }
}

impl WriteGate {
    /// From now on `room` more operations may pass (each adds at most one node); the
    /// rest wait until more room is given. `reason` is what a writer that waited too
    /// long is told. A consumer that measured its backlog gives the room left under its
    /// bound, which makes the bound hold between its measurements.
    pub fn set_room(&self, room: u64, reason: &'static str) {
        let mut state = lock(&self.state);
        state.room = Some(room);
        state.reason = reason;
        if room > 0 {
            self.opened.notify_all();
        }
    }

    /// Writers wait from now on.
    pub fn close(&self, reason: &'static str) {
        self.set_room(0, reason);
    }

    /// Any number of writers go on.
    pub fn open(&self) {
        let mut state = lock(&self.state);
        state.room = None;
        self.opened.notify_all();
    }

    /// Whether writers would wait now.
    pub fn is_closed(&self) -> bool {
        lock(&self.state).room == Some(0)
    }

    /// Writers waiting right now.
    pub fn waiting(&self) -> u64 {
        lock(&self.state).waiting
    }

    /// How long a writer waits before it fails with ENOSPC.
    pub fn set_wait_max(&self, wait_max: Duration) {
        lock(&self.state).wait_max = wait_max;
    }

    pub fn wait_max(&self) -> Duration {
        lock(&self.state).wait_max
    }

    /// Writers that had to wait so far.
    pub fn waited(&self) -> u64 {
        lock(&self.state).waited
    }

    /// Takes one unit of room, waiting for it at most [`WriteGate::wait_max`].
    pub(crate) fn pass(&self) -> Result<()> {
        let mut state = lock(&self.state);
        match state.room {
            None => return Ok(()),
            Some(room) if room > 0 => {
                state.room = Some(room - 1);
                return Ok(());
            }
            Some(_) => {}
        }
        state.waited += 1;
        state.waiting += 1;
        let deadline = Instant::now() + state.wait_max;
        let outcome = loop {
            match state.room {
                None => break Ok(()),
                Some(room) if room > 0 => {
                    state.room = Some(room - 1);
                    break Ok(());
                }
                Some(_) => {}
            }
            let now = Instant::now();
            if now >= deadline {
                break Err(Error::NoSpace {
                    path: Default::default(),
                    what: state.reason,
                });
            }
            state = self
                .opened
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        };
        state.waiting -= 1;
        outcome
    }
}

/// What a consumer of the change log has yet to take: the nodes changed after a
/// revision, and the content those files hold (an upper bound of the block data to
/// send).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Backlog {
    pub nodes: u64,
    pub bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn an_open_gate_lets_everyone_through() {
        let gate = WriteGate::default();
        gate.pass().unwrap();
        gate.close("backlog");
        gate.open();
        gate.pass().unwrap();
        assert_eq!(gate.waited(), 0);
    }

    #[test]
    fn a_closed_gate_holds_writers_until_it_opens() {
        let gate = Arc::new(WriteGate::default());
        gate.close("backlog");
        let writer = {
            let gate = gate.clone();
            std::thread::spawn(move || gate.pass())
        };
        while gate.waited() == 0 {
            std::thread::yield_now();
        }
        gate.open();
        writer.join().unwrap().unwrap();
    }

    #[test]
    fn room_lets_that_many_through() {
        let gate = WriteGate::default();
        gate.set_wait_max(Duration::from_millis(10));
        gate.set_room(3, "full");
        for _ in 0..3 {
            gate.pass().unwrap();
        }
        assert!(gate.is_closed());
        assert!(gate.pass().is_err());
        gate.set_room(1, "full");
        gate.pass().unwrap();
    }

    #[test]
    fn a_gate_that_stays_closed_fails_with_enospc() {
        let gate = WriteGate::default();
        gate.set_wait_max(Duration::from_millis(20));
        gate.close("the unsynced backlog is full");
        let err = gate.pass().unwrap_err();
        assert_eq!(err.errno(), libc::ENOSPC);
        assert!(err.to_string().contains("backlog"), "{err}");
    }
}
