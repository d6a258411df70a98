//! Replication between two workspaces in one process: every page of changes from one,
//! with the blocks the other lacks, applied to the other, leaves identical trees.

use computer_vfs::*;

mod common;
use common::random_bytes;

fn workspace(dir: &tempfile::TempDir, name: &str) -> Workspace {
    Workspace::open(dir.path().join(name), Options::default()).unwrap()
}

/// Sends everything after `cursor` from `from` to `to` in small pages; returns the new
/// cursor and the bytes of blocks that travelled.
fn sync(from: &Workspace, to: &Workspace, mut cursor: Cursor) -> (Cursor, u64) {
    let mut sent = 0;
    loop {
        let page = from.changes_after(&cursor, 7, 1 << 20).unwrap();
        let wanted = file_blocks(&page.entries);
        let have = to.has_blocks(&wanted).unwrap();
        let blocks: Vec<StoredBlock> = wanted
            .iter()
            .zip(have)
            .filter(|(_, have)| !have)
            .map(|(hash, _)| {
                from.stored_block(hash)
                    .unwrap()
                    .expect("sender has its blocks")
            })
            .collect();
        sent += blocks.iter().map(|b| b.data.len() as u64).sum::<u64>();
        to.apply_changes(&page.entries, &blocks).unwrap();
        assert!(
            cursor_at_or_after(&page.next, &cursor),
            "cursor moved backwards"
        );
        cursor = page.next;
        if page.complete {
            return (cursor, sent);
        }
    }
}

/// Every path with its kind, permissions and content (files) or target (symlinks).
fn tree(ws: &Workspace) -> Vec<(String, String)> {
    let fs = ws.fs();
    let mut out = Vec::new();
    let mut stack = vec!["/".to_string()];
    while let Some(dir) = stack.pop() {
        for entry in fs.readdir(&dir).unwrap() {
            let path = join(&dir, &entry.name_lossy());
            let attr = fs.lstat(&path).unwrap();
            let what = match attr.kind {
                FileKind::Directory => {
                    stack.push(path.clone());
                    format!("dir {:o} {}", attr.perm, attr.mtime)
                }
                FileKind::Symlink => format!("link {}", fs.readlink(&path).unwrap()),
                _ => {
                    let data = fs.read_file(&path).unwrap();
                    format!(
                        "file {:o} {} {} {}",
                        attr.perm,
                        attr.mtime,
                        data.len(),
                        blake3::hash(&data)
                    )
                }
            };
            out.push((path, what));
        }
    }
    out.sort();
    out
}

#[test]
fn a_replica_converges_through_every_kind_of_change() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (workspace(&dir, "a.db"), workspace(&dir, "b.db"));
    let fs = a.fs();
    fs.mkdir(
        "/src/deep/er",
        MkdirOptions {
            recursive: true,
            mode: 0o750,
        },
    )
    .unwrap();
    fs.write_file("/src/a.txt", "alpha").unwrap();
    fs.write_file("/src/deep/big", random_bytes(3 << 20, 1))
        .unwrap();
    fs.symlink("deep/big", "/src/link").unwrap();
    fs.write_file("/src/deep/er/x", "x").unwrap();
    let (cursor, first) = sync(&a, &b, Cursor::START);
    assert_eq!(tree(&a), tree(&b));
    assert!(first >= 3 << 20, "the big file's blocks travelled: {first}");

    // Renames of a whole tree, deletions, a file replaced by a directory, a head
    // insertion into the big file, a truncate, a hard link, a chmod.
    fs.rename("/src/deep", "/moved").unwrap();
    fs.rm("/src/a.txt", RmOptions::default()).unwrap();
    fs.write_file("/src/a.txt", "alpha again").unwrap();
    fs.rm("/src/link", RmOptions::default()).unwrap();
    fs.mkdir("/src/link", MkdirOptions::default()).unwrap();
    let mut big = b"a header of a few bytes".to_vec();
    big.extend(random_bytes(3 << 20, 1));
    fs.write_file("/moved/big", &big).unwrap();
    fs.truncate("/moved/er/x", 0).unwrap();
    fs.link("/src/a.txt", "/hard").unwrap();
    fs.chmod("/moved", 0o700).unwrap();
    let (cursor, second) = sync(&a, &b, cursor);
    assert_eq!(tree(&a), tree(&b));
    assert!(
        second < 1 << 20,
        "a head insertion re-sent {second} bytes of a 3 MiB file"
    );

    // Nothing changed: nothing to send, and applying a page twice changes nothing.
    let again = a.changes_after(&cursor, 100, 1 << 30).unwrap();
    assert!(again.entries.is_empty() && again.complete);
    // Replaying the whole log ends in the same tree; without the removals of paths
    // filled again later (which replay as remove-then-create), it changes nothing.
    let all = a.changes_after(&Cursor::START, 10_000, u64::MAX).unwrap();
    b.apply_changes(&all.entries, &[]).unwrap();
    assert_eq!(tree(&a), tree(&b));
    let states: Vec<ChangeEntry> = all
        .entries
        .iter()
        .filter(|e| e.state != EntryState::Removed)
        .cloned()
        .collect();
    assert_eq!(b.apply_changes(&states, &[]).unwrap(), 0);
    assert!(a.check().unwrap().is_ok() && b.check().unwrap().is_ok());
}

#[test]
fn a_block_that_does_not_match_its_hash_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (workspace(&dir, "a.db"), workspace(&dir, "b.db"));
    a.fs().write_file("/f", random_bytes(100_000, 2)).unwrap();
    let page = a.changes_after(&Cursor::START, 100, u64::MAX).unwrap();
    let EntryState::File { blocks, .. } =
        &page.entries.iter().find(|e| e.path == b"/f").unwrap().state
    else {
        panic!("not a file")
    };
    let mut stored = a.stored_block(&blocks[0].hash).unwrap().unwrap();
    stored.data[10] ^= 1;
    let err = b.apply_changes(&page.entries, &[stored]).unwrap_err();
    assert_eq!(err.errno(), libc::EIO);
    assert!(!b.fs().exists("/f").unwrap());
}

/// A peer's file state that no write could make is refused whole, and the store checks
/// clean after: a stored block referenced with another length than its own, an empty
/// block, a size past the largest file.
#[test]
fn a_file_state_no_write_could_make_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (workspace(&dir, "a.db"), workspace(&dir, "b.db"));
    a.fs().write_file("/f", random_bytes(100_000, 3)).unwrap();
    let page = a.changes_after(&Cursor::START, 100, u64::MAX).unwrap();
    let supplied: Vec<StoredBlock> = file_blocks(&page.entries)
        .iter()
        .map(|hash| a.stored_block(hash).unwrap().unwrap())
        .collect();
    b.apply_changes(&page.entries, &supplied).unwrap();
    let block = supplied[0].hash;
    let file = |size: u64, blocks: Vec<BlockRef>| ChangeEntry {
        path: b"/x".to_vec(),
        state: EntryState::File {
            perm: 0o644,
            mtime: 0,
            size,
            blocks,
        },
        ..page
            .entries
            .iter()
            .find(|e| e.path == b"/f")
            .unwrap()
            .clone()
    };
    let refused = [
        (
            file(
                100,
                vec![BlockRef {
                    hash: block,
                    len: 100,
                }],
            ),
            libc::EIO,
        ),
        (
            file(
                0,
                vec![BlockRef {
                    hash: block,
                    len: 0,
                }],
            ),
            libc::EIO,
        ),
        (file(1 << 63, vec![]), libc::EFBIG),
    ];
    for (entry, errno) in refused {
        let err = b.apply_changes(&[entry], &[]).unwrap_err();
        assert_eq!(err.errno(), errno, "{err}");
        assert!(!b.fs().exists("/x").unwrap());
    }
    assert!(b.check().unwrap().is_ok());
}

/// Random operations on one workspace, synced to another in random page sizes after
/// random stretches: the trees are equal after every sync.
#[test]
fn a_hole_wider_than_four_gibibytes_replicates() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (workspace(&dir, "a.db"), workspace(&dir, "b.db"));
    let far = 5u64 << 30;
    a.fs().write_file("/sparse", "head").unwrap();
    a.fs().write_at("/sparse", far, "tail").unwrap();
    sync(&a, &b, Cursor::START);
    let stat = b.fs().stat("/sparse").unwrap();
    assert_eq!(stat.size, far + 4);
    let fs = b.fs();
    assert_eq!(fs.read_range("/sparse", far, 4).unwrap(), b"tail");
    assert_eq!(fs.read_range("/sparse", 0, 4).unwrap(), b"head");
    assert_eq!(fs.read_range("/sparse", 1 << 32, 4).unwrap(), vec![0; 4]);
}

#[test]
fn blocks_sent_ahead_of_their_entries_are_held_then_used_or_swept() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (workspace(&dir, "a.db"), workspace(&dir, "b.db"));
    a.fs().write_file("/big", random_bytes(1 << 20, 7)).unwrap();
    a.fs()
        .write_file("/other", random_bytes(200_000, 8))
        .unwrap();
    let page = a.changes_after(&Cursor::START, 100, u64::MAX).unwrap();
    let hashes = |path: &[u8]| -> Vec<BlockHash> {
        let entry = page.entries.iter().find(|e| e.path == path).unwrap();
        match &entry.state {
            EntryState::File { blocks, .. } => blocks.iter().map(|b| b.hash).collect(),
            _ => unreachable!(),
        }
    };
    let stored = |hs: Vec<BlockHash>| -> Vec<StoredBlock> {
        hs.iter()
            .map(|h| a.stored_block(h).unwrap().unwrap())
            .collect()
    };
    // All blocks go ahead, in two calls; the entries follow with none attached.
    assert!(b.put_blocks(&stored(hashes(b"/big"))).unwrap() > 1);
    b.put_blocks(&stored(hashes(b"/other"))).unwrap();
    assert!(b.check().unwrap().is_ok(), "loose blocks are accounted for");
    let big: Vec<_> = page
        .entries
        .iter()
        .filter(|e| e.path == b"/big")
        .cloned()
        .collect();
    b.apply_changes(&big, &[]).unwrap();
    assert_eq!(
        b.fs().read_file("/big").unwrap(),
        a.fs().read_file("/big").unwrap()
    );
    assert!(b.check().unwrap().is_ok());
    // /other never came: its blocks go with the sweep, and only they.
    let before = b.check().unwrap().blocks;
    assert!(b.sweep_loose_blocks(std::time::Duration::ZERO).unwrap() > 0);
    let report = b.check().unwrap();
    assert!(report.is_ok() && report.blocks < before);
    assert_eq!(
        b.fs().read_file("/big").unwrap(),
        a.fs().read_file("/big").unwrap()
    );
    // A forged block is refused before anything is stored.
    let mut forged = stored(hashes(b"/other")).remove(0);
    forged.data[0] ^= 1;
    assert!(b.put_blocks(&[forged]).is_err());
}

mod random {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        Write(u8, u16, u8),
        Append(u8, u8),
        Mkdir(u8),
        Remove(u8),
        Rename(u8, u8),
        Symlink(u8, u8),
        Chmod(u8),
        Sync(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (any::<u8>(), any::<u16>(), any::<u8>()).prop_map(|(p, n, s)| Op::Write(p, n, s)),
            2 => (any::<u8>(), any::<u8>()).prop_map(|(p, s)| Op::Append(p, s)),
            2 => any::<u8>().prop_map(Op::Mkdir),
            2 => any::<u8>().prop_map(Op::Remove),
            2 => (any::<u8>(), any::<u8>()).prop_map(|(a, b)| Op::Rename(a, b)),
            1 => (any::<u8>(), any::<u8>()).prop_map(|(a, b)| Op::Symlink(a, b)),
            1 => any::<u8>().prop_map(Op::Chmod),
            2 => any::<u8>().prop_map(Op::Sync),
        ]
    }

    const PATHS: [&str; 8] = ["/a", "/b", "/a/x", "/a/y", "/b/x", "/a/x/z", "/c", "/b/y"];

    fn path(i: u8) -> &'static str {
        PATHS[i as usize % PATHS.len()]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]
        #[test]
        fn replica_equals_source_after_every_sync(ops in proptest::collection::vec(op(), 1..40)) {
            let dir = tempfile::tempdir().unwrap();
            let (a, b) = (workspace(&dir, "a.db"), workspace(&dir, "b.db"));
            let fs = a.fs();
            let mut cursor = Cursor::START;
            for op in ops {
                // Operations may fail (missing parent, not a directory...): that is fine,
                // only the resulting trees matter.
                let _ = match op {
                    Op::Write(p, n, seed) => fs.write_file(path(p), random_bytes(n as usize * 64, seed as u64)),
                    Op::Append(p, seed) => fs.append(path(p), random_bytes(100, seed as u64)),
                    Op::Mkdir(p) => fs.mkdir(path(p), MkdirOptions::default()),
                    Op::Remove(p) => fs.rm(path(p), RmOptions { recursive: true, force: true }),
                    Op::Rename(x, y) => fs.rename(path(x), path(y)),
                    Op::Symlink(x, y) => fs.symlink(path(x), path(y)),
                    Op::Chmod(p) => fs.chmod(path(p), 0o700),
                    Op::Sync(page) => {
                        cursor = sync_pages(&a, &b, cursor.clone(), 1 + page as usize % 5);
                        prop_assert_eq!(tree(&a), tree(&b));
                        Ok(())
                    }
                };
            }
            let _ = sync_pages(&a, &b, cursor, 3);
            prop_assert_eq!(tree(&a), tree(&b));
            prop_assert!(b.check().unwrap().is_ok());
        }
    }

    fn sync_pages(
        from: &Workspace,
        to: &Workspace,
        mut cursor: Cursor,
        page_entries: usize,
    ) -> Cursor {
        loop {
            let page = from.changes_after(&cursor, page_entries, 1 << 20).unwrap();
            let wanted = file_blocks(&page.entries);
            let have = to.has_blocks(&wanted).unwrap();
            let blocks: Vec<StoredBlock> = wanted
                .iter()
                .zip(have)
                .filter(|(_, have)| !have)
                .map(|(h, _)| from.stored_block(h).unwrap().unwrap())
                .collect();
            to.apply_changes(&page.entries, &blocks).unwrap();
            assert!(cursor_at_or_after(&page.next, &cursor));
            cursor = page.next;
            if page.complete {
                return cursor;
            }
        }
    }
}
