//! Batched commits (`Options::commit_delay`, as `computerd mount` opens a workspace):
//! mutations share one transaction and the `state` row (revision, counters) is written
//! back only before something reads it or the batch commits. Whatever reads inside a
//! batch, and whatever opens the database after it, must see every acknowledged
//! mutation counted exactly once, and nothing of a failed one.

use computer_vfs::Who;
use std::time::Duration;

use computer_vfs::{FileKind, InodeNo, NewNode, Options, Workspace};

fn open(path: &std::path::Path) -> Workspace {
    Workspace::open(
        path,
        Options {
            create: true,
            // Long enough that no batch commits on its own during the test.
            commit_delay: Some(Duration::from_secs(3600)),
            ..Options::default()
        },
    )
    .unwrap()
}

fn assert_clean(ws: &Workspace) {
    let report = ws.check().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

#[test]
fn reads_inside_a_batch_see_every_mutation_before_them() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ws.db");
    let ws = open(&db);
    let start = ws.revision().unwrap();

    // A burst with no read between its mutations, then reads of the counters.
    let d = ws
        .mkdir(Who::Trusted, InodeNo::ROOT, b"d", NewNode::new(0o755))
        .unwrap()
        .ino;
    for i in 0..50 {
        ws.mknod(
            Who::Trusted,
            d,
            format!("f{i}").as_bytes(),
            FileKind::File,
            NewNode::new(0o644),
            0,
        )
        .unwrap();
    }
    assert_eq!(ws.revision().unwrap().0, start.0 + 51);
    assert_eq!(ws.stats().unwrap().files, 50);
    assert_clean(&ws);

    // Failed mutations take no revision and count nothing.
    assert!(ws
        .mkdir(Who::Trusted, InodeNo::ROOT, b"d", NewNode::new(0o755))
        .is_err());
    assert!(ws.unlink(Who::Trusted, d, b"missing").is_err());
    assert_eq!(ws.revision().unwrap().0, start.0 + 51);

    for i in 0..20 {
        ws.unlink(Who::Trusted, d, format!("f{i}").as_bytes())
            .unwrap();
    }
    // A failure right after a burst of unwritten counters.
    assert!(ws.unlink(Who::Trusted, d, b"f0").is_err());
    assert_eq!(ws.revision().unwrap().0, start.0 + 71);
    assert_eq!(ws.stats().unwrap().files, 30);
    assert_clean(&ws);

    // File content moves the stored-bytes counter, which check() compares with the
    // blocks; write through the path API inside the same batch.
    let fs = ws.fs();
    let content: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    fs.write_file("/d/content", content).unwrap();
    assert_clean(&ws);
    let revision = ws.revision().unwrap();
    drop(fs);
    drop(ws);

    // Closing committed the batch with its counters.
    let ws = open(&db);
    assert_eq!(ws.revision().unwrap(), revision);
    assert_eq!(ws.stats().unwrap().files, 31);
    assert_clean(&ws);
    // New numbers continue from the written counters: nothing is handed out twice.
    let e = ws
        .mkdir(Who::Trusted, InodeNo::ROOT, b"e", NewNode::new(0o755))
        .unwrap();
    assert!(e.ino.0 > d.0);
    ws.mknod(
        Who::Trusted,
        e.ino,
        b"g",
        FileKind::File,
        NewNode::new(0o644),
        0,
    )
    .unwrap();
    assert_eq!(ws.revision().unwrap().0, revision.0 + 2);
    assert_clean(&ws);
}

#[test]
fn a_workspace_closed_at_once_commits_its_batch() {
    // A `computerd fs import` of one file on a busy machine lost its whole batch: the
    // workspace closed before the commit thread had first looked at its stop flag, and
    // the thread then left without committing.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ws.db");
    let batched = || computer_vfs::Options {
        commit_delay: Some(std::time::Duration::from_secs(60)),
        ..computer_vfs::Options::default()
    };
    for i in 0..200 {
        let ws = computer_vfs::Workspace::open(&db, batched()).unwrap();
        ws.fs()
            .mkdir(&format!("/d{i}"), computer_vfs::MkdirOptions::default())
            .unwrap();
    }
    let ws = computer_vfs::Workspace::open(&db, computer_vfs::Options::default()).unwrap();
    let missing: Vec<usize> = (0..200)
        .filter(|i| !ws.fs().exists(&format!("/d{i}")).unwrap())
        .collect();
    assert!(missing.is_empty(), "lost at close: {missing:?}");
}

/// SQLite's file format bytes (offsets 18 and 19 of the header): 2 in WAL mode, 1 with
/// a rollback journal.
fn format_bytes(db: &std::path::Path) -> [u8; 2] {
    let header = std::fs::read(db).unwrap();
    [header[18], header[19]]
}

fn bulk(path: &std::path::Path) -> Workspace {
    let options = Options {
        create: true,
        commit_delay: Some(Duration::from_millis(250)),
        bulk_load: true,
        ..Options::default()
    };
    Workspace::open(path, options).unwrap()
}

#[test]
fn a_bulk_load_writes_past_the_log_and_leaves_the_database_in_wal_mode() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ws.db");
    drop(open(&db));
    assert_eq!(format_bytes(&db), [2, 2]);
    let ws = bulk(&db);
    let fs = ws.fs();
    for i in 0..200u32 {
        fs.write_file(&format!("/f{i}"), i.to_le_bytes().repeat(4096))
            .unwrap();
    }
    ws.sync().unwrap();
    // Committed through a rollback journal: nothing in a log.
    assert_eq!(format_bytes(&db), [1, 1]);
    let wal = dir.path().join("ws.db-wal");
    assert!(std::fs::metadata(&wal).map_or(true, |m| m.len() == 0));
    assert_clean(&ws);
    drop((fs, ws));
    assert_eq!(format_bytes(&db), [2, 2]);
    assert!(!dir.path().join("ws.db-journal").exists());

    let ws = open(&db);
    assert_clean(&ws);
    assert_eq!(ws.stats().unwrap().files, 200);
    assert_eq!(
        ws.fs().read_file("/f7").unwrap(),
        7u32.to_le_bytes().repeat(4096)
    );
}

#[test]
fn a_bulk_load_beside_another_connection_stays_in_wal_mode() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ws.db");
    let other = open(&db);
    let ws = bulk(&db);
    ws.fs().write_file("/a", b"a").unwrap();
    ws.sync().unwrap();
    assert_eq!(format_bytes(&db), [2, 2]);
    drop(ws);
    assert_eq!(other.fs().read_file("/a").unwrap(), b"a");
    assert_clean(&other);
}
