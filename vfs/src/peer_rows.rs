//! What a workspace remembers of its peers, as rows: where each peer stands (`peers`),
//! which of our revisions carried a peer's changes (`received`), and how far we had
//! applied a peer's changes at each of our revisions (`applied_through`). `peers.rs`
//! decides what to send and how to merge; this is its memory.

use rusqlite::{params, Connection, OptionalExtension};

use crate::change_page::Cursor;
use crate::db::WriteTxn;
use crate::error::{Result, StorageContext};
use crate::types::Revision;

/// Where a peer stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerState {
    pub peer: String,
    /// The identity of the peer's local state; a peer that comes back with another one
    /// lost its disk and starts over.
    pub replica_id: String,
    /// How far the peer has applied this workspace's changes (our revisions).
    pub delivered: Cursor,
    /// How far this workspace has applied the peer's changes (the peer's revisions).
    pub applied: Cursor,
}

pub(crate) fn load(conn: &Connection, peer: &str) -> Result<Option<PeerState>> {
    conn.prepare_cached(
        "SELECT replica_id, delivered_rev, delivered_path, applied_rev, applied_path
         FROM peers WHERE peer = ?1",
    )
    .and_then(|mut s| {
        s.query_row([peer], |r| {
            Ok(PeerState {
                peer: peer.to_owned(),
                replica_id: r.get(0)?,
                delivered: Cursor {
                    revision: Revision(r.get::<_, i64>(1)? as u64),
                    path: r.get(2)?,
                },
                applied: Cursor {
                    revision: Revision(r.get::<_, i64>(3)? as u64),
                    path: r.get(4)?,
                },
            })
        })
        .optional()
    })
    .ctx("reading a peer")
}

pub(crate) fn store(conn: &Connection, state: &PeerState) -> Result<()> {
    #[cfg(debug_assertions)]
    assert_cursors_forward(conn, state)?;
    conn.prepare_cached(
        "INSERT OR REPLACE INTO peers
           (peer, replica_id, delivered_rev, delivered_path, applied_rev, applied_path)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )
    .and_then(|mut s| {
        s.execute(params![
            state.peer,
            state.replica_id,
            state.delivered.revision.0 as i64,
            state.delivered.path,
            state.applied.revision.0 as i64,
            state.applied.path
        ])
    })
    .ctx("recording a peer")?;
    Ok(())
}

/// Debug builds: a peer's cursors never move backwards while it is the same replica (a
/// replica that lost its disk starts over under a new id).
#[cfg(debug_assertions)]
fn assert_cursors_forward(conn: &Connection, state: &PeerState) -> Result<()> {
    let Some(old) = load(conn, &state.peer)? else {
        return Ok(());
    };
    if old.replica_id == state.replica_id {
        for (name, new, old) in [
            ("delivered", &state.delivered, &old.delivered),
            ("applied", &state.applied, &old.applied),
        ] {
            assert!(
                crate::change_page::cursor_at_or_after(new, old),
                "peer {}: {name} cursor moved back from {old:?} to {new:?}",
                state.peer
            );
        }
    }
    Ok(())
}

/// How far we had applied `peer`'s changes when we made our change at `revision`.
pub(crate) fn base_of(conn: &Connection, peer: &str, revision: Revision) -> Result<Cursor> {
    conn.prepare_cached(
        "SELECT through_rev, through_path FROM applied_through
         WHERE peer = ?1 AND revision < ?2 ORDER BY revision DESC LIMIT 1",
    )
    .and_then(|mut s| {
        s.query_row(params![peer, revision.0 as i64], |r| {
            Ok(Cursor {
                revision: Revision(r.get::<_, i64>(0)? as u64),
                path: r.get(1)?,
            })
        })
        .optional()
    })
    .map(|c| c.unwrap_or(Cursor::START))
    .ctx("reading how far a peer's changes were applied")
}

pub(crate) fn received_from(conn: &Connection, revision: Revision, peer: &str) -> Result<bool> {
    conn.prepare_cached("SELECT 1 FROM received WHERE revision = ?1 AND peer = ?2")
        .and_then(|mut s| s.exists(params![revision.0 as i64, peer]))
        .ctx("reading received revisions")
}

/// Records that our revision `revision` carried changes of `peer`.
pub(crate) fn record_received(txn: &WriteTxn<'_>, revision: Revision, peer: &str) -> Result<()> {
    txn.prepare_cached("INSERT OR REPLACE INTO received (revision, peer) VALUES (?1, ?2)")
        .and_then(|mut s| s.execute(params![revision.0 as i64, peer]))
        .ctx("recording a received revision")?;
    Ok(())
}

/// Records that as of our revision `as_of`, `peer`'s changes through `through` are
/// applied here.
pub(crate) fn record_applied_through(
    txn: &WriteTxn<'_>,
    peer: &str,
    as_of: Revision,
    through: &Cursor,
) -> Result<()> {
    txn.prepare_cached(
        "INSERT INTO applied_through (peer, revision, through_rev, through_path)
         VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (peer, revision) DO UPDATE
         SET through_rev = excluded.through_rev,
             through_path = excluded.through_path",
    )
    .and_then(|mut s| {
        s.execute(params![
            peer,
            as_of.0 as i64,
            through.revision.0 as i64,
            through.path
        ])
    })
    .ctx("recording how far a peer's changes were applied")?;
    Ok(())
}

/// Forgets what `peer` sent and how far it was applied: it came back as another replica.
pub(crate) fn forget_history(txn: &WriteTxn<'_>, peer: &str) -> Result<()> {
    for sql in [
        "DELETE FROM received WHERE peer = ?1",
        "DELETE FROM applied_through WHERE peer = ?1",
    ] {
        txn.execute(sql, [peer]).ctx("forgetting a replaced peer")?;
    }
    Ok(())
}
