//! Space coming back: deleted content's pages return to the file system, in the
//! background and with `Workspace::compact`.

use std::path::Path;
use std::time::{Duration, Instant};

use computer_vfs::{CompactProgress, Error, Options, RmOptions, Workspace};

mod common;
use common::random_bytes;

/// The database file and its write-ahead log, in bytes.
fn on_disk(db: &Path) -> u64 {
    let len = |suffix: &str| {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        std::fs::metadata(name).map_or(0, |m| m.len())
    };
    len("") + len("-wal")
}

/// A new workspace in a new directory.
fn new_workspace() -> (tempfile::TempDir, std::path::PathBuf, Workspace) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ws.db");
    let ws = Workspace::open(&db, Options::default()).unwrap();
    (dir, db, ws)
}

/// Opens the existing workspace at `db`.
fn reopen(db: &Path) -> Workspace {
    let options = Options {
        create: false,
        ..Options::default()
    };
    Workspace::open(db, options).unwrap()
}

/// Removes /d and everything in it.
fn remove_d(ws: &Workspace) {
    let options = RmOptions {
        recursive: true,
        force: false,
    };
    ws.fs().rm("/d", options).unwrap();
}

/// Writes `files` files of 1 MiB of noise under /d.
fn fill(ws: &Workspace, files: u64) {
    let fs = ws.fs();
    fs.mkdir("/d", Default::default()).unwrap();
    for i in 0..files {
        fs.write_file(&format!("/d/{i}"), random_bytes(1 << 20, i))
            .unwrap();
    }
}

#[test]
fn compact_after_removing_everything_leaves_under_a_mebibyte() {
    let (_dir, db, ws) = new_workspace();
    fill(&ws, 40);
    ws.fs().write_file("/kept", b"kept").unwrap();
    remove_d(&ws);
    assert!(ws.stats().unwrap().free_bytes >= 40 << 20);
    let mut reports = Vec::<CompactProgress>::new();
    let report = ws.compact(&mut |p| reports.push(p)).unwrap();
    assert!(!report.rewrote, "a new workspace compacts in steps");
    assert!(report.bytes_before >= 40 << 20, "{report:?}");
    assert!(report.bytes_after < 1 << 20, "{report:?}");
    assert!(on_disk(&db) < 1 << 20, "{} bytes on disk", on_disk(&db));
    // Progress rose step by step to everything free at the start.
    let last = reports.last().unwrap();
    assert_eq!(last.freed_bytes, last.free_bytes_at_start);
    assert!(reports.len() > 2, "{reports:?}");
    assert!(reports
        .windows(2)
        .all(|w| w[0].freed_bytes <= w[1].freed_bytes));
    assert_eq!(ws.fs().read_file("/kept").unwrap(), b"kept");
    assert!(ws.check().unwrap().is_ok());
    drop(ws);
    let ws = reopen(&db);
    assert_eq!(ws.fs().read_file("/kept").unwrap(), b"kept");
    assert_eq!(ws.stats().unwrap().free_bytes, 0);
}

#[test]
fn compact_keeps_every_file_that_remains() {
    let (_dir, _db, ws) = new_workspace();
    fill(&ws, 12);
    // Remove every other file: the pages that remain are spread over the whole file.
    for i in (0..12).step_by(2) {
        ws.fs().unlink(&format!("/d/{i}")).unwrap();
    }
    let report = ws.compact(&mut |_| {}).unwrap();
    assert!(report.bytes_after < report.bytes_before, "{report:?}");
    assert_eq!(ws.stats().unwrap().free_bytes, 0);
    for i in (1..12).step_by(2) {
        assert_eq!(
            ws.fs().read_file(&format!("/d/{i}")).unwrap(),
            random_bytes(1 << 20, i)
        );
    }
    assert!(ws.check().unwrap().is_ok());
}

#[test]
fn a_workspace_made_without_incremental_vacuum_is_rewritten_once() {
    let (_dir, db, ws) = new_workspace();
    fill(&ws, 4);
    drop(ws);
    // As workspaces were made before: no incremental vacuum.
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch("PRAGMA auto_vacuum = NONE; VACUUM")
        .unwrap();
    drop(conn);
    let ws = reopen(&db);
    remove_d(&ws);
    let mut rewriting = false;
    let report = ws.compact(&mut |p| rewriting |= p.rewriting).unwrap();
    assert!(report.rewrote && rewriting, "{report:?}");
    assert!(report.bytes_after < 1 << 20, "{report:?}");
    // From then on it compacts in steps.
    fill(&ws, 2);
    remove_d(&ws);
    assert!(!ws.compact(&mut |_| {}).unwrap().rewrote);
    assert!(ws.check().unwrap().is_ok());
}

#[test]
fn the_background_gives_most_of_a_large_deletion_back() {
    let (_dir, db, ws) = new_workspace();
    fill(&ws, 64);
    ws.checkpoint().unwrap();
    let full = on_disk(&db);
    remove_d(&ws);
    // The database file shrinks with no call: what stays free is below the share the
    // background leaves for later writes (16 MiB here).
    let started = Instant::now();
    let db_file = || std::fs::metadata(&db).unwrap().len();
    while db_file() > 20 << 20 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the database file is still {} bytes (it was {full} with the files)",
            db_file()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(ws.check().unwrap().is_ok());
}

#[test]
fn compact_of_a_read_only_workspace_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ws.db");
    drop(Workspace::open(&db, Options::default()).unwrap());
    let ws = Workspace::open(
        &db,
        Options {
            create: false,
            read_only: true,
            ..Options::default()
        },
    )
    .unwrap();
    let err = ws.compact(&mut |_| {}).unwrap_err();
    assert!(matches!(err, Error::ReadOnly(_)), "{err}");
    assert_eq!(err.errno(), libc::EROFS);
}
