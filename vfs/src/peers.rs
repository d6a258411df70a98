//! Peers: who replicates with this workspace, how far each has come, and applying their
//! changes without losing any version.
//!
//! Each side keeps a row per peer. The authoritative workspace has one per replica (and
//! later per execution backend); a replica has one, for its upstream. Both sides keep the
//! same two cursors:
//! - `delivered`: how far the peer has applied *our* changes (our revisions);
//! - `applied`: how far we have applied the *peer's* changes (its revisions).
//!
//! A cursor moves only in the transaction that does what it records, and never backwards.
//! Every transaction that applies a peer's batch and changes something is recorded in
//! `received` under that peer; every applied batch, whether it changed anything or not,
//! records in `applied_through` how far the peer's changes were applied as of our
//! revision then. That gives the rules everything else rests on:
//! - every change we send carries its *base*: how far we had applied the peer's
//!   changes when we made it (the latest `applied_through` row before it; a batch that
//!   found everything already in its state counts, or a path both sides filled the same
//!   way would look unseen to each forever);
//! - a change of the receiver's is *unseen* by an incoming change when the incoming
//!   change's base does not cover it and it was not received from that peer; only
//!   unseen changes can conflict with the peer's. (The peer's cursor *now* would not
//!   do: a removal made before a pull must not take what that pull brought.) A path
//!   is judged as the change log lists it, at the latest revision of its node and of
//!   the entries on the way to it: what came into a tree with an unseen move of a
//!   directory above it is unseen however old its own entries, and a directory of ours
//!   that took the peer's state since (directories merge) is the one the peer knows;
//! - changes received from a peer are never sent back to it, but for one: a state
//!   that lands on the authoritative side over a removal the peer had not seen (see
//!   `Meeting::Revived`) goes back, as the peer may hold another state there by then.
//!
//! Conflicts lose nothing. When both sides changed what is at a path, the authoritative
//! version stays at the path on both sides and the other is kept beside it as
//! `name.conflict-<peer>-<revision>`, which then replicates like any new file. A removal
//! never takes an unseen change with it: the removal of a directory takes only what the
//! remover had seen, and the removal of an unseen file is refused (the file comes back to
//! the remover).

use crate::access::Who;
use crate::db::WriteTxn;
use rusqlite::Connection;

use crate::block::BlockHash;
use crate::changes::{self, Admission, ChangeEntry, ChangePage, Cursor, EntryState, StoredBlock};
use crate::error::{Error, Result};
use crate::peer_rows::{self, PeerState};
use crate::store;
use crate::types::*;
use crate::workspace::Workspace;

/// The largest revision a database stores (revisions are SQLite integers).
const REVISION_MAX: u64 = i64::MAX as u64;

/// A path both sides changed. `kept_as` holds the version that did not stay at `path`
/// (equal to `path` when a removal was refused and the file stayed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    pub path: Vec<u8>,
    pub kept_as: Vec<u8>,
}

/// What applying a batch from a peer did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// How far the peer's changes are now applied.
    pub through: Cursor,
    /// Paths changed.
    pub changed: usize,
    pub conflicts: Vec<Conflict>,
    /// Every path the batch may have changed here, conflict copies included (what a
    /// mount must tell the kernel to forget).
    pub paths: Vec<Vec<u8>>,
}

impl Applied {
    /// Adds what one part of a batch did; its cursor becomes ours.
    fn absorb(&mut self, part: Applied) {
        self.through = part.through;
        self.changed += part.changed;
        self.conflicts.extend(part.conflicts);
        self.paths.extend(part.paths);
    }
}

/// The peer's record, refusing a replaced replica.
fn fenced(conn: &Connection, peer: &str, replica_id: &str) -> Result<PeerState> {
    match peer_rows::load(conn, peer)? {
        Some(state) if state.replica_id == replica_id => Ok(state),
        Some(_) => Err(Error::StaleReplica(Default::default())),
        None => Err(Error::invalid("unknown peer: register first")),
    }
}

/// Which of our changes a peer had when it made a change: those its `base` covers and
/// those we received from it.
struct PeerView<'a> {
    peer: &'a str,
    base: &'a Cursor,
    /// Files being written through staging files: their newest content is not in the
    /// database yet, so they count as changed whatever their revision says.
    dirty: &'a std::collections::HashSet<InodeNo>,
}

impl PeerView<'_> {
    /// Whether the change that left `path` at `revision` here may be unknown to the peer.
    fn unseen(&self, conn: &Connection, revision: Revision, path: &[u8]) -> Result<bool> {
        let at = Cursor {
            revision,
            path: path.to_vec(),
        };
        if changes::cursor_at_or_after(self.base, &at) {
            return Ok(false);
        }
        Ok(!peer_rows::received_from(conn, revision, self.peer)?)
    }
}

/// A node found at a path, with whether its binding there is unseen by the peer.
struct Found {
    parent: InodeNo,
    ino: InodeNo,
    attr: Attr,
    /// The latest revision of the entries on the way to the node, its own included:
    /// when the path last got bound (what the change log lists the path's subtree at).
    bound_at: Revision,
    /// That binding is unseen, and no state the peer sent for the path came after it.
    /// (A directory of ours that took the peer's state, as directories merge, is the
    /// one the peer knows at that path, however new our binding of it.)
    bound_unseen: bool,
}

/// Follows `path` literally (no symlinks); `None` when nothing is there.
fn find(conn: &Connection, path: &[u8], view: &PeerView<'_>) -> Result<Option<Found>> {
    let mut ino = InodeNo::ROOT;
    let mut parent = InodeNo::ROOT;
    let mut bound_at = Revision(0);
    for part in path.split(|&b| b == b'/').filter(|p| !p.is_empty()) {
        if !store::attr(conn, ino)?.is_dir() {
            return Ok(None);
        }
        let Some((child, child_bound_at)) = store::binding(conn, ino, part)? else {
            return Ok(None);
        };
        bound_at = bound_at.max(child_bound_at);
        parent = ino;
        ino = child;
    }
    let attr = store::attr(conn, ino)?;
    let taken_from_peer =
        attr.revision > bound_at && peer_rows::received_from(conn, attr.revision, view.peer)?;
    let bound_unseen = !taken_from_peer && view.unseen(conn, bound_at, path)?;
    Ok(Some(Found {
        parent,
        ino,
        attr,
        bound_at,
        bound_unseen,
    }))
}

/// The first node on the way to `path` (above it) that is not a directory, with its
/// path; `None` when the way is clear or ends at a missing directory.
fn find_blocker(
    conn: &Connection,
    path: &[u8],
    view: &PeerView<'_>,
) -> Result<Option<(Vec<u8>, Found)>> {
    let parts: Vec<&[u8]> = path
        .split(|&b| b == b'/')
        .filter(|p| !p.is_empty())
        .collect();
    let mut ino = InodeNo::ROOT;
    let mut walked = Vec::with_capacity(path.len());
    for part in parts.iter().take(parts.len().saturating_sub(1)) {
        walked.push(b'/');
        walked.extend_from_slice(part);
        let Some(child) = store::lookup(conn, ino, part)? else {
            return Ok(None);
        };
        if !store::attr(conn, child)?.is_dir() {
            return Ok(find(conn, &walked, view)?.map(|found| (walked, found)));
        }
        ino = child;
    }
    Ok(None)
}

/// A node below a directory, found by [`subtree`].
struct Below {
    path: Vec<u8>,
    is_dir: bool,
    /// Its path's state changed unseen: its node (a file's content, a directory's
    /// children or mode), or an entry on the way to it from the directory's binding on.
    unseen: bool,
}

/// Everything below directory `ino` (at `path`, bound there at `bound_at`), parents
/// before children.
///
/// Whether the peer has seen a path is decided as the change log lists it: at the
/// latest revision of its node and of the entries on the way to it. So a node that
/// came into the tree with an unseen move of a directory above it is unseen, however
/// old its own entries (the peer never had it at this path); one the peer sent after
/// such a move (a directory's state, as directories merge) is seen; and a directory
/// whose revision moved past the peer's base (a child added or removed, its mode
/// changed, a restamp) may never have reached the peer, however old its entry. A peer
/// that pulled it only after making a removal has it still: removing it here, in a
/// batch never sent back, would leave the sides different for good.
fn subtree(
    conn: &Connection,
    ino: InodeNo,
    path: &[u8],
    bound_at: Revision,
    view: &PeerView<'_>,
) -> Result<Vec<Below>> {
    let mut out = Vec::new();
    let mut stack = vec![(ino, path.to_vec(), bound_at)];
    while let Some((dir, dir_path, dir_bound_at)) = stack.pop() {
        for (child, name, child_bound_at) in store::bindings(conn, dir)? {
            let mut child_path = dir_path.clone();
            if child_path != b"/" {
                child_path.push(b'/');
            }
            child_path.extend_from_slice(&name);
            let attr = store::attr(conn, child)?;
            let bound_at = dir_bound_at.max(child_bound_at);
            let unseen = (!attr.is_dir() && view.dirty.contains(&child))
                || view.unseen(conn, bound_at.max(attr.revision), &child_path)?;
            if attr.is_dir() {
                stack.push((child, child_path.clone(), bound_at));
            }
            out.push(Below {
                path: child_path,
                is_dir: attr.is_dir(),
                unseen,
            });
        }
    }
    Ok(out)
}

/// How one incoming entry meets what is at its path here.
enum Meeting {
    /// Nothing unseen is in the way: apply the entry as it is.
    Apply,
    /// Already in that state.
    Same,
    /// An unseen version of ours is at the path and the entry would replace it.
    Clash,
    /// Both sides have a directory at the path and ours changed unseen: their children
    /// merge, and the authoritative side's mode and times stay.
    BothDirectories,
    /// An unseen non-directory of ours is at `at`, above the path, where the entry
    /// needs a directory (the peer made one there): the same clash, one level up.
    /// `parent` is its directory, `revision` its node's.
    Blocked {
        at: Vec<u8>,
        parent: InodeNo,
        revision: Revision,
    },
    /// The entry removes a directory holding unseen changes (or one that is itself an
    /// unseen change): remove only what the peer had seen, keep the rest.
    RemoveSeen(Removal),
    /// The entry removes an unseen file or symlink of ours: refused (and it is stamped
    /// as ours again, so it goes back to the remover).
    KeepOurs,
    /// A state for a path we removed (it or a directory above) without the peer having
    /// seen the removal: a file or symlink, or a directory where a directory above was
    /// made again since. It lands (a removal never takes an unseen change), and on the
    /// authoritative side it goes back to the peer: we had changes of that path the peer
    /// had not seen, which it may have taken since it made this one (a push held up
    /// while its sender pulled, whose own tree went aside as a conflict), so what the
    /// peer holds there need not be what it sent.
    Revived,
    /// A directory's state for a path we removed (it or a directory above) without the
    /// peer having seen the removal, with nothing made there again. On the authoritative
    /// side, by itself it would bring the directory back as received, never to be sent
    /// back, while the peer takes our removal: it lands only with news below it from the
    /// same batch (which makes the directory again anyway).
    RemovedHere,
}

fn meet(conn: &Connection, entry: &ChangeEntry, view: &PeerView<'_>) -> Result<Meeting> {
    let Some(found) = find(conn, &entry.path, view)? else {
        // Nothing here: a removal has nothing to do, anything else lands, unless a
        // version of ours that the peer never saw stands where it needs a directory.
        if entry.state == EntryState::Removed {
            return Ok(Meeting::Same);
        }
        let removal = removed_unseen(conn, &entry.path, view)?;
        if matches!(entry.state, EntryState::Directory { .. }) && removal == Some(Remade::No) {
            return Ok(Meeting::RemovedHere);
        }
        if let Some((at, blocker)) = find_blocker(conn, &entry.path, view)? {
            let unseen = blocker.bound_unseen
                || view.dirty.contains(&blocker.ino)
                || view.unseen(conn, blocker.attr.revision, &at)?;
            if unseen {
                return Ok(Meeting::Blocked {
                    at,
                    parent: blocker.parent,
                    revision: blocker.attr.revision,
                });
            }
        }
        if removal.is_some() {
            return Ok(Meeting::Revived);
        }
        // (A seen one the peer replaced with a directory: applying the entry drops it.)
        return Ok(Meeting::Apply);
    };
    if !view.dirty.contains(&found.ino) && changes::same_state(conn, &found.attr, &entry.state)? {
        return Ok(Meeting::Same);
    }
    if found.attr.is_dir() {
        if matches!(entry.state, EntryState::Directory { .. }) {
            // Directories merge: their content is their children, each its own entry.
            // Their own state (mode, times) is the authoritative side's when ours
            // changed unseen, as a file's would be: applied both ways, the states of
            // two messages that crossed (a push held up while its sender pulled) would
            // swap between the sides.
            if view.unseen(conn, found.attr.revision, &entry.path)? {
                return Ok(Meeting::BothDirectories);
            }
            return Ok(Meeting::Apply);
        }
        let below = subtree(conn, found.ino, &entry.path, found.bound_at, view)?;
        let kept_below = below.iter().any(|b| b.unseen);
        // The directory's own revision: its attributes, or a child added or removed.
        let touched = view.unseen(conn, found.attr.revision, &entry.path)?;
        if !found.bound_unseen && !kept_below && !touched {
            return Ok(Meeting::Apply);
        }
        return Ok(match entry.state {
            // Even when the directory itself is ours, unseen (it came here after the
            // peer's base): whatever came into it from the peer since, the peer had at
            // this path and removed; what came with it is unseen (`subtree`) and stays.
            EntryState::Removed => Meeting::RemoveSeen(seen_removals(&entry.path, &below)),
            _ => Meeting::Clash,
        });
    }
    let unseen = found.bound_unseen
        || view.dirty.contains(&found.ino)
        || view.unseen(conn, found.attr.revision, &entry.path)?;
    Ok(match (unseen, &entry.state) {
        (false, _) => Meeting::Apply,
        (true, EntryState::Removed) => Meeting::KeepOurs,
        (true, _) => Meeting::Clash,
    })
}

/// Whether what a removal left at a path was made again since.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Remade {
    /// Nothing stands where something was removed.
    No,
    /// Something stands there again: made since, or by the same mutation (a rename over
    /// an empty directory removes the old one and binds the new one at one revision).
    Yes,
}

/// Whether our latest removal of `path` or of a directory above it is unseen by the
/// peer; if so, whether every such removal was made again since (`Remade::Yes`: the
/// peer merges what stands there with its own, so a directory below it that the peer
/// sends is no news of a removed tree) or one still leaves nothing (`Remade::No`).
fn removed_unseen(conn: &Connection, path: &[u8], view: &PeerView<'_>) -> Result<Option<Remade>> {
    let mut found = None;
    let mut prefix = Vec::with_capacity(path.len());
    for part in path.split(|&b| b == b'/').filter(|p| !p.is_empty()) {
        prefix.push(b'/');
        prefix.extend_from_slice(part);
        let Some(removed) = store::last_removal(conn, &prefix)? else {
            continue;
        };
        if !view.unseen(conn, removed, &prefix)? {
            continue;
        }
        let stands = crate::log::binding(conn, &prefix)?.is_some_and(|bound| bound >= removed);
        if !stands {
            return Ok(Some(Remade::No));
        }
        found = Some(Remade::Yes);
    }
    Ok(found)
}

/// A removal cut down to what the peer had seen.
struct Removal {
    /// The top-most paths holding nothing unseen: removing these removes everything
    /// the peer had seen and nothing else.
    remove: Vec<Vec<u8>>,
    /// The directories that stay (the removed one and those on the way to what is
    /// kept). Removing their children stamps them as received, which would hide them
    /// from the peer, so they are stamped again as ours afterwards: the peer, which
    /// removed them, learns they are back.
    stay: Vec<Vec<u8>>,
}

/// Cuts the removal of the directory at `path` down to what the peer saw; `below` is
/// everything in it, parents before children. Linear in `below` (times the depth): a
/// peer removing a tree of a million entries, one of them unseen, must not stall the
/// server.
fn seen_removals(path: &[u8], below: &[Below]) -> Removal {
    // Every path holding something unseen: the unseen ones and the directories above.
    let mut holds_unseen: std::collections::HashSet<&[u8]> = Default::default();
    for unseen in below.iter().filter(|b| b.unseen) {
        for at in self_and_parents(&unseen.path) {
            if !holds_unseen.insert(at) {
                // Inserted before, with every directory above it.
                break;
            }
        }
    }
    let mut removed: std::collections::HashSet<&[u8]> = Default::default();
    let covered = |removed: &std::collections::HashSet<&[u8]>, item: &[u8]| {
        self_and_parents(item).any(|at| removed.contains(at))
    };
    let mut out: Vec<Vec<u8>> = Vec::new();
    for item in below {
        if covered(&removed, &item.path) || holds_unseen.contains(item.path.as_slice()) {
            continue;
        }
        debug_assert!(!item.unseen);
        removed.insert(&item.path);
        out.push(item.path.clone());
    }
    let mut stay = vec![path.to_vec()];
    stay.extend(
        below
            .iter()
            .filter(|b| b.is_dir && !covered(&removed, &b.path))
            .map(|b| b.path.clone()),
    );
    Removal { remove: out, stay }
}

/// `path` and each directory above it but the root, deepest first: `/a/b`, `/a`. A
/// path is within a directory other than the root (`is_within`) exactly when the
/// directory is one of these.
fn self_and_parents(path: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut end = Some(path.len());
    std::iter::from_fn(move || {
        let current = &path[..end?];
        end = current
            .iter()
            .rposition(|&b| b == b'/')
            .filter(|&slash| slash > 0);
        Some(current)
    })
}

/// Names for the losing version of `path`, in the order they are tried:
/// `path.conflict-<peer>-<revision>`, then with a counter.
fn conflict_candidates(
    path: &[u8],
    peer: &str,
    revision: Revision,
) -> impl Iterator<Item = Vec<u8>> {
    let tag: String = peer
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(12)
        .collect();
    let suffix = format!(".conflict-{tag}-{}", revision.0);
    // Room for the suffix and a counter within NAME_MAX: a long name gives way.
    let name_len = last_component(path).len();
    let keep = name_len.min(store::NAME_MAX - suffix.len() - 8);
    let mut base = path[..path.len() - name_len + keep].to_vec();
    base.extend_from_slice(suffix.as_bytes());
    (0u64..).map(move |n| {
        let mut candidate = base.clone();
        if n > 0 {
            candidate.extend_from_slice(format!("-{n}").as_bytes());
        }
        candidate
    })
}

/// A name for the losing version of `path`: `path.conflict-<peer>-<revision>`, or with
/// a counter if that is taken. Returns it and whether it already holds `state` (a
/// replayed batch finds the copy its first application made).
fn conflict_name(
    conn: &Connection,
    path: &[u8],
    peer: &str,
    revision: Revision,
    state: Option<&EntryState>,
) -> Result<(Vec<u8>, bool)> {
    for candidate in conflict_candidates(path, peer, revision) {
        let taken = match crate::resolve::resolve_in(
            conn,
            &candidate,
            false,
            crate::resolve::Symlinks::Follow,
        ) {
            Ok(r) => r.ino,
            Err(Error::NotFound(_)) | Err(Error::NotDir(_)) => None,
            Err(e) => return Err(e),
        };
        let Some(ino) = taken else {
            return Ok((candidate, false));
        };
        if let Some(state) = state {
            if changes::same_state(conn, &store::attr(conn, ino)?, state)? {
                return Ok((candidate, true));
            }
        }
    }
    unreachable!("the counter outlasts any directory")
}

/// Where the peer's version of `path` goes when a non-directory of ours at `at` (above
/// it) stays: under the directory `at.conflict-<peer>-<revision>` (or with a counter),
/// which entries of the same batch share. Returns it and whether it already holds
/// `state` (made by an earlier attempt).
fn blocked_conflict_name(
    conn: &Connection,
    at: &[u8],
    path: &[u8],
    peer: &str,
    revision: Revision,
    state: &EntryState,
) -> Result<(Vec<u8>, bool)> {
    let none = Default::default();
    let literal = PeerView {
        peer,
        base: &Cursor::START,
        dirty: &none,
    };
    let rest = &path[at.len()..];
    for dir in conflict_candidates(at, peer, revision) {
        let mut candidate = dir;
        candidate.extend_from_slice(rest);
        if let Some(found) = find(conn, &candidate, &literal)? {
            if changes::same_state(conn, &found.attr, state)? {
                return Ok((candidate, true));
            }
            continue;
        }
        if find_blocker(conn, &candidate, &literal)?.is_none() {
            return Ok((candidate, false));
        }
    }
    unreachable!("the counter outlasts any directory")
}

/// How often a batch is planned again because local changes raced its application.
const APPLY_ATTEMPTS: usize = 8;

/// What applying a batch will do.
#[derive(Default)]
struct Plan {
    /// Entries applied as received from the peer.
    batch: Vec<ChangeEntry>,
    conflicts: Vec<Conflict>,
    /// Authority::Ours: the peer's losing versions, written under conflict names
    /// outside the received batch so they travel back to the peer.
    copies: Vec<ChangeEntry>,
    /// Authority::Theirs: our losing versions, moved aside (parent, path, new path)
    /// before the batch.
    moves: Vec<(InodeNo, Vec<u8>, Vec<u8>)>,
    /// What a refused or cut-down removal leaves, and what came back over an unseen
    /// removal of ours, to stamp as ours after the batch.
    restamp: Vec<Vec<u8>>,
}

impl Plan {
    /// Authority::Ours: the peer's losing version of `entry` is written at `kept_as`,
    /// and the conflict reported.
    fn keep_copy(&mut self, entry: &ChangeEntry, kept_as: Vec<u8>) {
        self.conflicts.push(Conflict {
            path: entry.path.clone(),
            kept_as: kept_as.clone(),
        });
        self.copies.push(ChangeEntry {
            path: kept_as,
            ..entry.clone()
        });
    }
}

/// Which side's version stays at a contested path.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Authority {
    /// We are authoritative: ours stays, the peer's is kept beside it.
    Ours,
    /// The peer is: ours moves aside before the peer's lands.
    Theirs,
}

/// In the transaction that applied a peer's batch: the peer's changes through `through`
/// are applied here, as of our revision now (the one the batch takes, or the last one
/// when it changed nothing).
fn record_applied(
    txn: &WriteTxn<'_>,
    peer: &str,
    replica_id: &str,
    through: &Cursor,
) -> Result<()> {
    let mut state = fenced(txn, peer, replica_id)?;
    if !changes::cursor_at_or_after(&state.applied, through) {
        state.applied = through.clone();
        peer_rows::store(txn, &state)?;
    }
    let as_of = if txn.takes_revision() {
        peer_rows::record_received(txn, txn.revision, peer)?;
        txn.revision
    } else {
        Revision(txn.revision.0 - 1)
    };
    peer_rows::record_applied_through(txn, peer, as_of, through)
}

impl Authority {
    /// What the peer's batch must pass: our own checks when it pushes to us; as a pull
    /// from the upstream, which holds it already, only room for its content.
    fn admission(self) -> Admission {
        match self {
            Authority::Ours => Admission::Checked,
            Authority::Theirs => Admission::FromUpstream,
        }
    }
}

impl Workspace {
    /// The record of `peer`, if it ever synced.
    pub fn peer(&self, peer: &str) -> Result<Option<PeerState>> {
        self.db().read(|conn| peer_rows::load(conn, peer))
    }

    /// Records `peer` with local state `replica_id`. A known peer with another replica id
    /// lost its disk: its cursors start over (and whatever it held unpushed is lost to
    /// it, never mistaken for synced). Returns the record and whether it was reset.
    pub fn register_peer(&self, peer: &str, replica_id: &str) -> Result<(PeerState, bool)> {
        self.db().write(|txn| {
            txn.keep_revision();
            let existing = peer_rows::load(txn, peer)?;
            let (state, reset) = match existing {
                Some(state) if state.replica_id == replica_id => (state, false),
                other => (
                    PeerState {
                        peer: peer.to_owned(),
                        replica_id: replica_id.to_owned(),
                        delivered: Cursor::START,
                        applied: Cursor::START,
                    },
                    other.is_some(),
                ),
            };
            if reset {
                peer_rows::forget_history(txn, peer)?;
            }
            peer_rows::store(txn, &state)?;
            Ok((state, reset))
        })
    }

    /// Our changes after `cursor` that `peer` does not have: [`Workspace::changes_after`]
    /// without what we received from it. The page's `next` covers the dropped entries
    /// too.
    pub fn changes_for(
        &self,
        peer: &str,
        cursor: &Cursor,
        entries_max: usize,
        bytes_max: u64,
    ) -> Result<ChangePage> {
        // Revisions that applied the peer's own batches are passed over whole, before
        // anything of them is read: a replica that just pulled a large tree must not
        // read it all back only to find it is the server's.
        let mut page =
            self.changes_after_skipping(cursor, entries_max, bytes_max, &mut |conn, revision| {
                peer_rows::received_from(conn, revision, peer)
            })?;
        let drop: Vec<bool> = self.db().read(|conn| {
            page.entries
                .iter()
                .map(|e| {
                    // A removal of ours that the peer's version filled again since (our
                    // version moved aside under a conflict name, say) is not news to it.
                    if e.state == EntryState::Removed {
                        // Not for a directory: our removal still takes whatever of the
                        // old tree the peer had and we had seen.
                        let none = Default::default();
                        let view = PeerView {
                            peer,
                            base: &Cursor::START,
                            dirty: &none,
                        };
                        if let Some(found) = find(conn, &e.path, &view)? {
                            let now = found.attr.revision;
                            return Ok(!found.attr.is_dir()
                                && now > e.revision
                                && peer_rows::received_from(conn, now, peer)?);
                        }
                    }
                    Ok(false)
                })
                .collect()
        })?;
        let mut dropped = drop.into_iter();
        page.entries.retain(|_| !dropped.next().unwrap_or(false));
        self.db().read(|conn| {
            for entry in &mut page.entries {
                entry.base = peer_rows::base_of(conn, peer, entry.revision)?;
            }
            Ok(())
        })?;
        Ok(page)
    }

    /// The peer applied our changes through `cursor`. Never moves the record backwards;
    /// returns the record's cursor.
    pub fn mark_delivered(&self, peer: &str, replica_id: &str, cursor: &Cursor) -> Result<Cursor> {
        let current = self.db().read(|conn| fenced(conn, peer, replica_id))?;
        if changes::cursor_at_or_after(&current.delivered, cursor) {
            return Ok(current.delivered);
        }
        self.db().write(|txn| {
            txn.keep_revision();
            let mut state = fenced(txn, peer, replica_id)?;
            // A peer acknowledging changes that do not exist yet (a hostile or confused
            // one) would have the ones made up to there never sent to it.
            if cursor.revision > txn.previous_revision() {
                return Err(Error::invalid(
                    "the peer acknowledged changes past this workspace's revision",
                ));
            }
            if !changes::cursor_at_or_after(&state.delivered, cursor) {
                state.delivered = cursor.clone();
                peer_rows::store(txn, &state)?;
                // Received rows stay: an incoming change's base can be older than
                // this cursor, and deciding what it saw needs them. (One small row per
                // applied batch; pruning rows no node carries any more is future work.)
            }
            Ok(state.delivered)
        })
    }

    /// Authoritative side: applies a batch of a replica's changes, its cursor `through`
    /// after them. Where the replica's version meets an unseen one of ours, ours stays
    /// and theirs is kept under a conflict name (and travels back to the replica). A
    /// batch already applied changes nothing.
    pub fn apply_push(
        &self,
        peer: &str,
        replica_id: &str,
        entries: &[ChangeEntry],
        blocks: &[StoredBlock],
        through: &Cursor,
    ) -> Result<Applied> {
        self.apply_from(peer, replica_id, entries, blocks, through, Authority::Ours)
    }

    /// Replica side: applies a batch of upstream changes, its cursor `through` after
    /// them. Where upstream's version meets an unpushed one of ours, ours moves aside
    /// under a conflict name (and is pushed like any change) and upstream's lands.
    pub fn apply_pull(
        &self,
        upstream: &str,
        upstream_id: &str,
        entries: &[ChangeEntry],
        blocks: &[StoredBlock],
        through: &Cursor,
    ) -> Result<Applied> {
        self.apply_from(
            upstream,
            upstream_id,
            entries,
            blocks,
            through,
            Authority::Theirs,
        )
    }

    /// Applies a batch in parts: each removal that a later entry of the batch fills
    /// again (at or below its path: the peer removed a tree and made something there
    /// anew) ends a part, applied with the cursor just after it. In one revision, the
    /// removal and what filled the path again would be one mutation to our change
    /// log, which lists such a removal not at all (or after what it must come before):
    /// our other peers would keep what the peer removed.
    fn apply_from(
        &self,
        peer: &str,
        replica_id: &str,
        entries: &[ChangeEntry],
        blocks: &[StoredBlock],
        through: &Cursor,
        authority: Authority,
    ) -> Result<Applied> {
        // The cursor is stored as the peer's revision, a signed 64-bit integer: no
        // peer's log reaches past it.
        if through.revision.0 > REVISION_MAX {
            return Err(Error::invalid("a cursor past the largest revision"));
        }
        let mut applied = Applied::default();
        // Blocks a removal would free that a later part uses (a file moved out of the
        // tree and back) are held from one part to the next, and let go at the end.
        let mut held = Vec::new();
        let mut start = 0;
        let mut result = Ok(());
        for (at, entry) in entries.iter().enumerate() {
            let part_through = Cursor::after(entry);
            let filled_again = entry.state == EntryState::Removed
                && entries[at + 1..]
                    .iter()
                    .any(|later| is_within(&later.path, &entry.path));
            // (A batch out of order, past its own cursor, is applied whole.)
            if !filled_again || !changes::cursor_at_or_after(through, &part_through) {
                continue;
            }
            let later_blocks = changes::file_blocks(&entries[at + 1..]);
            result = self
                .apply_part(
                    peer,
                    replica_id,
                    &entries[start..=at],
                    blocks,
                    &later_blocks,
                    &part_through,
                    authority,
                )
                .map(|(part, part_held)| {
                    applied.absorb(part);
                    held.extend(part_held);
                });
            if result.is_err() {
                break;
            }
            start = at + 1;
        }
        if result.is_ok() {
            result = self
                .apply_part(
                    peer,
                    replica_id,
                    &entries[start..],
                    blocks,
                    &[],
                    through,
                    authority,
                )
                .map(|(last, _)| applied.absorb(last));
        }
        self.release_held(&held)?;
        if applied.changed > 0 {
            // A peer's chmod may have given an open file set-id bits back.
            self.setid_may_be_back(None);
        }
        result.map(|()| applied)
    }

    /// Applies entries of a peer's batch atomically with the cursor `through`, holding
    /// the stored blocks of `hold` for a later part; returns the holds it made.
    #[allow(clippy::too_many_arguments)]
    fn apply_part(
        &self,
        peer: &str,
        replica_id: &str,
        entries: &[ChangeEntry],
        blocks: &[StoredBlock],
        hold: &[BlockHash],
        through: &Cursor,
        authority: Authority,
    ) -> Result<(Applied, Vec<i64>)> {
        // The plan is made inside the transaction that applies it, so no local change
        // (a write through the mount) can land between deciding and applying. A plan
        // that needs steps of its own first (conflict copies, our versions moved aside:
        // changes of ours, so never in the received transaction) writes nothing; the
        // steps run, and the batch is planned again.
        let mut conflicts = Vec::new();
        let mut paths: Vec<Vec<u8>> = Vec::new();
        for _ in 0..APPLY_ATTEMPTS {
            let record = self.db().read(|conn| fenced(conn, peer, replica_id))?;
            if changes::cursor_at_or_after(&record.applied, through) {
                let applied = Applied {
                    through: record.applied,
                    conflicts,
                    paths,
                    ..Applied::default()
                };
                return Ok((applied, Vec::new()));
            }
            let dirty = self.dirty_staged();
            let planned = std::cell::RefCell::new(Plan::default());
            let outcome = self.apply_changes_with(
                authority.admission(),
                blocks,
                hold,
                |txn| {
                    // Entries the record already covers were applied by an earlier
                    // delivery of them (a push whose answer was lost, so the peer
                    // sends them again): applying them now would bring back what we
                    // changed since, a state the peer no longer holds.
                    let applied = fenced(txn, peer, replica_id)?.applied;
                    let plan = plan(txn, peer, entries, &applied, authority, &dirty)?;
                    let batch = plan.batch.clone();
                    let steps_first = !plan.copies.is_empty() || !plan.moves.is_empty();
                    *planned.borrow_mut() = plan;
                    Ok(if steps_first { Err(()) } else { Ok(batch) })
                },
                |txn| record_applied(txn, peer, replica_id, through),
            );
            let plan = planned.into_inner();
            match outcome {
                Ok(Ok((changed, held))) => {
                    conflicts.extend(plan.conflicts);
                    paths.extend(plan.batch.iter().map(|e| e.path.clone()));
                    let applied = Applied {
                        through: through.clone(),
                        changed,
                        conflicts,
                        paths,
                    };
                    return match self.restamp(&plan.restamp) {
                        Ok(()) => Ok((applied, held)),
                        Err(e) => {
                            self.release_held(&held)?;
                            Err(e)
                        }
                    };
                }
                Ok(Err(())) => {
                    // Conflict steps first; their conflicts are reported once, here.
                    self.conflict_steps(&plan, blocks, &mut conflicts, &mut paths)?;
                }
                // A file became busy being written between the plan and its apply:
                // plan again against what is there now.
                Err(Error::Busy(_)) => {}
                Err(err) => return Err(err),
            }
        }
        // Local changes keep landing: try again later (a transient failure).
        Err(Error::Busy(Default::default()))
    }

    /// Writes the peer's losing versions under conflict names, or moves ours aside.
    fn conflict_steps(
        &self,
        plan: &Plan,
        blocks: &[StoredBlock],
        conflicts: &mut Vec<Conflict>,
        paths: &mut Vec<Vec<u8>>,
    ) -> Result<()> {
        if !plan.copies.is_empty() {
            self.apply_changes(&plan.copies, blocks)?;
            for copy in &plan.copies {
                paths.push(copy.path.clone());
                if let Some(c) = plan.conflicts.iter().find(|c| c.kept_as == copy.path) {
                    conflicts.push(c.clone());
                }
            }
        }
        for (parent, path, kept_as) in &plan.moves {
            // A local rename: it replicates like any change of ours.
            self.rename(
                Who::Trusted,
                *parent,
                last_component(path),
                *parent,
                last_component(kept_as),
                RenameFlags {
                    no_replace: true,
                    ..RenameFlags::default()
                },
            )?;
            paths.push(kept_as.clone());
            conflicts.push(Conflict {
                path: path.clone(),
                kept_as: kept_as.clone(),
            });
        }
        Ok(())
    }

    /// Stamps what a refused or cut-down removal left (and what came back over an unseen
    /// removal) as changed here, so the peer learns what stands there now.
    fn restamp(&self, paths: &[Vec<u8>]) -> Result<()> {
        if paths.is_empty() {
            return Ok(());
        }
        let now = self.now();
        let none = Default::default();
        self.db().write(|txn| {
            let view = PeerView {
                peer: "",
                base: &Cursor::START,
                dirty: &none,
            };
            for path in paths {
                if let Some(found) = find(txn, path, &view)? {
                    store::touch_ctime(txn, found.ino, now)?;
                }
            }
            Ok(())
        })
    }
}

/// Whether `path` is `dir` or below it.
fn is_within(path: &[u8], dir: &[u8]) -> bool {
    path.starts_with(dir) && (path.len() == dir.len() || path[dir.len()] == b'/' || dir == b"/")
}

/// Decides what to do with each incoming entry past `applied` (how far the peer's
/// changes are applied here), against the state on `conn`.
fn plan(
    conn: &Connection,
    peer: &str,
    entries: &[ChangeEntry],
    applied: &Cursor,
    authority: Authority,
    dirty: &std::collections::HashSet<InodeNo>,
) -> Result<Plan> {
    let mut plan = Plan::default();
    {
        // Paths an earlier entry of this batch removes: the snapshot still shows
        // what was there, but a later entry (the same path filled again) meets
        // nothing.
        let mut cleared: Vec<Vec<u8>> = Vec::new();
        let fresh = entries
            .iter()
            .filter(|e| !changes::cursor_at_or_after(applied, &Cursor::after(e)));
        for entry in fresh {
            let view = PeerView {
                peer,
                base: &entry.base,
                dirty,
            };
            let meeting = if cleared.iter().any(|c| is_within(&entry.path, c)) {
                Meeting::Apply
            } else {
                meet(conn, entry, &view)?
            };
            match meeting {
                Meeting::Same => {}
                Meeting::Apply => {
                    if entry.state == EntryState::Removed {
                        cleared.push(entry.path.clone());
                    }
                    plan.batch.push(entry.clone());
                }
                Meeting::Revived => {
                    plan.batch.push(entry.clone());
                    // Received, it would never travel back; stamped as ours, it does
                    // (and meets a peer that still holds it as the same state). A
                    // replica need not: the upstream takes no state of ours but by
                    // our pushes, so what it holds is what it sent or newer.
                    if authority == Authority::Ours {
                        plan.restamp.push(entry.path.clone());
                    }
                }
                Meeting::KeepOurs => {
                    plan.conflicts.push(Conflict {
                        path: entry.path.clone(),
                        kept_as: entry.path.clone(),
                    });
                    // What stays must go back to the remover, which no longer has it.
                    // Its own change is usually ours to send already, but not always:
                    // a directory of ours whose state was merged from the peer's
                    // carries a received revision, and would never travel.
                    plan.restamp.push(entry.path.clone());
                }
                Meeting::RemoveSeen(Removal { remove, stay }) => {
                    plan.conflicts.push(Conflict {
                        path: entry.path.clone(),
                        kept_as: entry.path.clone(),
                    });
                    cleared.extend(remove.iter().cloned());
                    plan.restamp.extend(stay);
                    plan.batch
                        .extend(remove.into_iter().map(|path| ChangeEntry {
                            revision: entry.revision,
                            path,
                            state: EntryState::Removed,
                            base: entry.base.clone(),
                        }));
                }
                Meeting::RemovedHere => {
                    // The authoritative side's state wins on a replica: it makes the
                    // directory again, and the replica's removal, listed before what
                    // made it again, goes up with its next push.
                    let news_below = plan.batch.iter().any(|e| is_within(&e.path, &entry.path));
                    if authority == Authority::Theirs || news_below {
                        plan.batch.push(entry.clone());
                    }
                }
                Meeting::BothDirectories => {
                    if authority == Authority::Theirs {
                        plan.batch.push(entry.clone());
                    }
                }
                Meeting::Blocked {
                    at,
                    parent,
                    revision,
                } => match authority {
                    Authority::Ours => {
                        let (kept_as, made) = blocked_conflict_name(
                            conn,
                            &at,
                            &entry.path,
                            peer,
                            entry.revision,
                            &entry.state,
                        )?;
                        if !made {
                            plan.keep_copy(entry, kept_as);
                        }
                    }
                    Authority::Theirs => {
                        // Several entries of the batch may need the same directory.
                        if !plan.moves.iter().any(|(_, path, _)| *path == at) {
                            let (kept_as, _) = conflict_name(conn, &at, peer, revision, None)?;
                            plan.moves.push((parent, at, kept_as));
                        }
                        plan.batch.push(entry.clone());
                    }
                },
                Meeting::Clash => match authority {
                    Authority::Ours => {
                        let (kept_as, made) = conflict_name(
                            conn,
                            &entry.path,
                            peer,
                            entry.revision,
                            Some(&entry.state),
                        )?;
                        // Made by an earlier attempt or an earlier copy of this
                        // batch: reported then.
                        if !made {
                            plan.keep_copy(entry, kept_as);
                        }
                    }
                    Authority::Theirs => {
                        let found = find(conn, &entry.path, &view)?
                            .ok_or_else(|| Error::invalid("a contested path vanished"))?;
                        // An entry below it may have asked for the same move (Blocked).
                        if !plan.moves.iter().any(|(_, path, _)| *path == entry.path) {
                            let (kept_as, _) =
                                conflict_name(conn, &entry.path, peer, found.attr.revision, None)?;
                            plan.moves.push((found.parent, entry.path.clone(), kept_as));
                        }
                        plan.batch.push(entry.clone());
                    }
                },
            }
        }
    }
    Ok(plan)
}

fn last_component(path: &[u8]) -> &[u8] {
    path.rsplit(|&b| b == b'/').next().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The removal cut as first written, quadratic: the reference for the linear one.
    fn seen_removals_by_scanning(path: &[u8], below: &[Below]) -> Removal {
        let keeps = |path: &[u8]| below.iter().any(|b| b.unseen && is_within(&b.path, path));
        let mut out: Vec<Vec<u8>> = Vec::new();
        for item in below {
            let covered = out.iter().any(|p| is_within(&item.path, p));
            if covered || keeps(&item.path) {
                continue;
            }
            out.push(item.path.clone());
        }
        let mut stay = vec![path.to_vec()];
        stay.extend(
            below
                .iter()
                .filter(|b| b.is_dir && !out.iter().any(|p| is_within(&b.path, p)))
                .map(|b| b.path.clone()),
        );
        Removal { remove: out, stay }
    }

    /// A tree below `/top`, parents before children, from (parent choice, is a
    /// directory, unseen) triples. Names share prefixes (`d1`, `d1-`, `d10`), the case
    /// a byte-prefix test of paths gets wrong.
    fn tree(nodes: &[(usize, bool, bool)]) -> Vec<Below> {
        let mut below: Vec<Below> = Vec::new();
        for (i, &(parent, is_dir, unseen)) in nodes.iter().enumerate() {
            let dirs: Vec<&Below> = below.iter().filter(|b| b.is_dir).collect();
            let parent_path = match parent % (dirs.len() + 1) {
                0 => b"/top".to_vec(),
                n => dirs[n - 1].path.clone(),
            };
            let name = format!("d{}{}", i / 3, ["", "-", "0"][i % 3]);
            let mut path = parent_path;
            path.push(b'/');
            path.extend_from_slice(name.as_bytes());
            if below.iter().any(|b| b.path == path) {
                continue;
            }
            below.push(Below {
                path,
                is_dir,
                unseen,
            });
        }
        below
    }

    proptest! {
        #[test]
        fn the_linear_cut_is_the_scanning_one(
            nodes in prop::collection::vec((0usize..64, any::<bool>(), prop::bool::weighted(0.1)), 0..120)
        ) {
            let below = tree(&nodes);
            let fast = seen_removals(b"/top", &below);
            let slow = seen_removals_by_scanning(b"/top", &below);
            prop_assert_eq!(fast.remove, slow.remove);
            prop_assert_eq!(fast.stay, slow.stay);
        }
    }

    #[test]
    fn self_and_parents_lists_each_directory_above_but_the_root() {
        let listed: Vec<&[u8]> = self_and_parents(b"/a/bc/d").collect();
        assert_eq!(listed, [&b"/a/bc/d"[..], b"/a/bc", b"/a"]);
        assert_eq!(self_and_parents(b"/a").collect::<Vec<_>>(), [&b"/a"[..]]);
    }
}
