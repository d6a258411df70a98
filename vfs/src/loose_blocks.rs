//! Loose holds on blocks: a reference that no extent stands for, kept by the
//! `loose_blocks` table with the time it was taken. Replication stores a large
//! transfer's blocks before the entries that use them, and a batch applied in parts
//! keeps the blocks a later part needs; each such block holds one reference until the
//! entries use it or the hold is given up after a while.

use rusqlite::{params, Connection};

use crate::content::{self, BlockCache};
use crate::db::WriteTxn;
use crate::error::{Result, StorageContext};
use crate::types::TimestampNs;

/// Records that the reference the caller took on block `id` is a loose hold.
pub(crate) fn hold(txn: &WriteTxn<'_>, id: i64, at: TimestampNs) -> Result<()> {
    txn.prepare_cached("INSERT INTO loose_blocks (id, at) VALUES (?1, ?2)")
        .and_then(|mut s| s.execute(params![id, at]))
        .ctx("holding a loose block")?;
    Ok(())
}

/// Whether block `id` has a loose hold.
pub(crate) fn is_held(conn: &Connection, id: i64) -> Result<bool> {
    conn.prepare_cached("SELECT 1 FROM loose_blocks WHERE id = ?1")
        .and_then(|mut s| s.exists([id]))
        .ctx("reading loose blocks")
}

/// Whether any hold was taken at or before `before`.
pub(crate) fn any_due(conn: &Connection, before: TimestampNs) -> Result<bool> {
    conn.prepare_cached("SELECT 1 FROM loose_blocks WHERE at <= ?1 LIMIT 1")
        .and_then(|mut s| s.exists([before]))
        .ctx("reading loose blocks")
}

/// The blocks whose holds were taken at or before `before`.
pub(crate) fn due(conn: &Connection, before: TimestampNs) -> Result<Vec<i64>> {
    conn.prepare_cached("SELECT id FROM loose_blocks WHERE at <= ?1")
        .and_then(|mut s| s.query_map([before], |r| r.get(0))?.collect())
        .ctx("reading loose blocks")
}

/// Drops the loose hold on block `id`, if it has one, with the reference it stands
/// for (deleting the block if nothing else uses it).
pub(crate) fn release(txn: &mut WriteTxn<'_>, cache: &BlockCache, id: i64) -> Result<()> {
    let held = txn
        .prepare_cached("DELETE FROM loose_blocks WHERE id = ?1")
        .and_then(|mut s| s.execute([id]))
        .ctx("releasing a loose block")?;
    if held == 0 {
        return Ok(());
    }
    content::release_block(txn, cache, id)
}
