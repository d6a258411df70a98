//! Files the kernel opened without asking (`--cached-opens`): once OPEN answers ENOSYS,
//! the kernel opens every file of the connection by itself, keeps its pages across
//! opens, and sends its requests with handle 0 (`FileHandle::UNOPENED`) and no FLUSH or
//! RELEASE. A warm `grep -r` then costs no round trip per file.
//!
//! The kernel sends no RELEASE for a file it creates on such a connection either, so
//! the daemon keeps no handle for any file: a CREATE is answered with handle 0 too
//! (`WorkspaceFs::reply_created`), and nothing passes through to a staging file, since
//! nothing would say when the kernel is done with it. Reads open a handle for each READ
//! (`WorkspaceFs::read_unopened`). Writes reach the daemon through the page cache, one
//! WRITE per write(2), and go to a writer handle the daemon holds for the inode, as if
//! the file were open for writing ([`UnopenedWriters`]): a staging file takes them, so
//! that an fsync costs what the change costs, and the file is ingested once the writer
//! lets go. No close says when that is: the daemon lets go of a writer nothing has
//! written through for [`WRITER_QUIET`]. What the kernel cached is dropped when another
//! route changes a file (`replica::KernelCache`), as on any mount of this daemon.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use computer_vfs::{FileHandle, InodeNo, OpenFlags, Who, Workspace};

/// How long a held writer stays open after its last write: the staging file is ingested
/// only after it is let go, so a file written in bursts is not read back after each.
const WRITER_QUIET: Duration = Duration::from_secs(1);
/// How often the sweeper looks for quiet writers while it holds any.
const SWEEP_INTERVAL: Duration = Duration::from_millis(250);

/// The writer handles the daemon holds for files the kernel opened without asking.
#[derive(Default)]
pub(super) struct UnopenedWriters {
    state: Mutex<Writers>,
    /// Wakes the sweeper when the first writer is held, and when it must stop.
    wake: Condvar,
}

#[derive(Default)]
struct Writers {
    by_inode: HashMap<InodeNo, HeldWriter>,
    stopped: bool,
}

struct HeldWriter {
    handle: FileHandle,
    /// Requests using the handle now: it is let go only at 0.
    users: usize,
    last_used: Instant,
}

/// A held writer in use by one request; puts it back when dropped.
pub(super) struct WriterUse<'a> {
    writers: &'a UnopenedWriters,
    ino: InodeNo,
    pub handle: FileHandle,
}

impl Drop for WriterUse<'_> {
    fn drop(&mut self) {
        let mut state = self.writers.lock();
        let held = state.by_inode.get_mut(&self.ino);
        let held = held.expect("a held writer in use stays in the table");
        debug_assert_eq!(held.handle, self.handle);
        held.users -= 1;
        held.last_used = Instant::now();
    }
}

impl UnopenedWriters {
    fn lock(&self) -> MutexGuard<'_, Writers> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The writer held for `ino`, opened with `open` if there is none. Opening happens
    /// outside the table's lock; of two requests that both opened one, the second lets
    /// its own go.
    pub fn writer(
        &self,
        ws: &Workspace,
        ino: InodeNo,
        open: impl FnOnce() -> computer_vfs::Result<FileHandle>,
    ) -> computer_vfs::Result<WriterUse<'_>> {
        if let Some(writer) = self.in_use(ino) {
            return Ok(writer);
        }
        let opened = open()?;
        let (handle, surplus) = {
            let mut state = self.lock();
            let held = state.by_inode.entry(ino).or_insert(HeldWriter {
                handle: opened,
                users: 0,
                last_used: Instant::now(),
            });
            held.users += 1;
            let surplus = (held.handle != opened).then_some(opened);
            (held.handle, surplus)
        };
        self.wake.notify_all();
        // Counted in use above: whatever happens next, the use must be put back.
        let writer = WriterUse {
            writers: self,
            ino,
            handle,
        };
        release_all(ws, surplus.into_iter().collect());
        Ok(writer)
    }

    /// The writer held for `ino`, if any, counted as in use.
    fn take(&self, ino: InodeNo) -> Option<FileHandle> {
        let mut state = self.lock();
        let held = state.by_inode.get_mut(&ino)?;
        held.users += 1;
        Some(held.handle)
    }

    /// The writer held for `ino`, if any, as one request's use of it.
    pub fn in_use(&self, ino: InodeNo) -> Option<WriterUse<'_>> {
        let handle = self.take(ino)?;
        Some(WriterUse {
            writers: self,
            ino,
            handle,
        })
    }

    /// Removes the writers no request uses that have been quiet for `quiet` (all of
    /// them for zero), for the caller to release.
    fn quiet_writers(&self, state: &mut Writers, quiet: Duration) -> Vec<FileHandle> {
        let mut quiet_ones = Vec::new();
        state.by_inode.retain(|_, held| {
            let keep = held.users > 0 || held.last_used.elapsed() < quiet;
            if !keep {
                quiet_ones.push(held.handle);
            }
            keep
        });
        quiet_ones
    }

    /// Starts the thread that lets go of quiet writers. It stops at [`Self::stop`], or
    /// when nothing else holds the table, releasing every writer it holds.
    pub fn start_sweeper(self: &Arc<Self>, ws: Workspace) -> std::io::Result<()> {
        let writers = Arc::clone(self);
        std::thread::Builder::new()
            .name("unopened-writers".into())
            .spawn(move || writers.sweep(&ws))
            .map(drop)
    }

    fn sweep(self: Arc<Self>, ws: &Workspace) {
        loop {
            let quiet_ones = {
                let mut state = self.lock();
                if state.by_inode.is_empty() {
                    if state.stopped || Arc::strong_count(&self) == 1 {
                        return;
                    }
                    state = self.wake.wait(state).unwrap_or_else(|e| e.into_inner());
                } else {
                    state = (self.wake.wait_timeout(state, SWEEP_INTERVAL))
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                let last_round = state.stopped || Arc::strong_count(&self) == 1;
                let quiet = if last_round {
                    Duration::ZERO
                } else {
                    WRITER_QUIET
                };
                self.quiet_writers(&mut state, quiet)
            };
            release_all(ws, quiet_ones);
        }
    }

    /// Lets go of every writer (at unmount) and stops the sweeper; returns once the
    /// writers are released, so that what they wrote is committed or staged.
    pub fn stop(&self, ws: &Workspace) {
        let quiet_ones = {
            let mut state = self.lock();
            state.stopped = true;
            self.quiet_writers(&mut state, Duration::ZERO)
        };
        self.wake.notify_all();
        release_all(ws, quiet_ones);
    }
}

fn release_all(ws: &Workspace, handles: Vec<FileHandle>) {
    for handle in handles {
        if let Err(err) = ws.release(handle) {
            tracing::warn!("failed to release a file handle held for the kernel: {err}");
        }
    }
}

/// Opens the writer the daemon holds for `ino`: through a staging file where the
/// workspace has them, so that an fsync costs what the change costs. The kernel checked
/// the caller's access when it opened the file (such mounts check permissions in the
/// kernel too), and the held writer serves later writers of other opens, so the store
/// checks nothing here.
pub(super) fn open_writer(ws: &Workspace, ino: InodeNo) -> computer_vfs::Result<FileHandle> {
    let write_only = OpenFlags::from_libc(libc::O_WRONLY);
    let opened = ws.open_for_kernel(Who::Trusted, ino, write_only, ws.has_staging())?;
    Ok(opened.handle)
}

/// Files deleted while the kernel may still have them open: with no handle of the
/// kernel's to keep it, a file unlinked (or renamed over) while a process holds it
/// open or mapped would be gone from the store at once, and the process's next read
/// or write through the page cache would fail. The daemon holds a read-only handle on
/// the file across the deletion, which keeps it as an orphan (no links, still open),
/// until the kernel forgets the inode (FORGET: no open file or mapping of it remains)
/// or the mount ends.
#[derive(Default)]
pub(super) struct DeletedHolds {
    held: Mutex<HashMap<InodeNo, FileHandle>>,
}

impl DeletedHolds {
    fn lock(&self) -> MutexGuard<'_, HashMap<InodeNo, FileHandle>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a handle on the file `name` in `parent` names, if it is a regular file, for
    /// [`DeletedHolds::settle`] once the deletion is done.
    pub fn before_deletion(
        &self,
        ws: &Workspace,
        parent: InodeNo,
        name: &[u8],
    ) -> Option<(InodeNo, FileHandle)> {
        let attr = ws.lookup(Who::Trusted, parent, name).ok()?;
        if attr.kind != computer_vfs::FileKind::File || self.lock().contains_key(&attr.ino) {
            return None;
        }
        let read_only = OpenFlags::from_libc(libc::O_RDONLY);
        let opened = ws
            .open_for_kernel(Who::Trusted, attr.ino, read_only, false)
            .ok()?;
        Some((attr.ino, opened.handle))
    }

    /// Keeps the handle taken by [`DeletedHolds::before_deletion`] if the file lost its
    /// last link, else lets it go.
    pub fn settle(&self, ws: &Workspace, taken: Option<(InodeNo, FileHandle)>) {
        let Some((ino, handle)) = taken else { return };
        let orphan = ws.getattr(ino).is_ok_and(|attr| attr.nlink == 0);
        let kept = orphan && {
            let mut held = self.lock();
            // Two deletions of one file at once (a link and its last): one hold is enough.
            let first = !held.contains_key(&ino);
            if first {
                held.insert(ino, handle);
            }
            first
        };
        if !kept {
            release_all(ws, vec![handle]);
        }
    }

    /// The kernel forgot `ino`: a file it held deleted is let go (and deleted).
    pub fn forget(&self, ws: &Workspace, ino: InodeNo) {
        let handle = self.lock().remove(&ino);
        release_all(ws, handle.into_iter().collect());
    }

    /// At unmount: every held file is let go.
    pub fn release_every(&self, ws: &Workspace) {
        let handles = self.lock().drain().map(|(_, handle)| handle).collect();
        release_all(ws, handles);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use computer_vfs::{NewNode, Options};

    fn workspace() -> (tempfile::TempDir, Workspace) {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("ws.db");
        let options = Options {
            create: true,
            staging_dir: Some(dir.path().join("ws.db.staging")),
            ..Options::default()
        };
        let ws = Workspace::open(&db, options).unwrap();
        (dir, ws)
    }

    fn new_file(ws: &Workspace, name: &[u8]) -> InodeNo {
        let flags = OpenFlags::from_libc(libc::O_WRONLY);
        let (attr, handle) = ws
            .create(
                Who::Trusted,
                InodeNo::ROOT,
                name,
                NewNode::new(0o644),
                flags,
            )
            .unwrap();
        ws.release(handle).unwrap();
        attr.ino
    }

    fn contents(ws: &Workspace, ino: InodeNo) -> Vec<u8> {
        let read_only = OpenFlags::from_libc(libc::O_RDONLY);
        let opened = ws
            .open_for_kernel(Who::Trusted, ino, read_only, false)
            .unwrap();
        let data = ws.read(opened.handle, 0, 1 << 16).unwrap();
        ws.release(opened.handle).unwrap();
        data
    }

    #[test]
    fn a_held_writer_serves_every_write_until_it_falls_quiet() {
        let (_dir, ws) = workspace();
        let ino = new_file(&ws, b"f");
        let writers = UnopenedWriters::default();
        let first = writers.writer(&ws, ino, || open_writer(&ws, ino)).unwrap();
        let again = writers.writer(&ws, ino, || panic!("opened twice")).unwrap();
        assert_eq!(first.handle, again.handle);
        ws.write(first.handle, 0, b"written").unwrap();
        let handle = first.handle;
        drop(first);
        // In use by a request: never let go, however quiet.
        assert!(writers
            .quiet_writers(&mut writers.lock(), Duration::ZERO)
            .is_empty());
        drop(again);
        assert!(writers
            .quiet_writers(&mut writers.lock(), WRITER_QUIET)
            .is_empty());
        assert_eq!(
            writers.quiet_writers(&mut writers.lock(), Duration::ZERO),
            [handle]
        );
        ws.release(handle).unwrap();
        assert_eq!(contents(&ws, ino), b"written");
    }

    #[test]
    fn stopping_releases_every_held_writer() {
        let (_dir, ws) = workspace();
        let (a, b) = (new_file(&ws, b"a"), new_file(&ws, b"b"));
        let writers = Arc::new(UnopenedWriters::default());
        writers.start_sweeper(ws.clone()).unwrap();
        for (ino, data) in [(a, b"for a"), (b, b"for b")] {
            let writer = writers.writer(&ws, ino, || open_writer(&ws, ino)).unwrap();
            ws.write(writer.handle, 0, data).unwrap();
        }
        let handles: Vec<_> = writers.lock().by_inode.values().map(|h| h.handle).collect();
        writers.stop(&ws);
        assert!(writers.lock().by_inode.is_empty());
        for handle in handles {
            assert!(ws.release(handle).is_err(), "{handle:?} was not released");
        }
        assert_eq!(contents(&ws, a), b"for a");
        assert_eq!(contents(&ws, b), b"for b");
    }

    #[test]
    fn a_deleted_file_lives_until_the_kernel_forgets_it() {
        let (_dir, ws) = workspace();
        let ino = new_file(&ws, b"f");
        let linked = new_file(&ws, b"linked");
        ws.link(Who::Trusted, linked, InodeNo::ROOT, b"second")
            .unwrap();
        let holds = DeletedHolds::default();
        for name in [&b"f"[..], b"linked"] {
            let taken = holds.before_deletion(&ws, InodeNo::ROOT, name);
            assert!(taken.is_some());
            ws.unlink(Who::Trusted, InodeNo::ROOT, name).unwrap();
            holds.settle(&ws, taken);
        }
        // `linked` keeps a name: nothing to hold. `f` is an orphan, kept.
        assert_eq!(holds.lock().keys().collect::<Vec<_>>(), [&ino]);
        assert_eq!(ws.getattr(ino).unwrap().nlink, 0);
        holds.forget(&ws, linked);
        holds.forget(&ws, ino);
        assert!(holds.lock().is_empty());
        assert!(
            ws.getattr(ino).is_err(),
            "the orphan outlived its last holder"
        );
    }
}
