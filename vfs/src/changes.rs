//! The change log as replication reads and writes it: the state of every path that
//! changed after a cursor, and applying such states from another workspace.
//!
//! Entries are *states*, not operations: "`/a/b` is now a file with these blocks", "`/c`
//! is gone". A path appears once per page, at the revision of its last change, so a
//! receiver that applies pages in order ends with the sender's tree whatever it missed
//! in between. A directory moved (or created) after the cursor brings its whole subtree,
//! because every path below it changed; a tombstone removes everything below its path.
//! Entries carry block hashes, never bytes: the receiver fetches the blocks it lacks.
//!
//! Hard links are not preserved across replication: each name is its own file (as in
//! the reference system). Applying a state equal to the current one changes nothing,
//! so applying a page twice, or a sender's echo of our own change, is a no-op.

use std::collections::HashMap;

use rusqlite::Connection;

use crate::block::{BlockHash, EncodedBlock};
use crate::content::{self, Extent};
use crate::db::WriteTxn;
use crate::error::{kind, Error, Result};
use crate::loose_blocks;
use crate::store;
use crate::types::*;
use crate::workspace::Workspace;

pub use crate::change_page::{
    cursor_at_or_after, file_blocks, order_key, BlockRef, ChangeEntry, ChangePage, Cursor,
    EntryState, StoredBlock,
};

/// The full scan the revision walk of `log.rs` replaced, kept as the walk's oracle.
#[cfg(test)]
#[path = "changes_full_scan.rs"]
pub(crate) mod full_scan;

/// Takes a reference on each of `hashes` stored here; returns their ids.
fn retain_stored(txn: &WriteTxn<'_>, hashes: &[BlockHash]) -> Result<Vec<i64>> {
    let mut ids = Vec::new();
    for hash in hashes {
        if let Some(id) = content::retain_by_hash(txn, hash)? {
            ids.push(id);
        }
    }
    Ok(ids)
}

/// What a batch applied from another workspace must pass before it lands.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Admission {
    /// As any local change: the quota and the disk's reserve. A peer's push, a batch a
    /// caller applies.
    Checked,
    /// A pull of the upstream's changes, which the upstream already holds: refusing them
    /// here would leave the replica unable to sync at all once its disk fills (and so
    /// unable to take the deletions that would free it). Its bookkeeping and metadata
    /// may draw on the reserve; content still needs room, which fetching the blocks
    /// checks (`put_blocks`); a staged file the disk has no room to ingest stays
    /// staged, a local change the pull's plan counts as such.
    FromUpstream,
}

impl Workspace {
    /// The state of every path that changed after `cursor`, in (revision, path) order,
    /// at most `entries_max` entries and about `bytes_max` bytes of file content (at
    /// least one entry, whatever its size). `log.rs` has how it is read.
    pub fn changes_after(
        &self,
        cursor: &Cursor,
        entries_max: usize,
        bytes_max: u64,
    ) -> Result<ChangePage> {
        self.changes_after_skipping(cursor, entries_max, bytes_max, &mut |_, _| Ok(false))
    }

    /// [`Workspace::changes_after`], passing over whole the revisions `skip` names (a
    /// peer's own batches, which it must not get back).
    pub(crate) fn changes_after_skipping(
        &self,
        cursor: &Cursor,
        entries_max: usize,
        bytes_max: u64,
        skip: &mut dyn FnMut(&Connection, Revision) -> Result<bool>,
    ) -> Result<ChangePage> {
        self.commit_all()?;
        self.settle_staged()?;
        // Only committed revisions: a batch still open could be lost in a crash, and its
        // revision numbers taken again by other changes after a peer was told of them.
        self.db().commit()?;
        self.db().read_counted(|conn| {
            crate::log::page(
                conn,
                self.log_cache(),
                cursor,
                entries_max,
                bytes_max,
                skip,
                &entry_state,
            )
        })
    }

    /// Which of `hashes` this workspace stores.
    pub fn has_blocks(&self, hashes: &[BlockHash]) -> Result<Vec<bool>> {
        self.db().read(|conn| {
            hashes
                .iter()
                .map(|hash| content::has_block(conn, hash))
                .collect()
        })
    }

    /// A stored block as it is on disk (compressed or not), to send elsewhere.
    pub fn stored_block(&self, hash: &BlockHash) -> Result<Option<StoredBlock>> {
        self.db().read(|conn| content::stored_block(conn, hash))
    }

    /// Stores blocks ahead of the entries that will use them, for a transfer too large
    /// for one batch (a file of many blocks). Each new block holds a *loose* reference
    /// until an applied batch uses it (which drops that reference) or
    /// [`Workspace::sweep_loose_blocks`] gives up on it. Blocks already stored are left as
    /// they are. Every block is verified against its hash first; returns how many were
    /// new.
    pub fn put_blocks(&self, blocks: &[StoredBlock]) -> Result<usize> {
        for block in blocks {
            block.verify()?;
        }
        let now = self.now();
        self.db().write(|txn| {
            txn.keep_revision();
            let mut added = 0;
            for block in blocks {
                if content::has_block(txn, &block.hash)? {
                    continue;
                }
                let encoded = EncodedBlock {
                    raw_len: block.raw_len as usize,
                    codec: block.codec,
                    data: block.data.clone(),
                };
                let id = content::insert_block(txn, &block.hash, &encoded)?;
                loose_blocks::hold(txn, id, now)?;
                added += 1;
            }
            Ok(added)
        })
    }

    /// Drops the loose references (see [`Workspace::put_blocks`]) older than `age`,
    /// deleting blocks nothing else uses. Returns how many were dropped.
    pub fn sweep_loose_blocks(&self, age: std::time::Duration) -> Result<usize> {
        let before = self
            .now()
            .saturating_sub(age.as_nanos().min(i64::MAX as u128) as i64);
        // Most calls find nothing due (a probe asks before every push): no write then.
        let due = self.db().read(|conn| loose_blocks::any_due(conn, before))?;
        if !due {
            return Ok(0);
        }
        let cache = self.block_cache();
        self.db().write(|txn| {
            txn.keep_revision();
            txn.skip_quota();
            let ids = loose_blocks::due(txn, before)?;
            for &id in &ids {
                loose_blocks::release(txn, cache, id)?;
            }
            Ok(ids.len())
        })
    }

    /// Applies states from another workspace in one transaction. File contents must be
    /// either stored here already or among `blocks` (each verified against its hash; a
    /// mismatch refuses the whole batch). States equal to the current ones change
    /// nothing. Returns how many paths changed.
    pub fn apply_changes(&self, entries: &[ChangeEntry], blocks: &[StoredBlock]) -> Result<usize> {
        let applied = self.apply_changes_with(
            Admission::Checked,
            blocks,
            &[],
            |_| Ok(Ok::<_, ()>(entries.to_vec())),
            |_| Ok(()),
        )?;
        Ok(applied.map_or(0, |(changed, _)| changed))
    }

    /// [`Workspace::apply_changes`] with the entries decided inside the transaction:
    /// `plan` sees the state the batch will be applied to (no local change can slip in
    /// between) and returns the entries, or `Err(T)` to write nothing and hand `T` back.
    /// `also` runs in the same transaction after the entries (to record the cursor the
    /// batch covers).
    ///
    /// `hold` names blocks a later transaction of the same batch will use (a batch
    /// applied in parts): each stored one that this one would otherwise free gets a
    /// loose hold instead, whose id is returned with the count of changed paths; the
    /// caller drops what is left of them once the batch is done
    /// ([`Workspace::release_held`]).
    pub(crate) fn apply_changes_with<T>(
        &self,
        admission: Admission,
        blocks: &[StoredBlock],
        hold: &[BlockHash],
        plan: impl FnOnce(&WriteTxn<'_>) -> Result<std::result::Result<Vec<ChangeEntry>, T>>,
        also: impl FnOnce(&WriteTxn<'_>) -> Result<()>,
    ) -> Result<std::result::Result<(usize, Vec<i64>), T>> {
        for block in blocks {
            block.verify()?;
        }
        let supplied: HashMap<BlockHash, &StoredBlock> =
            blocks.iter().map(|b| (b.hash, b)).collect();
        self.commit_all()?;
        match admission {
            Admission::Checked => self.settle_staged()?,
            Admission::FromUpstream => self.settle_staged_where_room()?,
        }
        let now = self.now();
        let cache = self.block_cache();
        let mut holds = Vec::new();
        let applied = self.db().write(|txn| {
            if admission == Admission::FromUpstream {
                txn.skip_quota();
            }
            let entries = match plan(txn)? {
                Ok(entries) => entries,
                Err(other) => {
                    txn.keep_revision();
                    return Ok(Err(other));
                }
            };
            // Pin every stored block the batch refers to: an earlier entry (the old name
            // of a moved file, say) must not free a block a later one reuses.
            let pinned = retain_stored(txn, &file_blocks(&entries))?;
            let held_for_later = retain_stored(txn, hold)?;
            let mut changed = 0;
            for entry in &entries {
                if apply_entry(self, txn, cache, entry, &supplied, now, &mut holds)? {
                    changed += 1;
                }
            }
            let mut held = Vec::new();
            for id in held_for_later {
                if loose_blocks::is_held(txn, id)? || held.contains(&id) {
                    content::release_block(txn, cache, id)?;
                } else {
                    // The pin becomes the hold: the block survives this transaction.
                    loose_blocks::hold(txn, id, now)?;
                    held.push(id);
                }
            }
            for id in pinned {
                // The batch now uses the block: a loose hold on it has done its job.
                loose_blocks::release(txn, cache, id)?;
                content::release_block(txn, cache, id)?;
            }
            if changed == 0 {
                // An echo or a replay: bookkeeping only, no revision of its own.
                txn.keep_revision();
            }
            also(txn)?;
            Ok(Ok((changed, held)))
        });
        // Let go once the transaction ended (`Workspace::unstage_clean`).
        let finished = self.finish_uses(holds);
        applied.and_then(|applied| finished.map(|()| applied))
    }

    /// Drops the loose holds `ids` that [`Workspace::apply_changes_with`] made for a
    /// batch in parts and no part used, deleting blocks nothing else uses.
    pub(crate) fn release_held(&self, ids: &[i64]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let cache = self.block_cache();
        self.db().write(|txn| {
            txn.keep_revision();
            txn.skip_quota();
            for &id in ids {
                loose_blocks::release(txn, cache, id)?;
            }
            Ok(())
        })
    }
}

/// The replicable state of node `ino`.
pub(crate) fn entry_state(conn: &Connection, ino: InodeNo) -> Result<EntryState> {
    let attr = store::attr(conn, ino)?;
    Ok(match attr.kind {
        FileKind::Directory => EntryState::Directory {
            perm: attr.perm,
            mtime: attr.mtime,
        },
        FileKind::Symlink => EntryState::Symlink {
            target: store::symlink_target(conn, ino)?,
        },
        FileKind::File => EntryState::File {
            perm: attr.perm,
            mtime: attr.mtime,
            size: attr.size,
            blocks: block_refs(conn, ino)?,
        },
        // Fifos, sockets and devices do not replicate: a removal keeps the receiver's
        // tree free of something it cannot represent.
        _ => EntryState::Removed,
    })
}

fn block_refs(conn: &Connection, ino: InodeNo) -> Result<Vec<BlockRef>> {
    let mut out = Vec::new();
    let mut expected = 0u64;
    for (offset, len, hash) in content::extent_hashes(conn, ino)? {
        // A hole: sending zeros would cost bandwidth, so the all-zero hash marks a gap
        // the receiver leaves, in pieces that fit a length.
        let mut gap = offset
            .checked_sub(expected)
            .ok_or_else(|| Error::corrupt(format!("{ino}: extents overlap at {offset}")))?;
        while gap > 0 {
            let piece = gap.min(u32::MAX as u64);
            out.push(BlockRef {
                hash: BlockRef::HOLE,
                len: piece as u32,
            });
            gap -= piece;
        }
        out.push(BlockRef {
            hash,
            len: len as u32,
        });
        expected = offset + len;
    }
    Ok(out)
}

/// Refuses an entry no change here could have made: a relative path, a file past the
/// largest size (a peer's size is stored as the node's).
fn check_entry(ws: &Workspace, entry: &ChangeEntry) -> Result<()> {
    if entry.path.first() != Some(&b'/') {
        return Err(Error::invalid("change entry path is not absolute"));
    }
    if matches!(&entry.state, EntryState::File { size, .. } if *size > ws.file_size_max()) {
        return Err(kind::FileTooBig());
    }
    Ok(())
}

/// Applies one entry; returns whether anything changed.
fn apply_entry(
    ws: &Workspace,
    txn: &mut WriteTxn<'_>,
    cache: &content::BlockCache,
    entry: &ChangeEntry,
    supplied: &HashMap<BlockHash, &StoredBlock>,
    now: TimestampNs,
    holds: &mut Vec<std::sync::Arc<crate::open_files::OpenInode>>,
) -> Result<bool> {
    check_entry(ws, entry)?;
    let path = &entry.path;
    let existing = resolve_literal(txn, path)?.and_then(|(_, _, ino)| ino);
    if path == b"/" {
        if let EntryState::Directory { perm, mtime } = &entry.state {
            let attr = store::attr(txn, InodeNo::ROOT)?;
            if attr.perm == *perm && attr.mtime == *mtime {
                return Ok(false);
            }
            restate_directory(txn, attr, *perm, *mtime, now)?;
            return Ok(true);
        }
        return Err(Error::invalid("the root can only be a directory"));
    }
    if let Some(ino) = existing {
        let attr = store::attr(txn, ino)?;
        if same_state(txn, &attr, &entry.state)? {
            return Ok(false);
        }
        // Directories that stay directories keep their content; anything else goes.
        if let (FileKind::Directory, EntryState::Directory { perm, mtime }) =
            (attr.kind, &entry.state)
        {
            restate_directory(txn, attr, *perm, *mtime, now)?;
            return Ok(true);
        }
        if let (FileKind::File, EntryState::File { .. }) = (attr.kind, &entry.state) {
            // A staging file caching the old content must not serve it again; one
            // that readers hold makes it a new node (below).
            if attr.nlink == 1 && ws.unstage_clean(ino, holds)? {
                replace_file(txn, cache, ino, &entry.state, supplied, now)?;
                return Ok(true);
            }
        }
        remove_path(ws, txn, path, now)?;
        if matches!(entry.state, EntryState::Removed) {
            return Ok(true);
        }
    } else if matches!(entry.state, EntryState::Removed) {
        return Ok(false);
    }
    let (parent, name) = make_parents(ws, txn, path, now)?;
    match &entry.state {
        EntryState::Removed => {}
        EntryState::Directory { perm, mtime } => {
            let ino =
                store::insert_node(txn, FileKind::Directory, NewNode::new(*perm), 0, None, now)?;
            store::insert_dirent(txn, parent, &name, ino)?;
            store::count_subdirs(txn, parent, 1)?;
            let mut attr = store::attr(txn, ino)?;
            attr.mtime = *mtime;
            store::store_attr(txn, &attr)?;
        }
        EntryState::Symlink { target } => {
            let ino = store::insert_node(
                txn,
                FileKind::Symlink,
                NewNode::new(0o777),
                0,
                Some(target),
                now,
            )?;
            store::insert_dirent(txn, parent, &name, ino)?;
        }
        EntryState::File { perm, .. } => {
            let ino = store::insert_node(txn, FileKind::File, NewNode::new(*perm), 0, None, now)?;
            store::insert_dirent(txn, parent, &name, ino)?;
            replace_file(txn, cache, ino, &entry.state, supplied, now)?;
        }
    }
    Ok(true)
}

/// Gives directory `attr` a peer's mode and mtime; its children stay.
fn restate_directory(
    txn: &WriteTxn<'_>,
    mut attr: Attr,
    perm: u32,
    mtime: TimestampNs,
    now: TimestampNs,
) -> Result<()> {
    attr.perm = perm;
    attr.mtime = mtime;
    attr.ctime = now;
    store::store_attr(txn, &attr)
}

/// Whether node `attr` already is in `state`.
pub(crate) fn same_state(conn: &Connection, attr: &Attr, state: &EntryState) -> Result<bool> {
    Ok(match (attr.kind, state) {
        (FileKind::Directory, EntryState::Directory { perm, mtime }) => {
            attr.perm == *perm && attr.mtime == *mtime
        }
        (FileKind::Symlink, EntryState::Symlink { target }) => {
            &store::symlink_target(conn, attr.ino)? == target
        }
        (
            FileKind::File,
            EntryState::File {
                perm,
                mtime,
                size,
                blocks,
            },
        ) => {
            attr.perm == *perm
                && attr.mtime == *mtime
                && attr.size == *size
                && &block_refs(conn, attr.ino)? == blocks
        }
        _ => false,
    })
}

/// Gives file `ino` the content and attributes of a file state.
fn replace_file(
    txn: &mut WriteTxn<'_>,
    cache: &content::BlockCache,
    ino: InodeNo,
    state: &EntryState,
    supplied: &HashMap<BlockHash, &StoredBlock>,
    now: TimestampNs,
) -> Result<()> {
    let EntryState::File {
        perm,
        mtime,
        size,
        blocks,
    } = state
    else {
        return Err(Error::invalid("not a file state"));
    };
    // New references first, so a block shared with the old content never drops to zero.
    let mut extents = Vec::with_capacity(blocks.len());
    let mut offset = 0u64;
    for block in blocks {
        if !block.is_hole() {
            if block.len == 0 {
                return Err(Error::corrupt(format!("block {} is empty", block.hash)));
            }
            // A stored block's length is its own, whatever the peer says.
            let id = match content::retain_by_hash_of_len(txn, &block.hash, block.len)? {
                Some(id) => id,
                None => {
                    let stored = supplied.get(&block.hash).ok_or_else(|| {
                        Error::corrupt(format!("block {} neither stored nor supplied", block.hash))
                    })?;
                    if stored.raw_len != block.len {
                        return Err(Error::corrupt(format!(
                            "block {} has the wrong length",
                            block.hash
                        )));
                    }
                    let encoded = EncodedBlock {
                        raw_len: stored.raw_len as usize,
                        codec: stored.codec,
                        data: stored.data.clone(),
                    };
                    content::insert_block(txn, &block.hash, &encoded)?
                }
            };
            extents.push(Extent {
                offset,
                len: block.len as u64,
                block: id,
            });
        }
        offset += block.len as u64;
    }
    if offset > *size {
        return Err(Error::corrupt("file state's blocks exceed its size"));
    }
    content::release_all(txn, cache, ino)?;
    for extent in extents {
        content::insert_extent(txn, ino, extent)?;
    }
    let mut attr = store::attr(txn, ino)?;
    attr.perm = *perm & 0o7777;
    attr.size = *size;
    attr.mtime = *mtime;
    attr.ctime = now;
    store::store_attr(txn, &attr)
}

/// Removes whatever is at `path` (a whole tree for a directory).
fn remove_path(
    ws: &Workspace,
    txn: &mut WriteTxn<'_>,
    path: &[u8],
    now: TimestampNs,
) -> Result<()> {
    let Some((parent, name, Some(_))) = resolve_literal(txn, path)? else {
        return Ok(());
    };
    if name.is_empty() {
        return Err(Error::invalid("cannot remove the root"));
    }
    // The parent's times come from its own state, not from this removal, and so does
    // its revision: the removal is the entry's change (its tombstone), and an unpushed
    // change of ours to the parent must not pass for received (`store::set_revision`).
    let before = store::attr(txn, parent)?;
    ws.remove_tree_in(txn, parent, &name, now)?;
    let mut after = store::attr(txn, parent)?;
    after.mtime = before.mtime;
    store::store_attr(txn, &after)?;
    store::set_revision(txn, parent, before.revision)
}

/// Creates the missing directories above `path`; returns its parent and name.
fn make_parents(
    ws: &Workspace,
    txn: &mut WriteTxn<'_>,
    path: &[u8],
    now: TimestampNs,
) -> Result<(InodeNo, Vec<u8>)> {
    let parts: Vec<&[u8]> = path
        .split(|&b| b == b'/')
        .filter(|p| !p.is_empty())
        .collect();
    let Some((name, dirs)) = parts.split_last() else {
        return Err(Error::invalid("empty path"));
    };
    let mut parent = InodeNo::ROOT;
    for dir in dirs {
        store::check_name(dir)?;
        let existing = store::lookup(txn, parent, dir)?;
        if let Some(ino) = existing {
            if !store::attr(txn, ino)?.is_dir() {
                // The sender has a directory here (something lives below it); what we
                // have was replaced there, in an entry coalesced into that directory's.
                store::remove_dirent(txn, parent, dir)?;
                ws.drop_link(txn, ino, now)?;
            }
        }
        parent = match store::lookup(txn, parent, dir)? {
            Some(ino) => ino,
            None => {
                let ino = store::insert_node(
                    txn,
                    FileKind::Directory,
                    NewNode::new(0o755),
                    0,
                    None,
                    now,
                )?;
                store::insert_dirent(txn, parent, dir, ino)?;
                store::count_subdirs(txn, parent, 1)?;
                ino
            }
        };
    }
    store::check_name(name)?;
    Ok((parent, name.to_vec()))
}

/// (parent, name, node if present) of a path.
type Literal = (InodeNo, Vec<u8>, Option<InodeNo>);

/// Follows `path` component by component without following any symlink: replication
/// names exactly the entries it means. Returns (parent, name, node if present); `None`
/// when a directory on the way is missing or is not a directory.
fn resolve_literal(conn: &Connection, path: &[u8]) -> Result<Option<Literal>> {
    let parts: Vec<&[u8]> = path
        .split(|&b| b == b'/')
        .filter(|p| !p.is_empty())
        .collect();
    let Some((name, dirs)) = parts.split_last() else {
        return Ok(Some((InodeNo::ROOT, Vec::new(), Some(InodeNo::ROOT))));
    };
    let mut parent = InodeNo::ROOT;
    for dir in dirs {
        match store::lookup(conn, parent, dir)? {
            Some(ino) if store::attr(conn, ino)?.is_dir() => parent = ino,
            _ => return Ok(None),
        }
    }
    Ok(Some((
        parent,
        name.to_vec(),
        store::lookup(conn, parent, name)?,
    )))
}
