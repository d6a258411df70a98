//! `check`: verifies every invariant of a workspace database from scratch.
//!
//! SQLite's own integrity check, then: every block decodes and re-hashes to its key;
//! reference counts equal the extents that use each block; extents match their blocks,
//! do not overlap and stay inside their file; entries point at live nodes; link counts
//! match entries; every directory hangs from the root; the stored-bytes and node counters
//! match the rows. Problems are collected, not fatal, so one run reports them all.

use std::collections::HashMap;

use rusqlite::Connection;

use crate::block::{self, BlockHash, Codec};
use crate::db;
use crate::error::{Result, StorageContext};
use crate::store;
use crate::types::{FileKind, InodeNo};
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
        self.db().read_counted(|conn| {
            let mut report = CheckReport::default();
            sqlite_integrity(conn, &mut report)?;
            let uses = check_extents(conn, &mut report)?;
            check_blocks(conn, &uses, &mut report, progress)?;
            check_namespace(conn, &open_now, &mut report)?;
            Ok(report)
        })
    }
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
    // A block received ahead of the entries that use it holds one reference of its own.
    let mut stmt = conn
        .prepare("SELECT id FROM loose_blocks")
        .ctx("checking loose blocks")?;
    let loose = stmt
        .query_map([], |row| row.get::<_, i64>(0))
        .ctx("checking loose blocks")?;
    for id in loose {
        *uses.entry(id.ctx("checking loose blocks")?).or_default() += 1;
    }
    Ok(uses)
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
        .prepare(
            "SELECT b.id, b.hash, b.refcount, b.raw_len, b.codec, b.stored_len, d.data
             FROM blocks b LEFT JOIN block_data d ON d.id = b.id",
        )
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
        let data = match row.get_ref(6).ctx("checking blocks")? {
            rusqlite::types::ValueRef::Blob(data) => data,
            _ => {
                report.problem(format!("block {id}: no data"));
                continue;
            }
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
            block::decode_into(&hash, codec, raw_len.max(0) as usize, data, &mut out)
        });
        if let Err(err) = verified {
            report.problem(format!("block {id}: {err}"));
        }
        if report.blocks % 256 == 0 {
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
    let stray: i64 = conn
        .query_row(
            "SELECT count(*) FROM block_data d WHERE NOT EXISTS (SELECT 1 FROM blocks b WHERE b.id = d.id)",
            [],
            |row| row.get(0),
        )
        .ctx("checking blocks")?;
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
