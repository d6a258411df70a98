//! The `staged` table: which inodes have their current content in a staging file, and
//! which file. A row is written before the kernel may write the file, and removed in
//! the transaction that ingests the file clean or deletes the node, so after a crash
//! the rows name exactly the content the database does not hold yet.

use rusqlite::{params, Connection};

use crate::db::WriteTxn;
use crate::error::{Result, StorageContext};
use crate::types::InodeNo;

/// Records that `ino`'s content lives in the staging file `file` (replacing an older
/// binding). Cached: this runs for every file the kernel creates.
pub(crate) fn bind(txn: &WriteTxn<'_>, ino: InodeNo, file: &str) -> Result<()> {
    txn.prepare_cached("INSERT OR REPLACE INTO staged (ino, file) VALUES (?1, ?2)")
        .and_then(|mut stmt| stmt.execute(params![ino.0 as i64, file]))
        .ctx("recording a staging file")?;
    Ok(())
}

/// Forgets `ino`'s staging file, if it has one. Cached: this runs for every node
/// deleted.
pub(crate) fn unbind(txn: &WriteTxn<'_>, ino: InodeNo) -> Result<()> {
    txn.prepare_cached("DELETE FROM staged WHERE ino = ?1")
        .and_then(|mut stmt| stmt.execute([ino.0 as i64]))
        .ctx("unbinding a staging file")?;
    Ok(())
}

/// How many files are bound.
pub(crate) fn count(conn: &Connection) -> Result<u64> {
    conn.query_row("SELECT count(*) FROM staged", [], |row| {
        row.get::<_, i64>(0)
    })
    .map(|n| n as u64)
    .ctx("counting staged files")
}

/// Every binding: (inode, staging file name).
pub(crate) fn all(conn: &Connection) -> Result<Vec<(InodeNo, String)>> {
    let mut stmt = conn
        .prepare("SELECT ino, file FROM staged")
        .ctx("reading staged files")?;
    let rows = stmt
        .query_map([], |row| {
            Ok((
                InodeNo(row.get::<_, i64>(0)? as u64),
                row.get::<_, String>(1)?,
            ))
        })
        .ctx("reading staged files")?;
    rows.collect::<rusqlite::Result<Vec<_>>>()
        .ctx("reading staged files")
}
