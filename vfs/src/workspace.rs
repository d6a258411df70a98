//! The workspace and its inode API: what the FUSE daemon calls.
//!
//! Operations name nodes by [`InodeNo`] and entries by `(parent, name)`, as the kernel
//! does. Every mutation is one transaction and one revision.
//!
//! Writes through a [`FileHandle`] are buffered per inode ([`OpenInode`]): small writes
//! cost a memcpy, not a transaction. Buffered bytes are committed (chunked, hashed,
//! compressed, stored) when a file's buffer passes `dirty_file_bytes_max`, when all
//! buffers together pass `dirty_total_bytes_max`, and at `flush`, `fsync` and `release`.
//! All handles of one inode share its buffer, so every reader through this workspace sees
//! every write at once; other processes see it once committed. `fsync` also makes the
//! committed state durable (the WAL is synced), as POSIX promises.
//!
//! Lock order: an inode's state, then the writer connection, then the table of open
//! inodes. Nothing takes them the other way round.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use crate::access::{self, Access, Credentials, Who};
use crate::base::lock;
use crate::chunker::{ChunkSizes, Chunker};
use crate::clock::{Clock, SystemClock};
use crate::compact::{CompactProgress, CompactReport};
use crate::content::{self, BlockCache, ContentCtx};
use crate::db::{self, Db, DbInfo, DbOptions, WriteTxn};
use crate::error::{kind, Error, Result};
use crate::gate::{Backlog, WriteGate};
use crate::log::LogCache;
use crate::open_files::{Body, OpenFiles, OpenHandle, OpenInode, OpenState};
use crate::open_files::{FileHandle, OpenFlags};
use crate::staging::Staging;
use crate::store::{self, LINK_MAX, SYMLINK_MAX};
use crate::types::*;

/// Largest file the store accepts by default: 16 TiB.
pub const FILE_SIZE_MAX_DEFAULT: u64 = 1 << 44;
/// Longest extended attribute name and value.
pub const XATTR_NAME_MAX: usize = 255;
pub const XATTR_VALUE_MAX: usize = 65536;

/// How to open a workspace.
#[derive(Clone)]
pub struct Options {
    /// Make a workspace: create the database if it does not exist, and lay the schema
    /// in an empty one. Without it, only an existing workspace opens.
    pub create: bool,
    /// Refuse every mutation with EROFS.
    pub read_only: bool,
    /// The caller guarantees that no other process writes the database while this one
    /// has it open (it holds the database's owner lock). A read-only open then reads a
    /// database whose write-ahead log is empty as a file nobody changes, and creates
    /// nothing beside it; without it that happens only where nothing can be created.
    /// A batching writer (`commit_delay`) then keeps its read transaction open between
    /// reads instead of beginning one for each.
    pub no_other_writer: bool,
    /// Chunk sizes of a new workspace (an existing one keeps its own).
    pub chunk_sizes: ChunkSizes,
    /// zstd level for new blocks.
    pub zstd_level: i32,
    /// Memory for decoded blocks.
    pub block_cache_bytes: usize,
    /// Buffered writes of one file past which they are committed.
    pub dirty_file_bytes_max: usize,
    /// Buffered writes of all files past which a writer commits its own.
    pub dirty_total_bytes_max: usize,
    /// Reader connections kept open.
    pub reader_pool_max: usize,
    /// Largest file size; past it, EFBIG.
    pub file_size_max: u64,
    /// Commit mutations in batches at most this long after the first, instead of one
    /// transaction each. A crash may then lose the last `commit_delay` of mutations that
    /// were not fsynced (as a crash of a kernel filesystem loses its unsynced journal);
    /// `fsync`, `sync` and closing the workspace commit at once. `None` (the default):
    /// every mutation is durable against a process crash when it returns.
    pub commit_delay: Option<std::time::Duration>,
    /// Where staging files live (see `staging.rs`); `None` turns staging off. Files
    /// staged before a crash are recovered from `<db>.staging` even when `None`.
    pub staging_dir: Option<std::path::PathBuf>,
    /// Clean staged files kept as a cache, in bytes and in files.
    pub staging_cache_bytes: u64,
    pub staging_cache_files: usize,
    /// Files larger than this are not staged when opened for writing (materialising
    /// them would cost too much); they are written through the buffer instead.
    pub stage_size_max: u64,
    /// Bytes to keep free on the disk holding the database: a mutation that stores more
    /// fails with ENOSPC first, so the open batch can always commit and deletions still
    /// run (see `disk_room.rs`). 0 turns the reserve off.
    pub disk_reserve_bytes: u64,
    /// This process holds the database alone for a bulk load (`computerd fs import`,
    /// under its owner lock): commits go through a rollback journal instead of the
    /// write-ahead log, so each page the load adds is written once, not twice. Reads
    /// run on the writer's connection and nothing checkpoints. Closing the workspace
    /// puts the database back in WAL mode; after a crash, the next writer does, and
    /// rolls back the batch the crash cut (a read-only open rolls it back first too).
    /// If another connection has the database open, the load stays in WAL mode.
    pub bulk_load: bool,
    pub clock: Arc<dyn Clock>,
}

/// The default of [`Options::disk_reserve_bytes`]: several full batches (4 MiB of block
/// data each) and a checkpoint's growth of the database file.
pub const DISK_RESERVE_BYTES_DEFAULT: u64 = 64 << 20;

impl Default for Options {
    fn default() -> Options {
        Options {
            create: true,
            read_only: false,
            no_other_writer: false,
            chunk_sizes: ChunkSizes::DEFAULT,
            zstd_level: 1,
            block_cache_bytes: 64 << 20,
            dirty_file_bytes_max: 8 << 20,
            dirty_total_bytes_max: 128 << 20,
            reader_pool_max: 8,
            file_size_max: FILE_SIZE_MAX_DEFAULT,
            commit_delay: None,
            staging_dir: None,
            staging_cache_bytes: 1 << 30,
            staging_cache_files: 4096,
            stage_size_max: 4 << 30,
            disk_reserve_bytes: DISK_RESERVE_BYTES_DEFAULT,
            bulk_load: false,
            clock: Arc::new(SystemClock),
        }
    }
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("create", &self.create)
            .field("read_only", &self.read_only)
            .field("chunk_sizes", &self.chunk_sizes)
            .field("zstd_level", &self.zstd_level)
            .finish_non_exhaustive()
    }
}

struct Inner {
    db: Db,
    info: DbInfo,
    chunker: Chunker,
    cache: BlockCache,
    options: Options,
    /// Open inodes, their write buffers and handles.
    files: OpenFiles,
    staging: Option<Staging>,
    /// Whether any extended attribute may exist. The kernel asks for
    /// `security.capability` before the first write to every file; while no attribute
    /// was ever set, that is answered without touching the database.
    xattrs_maybe: std::sync::atomic::AtomicBool,
    /// Writers pass it before adding to the tree (see `gate.rs`).
    gate: WriteGate,
    /// The last large revision of the change log read, for the next page (`log.rs`).
    log_cache: LogCache,
}

/// A workspace that does not keep it open: what its own background threads hold.
pub(crate) struct WeakWorkspace(Weak<Inner>);

impl WeakWorkspace {
    /// The workspace, if something else still holds it open.
    pub(crate) fn upgrade(&self) -> Option<Workspace> {
        self.0.upgrade().map(|inner| Workspace { inner })
    }
}

impl Workspace {
    pub(crate) fn downgrade(&self) -> WeakWorkspace {
        WeakWorkspace(Arc::downgrade(&self.inner))
    }

    /// The staging part: files the kernel writes directly (`staging.rs`), if on.
    pub(crate) fn staging(&self) -> Option<&Staging> {
        self.inner.staging.as_ref()
    }

    /// The last large revision of the change log read (`log.rs`).
    pub(crate) fn log_cache(&self) -> &LogCache {
        &self.inner.log_cache
    }

    pub(crate) fn options(&self) -> &Options {
        &self.inner.options
    }

    pub(crate) fn chunker(&self) -> &Chunker {
        &self.inner.chunker
    }

    pub(crate) fn zstd_level(&self) -> i32 {
        self.inner.options.zstd_level
    }

    pub(crate) fn block_cache(&self) -> &BlockCache {
        &self.inner.cache
    }

    /// The open inodes and handles.
    pub(crate) fn files(&self) -> &OpenFiles {
        &self.inner.files
    }

    /// Forgets `bytes` of buffered writes that were committed or dropped.
    pub(crate) fn dirty_released(&self, bytes: usize) {
        self.inner.files.dirty_released(bytes);
    }

    pub(crate) fn file_size_max(&self) -> u64 {
        self.inner.options.file_size_max
    }

    /// Inodes with open handles right now.
    pub(crate) fn open_inodes(&self) -> Vec<InodeNo> {
        self.inner.files.inodes()
    }

    /// Commits the buffered writes of every open inode.
    pub(crate) fn commit_all(&self) -> Result<()> {
        for inode in self.inner.files.all() {
            let mut state = lock(&inode.state);
            if state.loaded {
                self.commit_locked(inode.ino, &mut state, false)?;
            }
        }
        Ok(())
    }
}

/// A workspace: one SQLite database holding a tree of files. Cheap to clone; clones
/// share everything.
#[derive(Clone)]
pub struct Workspace {
    inner: Arc<Inner>,
}

impl Drop for Workspace {
    /// The caller's last handle waits for a round of the staging worker that holds the
    /// workspace, so that nothing of it is at work once the handle is gone.
    fn drop(&mut self) {
        if let Some(staging) = &self.inner.staging {
            let handles = || Arc::strong_count(&self.inner);
            staging.worker.handle_goes(handles, || staging.stop());
        }
    }
}

impl Workspace {
    /// Opens (and with `options.create`, creates) the workspace database at `path`.
    pub fn open(path: impl AsRef<Path>, options: Options) -> Result<Workspace> {
        let path = path.as_ref();
        let db_options = DbOptions {
            commit_delay: options.commit_delay,
            create: options.create,
            read_only: options.read_only,
            chunk_sizes: options.chunk_sizes,
            reader_pool_max: options.reader_pool_max,
            disk_reserve_bytes: options.disk_reserve_bytes,
            no_other_writer: options.no_other_writer,
            bulk_load: options.bulk_load,
        };
        let (db, info) =
            Db::open(path, &db_options).map_err(|e| e.at(&path.display().to_string()))?;
        Workspace::from_db(db, info, options)
    }

    /// A workspace that lives in memory only (tests, scratch work).
    pub fn open_in_memory(options: Options) -> Result<Workspace> {
        let db_options = DbOptions {
            commit_delay: None,
            create: true,
            read_only: false,
            chunk_sizes: options.chunk_sizes,
            reader_pool_max: 1,
            disk_reserve_bytes: 0,
            no_other_writer: false,
            bulk_load: false,
        };
        let (db, info) = Db::open_in_memory(&db_options)?;
        Workspace::from_db(db, info, options)
    }

    fn from_db(db: Db, info: DbInfo, options: Options) -> Result<Workspace> {
        let chunker = Chunker::new(info.chunk_sizes);
        let staging = match (&options.staging_dir, db.is_read_only()) {
            (Some(dir), false) => {
                let (staging, _) = crate::staging::Staging::open(
                    dir,
                    options.staging_cache_bytes,
                    options.staging_cache_files,
                )?;
                Some(staging)
            }
            _ => None,
        };
        let workspace = Workspace {
            inner: Arc::new(Inner {
                cache: BlockCache::new(options.block_cache_bytes),
                db,
                info,
                chunker,
                options,
                files: OpenFiles::default(),
                staging,
                xattrs_maybe: std::sync::atomic::AtomicBool::new(true),
                gate: Default::default(),
                log_cache: Default::default(),
            }),
        };
        let any_xattr = workspace.inner.db.read(store::any_xattr)?;
        workspace
            .inner
            .xattrs_maybe
            .store(any_xattr, Ordering::SeqCst);
        if !workspace.inner.db.is_read_only() {
            workspace.reap_orphans()?;
            // Blocks received ahead of their entries by a transfer that did not finish:
            // no transfer is in flight before the workspace is open.
            workspace.sweep_loose_blocks(std::time::Duration::ZERO)?;
            workspace.recover_staging()?;
            workspace.start_staging_worker()?;
            if let Some(maker) = workspace.room_maker() {
                workspace.inner.db.set_room_maker(maker);
            }
        }
        Ok(workspace)
    }

    /// Why the workspace stopped taking changes, if it did: a storage failure undid
    /// changes already answered ([`Error::Halted`]). Reopening starts from the last
    /// commit.
    pub fn halted(&self) -> Option<String> {
        self.inner.db.halted()
    }

    /// A random id chosen when the workspace was created.
    pub fn id(&self) -> &str {
        &self.inner.info.workspace_id
    }

    pub fn chunk_sizes(&self) -> ChunkSizes {
        self.inner.info.chunk_sizes
    }

    pub fn is_read_only(&self) -> bool {
        self.inner.db.is_read_only()
    }

    pub(crate) fn now(&self) -> TimestampNs {
        self.inner.options.clock.now()
    }

    pub(crate) fn db(&self) -> &Db {
        &self.inner.db
    }

    pub(crate) fn ctx(&self) -> ContentCtx<'_> {
        ContentCtx {
            cache: &self.inner.cache,
            chunker: &self.inner.chunker,
            zstd_level: self.inner.options.zstd_level,
        }
    }

    /// Deletes nodes left without links by a crash while they were open.
    fn reap_orphans(&self) -> Result<()> {
        let orphans = self.inner.db.read(store::orphans)?;
        for ino in orphans {
            self.inner.db.write(|txn| {
                txn.skip_quota();
                self.delete_node(txn, ino)
            })?;
        }
        Ok(())
    }

    /// The gate writers pass before adding to the tree.
    pub fn write_gate(&self) -> &WriteGate {
        &self.inner.gate
    }

    /// Nodes changed after revision `after`, and their content's size (`gate.rs`).
    pub fn backlog(&self, after: Revision) -> Result<Backlog> {
        let (nodes, bytes) = self
            .inner
            .db
            .read(|conn| store::changed_since(conn, after))?;
        Ok(Backlog { nodes, bytes })
    }

    /// The current revision: the last committed mutation.
    pub fn revision(&self) -> Result<Revision> {
        self.inner
            .db
            .read_counted(|conn| db::read_counters(conn).map(|c| c.0))
    }

    // ---------------------------------------------------------------- reading the tree

    /// Attributes of the entry `name` in directory `parent`.
    ///
    /// A caller needs search permission on `parent`.
    pub fn lookup(&self, who: Who<'_>, parent: InodeNo, name: &[u8]) -> Result<Attr> {
        let cred = who.cred();
        let ended = self.inner.files.overlays_ended();
        let found = self.inner.db.read(|conn| {
            // The directory and the entry in one statement: a lookup is the commonest
            // request, and the directory's attributes are needed for the permission
            // check and to tell a missing name from a missing or non-directory parent.
            let (dir, entry) = store::lookup_in(conn, parent, name)?;
            let dir = dir.ok_or_else(kind::NotFound)?;
            if !dir.is_dir() {
                return Err(kind::NotDir());
            }
            if let Some(cred) = cred {
                access::search(&dir, cred)?;
            }
            match entry {
                Some(attr) => Ok(attr),
                None if name.len() > store::NAME_MAX => Err(kind::NameTooLong()),
                None => Err(kind::NotFound()),
            }
        })?;
        self.overlaid(ended, found)
    }

    /// `access(2)`: whether `cred` may access `ino` as `want` says (nothing: whether it
    /// exists). EROFS for writing a read-only workspace.
    pub fn access(&self, cred: &Credentials<'_>, ino: InodeNo, want: Access) -> Result<()> {
        let attr = self.stored_attr(ino)?;
        if want.write && self.is_read_only() {
            return Err(kind::ReadOnly());
        }
        access::check(&attr, cred, want)
    }

    /// Opening directory `ino` to list it: it must be one (ENOTDIR), readable by a
    /// caller.
    pub fn opendir(&self, who: Who<'_>, ino: InodeNo) -> Result<Attr> {
        self.inner.db.read(|conn| listable(conn, who, ino))
    }

    /// The stored attributes, which are all a permission check needs (the overlay of
    /// buffered or staged writes changes only sizes and times).
    pub(crate) fn stored_attr(&self, ino: InodeNo) -> Result<Attr> {
        self.inner.db.read(|conn| store::attr(conn, ino))
    }

    /// Attributes of node `ino`, including writes still buffered.
    pub fn getattr(&self, ino: InodeNo) -> Result<Attr> {
        let ended = self.inner.files.overlays_ended();
        let attr = self.inner.db.read(|conn| store::attr(conn, ino))?;
        self.overlaid(ended, attr)
    }

    /// [`Workspace::overlay`] for attributes read from the database after the count of
    /// ended overlays was `ended_before`. An overlay can end between that read and the
    /// laying (the file ingested or its buffer committed, then let go), which would
    /// leave the older stored attributes bare: the kernel would take a written file's
    /// size as it was before the write. So if any ended meanwhile, a file that got no
    /// overlay is read again; its new stored attributes include what the overlay held.
    pub(crate) fn overlaid(&self, ended_before: u64, attr: Attr) -> Result<Attr> {
        let (attr, laid) = self.overlay_laid(attr);
        if laid || attr.kind != FileKind::File || self.inner.files.overlays_ended() == ended_before
        {
            return Ok(attr);
        }
        match self.inner.db.read(|conn| store::attr(conn, attr.ino)) {
            Ok(again) => Ok(self.overlay(again)),
            // Removed since: the first answer stands, as for a request a moment earlier.
            Err(Error::NotFound(_)) => Ok(attr),
            Err(err) => Err(err),
        }
    }

    /// Reflects buffered writes (size, mtime) in attributes read from the database.
    pub(crate) fn overlay(&self, attr: Attr) -> Attr {
        self.overlay_laid(attr).0
    }

    /// [`Workspace::overlay`], and whether an overlay applied.
    fn overlay_laid(&self, mut attr: Attr) -> (Attr, bool) {
        if attr.kind != FileKind::File {
            return (attr, false);
        }
        if self.staged_overlay(&mut attr) {
            return (attr, true);
        }
        if let Some(open) = self.inner.files.get(attr.ino) {
            let state = lock(&open.state);
            if state.loaded {
                attr.size = state.size;
                if let Some(at) = state.written_at {
                    attr.mtime = at;
                    attr.ctime = attr.ctime.max(at);
                }
                return (attr, true);
            }
        }
        (attr, false)
    }

    /// The whole committed content of file `ino` (`size` bytes), read in the caller's
    /// transaction; `None` if a handle of this workspace has the file open or its newest
    /// bytes wait in a staging file (then they are not all in the store yet).
    pub(crate) fn read_quiet_file(
        &self,
        conn: &rusqlite::Connection,
        ino: InodeNo,
        size: u64,
    ) -> Result<Option<Vec<u8>>> {
        if self.inner.files.get(ino).is_some() || self.staged_entry(ino).is_some() {
            return Ok(None);
        }
        let mut buf = vec![0u8; usize::try_from(size).map_err(|_| kind::FileTooBig())?];
        content::read_into(conn, &self.inner.cache, ino, 0, &mut buf)?;
        Ok(Some(buf))
    }

    /// Up to `limit` entries of directory `dir` after cookie `after` (0 starts), if
    /// `who` may list it ([`Workspace::opendir`]). The check and the listing are one
    /// read of the database: the kernel asks again for every page of a listing, and
    /// once more past its end.
    pub fn readdir(
        &self,
        who: Who<'_>,
        dir: InodeNo,
        after: u64,
        limit: usize,
    ) -> Result<Vec<DirEntry>> {
        self.inner.db.read(|conn| {
            listable(conn, who, dir)?;
            store::list(conn, dir, after, limit)
        })
    }

    /// Like [`Workspace::readdir`], with each entry's attributes, and the directory's.
    pub fn readdir_plus(
        &self,
        who: Who<'_>,
        dir: InodeNo,
        after: u64,
        limit: usize,
    ) -> Result<(Attr, Vec<(DirEntry, Attr)>)> {
        let ended = self.inner.files.overlays_ended();
        let (dir_attr, entries) = self.inner.db.read(|conn| {
            let dir_attr = listable(conn, who, dir)?;
            Ok((dir_attr, store::list_plus(conn, dir, after, limit)?))
        })?;
        let entries = entries
            .into_iter()
            .map(|(e, a)| Ok((e, self.overlaid(ended, a)?)))
            .collect::<Result<_>>()?;
        Ok((dir_attr, entries))
    }

    /// The target of symlink `ino`.
    pub fn readlink(&self, ino: InodeNo) -> Result<Vec<u8>> {
        self.inner.db.read(|conn| store::symlink_target(conn, ino))
    }

    // ------------------------------------------------------------- changing the tree

    /// Checks that `parent` is a live directory that can take a new entry `name`.
    pub(crate) fn check_new_entry(txn: &WriteTxn<'_>, parent: InodeNo, name: &[u8]) -> Result<()> {
        Self::check_new_entry_as(txn, None, parent, name).map(drop)
    }

    /// [`Workspace::check_new_entry`], by `cred` if given (write and search permission
    /// on `parent`, after the checks Linux makes first). Returns the directory.
    fn check_new_entry_as(
        txn: &WriteTxn<'_>,
        cred: Option<&Credentials<'_>>,
        parent: InodeNo,
        name: &[u8],
    ) -> Result<Attr> {
        store::check_name(name)?;
        // The directory and the name in one statement: a create is a burst of these.
        let (dir, existing) = store::lookup_in(txn, parent, name)?;
        let dir = dir.ok_or_else(kind::NotFound)?;
        if !dir.is_dir() {
            return Err(kind::NotDir());
        }
        if existing.is_some() {
            return Err(kind::Exists());
        }
        if dir.nlink == 0 {
            return Err(kind::NotFound());
        }
        if let Some(cred) = cred {
            access::may_create(&dir, cred)?;
        }
        Ok(dir)
    }

    /// The owner of a node made in `dir`: as given by a trusted caller, or decided by the
    /// rules for `cred` (its ids, the directory's group if set-group-id).
    fn owner_in(
        dir: &Attr,
        cred: Option<&Credentials<'_>>,
        owner: NewNode,
        kind: FileKind,
    ) -> NewNode {
        match cred {
            Some(cred) => access::new_owner(dir, cred, owner.perm, kind),
            None => owner,
        }
    }

    /// Creates a node of any kind but directory and symlink (regular file, fifo, socket,
    /// device).
    ///
    /// A caller (`Who::Caller`) owns the node (only `owner.perm` is used) and needs write
    /// and search permission on `parent`.
    pub fn mknod(
        &self,
        who: Who<'_>,
        parent: InodeNo,
        name: &[u8],
        kind: FileKind,
        owner: NewNode,
        rdev: u32,
    ) -> Result<Attr> {
        let cred = who.cred();
        if matches!(kind, FileKind::Directory | FileKind::Symlink) {
            return Err(Error::invalid("mknod cannot make directories or symlinks"));
        }
        self.write_gate().pass()?;
        let now = self.now();
        self.inner.db.write(|txn| {
            let ino = Self::insert_entry_node(txn, cred, (parent, name), kind, owner, rdev, now)?;
            store::attr(txn, ino)
        })
    }

    /// Inside a mutation: checks that `cred` may add `name` to `parent` and adds a new
    /// node of `kind` there, owned as Linux owns it. What every creation of a file or
    /// special node shares, staged or not.
    pub(crate) fn insert_entry_node(
        txn: &mut WriteTxn<'_>,
        cred: Option<&Credentials<'_>>,
        (parent, name): (InodeNo, &[u8]),
        kind: FileKind,
        owner: NewNode,
        rdev: u32,
        now: TimestampNs,
    ) -> Result<InodeNo> {
        let dir = Self::check_new_entry_as(txn, cred, parent, name)?;
        let owner = Self::owner_in(&dir, cred, owner, kind);
        let ino = store::insert_node(txn, kind, owner, rdev, None, now)?;
        store::insert_dirent(txn, parent, name, ino)?;
        store::touch_dir(txn, parent, 0, now)?;
        Ok(ino)
    }

    /// Creates a regular file and opens it.
    ///
    /// A caller is checked as for [`Workspace::mknod`]; the creator may write the new
    /// file whatever its mode, as `open(O_CREAT)` may.
    pub fn create(
        &self,
        who: Who<'_>,
        parent: InodeNo,
        name: &[u8],
        owner: NewNode,
        flags: OpenFlags,
    ) -> Result<(Attr, FileHandle)> {
        let attr = self.mknod(who, parent, name, FileKind::File, owner, 0)?;
        let handle = self.open_file(
            attr.ino,
            OpenFlags {
                truncate: false,
                ..flags
            },
        )?;
        Ok((attr, handle))
    }

    /// Creates a directory.
    ///
    /// A caller is checked as for [`Workspace::mknod`].
    pub fn mkdir(
        &self,
        who: Who<'_>,
        parent: InodeNo,
        name: &[u8],
        owner: NewNode,
    ) -> Result<Attr> {
        let cred = who.cred();
        self.write_gate().pass()?;
        let now = self.now();
        self.inner.db.write(|txn| {
            let dir = Self::check_new_entry_as(txn, cred, parent, name)?;
            let owner = Self::owner_in(&dir, cred, owner, FileKind::Directory);
            let ino = store::insert_node(txn, FileKind::Directory, owner, 0, None, now)?;
            store::insert_dirent(txn, parent, name, ino)?;
            store::touch_dir(txn, parent, 1, now)?;
            store::attr(txn, ino)
        })
    }

    /// Creates a symlink to `target`.
    ///
    /// A caller is checked as for [`Workspace::mknod`].
    pub fn symlink(
        &self,
        who: Who<'_>,
        parent: InodeNo,
        name: &[u8],
        target: &[u8],
        owner: NewNode,
    ) -> Result<Attr> {
        let cred = who.cred();
        self.write_gate().pass()?;
        if target.is_empty() {
            return Err(kind::NotFound());
        }
        if target.len() > SYMLINK_MAX {
            return Err(kind::NameTooLong());
        }
        if target.contains(&0) {
            return Err(Error::invalid("symlink target contains NUL"));
        }
        let now = self.now();
        self.inner.db.write(|txn| {
            let dir = Self::check_new_entry_as(txn, cred, parent, name)?;
            let owner = NewNode {
                perm: 0o777,
                ..Self::owner_in(&dir, cred, owner, FileKind::Symlink)
            };
            let ino = store::insert_node(txn, FileKind::Symlink, owner, 0, Some(target), now)?;
            store::insert_dirent(txn, parent, name, ino)?;
            store::touch_dir(txn, parent, 0, now)?;
            store::attr(txn, ino)
        })
    }

    /// Adds a hard link to `ino` as `name` in `parent`.
    ///
    /// A caller may link only a file it owns or may read and write where links are
    /// protected (see `access::may_link`), and needs write and search permission on
    /// `parent`.
    pub fn link(&self, who: Who<'_>, ino: InodeNo, parent: InodeNo, name: &[u8]) -> Result<Attr> {
        let cred = who.cred();
        self.write_gate().pass()?;
        let now = self.now();
        let ended = self.inner.files.overlays_ended();
        let attr = self.inner.db.write(|txn| {
            let attr = store::attr(txn, ino)?;
            // A caller's link is checked in the kernel's order: the source, then the
            // new entry, then what the filesystem refuses.
            if let Some(cred) = cred {
                access::may_link(&attr, cred)?;
                Self::check_new_entry_as(txn, Some(cred), parent, name)?;
            }
            if attr.is_dir() {
                return Err(kind::NotPermitted());
            }
            if attr.nlink == 0 {
                return Err(kind::NotFound());
            }
            if attr.nlink >= LINK_MAX {
                return Err(kind::TooManyLinks());
            }
            if cred.is_none() {
                Self::check_new_entry(txn, parent, name)?;
            }
            store::insert_dirent(txn, parent, name, ino)?;
            store::add_nlink(txn, ino, 1, now)?;
            store::touch_dir(txn, parent, 0, now)?;
            store::attr(txn, ino)
        })?;
        self.overlaid(ended, attr)
    }

    /// Removes a non-directory entry. The node lives on while it has links or open handles.
    ///
    /// A caller needs write and search permission on `parent`, and the sticky bit's
    /// rule.
    pub fn unlink(&self, who: Who<'_>, parent: InodeNo, name: &[u8]) -> Result<()> {
        let cred = who.cred();
        let now = self.now();
        self.inner.db.write(|txn| {
            txn.skip_quota();
            // The directory and the entry's node in one statement: `rm` of many files
            // is a burst of these.
            let (dir, attr) = store::lookup_in(txn, parent, name)?;
            let dir = dir.ok_or_else(kind::NotFound)?;
            if !dir.is_dir() {
                return Err(kind::NotDir());
            }
            let attr = attr.ok_or_else(kind::NotFound)?;
            if let Some(cred) = cred {
                access::may_delete(&dir, &attr, cred)?;
            }
            if attr.is_dir() {
                return Err(kind::IsDir());
            }
            store::remove_dirent(txn, parent, name)?;
            store::touch_dir(txn, parent, 0, now)?;
            self.drop_link_of(txn, &attr, now)
        })
    }

    /// One link of `ino` is gone: count it, and delete the node with its last link unless
    /// a handle keeps it open.
    pub(crate) fn drop_link(
        &self,
        txn: &mut WriteTxn<'_>,
        ino: InodeNo,
        now: TimestampNs,
    ) -> Result<()> {
        let attr = store::attr(txn, ino)?;
        self.drop_link_of(txn, &attr, now)
    }

    /// [`Workspace::drop_link`] of a node whose attributes were just read in `txn`.
    pub(crate) fn drop_link_of(
        &self,
        txn: &mut WriteTxn<'_>,
        attr: &Attr,
        now: TimestampNs,
    ) -> Result<()> {
        let ino = attr.ino;
        if attr.nlink != 1 {
            return store::add_nlink(txn, ino, -1, now);
        }
        // Open: the last release deletes it (and looks again, in case this mutation is
        // rolled back).
        if self.inner.files.mark_orphan(ino) {
            // Kept, with no links, until its last handle goes.
            store::add_nlink(txn, ino, -1, now)?;
        } else {
            // Gone at once: counting the link first would only rewrite a row (and
            // its revision index) about to be deleted.
            self.delete_node(txn, ino)?;
        }
        Ok(())
    }

    pub(crate) fn delete_node(&self, txn: &mut WriteTxn<'_>, ino: InodeNo) -> Result<()> {
        self.unstage_deleted(txn, ino)?;
        content::release_all(txn, &self.inner.cache, ino)?;
        store::delete_node_row(txn, ino)
    }

    /// Whether some open node has lost its last link: its last release deletes it.
    pub(crate) fn open_orphans(&self) -> bool {
        self.inner.files.any_orphan()
    }

    pub(crate) fn is_open(&self, ino: InodeNo) -> bool {
        self.inner.files.is_open(ino)
    }

    /// Removes an empty directory.
    ///
    /// A caller is checked as for [`Workspace::unlink`].
    pub fn rmdir(&self, who: Who<'_>, parent: InodeNo, name: &[u8]) -> Result<()> {
        let cred = who.cred();
        if name == b"." {
            return Err(Error::invalid("cannot remove '.'"));
        }
        if name == b".." {
            return Err(kind::NotEmpty());
        }
        let now = self.now();
        self.inner.db.write(|txn| {
            txn.skip_quota();
            let dir = store::attr(txn, parent)?;
            if !dir.is_dir() {
                return Err(kind::NotDir());
            }
            let ino = store::lookup(txn, parent, name)?.ok_or_else(kind::NotFound)?;
            let attr = store::attr(txn, ino)?;
            if let Some(cred) = cred {
                access::may_delete(&dir, &attr, cred)?;
            }
            if !attr.is_dir() {
                return Err(kind::NotDir());
            }
            if store::has_entries(txn, ino)? {
                return Err(kind::NotEmpty());
            }
            store::remove_dirent(txn, parent, name)?;
            store::touch_dir(txn, parent, -1, now)?;
            self.delete_node(txn, ino)
        })
    }

    /// Renames an entry with rename(2) semantics, plus `RENAME_NOREPLACE` and
    /// `RENAME_EXCHANGE`. Moving a directory moves its whole subtree in one revision.
    ///
    /// For a caller, removing the source's entry and adding (or replacing) the target's
    /// follow the rules of unlink and create, and a directory moving to another parent
    /// must be writable (its `..` changes).
    pub fn rename(
        &self,
        who: Who<'_>,
        parent: InodeNo,
        name: &[u8],
        new_parent: InodeNo,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        if flags.exchange && flags.no_replace {
            return Err(Error::invalid("RENAME_EXCHANGE with RENAME_NOREPLACE"));
        }
        store::check_name(name)?;
        store::check_name(new_name)?;
        let now = self.now();
        self.inner.db.write(|txn| {
            txn.skip_quota();
            let dirs = [store::attr(txn, parent)?, store::attr(txn, new_parent)?];
            if dirs.iter().any(|dir| !dir.is_dir()) {
                return Err(kind::NotDir());
            }
            let src = store::lookup(txn, parent, name)?.ok_or_else(kind::NotFound)?;
            let src_attr = store::attr(txn, src)?;
            let dst = store::lookup(txn, new_parent, new_name)?;
            // renameat2(2) checks this first: even a target naming the same node (a hard
            // link, or the entry itself) exists, and NOREPLACE must not report success.
            if flags.no_replace && dst.is_some() {
                return Err(kind::Exists());
            }
            if flags.exchange {
                let dst = dst.ok_or_else(kind::NotFound)?;
                let checked = who.cred().map(|cred| (cred, &dirs));
                return self.exchange(
                    txn,
                    (parent, name, src),
                    (new_parent, new_name, dst),
                    checked,
                    now,
                );
            }
            if dst == Some(src) {
                // Two names of the same node: rename(2) does nothing.
                return Ok(());
            }
            if src_attr.is_dir() && store::is_ancestor(txn, src, new_parent)? {
                return Err(Error::invalid("cannot move a directory into itself"));
            }
            let dst_attr = dst.map(|dst| store::attr(txn, dst)).transpose()?;
            if let Some(cred) = who.cred() {
                access::may_delete(&dirs[0], &src_attr, cred)?;
                match &dst_attr {
                    Some(dst_attr) => {
                        access::may_delete(&dirs[1], dst_attr, cred)?;
                        // Linux checks the kinds here, before the `..` write check.
                        match (src_attr.is_dir(), dst_attr.is_dir()) {
                            (true, false) => return Err(kind::NotDir()),
                            (false, true) => return Err(kind::IsDir()),
                            _ => {}
                        }
                    }
                    None => access::may_create(&dirs[1], cred)?,
                }
                if src_attr.is_dir() && parent != new_parent {
                    access::may_reparent(&src_attr, cred)?;
                }
            }
            let mut replaced_dir = false;
            if let (Some(dst), Some(dst_attr)) = (dst, dst_attr) {
                match (src_attr.is_dir(), dst_attr.is_dir()) {
                    (true, false) => return Err(kind::NotDir()),
                    (false, true) => return Err(kind::IsDir()),
                    (true, true) if store::has_entries(txn, dst)? => return Err(kind::NotEmpty()),
                    _ => {}
                }
                replaced_dir = dst_attr.is_dir();
                store::remove_dirent(txn, new_parent, new_name)?;
                if replaced_dir {
                    self.delete_node(txn, dst)?;
                } else {
                    self.drop_link(txn, dst, now)?;
                }
            } else if new_parent != InodeNo::ROOT || !new_name.is_empty() {
                let target_dir = store::attr(txn, new_parent)?;
                if target_dir.nlink == 0 {
                    return Err(kind::NotFound());
                }
            }
            store::remove_dirent(txn, parent, name)?;
            store::insert_dirent(txn, new_parent, new_name, src)?;
            store::touch_ctime(txn, src, now)?;
            let moved_dir = i64::from(src_attr.is_dir());
            if parent == new_parent {
                store::touch_dir(txn, parent, -i64::from(replaced_dir), now)?;
            } else {
                store::touch_dir(txn, parent, -moved_dir, now)?;
                store::touch_dir(txn, new_parent, moved_dir - i64::from(replaced_dir), now)?;
            }
            Ok(())
        })
    }

    /// `RENAME_EXCHANGE`. With `checked`, the caller and the two directories: each entry
    /// is removed and re-added by the caller, and a directory changing parent must be
    /// writable.
    fn exchange(
        &self,
        txn: &mut WriteTxn<'_>,
        (a_parent, a_name, a): (InodeNo, &[u8], InodeNo),
        (b_parent, b_name, b): (InodeNo, &[u8], InodeNo),
        checked: Option<(&Credentials<'_>, &[Attr; 2])>,
        now: TimestampNs,
    ) -> Result<()> {
        if a == b {
            return Ok(());
        }
        let a_attr = store::attr(txn, a)?;
        let b_attr = store::attr(txn, b)?;
        if a_attr.is_dir() && store::is_ancestor(txn, a, b_parent)? {
            return Err(Error::invalid("cannot move a directory into itself"));
        }
        if b_attr.is_dir() && store::is_ancestor(txn, b, a_parent)? {
            return Err(Error::invalid("cannot move a directory into itself"));
        }
        if let Some((cred, [a_dir, b_dir])) = checked {
            access::may_delete(a_dir, &a_attr, cred)?;
            access::may_delete(b_dir, &b_attr, cred)?;
            if a_parent != b_parent {
                for moved in [&a_attr, &b_attr] {
                    if moved.is_dir() {
                        access::may_reparent(moved, cred)?;
                    }
                }
            }
        }
        // Re-point both entries; each gets a new cookie and revision.
        store::remove_dirent(txn, a_parent, a_name)?;
        store::remove_dirent(txn, b_parent, b_name)?;
        store::insert_dirent(txn, a_parent, a_name, b)?;
        store::insert_dirent(txn, b_parent, b_name, a)?;
        store::touch_ctime(txn, a, now)?;
        store::touch_ctime(txn, b, now)?;
        let (a_dir, b_dir) = (i64::from(a_attr.is_dir()), i64::from(b_attr.is_dir()));
        if a_parent == b_parent {
            store::touch_dir(txn, a_parent, 0, now)?;
        } else {
            store::touch_dir(txn, a_parent, b_dir - a_dir, now)?;
            store::touch_dir(txn, b_parent, a_dir - b_dir, now)?;
        }
        Ok(())
    }

    /// Changes attributes. A size change truncates or extends (with a hole) the file.
    ///
    /// A caller's change is checked by `access::setattr`, which may also drop set-id
    /// bits as Linux does, against the node as the transaction that changes it finds
    /// it: a chmod or chown landing between a check and its change cannot make a check
    /// stale. A change of size acts on the content before that transaction and is
    /// checked just before it.
    pub fn setattr(&self, who: Who<'_>, ino: InodeNo, changes: &SetAttr) -> Result<Attr> {
        let check = who.cred();
        if let (Some(cred), Some(_)) = (check, changes.size) {
            let attr = self.stored_attr(ino)?;
            let changes = access::setattr(&attr, changes, cred)?;
            return self.apply_setattr(ino, &changes, None);
        }
        self.apply_setattr(ino, changes, check)
    }

    /// [`Workspace::setattr`], checked against `check` in its transaction if given.
    fn apply_setattr(
        &self,
        ino: InodeNo,
        changes: &SetAttr,
        check: Option<&Credentials<'_>>,
    ) -> Result<Attr> {
        let (attr, perm) = self.change_attr(ino, changes, check)?;
        // After the change is stored: a write that read the mode before it asks again.
        if perm.is_some_and(access::write_may_drop_bits) {
            self.setid_may_be_back(Some(ino));
        }
        Ok(attr)
    }

    /// Stores `changes` to node `ino` in `txn`, checked first against `check` if given
    /// (size aside: the caller changed it already). Returns the node as stored and the
    /// mode it was given, if any (the check may have changed or added one).
    pub(crate) fn store_changes(
        txn: &mut WriteTxn<'_>,
        ino: InodeNo,
        changes: &SetAttr,
        check: Option<&Credentials<'_>>,
        now: TimestampNs,
    ) -> Result<(Attr, Option<u32>)> {
        let mut attr = store::attr(txn, ino)?;
        let checked;
        let changes = match check {
            Some(cred) => {
                checked = access::setattr(&attr, changes, cred)?;
                &checked
            }
            None => changes,
        };
        let resolve = |t: SetTime| match t {
            SetTime::Now => now,
            SetTime::At(at) => at,
        };
        if let Some(perm) = changes.perm {
            attr.perm = perm & 0o7777;
        }
        if let Some(uid) = changes.uid {
            attr.uid = uid;
        }
        if let Some(gid) = changes.gid {
            attr.gid = gid;
        }
        if let Some(at) = changes.atime {
            attr.atime = resolve(at);
        }
        if let Some(at) = changes.mtime {
            attr.mtime = resolve(at);
        }
        attr.ctime = changes.ctime.unwrap_or(now);
        store::store_attr(txn, &attr)?;
        Ok((attr, changes.perm))
    }

    fn change_attr(
        &self,
        ino: InodeNo,
        changes: &SetAttr,
        check: Option<&Credentials<'_>>,
    ) -> Result<(Attr, Option<u32>)> {
        debug_assert!(
            check.is_none() || changes.size.is_none(),
            "a change of size is checked before"
        );
        // Held while the size or times change, and the staging file looked for once
        // held: a fill cannot copy the old state behind the change.
        let content = changes.size.is_some() || changes.mtime.is_some() || changes.atime.is_some();
        let hold = content.then(|| self.acquire(ino));
        let result = self.change_held_attr(ino, changes, check, hold.as_deref());
        match hold {
            Some(open) => {
                let finished = self.finish_use(&open);
                result.and_then(|changed| finished.map(|()| changed))
            }
            None => result,
        }
    }

    /// [`Workspace::change_attr`] once the inode is held (`hold`, when the change needs
    /// it: a change of size always does).
    fn change_held_attr(
        &self,
        ino: InodeNo,
        changes: &SetAttr,
        check: Option<&Credentials<'_>>,
        hold: Option<&OpenInode>,
    ) -> Result<(Attr, Option<u32>)> {
        let staged = match hold {
            Some(_) => self.staged_for_holder(ino),
            None => self.staged_entry(ino),
        };
        if let Some(staged) = staged {
            // Pinned, so eviction cannot recycle the file while we change it; if it was
            // evicted already, the stored node is the file again.
            if self.pin_staged(&staged) {
                let result = self.staged_setattr(&staged, changes, check);
                self.unpin_staged(&staged);
                return result;
            }
        }
        let now = self.now();
        if let Some(size) = changes.size {
            if size > self.inner.options.file_size_max {
                return Err(kind::FileTooBig());
            }
            let open = hold.expect("a change of size holds the inode");
            self.set_size(open, size, now)?;
        }
        let mut rest = changes.clone();
        rest.size = None;
        if rest.is_empty() && changes.size.is_some() {
            return Ok((self.getattr(ino)?, None));
        }
        // Buffered writes carry an mtime that an explicit one must override. Cleared
        // before the transaction (the writer is taken after an inode's state, never
        // before), and given back if the change is refused or fails.
        let buffered_mtime = rest
            .mtime
            .and_then(|_| self.inner.files.get(ino))
            .map(|open| {
                let was = lock(&open.state).written_at.take();
                (open, was)
            });
        let ended = self.inner.files.overlays_ended();
        let stored = self
            .inner
            .db
            .write(|txn| Self::store_changes(txn, ino, &rest, check, now));
        if let (Err(_), Some((open, Some(was)))) = (&stored, buffered_mtime) {
            lock(&open.state).written_at.get_or_insert(was);
        }
        let (attr, perm) = stored?;
        Ok((self.overlaid(ended, attr)?, perm))
    }

    /// Truncates or extends an open inode to `size`, committing buffered writes with it.
    fn set_size(&self, open: &OpenInode, size: u64, now: TimestampNs) -> Result<()> {
        let mut state = lock(&open.state);
        self.load_state(open.ino, &mut state)?;
        let (old_size, old_written) = (state.size, state.written_at);
        let cut = state.dirty.split_off(size);
        state.size = size;
        state.written_at = Some(now);
        let result = self.commit_locked(open.ino, &mut state, true);
        match result {
            // The buffered bytes cut off are gone: count them out of the total too.
            Ok(()) => self.dirty_released(cut.bytes),
            // Nothing changed (ENOSPC, I/O error): the buffer and size stay as they were.
            Err(_) => {
                state.dirty.rejoin(cut);
                state.size = old_size;
                state.written_at = old_written;
            }
        }
        result
    }

    // ------------------------------------------------------------------ file content

    /// Registers one more user of `ino`'s shared state.
    pub(crate) fn acquire(&self, ino: InodeNo) -> Arc<OpenInode> {
        self.inner.files.acquire(ino)
    }

    /// Drops one user of `open`; the last one drops what the state still buffers (its
    /// commit failed and was reported) and deletes the node if it lost its last link
    /// while in use. Every user acquired with [`Workspace::acquire`] ends here.
    pub(crate) fn finish_use(&self, open: &Arc<OpenInode>) -> Result<()> {
        if !self.inner.files.unacquire(open) {
            return Ok(());
        }
        let dropped = lock(&open.state).dirty.clear();
        if dropped > 0 {
            self.dirty_released(dropped);
            tracing::warn!(
                "{}: dropped {dropped} buffered bytes that failed to commit",
                open.ino
            );
        }
        let unlinked = open.maybe_orphan() || lock(&open.state).opened_unlinked;
        if !unlinked {
            return Ok(());
        }
        let ino = open.ino;
        // On the writer: the unlink that flagged it has committed by now.
        let orphan = self
            .inner
            .db
            .read_latest(|conn| Ok(store::load_attr(conn, ino)?.is_some_and(|a| a.nlink == 0)))?;
        if orphan {
            self.inner.db.write(|txn| {
                txn.skip_quota();
                let still_orphan = store::load_attr(txn, ino)?.is_some_and(|a| a.nlink == 0);
                if !still_orphan || self.is_open(ino) {
                    return Ok(());
                }
                self.delete_node(txn, ino)
            })?;
        }
        Ok(())
    }

    /// [`Workspace::finish_use`] of every one of `holds`; the first failure, once all
    /// are let go.
    pub(crate) fn finish_uses(&self, holds: Vec<Arc<OpenInode>>) -> Result<()> {
        let mut finished = Ok(());
        for open in holds {
            finished = finished.and(self.finish_use(&open));
        }
        finished
    }

    pub(crate) fn load_state(&self, ino: InodeNo, state: &mut OpenState) -> Result<Option<Attr>> {
        if !state.loaded {
            // Read on the writer: the caller registered as a user of `ino` before this,
            // so a mutation that decided to delete the node (not seeing us) has
            // committed by now and we see it gone, rather than a reader's older snapshot
            // that still shows it.
            let attr = self.inner.db.read_latest(|conn| store::attr(conn, ino))?;
            if attr.kind != FileKind::File {
                return Err(if attr.is_dir() {
                    kind::IsDir()
                } else {
                    Error::invalid("not a regular file")
                });
            }
            state.size = attr.size;
            state.loaded = true;
            state.opened_unlinked = attr.nlink == 0;
            return Ok(Some(attr));
        }
        Ok(None)
    }

    /// Commits an inode's buffered writes (and a size change) as one mutation.
    pub(crate) fn commit_locked(
        &self,
        ino: InodeNo,
        state: &mut OpenState,
        size_changed: bool,
    ) -> Result<()> {
        self.inner.commit_locked(ino, state, size_changed)
    }

    /// Opens a regular file.
    pub fn open_file(&self, ino: InodeNo, flags: OpenFlags) -> Result<FileHandle> {
        if flags.write {
            self.write_gate().pass()?;
        }
        if flags.write && self.is_read_only() {
            return Err(kind::ReadOnly());
        }
        self.open_with(ino, flags, false, false, None)
            .map(|opened| opened.handle)
    }

    /// Opens a handle on the write buffer of `ino` (no staging file). `None`: the file
    /// turned out to be staged (a fill ended as this open began): open that instead.
    pub(crate) fn open_buffered(
        &self,
        ino: InodeNo,
        flags: OpenFlags,
        check: Option<(&Credentials<'_>, Access)>,
    ) -> Result<Option<FileHandle>> {
        let open = self.acquire(ino);
        // Looked for once held: a fill either saw this hold and gave up, or published
        // an entry the kernel must not see beside a cached open.
        if self.staged_for_holder(ino).is_some() {
            self.finish_use(&open)?;
            return Ok(None);
        }
        let prepared = (|| {
            let mut state = lock(&open.state);
            let loaded = self.load_state(ino, &mut state)?;
            if let Some((cred, want)) = check {
                let attr = match loaded {
                    Some(attr) => attr,
                    None => self.stored_attr(ino)?,
                };
                access::check(&attr, cred, want)?;
            }
            if flags.truncate && flags.write && state.size != 0 {
                drop(state);
                self.set_size(&open, 0, self.now())?;
            }
            Ok(())
        })();
        if let Err(err) = prepared {
            let _ = self.finish_use(&open);
            return Err(err);
        }
        Ok(Some(self.inner.files.add_handle(OpenHandle {
            open,
            flags,
            body: Body::Buffered,
        })))
    }

    fn handle(&self, fh: FileHandle) -> Result<OpenHandle> {
        self.inner.files.handle(fh)
    }

    /// The inode a handle refers to.
    pub fn handle_inode(&self, fh: FileHandle) -> Result<InodeNo> {
        Ok(self.handle(fh)?.open.ino)
    }

    /// Reads up to `size` bytes at `offset`; fewer at the end of the file.
    pub fn read(&self, fh: FileHandle, offset: u64, size: usize) -> Result<Vec<u8>> {
        self.read_through(&self.handle(fh)?, offset, size)
    }

    /// Reads into `buf` from `offset`; returns how many bytes it filled, fewer than
    /// `buf.len()` only at the end of the file. For a caller that has a buffer to fill
    /// (a FUSE transport's reply): no buffer of its own, no copy.
    pub fn read_into(&self, fh: FileHandle, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let size = buf.len();
        self.read_to(&self.handle(fh)?, offset, size, &mut ReadRoom(buf))
    }

    /// The whole content of the file open as `fh`, if it is not empty, holds at most
    /// `bytes_max` bytes and nothing else has the file open (no other handle, no other
    /// user): what a cache in front of the store (the kernel's page cache) may take
    /// in one piece at the open, before a reader asks. `None` otherwise, and for a
    /// handle on a staging file, whose reads do not come here.
    pub fn whole_if_sole(&self, fh: FileHandle, bytes_max: u64) -> Result<Option<Vec<u8>>> {
        let handle = self.handle(fh)?;
        if !matches!(handle.body, Body::Buffered) || !self.inner.files.sole_user(&handle.open) {
            return Ok(None);
        }
        let size = {
            let mut state = lock(&handle.open.state);
            self.load_state(handle.open.ino, &mut state)?;
            state.size
        };
        if size == 0 || size > bytes_max {
            return Ok(None);
        }
        let content = self.read_through(&handle, 0, size as usize)?;
        Ok(Some(content))
    }

    /// [`Workspace::read`] of an open handle.
    pub(crate) fn read_through(
        &self,
        handle: &OpenHandle,
        offset: u64,
        size: usize,
    ) -> Result<Vec<u8>> {
        let mut buf = Vec::new();
        let len = self.read_to(handle, offset, size, &mut buf)?;
        buf.truncate(len);
        Ok(buf)
    }

    /// Reads up to `size` bytes at `offset` of an open handle into `target`; returns
    /// how many.
    fn read_to(
        &self,
        handle: &OpenHandle,
        offset: u64,
        size: usize,
        target: &mut impl ReadTarget,
    ) -> Result<usize> {
        match &handle.body {
            Body::Staged(staged) => self.staged_read(staged, offset, size, target),
            Body::Buffered => self.buffered_read(&handle.open, offset, size, target),
        }
    }

    fn buffered_read(
        &self,
        open: &OpenInode,
        offset: u64,
        size: usize,
        target: &mut impl ReadTarget,
    ) -> Result<usize> {
        let mut state = lock(&open.state);
        self.load_state(open.ino, &mut state)?;
        let end = state.size.min(offset.saturating_add(size as u64));
        if offset >= end {
            return Ok(0);
        }
        let buf = target.room((end - offset) as usize);
        if state.dirty.is_empty() {
            // Nothing buffered: read the committed snapshot without holding the state.
            drop(state);
            self.inner
                .db
                .read(|conn| content::read_into(conn, &self.inner.cache, open.ino, offset, buf))?;
            return Ok(buf.len());
        }
        self.inner
            .db
            .read(|conn| content::read_into(conn, &self.inner.cache, open.ino, offset, buf))?;
        state.dirty.overlay(offset, buf);
        Ok(buf.len())
    }

    /// Writes `data` at `offset` (at the end with `append`). Returns the bytes written.
    pub fn write(&self, fh: FileHandle, offset: u64, data: &[u8]) -> Result<usize> {
        self.write_with(fh, offset, data, true)
    }

    /// After a write by `who`, who lacks `CAP_FSETID` (the kernel says so with each
    /// write it sends): drops the file's set-id bits as Linux does
    /// (`access::perm_without_privileges`). Returns whether the mode changed, so that
    /// the caller's cached attributes can be refreshed. Costs a read of the stored mode
    /// only while it may hold set-id bits.
    pub fn drop_setid_after_write(&self, who: Who<'_>, fh: FileHandle) -> Result<bool> {
        let open = self.handle(fh)?.open;
        let Some(cred) = who.cred() else {
            return Ok(false);
        };
        // Cleared before the read, so a chmod that lands after it arms it again.
        if !open.take_setid_check() {
            return Ok(false);
        }
        let attr = self.stored_attr(open.ino)?;
        if attr.kind != FileKind::File || !access::write_may_drop_bits(attr.perm) {
            return Ok(false);
        }
        // Which bits go depends on the writer: the next write asks again.
        open.keep_setid_check();
        let perm = access::perm_without_privileges(&attr, cred);
        if perm == attr.perm {
            return Ok(false);
        }
        let changes = SetAttr {
            perm: Some(perm),
            ..SetAttr::default()
        };
        self.apply_setattr(open.ino, &changes, None)?;
        Ok(true)
    }

    /// Tells open inodes that their stored modes may have gained set-id bits: `ino`, or
    /// every open inode (`None`: a peer's changes landed).
    pub(crate) fn setid_may_be_back(&self, ino: Option<InodeNo>) {
        self.inner.files.setid_may_be_back(ino);
    }

    /// Like [`Workspace::write`]; without `stamp_times` the write leaves mtime and ctime
    /// alone (the kernel's writeback cache keeps its own and sends them with setattr).
    pub fn write_with(
        &self,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        stamp_times: bool,
    ) -> Result<usize> {
        let handle = self.handle(fh)?;
        match &handle.body {
            Body::Staged(staged) => self.staged_write(staged, handle.flags, offset, data),
            Body::Buffered => {
                self.buffered_write(&handle.open, handle.flags, offset, data, stamp_times)
            }
        }
    }

    fn buffered_write(
        &self,
        open: &OpenInode,
        flags: OpenFlags,
        offset: u64,
        data: &[u8],
        stamp_times: bool,
    ) -> Result<usize> {
        if !flags.write {
            return Err(kind::BadHandle());
        }
        let mut state = lock(&open.state);
        self.load_state(open.ino, &mut state)?;
        let offset = if flags.append { state.size } else { offset };
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or_else(kind::FileTooBig)?;
        if end > self.inner.options.file_size_max {
            return Err(kind::FileTooBig());
        }
        if data.is_empty() {
            return Ok(0);
        }
        let now = self.now();
        let file_max = self.inner.options.dirty_file_bytes_max;
        // Make room first, so that a failing commit reports before any byte of this
        // write is kept: a write that returns an error has written nothing.
        if state.dirty.bytes + data.len() > file_max {
            self.commit_locked(open.ino, &mut state, false)?;
        }
        if data.len() >= file_max {
            // Too large to buffer: this write is its own mutation.
            let new_size = state.size.max(end);
            self.inner
                .commit_direct(open.ino, offset, data, new_size, now)?;
            state.size = new_size;
            return Ok(data.len());
        }
        let before = state.dirty.bytes;
        state.dirty.insert(offset, data);
        let grown = state.dirty.bytes.saturating_sub(before);
        let total = self.inner.files.dirty_grown(grown);
        state.size = state.size.max(end);
        if stamp_times {
            state.written_at = Some(now);
        }
        if total >= self.inner.options.dirty_total_bytes_max {
            // All buffers together are over their bound: commit them all, not only this
            // file's, so idle open files cannot hold memory without limit. Our own state
            // lock goes first (lock order), and this write is already buffered: a failure
            // here leaves it for the next flush, which will report it.
            drop(state);
            if let Err(err) = self.commit_all() {
                tracing::warn!("failed to commit buffered writes past the memory bound: {err}");
            }
        }
        Ok(data.len())
    }

    /// Commits the handle's inode's buffered writes (called on every close).
    pub fn flush(&self, fh: FileHandle) -> Result<()> {
        let handle = self.handle(fh)?;
        match &handle.body {
            // The kernel wrote the staging file itself; it is ingested at release.
            Body::Staged(_) => Ok(()),
            Body::Buffered => self.commit_open(&handle.open),
        }
    }

    /// Commits what an open inode buffers.
    fn commit_open(&self, open: &OpenInode) -> Result<()> {
        let mut state = lock(&open.state);
        if !state.loaded {
            return Ok(());
        }
        self.commit_locked(open.ino, &mut state, false)
    }

    /// Commits and makes durable everything written through this handle's inode; with
    /// `datasync`, as `fdatasync(2)`, the times of a staged file may not be.
    ///
    /// A staged file is made durable where it is, not ingested (see `sync_staged`): the
    /// cost is the change's, not the file's size.
    pub fn fsync(&self, fh: FileHandle, datasync: bool) -> Result<()> {
        let handle = self.handle(fh)?;
        match &handle.body {
            Body::Staged(staged) => self.sync_staged(staged, datasync)?,
            Body::Buffered => self.commit_open(&handle.open)?,
        }
        // The binding of a staged file is in the batch since it was opened for writing.
        self.inner.db.sync()
    }

    /// Closes a handle, committing what it buffered.
    pub fn release(&self, fh: FileHandle) -> Result<()> {
        let handle = self.inner.files.remove_handle(fh)?;
        if let Body::Staged(staged) = &handle.body {
            self.staged_release(staged, handle.flags);
        }
        // A staged handle's inode may buffer writes too: a path write (a peer's, a
        // tool's) that went through the buffer while the file was staged.
        let committed = self.commit_open(&handle.open);
        self.finish_use(&handle.open)?;
        committed
    }

    /// Copies `len` bytes between open files. A whole-file copy into an empty file shares
    /// blocks and moves no data. Returns the bytes copied.
    pub fn copy_range(
        &self,
        fh_in: FileHandle,
        offset_in: u64,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
    ) -> Result<u64> {
        self.write_gate().pass()?;
        self.check_copy_ranges((fh_in, offset_in), (fh_out, offset_out), len)?;
        let (src_handle, dst_handle) = (self.handle(fh_in)?, self.handle(fh_out)?);
        let src_staged = src_handle.staged().is_some();
        if src_staged || dst_handle.staged().is_some() {
            let copied =
                self.staged_copy_range((&src_handle, offset_in), (&dst_handle, offset_out), len)?;
            if let Some(copied) = copied {
                return Ok(copied);
            }
        }
        let (src, dst) = (src_handle.open, dst_handle.open);
        let src_size = self.copy_source_size(&src, src_staged)?;
        let len = len.min(src_size.saturating_sub(offset_in));
        if len == 0 {
            return Ok(0);
        }
        if offset_out
            .checked_add(len)
            .is_none_or(|end| end > self.inner.options.file_size_max)
        {
            return Err(kind::FileTooBig());
        }
        if src.ino != dst.ino && offset_in == 0 && offset_out == 0 && len == src_size {
            let mut state = lock(&dst.state);
            self.load_state(dst.ino, &mut state)?;
            if state.size <= src_size {
                let freed = state.dirty.clear();
                self.inner.files.dirty_released(freed);
                let now = self.now();
                let (src_ino, dst_ino) = (src.ino, dst.ino);
                self.inner.db.write(|txn| {
                    content::release_all(txn, &self.inner.cache, dst_ino)?;
                    content::share_all(txn, src_ino, dst_ino)?;
                    let mut attr = store::attr(txn, dst_ino)?;
                    attr.size = src_size;
                    attr.mtime = now;
                    attr.ctime = now;
                    store::store_attr(txn, &attr)
                })?;
                state.size = src_size;
                state.written_at = None;
                return Ok(len);
            }
        }
        // General case: copy through memory in bounded pieces.
        const PIECE: u64 = 1 << 20;
        let mut done = 0;
        while done < len {
            let n = PIECE.min(len - done) as usize;
            let bytes = self.read(fh_in, offset_in + done, n)?;
            if bytes.is_empty() {
                break;
            }
            self.write_at_unappended(&dst, offset_out + done, &bytes)?;
            done += bytes.len() as u64;
        }
        Ok(done)
    }

    /// The size of a copy's source, its buffered writes committed so that its blocks are
    /// its content. A staged source was ingested by `staged_copy_range`; its buffer
    /// state is never loaded (it would go stale, and getattr would believe it).
    fn copy_source_size(&self, src: &Arc<OpenInode>, staged: bool) -> Result<u64> {
        if staged {
            return Ok(self.getattr(src.ino)?.size);
        }
        let mut state = lock(&src.state);
        self.load_state(src.ino, &mut state)?;
        self.commit_locked(src.ino, &mut state, false)?;
        Ok(state.size)
    }

    /// What copy_file_range(2) refuses before any filesystem sees the copy: an output
    /// not open for writing, and overlapping ranges of one file (the length cut at the
    /// source's end first). Both ways of copying then agree: a staging file's copy
    /// would be refused by the host, and the buffer's would run.
    fn check_copy_ranges(
        &self,
        (fh_in, offset_in): (FileHandle, u64),
        (fh_out, offset_out): (FileHandle, u64),
        len: u64,
    ) -> Result<()> {
        let src = self.handle(fh_in)?.open;
        let dst = self.handle(fh_out)?;
        if !dst.flags.write {
            return Err(kind::BadHandle());
        }
        if src.ino != dst.open.ino {
            return Ok(());
        }
        let size = self.getattr(src.ino)?.size;
        let count = len.min(size.saturating_sub(offset_in));
        if offset_out < offset_in.saturating_add(count)
            && offset_in < offset_out.saturating_add(count)
        {
            return Err(Error::invalid("overlapping ranges of one file"));
        }
        Ok(())
    }

    fn write_at_unappended(&self, open: &Arc<OpenInode>, offset: u64, data: &[u8]) -> Result<()> {
        let mut state = lock(&open.state);
        self.load_state(open.ino, &mut state)?;
        let before = state.dirty.bytes;
        state.dirty.insert(offset, data);
        let grown = state.dirty.bytes.saturating_sub(before);
        self.inner.files.dirty_grown(grown);
        state.size = state.size.max(offset + data.len() as u64);
        state.written_at = Some(self.now());
        if state.dirty.bytes >= self.inner.options.dirty_file_bytes_max {
            self.commit_locked(open.ino, &mut state, false)?;
        }
        Ok(())
    }

    /// `fallocate(2)` mode 0 and `FALLOC_FL_KEEP_SIZE`: make sure `[offset, offset + len)`
    /// is within the file. The store allocates on write, so nothing is reserved.
    pub fn allocate(&self, fh: FileHandle, offset: u64, len: u64, keep_size: bool) -> Result<()> {
        self.write_gate().pass()?;
        let handle = self.handle(fh)?;
        let (open, flags) = match &handle.body {
            Body::Staged(staged) => {
                return self.staged_allocate(staged, handle.flags, offset, len, keep_size)
            }
            Body::Buffered => (&handle.open, handle.flags),
        };
        if !flags.write {
            return Err(kind::BadHandle());
        }
        let end = offset.checked_add(len).ok_or_else(kind::FileTooBig)?;
        if end > self.inner.options.file_size_max {
            return Err(kind::FileTooBig());
        }
        if keep_size {
            return Ok(());
        }
        let size = {
            let mut state = lock(&open.state);
            self.load_state(open.ino, &mut state)?;
            state.size
        };
        if end > size {
            self.set_size(open, end, self.now())?;
        }
        Ok(())
    }

    /// Commits every buffered write and makes the database durable.
    pub fn sync(&self) -> Result<()> {
        self.settle_staged()?;
        self.commit_all()?;
        self.inner.db.sync()
    }

    /// `fsync(2)` of a directory: its entries are rows of the store, durable once the
    /// write-ahead log is. The content of the files in it is not (as on a local disk):
    /// that is the files' own fsync, or [`Workspace::sync`].
    pub fn sync_entries(&self) -> Result<()> {
        self.inner.db.sync()
    }

    // ------------------------------------------------------------ extended attributes

    /// The value of extended attribute `name` of `ino`. A caller is checked by
    /// `access::may_xattr`.
    pub fn getxattr(&self, who: Who<'_>, ino: InodeNo, name: &[u8]) -> Result<Vec<u8>> {
        let cred = who.cred();
        // The kernel asks for `security.capability` before the first write to every
        // file; that needs no permission and, while no attribute exists, no query.
        let cred = cred.filter(|_| access::xattr_needs_permission(name));
        let missing = if access::xattr_not_kept(name) {
            kind::NotSupported
        } else {
            kind::NoAttribute
        };
        let none_exist = !self.inner.xattrs_maybe.load(Ordering::SeqCst);
        if none_exist && cred.is_none() {
            return Err(missing());
        }
        self.inner.db.read(|conn| {
            let attr = store::attr(conn, ino)?;
            if let Some(cred) = cred {
                access::may_xattr(&attr, name, false, cred)?;
            }
            if none_exist {
                return Err(missing());
            }
            store::xattr(conn, ino, name)?.ok_or_else(missing)
        })
    }

    /// The names of `ino`'s extended attributes, in order.
    pub fn listxattr(&self, ino: InodeNo) -> Result<Vec<Vec<u8>>> {
        self.inner.db.read(|conn| {
            store::attr(conn, ino)?;
            store::xattr_names(conn, ino)
        })
    }

    /// Sets extended attribute `name` of `ino`, as `mode` allows. A caller is checked by
    /// `access::may_xattr`.
    pub fn setxattr(
        &self,
        who: Who<'_>,
        ino: InodeNo,
        name: &[u8],
        value: &[u8],
        mode: XattrSet,
    ) -> Result<()> {
        let cred = who.cred();
        if access::xattr_not_kept(name) {
            return Err(kind::NotSupported());
        }
        self.write_gate().pass()?;
        if name.is_empty() {
            return Err(Error::invalid("empty attribute name"));
        }
        if name.len() > XATTR_NAME_MAX {
            return Err(kind::Range());
        }
        if value.len() > XATTR_VALUE_MAX {
            return Err(kind::TooBig());
        }
        let now = self.now();
        // Set before the write: a reader racing it may look in the table for nothing,
        // never miss a row.
        self.inner.xattrs_maybe.store(true, Ordering::SeqCst);
        self.inner.db.write(|txn| {
            let attr = store::attr(txn, ino)?;
            if let Some(cred) = cred {
                access::may_xattr(&attr, name, true, cred)?;
            }
            let exists = store::xattr_exists(txn, ino, name)?;
            match (mode, exists) {
                (XattrSet::Create, true) => return Err(kind::Exists()),
                (XattrSet::Replace, false) => return Err(kind::NoAttribute()),
                _ => {}
            }
            store::put_xattr(txn, ino, name, value)?;
            store::touch_ctime(txn, ino, now)
        })
    }

    /// Removes extended attribute `name` of `ino`. A caller is checked by
    /// `access::may_xattr`.
    pub fn removexattr(&self, who: Who<'_>, ino: InodeNo, name: &[u8]) -> Result<()> {
        let cred = who.cred();
        let now = self.now();
        self.inner.db.write(|txn| {
            txn.skip_quota();
            let attr = store::attr(txn, ino)?;
            if let Some(cred) = cred {
                access::may_xattr(&attr, name, true, cred)?;
            }
            if !store::remove_xattr(txn, ino, name)? {
                return Err(kind::NoAttribute());
            }
            store::touch_ctime(txn, ino, now)
        })
    }

    // ------------------------------------------------------------------ whole workspace

    /// Filesystem numbers for `statfs`: the quota if one is set, else the disk that holds
    /// the database.
    pub fn statfs(&self) -> Result<StatFs> {
        const BLOCK: u64 = 4096;
        let (_, stored, nodes, quota) = self.inner.db.read_counted(db::read_counters)?;
        let (disk_total, disk_free, disk_files, disk_ffree) = self.disk_space();
        let bytes_total = quota
            .bytes_max
            .unwrap_or(stored + disk_free)
            .min(disk_total.max(stored + disk_free));
        let bytes_total = quota.bytes_max.unwrap_or(bytes_total);
        let bytes_free = match quota.bytes_max {
            Some(max) => max.saturating_sub(stored).min(disk_free),
            None => disk_free,
        };
        let inodes_total = quota
            .inodes_max
            .unwrap_or(nodes + disk_ffree.max(disk_files).max(1 << 20));
        Ok(StatFs {
            block_size: BLOCK as u32,
            blocks_total: bytes_total / BLOCK,
            blocks_free: bytes_free / BLOCK,
            inodes_total,
            inodes_free: inodes_total.saturating_sub(nodes),
            name_max: store::NAME_MAX as u32,
        })
    }

    fn disk_space(&self) -> (u64, u64, u64, u64) {
        let Some(path) = self.inner.db.path() else {
            return (1 << 40, 1 << 40, 1 << 30, 1 << 30);
        };
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let Ok(c_path) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
            return (0, 0, 0, 0);
        };
        let mut out: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: c_path is a valid NUL-terminated string and out a valid statvfs.
        if unsafe { libc::statvfs(c_path.as_ptr(), &mut out) } != 0 {
            return (0, 0, 0, 0);
        }
        let frsize = out.f_frsize as u64;
        (
            out.f_blocks as u64 * frsize,
            out.f_bavail as u64 * frsize,
            out.f_files as u64,
            out.f_favail as u64,
        )
    }

    /// Sets or clears the workspace's limits.
    pub fn set_quota(&self, quota: Quota) -> Result<()> {
        self.inner.db.write(|txn| {
            txn.skip_quota();
            txn.set_quota(quota);
            Ok(())
        })
    }

    pub fn quota(&self) -> Result<Quota> {
        self.inner
            .db
            .read_counted(|conn| db::read_counters(conn).map(|c| c.3))
    }

    /// What the workspace holds.
    pub fn stats(&self) -> Result<Stats> {
        let mut stats = self.inner.db.read_counted(|conn| {
            let mut stats = Stats::default();
            for (kind, count, size) in store::nodes_by_kind(conn)? {
                match kind {
                    FileKind::File => {
                        stats.files = count;
                        stats.logical_bytes = size;
                    }
                    FileKind::Directory => stats.directories = count,
                    FileKind::Symlink => stats.symlinks = count,
                    _ => stats.other_nodes += count,
                }
            }
            let blocks = store::block_totals(conn)?;
            stats.blocks = blocks.count;
            stats.unique_bytes = blocks.raw_bytes;
            stats.stored_bytes = blocks.stored_bytes;
            stats.revision = db::read_counters(conn)?.0;
            let (page_size, _, free_pages) = crate::compact::pages(conn)?;
            stats.free_bytes = free_pages.saturating_mul(page_size);
            Ok(stats)
        })?;
        stats.staged_files = self.staged_files()?;
        if let Some(path) = self.inner.db.path() {
            for suffix in ["", "-wal"] {
                let mut p = path.as_os_str().to_owned();
                p.push(suffix);
                stats.database_bytes += std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
            }
        }
        Ok(stats)
    }

    /// Commits buffered writes, then gives every page deleted content freed back to the
    /// file system and empties the write-ahead log (see `compact.rs`). Mutations go on
    /// between its steps; `progress` hears after each one. The first compaction of a
    /// workspace made before incremental vacuum rewrites the database whole.
    pub fn compact(&self, progress: &mut dyn FnMut(CompactProgress)) -> Result<CompactReport> {
        self.sync()?;
        let path = self.inner.db.path().map(|p| p.display().to_string());
        self.inner.db.compact(progress).map_err(|e| match &path {
            Some(path) => e.at(path),
            None => e,
        })
    }

    /// Commits buffered writes and checkpoints the WAL into the database file.
    pub fn checkpoint(&self) -> Result<()> {
        self.sync()?;
        self.inner
            .db
            .with_writer(|conn| db::empty_wal(conn))
            .map(drop)
    }
}

impl Inner {
    /// Commits one write that bypasses the buffer (the buffer must be empty).
    fn commit_direct(
        &self,
        ino: InodeNo,
        offset: u64,
        data: &[u8],
        new_size: u64,
        written_at: TimestampNs,
    ) -> Result<()> {
        let ctx = ContentCtx {
            cache: &self.cache,
            chunker: &self.chunker,
            zstd_level: self.options.zstd_level,
        };
        self.db.write(|txn| {
            let mut attr = store::attr(txn, ino)?;
            content::apply(txn, &ctx, ino, attr.size, new_size, &[(offset, data)])?;
            attr.size = new_size;
            attr.mtime = written_at;
            attr.ctime = attr.ctime.max(written_at);
            store::store_attr(txn, &attr)
        })
    }

    /// See [`Workspace::commit_locked`]; here so that dropping the workspace can commit.
    fn commit_locked(&self, ino: InodeNo, state: &mut OpenState, size_changed: bool) -> Result<()> {
        if state.dirty.is_empty() && !size_changed {
            return Ok(());
        }
        let patch = state.dirty.patch();
        let new_size = state.size;
        let written_at = state.written_at;
        let ctx = ContentCtx {
            cache: &self.cache,
            chunker: &self.chunker,
            zstd_level: self.options.zstd_level,
        };
        self.db.write(|txn| {
            let mut attr = store::attr(txn, ino)?;
            content::apply(txn, &ctx, ino, attr.size, new_size, &patch)?;
            attr.size = new_size;
            if let Some(at) = written_at {
                attr.mtime = at;
                attr.ctime = attr.ctime.max(at);
            }
            store::store_attr(txn, &attr)
        })?;
        let freed = state.dirty.clear();
        self.files.dirty_released(freed);
        state.written_at = None;
        Ok(())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(staging) = &self.staging {
            // Files still dirty are bound in the `staged` table: the next open ingests them.
            staging.stop();
            staging.worker.join();
        }
        // Handles still open when the workspace goes away: commit what they buffered.
        let open = self.files.drain();
        if !open.is_empty() {
            tracing::debug!("{} inodes still open at close", open.len());
        }
        for inode in open {
            let mut state = lock(&inode.state);
            if !state.loaded {
                continue;
            }
            if let Err(err) = self.commit_locked(inode.ino, &mut state, false) {
                tracing::warn!("lost buffered writes of {} at close: {err}", inode.ino);
            }
        }
    }
}

/// The attributes of directory `dir` if `who` may list it: it must be one (ENOTDIR),
/// readable by a caller (EACCES).
fn listable(conn: &rusqlite::Connection, who: Who<'_>, dir: InodeNo) -> Result<Attr> {
    let attr = store::attr(conn, dir)?;
    if !attr.is_dir() {
        return Err(kind::NotDir());
    }
    if let Some(cred) = who.cred() {
        access::check(&attr, cred, Access::READ)?;
    }
    Ok(attr)
}

/// Where a read puts its bytes: [`ReadTarget::room`] is asked once, for exactly the
/// bytes the read will fill (at most the size asked for).
pub(crate) trait ReadTarget {
    fn room(&mut self, len: usize) -> &mut [u8];
}

/// A read into a buffer of its own.
impl ReadTarget for Vec<u8> {
    fn room(&mut self, len: usize) -> &mut [u8] {
        self.resize(len, 0);
        self
    }
}

/// A read into the caller's buffer, which holds at least the size asked for.
struct ReadRoom<'a>(&'a mut [u8]);

impl ReadTarget for ReadRoom<'_> {
    fn room(&mut self, len: usize) -> &mut [u8] {
        assert!(
            len <= self.0.len(),
            "a read fills no more than it was asked"
        );
        &mut self.0[..len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dirty_total(ws: &Workspace) -> usize {
        ws.inner.files.dirty_total()
    }

    /// `/f`, made and open for reading and writing.
    fn create_f(ws: &Workspace) -> (Attr, FileHandle) {
        ws.create(
            Who::Trusted,
            InodeNo::ROOT,
            b"f",
            NewNode::new(0o644),
            OpenFlags::READ_WRITE,
        )
        .unwrap()
    }

    /// A workspace in `dir` with staging on, and `/f` made as the mount makes it:
    /// staged (the file returned), open for writing (the handle).
    fn staged_f(
        dir: &tempfile::TempDir,
    ) -> (Workspace, Attr, FileHandle, Arc<crate::staging::StagedFile>) {
        let options = Options {
            staging_dir: Some(dir.path().join("ws.db.staging")),
            ..Options::default()
        };
        let ws = Workspace::open(dir.path().join("ws.db"), options).unwrap();
        let (attr, opened) = ws
            .create_for_kernel(
                Who::Trusted,
                InodeNo::ROOT,
                b"f",
                NewNode::new(0o644),
                OpenFlags::WRITE,
                true,
            )
            .unwrap();
        let staged = opened.staged.expect("a new file is staged");
        (ws, attr, opened.handle, staged)
    }

    /// A stored size read before a staged file's ingestion, laid over after it: the
    /// overlay has ended by then, and the bare stored size is the one before the write.
    #[test]
    fn attributes_read_before_an_ingestion_are_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let (ws, attr, handle, staged) = staged_f(&dir);
        std::os::unix::fs::FileExt::write_all_at(staged.file(), b"written", 0).unwrap();
        let ended = ws.inner.files.overlays_ended();
        // Not ingested while a writer has it open.
        let stored = ws.stored_attr(attr.ino).unwrap();
        assert_eq!(stored.size, 0);
        ws.release(handle).unwrap();
        ws.ingest(&staged).unwrap();
        assert_eq!(ws.overlay(stored.clone()).size, 0, "the overlay has ended");
        assert_eq!(ws.overlaid(ended, stored.clone()).unwrap().size, 7);
        let unchanged = ws.inner.files.overlays_ended();
        assert_eq!(
            ws.overlaid(unchanged, stored).unwrap().size,
            0,
            "no second look"
        );
    }

    /// The same for a buffered file committed and let go at its last close.
    #[test]
    fn attributes_read_before_a_buffered_files_release_are_read_again() {
        let ws = Workspace::open_in_memory(Options::default()).unwrap();
        let (attr, fh) = create_f(&ws);
        ws.write(fh, 0, b"written").unwrap();
        let ended = ws.inner.files.overlays_ended();
        let stored = ws.stored_attr(attr.ino).unwrap();
        assert_eq!(stored.size, 0);
        ws.release(fh).unwrap();
        assert_eq!(ws.overlay(stored.clone()).size, 0, "the overlay has ended");
        assert_eq!(ws.overlaid(ended, stored.clone()).unwrap().size, 7);
    }

    /// Another route replaces a staged file's whole content again and again while
    /// ingestions run: none stores a snapshot the replacement tore. The store holds one
    /// version or the other after each, or the empty file the replacement passes
    /// through.
    #[test]
    fn an_ingestion_stores_no_snapshot_a_replacement_tore() {
        const FILE_BYTES: usize = 1 << 20;
        const REPLACEMENTS: usize = 300;
        let dir = tempfile::tempdir().unwrap();
        let (ws, attr, handle, staged) = staged_f(&dir);
        ws.release(handle).unwrap();
        let versions = [vec![b'a'; FILE_BYTES], vec![b'b'; FILE_BYTES]];
        let stored = || {
            ws.inner
                .db
                .read(|conn| {
                    let size = store::attr(conn, attr.ino)?.size;
                    let mut buf = vec![0u8; size as usize];
                    content::read_into(conn, &ws.inner.cache, attr.ino, 0, &mut buf)?;
                    Ok(buf)
                })
                .unwrap()
        };
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..REPLACEMENTS {
                    ws.fs().write_file("/f", &versions[i % 2]).unwrap();
                }
                done.store(true, Ordering::SeqCst);
            });
            while !done.load(Ordering::SeqCst) {
                ws.ingest(&staged).unwrap();
                let now = stored();
                assert!(
                    now.is_empty() || versions.contains(&now),
                    "a torn snapshot was stored"
                );
            }
        });
    }

    #[test]
    fn acls_and_selinux_labels_are_not_kept_but_old_ones_stay_readable() {
        let ws = Workspace::open_in_memory(Options::default()).unwrap();
        let (attr, fh) = create_f(&ws);
        ws.release(fh).unwrap();
        let errno = |r: Result<Vec<u8>>| r.map_or_else(|e| e.errno(), |_| 0);
        for name in [&b"system.posix_acl_access"[..], b"security.selinux"] {
            let set = ws.setxattr(Who::Trusted, attr.ino, name, b"x", XattrSet::Any);
            assert_eq!(set.unwrap_err().errno(), libc::EOPNOTSUPP);
            assert_eq!(
                errno(ws.getxattr(Who::Trusted, attr.ino, name)),
                libc::EOPNOTSUPP
            );
        }
        assert_eq!(
            errno(ws.getxattr(Who::Trusted, attr.ino, b"user.missing")),
            libc::ENODATA
        );
        // Stored by an earlier version: read, listed and removed as before.
        let legacy = b"system.posix_acl_default";
        ws.inner.xattrs_maybe.store(true, Ordering::SeqCst);
        ws.inner
            .db
            .write(|txn| store::put_xattr(txn, attr.ino, legacy, b"old"))
            .unwrap();
        assert_eq!(ws.getxattr(Who::Trusted, attr.ino, legacy).unwrap(), b"old");
        assert_eq!(ws.listxattr(attr.ino).unwrap(), vec![legacy.to_vec()]);
        ws.removexattr(Who::Trusted, attr.ino, legacy).unwrap();
        assert_eq!(
            errno(ws.getxattr(Who::Trusted, attr.ino, legacy)),
            libc::EOPNOTSUPP
        );
    }

    #[test]
    fn a_read_into_the_callers_buffer_fills_what_a_read_returns() {
        let ws = Workspace::open_in_memory(Options::default()).unwrap();
        let (_, fh) = create_f(&ws);
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        ws.write(fh, 0, &data).unwrap();
        ws.fsync(fh, false).unwrap();
        // Buffered over the committed content, and a hole past it.
        ws.write(fh, 1000, b"dirty").unwrap();
        ws.write(fh, 400_000, b"end").unwrap();
        for (offset, size) in [
            (0, 4096),
            (990, 20),
            (299_990, 100),
            (399_999, 10),
            (500_000, 8),
        ] {
            let mut buf = vec![0xA5; size];
            let filled = ws.read_into(fh, offset, &mut buf).unwrap();
            assert_eq!(
                &buf[..filled],
                &ws.read(fh, offset, size).unwrap()[..],
                "at {offset}"
            );
            assert!(
                buf[filled..].iter().all(|&b| b == 0xA5),
                "nothing past the end"
            );
        }
        let mut at_end = [0xA5; 10];
        assert_eq!(ws.read_into(fh, 399_999, &mut at_end).unwrap(), 4);
        assert_eq!(&at_end[..4], b"\0end");
    }

    #[test]
    fn truncating_buffered_writes_releases_their_bytes() {
        let ws = Workspace::open_in_memory(Options::default()).unwrap();
        let (attr, fh) = create_f(&ws);
        ws.write(fh, 0, &[7u8; 8000]).unwrap();
        assert_eq!(dirty_total(&ws), 8000);
        let shrink = SetAttr {
            size: Some(100),
            ..Default::default()
        };
        ws.setattr(Who::Trusted, attr.ino, &shrink).unwrap();
        ws.release(fh).unwrap();
        // Nothing is buffered any more; a leak here would make every later write commit
        // at once once the leaks pass `dirty_total_bytes_max`.
        assert_eq!(dirty_total(&ws), 0);
    }

    #[test]
    fn failed_truncate_changes_nothing() {
        let ws = Workspace::open_in_memory(Options::default()).unwrap();
        let fs = ws.fs();
        let data: Vec<u8> = (0..100_000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 7) as u8)
            .collect();
        fs.write_file("/a", &data).unwrap();
        // A copy shares the blocks, so cutting one in /a needs a new block, past the quota.
        fs.copy("/a", "/b", false).unwrap();
        let stored = ws.stats().unwrap().stored_bytes;
        ws.set_quota(Quota {
            bytes_max: Some(stored),
            inodes_max: None,
        })
        .unwrap();
        let ino = fs.stat("/a").unwrap().ino;
        let fh = ws.open_file(ino, OpenFlags::READ_WRITE).unwrap();
        ws.write(fh, 90_000, b"buffered").unwrap();
        let shrink = SetAttr {
            size: Some(50_001),
            ..Default::default()
        };
        let err = ws.setattr(Who::Trusted, ino, &shrink).unwrap_err();
        assert_eq!(err.errno(), libc::ENOSPC);
        // The handle still sees the file as it was, buffered write included.
        assert_eq!(ws.getattr(ino).unwrap().size, 100_000);
        let mut expected = data.clone();
        expected[90_000..90_008].copy_from_slice(b"buffered");
        assert_eq!(ws.read(fh, 0, 200_000).unwrap(), expected);
        ws.set_quota(Quota::UNLIMITED).unwrap();
        ws.release(fh).unwrap();
        assert_eq!(fs.read_file("/a").unwrap(), expected);
        assert_eq!(dirty_total(&ws), 0);
    }
}
