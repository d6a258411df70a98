//! The inode API for staged files: opening files so the kernel can read and write them
//! directly (FUSE passthrough), and every operation on a handle or an inode that has a
//! staging file. `staging.rs` owns the files; this module owns the rules:
//!
//! - A file opened for writing by the kernel is staged (materialised if it has content)
//!   unless it is open through the write buffer already: one inode never has both.
//! - Once staged, every open of the inode (reading too) uses the staging file, so all of
//!   them see the same bytes.
//! - A writer makes the file dirty, recorded in the `staged` table first, so a crash
//!   loses nothing: the next open ingests it. The last writer's release queues the
//!   ingestion on the worker thread.
//! - `fsync` syncs the staging file (and the row binding it), which is enough for the
//!   next open to recover it; it does not ingest, so it costs what the change costs,
//!   not what the file's size costs (a database in the workspace fsyncs a few pages of
//!   a large file at every commit). The worker ingests a synced file that is still
//!   open for writing once it has been quiet for a moment, and never stores a snapshot
//!   that changed while it was read.
//! - While dirty, size and times come from the staging file (the kernel updates them).

use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use crate::access::{self, Access, Credentials, Who};
use crate::base::lock;
use crate::error::{kind, Error, Result};
use crate::ingest::{IngestOutcome, SMALL_FILES_PER_BATCH, SMALL_FILE_BYTES};
use crate::open_files::{Body, FileHandle, OpenFlags, OpenHandle, OpenInode};
use crate::staged_rows;
use crate::staging::{Doom, StagedFile, StagedState, Staging, POOL_LOW};
use crate::store;
use crate::types::*;
use crate::workspace::{ReadTarget, Workspace};

/// How long a released file waits before the worker ingests it: short-lived files are
/// deleted before they cost anything, and small files are ingested together.
const INGEST_DELAY: Duration = Duration::from_secs(1);

/// Attempts to attach to a staging file that keeps being evicted under us.
const ATTACH_ATTEMPTS: usize = 16;

/// Files of deleted nodes that wake the worker to recycle them together.
const DOOMED_BATCH: usize = 64;
/// A deleted staging file this large wakes the worker to give its space back at once.
const DOOMED_LARGE_BYTES: u64 = 1 << 20;

/// What `open_for_kernel` and `create_for_kernel` return.
pub struct Opened {
    pub handle: FileHandle,
    /// The staging file behind the handle, if any.
    pub staged: Option<Arc<StagedFile>>,
    /// Whether the kernel may read and write that file directly (passthrough). Not for a
    /// file whose writes drop set-id bits: those must reach the store
    /// (`Workspace::drop_setid_after_write`), so its handle is served by the daemon.
    pub passthrough: bool,
}

impl Opened {
    /// A handle served through the write buffer.
    fn buffered(handle: FileHandle) -> Opened {
        Opened {
            handle,
            staged: None,
            passthrough: false,
        }
    }
}

/// Why a file was not staged.
enum StageRefusal {
    /// Served through the write buffer instead (too large, or open that way already).
    UseBuffer,
    Failed(Error),
}

impl From<Error> for StageRefusal {
    fn from(err: Error) -> StageRefusal {
        StageRefusal::Failed(err)
    }
}

impl Workspace {
    /// Whether this workspace stages files (so passthrough can be offered).
    pub fn has_staging(&self) -> bool {
        self.staging().is_some()
    }

    /// Files whose content still waits in staging files to be ingested, as committed
    /// (a cheap count: what `computerd status` shows of a mount).
    pub fn staged_files(&self) -> Result<u64> {
        self.db().read(staged_rows::count)
    }

    pub(crate) fn staged_entry(&self, ino: InodeNo) -> Option<Arc<StagedFile>> {
        self.staging().and_then(|s| s.get(ino))
    }

    /// Opens a file for the kernel, `flags` as the caller opened it. With `passthrough`,
    /// a file opened for writing is staged and the returned staging file should be
    /// handed to the kernel. The handle may read whatever the caller asked: the kernel
    /// fills its page cache through any handle. A caller needs the access the flags ask
    /// for (execute, for `execve`).
    pub fn open_for_kernel(
        &self,
        who: Who<'_>,
        ino: InodeNo,
        flags: OpenFlags,
        passthrough: bool,
    ) -> Result<Opened> {
        let (wanted, (flags, mappable)) = (flags.access(), for_kernel(flags, passthrough));
        let check = who.cred().map(|cred| (cred, wanted));
        self.open_with(ino, flags, passthrough, mappable, check)
    }

    /// [`Workspace::open_for_kernel`] with the handle's own `flags`; `mappable`: a
    /// staging file returned may be mapped by the caller (`StagedState::mappable`);
    /// `check`: a caller and the access it asked for.
    pub(crate) fn open_with(
        &self,
        ino: InodeNo,
        flags: OpenFlags,
        passthrough: bool,
        mappable: bool,
        check: Option<(&Credentials<'_>, Access)>,
    ) -> Result<Opened> {
        if flags.write && self.is_read_only() {
            return Err(kind::ReadOnly());
        }
        if flags.write {
            self.write_gate().pass()?;
        }
        // A writer needs the attributes before choosing a body: set-id files are never
        // staged for writing, nor written through a staging file. A reader of an
        // unstaged file is checked on the attributes the buffered open loads anyway:
        // one database read per open, which `grep -r` makes thousands of.
        let writer_attr = flags.write.then(|| self.stored_attr(ino)).transpose()?;
        let keep_out = writer_attr
            .as_ref()
            .is_some_and(|attr| access::write_may_drop_bits(attr.perm));
        let check_staged = || match (check, &writer_attr) {
            (None, _) => Ok(()),
            (Some((cred, want)), Some(attr)) => access::check(attr, cred, want),
            (Some((cred, want)), None) => access::check(&self.stored_attr(ino)?, cred, want),
        };
        // A staging file can be evicted or deleted between looking it up and attaching
        // to it; then look again (a bounded number of times: each retry means another
        // thread made progress).
        for _ in 0..ATTACH_ATTEMPTS {
            if let Some(staged) = self.staged_entry(ino) {
                check_staged()?;
                match self.attach(&staged, flags, mappable)? {
                    Some(handle) => {
                        return Ok(Opened {
                            handle,
                            staged: Some(staged),
                            passthrough: !keep_out,
                        })
                    }
                    None => continue,
                }
            }
            if passthrough && flags.write && !keep_out && self.has_staging() {
                check_staged()?;
                match self.stage_and_attach(ino, flags, mappable) {
                    Ok(Some(opened)) => return Ok(opened),
                    Ok(None) => continue,
                    Err(StageRefusal::UseBuffer) => {}
                    Err(StageRefusal::Failed(err)) => return Err(err),
                }
            }
            match self.open_buffered(ino, flags, check)? {
                Some(handle) => return Ok(Opened::buffered(handle)),
                None => continue,
            }
        }
        Err(Error::Busy(Default::default()))
    }

    /// Creates a regular file and opens it for the kernel, staged when `passthrough`. A
    /// caller is checked as for [`Workspace::create`].
    pub fn create_for_kernel(
        &self,
        who: Who<'_>,
        parent: InodeNo,
        name: &[u8],
        owner: NewNode,
        flags: OpenFlags,
        passthrough: bool,
    ) -> Result<(Attr, Opened)> {
        let (flags, mappable) = for_kernel(flags, passthrough);
        self.write_gate().pass()?;
        let reserved = (self.staging().filter(|_| passthrough))
            .and_then(|staging| Some((staging, staging.try_reserve()?)));
        let Some((staging, file)) = reserved else {
            // Without staging, or with no file ready (a burst of creates outran the pool,
            // which grows for the next one): served through the write buffer rather
            // than by creating a file on the request path, which can cost a millisecond
            // on a busy disk.
            let (attr, handle) = self.create(who, parent, name, owner, flags)?;
            return Ok((attr, Opened::buffered(handle)));
        };
        let now = self.now();
        let created = self.db().write(|txn| {
            let ino = Workspace::insert_entry_node(
                txn,
                who.cred(),
                (parent, name),
                FileKind::File,
                owner,
                0,
                now,
            )?;
            staged_rows::bind(txn, ino, &file.name)?;
            store::attr(txn, ino)
        });
        let attr = match created {
            Ok(attr) => attr,
            Err(err) => {
                staging.give_back(file);
                return Err(err);
            }
        };
        let staged = staging.bind(attr.ino, file, true);
        staged.set_times(Some(attr.atime), Some(attr.mtime))?;
        lock(&staging.entries).insert(attr.ino, staged.clone());
        // Nothing else can have taken a file bound a moment ago to a node only we know.
        let handle = self
            .attach(
                &staged,
                OpenFlags {
                    truncate: false,
                    ..flags
                },
                mappable,
            )?
            .ok_or_else(|| Error::corrupt("a new staging file vanished"))?;
        let passthrough = !access::write_may_drop_bits(attr.perm);
        Ok((
            attr,
            Opened {
                handle,
                staged: Some(staged),
                passthrough,
            },
        ))
    }

    /// Stages `ino` and opens a handle on it, holding the inode from before the fill to
    /// after the handle counts as its user: a deletion meanwhile leaves it an orphan
    /// for the handle's release, as for any open file. `None`: the entry went before the
    /// handle could attach (look again).
    fn stage_and_attach(
        &self,
        ino: InodeNo,
        flags: OpenFlags,
        mappable: bool,
    ) -> Result<Option<Opened>, StageRefusal> {
        let hold = self.acquire(ino);
        let attached = self.stage(ino, &hold).and_then(|staged| {
            let handle = self.attach(&staged, flags, mappable)?;
            Ok(handle.map(|handle| Opened {
                handle,
                staged: Some(staged),
                passthrough: true,
            }))
        });
        // Not the last user once attached; otherwise the last one, which may delete an
        // orphan: that failure is the open's.
        let finished = self.finish_use(&hold);
        let opened = attached?;
        finished?;
        Ok(opened)
    }

    /// Stages `ino`, which the caller holds (`hold`): binds a staging file and fills it
    /// with the stored content.
    fn stage(&self, ino: InodeNo, hold: &OpenInode) -> Result<Arc<StagedFile>, StageRefusal> {
        let staging = self
            .staging()
            .expect("stage is only called with staging on");
        let _one_at_a_time = lock(&staging.create_lock);
        if let Some(staged) = staging.get(ino) {
            return Ok(staged);
        }
        // Marked before looking for users, and dropped only after the entry is
        // published: a route that holds the inode from now on waits, then finds it.
        let _fill = staging.begin_fill(ino);
        // An open through the buffer (or a buffered write in progress, or another
        // route's change of the content) keeps the inode out of staging: the kernel
        // cannot mix cached and passthrough opens, and a fill would copy content that
        // changes behind it.
        if !self.files().sole_user(hold) {
            return Err(StageRefusal::UseBuffer);
        }
        let attr = self.db().read(|conn| store::attr(conn, ino))?;
        if attr.kind != FileKind::File {
            return Err(StageRefusal::Failed(if attr.is_dir() {
                kind::IsDir()
            } else {
                Error::invalid("not a regular file")
            }));
        }
        if attr.size > self.options().stage_size_max {
            return Err(StageRefusal::UseBuffer);
        }
        let Some(file) = staging.try_reserve() else {
            return Err(StageRefusal::UseBuffer);
        };
        let name = file.name.clone();
        let staged = match self.fill_staging(staging, ino, file, &attr) {
            Ok(staged) => staged,
            Err(err) => {
                staging.recycle(name);
                return Err(err.into());
            }
        };
        lock(&staging.entries).insert(ino, staged.clone());
        Ok(staged)
    }

    fn fill_staging(
        &self,
        staging: &Staging,
        ino: InodeNo,
        file: crate::staging::PoolFile,
        attr: &Attr,
    ) -> Result<Arc<StagedFile>> {
        let staged = staging.bind(ino, file, false);
        if attr.size > 0 {
            self.materialize(ino, &staged, attr.size)?;
        }
        staged.set_times(Some(attr.atime), Some(attr.mtime))?;
        Ok(staged)
    }

    /// Opens a handle on a staged file. A writer marks it dirty, durably first.
    /// `None` if the entry stopped being the inode's staging file (evicted or deleted)
    /// after the caller looked it up: the caller looks again.
    pub(crate) fn attach(
        &self,
        staged: &Arc<StagedFile>,
        flags: OpenFlags,
        mappable: bool,
    ) -> Result<Option<FileHandle>> {
        let staging = self
            .staging()
            .expect("staged files exist only with staging on");
        {
            // Check membership and count the user under the table lock: eviction decides
            // under the same lock, so it either sees this user or already took the file.
            let entries = lock(&staging.entries);
            if !entries
                .get(&staged.ino)
                .is_some_and(|current| Arc::ptr_eq(current, staged))
            {
                return Ok(None);
            }
            let mut state = lock(&staged.state);
            drop(entries);
            if flags.write && !state.dirty {
                self.record_staged(staged)?;
                state.dirty = true;
            }
            state.users += 1;
            state.mappable |= mappable;
            state.map_writable |= mappable && flags.write;
            if flags.write {
                state.writers += 1;
                state.version += 1;
            }
            state.last_used = Instant::now();
        }
        if flags.write && flags.truncate {
            staged.set_len(0)?;
        }
        let open = self.acquire(staged.ino);
        Ok(Some(self.files().add_handle(OpenHandle {
            open,
            flags,
            body: Body::Staged(staged.clone()),
        })))
    }

    /// The staging file of `ino`, for a route that holds `ino` (`Workspace::acquire`) and
    /// is about to change its content or times: once a fill under way ended, the entry
    /// is there to write through, or no fill can copy the store from under the route
    /// ([`crate::staging::Staging::begin_fill`]).
    pub(crate) fn staged_for_holder(&self, ino: InodeNo) -> Option<Arc<StagedFile>> {
        let staging = self.staging()?;
        debug_assert!(self.is_open(ino), "the caller holds the inode");
        staging.wait_fill(ino);
        staging.get(ino)
    }

    /// Counts a user of `staged` if it is still the inode's staging file; eviction leaves
    /// used files alone. `false`: it was evicted or deleted meanwhile.
    pub(crate) fn pin_staged(&self, staged: &Arc<StagedFile>) -> bool {
        let Some(staging) = self.staging() else {
            return false;
        };
        let entries = lock(&staging.entries);
        if !entries
            .get(&staged.ino)
            .is_some_and(|current| Arc::ptr_eq(current, staged))
        {
            return false;
        }
        lock(&staged.state).users += 1;
        true
    }

    pub(crate) fn unpin_staged(&self, staged: &StagedFile) {
        let mut state = lock(&staged.state);
        state.users = state.users.saturating_sub(1);
    }

    /// Records in the database that `staged` may hold content the store lacks.
    fn record_staged(&self, staged: &StagedFile) -> Result<()> {
        self.db().write(|txn| {
            txn.skip_quota();
            staged_rows::bind(txn, staged.ino, &staged.name)
        })
    }

    /// Changes a staged file outside a writer handle (truncate, content) by `change`,
    /// counted as a writer while it runs: an ingestion that reads the file meanwhile
    /// stores no snapshot the change tore (`commit_snapshot`), nor calls it clean. The
    /// file is dirty, durably, before it changes, and queued to be ingested after.
    fn change_as_writer(
        &self,
        staged: &StagedFile,
        change: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        {
            let mut state = lock(&staged.state);
            if !state.dirty {
                self.record_staged(staged)?;
                state.dirty = true;
            }
            state.writers += 1;
            state.version += 1;
        }
        let changed = change();
        let mut state = lock(&staged.state);
        state.writers -= 1;
        self.changed_again(staged, state);
        changed
    }

    /// A dirty staged file changed once more (`state` is its state, locked): an
    /// ingestion under way, which read it before, leaves it dirty, and it is queued to
    /// be taken again unless a writer still holds it (its release queues it).
    fn changed_again(&self, staged: &StagedFile, mut state: MutexGuard<'_, StagedState>) {
        debug_assert!(state.dirty, "only a dirty file is ingested");
        state.version += 1;
        let idle = state.writers == 0;
        drop(state);
        if idle {
            if let Some(staging) = self.staging() {
                staging.enqueue(staged.ino);
            }
        }
    }

    /// `fsync(2)` of a staged file: its content durable in the staging file, and the
    /// name of that file durable in the staging directory. The row that binds it was
    /// written when it became dirty; the caller makes it durable (`Db::sync`). A crash
    /// from then on loses nothing: the next open ingests the file. The worker ingests it
    /// before that, once it is quiet, so that peers see what was synced.
    pub(crate) fn sync_staged(&self, staged: &StagedFile, datasync: bool) -> Result<()> {
        let staging = self
            .staging()
            .expect("staged files exist only with staging on");
        staged.sync(datasync)?;
        staging.sync_names()?;
        if lock(&staged.state).dirty {
            staging.enqueue(staged.ino);
        }
        Ok(())
    }

    /// A handle on a staged file is closed: the last writer queues the ingestion.
    pub(crate) fn staged_release(&self, staged: &StagedFile, flags: OpenFlags) {
        let queue = {
            let mut state = lock(&staged.state);
            state.users = state.users.saturating_sub(1);
            if flags.write {
                state.writers = state.writers.saturating_sub(1);
            }
            state.last_used = Instant::now();
            if flags.write && state.map_writable && !state.mapped {
                // A mapping made through a handle that could write may outlive it: it
                // takes the handle's place as a writer, so the file stays dirty, until
                // nothing else holds the staging file (`end_mapping_if_gone`, asked
                // once no handle is open, and a round later: the kernel lets go of its
                // own open of the file only as the closing process returns from
                // `close(2)`, which may be after this request).
                debug_assert!(state.dirty, "a writer's open made it dirty");
                state.mapped = true;
                state.writers += 1;
            }
            // A mapped file is looked at each round: snapshotted while a handle stays
            // open (as a file open for writing is), probed once none is.
            (state.writers == 0 && state.dirty) || state.mapped
        };
        if queue {
            if let Some(staging) = self.staging() {
                staging.enqueue(staged.ino);
            }
        }
    }

    pub(crate) fn staged_read(
        &self,
        staged: &StagedFile,
        offset: u64,
        size: usize,
        target: &mut impl ReadTarget,
    ) -> Result<usize> {
        let (file_size, _, _) = staged.stat()?;
        let end = file_size.min(offset.saturating_add(size as u64));
        if offset >= end {
            return Ok(0);
        }
        staged.read_at(target.room((end - offset) as usize), offset)
    }

    pub(crate) fn staged_write(
        &self,
        staged: &StagedFile,
        flags: OpenFlags,
        offset: u64,
        data: &[u8],
    ) -> Result<usize> {
        if !flags.write {
            return Err(kind::BadHandle());
        }
        let offset = if flags.append {
            staged.stat()?.0
        } else {
            offset
        };
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or_else(kind::FileTooBig)?;
        if end > self.file_size_max() {
            return Err(kind::FileTooBig());
        }
        staged.write_at(data, offset)?;
        Ok(data.len())
    }

    pub(crate) fn staged_allocate(
        &self,
        staged: &StagedFile,
        flags: OpenFlags,
        offset: u64,
        len: u64,
        keep_size: bool,
    ) -> Result<()> {
        if !flags.write {
            return Err(kind::BadHandle());
        }
        let end = offset.checked_add(len).ok_or_else(kind::FileTooBig)?;
        if end > self.file_size_max() {
            return Err(kind::FileTooBig());
        }
        let mode = if keep_size {
            libc::FALLOC_FL_KEEP_SIZE
        } else {
            0
        };
        let fd = std::os::fd::AsRawFd::as_raw_fd(staged.file());
        // SAFETY: a valid fd; fallocate has no memory effects.
        let rc = unsafe { libc::fallocate(fd, mode, offset as libc::off_t, len as libc::off_t) };
        if rc != 0 {
            return Err(Error::io(
                staged.name.clone(),
                std::io::Error::last_os_error(),
            ));
        }
        Ok(())
    }

    /// Attribute changes on a staged inode: size and times go to the staging file too.
    pub(crate) fn staged_setattr(
        &self,
        staged: &StagedFile,
        changes: &SetAttr,
        check: Option<&Credentials<'_>>,
    ) -> Result<(Attr, Option<u32>)> {
        let now = self.now();
        if let Some(size) = changes.size {
            if size > self.file_size_max() {
                return Err(kind::FileTooBig());
            }
            self.change_as_writer(staged, || staged.set_len(size))?;
        }
        let ino = staged.ino;
        let rest = SetAttr {
            size: None,
            ..changes.clone()
        };
        // Held from the change of the node to the staging file's times: an ingestion
        // commits under it, so none lands in between with the times it read before.
        let ended = self.files().overlays_ended();
        let state = lock(&staged.state);
        let stored = if !rest.is_empty() || changes.size.is_some() {
            self.db()
                .write(|txn| Workspace::store_changes(txn, ino, &rest, check, now))
        } else {
            self.stored_attr(ino).map(|attr| (attr, None))
        };
        let (attr, perm) = stored?;
        // Once the change is allowed and stored, the staging file's times, which are
        // the file's while it is dirty, become the node's.
        let atime = rest.atime.map(|_| attr.atime);
        let mtime = rest.mtime.map(|_| attr.mtime);
        let times = atime.is_some() || mtime.is_some();
        if times {
            staged.set_times(atime, mtime)?;
        }
        // Clean, the file's times are the node's: nothing to ingest again.
        if times && state.dirty {
            self.changed_again(staged, state);
        } else {
            drop(state);
        }
        Ok((self.overlaid(ended, attr)?, perm))
    }

    /// Replaces the whole content of a staged file (`Fs::write_file`), in its staging
    /// file as any write to it goes; a crash before ingestion keeps what that holds.
    pub(crate) fn staged_replace(&self, staged: &StagedFile, data: &[u8]) -> Result<()> {
        self.change_as_writer(staged, || {
            staged.set_len(0)?;
            staged.write_at(data, 0)
        })
    }

    /// While a staged file is dirty its size and times are the staging file's.
    pub(crate) fn staged_overlay(&self, attr: &mut Attr) -> bool {
        let Some(staged) = self.staged_entry(attr.ino) else {
            return false;
        };
        if !lock(&staged.state).dirty {
            return false;
        }
        match staged.stat() {
            Ok((size, mtime, ctime)) => {
                attr.size = size;
                attr.mtime = mtime;
                attr.ctime = attr.ctime.max(ctime);
                true
            }
            Err(err) => {
                tracing::warn!("failed to stat the staging file of {}: {err}", attr.ino);
                false
            }
        }
    }

    /// `copy_file_range` where either side is staged. `Ok(None)`: the source was
    /// ingested and the buffered path should do the copy (sharing blocks).
    pub(crate) fn staged_copy_range(
        &self,
        (src_handle, offset_in): (&OpenHandle, u64),
        (dst_handle, offset_out): (&OpenHandle, u64),
        len: u64,
    ) -> Result<Option<u64>> {
        let Some(dst) = dst_handle.staged() else {
            // Into the buffer: put the source's bytes in the store, then share blocks.
            if let Some(src) = src_handle.staged() {
                if self.ingest(src)? == IngestOutcome::StillDirty {
                    // A writer is still at work on the source: copy its current bytes.
                    return Ok(None);
                }
            }
            return Ok(None);
        };
        if !dst_handle.flags.write {
            return Err(kind::BadHandle());
        }
        if offset_out
            .checked_add(len)
            .is_none_or(|end| end > self.file_size_max())
        {
            return Err(kind::FileTooBig());
        }
        if let Some(src) = src_handle.staged() {
            return copy_between_files(src, offset_in, dst, offset_out, len).map(Some);
        }
        // From the store into the staging file, through memory in bounded pieces.
        const PIECE: u64 = 1 << 20;
        let mut done = 0;
        while done < len {
            let piece =
                self.read_through(src_handle, offset_in + done, PIECE.min(len - done) as usize)?;
            if piece.is_empty() {
                break;
            }
            dst.write_at(&piece, offset_out + done)?;
            done += piece.len() as u64;
        }
        Ok(Some(done))
    }

    /// Unbinds the staging file of a node being deleted (inside its transaction); the
    /// file is recycled once the deletion is committed.
    pub(crate) fn unstage_deleted(
        &self,
        txn: &crate::db::WriteTxn<'_>,
        ino: InodeNo,
    ) -> Result<()> {
        // With staging off too: an orphan reaped at open may still be bound by a crash
        // of a staging process, and a binding must never outlive its node (`check`).
        staged_rows::unbind(txn, ino)?;
        let Some(staging) = self.staging() else {
            return Ok(());
        };
        if let Some(staged) = lock(&staging.entries).remove(&ino) {
            // A large file's space should be back at once, as `rm` of it promises.
            let large = staged
                .file()
                .metadata()
                .is_ok_and(|meta| meta.len() >= DOOMED_LARGE_BYTES);
            let doomed = {
                let mut doomed = lock(&staging.doomed);
                doomed.push((staged, Doom::Deleted));
                doomed.len()
            };
            // Recycling is the worker's; wake it for a batch, a large file, or when
            // creates are about to find the pool empty, not for every file of an `rm`
            // (each wake costs the requests a context switch and the writer lock).
            // Otherwise the files wait for its next round, a second at most.
            if large || doomed >= DOOMED_BATCH || staging.pool_len() < POOL_LOW {
                staging.wake_now();
            }
        }
        Ok(())
    }

    /// Drops the staging file caching the content of `ino` before replication replaces
    /// that content in place (inside its transaction); `false` if readers hold it open:
    /// the kernel may pass their reads straight to that file, and then opens the inode
    /// with no other file until they close (a cached open fails with EIO). The caller
    /// then gives the path a new node, and the readers keep the old one, as after a
    /// rename over an open file. A staging file holding changes the database lacks is
    /// refused with EBUSY: replacing it would lose them (the caller plans again, and
    /// sees a conflict).
    ///
    /// The inode is held (a hold pushed on `holds`) until the caller lets go, after the
    /// transaction ends: a fill that starts meanwhile sees the hold and gives up, as it
    /// would copy the content being replaced.
    pub(crate) fn unstage_clean(
        &self,
        ino: InodeNo,
        holds: &mut Vec<Arc<OpenInode>>,
    ) -> Result<bool> {
        let Some(staging) = self.staging() else {
            return Ok(true);
        };
        holds.push(self.acquire(ino));
        // A fill that began before the hold may be copying the old content: busy as a
        // dirty file is, and by the next plan the fill is over.
        if staging.is_filling(ino) {
            return Err(Error::Busy(Default::default()));
        }
        let mut entries = lock(&staging.entries);
        if let Some(staged) = entries.get(&ino) {
            // Not waited for: a file's state is held across database writes (an attach
            // recording the file dirty, an ingestion), which wait for this transaction.
            // Held, the file is busy as a dirty one is; the next plan sees it settled.
            let (busy, read) = match staged.state.try_lock() {
                Ok(state) => (state.dirty || state.writers > 0, state.users > 0),
                Err(std::sync::TryLockError::WouldBlock) => (true, true),
                Err(std::sync::TryLockError::Poisoned(state)) => {
                    let state = state.into_inner();
                    (state.dirty || state.writers > 0, state.users > 0)
                }
            };
            if busy {
                return Err(Error::Busy(Default::default()));
            }
            if read {
                return Ok(false);
            }
            // Clean: nothing in the database binds it, so dropping it from memory is
            // all there is (and stays right if the transaction rolls back).
            if let Some(staged) = entries.remove(&ino) {
                lock(&staging.doomed).push((staged, Doom::Replaced));
                staging.wake_now();
            }
        }
        Ok(true)
    }

    /// Files whose staging file holds changes the database does not have yet (open for
    /// writing, or written and not ingested).
    pub(crate) fn dirty_staged(&self) -> std::collections::HashSet<InodeNo> {
        let Some(staging) = self.staging() else {
            return Default::default();
        };
        staging
            .snapshot()
            .into_iter()
            .filter(|staged| {
                let state = lock(&staged.state);
                state.dirty || state.writers > 0
            })
            .map(|staged| staged.inode())
            .collect()
    }

    /// How many files were written, closed and wait for ingestion: changes on their way
    /// into the database that the revision does not show yet. Cheap (no SQL), for a sync
    /// loop that polls for local changes.
    pub fn staged_waiting(&self) -> usize {
        let Some(staging) = self.staging() else {
            return 0;
        };
        staging
            .snapshot()
            .into_iter()
            .filter(|staged| {
                let state = lock(&staged.state);
                state.dirty && state.writers == 0
            })
            .count()
    }

    /// For a file released while a process may still write through a mapping of it
    /// (`StagedState::mapped`): once nothing but this process holds the staging file
    /// open, the mapping's writes are over, and it no longer counts as a writer (the
    /// file is then ingested as any released file is, with every write the mapping
    /// made). `true`: the file is still mapped, and must be looked at again. Where the
    /// kernel cannot tell (no leases), the mapping is taken to be gone, with a warning:
    /// its later writes would be lost rather than the file never settling.
    pub(crate) fn end_mapping_if_gone(&self, staged: &StagedFile) -> bool {
        // Held through the probe: no open attaches meanwhile, so the kernel opens the
        // staging file for no passthrough handle while the probe holds a lease on it
        // (the open would break the lease, and wait for it).
        let mut state = lock(&staged.state);
        // An open handle's release looks again.
        if !state.mapped || state.users > 0 {
            return false;
        }
        let elsewhere = staged.open_elsewhere().unwrap_or_else(|| {
            tracing::warn!(
                ino = staged.ino.0,
                "cannot tell whether a process still maps a released file (no file leases): \
                 writes through its mapping from now on are not stored"
            );
            false
        });
        if elsewhere {
            return true;
        }
        state.mapped = false;
        state.map_writable = false;
        state.writers -= 1;
        // Its last writes came through the mapping, unseen: an ingestion under way
        // read it before them.
        state.version += 1;
        false
    }

    /// Ingests every dirty staged file that has no writer left (a mapping that is gone
    /// included: `end_mapping_if_gone`).
    pub(crate) fn settle_staged(&self) -> Result<()> {
        for staged in self.idle_dirty_staged() {
            self.ingest(&staged)?;
        }
        Ok(())
    }

    /// [`Workspace::settle_staged`], leaving staged (and dirty) the files the disk has no
    /// room to ingest, for a pull that must land even then (`Admission::FromUpstream`).
    pub(crate) fn settle_staged_where_room(&self) -> Result<()> {
        for staged in self.idle_dirty_staged() {
            match self.ingest(&staged) {
                Err(Error::NoSpace { .. }) => {
                    debug_assert!(lock(&staged.state).dirty, "a failed ingestion is retried");
                    tracing::debug!(
                        ino = staged.ino.0,
                        "no room to ingest; the file stays staged"
                    );
                }
                other => {
                    other?;
                }
            }
        }
        Ok(())
    }

    fn idle_dirty_staged(&self) -> Vec<Arc<StagedFile>> {
        let Some(staging) = self.staging() else {
            return Vec::new();
        };
        staging
            .snapshot()
            .into_iter()
            .filter(|staged| !self.end_mapping_if_gone(staged))
            .filter(|staged| {
                let state = lock(&staged.state);
                state.dirty && state.writers == 0
            })
            .collect()
    }

    /// Ingests the dirty staged files in the tree at `top` as they are now, those open
    /// for writing too (which stay dirty): a copy shares the store's blocks. Walks the
    /// tree only if some staged file is dirty, which `settle_staged` leaves rare.
    pub(crate) fn ingest_staged_under(&self, top: InodeNo) -> Result<()> {
        let Some(staging) = self.staging() else {
            return Ok(());
        };
        let dirty: Vec<Arc<StagedFile>> = staging
            .snapshot()
            .into_iter()
            .filter(|staged| lock(&staged.state).dirty)
            .collect();
        if dirty.is_empty() {
            return Ok(());
        }
        let inside = self.db().read(|conn| nodes_under(conn, top))?;
        for staged in dirty.iter().filter(|s| inside.contains(&s.ino)) {
            self.ingest(staged)?;
        }
        Ok(())
    }

    /// After a crash: ingests every file the `staged` table still binds, then puts the
    /// other files of the staging directory back in the pool.
    pub(crate) fn recover_staging(&self) -> Result<()> {
        let bound = self.db().read(staged_rows::all)?;
        let temporary;
        let staging = match self.staging() {
            Some(staging) => staging,
            None if bound.is_empty() => return Ok(()),
            None => {
                let Some(db_path) = self.db().path() else {
                    return Ok(());
                };
                let mut dir = db_path.as_os_str().to_owned();
                dir.push(".staging");
                temporary = Staging::open(std::path::Path::new(&dir), 0, 0)?.0;
                &temporary
            }
        };
        // A set: with the pool's spares the directory can hold thousands of names, and
        // every bound file is looked up in it.
        let mut existing: std::collections::HashSet<String> =
            Staging::open(staging.dir(), 0, 0)?.1.into_iter().collect();
        for (ino, file) in &bound {
            if !existing.contains(file) {
                tracing::warn!(
                    "{ino}: its staging file {file} is gone; keeping the stored content"
                );
                self.db().write(|txn| {
                    txn.skip_quota();
                    staged_rows::unbind(txn, *ino)
                })?;
                continue;
            }
            let staged = staging.bind_existing(*ino, file, true)?;
            // The inode's staging file, as ingestion expects to find it (a large file is
            // ingested in several transactions, and dropped if its entry goes away).
            lock(&staging.entries).insert(*ino, staged.clone());
            match self.ingest(&staged)? {
                // Kept as a clean cached file, not put back in the pool.
                IngestOutcome::Clean => {
                    existing.remove(file);
                }
                IngestOutcome::Gone => {
                    lock(&staging.entries).remove(ino);
                }
                IngestOutcome::StillDirty | IngestOutcome::Torn => {
                    return Err(Error::corrupt(format!(
                        "{ino}: recovery of {file} did not complete"
                    )));
                }
            }
            tracing::info!("{ino}: recovered staged content from {file}");
        }
        if self.staging().is_some() {
            for name in existing {
                staging.adopt_leftover(name);
            }
        }
        Ok(())
    }

    /// Starts the thread that ingests released files, recycles deleted ones, evicts the
    /// cache and refills the pool.
    pub(crate) fn start_staging_worker(&self) -> Result<()> {
        let Some(staging) = self.staging() else {
            return Ok(());
        };
        // A first pool before the mount is used, so early creates find files ready.
        staging.refill(POOL_LOW)?;
        let queue = staging.queue.clone();
        let worker = staging.worker.clone();
        let weak = self.downgrade();
        let thread = std::thread::Builder::new()
            .name("vfs-ingest".into())
            .spawn(move || {
                // Normal priority: this thread holds the writer connection while it
                // stores a batch; at a lower one, requests waiting for the writer would
                // wait for it to be scheduled too.
                loop {
                    let pending = {
                        let (shared, wake) = &*queue;
                        let mut state = lock(shared);
                        let wait = match state.first_queued {
                            None => Duration::from_millis(500),
                            Some(at) => INGEST_DELAY.saturating_sub(at.elapsed()),
                        };
                        if !wait.is_zero() && !state.stop && !state.urgent {
                            state = wake
                                .wait_timeout(state, wait)
                                .unwrap_or_else(|e| e.into_inner())
                                .0;
                        }
                        if state.stop {
                            return;
                        }
                        state.urgent = false;
                        let settled = state
                            .first_queued
                            .is_some_and(|at| at.elapsed() >= INGEST_DELAY);
                        if settled {
                            state.first_queued = None;
                            std::mem::take(&mut state.pending)
                        } else {
                            Vec::new()
                        }
                    };
                    let stopped = || lock(&queue.0).stop;
                    let work = |ws: Workspace| ws.staging_work(pending);
                    if !worker.round(stopped, || weak.upgrade(), work) {
                        return;
                    }
                }
            })
            .map_err(|e| Error::io("ingest thread", e))?;
        staging.worker.started(thread);
        Ok(())
    }

    /// Ingests a file that was synced and is still open for writing, if nothing has
    /// changed it for `INGEST_DELAY`; otherwise (or if a write comes while it is read)
    /// it waits in the queue for the next round. Its last release queues it anyway.
    fn ingest_while_open(&self, staging: &Staging, staged: &Arc<StagedFile>) {
        if !staged.quiet_for().is_ok_and(|quiet| quiet >= INGEST_DELAY) {
            return staging.enqueue(staged.ino);
        }
        match self.ingest(staged) {
            Ok(IngestOutcome::Torn) => staging.enqueue(staged.ino),
            Ok(_) => {}
            Err(err) => tracing::warn!(
                "failed to ingest {} (kept staged, retried later): {err}",
                staged.ino
            ),
        }
    }

    /// Recycles the staging files of deleted nodes and of content replication replaced
    /// (which empties them: their space goes back to the disk).
    fn recycle_doomed(&self, staging: &Staging) {
        let doomed = {
            let mut doomed = lock(&staging.doomed);
            staging.recycling.fetch_add(doomed.len(), Ordering::SeqCst);
            std::mem::take(&mut *doomed)
        };
        if doomed.is_empty() {
            return;
        }
        // After this, a deletion still running has finished (it holds the writer) and
        // is committed: the node's absence below is what a crash would leave.
        let durable = self.unbindings_durable();
        for (staged, doom) in doomed {
            let exists = match doom {
                _ if !durable => Err(()),
                Doom::Replaced => Ok(false),
                Doom::Deleted => (self.db())
                    .read(|conn| Ok(store::load_attr(conn, staged.ino)?.is_some()))
                    .map_err(drop),
            };
            match exists {
                Ok(false) => recycle(staging, staged),
                // The deletion was rolled back: the node keeps its staging file.
                Ok(true) => {
                    lock(&staging.entries).entry(staged.ino).or_insert(staged);
                }
                Err(()) => lock(&staging.doomed).push((staged, doom)),
            }
            staging.recycling.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Makes durable every transaction that let go of a staging file (an ingestion that
    /// unbound it, a deletion) before any such file is emptied and handed to another
    /// node: those transactions sit in the open batch for a while, and a crash before
    /// they are durable brings back a `staged` row bound to the file, whose content
    /// the next open would then take for the node's. False (logged) if the store
    /// cannot commit; the files wait for the next round.
    fn unbindings_durable(&self) -> bool {
        match self.db().sync() {
            Ok(()) => true,
            Err(err) => {
                tracing::warn!("staging files wait to be recycled: {err}");
                false
            }
        }
    }

    /// What the writer calls when the disk runs short of room (see `disk_room.rs`):
    /// wakes the worker to give back the space of files deleted since its last round,
    /// and says whether there are any (or deleted files still open), so that `rm big; echo > small` on a full disk
    /// waits for that space instead of failing.
    pub(crate) fn room_maker(&self) -> Option<Box<dyn Fn() -> bool + Send + Sync>> {
        self.staging()?;
        let weak = self.downgrade();
        Some(Box::new(move || {
            let Some(ws) = weak.upgrade() else {
                return false;
            };
            let Some(staging) = ws.staging() else {
                return false;
            };
            // Files deleted while open are freed at their last release, which the
            // kernel sends a moment after the `close(2)` (`rm` may come in between).
            let releasing = ws.open_orphans();
            let doomed = !lock(&staging.doomed).is_empty();
            if doomed {
                staging.wake_now();
            }
            // Emptying a large file takes a while (10 ms for 100 MiB on tmpfs).
            let recycling = staging.recycling.load(Ordering::SeqCst) > 0;
            doomed || recycling || releasing
        }))
    }

    fn staging_work(&self, mut pending: Vec<InodeNo>) {
        let Some(staging) = self.staging() else {
            return;
        };
        // Space first: an ingestion on a full disk waits for the space of deleted files
        // (`Db::wait_for_room`), which only this thread gives back.
        self.recycle_doomed(staging);
        pending.sort_unstable();
        pending.dedup();
        let mut small = Vec::new();
        for ino in pending {
            // Deleted meanwhile (a temporary file): nothing to ingest.
            let Some(staged) = staging.get(ino) else {
                continue;
            };
            if self.end_mapping_if_gone(&staged) {
                // Looked at again next round; meanwhile snapshotted as an open file is.
                staging.enqueue(ino);
            }
            if lock(&staged.state).writers > 0 {
                self.ingest_while_open(staging, &staged);
                continue;
            }
            let size = staged.stat().map(|(size, _, _)| size).unwrap_or(u64::MAX);
            if size <= SMALL_FILE_BYTES {
                small.push(staged);
                continue;
            }
            if let Err(err) = self.ingest(&staged) {
                tracing::warn!("failed to ingest {ino} (kept staged, retried later): {err}");
            }
        }
        for batch in small.chunks(SMALL_FILES_PER_BATCH) {
            if let Err(err) = self.ingest_small(batch) {
                tracing::warn!(
                    "failed to ingest {} small files (kept staged): {err}",
                    batch.len()
                );
            }
        }
        // Let go of them before recycling: a file deleted since it was ingested here is
        // recycled only if nothing else holds it, and a file that cannot be recycled
        // is deleted, which leaves the pool to create another (costly on a busy ext4).
        drop(small);
        self.recycle_doomed(staging);
        self.evict(staging);
        // Deletions and evictions refill the pool; top it up only when they did not.
        if staging.pool_len() < staging.pool_target() {
            if let Err(err) = staging.refill(staging.pool_target()) {
                tracing::warn!("failed to refill the staging pool: {err}");
            }
        }
    }

    /// Recycles the clean staging files past the cache's bound, once the ingestions
    /// that unbound them are durable.
    fn evict(&self, staging: &Staging) {
        let mut evicted = Vec::new();
        for staged in staging.eviction_candidates() {
            let mut entries = lock(&staging.entries);
            // Still this node's file? A deletion since the snapshot moved it to the
            // doomed list, which recycles it after the deletion commits: recycling it
            // here as well would find it shared and delete its name under the doomed
            // list's copy, which would then put a nameless file in the pool.
            let current = entries
                .get(&staged.ino)
                .is_some_and(|entry| Arc::ptr_eq(entry, &staged));
            let state = lock(&staged.state);
            if current && state.users == 0 && !state.dirty && !state.ingesting {
                entries.remove(&staged.ino);
                drop(state);
                evicted.push(staged);
            }
        }
        if evicted.is_empty() {
            return;
        }
        if self.unbindings_durable() {
            evicted
                .into_iter()
                .for_each(|staged| recycle(staging, staged));
            return;
        }
        // Clean and unused: the node's again as it was (unless staged anew meanwhile,
        // when this file is left for the next open's sweep of leftovers).
        let mut entries = lock(&staging.entries);
        for staged in evicted {
            entries.entry(staged.ino).or_insert(staged);
        }
    }
}

/// What an open for the kernel may do, from what the caller asked: read whatever the
/// access mode (the kernel fills its page cache through any handle), and whether a
/// staging file handed over for passthrough may be mapped into the caller (any open
/// but a write-only one can map, `execve` included).
fn for_kernel(flags: OpenFlags, passthrough: bool) -> (OpenFlags, bool) {
    (
        OpenFlags {
            read: true,
            ..flags
        },
        passthrough && flags.read,
    )
}

/// The nodes of the tree at `top`, `top` included.
fn nodes_under(
    conn: &rusqlite::Connection,
    top: InodeNo,
) -> Result<std::collections::HashSet<InodeNo>> {
    let mut nodes = std::collections::HashSet::from([top]);
    let mut dirs = Vec::new();
    if store::attr(conn, top)?.is_dir() {
        dirs.push(top);
    }
    while let Some(dir) = dirs.pop() {
        for entry in store::list(conn, dir, 0, usize::MAX)? {
            if nodes.insert(entry.ino) && entry.kind == FileKind::Directory {
                dirs.push(entry.ino);
            }
        }
    }
    Ok(nodes)
}

fn recycle(staging: &Staging, staged: Arc<StagedFile>) {
    staging.recycle_staged(staged);
}

/// Copies between two staging files in the kernel (`copy_file_range(2)`).
fn copy_between_files(
    src: &StagedFile,
    offset_in: u64,
    dst: &StagedFile,
    offset_out: u64,
    len: u64,
) -> Result<u64> {
    use std::os::fd::AsRawFd;
    let (size, _, _) = src.stat()?;
    let len = len.min(size.saturating_sub(offset_in));
    let mut off_in = offset_in as libc::loff_t;
    let mut off_out = offset_out as libc::loff_t;
    let mut done = 0u64;
    while done < len {
        let want = (len - done).min(1 << 30) as usize;
        // SAFETY: valid fds and offset pointers.
        let n = unsafe {
            libc::copy_file_range(
                src.file().as_raw_fd(),
                &mut off_in,
                dst.file().as_raw_fd(),
                &mut off_out,
                want,
                0,
            )
        };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(Error::io(dst.name.clone(), err));
        }
        if n == 0 {
            break;
        }
        done += n as u64;
    }
    Ok(done)
}
