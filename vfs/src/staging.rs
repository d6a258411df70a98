//! Staging: plain local files that hold the current content of files being written, so
//! the kernel can read and write them directly (FUSE passthrough) at the speed of the
//! local disk. The store stays the authority: a staged file is *ingested* (chunked,
//! hashed, stored) when its last writer closes it, once it is quiet after an fsync, and
//! after a crash.
//!
//! The staging directory must be on a disk as durable as the database's: an `fsync(2)`
//! of a staged file makes the staging file durable where it is (with its name and the
//! `staged` row that binds it), not the store, so it costs what the change costs
//! whatever the file's size; the content reaches the store later (or, after a crash, at
//! the next open).
//!
//! Life of a staging file:
//! - **pool**: empty files named `pool-N` in the staging directory, created ahead so a
//!   `create(2)` in the mount does not pay for a file creation on the local disk. Files
//!   come back to the pool (truncated) instead of being deleted; past the pool's bound
//!   they are closed and kept as spares, reopened before any new file is made.
//! - **staged**: bound to an inode. The `staged` table of the database records the
//!   binding in the same transaction that creates it, so a crash before ingestion loses
//!   nothing: the next open ingests every recorded file.
//! - **dirty**: may differ from the store. Opening for writing makes it dirty; ingesting
//!   with no writer left makes it clean.
//! - **clean**: same content as the store; kept as a cache (bounded in bytes and files)
//!   so reopening a recently written file needs no materialisation.
//!
//! Memory stays bounded whatever the file size: ingestion streams the file through the
//! chunker with a window of one maximum block.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use crate::base::lock;
use crate::error::{Error, Result};
use crate::types::{InodeNo, TimestampNs};

/// Empty files kept ready in the pool: filled at open and topped up in the background.
/// Recycled files come back beyond it (up to `POOL_RECYCLED_MAX`).
pub(crate) const POOL_LOW: usize = 64;
pub(crate) const POOL_RECYCLED_MAX: usize = 2048;
/// Every time a create finds the pool empty, the number of files the worker keeps ready
/// doubles, up to this: a create that finds no file is served through the write buffer,
/// which costs the kernel three more requests (a WRITE and two FLUSHes), and leaves no
/// file to recycle, so a pool smaller than the bursts of creates it meets would stay so.
pub(crate) const POOL_TARGET_MAX: usize = 1024;
/// Emptied files kept, closed, once the pool is full, so that the next burst of creates
/// larger than the pool reopens them instead of making new ones. On ext4 a new inode
/// can cost a millisecond where many were deleted recently (the pool's own deletions
/// included: a full npm install made 15,432 files and deleted 12,800 of them without
/// this); reopening a name costs a few microseconds. Closed, they hold no descriptor,
/// only an inode each.
pub(crate) const SPARE_MAX: usize = 16384;
/// Clean staged files up to this size leave the cache as soon as they are ingested.
pub(crate) const SMALL_CACHED_BYTES_MAX: u64 = 64 << 10;

// The pool grows from its low mark to its target, and takes recycled files past both.
const _: () = assert!(POOL_LOW <= POOL_TARGET_MAX && POOL_TARGET_MAX <= POOL_RECYCLED_MAX);

/// One staging file bound to an inode.
pub struct StagedFile {
    pub(crate) ino: InodeNo,
    /// The file name inside the staging directory.
    pub(crate) name: String,
    file: File,
    pub(crate) state: Mutex<StagedState>,
    /// Held for the whole of an ingestion: one at a time per file.
    pub(crate) ingest_serial: Mutex<()>,
}

#[derive(Debug)]
pub(crate) struct StagedState {
    /// Open handles on this file.
    pub users: u32,
    /// Open handles that may write.
    pub writers: u32,
    /// The file may differ from the store.
    pub dirty: bool,
    /// Bumped whenever the content may have changed; ingestion compares it to know
    /// whether what it stored is still current.
    pub version: u64,
    /// An ingestion is running; others wait.
    pub ingesting: bool,
    pub last_used: Instant,
    /// Bytes of the file as last ingested (for the cache bound, without a stat).
    pub size: u64,
    /// The kernel may have mapped the file into a process: it was handed over for
    /// passthrough to an open that can read. Such a mapping holds the staging file
    /// itself, not the FUSE file, so it outlives the last release; emptying the file
    /// for reuse would then SIGBUS the process (git maps its packs and closes the
    /// descriptor). Such a file goes back to the pool only if nothing has it open
    /// any more (`open_elsewhere`); otherwise it is unlinked.
    pub mappable: bool,
    /// It was handed over for passthrough to an open that reads and writes: such an
    /// open can map it shared and writable, and a process may go on writing through
    /// that mapping after its last `close(2)`, with no request the daemon would see.
    pub map_writable: bool,
    /// A handle that could write was released while such a mapping may still write to
    /// the file: counted in `writers` in the handle's place (the file stays dirty and
    /// bound, is not evicted, and a pull over it sees a local change) until no handle
    /// is open and nothing but this process holds the staging file open
    /// (`Workspace::end_mapping_if_gone`).
    pub mapped: bool,
}

impl StagedFile {
    /// The staging file, for the kernel (passthrough) and for `pread`/`pwrite`.
    pub fn file(&self) -> &File {
        &self.file
    }

    pub fn inode(&self) -> InodeNo {
        self.ino
    }

    /// Whether anything but this process has the staging file open (a mapping made
    /// through passthrough); `None` if the kernel cannot say.
    pub(crate) fn open_elsewhere(&self) -> Option<bool> {
        open_elsewhere(&self.file)
    }

    /// Size and times of the staged content as the kernel left them.
    pub(crate) fn stat(&self) -> Result<(u64, TimestampNs, TimestampNs)> {
        let meta = self
            .file
            .metadata()
            .map_err(|e| Error::io(self.name.clone(), e))?;
        let mtime = meta.mtime() * 1_000_000_000 + meta.mtime_nsec();
        let ctime = meta.ctime() * 1_000_000_000 + meta.ctime_nsec();
        Ok((meta.len(), mtime, ctime))
    }

    pub(crate) fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            match self.file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::io(self.name.clone(), e)),
            }
        }
        Ok(done)
    }

    pub(crate) fn write_at(&self, data: &[u8], offset: u64) -> Result<()> {
        self.file
            .write_all_at(data, offset)
            .map_err(|e| Error::io(self.name.clone(), e))
    }

    /// Makes the file's content durable on its disk (`fdatasync(2)`, or `fsync(2)` with
    /// its times too).
    pub(crate) fn sync(&self, datasync: bool) -> Result<()> {
        let synced = if datasync {
            self.file.sync_data()
        } else {
            self.file.sync_all()
        };
        synced.map_err(|e| Error::io(self.name.clone(), e))
    }

    /// Seconds since anything last changed the file (its ctime, which `write(2)`,
    /// truncation and a write through a mapping move, and which nobody can set back).
    pub(crate) fn quiet_for(&self) -> Result<std::time::Duration> {
        let meta = self
            .file
            .metadata()
            .map_err(|e| Error::io(self.name.clone(), e))?;
        let changed = std::time::UNIX_EPOCH
            + std::time::Duration::new(meta.ctime().max(0) as u64, meta.ctime_nsec() as u32);
        Ok(std::time::SystemTime::now()
            .duration_since(changed)
            .unwrap_or_default())
    }

    pub(crate) fn set_len(&self, size: u64) -> Result<()> {
        self.file
            .set_len(size)
            .map_err(|e| Error::io(self.name.clone(), e))
    }

    pub(crate) fn set_times(
        &self,
        atime: Option<TimestampNs>,
        mtime: Option<TimestampNs>,
    ) -> Result<()> {
        let spec = |t: Option<TimestampNs>| match t {
            Some(ns) => libc::timespec {
                tv_sec: ns.div_euclid(1_000_000_000) as libc::time_t,
                tv_nsec: ns.rem_euclid(1_000_000_000) as _,
            },
            None => libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_OMIT,
            },
        };
        let times = [spec(atime), spec(mtime)];
        // SAFETY: a valid fd and two valid timespecs.
        let rc =
            unsafe { libc::futimens(std::os::fd::AsRawFd::as_raw_fd(&self.file), times.as_ptr()) };
        if rc != 0 {
            return Err(Error::io(
                self.name.clone(),
                std::io::Error::last_os_error(),
            ));
        }
        Ok(())
    }
}

/// An empty staging file, open, not bound to any inode.
pub struct PoolFile {
    pub name: String,
    file: File,
}

/// Why a staging file left its node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Doom {
    /// The node is being deleted: if the deletion is undone, the file is the node's
    /// again.
    Deleted,
    /// Replication replaces the node's content: the file, clean, caches content that
    /// is going away, and never comes back.
    Replaced,
}

/// The staging directory and the files in it.
///
/// Lock order: `entries`, then a file's `state`, then the database writer. `entries` is
/// never held while waiting for anything else.
pub(crate) struct Staging {
    dir: PathBuf,
    pool: Mutex<Vec<PoolFile>>,
    /// How many empty files the worker keeps ready (see `POOL_TARGET_MAX`).
    pool_target: AtomicUsize,
    /// Most files the pool holds: each is an open descriptor, and a process may have
    /// few (a quarter of the soft limit at most).
    pool_max: usize,
    /// Names of emptied, closed files beyond `pool_max` (up to `SPARE_MAX`), reopened
    /// before any file is created.
    spare: Mutex<Vec<String>>,
    next_name: AtomicU64,
    /// A file was created in the directory since it was last synced: its name is not
    /// durable yet (see `sync_names`).
    names_unsynced: AtomicBool,
    pub(crate) entries: Mutex<HashMap<InodeNo, Arc<StagedFile>>>,
    /// Serialises the creation of staged files (materialisation included).
    pub(crate) create_lock: Mutex<()>,
    /// The inode whose staging file is being filled from the store (under
    /// `create_lock`, so one at most), and the signal that a fill ended (see
    /// [`Staging::begin_fill`]).
    filling: Mutex<Option<InodeNo>>,
    fill_ended: Condvar,
    /// Entries let go of by a deletion or a replacement of their content; recycled once
    /// what let go of them is durable.
    pub(crate) doomed: Mutex<Vec<(Arc<StagedFile>, Doom)>>,
    /// Doomed entries taken by the worker and not recycled yet: their space is on its
    /// way back to the disk.
    pub(crate) recycling: AtomicUsize,
    /// Bytes of clean, unused staged files kept as a cache.
    pub(crate) cache_bytes_max: u64,
    /// Clean, unused staged files kept as a cache.
    pub(crate) cache_files_max: usize,
    /// Work for the ingest worker; shared with it so it can wait without keeping the
    /// workspace alive.
    pub(crate) queue: Arc<(Mutex<IngestQueue>, Condvar)>,
    /// The ingest worker's thread and its rounds; shared with it.
    pub(crate) worker: Arc<Worker>,
}

/// The ingest worker's thread, and the fence that keeps a workspace's last handle from
/// going while a round of the worker still holds the workspace: once a caller's last
/// handle is gone, no thread of that workspace is at work, and the caller may open the
/// same database and staging directory again (two instances at work on one staging
/// directory would each take the other's files for its own).
#[derive(Default)]
pub(crate) struct Worker {
    /// Held by the worker through each round, in which it holds the workspace.
    round: Mutex<()>,
    /// Set while a round holds the workspace (from just after it took it to just after
    /// it let go).
    may_hold: AtomicBool,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    thread_id: std::sync::OnceLock<std::thread::ThreadId>,
}

impl Worker {
    pub(crate) fn started(&self, thread: std::thread::JoinHandle<()>) {
        let _ = self.thread_id.set(thread.thread().id());
        *lock(&self.thread) = Some(thread);
    }

    fn on_worker_thread(&self) -> bool {
        self.thread_id.get() == Some(&std::thread::current().id())
    }

    /// Runs one round: `work` is handed the workspace `take` gives (`None`: it is gone,
    /// or `stopped` says the worker was stopped meanwhile; the worker then ends).
    pub(crate) fn round<W>(
        &self,
        stopped: impl FnOnce() -> bool,
        take: impl FnOnce() -> Option<W>,
        work: impl FnOnce(W),
    ) -> bool {
        let _round = lock(&self.round);
        if stopped() {
            return false;
        }
        let Some(workspace) = take() else {
            return false;
        };
        // Set once the workspace is held (a handle counting it as a round's before
        // would wait when it need not), cleared once it is let go (`work` drops it).
        self.may_hold.store(true, Ordering::SeqCst);
        work(workspace);
        self.may_hold.store(false, Ordering::SeqCst);
        true
    }

    /// A handle of the workspace goes; `handles` counts the handles left, this one
    /// included. If it is the last one but a round's own, waits for that round to end,
    /// and stops the worker (`stop`) once it is the very last.
    pub(crate) fn handle_goes(&self, handles: impl Fn() -> usize, stop: impl FnOnce()) {
        if self.on_worker_thread() {
            return;
        }
        let round_holds = usize::from(self.may_hold.load(Ordering::SeqCst));
        if handles().saturating_sub(1).saturating_sub(round_holds) > 0 {
            return;
        }
        let _no_round = lock(&self.round);
        if handles() == 1 {
            stop();
        }
    }

    /// Waits for the worker thread to end (it was told to stop); not from the worker
    /// thread itself, which ends by its own once it returns.
    pub(crate) fn join(&self) {
        let thread = lock(&self.thread).take();
        if let Some(thread) = thread.filter(|_| !self.on_worker_thread()) {
            let _ = thread.join();
        }
    }
}

/// A fill under way ([`Staging::begin_fill`]); dropping it ends the fill.
pub(crate) struct FillGuard<'a> {
    staging: &'a Staging,
}

impl Drop for FillGuard<'_> {
    fn drop(&mut self) {
        *lock(&self.staging.filling) = None;
        self.staging.fill_ended.notify_all();
    }
}

#[derive(Default)]
pub(crate) struct IngestQueue {
    pub pending: Vec<InodeNo>,
    /// When the oldest pending file was queued: the worker lets files settle a moment,
    /// so short-lived files are never ingested and small ones go in together.
    pub first_queued: Option<Instant>,
    /// Work that should not wait for the delay: deleted files to recycle, an empty pool.
    pub urgent: bool,
    pub stop: bool,
}

impl Staging {
    /// Opens (creating) the staging directory. Names of files already there are
    /// returned so the caller can recover the ones the database still binds.
    pub fn open(
        dir: &Path,
        cache_bytes_max: u64,
        cache_files_max: usize,
    ) -> Result<(Staging, Vec<String>)> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir.display().to_string(), e))?;
        let mut existing = Vec::new();
        let mut highest = 0u64;
        for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir.display().to_string(), e))? {
            let entry = entry.map_err(|e| Error::io(dir.display().to_string(), e))?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if let Some(n) = name
                .strip_prefix("pool-")
                .and_then(|n| n.parse::<u64>().ok())
            {
                highest = highest.max(n);
                existing.push(name);
            }
        }
        // Every pooled and cached file is an open descriptor: together they keep to
        // three quarters of the process's limit, leaving the rest to the database,
        // the kernel connection and whatever else the process opens.
        let descriptors = descriptor_limit();
        let pool_max = POOL_RECYCLED_MAX.min(descriptors / 4).max(POOL_LOW);
        let cache_files_max = cache_files_max.min(descriptors / 2);
        let staging = Staging {
            dir: dir.to_path_buf(),
            pool: Mutex::new(Vec::new()),
            pool_target: AtomicUsize::new(POOL_LOW),
            pool_max,
            spare: Mutex::new(Vec::new()),
            next_name: AtomicU64::new(highest + 1),
            names_unsynced: AtomicBool::new(true),
            entries: Mutex::new(HashMap::new()),
            create_lock: Mutex::new(()),
            filling: Mutex::new(None),
            fill_ended: Condvar::new(),
            doomed: Mutex::new(Vec::new()),
            recycling: AtomicUsize::new(0),
            cache_bytes_max,
            cache_files_max,
            queue: Arc::new((Mutex::new(IngestQueue::default()), Condvar::new())),
            worker: Arc::default(),
        };
        Ok((staging, existing))
    }

    /// Marks `ino` as being filled from the store until the returned guard drops, which
    /// the filler lets happen only after it published the entry or gave up. The fence
    /// against other routes: a route that changes the stored content of a file first
    /// holds it (`Workspace::acquire`), then waits out a fill of it
    /// ([`Staging::wait_fill`]) and looks for its entry. A fill either saw the hold
    /// (the filler checks for one after marking) and gave up, or the route finds the
    /// entry published and writes through it: no fill copies content that a route
    /// changes in the store behind it.
    pub(crate) fn begin_fill(&self, ino: InodeNo) -> FillGuard<'_> {
        let mut filling = lock(&self.filling);
        assert!(
            filling.is_none(),
            "fills run one at a time, under create_lock"
        );
        *filling = Some(ino);
        FillGuard { staging: self }
    }

    /// Waits while `ino` is being filled.
    pub(crate) fn wait_fill(&self, ino: InodeNo) {
        let mut filling = lock(&self.filling);
        while *filling == Some(ino) {
            filling = self
                .fill_ended
                .wait(filling)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// Whether `ino` is being filled right now.
    pub(crate) fn is_filling(&self, ino: InodeNo) -> bool {
        *lock(&self.filling) == Some(ino)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Puts an existing, unbound file back in the pool (emptied).
    pub fn recycle(&self, name: String) {
        let path = self.path(&name);
        match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(file) => self.give_back(PoolFile { name, file }),
            Err(_) => {
                let _ = std::fs::remove_file(&path);
            }
        }
    }

    /// Takes in a file found in the directory at open and bound to nothing: into the
    /// pool while it has room (opened and emptied now), else as a spare by name alone,
    /// emptied when reopened, so that opening a workspace with thousands of spares costs
    /// no syscall for each.
    pub fn adopt_leftover(&self, name: String) {
        if lock(&self.pool).len() < self.pool_max {
            return self.recycle(name);
        }
        self.keep_spare(name);
    }

    /// Keeps the closed file `name` as a spare, or deletes it past `SPARE_MAX`.
    fn keep_spare(&self, name: String) {
        let mut spare = lock(&self.spare);
        if spare.len() < SPARE_MAX {
            spare.push(name);
        } else {
            drop(spare);
            let _ = std::fs::remove_file(self.path(&name));
        }
    }

    /// Returns a file to the pool, emptied; past the pool's bound it is closed and kept
    /// as a spare, past `SPARE_MAX` deleted.
    pub fn give_back(&self, pool_file: PoolFile) {
        let path = self.path(&pool_file.name);
        if pool_file.file.set_len(0).is_err() {
            let _ = std::fs::remove_file(&path);
            return;
        }
        disarm_flush_on_close(&path);
        let mut pool = lock(&self.pool);
        if pool.len() < self.pool_max {
            pool.push(pool_file);
            return;
        }
        drop(pool);
        let PoolFile { name, file } = pool_file;
        drop(file);
        self.keep_spare(name);
    }

    /// Returns the file of an entry nobody uses any more to the pool.
    pub fn recycle_staged(&self, staged: Arc<StagedFile>) {
        // Where the kernel cannot say, delete rather than reuse.
        if lock(&staged.state).mappable && staged.open_elsewhere().unwrap_or(true) {
            // A process still maps it: unlinking keeps its pages for the mapping, where
            // emptying the file for reuse would SIGBUS it.
            let _ = std::fs::remove_file(self.path(&staged.name));
            return;
        }
        match Arc::try_unwrap(staged) {
            Ok(staged) => self.give_back(PoolFile {
                name: staged.name,
                file: staged.file,
            }),
            // Someone still holds it (a lookup that lost a race): never reuse a file that
            // can still be written; delete its name and let the last holder close it.
            Err(shared) => {
                let _ = std::fs::remove_file(self.path(&shared.name));
            }
        }
    }

    /// Fills the pool up to `target` files, spares first. Run off the request path.
    pub fn refill(&self, target: usize) -> Result<()> {
        while lock(&self.pool).len() < target {
            let file = match self.reopen_spare() {
                Some(file) => file,
                None => self.create_file()?,
            };
            lock(&self.pool).push(file);
        }
        Ok(())
    }

    /// A spare opened again (and emptied, if it is a leftover with content), if one is
    /// left. One that cannot be opened means someone else emptied the directory: the
    /// others are forgotten too, so that a create never tries thousands of vanished
    /// names (opening the workspace again takes in whatever is left there).
    fn reopen_spare(&self) -> Option<PoolFile> {
        let name = lock(&self.spare).pop()?;
        let path = self.path(&name);
        let opened = OpenOptions::new().read(true).write(true).open(&path);
        let emptied = opened.and_then(|file| {
            if file.metadata()?.len() > 0 {
                file.set_len(0)?;
                disarm_flush_on_close(&path);
            }
            Ok(file)
        });
        match emptied {
            Ok(file) => Some(PoolFile { name, file }),
            Err(err) => {
                tracing::warn!("staging file {name}: {err}; forgetting the spares");
                let _ = std::fs::remove_file(&path);
                lock(&self.spare).clear();
                None
            }
        }
    }

    /// Emptied files kept closed beyond the pool.
    #[cfg(test)]
    fn spare_len(&self) -> usize {
        lock(&self.spare).len()
    }

    fn create_file(&self) -> Result<PoolFile> {
        let name = self.new_name();
        let path = self.path(&name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| Error::io(path.display().to_string(), e))?;
        // After the creation: a `sync_names` that clears the flag covers it.
        self.names_unsynced.store(true, Ordering::SeqCst);
        Ok(PoolFile { name, file })
    }

    /// Makes the names of the files created in the directory durable (`fsync(2)` of
    /// the directory), if any was created since the last time: a staging file synced
    /// under a name that a crash could take away would be lost with it.
    pub(crate) fn sync_names(&self) -> Result<()> {
        if !self.names_unsynced.swap(false, Ordering::SeqCst) {
            return Ok(());
        }
        let synced = File::open(&self.dir).and_then(|dir| dir.sync_all());
        if let Err(err) = synced {
            self.names_unsynced.store(true, Ordering::SeqCst);
            return Err(Error::io(self.dir.display().to_string(), err));
        }
        Ok(())
    }

    pub fn pool_len(&self) -> usize {
        lock(&self.pool).len()
    }

    /// How many empty files the worker should keep ready now.
    pub fn pool_target(&self) -> usize {
        self.pool_target.load(Ordering::Relaxed)
    }

    fn new_name(&self) -> String {
        format!("pool-{}", self.next_name.fetch_add(1, Ordering::SeqCst))
    }

    /// Opens the existing staging file `name` as the staged content of `ino` (recovery).
    pub fn bind_existing(&self, ino: InodeNo, name: &str, dirty: bool) -> Result<Arc<StagedFile>> {
        let path = self.path(name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| Error::io(path.display().to_string(), e))?;
        Ok(self.bind(
            ino,
            PoolFile {
                name: name.to_owned(),
                file,
            },
            dirty,
        ))
    }

    /// Makes a pool file the staged content of `ino`.
    pub fn bind(&self, ino: InodeNo, pool_file: PoolFile, dirty: bool) -> Arc<StagedFile> {
        let PoolFile { name, file } = pool_file;
        Arc::new(StagedFile {
            ino,
            name,
            file,
            state: Mutex::new(StagedState {
                users: 0,
                writers: 0,
                dirty,
                version: u64::from(dirty),
                ingesting: false,
                last_used: Instant::now(),
                size: 0,
                mappable: false,
                map_writable: false,
                mapped: false,
            }),
            ingest_serial: Mutex::new(()),
        })
    }

    /// Wakes the worker to ingest `ino`.
    pub fn enqueue(&self, ino: InodeNo) {
        let (queue, wake) = &*self.queue;
        let mut queue = lock(queue);
        queue.pending.push(ino);
        // Only the first file of a batch wakes the worker (which then waits out the
        // delay); waking it for every release would only cost context switches.
        if queue.first_queued.is_none() {
            queue.first_queued = Some(Instant::now());
            wake.notify_one();
        }
    }

    /// Wakes the worker now for housekeeping (recycling, refilling the pool).
    pub fn wake_now(&self) {
        let (queue, wake) = &*self.queue;
        lock(queue).urgent = true;
        wake.notify_one();
    }

    /// An empty file from the pool, or else a spare reopened (an open of an existing
    /// name, microseconds); never a new file, which can cost a millisecond. Finding the
    /// pool empty doubles its target and wakes the worker to refill it.
    pub fn try_reserve(&self) -> Option<PoolFile> {
        if let Some(taken) = lock(&self.pool).pop() {
            return Some(taken);
        }
        let limit = POOL_TARGET_MAX.min(self.pool_max);
        let _ = self
            .pool_target
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |target| {
                (target < limit).then(|| (target * 2).min(limit))
            });
        self.wake_now();
        self.reopen_spare()
    }

    /// Tells the worker to stop (it does once it holds no work).
    pub fn stop(&self) {
        let (queue, wake) = &*self.queue;
        lock(queue).stop = true;
        wake.notify_all();
    }

    /// Every entry, for a pass that must not hold the table while it works.
    pub fn snapshot(&self) -> Vec<Arc<StagedFile>> {
        lock(&self.entries).values().cloned().collect()
    }

    pub fn get(&self, ino: InodeNo) -> Option<Arc<StagedFile>> {
        lock(&self.entries).get(&ino).cloned()
    }

    /// Clean, unused entries beyond the cache bounds, least recently used first.
    pub fn eviction_candidates(&self) -> Vec<Arc<StagedFile>> {
        let mut clean: Vec<(Instant, u64, Arc<StagedFile>)> = Vec::new();
        let mut out_small = Vec::new();
        for staged in self.snapshot() {
            let state = lock(&staged.state);
            if state.users == 0 && !state.dirty && !state.ingesting {
                let (last_used, size) = (state.last_used, state.size);
                drop(state);
                if size <= SMALL_CACHED_BYTES_MAX {
                    // Small files are cheap to stage again and would drain the pool.
                    out_small.push(staged);
                    continue;
                }
                clean.push((last_used, size, staged));
            }
        }
        clean.sort_by_key(|(at, _, _)| *at);
        let mut bytes: u64 = clean.iter().map(|(_, size, _)| size).sum();
        let mut files = clean.len();
        let mut out = out_small;
        for (_, size, staged) in clean {
            if bytes <= self.cache_bytes_max && files <= self.cache_files_max {
                break;
            }
            bytes -= size;
            files -= 1;
            out.push(staged);
        }
        out
    }
}

/// Undoes what truncating `path` to zero armed on ext4: its "replace by truncate"
/// heuristic (`auto_da_alloc`) marks a file truncated to nothing so that the next close
/// of it starts writeback of its delayed blocks. A recycled staging file is next closed
/// by the process that writes the new file through passthrough, whose `close(2)` would
/// then submit disk I/O for a file we never asked to be durable (fsync does that). Any
/// close clears the mark, so close one now, while the file is empty and there is
/// nothing to write. On other filesystems this is an open and a close.
fn disarm_flush_on_close(path: &Path) {
    let _ = File::open(path);
}

/// Whether anything but `file` itself has the file open: a mapping made through
/// passthrough holds the kernel's own open of the staging file, which outlives the FUSE
/// file and its RELEASE. Asked of the kernel with a write lease, which it grants only
/// to the one open of a file (`fcntl(2)`, F_SETLEASE); granted, it is dropped at once.
/// `None`: the kernel cannot say (leases disabled, a file system without them).
fn open_elsewhere(file: &File) -> Option<bool> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    quiet_lease_breaks(file);
    // SAFETY: fcntl on a descriptor we own; F_SETLEASE only changes lease state.
    if unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_WRLCK) } == 0 {
        // SAFETY: as above; removing our own lease.
        unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_UNLCK) };
        return Some(false);
    }
    let refused = std::io::Error::last_os_error().raw_os_error() == Some(libc::EAGAIN);
    refused.then_some(true)
}

/// Makes a break of a lease on `file` signal nothing that would end this process. An
/// open of the file while a lease is held breaks it, and the kernel signals the holder:
/// with SIGIO by default, whose default action ends the process. Callers keep their
/// own opens away from a probe's lease; this is for anyone else's (a shell in the
/// staging directory). SIGURG is ignored unless handled.
fn quiet_lease_breaks(file: &File) {
    /// `fcntl(2)`'s command naming the signal of a file's I/O events and lease breaks
    /// (Linux's `<fcntl.h>`; the libc crate lacks it).
    const F_SETSIG: libc::c_int = 10;
    // SAFETY: fcntl on a descriptor we own; F_SETSIG only names the signal.
    unsafe {
        libc::fcntl(
            std::os::fd::AsRawFd::as_raw_fd(file),
            F_SETSIG,
            libc::SIGURG,
        )
    };
}

/// The soft limit on open files of this process (`RLIMIT_NOFILE`).
fn descriptor_limit() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid rlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return 1024;
    }
    usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_found_empty_grows_its_target() {
        let dir = tempfile::tempdir().unwrap();
        let (staging, _) = Staging::open(&dir.path().join("staging"), 0, 0).unwrap();
        assert_eq!(staging.pool_target(), POOL_LOW);
        assert!(staging.try_reserve().is_none());
        assert_eq!(staging.pool_target(), 2 * POOL_LOW);
        staging.refill(staging.pool_target()).unwrap();
        assert_eq!(staging.pool_len(), 2 * POOL_LOW);
        // Taking files that are there changes nothing.
        let taken: Vec<_> = (0..2 * POOL_LOW)
            .map(|_| staging.try_reserve().unwrap())
            .collect();
        assert_eq!(staging.pool_target(), 2 * POOL_LOW);
        // Misses double it up to the bound.
        for _ in 0..20 {
            assert!(staging.try_reserve().is_none());
        }
        assert_eq!(staging.pool_target(), POOL_TARGET_MAX.min(staging.pool_max));
        for file in taken {
            staging.give_back(file);
        }
        assert_eq!(staging.pool_len(), 2 * POOL_LOW);
    }

    /// A staging directory whose pool holds at most `pool_max` open files.
    fn bounded_staging(pool_max: usize) -> (tempfile::TempDir, PathBuf, Staging) {
        let dir = tempfile::tempdir().unwrap();
        let staging_dir = dir.path().join("staging");
        let (mut staging, _) = Staging::open(&staging_dir, 0, 0).unwrap();
        staging.pool_max = pool_max;
        (dir, staging_dir, staging)
    }

    /// Past the pool's bound, files given back are kept closed and reopened before any
    /// new one is made: a burst larger than the pool neither deletes nor creates inodes.
    #[test]
    fn files_past_the_pool_bound_are_kept_as_spares_and_reopened() {
        let (_dir, staging_dir, staging) = bounded_staging(2);
        let on_disk = || std::fs::read_dir(&staging_dir).unwrap().count();
        staging.refill(2).unwrap();
        let taken: Vec<_> = (0..2).map(|_| staging.try_reserve().unwrap()).collect();
        staging.refill(2).unwrap();
        assert_eq!(on_disk(), 4);
        for pool_file in taken {
            pool_file.file.write_all_at(b"written", 0).unwrap();
            staging.give_back(pool_file);
        }
        assert_eq!((staging.pool_len(), staging.spare_len()), (2, 2));
        assert_eq!(on_disk(), 4);

        let taken: Vec<_> = (0..2).map(|_| staging.try_reserve().unwrap()).collect();
        staging.refill(2).unwrap();
        assert_eq!((staging.pool_len(), staging.spare_len()), (2, 0));
        assert_eq!(on_disk(), 4, "spares are reopened, no file is created");
        let reopened: Vec<_> = (0..2).map(|_| staging.try_reserve().unwrap()).collect();
        for pool_file in &reopened {
            assert_eq!(pool_file.file.metadata().unwrap().len(), 0);
        }
        // A spare someone deleted is forgotten, with the others.
        for pool_file in taken.into_iter().chain(reopened).take(3) {
            staging.give_back(pool_file);
        }
        assert_eq!(staging.spare_len(), 1);
        let name = lock(&staging.spare)[0].clone();
        std::fs::remove_file(staging_dir.join(&name)).unwrap();
        let drained: Vec<_> = (0..2).map(|_| staging.try_reserve().unwrap()).collect();
        staging.refill(1).unwrap();
        assert_eq!((staging.pool_len(), staging.spare_len()), (1, 0));
        assert_ne!(lock(&staging.pool)[0].name, name);

        // A create that finds the pool empty takes a spare rather than no file.
        for pool_file in drained {
            staging.give_back(pool_file);
        }
        assert_eq!((staging.pool_len(), staging.spare_len()), (2, 1));
        let spare = lock(&staging.spare)[0].clone();
        let _pool: Vec<_> = (0..2).map(|_| staging.try_reserve().unwrap()).collect();
        assert_eq!(staging.try_reserve().unwrap().name, spare);
        assert!(staging.try_reserve().is_none());
    }

    /// Leftovers found at open fill the pool first (emptied then); the rest become spares
    /// by name, emptied only when reopened.
    #[test]
    fn leftovers_past_the_pool_are_emptied_when_reopened() {
        let (_dir, staging_dir, staging) = bounded_staging(1);
        for name in ["pool-8", "pool-9"] {
            std::fs::write(staging_dir.join(name), b"left by a crash").unwrap();
        }
        staging.adopt_leftover("pool-8".into());
        staging.adopt_leftover("pool-9".into());
        assert_eq!((staging.pool_len(), staging.spare_len()), (1, 1));
        let size = |name: &str| std::fs::metadata(staging_dir.join(name)).unwrap().len();
        assert_eq!(
            (size("pool-8"), size("pool-9")),
            (0, 15),
            "the spare is not touched"
        );
        assert_eq!(staging.try_reserve().unwrap().name, "pool-8");
        let spare = staging.try_reserve().unwrap();
        assert_eq!(spare.name, "pool-9");
        assert_eq!(spare.file.metadata().unwrap().len(), 0);
    }

    /// Another open of a file while this process holds a lease on it breaks the lease;
    /// the signal that says so must not end the process (SIGIO would: the test binary
    /// would die here).
    #[test]
    fn a_broken_lease_does_not_end_the_process() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leased");
        std::fs::write(&path, b"x").unwrap();
        let held = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        quiet_lease_breaks(&held);
        let fd = std::os::fd::AsRawFd::as_raw_fd(&held);
        // SAFETY: fcntl on a descriptor this test owns.
        assert_eq!(
            unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_WRLCK) },
            0
        );
        let breaking = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path);
        let refused = breaking.unwrap_err().raw_os_error();
        assert_eq!(refused, Some(libc::EWOULDBLOCK), "the open broke the lease");
        // SAFETY: as above.
        unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_UNLCK) };
        std::thread::sleep(std::time::Duration::from_millis(50));
    }

    /// A file that was handed out mappable goes back to the pool only once nothing maps
    /// it: a mapping of this process stands for one made through passthrough (both hold
    /// an open of the staging file of their own).
    #[test]
    fn mappable_files_are_reused_only_when_nothing_maps_them() {
        let dir = tempfile::tempdir().unwrap();
        let (staging, _) = Staging::open(&dir.path().join("staging"), 0, 0).unwrap();
        let content = vec![b'x'; 8192];
        let bound = |ino: u64| {
            staging.refill(1).unwrap();
            let staged = staging.bind(InodeNo(ino), staging.try_reserve().unwrap(), true);
            staged.file().write_all_at(&content, 0).unwrap();
            lock(&staged.state).mappable = true;
            staged
        };

        let unmapped = bound(10);
        let name = unmapped.name.clone();
        // A reader came and went, as `cat` through passthrough.
        drop(File::open(staging.path(&name)).unwrap());
        let before = staging.pool_len();
        staging.recycle_staged(unmapped);
        assert_eq!(staging.pool_len(), before + 1, "an unmapped file is reused");
        assert!(staging.path(&name).exists());

        let mapped = bound(11);
        let name = mapped.name.clone();
        let reader = File::open(staging.path(&name)).unwrap();
        // SAFETY: a private read-only mapping of a file we own, unmapped below.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                content.len(),
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                std::os::fd::AsRawFd::as_raw_fd(&reader),
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED);
        drop(reader);
        let before = staging.pool_len();
        staging.recycle_staged(mapped);
        assert_eq!(staging.pool_len(), before, "a mapped file is not reused");
        assert!(!staging.path(&name).exists(), "its name is gone");
        // SAFETY: the mapping made above, still valid: the pages outlive the name.
        let mapped_bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, content.len()) };
        assert_eq!(mapped_bytes, &content[..]);
        // SAFETY: unmapping what was mapped above.
        unsafe { libc::munmap(addr, content.len()) };
    }
}
