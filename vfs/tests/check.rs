//! `check` against databases broken on purpose: each invariant it verifies, broken
//! through a raw SQLite connection the way a bug or a bad copy could, is reported; and
//! healthy databases with peers, tombstones and staged files pass.

use computer_vfs::Who;
use std::path::{Path, PathBuf};

use computer_vfs::*;

const PEER: &str = "p";
const REPLICA: &str = "replica-p";

/// A closed workspace with rows of every kind `check` reads: a removed file (its node
/// is inode 2 and its block id 1, both gone now), a directory and files, a rename over
/// a file (a path removed and filled again in one mutation), and a peer with both
/// cursors moved, a batch received from it and the record of how far it was applied.
fn healthy(dir: &Path) -> PathBuf {
    let path = dir.join("ws.db");
    let ws = Workspace::open(&path, Options::default()).unwrap();
    let fs = ws.fs();
    fs.write_file("/gone", "removed first").unwrap();
    fs.rm("/gone", RmOptions::default()).unwrap();
    fs.mkdir(
        "/d",
        MkdirOptions {
            recursive: false,
            mode: 0o755,
        },
    )
    .unwrap();
    fs.write_file("/d/a", "alpha").unwrap();
    fs.write_file("/d/b", "beta").unwrap();
    fs.rename("/d/b", "/d/a").unwrap();
    ws.register_peer(PEER, REPLICA).unwrap();
    let from_peer = ChangeEntry {
        revision: Revision(2),
        path: b"/from-peer".to_vec(),
        state: EntryState::Directory {
            perm: 0o755,
            mtime: 0,
        },
        base: Cursor::START,
    };
    let through = Cursor::after(&from_peer);
    let applied = ws
        .apply_push(PEER, REPLICA, &[from_peer], &[], &through)
        .unwrap();
    assert_eq!(applied.changed, 1);
    let ours = ws
        .changes_for(PEER, &Cursor::START, 1000, u64::MAX)
        .unwrap();
    assert!(ours.complete);
    ws.mark_delivered(PEER, REPLICA, &ours.next).unwrap();
    let report = ws.check().unwrap();
    assert!(report.is_ok(), "{:#?}", report.problems);
    path
}

fn read_only() -> Options {
    Options {
        create: false,
        read_only: true,
        ..Options::default()
    }
}

/// What a read-only check reports of the healthy database after `sql` ran on it. (Read
/// only: a writable open would repair some of it first, as it does after a crash.)
fn problems_after(sql: &str) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let path = healthy(dir.path());
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch(sql)
        .unwrap();
    let ws = Workspace::open(&path, read_only()).unwrap();
    let report = ws.check().unwrap();
    report.problems.into_iter().map(|p| p.0).collect()
}

#[track_caller]
fn assert_reported(sql: &str, expected: &str) {
    let problems = problems_after(sql);
    assert!(
        problems.iter().any(|p| p.contains(expected)),
        "after {sql}\nexpected a problem with {expected:?}, got {problems:#?}"
    );
}

#[test]
fn a_healthy_database_checks_clean_when_opened_read_only() {
    assert_eq!(problems_after(""), Vec::<String>::new());
}

#[test]
fn a_revision_past_the_workspace_is_reported_in_every_table() {
    let past = "(SELECT revision + 1 FROM state)";
    assert_reported(
        &format!("UPDATE nodes SET revision = {past} WHERE ino = 1"),
        "inode 1: revision",
    );
    assert_reported(
        &format!("UPDATE dirents SET revision = {past} WHERE name = CAST('d' AS BLOB)"),
        "entry \"d\" in directory 1: revision",
    );
    assert_reported(
        &format!("UPDATE tombstones SET revision = {past} WHERE path = CAST('/gone' AS BLOB)"),
        "tombstone of /gone: revision",
    );
    assert_reported(
        &format!("UPDATE received SET revision = {past}"),
        "batch received from peer p: revision",
    );
    assert_reported(
        &format!("UPDATE applied_through SET revision = {past}"),
        "record of how far peer p was applied: revision",
    );
}

#[test]
fn a_revision_before_the_first_is_reported() {
    assert_reported(
        "UPDATE nodes SET revision = 0 WHERE ino = 1",
        "inode 1: revision 0, outside",
    );
}

#[test]
fn an_id_counter_at_or_below_an_id_in_use_is_reported() {
    assert_reported(
        "UPDATE state SET next_ino = (SELECT max(ino) FROM nodes)",
        "next_ino is",
    );
    assert_reported(
        "UPDATE state SET next_block = (SELECT max(id) FROM blocks)",
        "next_block is",
    );
    assert_reported(
        "UPDATE state SET next_cookie = (SELECT max(cookie) FROM dirents)",
        "next_cookie is",
    );
}

#[test]
fn an_inode_number_named_only_by_a_stray_row_counts_as_in_use() {
    // An attribute of a node numbered past the counter: the next node would inherit it.
    assert_reported(
        "INSERT INTO xattrs (ino, name, value)
         VALUES ((SELECT next_ino FROM state), CAST('user.x' AS BLOB), X'00')",
        "next_ino is",
    );
}

#[test]
fn a_tombstone_of_a_path_bound_before_its_removal_is_reported() {
    // `/d` stands, bound by its mkdir: a removal since would have unbound it.
    assert_reported(
        "INSERT INTO tombstones (revision, path)
         VALUES ((SELECT revision FROM state), CAST('/d' AS BLOB))",
        "tombstone of /d at revision",
    );
}

#[test]
fn a_tombstone_of_the_root_or_a_relative_path_is_reported() {
    assert_reported(
        "INSERT INTO tombstones (revision, path) VALUES (2, CAST('/' AS BLOB))",
        "tombstone of \"/\" at revision 2: not a path below the root",
    );
    assert_reported(
        "INSERT INTO tombstones (revision, path) VALUES (2, CAST('d/a' AS BLOB))",
        "tombstone of \"d/a\" at revision 2: not a path below the root",
    );
}

#[test]
fn a_delivered_cursor_past_our_revision_is_reported() {
    assert_reported(
        "UPDATE peers SET delivered_rev = (SELECT revision + 1 FROM state)",
        "peer p: delivered cursor at revision",
    );
}

#[test]
fn a_negative_applied_cursor_is_reported() {
    assert_reported(
        "UPDATE peers SET applied_rev = -1",
        "peer p: applied cursor at negative revision -1",
    );
}

#[test]
fn rows_of_an_unknown_peer_are_reported() {
    assert_reported(
        "INSERT INTO received (revision, peer) VALUES (2, 'stranger')",
        "unknown peer stranger has 1 rows in received",
    );
    assert_reported(
        "INSERT INTO applied_through (peer, revision, through_rev, through_path)
         VALUES ('stranger', 2, 1, X'')",
        "unknown peer stranger has 1 rows in applied_through",
    );
}

#[test]
fn an_applied_through_record_past_the_applied_cursor_is_reported() {
    // The cursor is at (2, "/from-peer"): a later revision is past it, and so is a path
    // after it within revision 2.
    assert_reported(
        "UPDATE applied_through SET through_rev = through_rev + 1",
        "peer p: applied through (revision 3",
    );
    assert_reported(
        "UPDATE applied_through SET through_path = CAST('/g' AS BLOB)",
        "peer p: applied through (revision 2, \"/g\")",
    );
}

#[test]
fn an_applied_through_record_before_the_cursor_in_path_order_passes() {
    // Within a revision, paths come children first: `/from-peer/x` is before
    // `/from-peer`, though it sorts after it byte for byte.
    assert_eq!(
        problems_after("UPDATE applied_through SET through_path = CAST('/from-peer/x' AS BLOB)"),
        Vec::<String>::new()
    );
}

#[test]
fn a_staged_row_of_a_missing_node_or_a_directory_is_reported() {
    assert_reported(
        "INSERT INTO staged (ino, file) VALUES (2, 'f2')",
        "staging file f2 is bound to missing inode 2",
    );
    assert_reported(
        "INSERT INTO staged (ino, file) VALUES (1, 'f1')",
        "staging file f1 is bound to inode 1, not a regular file",
    );
}

/// A damaged length is reported, with nothing allocated for it: a terabyte here once
/// aborted the check on the allocation.
#[test]
fn a_block_length_past_the_largest_block_is_reported() {
    assert_reported(
        "UPDATE blocks SET raw_len = 1 << 40",
        "1099511627776 is above the largest block",
    );
}

#[test]
fn a_loose_hold_on_a_missing_block_is_reported() {
    assert_reported(
        "INSERT INTO loose_blocks (id, at) VALUES (1, 0)",
        "loose hold on missing block 1",
    );
}

/// A file being written through its staging file is bound in `staged` while its
/// content waits there: a healthy state, for the workspace and for what a crash leaves.
#[test]
fn a_file_staged_for_writing_checks_clean_live_and_as_a_crash_leaves_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ws.db");
    let options = Options {
        staging_dir: Some(dir.path().join("ws.db.staging")),
        ..Options::default()
    };
    let ws = Workspace::open(&path, options).unwrap();
    ws.fs().write_file("/f", "stored").unwrap();
    let ino = ws.fs().stat("/f").unwrap().ino;
    let opened = ws
        .open_for_kernel(Who::Trusted, ino, OpenFlags::WRITE, true)
        .unwrap();
    let staged = opened.staged.as_ref().expect("a small file is staged");
    std::os::unix::fs::FileExt::write_all_at(staged.file(), b"newer", 0).unwrap();
    assert_eq!(ws.staged_files().unwrap(), 1, "the binding is committed");
    let live = ws.check().unwrap();
    assert!(live.is_ok(), "{:#?}", live.problems);
    // Another open beside it reads what a crash would leave: the binding, the old content.
    let beside = Workspace::open(&path, read_only()).unwrap();
    assert_eq!(beside.staged_files().unwrap(), 1);
    let crashed = beside.check().unwrap();
    assert!(crashed.is_ok(), "{:#?}", crashed.problems);
    ws.release(opened.handle).unwrap();
}
