//! A file that a test changes version by version while a thread keeps reading it
//! through a mount, each read through a new open: the reader must never go back to an
//! older version (pages the kernel kept, or was given, from before a change would show
//! one).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A thread that reads a file through the mount over and over, each time through a new
/// open, and checks what it read: `check(content, last)` returns what the next check
/// gets as `last`.
pub struct ReadLoop {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl ReadLoop {
    pub fn start(path: &Path, check: fn(&[u8], u32) -> u32) -> ReadLoop {
        let stop = Arc::new(AtomicBool::new(false));
        let (path, stopped) = (path.to_path_buf(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut last = 0;
            while !stopped.load(Ordering::Relaxed) {
                last = check(&std::fs::read(&path).unwrap(), last);
            }
        });
        ReadLoop { stop, thread }
    }

    /// Stops the loop, failing the test if a read or a check failed.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the read loop failed");
    }
}

/// A file's content at version `v`: small enough to come with its opens, and long
/// enough that a mixture of two versions would not parse.
pub fn version(v: u32) -> Vec<u8> {
    format!("version {v}\n").repeat(200).into_bytes()
}

/// A [`ReadLoop`] check: the version read is never older than the last one seen (a
/// torn read, see [`version_of`], is skipped).
pub fn never_older(content: &[u8], last: u32) -> u32 {
    match version_of(content) {
        Some(seen) => {
            assert!(seen >= last, "read version {seen} after {last}");
            seen
        }
        None => last,
    }
}

/// The version `content` holds, or `None` for a read torn by a change in flight: the
/// kernel drops a file's attributes before its pages when told to forget them, so a
/// read in between may see the new size over the old page. After the change returned,
/// no read may be torn.
pub fn version_of(content: &[u8]) -> Option<u32> {
    let text = std::str::from_utf8(content).ok()?;
    let first = text.lines().next()?;
    let whole = text == format!("{first}\n").repeat(200);
    whole.then(|| first.strip_prefix("version ")?.parse().ok())?
}

/// Rewrites the file `name` of the workspace in `db` in place, as version `v`, with the
/// shell backend (`computerd exec --backend shell`: bash inside the daemon that owns
/// `db`, on the store, a route that reaches the kernel's caches only through the
/// daemon's invalidations). Fails the test if the command fails.
pub fn rewrite_in_place(db: &Path, name: &str, v: u32) {
    let script = format!("for i in $(seq 1 200); do echo 'version {v}'; done > {name}");
    let out = super::exec(db, &["--backend", "shell"], &script);
    let failure = super::describe_failure(&script, None, &out);
    assert!(out.status.success(), "{failure}");
}
