//! `check`: verifies a workspace database from scratch, every invariant of the map
//! (docs/ARCHITECTURE.md, "Invariants") that the rows themselves can show.
//!
//! SQLite's own integrity check, then:
//! - blocks: every block decodes and re-hashes to its key; reference counts equal the
//!   extents and loose holds that use each block; extents match their blocks, do not
//!   overlap and stay inside their file; the stored-bytes counter matches the blocks;
//! - the tree: entries point at live nodes; link counts match entries; every directory
//!   hangs from the root; the node counter matches the rows;
//! - ids: each counter of the `state` row is above every id of its kind in use, so the
//!   next one handed out is new;
//! - revisions: no row carries a revision the workspace has not reached; whatever is at
//!   a tombstone's path now was put there by the removal's mutation or a later one;
//! - peers: a `delivered` cursor (on our log) is not past our revision; a record of how
//!   far a peer's changes were applied is not past its `applied` cursor, and it and
//!   every received batch belong to a registered peer;
//! - staging: every `staged` row binds a live regular file.
//!
//! What it cannot see is history and the running process: that each mutation took one
//! revision, that ids of rows since deleted were not handed out again, that cursors
//! never moved backwards, lock order. The map says which and why. Problems are
//! collected, not fatal, so one run reports them all. Rows are streamed: what a check
//! holds is a count per block and per node, never the rows.

use std::collections::HashMap;

use rusqlite::types::ValueRef;
use rusqlite::Connection;

use crate::block::{self, BlockHash, Codec};
use crate::block_store;
use crate::changes::{cursor_at_or_after, Cursor};
use crate::db;
use crate::error::{Result, StorageContext};
use crate::log;
use crate::store;
use crate::types::{FileKind, InodeNo, Revision};
use crate::workspace::Workspace;

/// Problems reported past this many are counted, not listed.
pub const CHECK_PROBLEMS_LISTED_MAX: usize = 1000;

/// One broken invariant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem(pub String);

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What [`Workspace::check`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckReport {
    pub problems: Vec<Problem>,
    /// Problems beyond the listed ones.
    pub problems_unlisted: usize,
    pub nodes: u64,
    pub blocks: u64,
    /// Raw bytes of all blocks, re-hashed.
    pub block_bytes: u64,
}

impl CheckReport {
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty() && self.problems_unlisted == 0
    }

    fn problem(&mut self, text: String) {
        if self.problems.len() < CHECK_PROBLEMS_LISTED_MAX {
            self.problems.push(Problem(text));
        } else {
            self.problems_unlisted += 1;
        }
    }
}

/// Progress of a check: blocks verified so far out of the total.
#[derive(Clone, Copy, Debug)]
pub struct CheckProgress {
    pub blocks_done: u64,
    pub blocks_total: u64,
}

impl Workspace {
    /// Verifies the whole database. Commits buffered writes first.
    pub fn check(&self) -> Result<CheckReport> {
        self.check_with_progress(&mut |_| {})
    }

    pub fn check_with_progress(
        &self,
        progress: &mut dyn FnMut(CheckProgress),
    ) -> Result<CheckReport> {
        if !self.is_read_only() {
            self.commit_all()?;
            self.settle_staged()?;
        }
        let open_now: Vec<InodeNo> = self.open_inodes();
        self.db()
            .read_counted(|conn| check_database(conn, &open_now, progress))
    }
}

/// Runs every check on one snapshot of the database.
fn check_database(
    conn: &Connection,
    open_now: &[InodeNo],
    progress: &mut dyn FnMut(CheckProgress),
) -> Result<CheckReport> {
    let mut report = CheckReport::default();
    sqlite_integrity(conn, &mut report)?;
    let mut uses = check_extents(conn, &mut report)?;
    count_loose_holds(conn, &mut uses, &mut report)?;
    check_blocks(conn, &uses, &mut report, progress)?;
    check_namespace(conn, open_now, &mut report)?;
    let state = read_state(conn)?;
    check_revisions(conn, state.revision, &mut report)?;
    check_id_counters(conn, &state, &mut report)?;
    check_tombstones(conn, &mut report)?;
    check_peer_cursors(conn, state.revision, &mut report)?;
    check_peer_rows_known(conn, &mut report)?;
    check_applied_through(conn, &mut report)?;
    check_staged(conn, &mut report)?;
    Ok(report)
}

fn sqlite_integrity(conn: &Connection, report: &mut CheckReport) -> Result<()> {
    let mut stmt = conn
        .prepare("PRAGMA integrity_check")
        .ctx("checking integrity")?;
    let rows = stmt
        .query_map([], |row| row.get::<_, String>(0))
        .ctx("checking integrity")?;
    for row in rows {
        let line = row.ctx("checking integrity")?;
        if line != "ok" {
            report.problem(format!("sqlite: {line}"));
        }
    }
    Ok(())
}

/// Checks extents against their files and blocks; returns how many extents use each block.
fn check_extents(conn: &Connection, report: &mut CheckReport) -> Result<HashMap<i64, u64>> {
    let mut uses: HashMap<i64, u64> = HashMap::new();
    let mut stmt = conn
        .prepare(
            "SELECT e.ino, e.offset, e.len, e.block, n.kind, n.size, b.raw_len
             FROM extents e LEFT JOIN nodes n ON n.ino = e.ino LEFT JOIN blocks b ON b.id = e.block
             ORDER BY e.ino, e.offset",
        )
        .ctx("checking extents")?;
    let mut rows = stmt.query([]).ctx("checking extents")?;
    let mut previous: Option<(i64, i64)> = None; // (ino, end of last extent)
    while let Some(row) = rows.next().ctx("checking extents")? {
        let ino: i64 = row.get(0).ctx("checking extents")?;
        let offset: i64 = row.get(1).ctx("checking extents")?;
        let len: i64 = row.get(2).ctx("checking extents")?;
        let block: i64 = row.get(3).ctx("checking extents")?;
        let kind: Option<i64> = row.get(4).ctx("checking extents")?;
        let size: Option<i64> = row.get(5).ctx("checking extents")?;
        let raw_len: Option<i64> = row.get(6).ctx("checking extents")?;
        *uses.entry(block).or_default() += 1;
        match kind {
            None => report.problem(format!("extent of missing inode {ino} at {offset}")),
            Some(code) if code != crate::db::kind_code(FileKind::File) => {
                report.problem(format!("inode {ino} is not a file but has content"))
            }
            _ => {}
        }
        match raw_len {
            None => report.problem(format!("inode {ino} at {offset}: missing block {block}")),
            Some(raw) if raw != len => report.problem(format!(
                "inode {ino} at {offset}: extent of {len} bytes, block of {raw}"
            )),
            _ => {}
        }
        if len <= 0 {
            report.problem(format!("inode {ino} at {offset}: empty extent"));
        }
        if let Some(size) = size {
            if offset + len > size {
                report.problem(format!(
                    "inode {ino}: extent at {offset} ends past the size {size}"
                ));
            }
        }
        if let Some((prev_ino, prev_end)) = previous {
            if prev_ino == ino && offset < prev_end {
                report.problem(format!("inode {ino}: extents overlap at {offset}"));
            }
        }
        previous = Some((ino, offset + len));
    }
    Ok(uses)
}

/// Adds the loose holds to `uses`: a block received ahead of the entries that use it
/// holds one reference of its own until they come.
fn count_loose_holds(
    conn: &Connection,
    uses: &mut HashMap<i64, u64>,
    report: &mut CheckReport,
) -> Result<()> {
    let mut stmt = conn
        .prepare(
            "SELECT l.id, b.id IS NOT NULL FROM loose_blocks l LEFT JOIN blocks b ON b.id = l.id",
        )
        .ctx("checking loose blocks")?;
    let mut rows = stmt.query([]).ctx("checking loose blocks")?;
    while let Some(row) = rows.next().ctx("checking loose blocks")? {
        let id: i64 = row.get(0).ctx("checking loose blocks")?;
        let stored: bool = row.get(1).ctx("checking loose blocks")?;
        if stored {
            *uses.entry(id).or_default() += 1;
        } else {
            report.problem(format!("loose hold on missing block {id}"));
        }
    }
    Ok(())
}

fn check_blocks(
    conn: &Connection,
    uses: &HashMap<i64, u64>,
    report: &mut CheckReport,
    progress: &mut dyn FnMut(CheckProgress),
) -> Result<()> {
    let blocks_total: i64 = conn
        .query_row("SELECT count(*) FROM blocks", [], |row| row.get(0))
        .ctx("counting blocks")?;
    let mut stmt = conn
        .prepare("SELECT id, hash, refcount, raw_len, codec, stored_len FROM blocks")
        .ctx("checking blocks")?;
    let mut rows = stmt.query([]).ctx("checking blocks")?;
    let mut stored_sum: u64 = 0;
    let mut out = Vec::new();
    while let Some(row) = rows.next().ctx("checking blocks")? {
        let id: i64 = row.get(0).ctx("checking blocks")?;
        let hash: Vec<u8> = row.get(1).ctx("checking blocks")?;
        let refcount: i64 = row.get(2).ctx("checking blocks")?;
        let raw_len: i64 = row.get(3).ctx("checking blocks")?;
        let codec: i64 = row.get(4).ctx("checking blocks")?;
        let stored_len: i64 = row.get(5).ctx("checking blocks")?;
        let Some(data) = block_store::get(conn, id)? else {
            report.problem(format!("block {id}: no data"));
            continue;
        };
        if data.len() as i64 != stored_len {
            report.problem(format!(
                "block {id}: {} bytes stored, {stored_len} recorded",
                data.len()
            ));
        }
        stored_sum += data.len() as u64;
        report.blocks += 1;
        report.block_bytes += raw_len.max(0) as u64;
        let used = uses.get(&id).copied().unwrap_or(0);
        if refcount as u64 != used || refcount < 0 {
            report.problem(format!(
                "block {id}: reference count {refcount}, used by {used} extents and loose holds"
            ));
        }
        if refcount == 0 {
            report.problem(format!("block {id}: unreferenced block kept"));
        }
        let verified = BlockHash::from_slice(&hash).and_then(|hash| {
            let codec = Codec::from_code(codec)?;
            block::decode_into(&hash, codec, raw_len.max(0) as usize, &data, &mut out)
        });
        if let Err(err) = verified {
            report.problem(format!("block {id}: {err}"));
        }
        if report.blocks.is_multiple_of(256) {
            progress(CheckProgress {
                blocks_done: report.blocks,
                blocks_total: blocks_total as u64,
            });
        }
    }
    progress(CheckProgress {
        blocks_done: report.blocks,
        blocks_total: blocks_total as u64,
    });
    let stray = block_store::count_without_block(conn)?;
    if stray > 0 {
        report.problem(format!("{stray} block data rows without a block"));
    }
    let (_, stored_counter, _, _) = db::read_counters(conn)?;
    if stored_counter != stored_sum {
        report.problem(format!(
            "stored bytes counter {stored_counter}, blocks hold {stored_sum}"
        ));
    }
    Ok(())
}

fn check_namespace(
    conn: &Connection,
    open_now: &[InodeNo],
    report: &mut CheckReport,
) -> Result<()> {
    // Entries per node and subdirectories per directory.
    let mut links: HashMap<i64, i64> = HashMap::new();
    let mut subdirs: HashMap<i64, i64> = HashMap::new();
    let mut stmt = conn
        .prepare(
            "SELECT d.parent, d.ino, p.kind, c.kind FROM dirents d
             LEFT JOIN nodes p ON p.ino = d.parent LEFT JOIN nodes c ON c.ino = d.ino",
        )
        .ctx("checking entries")?;
    let mut rows = stmt.query([]).ctx("checking entries")?;
    while let Some(row) = rows.next().ctx("checking entries")? {
        let parent: i64 = row.get(0).ctx("checking entries")?;
        let ino: i64 = row.get(1).ctx("checking entries")?;
        let parent_kind: Option<i64> = row.get(2).ctx("checking entries")?;
        let kind: Option<i64> = row.get(3).ctx("checking entries")?;
        match parent_kind {
            None => report.problem(format!("entry in missing directory {parent}")),
            Some(k) if k != crate::db::kind_code(FileKind::Directory) => {
                report.problem(format!("entry in non-directory {parent}"))
            }
            _ => {}
        }
        match kind {
            None => report.problem(format!("entry in {parent} names missing inode {ino}")),
            Some(k) => {
                *links.entry(ino).or_default() += 1;
                if k == crate::db::kind_code(FileKind::Directory) {
                    *subdirs.entry(parent).or_default() += 1;
                }
            }
        }
    }
    drop(rows);
    drop(stmt);
    let mut stmt = conn
        .prepare("SELECT ino, kind, nlink FROM nodes")
        .ctx("checking nodes")?;
    let mut rows = stmt.query([]).ctx("checking nodes")?;
    let mut dirs = Vec::new();
    while let Some(row) = rows.next().ctx("checking nodes")? {
        let ino: i64 = row.get(0).ctx("checking nodes")?;
        let kind: i64 = row.get(1).ctx("checking nodes")?;
        let nlink: i64 = row.get(2).ctx("checking nodes")?;
        report.nodes += 1;
        let entries = links.get(&ino).copied().unwrap_or(0);
        let is_root = ino == InodeNo::ROOT.0 as i64;
        if kind == crate::db::kind_code(FileKind::Directory) {
            let expected_entries = if is_root { 0 } else { 1 };
            if entries != expected_entries {
                report.problem(format!("directory {ino} has {entries} entries naming it"));
            }
            let expected = 2 + subdirs.get(&ino).copied().unwrap_or(0);
            if nlink != expected {
                report.problem(format!(
                    "directory {ino}: link count {nlink}, expected {expected}"
                ));
            }
            if !is_root {
                dirs.push(InodeNo(ino as u64));
            }
        } else if nlink != entries {
            report.problem(format!(
                "inode {ino}: link count {nlink}, {entries} entries"
            ));
        } else if nlink == 0 && !open_now.contains(&InodeNo(ino as u64)) {
            report.problem(format!("inode {ino}: no links and not open (orphan)"));
        }
    }
    drop(rows);
    drop(stmt);
    for dir in dirs {
        if !store::is_ancestor(conn, InodeNo::ROOT, dir).unwrap_or(false) {
            report.problem(format!(
                "directory {} is not reachable from the root",
                dir.0
            ));
        }
    }
    let (_, _, node_counter, _) = db::read_counters(conn)?;
    if node_counter != report.nodes {
        report.problem(format!(
            "node counter {node_counter}, {} nodes present",
            report.nodes
        ));
    }
    Ok(())
}

/// The `state` row's revision and id counters, as stored.
struct StateRow {
    revision: i64,
    next_ino: i64,
    next_cookie: i64,
    next_block: i64,
}

fn read_state(conn: &Connection) -> Result<StateRow> {
    conn.query_row(
        "SELECT revision, next_ino, next_cookie, next_block FROM state WHERE id = 1",
        [],
        |row| {
            Ok(StateRow {
                revision: row.get(0)?,
                next_ino: row.get(1)?,
                next_cookie: row.get(2)?,
                next_block: row.get(3)?,
            })
        },
    )
    .ctx("reading the state row")
}

/// Column `index` as text for a problem line: names and paths are bytes, shown with
/// invalid UTF-8 replaced.
fn shown(row: &rusqlite::Row<'_>, index: usize) -> Result<String> {
    Ok(match row.get_ref(index).ctx("reading a name")? {
        ValueRef::Text(bytes) | ValueRef::Blob(bytes) => {
            String::from_utf8_lossy(bytes).into_owned()
        }
        other => format!("{other:?}"),
    })
}

/// Every kind of row that carries a revision: SQL for what a problem calls the row, and
/// its revision. (Nodes carry their last change's, entries the one that made them,
/// tombstones the removal's; a peer's batches the revision that applied them.)
const REVISIONED_ROWS: [&str; 5] = [
    "SELECT 'inode ' || ino, revision FROM nodes",
    "SELECT 'entry \"' || CAST(name AS TEXT) || '\" in directory ' || parent, revision
     FROM dirents",
    "SELECT 'tombstone of ' || CAST(path AS TEXT), revision FROM tombstones",
    "SELECT 'batch received from peer ' || peer, revision FROM received",
    "SELECT 'record of how far peer ' || peer || ' was applied', revision
     FROM applied_through",
];

/// Every revision a row carries was taken by a committed mutation, so none is past the
/// workspace's: the next mutation would take it again, and a peer reading the log after
/// it would never see the change. (Revision 1 made the root; none is before it.)
fn check_revisions(conn: &Connection, current: i64, report: &mut CheckReport) -> Result<()> {
    for select in REVISIONED_ROWS {
        let mut stmt = conn
            .prepare(&format!("{select} WHERE revision < 1 OR revision > ?1"))
            .ctx("checking revisions")?;
        let mut rows = stmt.query([current]).ctx("checking revisions")?;
        while let Some(row) = rows.next().ctx("checking revisions")? {
            let what = shown(row, 0)?;
            let revision: i64 = row.get(1).ctx("checking revisions")?;
            report.problem(format!(
                "{what}: revision {revision}, outside the workspace's revisions 1 to {current}"
            ));
        }
    }
    Ok(())
}

/// An id counter of the `state` row: its column and value, what it numbers, and SQL for
/// the largest such number any row holds (each part a lookup in an index).
struct IdCounter {
    column: &'static str,
    next: i64,
    numbers: &'static str,
    largest_in_use: &'static str,
}

fn id_counters(state: &StateRow) -> [IdCounter; 3] {
    [
        IdCounter {
            column: "next_ino",
            next: state.next_ino,
            numbers: "inode number",
            largest_in_use: "SELECT max(m) FROM (
                SELECT max(ino) AS m FROM nodes UNION ALL SELECT max(ino) FROM dirents
                UNION ALL SELECT max(parent) FROM dirents UNION ALL SELECT max(ino) FROM extents
                UNION ALL SELECT max(ino) FROM xattrs UNION ALL SELECT max(ino) FROM staged)",
        },
        IdCounter {
            column: "next_block",
            next: state.next_block,
            numbers: "block id",
            // Extents name only blocks that exist, or `check_extents` says otherwise;
            // bytes stored without a block are reported on their own.
            largest_in_use: "SELECT max(m) FROM (
                SELECT max(id) AS m FROM blocks UNION ALL SELECT max(id) FROM loose_blocks)",
        },
        IdCounter {
            column: "next_cookie",
            next: state.next_cookie,
            numbers: "entry cookie",
            largest_in_use: "SELECT max(cookie) FROM dirents",
        },
    ]
}

/// Inode numbers, block ids and entry cookies are handed out by counters, never
/// reused: each counter must be above every number of its kind in use, or the next
/// node (block, entry) made would take one the kernel or the block cache still knows.
/// (Numbers of rows since deleted leave no trace to check against.)
fn check_id_counters(conn: &Connection, state: &StateRow, report: &mut CheckReport) -> Result<()> {
    for counter in id_counters(state) {
        let largest: Option<i64> = conn
            .query_row(counter.largest_in_use, [], |row| row.get(0))
            .ctx("checking id counters")?;
        if let Some(largest) = largest.filter(|&largest| largest >= counter.next) {
            report.problem(format!(
                "{} is {}, but {} {largest} is in use: the next one made would take it again",
                counter.column, counter.next, counter.numbers
            ));
        }
    }
    Ok(())
}

/// A removal leaves its path unbound (`store::remove_dirent`), and entries are only ever
/// made, never changed: so whatever is at a tombstone's path now was put there by the
/// removal's own mutation or a later one, and some entry on the way to it is at least
/// as new as the tombstone. The change log relies on it: a path bound from before its
/// removal would be listed as removed while it stands. Only each path's latest
/// tombstone needs looking at.
fn check_tombstones(conn: &Connection, report: &mut CheckReport) -> Result<()> {
    let mut stmt = conn
        .prepare("SELECT path, max(revision) FROM tombstones GROUP BY path")
        .ctx("checking tombstones")?;
    let mut rows = stmt.query([]).ctx("checking tombstones")?;
    while let Some(row) = rows.next().ctx("checking tombstones")? {
        let path: Vec<u8> = row.get(0).ctx("checking tombstones")?;
        let removed_at: i64 = row.get(1).ctx("checking tombstones")?;
        let shown = String::from_utf8_lossy(&path);
        if !is_removable_path(&path) {
            report.problem(format!(
                "tombstone of {shown:?} at revision {removed_at}: not a path below the root"
            ));
            continue;
        }
        if let Some(Revision(bound)) = log::binding(conn, &path)? {
            if (bound as i64) < removed_at {
                report.problem(format!(
                    "tombstone of {shown} at revision {removed_at}: the path is bound since \
                     revision {bound}, before its removal"
                ));
            }
        }
    }
    Ok(())
}

/// Whether `path` is one a removal records (`store::entry_path`): `/`, then names
/// joined by `/`, none empty, `.` or `..` (so not the root, which is never removed).
fn is_removable_path(path: &[u8]) -> bool {
    match path.split_first() {
        Some((b'/', names)) => names
            .split(|&b| b == b'/')
            .all(|name| !name.is_empty() && name != b"." && name != b".."),
        _ => false,
    }
}

/// A peer's `delivered` cursor is on our own log: the peer cannot have applied a
/// revision that was never made here. (Its `applied` cursor counts the peer's
/// revisions, which this database does not hold; only its sign is ours to check.)
fn check_peer_cursors(conn: &Connection, current: i64, report: &mut CheckReport) -> Result<()> {
    let mut stmt = conn
        .prepare("SELECT peer, delivered_rev, applied_rev FROM peers")
        .ctx("checking peers")?;
    let mut rows = stmt.query([]).ctx("checking peers")?;
    while let Some(row) = rows.next().ctx("checking peers")? {
        let peer = shown(row, 0)?;
        let delivered: i64 = row.get(1).ctx("checking peers")?;
        let applied: i64 = row.get(2).ctx("checking peers")?;
        if !(0..=current).contains(&delivered) {
            report.problem(format!(
                "peer {peer}: delivered cursor at revision {delivered}, outside the \
                 workspace's revisions 0 to {current}"
            ));
        }
        if applied < 0 {
            report.problem(format!(
                "peer {peer}: applied cursor at negative revision {applied}"
            ));
        }
    }
    Ok(())
}

/// The tables of what came from each peer, by peer name.
const PEER_ROWS: [&str; 2] = ["received", "applied_through"];

/// What came from a peer belongs to a registered one: a peer that comes back as another
/// replica loses these rows with its cursors (`Workspace::register_peer`), and peers
/// are never forgotten otherwise.
fn check_peer_rows_known(conn: &Connection, report: &mut CheckReport) -> Result<()> {
    for table in PEER_ROWS {
        let mut stmt = conn
            .prepare(&format!(
                "SELECT t.peer, count(*) FROM {table} t
                 WHERE NOT EXISTS (SELECT 1 FROM peers p WHERE p.peer = t.peer)
                 GROUP BY t.peer"
            ))
            .ctx("checking peers")?;
        let mut rows = stmt.query([]).ctx("checking peers")?;
        while let Some(row) = rows.next().ctx("checking peers")? {
            let peer = shown(row, 0)?;
            let count: i64 = row.get(1).ctx("checking peers")?;
            report.problem(format!("unknown peer {peer} has {count} rows in {table}"));
        }
    }
    Ok(())
}

/// How far a peer's changes were applied as of one of our revisions is never past how
/// far they are applied now: the batch that wrote the record moved the cursor to at
/// least there, and the cursor never moves backwards.
fn check_applied_through(conn: &Connection, report: &mut CheckReport) -> Result<()> {
    // Rows at an earlier revision than the cursor's are behind it whatever their path.
    let mut stmt = conn
        .prepare(
            "SELECT a.peer, a.revision, a.through_rev, a.through_path, p.applied_rev,
                    p.applied_path
             FROM applied_through a JOIN peers p ON p.peer = a.peer
             WHERE a.through_rev >= p.applied_rev",
        )
        .ctx("checking peers")?;
    let mut rows = stmt.query([]).ctx("checking peers")?;
    while let Some(row) = rows.next().ctx("checking peers")? {
        let peer = shown(row, 0)?;
        let as_of: i64 = row.get(1).ctx("checking peers")?;
        let through = cursor(row, 2)?;
        let applied = cursor(row, 4)?;
        if !cursor_at_or_after(&applied, &through) {
            report.problem(format!(
                "peer {peer}: applied through {} as of revision {as_of}, past its applied \
                 cursor {}",
                show_cursor(&through),
                show_cursor(&applied)
            ));
        }
    }
    Ok(())
}

/// The cursor in columns `first` (revision) and `first + 1` (path).
fn cursor(row: &rusqlite::Row<'_>, first: usize) -> Result<Cursor> {
    Ok(Cursor {
        revision: Revision(row.get::<_, i64>(first).ctx("reading a cursor")? as u64),
        path: row.get(first + 1).ctx("reading a cursor")?,
    })
}

fn show_cursor(cursor: &Cursor) -> String {
    format!(
        "(revision {}, {:?})",
        cursor.revision.0,
        String::from_utf8_lossy(&cursor.path)
    )
}

/// Each `staged` row binds a staging file to a live regular file, whose content it may
/// hold newer than the rows: ingestion (after a crash, the next open) writes it back
/// there, and the mutation that deletes a node unbinds its file
/// (`Workspace::unstage_deleted`).
fn check_staged(conn: &Connection, report: &mut CheckReport) -> Result<()> {
    let mut stmt = conn
        .prepare(
            "SELECT s.ino, s.file, n.kind FROM staged s LEFT JOIN nodes n ON n.ino = s.ino
             WHERE n.kind IS NOT ?1",
        )
        .ctx("checking staged files")?;
    let mut rows = stmt
        .query([db::kind_code(FileKind::File)])
        .ctx("checking staged files")?;
    while let Some(row) = rows.next().ctx("checking staged files")? {
        let ino: i64 = row.get(0).ctx("checking staged files")?;
        let file = shown(row, 1)?;
        let kind: Option<i64> = row.get(2).ctx("checking staged files")?;
        report.problem(match kind {
            None => format!("staging file {file} is bound to missing inode {ino}"),
            Some(_) => format!("staging file {file} is bound to inode {ino}, not a regular file"),
        });
    }
    Ok(())
}
