//! Messages for a person watching: announcements, waits, progress. `-q` silences them;
//! errors, results and what a script reads are never silenced.

use std::sync::atomic::{AtomicBool, Ordering};

static QUIET: AtomicBool = AtomicBool::new(false);

/// Set once by `main` from `-q`.
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

pub fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// `eprintln!` unless `-q` was given.
macro_rules! notice {
    ($($arg:tt)*) => {
        if !$crate::notice::quiet() {
            eprintln!($($arg)*);
        }
    };
}
pub(crate) use notice;
