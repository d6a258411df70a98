//! Reading the change log in order, one revision at a time.
//!
//! A path's *revision* in the log is the latest of its node's revision and the
//! revisions of the directory entries on the way to it: creating, renaming or moving
//! any directory above a path changes the path. A page lists each path changed after a
//! cursor once, at that revision, in (revision, path) order. This module finds the
//! paths of one revision directly, instead of every path changed since the cursor:
//!
//! - nodes whose own revision is `r` (at each of their names), unless a directory
//!   above moved later;
//! - entries made at `r`, and for a directory entry its whole subtree, except what
//!   changed later (that comes at its own revision);
//! - paths removed at `r`, unless removed again later by a removal that is listed, or
//!   filled again in the same mutation (the new state says it all).
//!
//! and walks the revisions upward from the cursor (three index lookups each) until the
//! page is full. So a page costs what it holds plus the revisions it crosses, not the
//! whole log after the cursor. A revision holding very many paths (the move of a large
//! tree) is computed once and kept while the workspace does not change, so reading it
//! in many pages does not compute it again for each.
//!
//! The set of paths at a revision only ever shrinks (a later change moves a path to a
//! later revision), so a cursor `(r, "")`, which sorts after every path of `r`, stays
//! true once given: "all of revision `r` has been seen".

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use rusqlite::{params, Connection, OptionalExtension};

use crate::change_page::order_key;
use crate::error::{Error, Result, StorageContext};
use crate::store;
use crate::types::*;

/// One path of a revision, in page order: (order key, path, node or `None` if removed).
pub(crate) type LogItem = (Vec<u8>, Vec<u8>, Option<InodeNo>);

/// The paths of one revision, computed against the workspace at one revision.
#[derive(Clone)]
pub(crate) struct CachedRevision {
    /// The workspace's revision when this was computed: valid while it has not moved.
    pub(crate) as_of: Revision,
    pub(crate) revision: Revision,
    pub(crate) items: Arc<Vec<LogItem>>,
}

/// Revisions with more paths than this are kept for the next page.
pub(crate) const CACHE_ITEMS_MIN: usize = 256;

/// A directory's path, and the latest revision of the entries on the way to it (its
/// own included).
#[derive(Clone)]
struct DirInfo {
    path: Vec<u8>,
    chain: Revision,
}

/// A walk over the log of one read snapshot.
pub(crate) struct LogWalk<'c> {
    conn: &'c Connection,
    dirs: HashMap<InodeNo, Option<DirInfo>>,
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut path = Vec::with_capacity(dir.len() + 1 + name.len());
    path.extend_from_slice(dir);
    if path != b"/" {
        path.push(b'/');
    }
    path.extend_from_slice(name);
    path
}

impl<'c> LogWalk<'c> {
    pub(crate) fn new(conn: &'c Connection) -> LogWalk<'c> {
        LogWalk {
            conn,
            dirs: HashMap::new(),
        }
    }

    /// The next revision after `r` that changed anything, if any.
    pub(crate) fn next_revision(&self, r: Revision) -> Result<Option<Revision>> {
        let next: Option<i64> = self
            .conn
            .prepare_cached(
                "SELECT MIN(m) FROM (
                   SELECT MIN(revision) AS m FROM nodes WHERE revision > ?1
                   UNION ALL SELECT MIN(revision) FROM dirents WHERE revision > ?1
                   UNION ALL SELECT MIN(revision) FROM tombstones WHERE revision > ?1)",
            )
            .and_then(|mut s| s.query_row([r.0 as i64], |row| row.get(0)))
            .ctx("reading the change log")?;
        Ok(next.map(|n| Revision(n as u64)))
    }

    /// Every path whose revision in the log is `r`, in page order.
    pub(crate) fn revision(&mut self, r: Revision) -> Result<Vec<LogItem>> {
        let mut live: BTreeMap<Vec<u8>, InodeNo> = BTreeMap::new();
        // Nodes changed at `r`, at each of their names.
        let nodes: Vec<i64> = self
            .conn
            .prepare_cached("SELECT ino FROM nodes WHERE revision = ?1 AND nlink > 0")
            .and_then(|mut s| s.query_map([r.0 as i64], |row| row.get(0))?.collect())
            .ctx("reading changed nodes")?;
        for ino in nodes {
            let ino = InodeNo(ino as u64);
            if ino == InodeNo::ROOT {
                live.insert(b"/".to_vec(), ino);
                continue;
            }
            for (parent, name, bound_at) in names_of(self.conn, ino)? {
                let Some(dir) = self.dir_info(parent)? else {
                    continue;
                };
                if dir.chain.max(bound_at) > r {
                    continue;
                }
                live.insert(join(&dir.path, &name), ino);
            }
        }
        // Entries made at `r`: the path, and below a directory everything that did not
        // change later.
        let bound: Vec<(i64, Vec<u8>, i64)> = self
            .conn
            .prepare_cached("SELECT parent, name, ino FROM dirents WHERE revision = ?1")
            .and_then(|mut s| {
                s.query_map([r.0 as i64], |row| {
                    Ok((row.get(0)?, row.get(1)?, row.get(2)?))
                })?
                .collect()
            })
            .ctx("reading new entries")?;
        for (parent, name, ino) in bound {
            let Some(dir) = self.dir_info(InodeNo(parent as u64))? else {
                continue;
            };
            if dir.chain > r {
                continue;
            }
            let ino = InodeNo(ino as u64);
            let path = join(&dir.path, &name);
            let attr = store::attr(self.conn, ino)?;
            if attr.revision <= r {
                live.insert(path.clone(), ino);
            }
            if attr.is_dir() {
                self.subtree(ino, path, r, &mut live)?;
            }
        }
        // Paths removed at `r`.
        let removed: Vec<Vec<u8>> = self
            .conn
            .prepare_cached("SELECT DISTINCT path FROM tombstones WHERE revision = ?1")
            .and_then(|mut s| s.query_map([r.0 as i64], |row| row.get(0))?.collect())
            .ctx("reading tombstones")?;
        let mut items: Vec<LogItem> = live
            .into_iter()
            .map(|(path, ino)| (order_key(&path), path, Some(ino)))
            .collect();
        let mut removals = Vec::new();
        for path in removed {
            if self.removal_listed_later(&path, r)? {
                continue;
            }
            // Filled again in the same mutation (a rename over it, a batch replacing a
            // file with a directory): the new state says it all, even once the path
            // changes again and its entry moves later. (Listed, the removal would come
            // after what the mutation put below the path, which sorts first, and take
            // it away.) Filled later, the removal comes first, then the new state.
            if binding(self.conn, &path)?.is_some_and(|bound| bound <= r) {
                continue;
            }
            removals.push((order_key(&path), path, None));
        }
        items.extend(removals);
        items.sort();
        Ok(items)
    }

    /// Adds everything below directory `dir` (at `path`, entered at `r`) whose revision
    /// in the log is `r`.
    fn subtree(
        &mut self,
        dir: InodeNo,
        path: Vec<u8>,
        r: Revision,
        live: &mut BTreeMap<Vec<u8>, InodeNo>,
    ) -> Result<()> {
        let dir_code = crate::db::kind_code(FileKind::Directory);
        let mut stack = vec![(dir, path)];
        while let Some((dir, dir_path)) = stack.pop() {
            // Known from here on: directories below answer without their own queries.
            self.dirs.insert(
                dir,
                Some(DirInfo {
                    path: dir_path.clone(),
                    chain: r,
                }),
            );
            let children: Vec<(Vec<u8>, i64, i64, i64, i64)> = self
                .conn
                .prepare_cached(
                    "SELECT d.name, d.ino, d.revision, n.revision, n.kind
                     FROM dirents d JOIN nodes n ON n.ino = d.ino WHERE d.parent = ?1",
                )
                .and_then(|mut s| {
                    s.query_map([dir.0 as i64], |row| {
                        Ok((
                            row.get(0)?,
                            row.get(1)?,
                            row.get(2)?,
                            row.get(3)?,
                            row.get(4)?,
                        ))
                    })?
                    .collect()
                })
                .ctx("listing a directory")?;
            for (name, ino, bound_at, revision, kind) in children {
                if bound_at as u64 > r.0 {
                    // Moved in later: it comes then, with everything below it.
                    continue;
                }
                let child = join(&dir_path, &name);
                let ino = InodeNo(ino as u64);
                if revision as u64 <= r.0 {
                    live.insert(child.clone(), ino);
                }
                if kind == dir_code {
                    stack.push((ino, child));
                }
            }
        }
        Ok(())
    }

    /// Whether a later removal of `path` than the one at `r` is listed, and so removes
    /// all this one did. The latest is, unless the path was filled again in that same
    /// mutation (a rename over an empty directory); then the one before it stands in for
    /// it. (Skipped for both, a tree removed, filled again from a peer, then replaced
    /// by a rename would never be removed: the receiver's directory merges with the new
    /// one and keeps what the remover had seen.)
    fn removal_listed_later(&self, path: &[u8], r: Revision) -> Result<bool> {
        let later: Vec<i64> = self
            .conn
            .prepare_cached(
                "SELECT DISTINCT revision FROM tombstones WHERE path = ?1 AND revision > ?2
                 ORDER BY revision DESC LIMIT 2",
            )
            .and_then(|mut s| {
                s.query_map(params![path, r.0 as i64], |row| row.get(0))?
                    .collect()
            })
            .ctx("reading tombstones")?;
        let Some(&latest) = later.first() else {
            return Ok(false);
        };
        let filled_by_latest =
            binding(self.conn, path)?.is_some_and(|bound| bound.0 <= latest as u64);
        Ok(!filled_by_latest || later.len() > 1)
    }

    /// The path of directory `dir` and the latest entry revision on the way to it;
    /// `None` for a directory cut off from the root (being deleted).
    fn dir_info(&mut self, dir: InodeNo) -> Result<Option<DirInfo>> {
        // Walk up to the first known ancestor, then fill in on the way back down.
        let mut chain: Vec<(InodeNo, InodeNo, Vec<u8>, Revision)> = Vec::new();
        let mut current = dir;
        let base = loop {
            if let Some(known) = self.dirs.get(&current) {
                break known.clone();
            }
            if current == InodeNo::ROOT {
                let root = Some(DirInfo {
                    path: b"/".to_vec(),
                    chain: Revision(0),
                });
                self.dirs.insert(InodeNo::ROOT, root.clone());
                break root;
            }
            let entry: Option<(i64, Vec<u8>, i64)> = self
                .conn
                .prepare_cached("SELECT parent, name, revision FROM dirents WHERE ino = ?1")
                .and_then(|mut s| {
                    s.query_row([current.0 as i64], |row| {
                        Ok((row.get(0)?, row.get(1)?, row.get(2)?))
                    })
                    .optional()
                })
                .ctx("reading a directory's entry")?;
            let Some((parent, name, bound_at)) = entry else {
                break None;
            };
            if chain.len() > store::PATH_MAX {
                return Err(Error::corrupt(format!("{dir} has a cycle of parents")));
            }
            let parent = InodeNo(parent as u64);
            chain.push((current, parent, name, Revision(bound_at as u64)));
            current = parent;
        };
        let mut info = base;
        for (ino, _, name, bound_at) in chain.into_iter().rev() {
            info = info.map(|parent| DirInfo {
                path: join(&parent.path, &name),
                chain: parent.chain.max(bound_at),
            });
            self.dirs.insert(ino, info.clone());
        }
        Ok(info)
    }
}

/// The latest revision of the entries on the way to `path` (its own included), if
/// something is there now; symlinks are not followed.
pub(crate) fn binding(conn: &Connection, path: &[u8]) -> Result<Option<Revision>> {
    let mut ino = InodeNo::ROOT;
    let mut bound = Revision(0);
    for part in path.split(|&b| b == b'/').filter(|p| !p.is_empty()) {
        let entry: Option<(i64, i64)> = conn
            .prepare_cached("SELECT ino, revision FROM dirents WHERE parent = ?1 AND name = ?2")
            .and_then(|mut s| {
                s.query_row(params![ino.0 as i64, part], |row| {
                    Ok((row.get(0)?, row.get(1)?))
                })
                .optional()
            })
            .ctx("reading an entry")?;
        let Some((child, revision)) = entry else {
            return Ok(None);
        };
        ino = InodeNo(child as u64);
        bound = bound.max(Revision(revision as u64));
    }
    Ok(Some(bound))
}

/// The entries naming `ino`: (parent, name, revision the entry was made).
pub(crate) fn names_of(
    conn: &Connection,
    ino: InodeNo,
) -> Result<Vec<(InodeNo, Vec<u8>, Revision)>> {
    let mut stmt = conn
        .prepare_cached("SELECT parent, name, revision FROM dirents WHERE ino = ?1")
        .ctx("reading names")?;
    let rows = stmt
        .query_map([ino.0 as i64], |r| {
            Ok((
                InodeNo(r.get::<_, i64>(0)? as u64),
                r.get::<_, Vec<u8>>(1)?,
                Revision(r.get::<_, i64>(2)? as u64),
            ))
        })
        .ctx("reading names")?;
    rows.collect::<rusqlite::Result<_>>().ctx("reading names")
}

/// The last large revision computed, kept for the next page (see the module doc).
#[derive(Default)]
pub(crate) struct LogCache(std::sync::Mutex<Option<CachedRevision>>);

impl LogCache {
    /// The paths of revision `r` as of workspace revision `as_of`, computed by `walk`
    /// unless kept from an earlier page.
    fn revision(
        &self,
        walk: &mut LogWalk<'_>,
        as_of: Revision,
        r: Revision,
    ) -> Result<Arc<Vec<LogItem>>> {
        {
            let kept = crate::base::lock(&self.0);
            if let Some(kept) = kept.as_ref() {
                if kept.as_of == as_of && kept.revision == r {
                    return Ok(kept.items.clone());
                }
            }
        }
        let items = Arc::new(walk.revision(r)?);
        if items.len() >= CACHE_ITEMS_MIN {
            *crate::base::lock(&self.0) = Some(CachedRevision {
                as_of,
                revision: r,
                items: items.clone(),
            });
        }
        Ok(items)
    }
}

/// A page of the log after `cursor`: at most `entries_max` entries and about
/// `bytes_max` bytes of file content (at least one entry, whatever its size).
/// Revisions for which `skip` says so are passed over whole (a peer's own changes,
/// which it must not get back). `state_of` reads a node's replicable state.
/// `conn` is a read of `Db::read_counted` (the page reads the current revision).
pub(crate) fn page(
    conn: &Connection,
    cache: &LogCache,
    cursor: &crate::change_page::Cursor,
    entries_max: usize,
    bytes_max: u64,
    skip: &mut dyn FnMut(&Connection, Revision) -> Result<bool>,
    state_of: &dyn Fn(&Connection, InodeNo) -> Result<crate::change_page::EntryState>,
) -> Result<crate::change_page::ChangePage> {
    use crate::change_page::{ChangeEntry, ChangePage, Cursor, EntryState};
    let entries_max = entries_max.max(1);
    let (current, _, _, _) = crate::db::read_counters(conn)?;
    let mut walk = LogWalk::new(conn);
    let mut entries: Vec<ChangeEntry> = Vec::new();
    let mut bytes = 0u64;
    let after_key = order_key(&cursor.path);
    // A cursor with an empty path has seen all of its revision.
    let mut next_revision = if cursor.path.is_empty() {
        walk.next_revision(cursor.revision)?
    } else {
        Some(cursor.revision)
    };
    let mut taken_through: Option<Revision> = None;
    while let Some(r) = next_revision.filter(|r| *r <= current) {
        if !skip(conn, r)? {
            let items = cache.revision(&mut walk, current, r)?;
            for (key, path, ino) in items.iter() {
                if r == cursor.revision && *key <= after_key {
                    continue;
                }
                if entries.len() >= entries_max || (bytes >= bytes_max && !entries.is_empty()) {
                    let next = entries
                        .last()
                        .map(Cursor::after)
                        .expect("a full page has entries");
                    return Ok(ChangePage {
                        entries,
                        next,
                        complete: false,
                        revision: current,
                    });
                }
                let state = match ino {
                    None => EntryState::Removed,
                    Some(ino) => state_of(conn, *ino)?,
                };
                let entry = ChangeEntry {
                    revision: r,
                    path: path.clone(),
                    state,
                    base: Cursor::START,
                };
                bytes += entry.weight();
                entries.push(entry);
            }
        }
        taken_through = Some(r);
        next_revision = walk.next_revision(r)?;
    }
    let next = match taken_through {
        Some(r) => Cursor {
            revision: r,
            path: Vec::new(),
        },
        None => cursor.clone(),
    };
    Ok(ChangePage {
        entries,
        next,
        complete: true,
        revision: current,
    })
}
