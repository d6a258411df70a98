//! Small helpers every layer of the store shares. Nothing here imports another module
//! of the crate, so any module may use it without an upward edge.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// How many symbolic links [`real_path`] follows through a name that does not exist
/// yet, as the kernel does before ELOOP.
const SYMLINKS_FOLLOWED_MAX: u32 = 40;

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

/// `path` with every symbolic link resolved, absolute: the file SQLite opens for a
/// database path (it resolves links itself, so its `-wal` lies beside the target),
/// and the path the mount table lists for a mount point. A name that does not exist
/// yet keeps its place under its resolved directory, or, if it is a dangling link,
/// becomes the link's target, where a create would put the file.
///
/// Everything named after a database (its owner lock, staging directory, log) must be
/// named after this path: two names of one database would otherwise get two locks.
pub fn real_path(path: &Path) -> PathBuf {
    real_path_following(path, SYMLINKS_FOLLOWED_MAX)
}

fn real_path_following(path: &Path, links_left: u32) -> PathBuf {
    if let Ok(real) = std::fs::canonicalize(path) {
        return real;
    }
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
    let (Some(parent), Some(name)) = (absolute.parent(), absolute.file_name()) else {
        return absolute;
    };
    let dir = real_path_following(parent, links_left);
    let joined = dir.join(name);
    match std::fs::read_link(&joined) {
        Ok(target) if links_left > 0 => real_path_following(&dir.join(target), links_left - 1),
        _ => joined,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn real_path_resolves_links_to_files_that_exist_and_that_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir(root.join("data")).unwrap();
        std::fs::write(root.join("data/ws.db"), b"").unwrap();
        symlink(root.join("data/ws.db"), root.join("link.db")).unwrap();
        symlink("data", root.join("dir")).unwrap();
        symlink("data/new.db", root.join("dangling.db")).unwrap();
        symlink("loop.db", root.join("loop.db")).unwrap();

        assert_eq!(real_path(&root.join("link.db")), root.join("data/ws.db"));
        assert_eq!(real_path(&root.join("dir/ws.db")), root.join("data/ws.db"));
        assert_eq!(
            real_path(&root.join("dir/new.db")),
            root.join("data/new.db")
        );
        assert_eq!(
            real_path(&root.join("dangling.db")),
            root.join("data/new.db")
        );
        assert_eq!(
            real_path(&root.join("missing/new.db")),
            root.join("missing/new.db")
        );
        // A loop ends after the kernel's number of links, at the link itself.
        assert_eq!(real_path(&root.join("loop.db")), root.join("loop.db"));
    }

    #[test]
    fn real_path_makes_a_relative_path_absolute() {
        let cwd = std::fs::canonicalize(".").unwrap();
        assert_eq!(
            real_path(Path::new("no-such-file.db")),
            cwd.join("no-such-file.db")
        );
    }
}
