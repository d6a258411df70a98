//! Helpers shared by the runtimes' integration tests.

#![allow(dead_code)] // each test binary uses its own share

use std::sync::Mutex;
use std::time::{Duration, Instant};

use computer_runtimes::audit::{AuditEntry, AuditSink};
use computer_runtimes::{Event, ExecHandle, ExecOptions, Runtimes, Stream};

/// Stdout and stderr of a finished exec, from its events.
pub fn collect(handle: &mut ExecHandle) -> (String, String) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    for event in handle.by_ref() {
        match event {
            Event::Output {
                stream: Stream::Stdout,
                data,
                ..
            } => out.extend(data),
            Event::Output {
                stream: Stream::Stderr,
                data,
                ..
            } => err.extend(data),
            Event::Missed { first, next } => panic!("missed events {first}..{next}"),
            Event::Exit { .. } => {}
        }
    }
    (
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

/// Polls `probe` until it returns `Some` or `timeout` passes.
pub fn wait_for<T>(timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        let found = probe();
        if found.is_some() || Instant::now() >= deadline {
            return found;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn run(rt: &Runtimes, script: &str) -> (String, String, i32) {
    let mut handle = rt.exec(script, ExecOptions::default()).unwrap();
    let (out, err) = collect(&mut handle);
    (out, err, handle.result().exit_code)
}

/// An audit sink that keeps every record, with its kind, for a test to read.
#[derive(Default)]
pub struct Kept(pub Mutex<Vec<(String, AuditEntry)>>);

impl AuditSink for Kept {
    fn keep(&self, kind: &str, entry: &AuditEntry) {
        let mut kept = self.0.lock().unwrap();
        kept.push((kind.to_owned(), entry.clone()));
    }
}
