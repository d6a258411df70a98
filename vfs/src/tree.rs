//! Operations on whole subtrees, each one mutation: replacing a file's content, `mkdir
//! -p`, recursive removal and copy.

use crate::base::lock;
use crate::content;
use crate::error::{kind, Error, Result};
use crate::resolve::{resolve_in, Resolved};
use crate::store;
use crate::types::*;
use crate::workspace::Workspace;

/// Deepest tree the recursive operations walk.
const TREE_DEPTH_MAX: usize = 4096;

impl Workspace {
    /// Creates entry `name` in `parent` with `data`, or replaces the content of `ino`,
    /// in one transaction.
    pub(crate) fn replace_content(
        &self,
        parent: InodeNo,
        name: &[u8],
        ino: Option<InodeNo>,
        data: &[u8],
        owner: NewNode,
    ) -> Result<()> {
        let len = data.len() as u64;
        if len > self.file_size_max() {
            return Err(kind::FileTooBig());
        }
        let now = self.now();
        let ctx = self.ctx();
        let patch = [(0u64, data)];
        let Some(ino) = ino else {
            return self.db().write(|txn| {
                Workspace::check_new_entry(txn, parent, name)?;
                let ino = store::insert_node(txn, FileKind::File, owner, 0, None, now)?;
                store::insert_dirent(txn, parent, name, ino)?;
                store::touch_dir(txn, parent, 0, now)?;
                content::apply(txn, &ctx, ino, 0, len, &patch)?;
                let mut attr = store::attr(txn, ino)?;
                attr.size = len;
                store::store_attr(txn, &attr)
            });
        };
        let open = self.acquire(ino);
        // While staged, the staging file is the content: every open reads it and its
        // ingestion would put it back over the database's. Looked for once held, so a
        // fill cannot copy the old content behind this change.
        if let Some(staged) = self.staged_for_holder(ino) {
            if self.pin_staged(&staged) {
                let result = self.staged_replace(&staged, data);
                self.unpin_staged(&staged);
                return result.and(self.finish_use(&open));
            }
        }
        let result = (|| {
            let mut state = lock(&open.state);
            self.load_state(ino, &mut state)?;
            self.db().write(|txn| {
                let mut attr = store::attr(txn, ino)?;
                content::apply(txn, &ctx, ino, attr.size, len, &patch)?;
                attr.size = len;
                attr.mtime = now;
                attr.ctime = now;
                store::store_attr(txn, &attr)
            })?;
            let freed = state.dirty.clear();
            self.dirty_released(freed);
            state.size = len;
            state.written_at = None;
            Ok(())
        })();
        let finished = self.finish_use(&open);
        result.and(finished)
    }

    /// Creates a directory and its missing parents (`mkdir -p`) in one transaction.
    /// An existing directory is fine; an existing non-directory is EEXIST or ENOTDIR.
    pub(crate) fn mkdir_all(&self, path: &[u8], owner: NewNode) -> Result<()> {
        let now = self.now();
        let parts: Vec<&[u8]> = path
            .split(|&b| b == b'/')
            .filter(|c| !c.is_empty())
            .collect();
        self.db().write(|txn| {
            let mut prefix = Vec::with_capacity(path.len());
            let mut created_from: Option<(InodeNo, usize)> = None;
            for (i, part) in parts.iter().enumerate() {
                prefix.push(b'/');
                prefix.extend_from_slice(part);
                // Not following a final symlink: a missing prefix is created where its
                // own name is, never at the place a dangling symlink points to.
                let resolved = resolve_in(txn, &prefix, false, crate::resolve::Symlinks::Follow)?;
                let Some(mut ino) = resolved.ino else {
                    created_from = Some((resolved.parent, i));
                    break;
                };
                if store::attr(txn, ino)?.kind == FileKind::Symlink {
                    // A symlink to a directory is fine; one that leads nowhere is a
                    // name already taken, as mkdir(2) sees it.
                    ino = match resolve_in(txn, &prefix, true, crate::resolve::Symlinks::Follow) {
                        Ok(Resolved {
                            ino: Some(target), ..
                        }) => target,
                        Ok(_) | Err(Error::NotFound(_) | Error::NotDir(_) | Error::Loop(_)) => {
                            return Err(kind::Exists())
                        }
                        Err(err) => return Err(err),
                    };
                }
                let attr = store::attr(txn, ino)?;
                if !attr.is_dir() {
                    return Err(if i + 1 == parts.len() {
                        kind::Exists()
                    } else {
                        kind::NotDir()
                    });
                }
            }
            let Some((mut parent, first)) = created_from else {
                return Ok(());
            };
            for part in &parts[first..] {
                if *part == b"." || *part == b".." {
                    return Err(Error::invalid("'.' or '..' after a missing directory"));
                }
                Workspace::check_new_entry(txn, parent, part)?;
                let ino = store::insert_node(txn, FileKind::Directory, owner, 0, None, now)?;
                store::insert_dirent(txn, parent, part, ino)?;
                store::touch_dir(txn, parent, 1, now)?;
                parent = ino;
            }
            Ok(())
        })
    }

    /// Removes entry `name` of `parent` and, if it is a directory, everything below it,
    /// in one transaction with one tombstone.
    pub(crate) fn remove_tree(&self, parent: InodeNo, name: &[u8]) -> Result<()> {
        let now = self.now();
        self.db().write(|txn| {
            txn.skip_quota();
            self.remove_tree_in(txn, parent, name, now)
        })
    }

    /// [`Workspace::remove_tree`] inside a transaction the caller holds.
    pub(crate) fn remove_tree_in(
        &self,
        txn: &mut crate::db::WriteTxn<'_>,
        parent: InodeNo,
        name: &[u8],
        now: TimestampNs,
    ) -> Result<()> {
        let top = store::lookup(txn, parent, name)?.ok_or_else(kind::NotFound)?;
        let top_attr = store::attr(txn, top)?;
        if !top_attr.is_dir() {
            store::remove_dirent(txn, parent, name)?;
            store::touch_dir(txn, parent, 0, now)?;
            return self.drop_link(txn, top, now);
        }
        // Depth-first: empty each directory, then delete it.
        let mut stack: Vec<(InodeNo, bool)> = vec![(top, false)];
        while let Some((dir, emptied)) = stack.pop() {
            if emptied {
                if dir != top {
                    self.delete_node(txn, dir)?;
                }
                continue;
            }
            stack.push((dir, true));
            if stack.len() > TREE_DEPTH_MAX {
                return Err(Error::invalid("directory tree too deep"));
            }
            let entries = store::list(txn, dir, 0, usize::MAX)?;
            for entry in entries {
                store::remove_dirent_with(txn, dir, &entry.name, false)?;
                if entry.kind == FileKind::Directory {
                    stack.push((entry.ino, false));
                } else {
                    self.drop_link(txn, entry.ino, now)?;
                }
            }
        }
        store::remove_dirent(txn, parent, name)?;
        store::touch_dir(txn, parent, -1, now)?;
        self.delete_node(txn, top)
    }

    /// Whether `ancestor` is `dir` or above it.
    pub(crate) fn is_ancestor_of(&self, ancestor: InodeNo, dir: InodeNo) -> Result<bool> {
        self.db()
            .read(|conn| store::is_ancestor(conn, ancestor, dir))
    }

    /// Copies node `src` (a whole tree if it is a directory) to entry `name` of `parent`
    /// in one transaction. Files share their blocks with the source.
    pub(crate) fn copy_tree(
        &self,
        src: InodeNo,
        parent: InodeNo,
        name: &[u8],
        owner: NewNode,
    ) -> Result<()> {
        // Buffered writes and staged files must be in the blocks we are about to share,
        // those still open for writing too (as they are now).
        self.commit_all()?;
        self.settle_staged()?;
        self.ingest_staged_under(src)?;
        let now = self.now();
        self.db().write(|txn| {
            Workspace::check_new_entry(txn, parent, name)?;
            let mut stack: Vec<(InodeNo, InodeNo, Vec<u8>)> = vec![(src, parent, name.to_vec())];
            while let Some((from, into, entry_name)) = stack.pop() {
                let attr = store::attr(txn, from)?;
                let node_owner = NewNode {
                    perm: attr.perm,
                    ..owner
                };
                let target = match attr.kind {
                    FileKind::Symlink => Some(store::symlink_target(txn, from)?),
                    _ => None,
                };
                let copy = store::insert_node(
                    txn,
                    attr.kind,
                    node_owner,
                    attr.rdev,
                    target.as_deref(),
                    now,
                )?;
                store::insert_dirent(txn, into, &entry_name, copy)?;
                store::touch_dir(txn, into, i64::from(attr.is_dir()), now)?;
                match attr.kind {
                    FileKind::File => {
                        content::share_all(txn, from, copy)?;
                        let mut copied = store::attr(txn, copy)?;
                        copied.size = attr.size;
                        store::store_attr(txn, &copied)?;
                    }
                    FileKind::Directory => {
                        if stack.len() > TREE_DEPTH_MAX {
                            return Err(Error::invalid("directory tree too deep"));
                        }
                        for entry in store::list(txn, from, 0, usize::MAX)? {
                            stack.push((entry.ino, copy, entry.name));
                        }
                    }
                    _ => {}
                }
            }
            Ok(())
        })
    }
}
