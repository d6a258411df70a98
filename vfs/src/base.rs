//! Small helpers every layer of the store shares. Nothing here imports another module
//! of the crate, so any module may use it without an upward edge.

use std::sync::{Mutex, MutexGuard};

/// Locks `mutex`, taking its data even if a thread panicked while holding it: the data
/// of every mutex here stays consistent between statements (a panic is a bug reported
/// on its own), and one panic must not turn every later call into another.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Lowers the calling thread's CPU priority: ingestion and checkpoints should not take
/// the CPU from the commands a user is waiting for.
pub(crate) fn background_priority() {
    // SAFETY: gettid and setpriority have no memory effects; a failure only leaves the
    // priority as it was.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 10);
    }
}
