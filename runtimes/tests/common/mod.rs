//! Helpers shared by the runtimes' integration tests.

#![allow(dead_code)] // each test binary uses its own share

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

pub fn run(rt: &Runtimes, script: &str) -> (String, String, i32) {
    let mut handle = rt.exec(script, ExecOptions::default()).unwrap();
    let (out, err) = collect(&mut handle);
    (out, err, handle.result().exit_code)
}
