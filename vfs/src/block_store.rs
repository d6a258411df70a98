//! The block store: where the bytes of blocks live. Everything in vfs reaches block
//! bytes through these calls; the `blocks` table (hash, reference count, lengths,
//! codec) is the namespace's index of them and stays with the store.
//!
//! Today the bytes are rows of `block_data` in the workspace's own database, written
//! and deleted in the transaction of the `blocks` row that counts references to them,
//! so a crash never leaves one without the other, and a table never updated, so
//! reference counts change without rewriting data pages. A second place for bytes
//! (object storage) would answer the same calls: [`put`] before the commit that names
//! the block, [`delete`] after the commit that dropped its last reference (bytes with
//! no block are garbage, never a loss), [`get`] by id, and the scans `check` makes.

use rusqlite::{params, Connection, OptionalExtension};

use crate::db::WriteTxn;
use crate::error::{Result, StorageContext};

/// Stores the encoded bytes of block `id`.
pub(crate) fn put(txn: &WriteTxn<'_>, id: i64, data: &[u8]) -> Result<()> {
    txn.prepare_cached("INSERT INTO block_data (id, data) VALUES (?1, ?2)")
        .and_then(|mut stmt| stmt.execute(params![id, data]))
        .ctx("storing a block")?;
    Ok(())
}

/// The encoded bytes of block `id`, if they are stored.
pub(crate) fn get(conn: &Connection, id: i64) -> Result<Option<Vec<u8>>> {
    conn.prepare_cached("SELECT data FROM block_data WHERE id = ?1")
        .and_then(|mut stmt| stmt.query_row([id], |row| row.get(0)).optional())
        .ctx("reading a block")
}

/// Deletes the bytes of block `id`.
pub(crate) fn delete(txn: &WriteTxn<'_>, id: i64) -> Result<()> {
    txn.prepare_cached("DELETE FROM block_data WHERE id = ?1")
        .and_then(|mut stmt| stmt.execute([id]))
        .ctx("deleting a block")?;
    Ok(())
}

/// How many stored byte runs no block names (`check`).
pub(crate) fn count_without_block(conn: &Connection) -> Result<u64> {
    let sql = "SELECT count(*) FROM block_data d \
               WHERE NOT EXISTS (SELECT 1 FROM blocks b WHERE b.id = d.id)";
    let count: i64 = conn
        .query_row(sql, [], |row| row.get(0))
        .ctx("checking blocks")?;
    Ok(count as u64)
}
