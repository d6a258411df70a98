//! The table of open files: what each open inode buffers and which handles name it.
//!
//! One part of a [`Workspace`](crate::workspace::Workspace) with its own locks: the
//! table of open inodes, the table of handles, and the count of buffered bytes of all
//! files together. An open inode's state ([`OpenState`]) has a lock of its own, taken
//! before the table's (see `workspace.rs` for the whole order). A handle's body is
//! decided once, at open: the inode's write buffer, or a staging file.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::access::Access;
use crate::base::lock;
use crate::error::{kind, Result};
use crate::staging::StagedFile;
use crate::types::{InodeNo, TimestampNs};

/// An open file, as the kernel's file handle names it. Never 0: the kernel uses 0 for a
/// file it opened without asking (`FileHandle::UNOPENED`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileHandle(pub u64);

impl FileHandle {
    /// The handle the kernel sends for a file it opened without an OPEN request (a
    /// daemon that answered OPEN with ENOSYS): no handle of this workspace's.
    pub const UNOPENED: FileHandle = FileHandle(0);
}

/// How a file is opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenFlags {
    pub read: bool,
    pub write: bool,
    /// Truncate to zero on open (`O_TRUNC`).
    pub truncate: bool,
    /// Every write goes to the end of the file (`O_APPEND`).
    pub append: bool,
    /// Opened by `execve` to run it (the kernel's `FMODE_EXEC`, which FUSE passes among
    /// the open flags): a caller needs execute permission instead of read.
    pub exec: bool,
}

impl OpenFlags {
    pub const READ: OpenFlags = OpenFlags {
        read: true,
        write: false,
        truncate: false,
        append: false,
        exec: false,
    };
    pub const WRITE: OpenFlags = OpenFlags {
        read: false,
        write: true,
        truncate: false,
        append: false,
        exec: false,
    };
    pub const READ_WRITE: OpenFlags = OpenFlags {
        read: true,
        write: true,
        truncate: false,
        append: false,
        exec: false,
    };

    /// Decodes `open(2)` flags, as the kernel passes them to FUSE.
    pub fn from_libc(flags: i32) -> OpenFlags {
        /// The kernel's `__FMODE_EXEC`, set for an open by `execve`; no `O_` flag uses it.
        const FMODE_EXEC: i32 = 0x20;
        let access = flags & libc::O_ACCMODE;
        OpenFlags {
            read: access == libc::O_RDONLY || access == libc::O_RDWR,
            write: access == libc::O_WRONLY || access == libc::O_RDWR,
            truncate: flags & libc::O_TRUNC != 0,
            append: flags & libc::O_APPEND != 0,
            exec: flags & FMODE_EXEC != 0,
        }
    }

    /// What a caller needs to open a file with these flags.
    pub(crate) fn access(&self) -> Access {
        if self.exec {
            return Access::EXEC;
        }
        Access {
            read: self.read,
            write: self.write,
            exec: false,
        }
    }
}

/// Buffered writes of one file: sorted, non-overlapping runs.
#[derive(Default)]
pub(crate) struct Dirty {
    runs: BTreeMap<u64, Vec<u8>>,
    pub(crate) bytes: usize,
}

impl Dirty {
    pub(crate) fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Records `data` at `offset`, merging with the runs it overlaps or touches.
    pub(crate) fn insert(&mut self, offset: u64, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let end = offset + data.len() as u64;
        // Fast path: appending to the run that ends exactly here, with nothing after.
        if let Some((&start, run)) = self.runs.range_mut(..=offset).next_back() {
            let run_end = start + run.len() as u64;
            let nothing_after = self.runs_after(offset).is_none_or(|next| next >= end);
            if run_end == offset && nothing_after {
                let run = self.runs.get_mut(&start).expect("run exists");
                run.extend_from_slice(data);
                self.bytes += data.len();
                return;
            }
        }
        // General case: collect every run overlapping or touching [offset, end].
        let mut first = offset;
        let mut last = end;
        let touching: Vec<u64> = self
            .runs
            .range(..=end)
            .filter(|(&s, r)| s + r.len() as u64 >= offset)
            .map(|(&s, _)| s)
            .collect();
        if let Some(&s) = touching.first() {
            first = first.min(s);
        }
        let mut merged_parts: Vec<(u64, Vec<u8>)> = Vec::with_capacity(touching.len());
        for s in touching {
            let run = self.runs.remove(&s).expect("run exists");
            self.bytes -= run.len();
            last = last.max(s + run.len() as u64);
            merged_parts.push((s, run));
        }
        let mut merged = vec![0u8; (last - first) as usize];
        for (s, run) in &merged_parts {
            let at = (s - first) as usize;
            merged[at..at + run.len()].copy_from_slice(run);
        }
        let at = (offset - first) as usize;
        merged[at..at + data.len()].copy_from_slice(data);
        self.bytes += merged.len();
        self.runs.insert(first, merged);
    }

    fn runs_after(&self, offset: u64) -> Option<u64> {
        self.runs.range(offset + 1..).next().map(|(&s, _)| s)
    }

    /// Removes everything at or past `size` and returns it, so that a failed truncation
    /// can put it back ([`Dirty::rejoin`]).
    pub(crate) fn split_off(&mut self, size: u64) -> Dirty {
        let mut tail = Dirty::default();
        if let Some((&s, run)) = self.runs.range_mut(..size).next_back() {
            let keep = (size - s) as usize;
            if run.len() > keep {
                let cut = run.split_off(keep);
                self.bytes -= cut.len();
                tail.bytes += cut.len();
                tail.runs.insert(size, cut);
            }
        }
        let doomed: Vec<u64> = self.runs.range(size..).map(|(&s, _)| s).collect();
        for s in doomed {
            let run = self.runs.remove(&s).expect("run exists");
            self.bytes -= run.len();
            tail.bytes += run.len();
            tail.runs.insert(s, run);
        }
        tail
    }

    /// Puts back what [`Dirty::split_off`] removed.
    pub(crate) fn rejoin(&mut self, tail: Dirty) {
        for (s, run) in tail.runs {
            self.insert(s, &run);
        }
    }

    /// Copies buffered bytes over `buf`, which holds the file from `offset`.
    pub(crate) fn overlay(&self, offset: u64, buf: &mut [u8]) {
        let end = offset + buf.len() as u64;
        let start_key = self
            .runs
            .range(..=offset)
            .next_back()
            .map_or(offset, |(&s, _)| s);
        for (&s, run) in self.runs.range(start_key..end) {
            let run_end = s + run.len() as u64;
            if run_end <= offset {
                continue;
            }
            let from = offset.max(s);
            let to = end.min(run_end);
            buf[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&run[(from - s) as usize..(to - s) as usize]);
        }
    }

    pub(crate) fn patch(&self) -> Vec<(u64, &[u8])> {
        self.runs.iter().map(|(&s, r)| (s, r.as_slice())).collect()
    }

    pub(crate) fn clear(&mut self) -> usize {
        let bytes = self.bytes;
        self.runs.clear();
        self.bytes = 0;
        bytes
    }
}

/// The shared state of an inode with open handles.
pub(crate) struct OpenInode {
    pub(crate) ino: InodeNo,
    /// Handles (and transient users); changed only under the open-table lock.
    users: AtomicU64,
    /// Its last link went while it was open: the last release must delete it.
    maybe_orphan: AtomicBool,
    /// The stored mode may hold set-id bits that a write takes away
    /// ([`Workspace::drop_setid_after_write`](crate::workspace::Workspace::drop_setid_after_write)). Set when the inode is opened and again by
    /// whatever may add such bits while it is open (chmod, a peer's changes); cleared
    /// only when the stored mode has none, so a write to an ordinary file asks nothing
    /// of the database.
    setid_maybe: AtomicBool,
    pub(crate) state: Mutex<OpenState>,
}

#[derive(Default)]
pub(crate) struct OpenState {
    /// Whether `size` has been read from the database yet.
    pub(crate) loaded: bool,
    /// The file size including buffered writes.
    pub(crate) size: u64,
    pub(crate) dirty: Dirty,
    /// The time of the last buffered write, committed as mtime and ctime.
    pub(crate) written_at: Option<TimestampNs>,
    /// The node had no link left when it was opened (reopened through /proc, or opened
    /// by a racing path lookup): its last user must delete it.
    pub(crate) opened_unlinked: bool,
}

/// What an open handle reads and writes, decided when it is opened.
#[derive(Clone)]
pub(crate) enum Body {
    /// The inode's write buffer over its stored content.
    Buffered,
    /// A staging file, which the kernel may also read and write itself (passthrough).
    Staged(Arc<StagedFile>),
}

/// An open handle.
#[derive(Clone)]
pub(crate) struct OpenHandle {
    pub(crate) open: Arc<OpenInode>,
    pub(crate) flags: OpenFlags,
    pub(crate) body: Body,
}

impl OpenHandle {
    /// The staging file behind the handle, if it has one.
    pub(crate) fn staged(&self) -> Option<&Arc<StagedFile>> {
        match &self.body {
            Body::Buffered => None,
            Body::Staged(staged) => Some(staged),
        }
    }
}

impl OpenInode {
    /// Whether the inode lost its last link while open: its last user deletes it.
    pub(crate) fn maybe_orphan(&self) -> bool {
        self.maybe_orphan.load(Ordering::SeqCst)
    }

    /// Whether a write must look at the stored mode for set-id bits; the caller looks,
    /// and calls [`OpenInode::keep_setid_check`] if the bits are there.
    pub(crate) fn take_setid_check(&self) -> bool {
        self.setid_maybe.swap(false, Ordering::SeqCst)
    }

    pub(crate) fn keep_setid_check(&self) {
        self.setid_maybe.store(true, Ordering::SeqCst);
    }
}

/// The open inodes and handles of a workspace.
#[derive(Default)]
pub(crate) struct OpenFiles {
    inodes: Mutex<HashMap<InodeNo, Arc<OpenInode>>>,
    handles: Mutex<HashMap<u64, OpenHandle>>,
    next_handle: AtomicU64,
    /// Buffered bytes of all open inodes together.
    dirty_total: AtomicUsize,
    /// How many times an overlay stopped applying (see [`OpenFiles::overlays_ended`]).
    overlays_ended: AtomicU64,
}

impl OpenFiles {
    /// Counts a user of `ino` (a handle, or a transient one) and returns its state,
    /// shared by all of its users.
    pub(crate) fn acquire(&self, ino: InodeNo) -> Arc<OpenInode> {
        let mut inodes = lock(&self.inodes);
        let entry = inodes.entry(ino).or_insert_with(|| {
            Arc::new(OpenInode {
                ino,
                users: AtomicU64::new(0),
                maybe_orphan: AtomicBool::new(false),
                // Unknown until a write looks.
                setid_maybe: AtomicBool::new(true),
                state: Mutex::new(OpenState::default()),
            })
        });
        entry.users.fetch_add(1, Ordering::SeqCst);
        entry.clone()
    }

    /// Drops one user; the last one removes the shared state. Returns whether it was the
    /// last.
    pub(crate) fn unacquire(&self, open: &Arc<OpenInode>) -> bool {
        let mut inodes = lock(&self.inodes);
        let left = open.users.fetch_sub(1, Ordering::SeqCst) - 1;
        if left > 0 {
            return false;
        }
        if inodes
            .get(&open.ino)
            .is_some_and(|current| Arc::ptr_eq(current, open))
        {
            // Counted before the state goes, under the lock a reader's `get` takes.
            self.overlay_ended();
            inodes.remove(&open.ino);
        }
        true
    }

    /// How many times an overlay of attributes stopped applying: a buffered inode let
    /// go after its commit, a staged file found clean after its ingestion. Each comes
    /// after the database write that makes the overlay unneeded, so a reader that saw
    /// this count unchanged from before its database read to after it laid the
    /// overlays missed none (`Workspace::overlaid`).
    pub(crate) fn overlays_ended(&self) -> u64 {
        self.overlays_ended.load(Ordering::SeqCst)
    }

    /// Counts an overlay ending; called before the state that held it changes, and
    /// under the lock through which readers see that state.
    pub(crate) fn overlay_ended(&self) {
        self.overlays_ended.fetch_add(1, Ordering::SeqCst);
    }

    /// Whether `open` has no user besides the one asking (its own handle).
    pub(crate) fn sole_user(&self, open: &OpenInode) -> bool {
        let _inodes = lock(&self.inodes);
        open.users.load(Ordering::SeqCst) == 1
    }

    pub(crate) fn get(&self, ino: InodeNo) -> Option<Arc<OpenInode>> {
        lock(&self.inodes).get(&ino).cloned()
    }

    pub(crate) fn is_open(&self, ino: InodeNo) -> bool {
        lock(&self.inodes).contains_key(&ino)
    }

    /// Inodes with users right now.
    pub(crate) fn inodes(&self) -> Vec<InodeNo> {
        lock(&self.inodes).keys().copied().collect()
    }

    /// The state of every open inode.
    pub(crate) fn all(&self) -> Vec<Arc<OpenInode>> {
        lock(&self.inodes).values().cloned().collect()
    }

    /// The state of every open inode, for a workspace going away.
    pub(crate) fn drain(&mut self) -> Vec<Arc<OpenInode>> {
        self.inodes
            .get_mut()
            .map(|inodes| inodes.drain().map(|(_, open)| open).collect())
            .unwrap_or_default()
    }

    /// Marks `ino` as losing its last link if it is open, and says whether it was. Under
    /// the table's lock, so the last release either comes after (and sees the mark) or
    /// came before (and the inode is not found).
    pub(crate) fn mark_orphan(&self, ino: InodeNo) -> bool {
        match lock(&self.inodes).get(&ino) {
            Some(open) => {
                open.maybe_orphan.store(true, Ordering::SeqCst);
                true
            }
            None => false,
        }
    }

    /// Whether some open inode has lost its last link.
    pub(crate) fn any_orphan(&self) -> bool {
        lock(&self.inodes).values().any(|open| open.maybe_orphan())
    }

    /// Tells `ino` (or, with `None`, every open inode) that its stored mode may have
    /// gained set-id bits.
    pub(crate) fn setid_may_be_back(&self, ino: Option<InodeNo>) {
        let inodes = lock(&self.inodes);
        match ino {
            Some(ino) => inodes
                .get(&ino)
                .into_iter()
                .for_each(|o| o.keep_setid_check()),
            None => inodes.values().for_each(|o| o.keep_setid_check()),
        }
    }

    pub(crate) fn add_handle(&self, handle: OpenHandle) -> FileHandle {
        // From 1: 0 is `FileHandle::UNOPENED`.
        let id = self.next_handle.fetch_add(1, Ordering::SeqCst) + 1;
        lock(&self.handles).insert(id, handle);
        FileHandle(id)
    }

    pub(crate) fn handle(&self, fh: FileHandle) -> Result<OpenHandle> {
        let handles = lock(&self.handles);
        handles.get(&fh.0).cloned().ok_or_else(kind::BadHandle)
    }

    pub(crate) fn remove_handle(&self, fh: FileHandle) -> Result<OpenHandle> {
        lock(&self.handles)
            .remove(&fh.0)
            .ok_or_else(kind::BadHandle)
    }

    /// Counts `bytes` more buffered; returns the total of all files.
    pub(crate) fn dirty_grown(&self, bytes: usize) -> usize {
        self.dirty_total.fetch_add(bytes, Ordering::SeqCst) + bytes
    }

    /// Forgets `bytes` of buffered writes that were committed or dropped.
    pub(crate) fn dirty_released(&self, bytes: usize) {
        let before = self.dirty_total.fetch_sub(bytes, Ordering::SeqCst);
        debug_assert!(
            before >= bytes,
            "released {bytes} of {before} buffered bytes"
        );
    }

    #[cfg(test)]
    pub(crate) fn dirty_total(&self) -> usize {
        self.dirty_total.load(Ordering::SeqCst)
    }
}
