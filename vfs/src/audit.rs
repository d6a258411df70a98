//! The audit trail: what was done to the workspace by way of it, one record per action
//! (an exec, a refusal), kept in the workspace's own database beside the tree so that it
//! lasts as long as the workspace does and travels with the file.
//!
//! The store knows nothing of what a record says: a kind, a subject id and a body of
//! text (the runtimes write JSON), stamped with the time it was kept. Records are not
//! revisions of the tree and never reach peers; each workspace keeps its own trail.
//!
//! The table came after schema version 3 and is additive: a writer creates it when it
//! opens the database (older builds ignore it), a reader of a database without it sees
//! an empty trail. It keeps the newest [`AUDIT_RECORDS_MAX`] records.

use rusqlite::{params, Connection, OptionalExtension};

use crate::error::{Error, Result, StorageContext};
use crate::workspace::Workspace;

/// Records kept; the oldest go as new ones come.
pub const AUDIT_RECORDS_MAX: u64 = 100_000;
/// The longest body kept, bytes; a longer one is refused (the writer bounds its fields).
pub const AUDIT_BODY_BYTES_MAX: usize = 64 << 10;
const _: () = assert!(AUDIT_BODY_BYTES_MAX == 64 << 10, "the refusal says 64 KiB");
/// The longest kind or subject, bytes.
const AUDIT_LABEL_BYTES_MAX: usize = 256;

/// One kept record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditRecord {
    /// Its place in the trail: increasing, never reused.
    pub seq: u64,
    /// When it was kept, milliseconds since the Unix epoch.
    pub at_ms: i64,
    /// What kind of action (`exec`, `refused`, ...).
    pub kind: String,
    /// What it is about (an exec id).
    pub subject: String,
    pub body: String,
}

impl Workspace {
    /// Keeps a record in the audit trail; returns its sequence number. Does not make a
    /// revision of the tree.
    pub fn append_audit(&self, kind: &str, subject: &str, body: &str) -> Result<u64> {
        check_label("an audit kind is 1 to 256 bytes", kind)?;
        check_label("an audit subject is 1 to 256 bytes", subject)?;
        if body.len() > AUDIT_BODY_BYTES_MAX {
            return Err(Error::invalid("an audit record's body is over 64 KiB"));
        }
        let at_ms = crate::clock::system_now() / 1_000_000;
        let seq = self.db().write(|txn| {
            txn.keep_revision();
            txn.skip_quota();
            let seq = insert(txn, at_ms, kind, subject, body)?;
            prune(txn, seq)?;
            Ok(seq)
        })?;
        // Committed at once, not with the next batch: the record is readable beside the
        // owner as soon as the action it records has answered, and outlives its crash.
        self.db().commit()?;
        Ok(seq)
    }

    /// The newest `limit` records after `after_seq`, oldest first.
    pub fn audit_records(&self, after_seq: u64, limit: usize) -> Result<Vec<AuditRecord>> {
        self.db().read(|conn| newest(conn, after_seq, limit))
    }
}

fn check_label(what: &'static str, label: &str) -> Result<()> {
    if label.is_empty() || label.len() > AUDIT_LABEL_BYTES_MAX {
        return Err(Error::invalid(what));
    }
    Ok(())
}

fn insert(conn: &Connection, at_ms: i64, kind: &str, subject: &str, body: &str) -> Result<u64> {
    conn.prepare_cached("INSERT INTO audit (at_ms, kind, subject, body) VALUES (?1, ?2, ?3, ?4)")
        .and_then(|mut s| s.execute(params![at_ms, kind, subject, body]))
        .ctx("keeping an audit record")?;
    let seq = conn.last_insert_rowid();
    debug_assert!(seq > 0);
    Ok(seq as u64)
}

/// Drops what fell out of the kept window behind `newest`.
fn prune(conn: &Connection, newest: u64) -> Result<()> {
    let Some(oldest_kept) = newest.checked_sub(AUDIT_RECORDS_MAX - 1) else {
        return Ok(());
    };
    conn.prepare_cached("DELETE FROM audit WHERE seq < ?1")
        .and_then(|mut s| s.execute([oldest_kept as i64]))
        .ctx("dropping old audit records")?;
    Ok(())
}

fn newest(conn: &Connection, after_seq: u64, limit: usize) -> Result<Vec<AuditRecord>> {
    let exists: Option<i64> = conn
        .query_row(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'audit'",
            [],
            |row| row.get(0),
        )
        .optional()
        .ctx("reading the audit trail")?;
    if exists.is_none() {
        return Ok(Vec::new());
    }
    let mut records = conn
        .prepare_cached(
            "SELECT seq, at_ms, kind, subject, body FROM audit WHERE seq > ?1
             ORDER BY seq DESC LIMIT ?2",
        )
        .and_then(|mut s| {
            s.query_map(params![after_seq as i64, limit as i64], |r| {
                Ok(AuditRecord {
                    seq: r.get::<_, i64>(0)? as u64,
                    at_ms: r.get(1)?,
                    kind: r.get(2)?,
                    subject: r.get(3)?,
                    body: r.get(4)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
        })
        .ctx("reading the audit trail")?;
    records.reverse();
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Options;

    #[test]
    fn records_come_back_in_order_without_a_revision() {
        let ws = Workspace::open_in_memory(Options::default()).unwrap();
        let before = ws.revision().unwrap();
        let first = ws.append_audit("exec", "x1", "{\"a\":1}").unwrap();
        let second = ws.append_audit("refused", "x2", "{}").unwrap();
        assert!(second > first);
        assert_eq!(ws.revision().unwrap(), before, "the trail is not the tree");
        let records = ws.audit_records(0, 10).unwrap();
        let kinds: Vec<&str> = records.iter().map(|r| r.kind.as_str()).collect();
        assert_eq!(kinds, ["exec", "refused"]);
        assert_eq!(ws.audit_records(first, 10).unwrap().len(), 1);
        assert_eq!(
            ws.audit_records(0, 1).unwrap()[0].subject,
            "x2",
            "the newest"
        );
        assert!(ws.append_audit("", "x", "{}").is_err());
        let body = "x".repeat(AUDIT_BODY_BYTES_MAX + 1);
        assert!(ws.append_audit("exec", "x", &body).is_err());
    }

    #[test]
    fn the_trail_keeps_its_newest_records() {
        let ws = Workspace::open_in_memory(Options::default()).unwrap();
        for n in 1..=5 {
            ws.append_audit("exec", &format!("x{n}"), "{}").unwrap();
        }
        // As if the fifth were the newest of a full window shifted by two.
        ws.db()
            .write(|txn| {
                txn.keep_revision();
                prune(txn, AUDIT_RECORDS_MAX + 2)
            })
            .unwrap();
        let subjects: Vec<String> = ws
            .audit_records(0, 10)
            .unwrap()
            .into_iter()
            .map(|r| r.subject)
            .collect();
        assert_eq!(subjects, ["x3", "x4", "x5"]);
    }
}
