//! The SQLite database: schema, connections, transactions.
//!
//! One writer connection behind a mutex and a pool of reader connections. In WAL mode
//! readers never block the writer nor each other, so threads serving reads run in
//! parallel while one mutation commits. Each mutation is one `BEGIN IMMEDIATE`
//! transaction that takes the next revision; a long busy timeout absorbs other processes
//! (the CLI against a mounted workspace) so SQLITE_BUSY does not reach callers.
//!
//! This module owns the SQL schema; docs/STORAGE.md explains it.

mod disk_room;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use rusqlite::config::DbConfig;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};

use crate::chunker::ChunkSizes;
use crate::compact::{self, CompactProgress, CompactReport};
use crate::error::{Error, ErrorPath, Result, StorageContext};
use crate::types::{FileKind, Quota, Revision};
use disk_room::{DiskRoom, METADATA_BYTES_PER_MUTATION};

/// A node's kind as the `kind` column of `nodes` holds it.
pub(crate) fn kind_code(kind: FileKind) -> i64 {
    match kind {
        FileKind::File => 1,
        FileKind::Directory => 2,
        FileKind::Symlink => 3,
        FileKind::Fifo => 4,
        FileKind::Socket => 5,
        FileKind::CharDevice => 6,
        FileKind::BlockDevice => 7,
    }
}

pub(crate) fn kind_from_code(code: i64) -> Result<FileKind> {
    Ok(match code {
        1 => FileKind::File,
        2 => FileKind::Directory,
        3 => FileKind::Symlink,
        4 => FileKind::Fifo,
        5 => FileKind::Socket,
        6 => FileKind::CharDevice,
        7 => FileKind::BlockDevice,
        other => return Err(Error::corrupt(format!("unknown node kind {other}"))),
    })
}

/// The schema version this code writes. Opening a database of another version fails.
pub const SCHEMA_VERSION: i64 = 3;

const SCHEMA: &str = r#"
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value ANY
);
CREATE TABLE state (
    id            INTEGER PRIMARY KEY CHECK (id = 1),
    revision      INTEGER NOT NULL,
    stored_bytes  INTEGER NOT NULL,
    node_count    INTEGER NOT NULL,
    next_ino      INTEGER NOT NULL,
    next_cookie   INTEGER NOT NULL,
    next_block    INTEGER NOT NULL,
    quota_bytes   INTEGER,
    quota_inodes  INTEGER
);
CREATE TABLE nodes (
    ino       INTEGER PRIMARY KEY,
    kind      INTEGER NOT NULL,
    perm      INTEGER NOT NULL,
    uid       INTEGER NOT NULL,
    gid       INTEGER NOT NULL,
    nlink     INTEGER NOT NULL,
    size      INTEGER NOT NULL,
    atime     INTEGER NOT NULL,
    mtime     INTEGER NOT NULL,
    ctime     INTEGER NOT NULL,
    rdev      INTEGER NOT NULL DEFAULT 0,
    target    BLOB,
    revision  INTEGER NOT NULL
);
CREATE INDEX nodes_by_revision ON nodes (revision);
CREATE TABLE dirents (
    cookie    INTEGER PRIMARY KEY,
    parent    INTEGER NOT NULL,
    name      BLOB NOT NULL,
    ino       INTEGER NOT NULL,
    revision  INTEGER NOT NULL
);
CREATE UNIQUE INDEX dirents_by_name ON dirents (parent, name);
CREATE INDEX dirents_by_parent ON dirents (parent, cookie);
CREATE INDEX dirents_by_ino ON dirents (ino);
CREATE TABLE blocks (
    id          INTEGER PRIMARY KEY,
    hash        BLOB NOT NULL UNIQUE,
    refcount    INTEGER NOT NULL,
    raw_len     INTEGER NOT NULL,
    codec       INTEGER NOT NULL,
    stored_len  INTEGER NOT NULL
);
CREATE TABLE block_data (
    id    INTEGER PRIMARY KEY,
    data  BLOB NOT NULL
);
CREATE TABLE extents (
    ino       INTEGER NOT NULL,
    offset    INTEGER NOT NULL,
    len       INTEGER NOT NULL,
    block     INTEGER NOT NULL,
    PRIMARY KEY (ino, offset)
) WITHOUT ROWID;
CREATE TABLE xattrs (
    ino    INTEGER NOT NULL,
    name   BLOB NOT NULL,
    value  BLOB NOT NULL,
    PRIMARY KEY (ino, name)
) WITHOUT ROWID;
CREATE TABLE tombstones (
    revision  INTEGER NOT NULL,
    path      BLOB NOT NULL
);
CREATE INDEX tombstones_by_revision ON tombstones (revision);
CREATE TABLE staged (
    ino   INTEGER PRIMARY KEY,
    file  TEXT NOT NULL
);
"#;

/// The audit trail (`audit.rs`): added after version 3 without a version of its own,
/// created when a writer opens the database; older builds ignore it.
const AUDIT_TABLE: &str = r#"
CREATE TABLE IF NOT EXISTS audit (
    seq     INTEGER PRIMARY KEY,
    at_ms   INTEGER NOT NULL,
    kind    TEXT NOT NULL,
    subject TEXT NOT NULL,
    body    TEXT NOT NULL
);
"#;

/// The tables replication added (schema version 2): peers and their cursors, the
/// revisions that hold their batches, how far their changes were applied as of each of
/// our revisions, blocks held ahead of their entries. A version 1 database gains
/// them when opened for writing.
const REPLICATION_TABLES: &str = r#"
CREATE TABLE peers (
    peer           TEXT PRIMARY KEY,
    replica_id     TEXT NOT NULL,
    delivered_rev  INTEGER NOT NULL,
    delivered_path BLOB NOT NULL,
    applied_rev    INTEGER NOT NULL,
    applied_path   BLOB NOT NULL
);
CREATE TABLE received (
    revision INTEGER PRIMARY KEY,
    peer     TEXT NOT NULL
);
CREATE INDEX received_by_peer ON received (peer, revision);
CREATE TABLE applied_through (
    peer         TEXT NOT NULL,
    revision     INTEGER NOT NULL,
    through_rev  INTEGER NOT NULL,
    through_path BLOB NOT NULL,
    PRIMARY KEY (peer, revision)
) WITHOUT ROWID;
CREATE TABLE loose_blocks (
    id INTEGER PRIMARY KEY,
    at INTEGER NOT NULL
);
"#;

/// The indexes that let the change log be read a revision at a time (schema version
/// 3, `log.rs`): entries by the revision that made them, removals by path. A version 2
/// database gains them when opened for writing (building them reads each table once).
const LOG_INDEXES: &str = r#"
CREATE INDEX IF NOT EXISTS dirents_by_revision ON dirents (revision);
CREATE INDEX IF NOT EXISTS tombstones_by_path ON tombstones (path, revision);
"#;

/// How to open a database.
#[derive(Clone, Debug)]
pub struct DbOptions {
    /// Commit mutations in batches, at most this long after the first (`None`: each
    /// mutation commits before it returns).
    pub commit_delay: Option<Duration>,
    pub create: bool,
    pub read_only: bool,
    pub chunk_sizes: ChunkSizes,
    pub reader_pool_max: usize,
    /// Bytes of the database's disk held for commits (see `disk_room.rs`); 0: none.
    /// Used only with `commit_delay`.
    pub disk_reserve_bytes: u64,
    /// No other process writes the database while it is open here (the caller holds
    /// its owner lock); see [`ReadMode`]. With `commit_delay`, reads then hold their
    /// transaction between them (`Writer::read`).
    pub no_other_writer: bool,
    /// A bulk load by a process that holds the database alone (see
    /// [`crate::Options::bulk_load`]): commits go through a rollback journal.
    pub bulk_load: bool,
}

/// How the connections of a read-only database read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReadMode {
    /// Beside a possible writer, through the write-ahead log and its shared-memory
    /// index, which SQLite creates beside the database (`-wal`, `-shm`) if missing.
    Shared,
    /// As a file nobody changes (SQLite's `immutable`): no locks, no log, nothing
    /// created beside it. Chosen when the log holds nothing and nobody writes the
    /// database meanwhile: the caller holds its owner lock, or its directory cannot be
    /// written by this user and no writer is at work (a writer in WAL mode keeps the
    /// log's index, `-shm`, beside the database while it runs, even with the log
    /// emptied by a checkpoint).
    Immutable,
}

impl ReadMode {
    fn of(path: &Path, no_other_writer: bool) -> Result<ReadMode> {
        let wal_bytes = match std::fs::metadata(wal_path(path)) {
            Ok(meta) => meta.len(),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => 0,
            Err(err) => return Err(Error::io(wal_path(path).display().to_string(), err)),
        };
        let beside = Beside {
            wal_bytes,
            index_exists: sibling(path, "-shm").exists(),
            dir_writable: dir_is_writable(path),
        };
        ReadMode::choose(beside, no_other_writer)
    }

    /// The mode for a database with `beside` it, `no_other_writer` if the caller holds
    /// its owner lock.
    fn choose(beside: Beside, no_other_writer: bool) -> Result<ReadMode> {
        let Beside {
            wal_bytes,
            index_exists,
            dir_writable,
        } = beside;
        if wal_bytes > 0 && !dir_writable && !index_exists {
            // SQLite needs the log's index to read the log, and cannot make one here.
            return Err(Error::UnreadableLog(ErrorPath::none()));
        }
        // Beside a writer whose log is empty (checkpointed), SQLite reads the index it
        // keeps even where this user cannot write it.
        let unwritten = no_other_writer || (!dir_writable && !index_exists);
        Ok(if wal_bytes == 0 && unwritten {
            ReadMode::Immutable
        } else {
            ReadMode::Shared
        })
    }

    /// Opens a read-only connection to `path` in this mode.
    fn connect(self, path: &Path) -> rusqlite::Result<Connection> {
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        match self {
            ReadMode::Shared => Connection::open_with_flags(path, flags),
            ReadMode::Immutable => Connection::open_with_flags(
                format!("file:{}?immutable=1", uri_escaped(path)),
                flags | OpenFlags::SQLITE_OPEN_URI,
            ),
        }
    }
}

/// What lies beside a database file when a reader opens it.
#[derive(Clone, Copy, Debug)]
struct Beside {
    /// The size of its log (`-wal`), 0 if there is none.
    wal_bytes: u64,
    /// Whether the log's index (`-shm`) exists.
    index_exists: bool,
    /// Whether this user can create files in its directory.
    dir_writable: bool,
}

/// Whether files can be created in the directory holding `path` (false on read-only
/// media, and in a directory this user may not write).
fn dir_is_writable(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let Ok(dir) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `dir` is a NUL-terminated path that outlives the call.
    unsafe { libc::access(dir.as_ptr(), libc::W_OK) == 0 }
}

/// `path` as the path of a `file:` URI: every byte but unreserved ones and `/`
/// percent-encoded (a `?` or `#` in a name would otherwise end the path).
fn uri_escaped(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut out = String::new();
    for &byte in path.as_os_str().as_bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                out.push(byte as char)
            }
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

/// Checkpoint the WAL into the database file once it holds this much.
pub(crate) const WAL_CHECKPOINT_BYTES: u64 = 32 << 20;
/// The write-ahead log's file is cut back to this when the log starts over.
const WAL_KEPT_BYTES: u64 = 2 * WAL_CHECKPOINT_BYTES;
/// Past this, the writer itself checkpoints before going on: the bound on the WAL when
/// the checkpointer cannot keep up (long readers, a flood of writes).
const WAL_BYTES_MAX: u64 = 1 << 30;
/// The writer looks at the WAL size every this many commits.
const WAL_CHECK_EVERY_COMMITS: u64 = 256;

// The background checkpoint runs before the log is cut back, and both long before the
// writer must checkpoint itself.
const _: () = assert!(WAL_CHECKPOINT_BYTES < WAL_KEPT_BYTES && WAL_KEPT_BYTES < WAL_BYTES_MAX);

pub(crate) struct Db {
    // Field order is drop order: readers and the checkpointer close before the writer,
    // so the writer is the last connection and checkpoints the WAL away at close.
    readers: Option<Mutex<Vec<Connection>>>,
    // Held for its Drop, which stops and joins the thread.
    _checkpointer: Option<Checkpointer>,
    _committer: Option<Committer>,
    /// Reads on the writer hold their transaction between them (see [`Writer::read`]):
    /// batching, with a committer to end an idle one, and no other writer.
    hold_reads: bool,
    writer: Arc<Mutex<Writer>>,
    /// With `Some`, mutations share a transaction committed at most this late (see
    /// `DbOptions::commit_delay`).
    commit_delay: Option<Duration>,
    path: Option<PathBuf>,
    read_only: bool,
    /// How reader connections open (and the writer, when `read_only`).
    read_mode: ReadMode,
    reader_pool_max: usize,
    progress: Arc<CommitProgress>,
    /// Asks for deleted files' space to be given back; true if some is on its way
    /// (`Workspace::room_maker`). Called when the disk runs short of room.
    room_maker: OnceLock<RoomMaker>,
    /// When a mutation last waited for room (see `ROOM_WAIT_EVERY`).
    room_waited_at: Mutex<Option<Instant>>,
}

pub(crate) type RoomMaker = Box<dyn Fn() -> bool + Send + Sync>;

/// Longest a mutation waits for deleted files' space when the disk is short of room.
const ROOM_WAIT_MAX: Duration = Duration::from_millis(500);
/// After a wait for room, mutations go on without one for this long: the wait is for a
/// create after a large `rm`, and must not slow an `rm -r` of many small files (each
/// unlink finding the disk still short) to the pace of the worker's rounds.
const ROOM_WAIT_EVERY: Duration = Duration::from_secs(1);

/// The writer connection and the batch of mutations it holds uncommitted, if any.
pub(crate) struct Writer {
    // Field order is drop order: the ballast goes first, so the checkpoint at close has
    // the room it held.
    /// Room kept on the database's disk for commits; `None` unless batching on a file
    /// with a reserve.
    room: Option<DiskRoom>,
    conn: Connection,
    batch: Option<Batch>,
    /// When the read transaction this connection holds between reads began, if it holds
    /// one (see [`Writer::read`]).
    held_read: Option<Instant>,
    /// Set when a storage failure undid answered mutations (why, for the log and the
    /// error): from then on every mutation fails, see `Error::Halted`.
    halted: Option<String>,
    /// Commits go through a rollback journal (`DbOptions::bulk_load`) until this
    /// closes, which puts the database back in WAL mode.
    bulk_load: bool,
    /// Shared with the `Db`, which reads it without this writer's lock.
    progress: Arc<CommitProgress>,
}

/// How far mutations, commits and syncs have come, readable without the writer's lock:
/// an fsync that finds every finished mutation committed and synced neither waits for a
/// mutation in progress (an ingestion storing a batch of blocks holds the writer for
/// milliseconds) nor flushes the disk for nothing. Written under the writer's lock, but
/// `synced`, which is written after a sync.
#[derive(Debug)]
struct CommitProgress {
    /// Mutations that have finished, done or undone.
    finished: AtomicU64,
    /// `finished` as of the last commit: every mutation up to it is committed.
    committed_through: AtomicU64,
    /// Transactions that may have been committed: batches, and maintenance run on the
    /// writer (`with_writer`) whether or not it committed anything. Starts at 1: what an
    /// earlier process committed may not be synced yet.
    commits: AtomicU64,
    /// `commits` as of the last sync of the database's files that finished.
    synced: AtomicU64,
}

impl Default for CommitProgress {
    fn default() -> CommitProgress {
        CommitProgress {
            finished: AtomicU64::new(0),
            committed_through: AtomicU64::new(0),
            commits: AtomicU64::new(1),
            synced: AtomicU64::new(0),
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // The last connection (the committer, which commits the last batch, and the
        // readers are gone): back to WAL mode, which every other open expects. If this
        // fails, or never runs (a crash), the next open that writes does it.
        if self.bulk_load && self.batch.is_none() {
            if let Err(err) = self.conn.execute_batch(LEAVE_BULK_LOAD) {
                tracing::warn!("leaving bulk-load mode: {err}");
            }
        }
    }
}

struct Batch {
    started: Instant,
    mutations: u32,
    /// Block data the batch's mutations stored, freed or not since: what its commit
    /// will write (see `Batch::pending_bytes`). A file rewritten in place frees as much
    /// as it stores, but the new pages still go to the WAL.
    written: u64,
    /// The `state` row as of the last mutation: inside a batch nobody else writes it,
    /// so it is read once per batch, not once per mutation.
    state: StateRow,
    /// `state` is newer than the row in the database. The row is written before the
    /// batch commits and before a read of the counters (`Db::read_counted`), not by
    /// every mutation: a burst of creates and lookups, or an `rm` of many files, writes
    /// it once, and outside their savepoints, which would each copy its page first.
    state_unwritten: bool,
}

impl Batch {
    /// About how much the commit of this batch will write: its new block data and a
    /// page or so of metadata per mutation.
    fn pending_bytes(&self) -> u64 {
        self.written
            .saturating_add(u64::from(self.mutations) * METADATA_BYTES_PER_MUTATION)
    }

    /// Writes the counters back to the `state` row if a mutation changed them since.
    fn write_state(&mut self, conn: &Connection) -> Result<()> {
        if self.state_unwritten {
            write_state(conn, &self.state)?;
            self.state_unwritten = false;
        }
        Ok(())
    }
}

/// Longest a read transaction is held between reads (see [`Writer::read`]), give or
/// take half a commit delay: the committer ends it at its next look.
const HELD_READ_MAX: Duration = Duration::from_millis(20);

/// Mutations in one batch at most, whatever the delay.
const BATCH_MUTATIONS_MAX: u32 = 4096;
/// A batch that wrote this much block data commits at once, whatever the delay. It
/// keeps the batch well inside the page cache (`PAGE_CACHE_BYTES`), so SQLite writes
/// nothing of it before COMMIT and a failing disk meets it there, not halfway through a
/// later mutation; and it bounds what the disk reserve must leave room for.
const BATCH_STORED_BYTES_MAX: u64 = 4 << 20;

/// SQLite's page cache per connection (`cache_size`).
const PAGE_CACHE_BYTES: u64 = 16 << 20;

// "Well inside": a batch's block data takes at most a quarter of the page cache.
const _: () = assert!(BATCH_STORED_BYTES_MAX * 4 <= PAGE_CACHE_BYTES);

impl Writer {
    fn new(conn: Connection, room: Option<DiskRoom>, bulk_load: bool) -> Writer {
        Writer {
            conn,
            batch: None,
            held_read: None,
            room,
            halted: None,
            bulk_load,
            progress: Arc::default(),
        }
    }

    /// Opens a batch (a transaction) if none is open.
    fn begin_batch(&mut self) -> Result<()> {
        if self.batch.is_some() {
            return Ok(());
        }
        self.end_read();
        self.conn
            .execute_batch("BEGIN IMMEDIATE")
            .ctx("starting a write")?;
        let state = match read_state(&self.conn) {
            Ok(state) => state,
            Err(err) => {
                let _ = self.conn.execute_batch("ROLLBACK");
                return Err(err);
            }
        };
        self.batch = Some(Batch {
            started: Instant::now(),
            mutations: 0,
            written: 0,
            state,
            state_unwritten: false,
        });
        Ok(())
    }

    /// Runs `f` on this connection: inside the open batch if there is one (which only
    /// this connection sees), else inside the read transaction it holds between reads,
    /// begun if none is.
    ///
    /// Beginning and ending a read transaction takes SQLite's shared-memory locks
    /// (`fcntl(2)` each) and a look at the log's header: about half of what a small read
    /// such as an OPEN's costs. Holding one across reads is safe where nothing but this
    /// connection writes the database (`hold`: the caller holds the owner lock, see
    /// `DbOptions::no_other_writer`): the transaction ends before every batch begins
    /// ([`Writer::begin_batch`]), so it always sees the latest state. It ends too before
    /// anything else uses the connection ([`Writer::commit_batch`], which maintenance
    /// calls first) and once it is `HELD_READ_MAX` old ([`Committer`]): a reader at the
    /// log's end does not hold back a checkpoint's copying, but would keep the log from
    /// starting over. Otherwise (`hold` false) every read is its own transaction.
    fn read<T>(
        &mut self,
        counted: bool,
        hold: bool,
        f: impl FnOnce(&Connection) -> Result<T>,
    ) -> Result<T> {
        if let Some(conn) = self.batch_conn(counted)? {
            return f(conn);
        }
        if !hold {
            return in_read_txn(&self.conn, f);
        }
        if self.held_read.is_none() {
            run_cached(&self.conn, "BEGIN").ctx("starting a read")?;
            self.held_read = Some(Instant::now());
        }
        let out = f(&self.conn);
        if out.is_err() {
            self.end_read();
        }
        out
    }

    /// Ends the read transaction held between reads, if one is.
    fn end_read(&mut self) {
        if self.held_read.take().is_some() && !self.conn.is_autocommit() {
            if let Err(err) = run_cached(&self.conn, "COMMIT") {
                tracing::debug!("ending a read failed: {err}");
                let _ = self.conn.execute_batch("ROLLBACK");
            }
        }
    }

    /// The connection, to read inside the open batch (which only it sees), with the
    /// `state` row brought up to date if `counted`; `None` if no batch is open.
    fn batch_conn(&mut self, counted: bool) -> Result<Option<&Connection>> {
        match &mut self.batch {
            Some(batch) => {
                if counted {
                    batch.write_state(&self.conn)?;
                }
                Ok(Some(&self.conn))
            }
            None => Ok(None),
        }
    }

    fn commit_batch(&mut self) -> Result<()> {
        self.end_read();
        if let Some(mut batch) = self.batch.take() {
            if let Some(room) = &mut self.room {
                room.before_commit(batch.pending_bytes());
            }
            let committed = batch
                .write_state(&self.conn)
                .and_then(|()| self.conn.execute_batch("COMMIT").ctx("committing"));
            if let Err(err) = committed {
                let _ = self.conn.execute_batch("ROLLBACK");
                if batch.mutations > 0 {
                    self.halt(batch.mutations, &err);
                }
                return Err(err);
            }
            let progress = &self.progress;
            progress.commits.fetch_add(1, Ordering::SeqCst);
            let finished = progress.finished.load(Ordering::SeqCst);
            progress.committed_through.store(finished, Ordering::SeqCst);
            if let Some(room) = &mut self.room {
                room.committed(batch.pending_bytes());
                if room.wants_checkpoint(|| logical_bytes(&self.conn)) {
                    // Copied into the database now, the WAL can start over at the next
                    // batch instead of growing into the last of the disk; the
                    // background checkpointer looks only every 200 ms.
                    if let Err(err) = self.conn.execute_batch("PRAGMA wal_checkpoint(PASSIVE)") {
                        tracing::debug!("checkpoint on a short disk failed: {err}");
                    }
                }
            }
        }
        Ok(())
    }

    /// Undoes the mutation in progress, which failed with `cause` (or panicked): back
    /// to its savepoint, so that the batch's other mutations stay; or, without batching
    /// or if SQLite already rolled back the whole transaction (a full disk, an I/O
    /// error), the whole transaction, halting the writer if it held answered ones.
    fn undo_mutation(&mut self, batching: bool, cause: &Error) {
        let undone = !self.conn.is_autocommit()
            && run_cached(&self.conn, "ROLLBACK TO mutation")
                .and_then(|()| run_cached(&self.conn, "RELEASE mutation"))
                .is_ok();
        if batching && undone {
            return;
        }
        // Nothing else is in the transaction without batching; with it, a failed undo
        // leaves no choice.
        let lost = self.batch.take().map_or(0, |batch| batch.mutations);
        let _ = self.conn.execute_batch("ROLLBACK");
        if lost > 0 {
            self.halt(lost, cause);
        }
    }

    /// `lost` answered mutations were undone by `cause`. Going on would build on a state
    /// the kernel and every caller believe gone (the inode numbers of the lost creates
    /// would even be handed out again), so the writer takes no more changes.
    fn halt(&mut self, lost: u32, cause: &Error) {
        let why = format!("a storage failure undid {lost} answered change(s) ({cause})");
        tracing::error!("{why}; the workspace takes no more changes until it is reopened");
        self.halted.get_or_insert(why);
    }

    /// Whether the disk is nearly down to its reserve (see `disk_room.rs`).
    fn room_is_short(&mut self) -> bool {
        let pending = self.batch.as_ref().map_or(0, Batch::pending_bytes);
        self.room
            .as_mut()
            .is_some_and(|room| room.is_short(pending))
    }

    fn refuse_if_halted(&self) -> Result<()> {
        match &self.halted {
            Some(why) => Err(Error::halted(why.clone())),
            None => Ok(()),
        }
    }
}

/// A thread that commits the open batch once it is `commit_delay` old.
struct Committer {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Committer {
    fn start(writer: Arc<Mutex<Writer>>, delay: Duration) -> Result<Committer> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let signal = stop.clone();
        let thread = std::thread::Builder::new()
            .name("vfs-commit".into())
            .spawn(move || {
                let (stopped, wake) = &*signal;
                let mut done = stopped.lock().unwrap_or_else(|e| e.into_inner());
                while !*done {
                    done = wake
                        .wait_timeout(done, delay / 2)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                    let mut w = writer.lock().unwrap_or_else(|e| e.into_inner());
                    let due = w
                        .batch
                        .as_ref()
                        .is_some_and(|b| b.started.elapsed() >= delay);
                    if due && !*done {
                        // A failure halts the writer, which reports it to every caller.
                        let _ = w.commit_batch();
                    }
                    if w.held_read
                        .is_some_and(|began| began.elapsed() >= HELD_READ_MAX)
                    {
                        w.end_read();
                    }
                }
                // Stopped: the open batch commits now. This runs even when the stop came
                // before the thread first looked at it (a command shorter than a
                // scheduling slice, on a busy machine), which inside the loop it did not.
                let mut w = writer.lock().unwrap_or_else(|e| e.into_inner());
                if let Err(err) = w.commit_batch() {
                    tracing::error!("the last batch of changes did not commit at close: {err}");
                }
            })
            .map_err(|e| Error::io("commit thread", e))?;
        Ok(Committer {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        let (stopped, wake) = &*self.stop;
        *stopped.lock().unwrap_or_else(|e| e.into_inner()) = true;
        wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A thread that copies the WAL into the database file in the background, so no commit
/// pays for a checkpoint (and its fsyncs).
struct Checkpointer {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Checkpointer {
    fn start(path: &Path, writer: Arc<Mutex<Writer>>) -> Result<Checkpointer> {
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .ctx("opening the checkpointer")?;
        configure(&conn, false)?;
        let wal = wal_path(path);
        let db_path = path.to_path_buf();
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let signal = stop.clone();
        let thread = std::thread::Builder::new()
            .name("vfs-checkpoint".into())
            .spawn(move || {
                crate::base::background_priority();
                let (stopped, wake) = &*signal;
                let mut done = stopped.lock().unwrap_or_else(|e| e.into_inner());
                while !*done {
                    let (guard, _) = wake
                        .wait_timeout(done, Duration::from_millis(200))
                        .unwrap_or_else(|e| e.into_inner());
                    done = guard;
                    if *done {
                        break;
                    }
                    let size = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
                    let free = disk_room::free_bytes(&wal).ok();
                    // Where the free space is unknown, nothing says the checkpoint
                    // cannot fit.
                    if size >= checkpoint_threshold(free, size)
                        && free.is_none_or(|free| {
                            checkpoint_fits(&db_path, logical_bytes(&conn), free)
                        })
                    {
                        drop(done);
                        if let Err(err) = conn.execute_batch("PRAGMA wal_checkpoint(PASSIVE)") {
                            tracing::warn!("background checkpoint failed: {err}");
                        }
                        done = stopped.lock().unwrap_or_else(|e| e.into_inner());
                    }
                    drop(done);
                    give_back_free_pages(&writer);
                    done = stopped.lock().unwrap_or_else(|e| e.into_inner());
                }
            })
            .map_err(|e| Error::io("checkpointer thread", e))?;
        Ok(Checkpointer {
            stop,
            thread: Some(thread),
        })
    }
}

/// One bounded step of giving deleted content's space back (`compact.rs`), when much of
/// the file is free and the writer is idle: never while a mutation holds the writer or a
/// batch is open (the step would wait for it, or it for the step), nor on a disk short
/// of room (a step writes the pages it moves to the log first).
fn give_back_free_pages(writer: &Mutex<Writer>) {
    let Ok(mut w) = writer.try_lock() else {
        return;
    };
    if w.batch.is_some() || w.halted.is_some() || w.room_is_short() {
        return;
    }
    let stepped = compact::wants_background_step(&w.conn).and_then(|wanted| {
        if wanted {
            w.end_read();
            compact::step(&w.conn)
        } else {
            Ok(0)
        }
    });
    match stepped {
        Ok(0) => {}
        Ok(pages) => {
            tracing::debug!("gave {pages} free pages back to the file system");
            // The file is cut short when the log is copied into it: at the end of a
            // run, copy it now rather than at the next large write.
            if !compact::wants_background_step(&w.conn).unwrap_or(true) {
                if let Err(err) = w.conn.execute_batch("PRAGMA wal_checkpoint(PASSIVE)") {
                    tracing::debug!("checkpoint after giving pages back failed: {err}");
                }
            }
        }
        Err(err) => tracing::debug!("giving free pages back failed: {err}"),
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        let (stopped, wake) = &*self.stop;
        *stopped.lock().unwrap_or_else(|e| e.into_inner()) = true;
        wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Copies the whole write-ahead log into the database and empties its file, waiting (at
/// most `EMPTY_WAL_WAIT`) for a checkpoint another connection is running to end first.
/// Returns whether it was emptied: a reader that holds an old snapshot past the wait
/// keeps it (the next checkpoint takes it up).
pub(crate) fn empty_wal(conn: &Connection) -> Result<bool> {
    const EMPTY_WAL_WAIT: Duration = Duration::from_secs(10);
    let started = Instant::now();
    loop {
        let busy: i64 = conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| row.get(0))
            .ctx("emptying the write-ahead log")?;
        if busy == 0 {
            return Ok(true);
        }
        if started.elapsed() >= EMPTY_WAL_WAIT {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The database's size as of the last commit (what a checkpoint makes the file), or 0.
fn logical_bytes(conn: &Connection) -> u64 {
    let pragma = |name: &str| -> u64 {
        conn.query_row(&format!("PRAGMA {name}"), [], |row| row.get::<_, i64>(0))
            .map_or(0, |v| v.max(0) as u64)
    };
    pragma("page_count").saturating_mul(pragma("page_size"))
}

/// Whether a disk with `free` bytes has room for what a checkpoint adds to the database
/// file (the pages past its end, up to `logical_bytes`) and still leaves room for
/// commits: a checkpoint that cannot finish only takes that room and leaves the WAL as
/// long (`disk_room.rs`).
fn checkpoint_fits(db: &Path, logical_bytes: u64, free: u64) -> bool {
    checkpoint_growth(db, logical_bytes).saturating_add(CHECKPOINT_ROOM_BYTES) <= free
}

/// What a checkpoint adds to the database file at `db`: the pages past its end, up to
/// the database's size as of the last commit.
pub(crate) fn checkpoint_growth(db: &Path, logical_bytes: u64) -> u64 {
    let file_bytes = std::fs::metadata(db).map_or(0, |m| m.len());
    logical_bytes.saturating_sub(file_bytes)
}

/// Free bytes a background checkpoint leaves for commits.
const CHECKPOINT_ROOM_BYTES: u64 = 4 << 20;

/// WAL bytes past which the background checkpoint runs: `WAL_CHECKPOINT_BYTES`, or on a
/// disk with little room, a quarter of the room the WAL has (free space and its own size).
/// A checkpoint lets the WAL be reused from its start instead of growing, which on a
/// full disk is what keeps commits possible (`disk_room.rs`); and a checkpoint needs the
/// database file to grow by what it copies, so it must come before that room is gone.
pub(crate) fn checkpoint_threshold(free: Option<u64>, wal_bytes: u64) -> u64 {
    free.map_or(WAL_CHECKPOINT_BYTES, |free| {
        WAL_CHECKPOINT_BYTES.min(free.saturating_add(wal_bytes) / 4)
    })
}

/// Runs a statement without parameters or results through the statement cache.
fn run_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(drop)
}

/// The WAL file of the database at `path`.
pub(crate) fn wal_path(path: &Path) -> PathBuf {
    sibling(path, "-wal")
}

/// The file named as the database at `path` with `suffix` appended (`-wal`,
/// `-reserve`).
pub(crate) fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// What `open` learned about the database.
pub(crate) struct DbInfo {
    pub chunk_sizes: ChunkSizes,
    pub workspace_id: String,
}

/// Process-wide SQLite settings, which only take effect before SQLite initialises: this
/// runs before the first connection of the store opens. If something else in the
/// process initialised SQLite first, they stay off (the store works the same).
fn configure_library() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: sqlite3_config is only unsafe against a concurrent initialisation or
        // use of SQLite; `call_once` runs this before any connection of this crate
        // opens. Had another user initialised it already, it answers SQLITE_MISUSE and
        // changes nothing. The callback is a plain function that lives forever.
        let rc = unsafe {
            rusqlite::ffi::sqlite3_config(
                rusqlite::ffi::SQLITE_CONFIG_LOG,
                sqlite_log as SqliteLogFn,
                std::ptr::null_mut::<std::ffi::c_void>(),
            )
        };
        if rc != rusqlite::ffi::SQLITE_OK {
            tracing::debug!("SQLite was initialised before the store; its log stays off ({rc})");
        }
        // SAFETY: as above; the argument is a plain int.
        let rc = unsafe {
            rusqlite::ffi::sqlite3_config(
                rusqlite::ffi::SQLITE_CONFIG_STMTJRNL_SPILL,
                STATEMENT_JOURNAL_SPILL_BYTES,
            )
        };
        if rc != rusqlite::ffi::SQLITE_OK {
            tracing::debug!(
                "SQLite was initialised before the store; its journal spill stays ({rc})"
            );
        }
    });
}

/// How much of a savepoint's undo record (the statement journal) SQLite keeps in memory
/// before it moves it to a temporary file, which then stays open, and is written page
/// by page with two `pwrite`s each, until the batch commits. SQLite's default, 64 KiB,
/// is less than many mutations inside a batch record (they rewrite pages that earlier
/// mutations of the batch dirtied), and after one spill every later mutation of the
/// batch writes to the file: a quarter of the daemon's time in `rm` of 5,000 files went
/// to those writes (`perf`), and an unlink cost 27 to 28 µs in the store against 16 to
/// 20 µs with this (`benches/examples/small_files`).
///
/// It must stay below 128 KiB: SQLite moves the record to the file one buffer of this
/// size per `write`, and its unix VFS writes at most 128 KiB - 1 bytes per call (it
/// masks the length), so a larger spill turns every big ingestion's first spill into a
/// short write reported as SQLITE_FULL (seen with 1 and 4 MiB).
const STATEMENT_JOURNAL_SPILL_BYTES: std::ffi::c_int = 120 << 10;

/// SQLite's log message without the statement it quotes (`statement aborts at 5: [SQL]
/// reason` becomes `reason`).
fn without_statement(message: &str) -> &str {
    match (message.find("statement aborts at"), message.rfind("] ")) {
        (Some(0), Some(end)) => &message[end + 2..],
        // `reason in "SQL"`, from a statement that failed to prepare.
        _ => message.split(" in \"").next().unwrap_or(message),
    }
}

type SqliteLogFn = extern "C" fn(*mut std::ffi::c_void, std::ffi::c_int, *const std::ffi::c_char);

/// SQLite's own log, into ours: the detail behind an I/O error, a full disk or a
/// corruption, in SQLite's words, as warnings (the statement it was running only at
/// debug level: a user acts on the error, not on our SQL); the rest at debug level.
extern "C" fn sqlite_log(
    _: *mut std::ffi::c_void,
    code: std::ffi::c_int,
    message: *const std::ffi::c_char,
) {
    // SAFETY: SQLite passes a NUL-terminated message valid for the call.
    let message = unsafe { std::ffi::CStr::from_ptr(message) }.to_string_lossy();
    use rusqlite::ffi;
    match code & 0xff {
        ffi::SQLITE_IOERR
        | ffi::SQLITE_CORRUPT
        | ffi::SQLITE_FULL
        | ffi::SQLITE_CANTOPEN
        | ffi::SQLITE_NOMEM
        | ffi::SQLITE_NOTADB
        | ffi::SQLITE_READONLY => {
            tracing::debug!("sqlite ({code}): {message}");
            tracing::warn!("sqlite ({code}): {}", without_statement(&message));
        }
        ffi::SQLITE_NOTICE => tracing::info!("sqlite ({code}): {message}"),
        // Constraints that mean EEXIST, undos after SQLite already rolled back, a busy
        // checkpoint, planner hints.
        _ => tracing::debug!("sqlite ({code}): {message}"),
    }
}

fn configure(conn: &Connection, read_only: bool) -> Result<()> {
    conn.busy_timeout(Duration::from_secs(60))
        .ctx("setting the busy timeout")?;
    // Plans must not depend on bound values: otherwise SQLite re-prepares range and join
    // statements on every new binding, which costs more than running them.
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .ctx("configuring the connection")?;
    conn.set_prepared_statement_cache_capacity(64);
    // temp_store FILE (SQLite's default): every mutation is a savepoint in the open
    // batch, and SQLite first copies each page it changes into the savepoint's undo
    // record. With MEMORY that record is kept in 1 KiB allocations, several per page
    // copied (a create paid 16-19 us in the store instead of 11-13); with FILE it is
    // one buffer of STATEMENT_JOURNAL_SPILL_BYTES, past which it goes to a temporary
    // file that stays open for the batch.
    let mut pragmas = format!(
        "PRAGMA synchronous = NORMAL;
         PRAGMA foreign_keys = OFF;
         PRAGMA temp_store = FILE;
         PRAGMA cache_size = -{};",
        PAGE_CACHE_BYTES >> 10
    );
    if !read_only {
        // Checkpoints run on their own thread (`Db::checkpoint_if_needed`), not inside
        // whichever commit happens to cross the threshold.
        pragmas.push_str("PRAGMA journal_mode = WAL; PRAGMA wal_autocheckpoint = 0;");
        // A log that grew during a burst is cut back to this when it starts over,
        // instead of keeping the burst's size until the workspace closes.
        pragmas.push_str(&format!("PRAGMA journal_size_limit = {WAL_KEPT_BYTES};"));
    }
    conn.execute_batch(&pragmas)
        .ctx("configuring the connection")?;
    Ok(())
}

/// Puts a bulk load's database back as every other open expects it.
const LEAVE_BULK_LOAD: &str = "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;";

/// Moves the writer `conn` to the rollback journal for a bulk load; false (with the
/// connection left in WAL mode, which is only slower) if SQLite would not, because
/// another connection has the database open.
///
/// The rollback journal writes each page the load adds once, into the database; the
/// WAL writes it twice (into the log, then at a checkpoint into the database), which an
/// import into an empty workspace measured at 2.07 bytes written per byte stored
/// (`docs/benchmarks.md`). The journal holds only the old content of the pages a
/// transaction changes that existed before it. Synchronous FULL: in rollback mode
/// NORMAL leaves a small window for corruption at a power loss; a load commits seldom,
/// so the extra syncs cost nothing measurable.
fn enter_bulk_load(conn: &Connection) -> Result<bool> {
    let mode: String = match conn.query_row("PRAGMA journal_mode = DELETE", [], |row| row.get(0)) {
        Ok(mode) => mode,
        Err(err) if err.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy) => {
            "wal".to_owned()
        }
        Err(err) => return Err(err).ctx("leaving WAL mode for a bulk load"),
    };
    if !mode.eq_ignore_ascii_case("delete") {
        tracing::debug!("bulk load stays in {mode} mode: the database is open elsewhere");
        return Ok(false);
    }
    conn.execute_batch("PRAGMA synchronous = FULL")
        .ctx("configuring a bulk load")?;
    Ok(true)
}

/// Rolls back what a writer killed in rollback-journal mode (a bulk load) left half
/// done, before a read-only open, which cannot (SQLite's immutable reads would not even
/// look): a brief read-write connection does it, where the directory can be written.
fn roll_back_hot_journal(path: &Path) -> Result<()> {
    let journal = sibling(path, "-journal");
    let hot = std::fs::metadata(&journal).is_ok_and(|meta| meta.len() > 0);
    if !hot {
        return Ok(());
    }
    if !dir_is_writable(path) {
        return Err(Error::HotJournal(ErrorPath::none()));
    }
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .ctx("opening the database to roll back an interrupted write")?;
    conn.busy_timeout(Duration::from_secs(60))
        .ctx("setting the busy timeout")?;
    // The first read of a database with a hot journal rolls it back.
    conn.query_row("SELECT count(*) FROM sqlite_master", [], |row| {
        row.get::<_, i64>(0)
    })
    .ctx("rolling back an interrupted write")?;
    Ok(())
}

impl Db {
    pub fn open(path: &Path, options: &DbOptions) -> Result<(Db, DbInfo)> {
        // What SQLite opens: its log and journal lie beside the link's target.
        let path = &crate::base::real_path(path);
        let exists = path.exists();
        if !exists && !options.create {
            return Err(Error::io(
                path.display().to_string(),
                std::io::Error::from_raw_os_error(libc::ENOENT),
            ));
        }
        // Before SQLite opens it, which would write its header into an empty file.
        if exists && !options.create && !is_sqlite_file(path)? {
            return Err(Error::NotWorkspace(ErrorPath::none()));
        }
        if options.read_only && exists {
            roll_back_hot_journal(path)?;
        }
        let read_mode = match options.read_only {
            true => ReadMode::of(path, options.no_other_writer)?,
            false => ReadMode::Shared,
        };
        configure_library();
        let writer = connect_writer(path, options, read_mode)?;
        let info = init_or_check(&writer, options)?;
        let bulk_load = options.bulk_load && !options.read_only && enter_bulk_load(&writer)?;
        let commit_delay = options.commit_delay.filter(|_| !options.read_only);
        // Only batches can lose answered mutations to a full disk (`disk_room.rs`).
        let room = (options.disk_reserve_bytes > 0 && commit_delay.is_some())
            .then(|| DiskRoom::new(path, options.disk_reserve_bytes));
        let writer = Writer::new(writer, room, bulk_load);
        let progress = writer.progress.clone();
        let writer = Arc::new(Mutex::new(writer));
        // A bulk load has no log to checkpoint, and holds the database alone.
        let checkpointer = if options.read_only || bulk_load {
            None
        } else {
            Some(Checkpointer::start(path, writer.clone())?)
        };
        let committer = match commit_delay {
            Some(delay) => Some(Committer::start(writer.clone(), delay)?),
            None => None,
        };
        let db = Db {
            // A bulk load reads on its writer: in rollback-journal mode a reader's
            // snapshot would hold up the writer's commits.
            readers: (!bulk_load).then(|| Mutex::new(Vec::new())),
            _checkpointer: checkpointer,
            hold_reads: committer.is_some() && options.no_other_writer,
            _committer: committer,
            commit_delay,
            writer,
            path: Some(path.to_path_buf()),
            read_only: options.read_only,
            read_mode,
            reader_pool_max: options.reader_pool_max.max(1),
            progress,
            room_maker: OnceLock::new(),
            room_waited_at: Mutex::new(None),
        };
        Ok((db, info))
    }

    pub fn open_in_memory(options: &DbOptions) -> Result<(Db, DbInfo)> {
        configure_library();
        let writer = Connection::open_in_memory().ctx("opening an in-memory database")?;
        compact::enable_if_empty(&writer)?;
        configure(&writer, false)?;
        let info = init_or_check(&writer, options)?;
        let writer = Writer::new(writer, None, false);
        let progress = writer.progress.clone();
        let db = Db {
            readers: None,
            _checkpointer: None,
            _committer: None,
            hold_reads: false,
            commit_delay: None,
            writer: Arc::new(Mutex::new(writer)),
            path: None,
            read_only: false,
            read_mode: ReadMode::Shared,
            reader_pool_max: 1,
            progress,
            room_maker: OnceLock::new(),
            room_waited_at: Mutex::new(None),
        };
        Ok((db, info))
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Runs `f` on a reader connection inside a read transaction, so every statement in
    /// `f` sees the same snapshot. Inside a batch the `state` row may lag behind the
    /// batch's mutations: whatever reads the counters uses [`Db::read_counted`].
    pub fn read<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        self.read_snapshot(false, f)
    }

    /// [`Db::read`] with the `state` row (revision and counters, [`read_counters`])
    /// brought up to date first.
    pub fn read_counted<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        self.read_snapshot(true, f)
    }

    fn read_snapshot<T>(
        &self,
        counted: bool,
        f: impl FnOnce(&Connection) -> Result<T>,
    ) -> Result<T> {
        let pool = match &self.readers {
            // Batched mutations are visible only to the writer connection: read there.
            Some(pool) if self.commit_delay.is_none() => pool,
            _ => {
                let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
                return w.read(counted, self.hold_reads, f);
            }
        };
        let taken = pool.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let conn = match taken {
            Some(conn) => conn,
            None => self.new_reader()?,
        };
        let result = in_read_txn(&conn, f);
        let mut pool = pool.lock().unwrap_or_else(|e| e.into_inner());
        if pool.len() < self.reader_pool_max && !conn.is_autocommit() {
            // A failed read left a transaction open; do not reuse that connection.
        } else if pool.len() < self.reader_pool_max {
            pool.push(conn);
        }
        result
    }

    fn new_reader(&self) -> Result<Connection> {
        let path = self.path.as_ref().expect("file databases have a path");
        let conn = self.read_mode.connect(path).ctx("opening a reader")?;
        configure(&conn, true)?;
        Ok(conn)
    }

    /// Runs `f` as one mutation that takes the next revision. `f` returning an error
    /// undoes everything it did; the revision is not used up.
    ///
    /// Without a commit delay the mutation is its own transaction, committed before this
    /// returns. With one, it is a savepoint inside the open batch, committed with the
    /// batch (at most `commit_delay` later, or at [`Db::commit`]).
    pub fn write<T>(&self, f: impl FnOnce(&mut WriteTxn<'_>) -> Result<T>) -> Result<T> {
        if self.read_only {
            return Err(Error::ReadOnly(Default::default()));
        }
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        w.refuse_if_halted()?;
        if w.room_is_short() {
            w = self.wait_for_room(w);
            w.refuse_if_halted()?;
        }
        let batching = self.commit_delay.is_some();
        w.begin_batch()?;
        run_cached(&w.conn, "SAVEPOINT mutation").ctx("starting a mutation")?;
        let (state, pending) = {
            let batch = w.batch.as_ref().expect("a batch is open");
            (batch.state, batch.pending_bytes())
        };
        let growth_allowance = w
            .room
            .as_mut()
            .map_or(u64::MAX, |room| room.allowance(pending));
        // Block data the mutation stored, kept even if it fails: a savepoint rolled back
        // leaves the pages it reused dirty, and the batch's commit writes them all the same.
        let mut written = 0u64;
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut txn = WriteTxn {
                conn: &w.conn,
                revision: Revision(state.revision.0 + 1),
                stored_bytes: state.stored_bytes,
                node_count: state.node_count,
                quota: state.quota,
                next_ino: state.next_ino,
                next_cookie: state.next_cookie,
                next_block: state.next_block,
                quota_checked: true,
                takes_revision: true,
                growth_allowance,
                written_bytes: 0,
            };
            let out = f(&mut txn);
            written = txn.written_bytes;
            let out = out?;
            let state = txn.finish()?;
            Ok((out, state))
        }));
        let result = match result {
            Ok(result) => result,
            Err(panic) => {
                // Half a mutation must not reach the batch's commit: undone here, the
                // panic goes on to its thread as before.
                w.undo_mutation(batching, &Error::halted("a change failed half-way"));
                std::panic::resume_unwind(panic);
            }
        };
        self.progress.finished.fetch_add(1, Ordering::SeqCst);
        match result {
            Ok((out, state)) => {
                run_cached(&w.conn, "RELEASE mutation").ctx("ending a mutation")?;
                let batch = w.batch.as_mut().expect("a batch is open");
                batch.state = state;
                batch.state_unwritten = true;
                batch.mutations += 1;
                batch.written = batch.written.saturating_add(written);
                let full = batch.mutations >= BATCH_MUTATIONS_MAX
                    || batch.written >= BATCH_STORED_BYTES_MAX;
                if !batching || full {
                    w.commit_batch()?;
                }
                let finished = self.progress.finished.load(Ordering::Relaxed);
                if finished.is_multiple_of(WAL_CHECK_EVERY_COMMITS) && w.batch.is_none() {
                    self.bound_wal(&w.conn);
                }
                Ok(out)
            }
            Err(err) => {
                if let Some(batch) = w.batch.as_mut() {
                    batch.written = batch
                        .written
                        .saturating_add(written)
                        .saturating_add(METADATA_BYTES_PER_MUTATION);
                }
                w.undo_mutation(batching, &err);
                Err(err)
            }
        }
    }

    /// Why the writer stopped taking changes, if it did (see `Error::Halted`).
    pub fn halted(&self) -> Option<String> {
        crate::base::lock(&self.writer).halted.clone()
    }

    /// Sets what the writer calls when the disk runs short of room (once).
    pub fn set_room_maker(&self, maker: RoomMaker) {
        let _ = self.room_maker.set(maker);
    }

    /// The disk is short of room: while deleted files' space is on its way back, waits
    /// for it (a while at most) instead of refusing the mutation, as ext4 retries an
    /// allocation after a journal commit.
    fn wait_for_room<'a>(&'a self, mut w: MutexGuard<'a, Writer>) -> MutexGuard<'a, Writer> {
        let Some(make_room) = self.room_maker.get() else {
            return w;
        };
        let waited_lately = crate::base::lock(&self.room_waited_at)
            .is_some_and(|at| at.elapsed() < ROOM_WAIT_EVERY);
        if waited_lately {
            return w;
        }
        let deadline = Instant::now() + ROOM_WAIT_MAX;
        let mut waited = false;
        loop {
            // Unlocked: giving the space back needs the writer (to see the deletions).
            drop(w);
            let freeing = make_room();
            if freeing {
                waited = true;
                std::thread::sleep(Duration::from_millis(2));
            }
            w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
            if !freeing || !w.room_is_short() || Instant::now() >= deadline {
                if waited {
                    tracing::debug!("waited for deleted files' space on a short disk");
                    *crate::base::lock(&self.room_waited_at) = Some(Instant::now());
                }
                return w;
            }
        }
    }

    /// Runs `f` on the writer connection, after any mutation in progress: it sees every
    /// mutation committed (or batched) before it.
    pub fn read_latest<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        w.read(false, self.hold_reads, f)
    }

    /// Commits the open batch now (before a checkpoint, or a close), if a finished
    /// mutation is in it.
    pub fn commit(&self) -> Result<()> {
        let progress = &self.progress;
        let finished = progress.finished.load(Ordering::SeqCst);
        if progress.committed_through.load(Ordering::SeqCst) < finished {
            self.writer
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .commit_batch()?;
        }
        Ok(())
    }

    /// Commits and makes every committed transaction survive power loss: an fsync of
    /// the write-ahead log, unless nothing was committed since the last one (a clean
    /// `fdatasync` still flushes the disk's cache, about 60 µs here).
    ///
    /// The log alone: with `synchronous = NORMAL` SQLite syncs the database file itself
    /// after every checkpoint, before the log starts over. Without a log (a bulk load
    /// commits through a rollback journal) the database file is synced.
    pub fn sync(&self) -> Result<()> {
        self.commit()?;
        let progress = &self.progress;
        let commits = progress.commits.load(Ordering::SeqCst);
        let Some(path) = self.path.as_deref() else {
            return Ok(());
        };
        if progress.synced.load(Ordering::SeqCst) >= commits {
            return Ok(());
        }
        let wal = wal_path(path);
        let file = if wal.exists() { wal.as_path() } else { path };
        std::fs::File::open(file)
            .and_then(|f| f.sync_data())
            .map_err(|e| Error::io(file.display().to_string(), e))?;
        progress.synced.fetch_max(commits, Ordering::SeqCst);
        Ok(())
    }

    /// Checkpoints from the writer when the WAL has outgrown its bound (the background
    /// checkpointer could not keep up): writers wait rather than fill the disk.
    fn bound_wal(&self, conn: &Connection) {
        let Some(path) = &self.path else { return };
        let size = std::fs::metadata(wal_path(path))
            .map(|m| m.len())
            .unwrap_or(0);
        if size > WAL_BYTES_MAX {
            if let Err(err) = conn.execute_batch("PRAGMA wal_checkpoint(RESTART)") {
                tracing::warn!("checkpoint of a {size}-byte WAL failed: {err}");
            }
        }
    }

    /// Gives every free page of the database back to the file system (see
    /// `compact.rs`), a step at a time so mutations go on between steps, then copies the
    /// write-ahead log in and empties it. `progress` hears after each step.
    pub fn compact(&self, progress: &mut dyn FnMut(CompactProgress)) -> Result<CompactReport> {
        if self.read_only {
            return Err(Error::ReadOnly(Default::default()));
        }
        let bytes_before = self.file_bytes()?;
        let ((page_size, _, free_pages), incremental) =
            self.with_writer(|conn| Ok((compact::pages(conn)?, compact::is_incremental(conn)?)))?;
        let mut state = CompactProgress {
            free_bytes_at_start: free_pages.saturating_mul(page_size),
            freed_bytes: 0,
            rewriting: !incremental,
        };
        progress(state);
        if incremental {
            loop {
                let freed = self.with_writer(|conn| compact::step(conn))?;
                if freed == 0 {
                    break;
                }
                state.freed_bytes = state.freed_bytes.saturating_add(freed * page_size);
                progress(state);
            }
        } else {
            self.with_writer(|conn| compact::rewrite_incremental(conn))?;
            state.freed_bytes = state.free_bytes_at_start;
            state.rewriting = false;
            progress(state);
        }
        self.with_writer(|conn| empty_wal(conn))?;
        Ok(CompactReport {
            bytes_before,
            bytes_after: self.file_bytes()?,
            rewrote: !incremental,
        })
    }

    /// The bytes the database takes: its file and write-ahead log, or its pages in
    /// memory.
    fn file_bytes(&self) -> Result<u64> {
        let Some(path) = &self.path else {
            return self.with_writer(|conn| Ok(logical_bytes(conn)));
        };
        let len = |path: &Path| std::fs::metadata(path).map_or(0, |m| m.len());
        Ok(len(path) + len(&wal_path(path)))
    }

    /// Runs `f` on the writer connection outside of any transaction (maintenance:
    /// checkpoints, integrity checks).
    pub fn with_writer<T>(&self, f: impl FnOnce(&mut Connection) -> Result<T>) -> Result<T> {
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        w.commit_batch()?;
        w.progress.commits.fetch_add(1, Ordering::SeqCst);
        f(&mut w.conn)
    }
}

/// The `state` row: counters every mutation reads and writes back.
#[derive(Clone, Copy, Debug)]
struct StateRow {
    revision: Revision,
    stored_bytes: u64,
    node_count: u64,
    next_ino: u64,
    next_cookie: u64,
    next_block: u64,
    quota: Quota,
}

fn read_state(conn: &Connection) -> Result<StateRow> {
    conn.prepare_cached(
        "SELECT revision, stored_bytes, node_count, next_ino, next_cookie, next_block,
                quota_bytes, quota_inodes FROM state WHERE id = 1",
    )
    .and_then(|mut stmt| {
        stmt.query_row([], |row| {
            Ok(StateRow {
                revision: Revision(row.get::<_, i64>(0)? as u64),
                stored_bytes: row.get::<_, i64>(1)? as u64,
                node_count: row.get::<_, i64>(2)? as u64,
                next_ino: row.get::<_, i64>(3)? as u64,
                next_cookie: row.get::<_, i64>(4)? as u64,
                next_block: row.get::<_, i64>(5)? as u64,
                quota: Quota {
                    bytes_max: row.get::<_, Option<i64>>(6)?.map(|v| v as u64),
                    inodes_max: row.get::<_, Option<i64>>(7)?.map(|v| v as u64),
                },
            })
        })
    })
    .ctx("reading the workspace state")
}

fn write_state(conn: &Connection, state: &StateRow) -> Result<()> {
    conn.prepare_cached(
        "UPDATE state SET revision = ?1, stored_bytes = ?2, node_count = ?3,
                next_ino = ?4, next_cookie = ?5, next_block = ?6,
                quota_bytes = ?7, quota_inodes = ?8 WHERE id = 1",
    )
    .and_then(|mut stmt| {
        stmt.execute(params![
            state.revision.0 as i64,
            state.stored_bytes as i64,
            state.node_count as i64,
            state.next_ino as i64,
            state.next_cookie as i64,
            state.next_block as i64,
            state.quota.bytes_max.map(|v| v as i64),
            state.quota.inodes_max.map(|v| v as i64),
        ])
    })
    .ctx("advancing the revision")?;
    Ok(())
}

/// The writer connection, configured (on a read-only database, the connection that
/// reads where a writer would).
fn connect_writer(path: &Path, options: &DbOptions, read_mode: ReadMode) -> Result<Connection> {
    let writer = if options.read_only {
        read_mode.connect(path)
    } else {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        Connection::open_with_flags(path, flags)
    }
    .ctx("opening the database")?;
    if options.create {
        compact::enable_if_empty(&writer)?;
    }
    configure(&writer, options.read_only)?;
    Ok(writer)
}

/// Runs `f` in a read transaction on `conn`, rolled back if `f` fails. BEGIN and COMMIT
/// come from the statement cache: parsing them anew costs about a microsecond a read,
/// and `grep -r` makes one read per file.
fn in_read_txn<T>(conn: &Connection, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
    let run = |sql: &str| {
        conn.prepare_cached(sql)
            .and_then(|mut stmt| stmt.execute([]))
    };
    run("BEGIN").ctx("starting a read")?;
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(conn))).unwrap_or_else(
        |panic| {
            // Left open, the transaction would hold the next writer's `BEGIN` off.
            let _ = run("ROLLBACK");
            std::panic::resume_unwind(panic)
        },
    );
    let ended = run(if out.is_ok() { "COMMIT" } else { "ROLLBACK" });
    let out = out?;
    ended.ctx("ending a read")?;
    Ok(out)
}

/// Reads the revision, stored bytes and node count as of the connection's snapshot; on
/// the writer connection, only current inside [`Db::read_counted`].
pub(crate) fn read_counters(conn: &Connection) -> Result<(Revision, u64, u64, Quota)> {
    let state = read_state(conn)?;
    Ok((
        state.revision,
        state.stored_bytes,
        state.node_count,
        state.quota,
    ))
}

/// A write transaction. Dereferences to the SQLite transaction for statements.
///
/// Ids (inode numbers, entry cookies, block ids) come from counters in the `state` row
/// rather than from AUTOINCREMENT: they are never reused, and the row is written with
/// every commit anyway, so no extra page changes.
pub(crate) struct WriteTxn<'c> {
    conn: &'c Connection,
    /// The revision this mutation commits as.
    pub revision: Revision,
    pub stored_bytes: u64,
    pub node_count: u64,
    pub quota: Quota,
    next_ino: u64,
    next_cookie: u64,
    next_block: u64,
    /// Cleared by mutations that only free space, which always pass.
    quota_checked: bool,
    /// False for bookkeeping that changes no node (peer cursors): it takes no revision.
    takes_revision: bool,
    /// How many bytes of block data this mutation may store before it would eat into the
    /// disk reserve (`disk_room.rs`); checked with the quota.
    growth_allowance: u64,
    /// Block data this mutation stored (whatever it freed): what it adds to the WAL.
    pub(crate) written_bytes: u64,
}

impl std::ops::Deref for WriteTxn<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl WriteTxn<'_> {
    /// This transaction changes no node, only bookkeeping: it does not take a revision.
    pub fn keep_revision(&mut self) {
        self.takes_revision = false;
    }

    /// The last revision committed before this transaction (batched ones included).
    pub fn previous_revision(&self) -> Revision {
        Revision(self.revision.0 - 1)
    }

    /// Whether this transaction commits as a revision of its own.
    pub fn takes_revision(&self) -> bool {
        self.takes_revision
    }

    /// Lets this transaction exceed the quota: it only deletes or frees.
    pub fn skip_quota(&mut self) {
        self.quota_checked = false;
    }

    pub fn set_quota(&mut self, quota: Quota) {
        self.quota = quota;
    }

    /// Fails with ENOSPC if storing `bytes` more of block data would eat into the disk
    /// reserve (`disk_room.rs`). Mutations that only free space pass.
    pub fn check_room(&self, bytes: u64) -> Result<()> {
        if !self.quota_checked || self.growth_allowance == u64::MAX {
            return Ok(());
        }
        let growth = self
            .written_bytes
            .saturating_add(bytes)
            .saturating_add(METADATA_BYTES_PER_MUTATION);
        if growth > self.growth_allowance {
            return Err(Error::no_space(
                "the disk holding the workspace is down to its reserve",
            ));
        }
        Ok(())
    }

    /// A fresh inode number.
    pub fn allocate_ino(&mut self) -> u64 {
        let ino = self.next_ino;
        self.next_ino = ino.checked_add(1).expect("inode numbers exhausted");
        ino
    }

    /// A fresh directory-entry cookie (greater than every earlier one).
    pub fn allocate_cookie(&mut self) -> u64 {
        let cookie = self.next_cookie;
        self.next_cookie = cookie.checked_add(1).expect("entry cookies exhausted");
        cookie
    }

    /// A fresh block id.
    pub fn allocate_block(&mut self) -> i64 {
        let id = self.next_block;
        // Ids are SQLite integers: past i64::MAX one would be stored negative.
        assert!(id < i64::MAX as u64, "block ids exhausted");
        self.next_block = id + 1;
        id as i64
    }

    fn committed_revision(&self) -> Revision {
        if self.takes_revision {
            self.revision
        } else {
            Revision(self.revision.0 - 1)
        }
    }

    /// Checks the quota and returns the counters, for the batch to write back (see
    /// `Batch::state_unwritten`).
    fn finish(self) -> Result<StateRow> {
        if self.quota_checked {
            if let Some(max) = self.quota.bytes_max {
                if self.stored_bytes > max {
                    return Err(Error::no_space("workspace byte quota exceeded"));
                }
            }
            if let Some(max) = self.quota.inodes_max {
                if self.node_count > max {
                    return Err(Error::no_space("workspace inode quota exceeded"));
                }
            }
            self.check_room(0)?;
        }
        Ok(StateRow {
            revision: self.committed_revision(),
            stored_bytes: self.stored_bytes,
            node_count: self.node_count,
            next_ino: self.next_ino,
            next_cookie: self.next_cookie,
            next_block: self.next_block,
            quota: self.quota,
        })
    }
}

fn random_id() -> String {
    let mut bytes = [0u8; 16];
    let filled = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes));
    if filled.is_err() {
        // Fall back to time and pid; the id only needs to be unlikely to collide.
        let seed = format!("{:?}{}", std::time::SystemTime::now(), std::process::id());
        bytes.copy_from_slice(&blake3::hash(seed.as_bytes()).as_bytes()[..16]);
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether the file at `path` starts as every SQLite database does (an empty file is
/// not one yet).
fn is_sqlite_file(path: &Path) -> Result<bool> {
    const HEADER: &[u8; 16] = b"SQLite format 3\0";
    let mut start = [0u8; 16];
    let read = std::fs::File::open(path).and_then(|mut file| {
        use std::io::Read;
        let mut filled = 0;
        while filled < start.len() {
            match file.read(&mut start[filled..])? {
                0 => break,
                n => filled += n,
            }
        }
        Ok(filled)
    });
    match read {
        Ok(filled) => Ok(filled == HEADER.len() && &start == HEADER),
        Err(err) => Err(Error::io(path.display().to_string(), err)),
    }
}

fn init_or_check(conn: &Connection, options: &DbOptions) -> Result<DbInfo> {
    let has_meta: bool = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'",
            [],
            |row| row.get::<_, i64>(0),
        )
        .ctx("inspecting the database")?
        > 0;
    if !has_meta {
        // An empty file (a mistyped path someone touched) becomes a workspace only when
        // asked to.
        if options.read_only || !options.create {
            return Err(Error::NotWorkspace(ErrorPath::none()));
        }
        let empty: i64 = conn
            .query_row("SELECT count(*) FROM sqlite_master", [], |row| row.get(0))
            .ctx("inspecting the database")?;
        if empty != 0 {
            return Err(Error::corrupt(
                "not a workspace database (foreign tables present)",
            ));
        }
        create_schema(conn, options)?;
    }
    let version: Option<i64> = conn
        .query_row(
            "SELECT value FROM meta WHERE key = 'schema_version'",
            [],
            |row| row.get(0),
        )
        .optional()
        .ctx("reading the schema version")?;
    upgrade_schema(conn, version, options)?;
    let get = |key: &str| -> Result<i64> {
        conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |row| {
            row.get(0)
        })
        .ctx("reading workspace settings")
    };
    let chunk_sizes = ChunkSizes {
        min: get("chunk_min")? as usize,
        avg: get("chunk_avg")? as usize,
        max: get("chunk_max")? as usize,
    };
    if !chunk_sizes.is_valid() {
        return Err(Error::corrupt(format!(
            "invalid chunk sizes {chunk_sizes:?}"
        )));
    }
    let workspace_id: String = conn
        .query_row(
            "SELECT value FROM meta WHERE key = 'workspace_id'",
            [],
            |row| row.get(0),
        )
        .ctx("reading the workspace id")?;
    Ok(DbInfo {
        chunk_sizes,
        workspace_id,
    })
}

/// Takes a database at `version` to [`SCHEMA_VERSION`], one upgrade per transaction,
/// and adds the additive tables; a read-only open only checks the version.
fn upgrade_schema(conn: &Connection, version: Option<i64>, options: &DbOptions) -> Result<()> {
    // Each upgrade takes a version to the next, in one transaction.
    let upgrades: [(i64, &str, &str); 2] = [
        (1, REPLICATION_TABLES, "upgrading the schema to version 2"),
        (2, LOG_INDEXES, "upgrading the schema to version 3"),
    ];
    let mut version = version;
    for (from, sql, what) in upgrades {
        if version == Some(from) && !options.read_only {
            conn.execute_batch(&format!(
                "BEGIN IMMEDIATE; {sql}
                 UPDATE meta SET value = {} WHERE key = 'schema_version'; COMMIT;",
                from + 1
            ))
            .ctx(what)?;
            version = Some(from + 1);
        }
    }
    if version != Some(SCHEMA_VERSION) {
        return Err(Error::corrupt(format!(
            "schema version {version:?}, this build reads version {SCHEMA_VERSION}"
        )));
    }
    // Additive, not a schema version of its own (`audit.rs` keeps it).
    if !options.read_only {
        conn.execute_batch(AUDIT_TABLE)
            .ctx("adding the audit trail")?;
    }
    Ok(())
}

fn create_schema(conn: &Connection, options: &DbOptions) -> Result<()> {
    let now = crate::clock::system_now();
    conn.execute_batch("BEGIN IMMEDIATE")
        .ctx("creating the schema")?;
    let result = (|| -> Result<()> {
        conn.execute_batch(SCHEMA).ctx("creating the schema")?;
        conn.execute_batch(REPLICATION_TABLES)
            .ctx("creating the schema")?;
        conn.execute_batch(LOG_INDEXES).ctx("creating the schema")?;
        conn.execute_batch(AUDIT_TABLE).ctx("creating the schema")?;
        let sizes = options.chunk_sizes;
        let meta: [(&str, rusqlite::types::Value); 5] = [
            ("schema_version", SCHEMA_VERSION.into()),
            ("chunk_min", (sizes.min as i64).into()),
            ("chunk_avg", (sizes.avg as i64).into()),
            ("chunk_max", (sizes.max as i64).into()),
            ("workspace_id", random_id().into()),
        ];
        for (key, value) in meta {
            conn.execute(
                "INSERT INTO meta (key, value) VALUES (?1, ?2)",
                params![key, value],
            )
            .ctx("creating the schema")?;
        }
        conn.execute(
            "INSERT INTO state (id, revision, stored_bytes, node_count, next_ino, next_cookie, next_block)
             VALUES (1, 1, 0, 1, 2, 1, 1)",
            [],
        )
        .ctx("creating the schema")?;
        // The root directory, owned by whoever creates the workspace.
        let (uid, gid) = (unsafe { libc::geteuid() }, unsafe { libc::getegid() });
        conn.execute(
            "INSERT INTO nodes (ino, kind, perm, uid, gid, nlink, size, atime, mtime, ctime, revision)
             VALUES (1, ?1, ?2, ?3, ?4, 2, 0, ?5, ?5, ?5, 1)",
            params![kind_code(FileKind::Directory), 0o755, uid, gid, now],
        )
        .ctx("creating the root directory")?;
        Ok(())
    })();
    match result {
        Ok(()) => conn.execute_batch("COMMIT").ctx("creating the schema"),
        Err(err) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(err)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DELAY: Duration = Duration::from_millis(25);

    fn batching_db_options() -> DbOptions {
        DbOptions {
            commit_delay: Some(DELAY),
            create: true,
            read_only: false,
            chunk_sizes: ChunkSizes::DEFAULT,
            reader_pool_max: 4,
            disk_reserve_bytes: 0,
            no_other_writer: true,
            bulk_load: false,
        }
    }

    fn batching_db(dir: &Path) -> Db {
        Db::open(&dir.join("ws.db"), &batching_db_options())
            .unwrap()
            .0
    }

    fn revision(db: &Db) -> u64 {
        db.read_counted(|conn| Ok(read_counters(conn)?.0 .0))
            .unwrap()
    }

    fn holds_read(db: &Db) -> bool {
        let w = crate::base::lock(&db.writer);
        w.held_read.is_some() && !w.conn.is_autocommit()
    }

    /// A reader that cannot write the database's directory reads it as immutable only
    /// while no writer is at work; beside one whose log a checkpoint emptied (its
    /// index still there) it reads through the log.
    #[test]
    fn a_reader_reads_beside_a_writer_whatever_it_may_write() {
        let choose = |wal_bytes, index_exists, dir_writable, no_other_writer| {
            let beside = Beside {
                wal_bytes,
                index_exists,
                dir_writable,
            };
            ReadMode::choose(beside, no_other_writer).map_err(|e| e.errno())
        };
        use ReadMode::{Immutable, Shared};
        // The owner lock held: nobody else writes.
        assert_eq!(choose(0, true, true, true), Ok(Immutable));
        assert_eq!(choose(0, true, false, true), Ok(Immutable));
        assert_eq!(choose(4096, true, true, true), Ok(Shared));
        // No lock: a writable directory lets SQLite make what it needs.
        assert_eq!(choose(0, false, true, false), Ok(Shared));
        assert_eq!(choose(0, true, true, false), Ok(Shared));
        // A directory this user cannot write: a writer at work keeps its index.
        assert_eq!(choose(0, true, false, false), Ok(Shared));
        assert_eq!(choose(4096, true, false, false), Ok(Shared));
        assert_eq!(choose(0, false, false, false), Ok(Immutable));
        assert!(choose(4096, false, false, false).is_err());
    }

    /// A mutation that adds `key` to the `meta` table.
    fn insert_meta(db: &Db, key: &str) {
        db.write(|txn| {
            txn.execute("INSERT INTO meta VALUES (?1, 1)", [key])
                .ctx("test")?;
            Ok(())
        })
        .unwrap();
    }

    fn meta_keys(db: &Db) -> Vec<String> {
        db.read_latest(|conn| {
            let mut stmt = conn
                .prepare("SELECT key FROM meta WHERE key IN ('half', 'whole')")
                .ctx("test")?;
            let keys = stmt.query_map([], |row| row.get(0)).ctx("test")?;
            keys.collect::<rusqlite::Result<Vec<String>>>().ctx("test")
        })
        .unwrap()
    }

    /// A mutation that panics half-way leaves nothing in the batch the next one
    /// commits, and takes no revision.
    #[test]
    fn a_mutation_that_panics_is_undone() {
        let dir = tempfile::tempdir().unwrap();
        let db = batching_db(dir.path());
        let before = revision(&db);
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            db.write(|txn| -> Result<()> {
                txn.execute("INSERT INTO meta VALUES ('half', 1)", [])
                    .ctx("test")?;
                panic!("half-way");
            })
        }));
        assert!(panicked.is_err());
        insert_meta(&db, "whole");
        db.commit().unwrap();
        assert_eq!(meta_keys(&db), ["whole"]);
        assert_eq!(revision(&db), before + 1);
    }

    /// A read that panics does not leave its transaction open on the writer, where the
    /// next mutation could not begin.
    #[test]
    fn a_read_that_panics_ends_its_transaction() {
        let dir = tempfile::tempdir().unwrap();
        let options = DbOptions {
            commit_delay: None,
            ..batching_db_options()
        };
        let db = Db::open(&dir.path().join("ws.db"), &options).unwrap().0;
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            db.read_latest(|_| -> Result<()> { panic!("half-way") })
        }));
        assert!(panicked.is_err());
        insert_meta(&db, "whole");
        assert_eq!(meta_keys(&db), ["whole"]);
    }

    #[test]
    fn a_read_held_between_reads_sees_every_later_mutation() {
        let dir = tempfile::tempdir().unwrap();
        let db = batching_db(dir.path());
        let before = revision(&db);
        for step in 1..=3 {
            db.commit().unwrap();
            assert!(revision(&db) == before + step - 1 && holds_read(&db));
            db.write(|_| Ok(())).unwrap();
            assert!(!holds_read(&db), "a mutation ends the read it follows");
            db.commit().unwrap();
            assert_eq!(revision(&db), before + step);
        }
    }

    #[test]
    fn a_held_read_ends_when_idle_and_before_maintenance() {
        let dir = tempfile::tempdir().unwrap();
        let db = batching_db(dir.path());
        db.write(|_| Ok(())).unwrap();
        db.commit().unwrap();
        revision(&db);
        assert!(holds_read(&db));
        // The log can be emptied: maintenance ends the read first.
        assert!(db.with_writer(|conn| empty_wal(conn)).unwrap());
        assert!(!holds_read(&db));
        revision(&db);
        let deadline = Instant::now() + HELD_READ_MAX + DELAY * 20;
        while holds_read(&db) {
            assert!(
                Instant::now() < deadline,
                "the committer never ended the read"
            );
            std::thread::sleep(DELAY / 5);
        }
    }

    #[test]
    fn sqlite_log_lines_lose_the_statement() {
        assert_eq!(
            without_statement("statement aborts at 5: [PRAGMA journal_mode = WAL] disk I/O error"),
            "disk I/O error"
        );
        assert_eq!(
            without_statement("os_unix.c:1234: (2) open(/x) - "),
            "os_unix.c:1234: (2) open(/x) - "
        );
        assert_eq!(
            without_statement("unable to open database file in \"PRAGMA x = 1;\n PRAGMA y\""),
            "unable to open database file"
        );
    }
}
