//! The bounded, sequenced record of one exec's output, which any number of readers
//! follow, each from its own position.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::exec::{Event, ExecResult, Stream};

/// Output kept per exec for readers that attach late or fall behind, bytes. Older
/// chunks are dropped first; a reader that wanted them receives [`Event::Missed`].
pub const EXEC_LOG_BYTES_MAX: usize = 4 << 20;

struct Chunk {
    seq: u64,
    stream: Stream,
    data: Vec<u8>,
}

struct LogState {
    kept: VecDeque<Chunk>,
    kept_bytes: usize,
    /// The sequence number of the next chunk (or of the exit event once finished).
    next_seq: u64,
    result: Option<ExecResult>,
}

impl LogState {
    /// The first sequence number still kept.
    fn first_kept(&self) -> u64 {
        self.kept.front().map_or(self.next_seq, |chunk| chunk.seq)
    }

    /// The event at `seq` if there is one yet; `Some(None)` past the end of a finished log.
    fn event_at(&self, seq: u64) -> Option<Option<Event>> {
        let first = self.first_kept();
        if seq < first {
            return Some(Some(Event::Missed {
                first: seq,
                next: first,
            }));
        }
        if let Some(chunk) = self.kept.get((seq - first) as usize) {
            debug_assert_eq!(chunk.seq, seq);
            return Some(Some(Event::Output {
                seq,
                stream: chunk.stream,
                data: chunk.data.clone(),
            }));
        }
        match &self.result {
            Some(result) if seq == self.next_seq => Some(Some(Event::Exit {
                seq,
                result: result.clone(),
            })),
            Some(_) => Some(None),
            None => None,
        }
    }
}

pub(crate) struct OutputLog {
    state: Mutex<LogState>,
    changed: Condvar,
    bytes_max: usize,
}

impl OutputLog {
    pub fn new(bytes_max: usize) -> OutputLog {
        OutputLog {
            state: Mutex::new(LogState {
                kept: VecDeque::new(),
                kept_bytes: 0,
                next_seq: 0,
                result: None,
            }),
            changed: Condvar::new(),
            bytes_max,
        }
    }

    fn lock(&self) -> MutexGuard<'_, LogState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends a chunk, dropping the oldest ones beyond the bound (never the newest).
    /// Output arriving after the exit was recorded (from a process that outlived the
    /// command and kept its pipe) is dropped: the exit is the last event.
    pub fn push(&self, stream: Stream, data: Vec<u8>) {
        let mut state = self.lock();
        if state.result.is_some() {
            return;
        }
        let seq = state.next_seq;
        state.next_seq += 1;
        state.kept_bytes += data.len();
        state.kept.push_back(Chunk { seq, stream, data });
        while state.kept_bytes > self.bytes_max && state.kept.len() > 1 {
            let dropped = state.kept.pop_front().expect("more than one chunk");
            state.kept_bytes -= dropped.data.len();
        }
        drop(state);
        self.changed.notify_all();
    }

    /// Records the end; the exit event takes the next sequence number.
    pub fn finish(&self, result: ExecResult) {
        self.lock().result = Some(result);
        self.changed.notify_all();
    }

    pub fn result(&self) -> Option<ExecResult> {
        self.lock().result.clone()
    }

    /// Waits for the end.
    pub fn wait_result(&self) -> ExecResult {
        let mut state = self.lock();
        loop {
            if let Some(result) = &state.result {
                return result.clone();
            }
            state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The event at `seq`, waiting for it up to `wait` (`None`: as long as it takes).
    /// Returns `None` past the exit event, or when the wait ran out.
    pub fn event(&self, seq: u64, wait: Option<Duration>) -> Option<Event> {
        let deadline = wait.map(|wait| Instant::now() + wait);
        let mut state = self.lock();
        loop {
            if let Some(event) = state.event_at(seq) {
                return event;
            }
            state = match deadline {
                None => self.changed.wait(state).unwrap_or_else(|e| e.into_inner()),
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    let waited = self.changed.wait_timeout(state, left);
                    waited.unwrap_or_else(|e| e.into_inner()).0
                }
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::{ExecStatus, SyncOutcome};

    fn result() -> ExecResult {
        ExecResult {
            status: ExecStatus::Completed,
            exit_code: 0,
            duration: Duration::ZERO,
            backend: "test".into(),
            reason: "default".into(),
            sync: SyncOutcome::Complete,
            error: None,
            value: None,
        }
    }

    #[test]
    fn readers_follow_in_sequence_and_end_after_the_exit() {
        let log = OutputLog::new(1024);
        log.push(Stream::Stdout, b"a".to_vec());
        log.push(Stream::Stderr, b"b".to_vec());
        log.finish(result());
        let now = Some(Duration::ZERO);
        assert!(matches!(
            log.event(0, now),
            Some(Event::Output {
                seq: 0,
                stream: Stream::Stdout,
                ..
            })
        ));
        assert!(matches!(
            log.event(1, now),
            Some(Event::Output {
                seq: 1,
                stream: Stream::Stderr,
                ..
            })
        ));
        assert!(matches!(
            log.event(2, now),
            Some(Event::Exit { seq: 2, .. })
        ));
        assert_eq!(log.event(3, now), None);
    }

    #[test]
    fn a_reader_behind_the_bound_learns_what_it_missed() {
        let log = OutputLog::new(10);
        for _ in 0..5 {
            log.push(Stream::Stdout, vec![b'x'; 4]);
        }
        // 20 bytes pushed, at most 10 kept: chunks 3 and 4 remain.
        assert_eq!(
            log.event(0, Some(Duration::ZERO)),
            Some(Event::Missed { first: 0, next: 3 })
        );
        assert!(matches!(
            log.event(3, Some(Duration::ZERO)),
            Some(Event::Output { seq: 3, .. })
        ));
        // The newest chunk is kept even when it alone is over the bound.
        log.push(Stream::Stdout, vec![b'y'; 64]);
        assert_eq!(
            log.event(4, Some(Duration::ZERO)),
            Some(Event::Missed { first: 4, next: 5 })
        );
    }

    #[test]
    fn a_waiting_reader_wakes_for_new_output() {
        let log = std::sync::Arc::new(OutputLog::new(1024));
        let writer = log.clone();
        let thread = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            writer.push(Stream::Stdout, b"late".to_vec());
        });
        assert_eq!(log.event(0, Some(Duration::ZERO)), None);
        assert!(matches!(
            log.event(0, None),
            Some(Event::Output { seq: 0, .. })
        ));
        thread.join().unwrap();
    }
}
