//! What must hold, checked against the databases themselves (never against what the
//! simulation believes it did): cursors, store integrity, log writes, and at the end
//! identical trees with nothing left to push.

use std::collections::BTreeMap;

use computer_vfs::{cursor_at_or_after, Cursor, EntryState, PeerState, Revision, Workspace};

use super::net::show_cursor;
use super::replicas::Attempt;
use super::{ensure, Check, Side, Sim};
use crate::UPSTREAM;

/// A tree as replication sees it: every live path, the revision of its last change
/// there (which differs between sides) and its state (which must not).
type Tree = BTreeMap<Vec<u8>, (Revision, EntryState)>;

/// Paths of a difference listed in a failure, at most.
const DIFFERENCES_LISTED_MAX: usize = 8;

impl Sim {
    /// After every step: on both sides, no cursor moved backwards, and neither side
    /// claims more of the other than the other did.
    pub(super) fn check_cursors(&mut self) -> Check {
        let server = self.server();
        let server_revision = server
            .revision()
            .map_err(|e| format!("reading the server's revision: {e}"))?;
        for index in 0..self.slots.len() {
            let slot = &self.slots[index];
            let ws = slot.workspace();
            let on_server = server
                .peer(&slot.peer)
                .map_err(|e| format!("reading the server's record of r{index}: {e}"))?;
            let upstream = ws
                .peer(UPSTREAM)
                .map_err(|e| format!("reading r{index}'s upstream record: {e}"))?;
            match (&self.server_seen[index], &on_server) {
                (Some(_), None) => return Err(format!("the server forgot peer r{index}")),
                // A record under another replica id is a new replica's: it starts over.
                (Some(before), Some(now)) if before.replica_id == now.replica_id => {
                    forward(before, now, &format!("the server's record of r{index}"))?;
                }
                _ => {}
            }
            match (&slot.upstream_seen, &upstream) {
                (Some(_), None) => return Err(format!("r{index} forgot its upstream record")),
                (Some(before), Some(now)) => {
                    ensure!(
                        before.replica_id == now.replica_id,
                        "r{index}'s upstream record changed workspace: {} then {}",
                        before.replica_id,
                        now.replica_id
                    );
                    forward(before, now, &format!("r{index}'s upstream record"))?;
                }
                _ => {}
            }
            if let Some(upstream) = &upstream {
                ensure!(
                    upstream.applied.revision <= server_revision,
                    "r{index} claims to have applied the server's changes through {}, past \
                     the server's revision {}",
                    show_cursor(&upstream.applied),
                    server_revision.0
                );
            }
            match &on_server {
                Some(record) if record.replica_id == ws.id() => {
                    let replica_revision = ws
                        .revision()
                        .map_err(|e| format!("reading r{index}'s revision: {e}"))?;
                    ensure!(
                        record.applied.revision <= replica_revision,
                        "the server claims to have applied r{index}'s changes through {}, \
                         past r{index}'s revision {}",
                        show_cursor(&record.applied),
                        replica_revision.0
                    );
                    let (applied_here, delivered_here) = match &upstream {
                        Some(u) => (u.applied.clone(), u.delivered.clone()),
                        // Registered by a hello whose answer never came back: nothing
                        // else can have happened yet.
                        None => (Cursor::START, Cursor::START),
                    };
                    ensure!(
                        cursor_at_or_after(&applied_here, &record.delivered),
                        "the server believes r{index} applied its changes through {}, r{index} \
                         applied them only through {}",
                        show_cursor(&record.delivered),
                        show_cursor(&applied_here)
                    );
                    // The replica moves `delivered` past its echoes (changes it received
                    // from upstream) without telling the server, so the server's cursor
                    // may lag it; but no change of the replica's own may lie between.
                    if let Some(unapplied) =
                        first_unapplied(ws, &record.applied, &delivered_here)
                            .map_err(|e| format!("reading r{index}'s changes: {e}"))?
                    {
                        return Err(format!(
                            "r{index} believes the server applied its changes through {}, but \
                             the server applied them only through {}, before r{index}'s change \
                             {}",
                            show_cursor(&delivered_here),
                            show_cursor(&record.applied),
                            show_cursor(&unapplied)
                        ));
                    }
                }
                _ => {}
            }
            self.server_seen[index] = on_server;
            self.slots[index].upstream_seen = upstream;
        }
        Ok(())
    }

    /// Every database passes its integrity check (block reference counts match the
    /// trees, every block decodes, every entry points at a live node, ...).
    pub(super) fn check_stores(&mut self) -> Check {
        check_store("the server", &self.server())?;
        for slot in &self.slots {
            check_store(&slot.peer, slot.workspace())?;
        }
        Ok(())
    }

    /// After a successful sync of replica `index`: its log writes from before the sync
    /// are on the server, and the log writes known to be on the server when it started
    /// are on the replica.
    pub(super) fn check_synced(&mut self, index: usize, attempt: &Attempt) -> Check {
        let server = self.server();
        let ws = self.slots[index].workspace().clone();
        let generation = self.slots[index].generation;
        let side = Side::Replica(index);
        for (at, write) in self.writes.iter_mut().enumerate() {
            if write.side == side
                && write.generation == generation
                && write.ops_at <= attempt.ops_at_start
            {
                ensure!(
                    holds(&server, &write.path, &write.content)?,
                    "r{index} synced, but its log write {} (made before the sync) is not on \
                     the server",
                    write.path
                );
                write.on_server = true;
            }
            if attempt.on_server_at_start.binary_search(&at).is_ok() {
                ensure!(
                    holds(&ws, &write.path, &write.content)?,
                    "r{index} synced, but {}'s log write {} (on the server before the sync) \
                     is not on r{index}",
                    write.side,
                    write.path
                );
            }
        }
        Ok(())
    }

    /// At the end, once settled: every database is sound, all trees are identical,
    /// every acknowledged log write is on every side (those of a lost disk only if they
    /// reached the server), nothing waits to be pushed, every pending sync has ended.
    pub(super) fn final_checks(&mut self) -> Check {
        self.check_cursors()?;
        self.check_stores()?;
        for index in 0..self.slots.len() {
            ensure!(
                self.slots[index].attempt.is_none(),
                "r{index} still has a sync in flight"
            );
            ensure!(
                !self.unpushed(index)?,
                "r{index} still has changes to push after settling"
            );
            if let Some(pending) = &self.slots[index].pending {
                return Err(format!(
                    "r{index}'s pending sync #{} is still open after settling",
                    pending.record
                ));
            }
        }
        for (number, record) in self.ledger.iter().enumerate() {
            ensure!(
                record.end.is_some(),
                "pending sync #{number} of r{} (generation {}, opened at step {} because {}) \
                 never ended",
                record.replica,
                record.generation,
                record.opened,
                record.why
            );
        }
        let server = self.server();
        let server_tree = tree(&server).map_err(|e| format!("the server: {e}"))?;
        for slot in &self.slots {
            let replica_tree = tree(slot.workspace()).map_err(|e| format!("{}: {e}", slot.peer))?;
            let same = replica_tree.len() == server_tree.len()
                && replica_tree
                    .iter()
                    .zip(&server_tree)
                    .all(|((p, (_, a)), (q, (_, b)))| p == q && a == b);
            if !same {
                return Err(format!(
                    "after settling, {}'s tree differs from the server's:\n{}",
                    slot.peer,
                    differences(&server_tree, &replica_tree)
                ));
            }
        }
        let mut sides: Vec<(String, Workspace)> = vec![("the server".into(), server)];
        sides.extend(
            self.slots
                .iter()
                .map(|s| (s.peer.clone(), s.workspace().clone())),
        );
        for write in self.writes.iter().filter(|w| !w.lost) {
            for (name, ws) in &sides {
                ensure!(
                    holds(ws, &write.path, &write.content)?,
                    "{}'s log write {} (made at step count {}) is missing or wrong on {name}",
                    write.side,
                    write.path,
                    write.ops_at
                );
            }
        }
        Ok(())
    }
}

/// The first state of the replica's own (not received from upstream) after `applied`
/// (how far the server applied its changes) and at or before `delivered` (how far the
/// replica believes it did): one the replica wrongly takes as delivered. Removals do
/// not count: one whose path the server's version filled again is rightly skipped
/// (`Workspace::changes_for`), and shows again once the path changes here, superseded
/// by that later state.
fn first_unapplied(
    ws: &Workspace,
    applied: &Cursor,
    delivered: &Cursor,
) -> computer_vfs::Result<Option<Cursor>> {
    let mut from = applied.clone();
    while !cursor_at_or_after(&from, delivered) {
        let page = ws.changes_for(UPSTREAM, &from, 64, u64::MAX)?;
        for entry in &page.entries {
            let at = Cursor::after(entry);
            if !cursor_at_or_after(delivered, &at) {
                return Ok(None);
            }
            if entry.state != EntryState::Removed {
                return Ok(Some(at));
            }
        }
        if page.complete {
            break;
        }
        from = page.next;
    }
    Ok(None)
}

/// `now` is at or past `before` in both cursors.
fn forward(before: &PeerState, now: &PeerState, what: &str) -> Check {
    for (name, b, n) in [
        ("delivered", &before.delivered, &now.delivered),
        ("applied", &before.applied, &now.applied),
    ] {
        ensure!(
            cursor_at_or_after(n, b),
            "{what}: cursor {name} moved backwards, from {} to {}",
            show_cursor(b),
            show_cursor(n)
        );
    }
    Ok(())
}

fn check_store(name: &str, ws: &Workspace) -> Check {
    let report = ws
        .check()
        .map_err(|e| format!("checking {name}'s database: {e}"))?;
    if report.is_ok() {
        return Ok(());
    }
    let problems: Vec<String> = report.problems.iter().map(|p| p.to_string()).collect();
    Err(format!(
        "{name}'s database fails its check ({} more unlisted):\n  {}",
        report.problems_unlisted,
        problems.join("\n  ")
    ))
}

/// Whether `ws` has a file at `path` holding exactly `content`.
fn holds(ws: &Workspace, path: &str, content: &[u8]) -> Result<bool, String> {
    match ws.fs().read_file(path) {
        Ok(found) => Ok(found == content),
        Err(computer_vfs::Error::NotFound(_)) | Err(computer_vfs::Error::NotDir(_)) => Ok(false),
        Err(e) => Err(format!("reading {path}: {e}")),
    }
}

/// Every live path of `ws` with its state, as replication would send it.
fn tree(ws: &Workspace) -> Result<Tree, String> {
    let page = ws
        .changes_after(&Cursor::START, usize::MAX, u64::MAX)
        .map_err(|e| format!("reading the tree: {e}"))?;
    ensure!(page.complete, "the tree did not fit one page");
    Ok(page
        .entries
        .into_iter()
        .filter(|e| e.state != EntryState::Removed)
        .map(|e| (e.path, (e.revision, e.state)))
        .collect())
}

/// The first few paths where two trees differ, one a line.
fn differences(server: &Tree, replica: &Tree) -> String {
    let mut paths: Vec<&Vec<u8>> = server.keys().chain(replica.keys()).collect();
    paths.sort();
    paths.dedup();
    let lines: Vec<String> = paths
        .into_iter()
        .filter(|p| server.get(*p).map(|e| &e.1) != replica.get(*p).map(|e| &e.1))
        .take(DIFFERENCES_LISTED_MAX)
        .map(|p| {
            format!(
                "  {}: server {}, replica {}",
                String::from_utf8_lossy(p),
                describe(server.get(p)),
                describe(replica.get(p))
            )
        })
        .collect();
    lines.join("\n")
}

fn describe(found: Option<&(Revision, EntryState)>) -> String {
    let Some((revision, state)) = found else {
        return "nothing".into();
    };
    let what = match state {
        EntryState::Removed => "removed".into(),
        EntryState::File {
            perm,
            mtime,
            size,
            blocks,
        } => format!(
            "file of {size} bytes in {} blocks, mode {perm:o}, mtime {mtime}",
            blocks.len()
        ),
        EntryState::Directory { perm, mtime } => {
            format!("directory, mode {perm:o}, mtime {mtime}")
        }
        EntryState::Symlink { target } => {
            format!("symlink to {:?}", String::from_utf8_lossy(target))
        }
    };
    format!("{what} (since revision {})", revision.0)
}
