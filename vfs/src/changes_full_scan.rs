//! The change log read by a full scan of everything changed since the cursor's
//! revision: what `Workspace::changes_after` did before `log.rs` walked revisions. It is
//! quadratic in the length of the log read, and kept only as the oracle the walk is
//! tested against (`log.rs`).

use std::collections::BTreeMap;

use rusqlite::Connection;

use super::{entry_state, order_key, ChangeEntry, ChangePage, Cursor, EntryState};
use crate::error::{Result, StorageContext};
use crate::store;
use crate::types::*;
use crate::workspace::Workspace;

/// A candidate in page order: (revision, order key, path, node).
type Ordered = (Revision, Vec<u8>, Vec<u8>, Option<InodeNo>);

/// What changed from a revision on: live paths, and removed paths with the revisions
/// of their last removal and of the one before it.
struct Candidates {
    live: BTreeMap<Vec<u8>, Candidate>,
    removed: BTreeMap<Vec<u8>, (Revision, Option<Revision>)>,
}

/// A path's candidate entry while a page is assembled.
struct Candidate {
    revision: Revision,
    ino: Option<InodeNo>,
}

fn join_path(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut path = dir.to_vec();
    if path != b"/" {
        path.push(b'/');
    }
    path.extend_from_slice(name);
    path
}

/// The state of every path that changed after `cursor`, in (revision, path) order,
/// at most `entries_max` entries and about `bytes_max` bytes of file content (at
/// least one entry, whatever its size).
pub(crate) fn changes_after_full_scan(
    ws: &Workspace,
    cursor: &Cursor,
    entries_max: usize,
    bytes_max: u64,
) -> Result<ChangePage> {
    ws.commit_all()?;
    ws.settle_staged()?;
    let entries_max = entries_max.max(1);
    ws.db().read_counted(|conn| {
        let (revision, _, _, _) = crate::db::read_counters(conn)?;
        // From the cursor's revision on, inclusive: its later paths are still to come.
        let candidates = collect_candidates(conn, cursor.revision)?;
        let after = (cursor.revision, order_key(&cursor.path));
        let Candidates { live, removed } = candidates;
        // A path removed and later filled again gets both entries: the removal first,
        // so nothing that was below the old node survives on the receiver. Removed
        // and filled in one mutation (rename over a file or an empty directory, a
        // batch replacing a file with a directory), the new state says it all: the
        // path's binding is of that revision, even once the path changes again and
        // its entry moves later. (Listed, the removal would come after what the
        // mutation put below the path, which sorts first, and take it away.)
        // Then the removal before it stands in for it: the tree it removed may have been
        // filled again from elsewhere before the mutation replaced it.
        let mut removals: Vec<Ordered> = Vec::new();
        for (path, (rev, previous)) in removed {
            let listed = match live.get(&path) {
                None => true,
                Some(c) => c.revision > rev && crate::log::binding(conn, &path)? != Some(rev),
            };
            match (listed, previous) {
                (true, _) => removals.push((rev, order_key(&path), path, None)),
                (false, Some(previous)) => removals.push((previous, order_key(&path), path, None)),
                (false, None) => {}
            }
        }
        let mut ordered: Vec<Ordered> = live
            .into_iter()
            .map(|(path, c)| (c.revision, order_key(&path), path, c.ino))
            .chain(removals)
            .filter(|(rev, key, _, _)| (*rev, key) > (after.0, &after.1))
            .collect();
        ordered.sort();
        let mut entries = Vec::new();
        let mut bytes = 0u64;
        let total = ordered.len();
        for (taken, (rev, _, path, ino)) in ordered.into_iter().enumerate() {
            if entries.len() >= entries_max || (bytes >= bytes_max && !entries.is_empty()) {
                let next = entries
                    .last()
                    .map(Cursor::after)
                    .unwrap_or_else(|| cursor.clone());
                return Ok(ChangePage {
                    entries,
                    next,
                    complete: false,
                    revision,
                });
            }
            let state = match ino {
                None => EntryState::Removed,
                Some(ino) => entry_state(conn, ino)?,
            };
            let entry = ChangeEntry {
                revision: rev,
                path,
                state,
                base: Cursor::START,
            };
            bytes += entry.weight();
            entries.push(entry);
            debug_assert!(taken < total);
        }
        let next = entries
            .last()
            .map(Cursor::after)
            .unwrap_or_else(|| cursor.clone());
        Ok(ChangePage {
            entries,
            next,
            complete: true,
            revision,
        })
    })
}

/// Every path changed at or after revision `from`, with its revision and node (`None`:
/// removed).
fn collect_candidates(conn: &Connection, from: Revision) -> Result<Candidates> {
    let mut out: BTreeMap<Vec<u8>, Candidate> = BTreeMap::new();
    let mut offer = |out: &mut BTreeMap<Vec<u8>, Candidate>,
                     path: Vec<u8>,
                     revision: Revision,
                     ino: Option<InodeNo>| {
        match out.get(&path) {
            Some(existing) if existing.revision >= revision => {}
            _ => {
                out.insert(path, Candidate { revision, ino });
            }
        }
    };
    // Removed paths.
    let mut stmt = conn
        .prepare_cached("SELECT revision, path FROM tombstones WHERE revision >= ?1")
        .ctx("reading tombstones")?;
    let rows = stmt
        .query_map([from.0 as i64], |r| {
            Ok((
                Revision(r.get::<_, i64>(0)? as u64),
                r.get::<_, Vec<u8>>(1)?,
            ))
        })
        .ctx("reading tombstones")?;
    let mut removed: BTreeMap<Vec<u8>, (Revision, Option<Revision>)> = BTreeMap::new();
    for row in rows {
        let (revision, path) = row.ctx("reading tombstones")?;
        let (latest, previous) = removed.entry(path).or_insert((revision, None));
        if revision > *latest {
            *previous = Some(*latest);
            *latest = revision;
        } else if revision < *latest && previous.is_none_or(|p| revision > p) {
            *previous = Some(revision);
        }
    }
    // Changed nodes, at each of their paths; a directory bound after the cursor brings
    // its subtree along.
    let mut stmt = conn
        .prepare_cached("SELECT ino, revision FROM nodes WHERE revision >= ?1 AND nlink > 0")
        .ctx("reading changed nodes")?;
    let rows = stmt
        .query_map([from.0 as i64], |r| {
            Ok((
                InodeNo(r.get::<_, i64>(0)? as u64),
                Revision(r.get::<_, i64>(1)? as u64),
            ))
        })
        .ctx("reading changed nodes")?;
    let changed: Vec<(InodeNo, Revision)> = rows
        .collect::<rusqlite::Result<_>>()
        .ctx("reading changed nodes")?;
    for (ino, revision) in changed {
        if ino == InodeNo::ROOT {
            offer(&mut out, b"/".to_vec(), revision, Some(ino));
            continue;
        }
        for (parent, name, bound_at) in crate::log::names_of(conn, ino)? {
            let Ok(dir) = store::dir_path(conn, parent) else {
                continue;
            };
            let path = join_path(&dir, &name);
            let rev = revision.max(bound_at);
            offer(&mut out, path.clone(), rev, Some(ino));
            if bound_at >= from {
                let attr = store::attr(conn, ino)?;
                if attr.is_dir() {
                    add_subtree(conn, ino, &path, bound_at, &mut out, &mut offer)?;
                }
            }
        }
    }
    Ok(Candidates { live: out, removed })
}

type Offer<'a> =
    dyn FnMut(&mut BTreeMap<Vec<u8>, Candidate>, Vec<u8>, Revision, Option<InodeNo>) + 'a;

/// Offers every path below directory `dir` (at `path`) at least at revision `bound_at`.
fn add_subtree(
    conn: &Connection,
    dir: InodeNo,
    path: &[u8],
    bound_at: Revision,
    out: &mut BTreeMap<Vec<u8>, Candidate>,
    offer: &mut Offer<'_>,
) -> Result<()> {
    let mut stack = vec![(dir, path.to_vec())];
    while let Some((dir, dir_path)) = stack.pop() {
        for (entry, attr) in store::list_plus(conn, dir, 0, usize::MAX)? {
            let child = join_path(&dir_path, &entry.name);
            offer(
                out,
                child.clone(),
                attr.revision.max(bound_at),
                Some(attr.ino),
            );
            if attr.is_dir() {
                stack.push((attr.ino, child));
            }
        }
    }
    Ok(())
}

/// The revision walk of `log.rs` against this oracle.
#[cfg(test)]
mod tests {
    use crate::change_page::{ChangePage, Cursor, EntryState};
    use crate::fs::{MkdirOptions, RmOptions};
    use crate::workspace::{Options, Workspace};

    /// (revision, path, removed) of every entry after `cursor`, paging `n` at a time.
    type Seen = Vec<(u64, Vec<u8>, bool)>;

    fn through(mut next: impl FnMut(&Cursor) -> ChangePage, from: &Cursor) -> Seen {
        let mut cursor = from.clone();
        let mut out = Vec::new();
        for _ in 0..100_000 {
            let page = next(&cursor);
            for e in &page.entries {
                out.push((e.revision.0, e.path.clone(), e.state == EntryState::Removed));
            }
            assert!(crate::change_page::cursor_at_or_after(&page.next, &cursor));
            cursor = page.next;
            if page.complete {
                return out;
            }
        }
        panic!("paging never completed");
    }

    fn new_pages(ws: &Workspace, from: &Cursor, n: usize) -> Seen {
        through(
            |cursor| {
                ws.db()
                    .read(|conn| {
                        crate::log::page(
                            conn,
                            ws.log_cache(),
                            cursor,
                            n,
                            u64::MAX,
                            &mut |_, _| Ok(false),
                            &|_, _| Ok(EntryState::Symlink { target: Vec::new() }),
                        )
                    })
                    .unwrap()
            },
            from,
        )
    }

    fn old_pages(ws: &Workspace, from: &Cursor, n: usize) -> Seen {
        through(
            |cursor| super::changes_after_full_scan(ws, cursor, n, u64::MAX).unwrap(),
            from,
        )
    }

    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// Random trees and operations: the revision walk lists the same entries in the
    /// same order as the full scan it replaces, from any cursor, in pages of any size.
    #[test]
    fn the_walk_lists_what_the_full_scan_lists() {
        for seed in 1..=40u64 {
            let ws = Workspace::open_in_memory(Options::default()).unwrap();
            let fs = ws.fs();
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let names = ["a", "b", "c", "d"];
            let mut cursors = vec![Cursor::START];
            for step in 0..120 {
                let pick = |rng: &mut Rng| {
                    let depth = 1 + rng.below(3);
                    let mut path = String::new();
                    for _ in 0..depth {
                        path.push('/');
                        path.push_str(names[rng.below(names.len() as u64) as usize]);
                    }
                    path
                };
                let p = pick(&mut rng);
                let q = pick(&mut rng);
                let _ = match rng.below(9) {
                    0 | 1 => fs.write_file(&p, format!("{seed} {step}")),
                    2 => fs.mkdir(
                        &p,
                        MkdirOptions {
                            recursive: true,
                            ..MkdirOptions::default()
                        },
                    ),
                    3 => fs.rm(
                        &p,
                        RmOptions {
                            recursive: true,
                            force: true,
                        },
                    ),
                    4 | 5 => fs.rename(&p, &q),
                    6 => fs.symlink("target", &p),
                    7 => fs.link(&p, &q),
                    _ => fs.chmod(&p, 0o700),
                };
                if rng.below(10) == 0 {
                    let page =
                        ws.changes_after(&Cursor::START, 1 + rng.below(20) as usize, u64::MAX);
                    if let Some(e) = page.unwrap().entries.last() {
                        cursors.push(Cursor::after(e));
                    }
                }
            }
            for cursor in &cursors {
                let expected = old_pages(&ws, cursor, 1000);
                for n in [1, 3, 1000] {
                    assert_eq!(
                        new_pages(&ws, cursor, n),
                        expected,
                        "seed {seed}, from {cursor:?}, pages of {n}"
                    );
                }
            }
        }
    }
}
