//! Reading the change log a revision at a time: what pages hold, where their cursors
//! leave off, and that a peer's own batches are passed over without being read.

use computer_vfs::*;

fn workspace(dir: &tempfile::TempDir, name: &str) -> Workspace {
    Workspace::open(dir.path().join(name), Options::default()).unwrap()
}

/// Every stored block the file states of `entries` name that `to` lacks, from `from`.
fn blocks_for(from: &Workspace, to: &Workspace, entries: &[ChangeEntry]) -> Vec<StoredBlock> {
    let wanted = file_blocks(entries);
    let have = to.has_blocks(&wanted).unwrap();
    wanted
        .iter()
        .zip(have)
        .filter(|(_, have)| !have)
        .map(|(h, _)| from.stored_block(h).unwrap().unwrap())
        .collect()
}

#[test]
fn a_complete_page_leaves_its_cursor_past_its_last_revision() {
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(&dir, "ws.db");
    let fs = ws.fs();
    fs.write_file("/a", "1").unwrap();
    fs.write_file("/b", "2").unwrap();
    let page = ws.changes_after(&Cursor::START, 100, u64::MAX).unwrap();
    assert!(page.complete);
    let paths: Vec<&[u8]> = page.entries.iter().map(|e| e.path.as_slice()).collect();
    // In (revision, path) order, children before their directory within a revision.
    assert_eq!(paths, [&b"/a"[..], b"/b", b"/"]);
    // All of the last revision is seen: the cursor says so with an empty path, which
    // sorts after every path of that revision.
    assert_eq!(page.next.revision, ws.revision().unwrap());
    assert!(page.next.path.is_empty());
    let again = ws.changes_after(&page.next, 100, u64::MAX).unwrap();
    assert!(again.entries.is_empty() && again.complete);
    assert_eq!(again.next, page.next);
    // Only what changed since comes next.
    fs.write_file("/c", "3").unwrap();
    let next = ws.changes_after(&page.next, 100, u64::MAX).unwrap();
    let paths: Vec<&[u8]> = next.entries.iter().map(|e| e.path.as_slice()).collect();
    assert_eq!(paths, [&b"/c"[..], b"/"]);
}

#[test]
fn one_revision_of_many_paths_is_read_in_pages_that_resume_inside_it() {
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(&dir, "ws.db");
    let fs = ws.fs();
    fs.mkdir("/tree", MkdirOptions::default()).unwrap();
    for i in 0..700 {
        fs.write_file(&format!("/tree/f{i:04}"), format!("{i}"))
            .unwrap();
    }
    let start = ws.changes_after(&Cursor::START, 100_000, u64::MAX).unwrap();
    // One revision moves the whole tree.
    fs.rename("/tree", "/moved").unwrap();
    let moved_at = ws.revision().unwrap();
    let mut cursor = start.next;
    let mut seen = Vec::new();
    loop {
        let page = ws.changes_after(&cursor, 64, u64::MAX).unwrap();
        assert!(page.entries.len() <= 64);
        for e in &page.entries {
            assert_eq!(e.revision, moved_at);
            seen.push(e.path.clone());
        }
        cursor = page.next;
        if page.complete {
            break;
        }
    }
    // The old tree's removal, the new one, and the root: every path once, in order.
    let mut sorted = seen.clone();
    sorted.sort_by_key(|p| order_key(p));
    sorted.dedup();
    assert_eq!(seen, sorted, "pages repeated or reordered paths");
    assert_eq!(seen.len(), 700 + 1 + 1 + 1, "{:?}", &seen[..5]);
}

#[test]
fn a_peers_own_batches_are_passed_over_whole() {
    let dir = tempfile::tempdir().unwrap();
    let server = workspace(&dir, "server.db");
    let replica = workspace(&dir, "replica.db");
    for d in 0..7 {
        server
            .fs()
            .mkdir(&format!("/d{d}"), MkdirOptions::default())
            .unwrap();
    }
    for i in 0..500 {
        server
            .fs()
            .write_file(&format!("/d{}/f{i}", i % 7), format!("file {i}"))
            .unwrap();
    }
    server.register_peer("r", replica.id()).unwrap();
    replica.register_peer("upstream", server.id()).unwrap();
    // The replica pulls everything, in pages.
    let mut cursor = Cursor::START;
    loop {
        let page = server.changes_for("r", &cursor, 100, u64::MAX).unwrap();
        let blocks = blocks_for(&server, &replica, &page.entries);
        replica
            .apply_pull("upstream", server.id(), &page.entries, &blocks, &page.next)
            .unwrap();
        cursor = page.next;
        if page.complete {
            break;
        }
    }
    assert_eq!(replica.fs().read_file("/d3/f3").unwrap(), b"file 3");
    // Everything the replica now has came from the server: one page, empty, complete,
    // whose cursor moves past it all.
    let page = replica
        .changes_for("upstream", &Cursor::START, 10, u64::MAX)
        .unwrap();
    assert!(page.entries.is_empty(), "{:?}", &page.entries[..1]);
    assert!(page.complete);
    assert_eq!(page.next.revision, replica.revision().unwrap());
    // A change of its own after that comes through.
    replica.fs().write_file("/mine", "local").unwrap();
    let page = replica
        .changes_for("upstream", &Cursor::START, 10, u64::MAX)
        .unwrap();
    let paths: Vec<&[u8]> = page.entries.iter().map(|e| e.path.as_slice()).collect();
    assert!(paths.contains(&&b"/mine"[..]), "{paths:?}");
    assert!(page.complete);
}
