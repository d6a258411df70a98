//! Giving deleted content's space back to the file system.
//!
//! SQLite keeps the pages a deletion frees inside the database file, for later writes.
//! A workspace made with `auto_vacuum = INCREMENTAL` (every workspace made since schema
//! creation set it) can move its last pages into those free ones and cut the file
//! short, a bounded step at a time: the checkpointer does that in the background when a
//! large share of the file is free ([`wants_background_step`]), and `Db::compact` does
//! all of it now. A workspace made before that setting has to be rewritten once
//! (`VACUUM`) to take it; `Db::compact` does that too, and says so.
//!
//! Every function here runs on the writer connection, outside any transaction: the
//! caller holds the writer (so no batch is open), and each step is its own transaction.

use rusqlite::Connection;

use crate::error::{Result, StorageContext};

/// Pages one incremental step frees at most: bounds how long a step holds the writer
/// (and what it adds to the write-ahead log) to a few MiB of page moves.
pub(crate) const STEP_PAGES_MAX: u64 = 1024;
/// Free bytes below which the background leaves them for later writes to reuse.
const BACKGROUND_FREE_BYTES_MIN: u64 = 16 << 20;
/// The background frees pages only while at least 1/this of the file is free: below
/// that, the free pages are churn that the next writes take again.
const BACKGROUND_FREE_SHARE_DENOMINATOR: u64 = 4;

/// SQLite's `auto_vacuum` value for incremental vacuum.
const AUTO_VACUUM_INCREMENTAL: i64 = 2;

/// Where compaction stands, for progress reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompactProgress {
    /// Free bytes in the database file when compaction began.
    pub free_bytes_at_start: u64,
    /// Of those, given back to the file system so far.
    pub freed_bytes: u64,
    /// The database is being rewritten whole (a workspace made before incremental
    /// vacuum): no finer progress until it is done.
    pub rewriting: bool,
}

/// What a compaction did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompactReport {
    /// The database's pages before and after, in bytes (free ones included).
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// The database was rewritten once to take incremental vacuum.
    pub rewrote: bool,
}

/// The page size, page count and free pages of the database `conn` writes.
pub(crate) fn pages(conn: &Connection) -> Result<(u64, u64, u64)> {
    let pragma = |name: &str| -> Result<u64> {
        conn.query_row(&format!("PRAGMA {name}"), [], |row| row.get::<_, i64>(0))
            .ctx("reading the database's size")
            .map(|v| v.max(0) as u64)
    };
    Ok((
        pragma("page_size")?,
        pragma("page_count")?,
        pragma("freelist_count")?,
    ))
}

/// Whether the database can give pages back a step at a time.
pub(crate) fn is_incremental(conn: &Connection) -> Result<bool> {
    let mode: i64 = conn
        .query_row("PRAGMA auto_vacuum", [], |row| row.get(0))
        .ctx("reading the vacuum mode")?;
    Ok(mode == AUTO_VACUUM_INCREMENTAL)
}

/// Sets incremental vacuum on a database that has no pages yet. It must come before
/// anything writes the first page (switching to WAL does), after which only a rewrite
/// changes it.
pub(crate) fn enable_if_empty(conn: &Connection) -> Result<()> {
    let (_, page_count, _) = pages(conn)?;
    if page_count == 0 {
        conn.execute_batch("PRAGMA auto_vacuum = INCREMENTAL")
            .ctx("setting incremental vacuum")?;
    }
    Ok(())
}

/// Whether the background should free a step of pages now: enough of the file is free
/// that keeping it would waste the disk, not just hold room for the next writes.
pub(crate) fn wants_background_step(conn: &Connection) -> Result<bool> {
    if !is_incremental(conn)? {
        return Ok(false);
    }
    let (page_size, page_count, free) = pages(conn)?;
    Ok(free.saturating_mul(page_size) >= BACKGROUND_FREE_BYTES_MIN
        && free.saturating_mul(BACKGROUND_FREE_SHARE_DENOMINATOR) >= page_count)
}

/// Frees at most [`STEP_PAGES_MAX`] pages, as one transaction; returns how many.
pub(crate) fn step(conn: &Connection) -> Result<u64> {
    let (_, _, free_before) = pages(conn)?;
    if free_before == 0 {
        return Ok(0);
    }
    // SQLite frees one page per step of the statement: run it to its end.
    let mut stmt = conn
        .prepare(&format!("PRAGMA incremental_vacuum({STEP_PAGES_MAX})"))
        .ctx("freeing pages")?;
    let mut rows = stmt.query([]).ctx("freeing pages")?;
    while rows.next().ctx("freeing pages")?.is_some() {}
    let (_, _, free_after) = pages(conn)?;
    debug_assert!(free_after <= free_before, "a vacuum step added free pages");
    Ok(free_before.saturating_sub(free_after))
}

/// Rewrites the whole database with incremental vacuum on, freeing every free page.
pub(crate) fn rewrite_incremental(conn: &Connection) -> Result<()> {
    conn.execute_batch("PRAGMA auto_vacuum = INCREMENTAL; VACUUM")
        .ctx("rewriting the database")?;
    debug_assert!(is_incremental(conn).unwrap_or(true));
    Ok(())
}
