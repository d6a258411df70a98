//! End-to-end checks of the path and inode APIs on real database files.

use computer_vfs::*;

mod common;
use common::random_bytes;

fn workspace() -> (tempfile::TempDir, Workspace) {
    let dir = tempfile::tempdir().unwrap();
    let ws = Workspace::open(dir.path().join("ws.db"), Options::default()).unwrap();
    (dir, ws)
}

#[test]
fn write_read_and_list() {
    let (_dir, ws) = workspace();
    let fs = ws.fs();
    fs.mkdir(
        "/a/b",
        MkdirOptions {
            recursive: true,
            mode: 0o755,
        },
    )
    .unwrap();
    fs.write_file("/a/b/hello.txt", "hello world\n").unwrap();
    assert_eq!(
        fs.read_to_string("/a/b/hello.txt").unwrap(),
        "hello world\n"
    );
    let names: Vec<String> = fs
        .readdir("/a/b")
        .unwrap()
        .iter()
        .map(|e| e.name_lossy())
        .collect();
    assert_eq!(names, vec!["hello.txt"]);
    assert_eq!(fs.stat("/a/b/hello.txt").unwrap().size, 12);
    let err = fs.read_file("/a/missing").unwrap_err();
    assert_eq!(err.errno(), libc::ENOENT);
    assert_eq!(err.to_string(), "/a/missing: no such file or directory");
    fs.append("/a/b/hello.txt", "more\n").unwrap();
    assert_eq!(
        fs.read_to_string("/a/b/hello.txt").unwrap(),
        "hello world\nmore\n"
    );
    fs.write_at("/a/b/hello.txt", 0, "HELLO").unwrap();
    assert_eq!(
        fs.read_to_string("/a/b/hello.txt").unwrap(),
        "HELLO world\nmore\n"
    );
    fs.truncate("/a/b/hello.txt", 5).unwrap();
    assert_eq!(fs.read_to_string("/a/b/hello.txt").unwrap(), "HELLO");
    fs.truncate("/a/b/hello.txt", 8).unwrap();
    assert_eq!(fs.read_file("/a/b/hello.txt").unwrap(), b"HELLO\0\0\0");
    assert!(
        ws.check().unwrap().is_ok(),
        "{:?}",
        ws.check().unwrap().problems
    );
}

#[test]
fn large_file_round_trips_and_partial_writes_touch_few_blocks() {
    let (_dir, ws) = workspace();
    let fs = ws.fs();
    let data = random_bytes(8 << 20, 1);
    fs.write_file("/big", &data).unwrap();
    assert_eq!(fs.read_file("/big").unwrap(), data);
    let before = ws.stats().unwrap();
    let mut changed = data.clone();
    changed[4 << 20] ^= 0xff;
    fs.write_at("/big", 4 << 20, [changed[4 << 20]]).unwrap();
    assert_eq!(fs.read_file("/big").unwrap(), changed);
    let after = ws.stats().unwrap();
    assert!(
        after.blocks <= before.blocks + 2,
        "{} -> {} blocks",
        before.blocks,
        after.blocks
    );
    let report = ws.check().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
}

#[test]
fn identical_files_are_stored_once() {
    let (_dir, ws) = workspace();
    let fs = ws.fs();
    let data = random_bytes(4 << 20, 2);
    for i in 0..5 {
        fs.write_file(&format!("/copy{i}"), &data).unwrap();
    }
    let stats = ws.stats().unwrap();
    assert_eq!(stats.logical_bytes, 5 * data.len() as u64);
    assert!(stats.stored_bytes < data.len() as u64 + (64 << 10));
    fs.copy("/copy0", "/copy5", false).unwrap();
    assert_eq!(fs.read_file("/copy5").unwrap(), data);
    assert!(ws.stats().unwrap().stored_bytes < data.len() as u64 + (64 << 10));
    assert!(ws.check().unwrap().is_ok());
}

#[test]
fn rename_symlinks_and_links() {
    let (_dir, ws) = workspace();
    let fs = ws.fs();
    fs.mkdir("/d", MkdirOptions::default()).unwrap();
    fs.write_file("/d/f", "x").unwrap();
    fs.symlink("d/f", "/rel").unwrap();
    fs.symlink("/d", "/abs").unwrap();
    assert_eq!(fs.read_to_string("/rel").unwrap(), "x");
    assert_eq!(fs.read_to_string("/abs/f").unwrap(), "x");
    fs.symlink("/loop2", "/loop1").unwrap();
    fs.symlink("/loop1", "/loop2").unwrap();
    assert_eq!(fs.stat("/loop1").unwrap_err().errno(), libc::ELOOP);
    fs.link("/d/f", "/hard").unwrap();
    assert_eq!(fs.stat("/hard").unwrap().nlink, 2);
    fs.rename("/d", "/e").unwrap();
    assert_eq!(fs.read_to_string("/e/f").unwrap(), "x");
    assert_eq!(fs.stat("/rel").unwrap_err().errno(), libc::ENOENT);
    fs.mkdir("/e/sub", MkdirOptions::default()).unwrap();
    assert_eq!(
        fs.rename("/e", "/e/sub/x").unwrap_err().errno(),
        libc::EINVAL
    );
    fs.write_file("/g", "g").unwrap();
    fs.rename("/g", "/e/f").unwrap();
    assert_eq!(fs.read_to_string("/e/f").unwrap(), "g");
    assert_eq!(fs.read_to_string("/hard").unwrap(), "x");
    assert_eq!(fs.stat("/hard").unwrap().nlink, 1);
    fs.rm(
        "/e",
        RmOptions {
            recursive: true,
            force: false,
        },
    )
    .unwrap();
    assert!(!fs.exists("/e").unwrap());
    assert!(
        ws.check().unwrap().is_ok(),
        "{:?}",
        ws.check().unwrap().problems
    );
}

#[test]
fn glob_and_grep() {
    let (_dir, ws) = workspace();
    let fs = ws.fs();
    fs.mkdir(
        "/src/deep",
        MkdirOptions {
            recursive: true,
            mode: 0o755,
        },
    )
    .unwrap();
    fs.write_file("/src/a.rs", "fn main() {}\n// TODO one\n")
        .unwrap();
    fs.write_file("/src/deep/b.rs", "todo two\nTODO three\n")
        .unwrap();
    fs.write_file("/src/c.txt", "TODO txt\n").unwrap();
    assert_eq!(
        fs.glob("/src/**/*.rs").unwrap(),
        vec!["/src/a.rs", "/src/deep/b.rs"]
    );
    assert_eq!(fs.glob("/src/*.rs").unwrap(), vec!["/src/a.rs"]);
    let hits = fs.grep("TODO", "/src", &GrepOptions::default()).unwrap();
    assert_eq!(hits.len(), 3);
    let hits = fs
        .grep(
            "todo",
            "/src",
            &GrepOptions {
                ignore_case: true,
                include: Some("*.rs".into()),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(hits.len(), 3);
    assert!(hits
        .iter()
        .any(|m| m.path == "/src/deep/b.rs" && m.line_number == 2));
}

#[test]
fn a_version_1_database_gains_the_replication_tables() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    {
        let ws = Workspace::open(&path, Options::default()).unwrap();
        ws.fs().write_file("/kept", "from version 1").unwrap();
    }
    {
        // What a version 1 build left: no replication tables.
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "DROP TABLE peers; DROP TABLE received; DROP TABLE applied_through;
             DROP TABLE loose_blocks;
             DROP INDEX dirents_by_revision; DROP INDEX tombstones_by_path;
             UPDATE meta SET value = 1 WHERE key = 'schema_version';",
        )
        .unwrap();
    }
    let read_only = Options {
        read_only: true,
        ..Options::default()
    };
    assert!(
        Workspace::open(&path, read_only).is_err(),
        "a read-only open cannot upgrade"
    );
    let ws = Workspace::open(&path, Options::default()).unwrap();
    assert_eq!(ws.fs().read_file("/kept").unwrap(), b"from version 1");
    ws.register_peer("p", "r").unwrap();
    assert!(ws.check().unwrap().is_ok());
    drop(ws);
    // And the indexes of version 3, which read the change log a revision at a time.
    let conn = rusqlite::Connection::open(&path).unwrap();
    let indexes: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'index'
             AND name IN ('dirents_by_revision', 'tombstones_by_path')",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(indexes, 2);
}

/// The names in `dir`, sorted.
fn names(fs: &Fs, dir: &str) -> Vec<String> {
    let mut names: Vec<String> = fs
        .readdir(dir)
        .unwrap()
        .iter()
        .map(|e| e.name_lossy())
        .collect();
    names.sort();
    names
}

#[test]
fn a_replacement_lands_whole_at_commit_and_keeps_the_mode() {
    let (_dir, ws) = workspace();
    let fs = ws.fs();
    fs.write_file("/f", "old").unwrap();
    fs.chmod("/f", 0o600).unwrap();
    let new = random_bytes(3 << 20, 7);
    let mut replacement = fs.create_replace("/f").unwrap();
    // Pieces in any order: the second half first.
    let half = new.len() / 2;
    replacement.write_at(half as u64, &new[half..]).unwrap();
    replacement.write_at(0, &new[..half]).unwrap();
    assert_eq!(
        fs.read_file("/f").unwrap(),
        b"old",
        "nothing shows before commit"
    );
    assert_eq!(replacement.commit().unwrap(), new.len() as u64);
    assert_eq!(fs.read_file("/f").unwrap(), new);
    assert_eq!(fs.stat("/f").unwrap().perm, 0o600);
    assert_eq!(names(&fs, "/"), ["f"], "no hidden file is left");
}

#[test]
fn a_dropped_replacement_leaves_the_file_and_nothing_else() {
    let (_dir, ws) = workspace();
    let fs = ws.fs();
    fs.write_file("/f", "old").unwrap();
    let mut replacement = fs.create_replace("/f").unwrap();
    replacement.write_at(0, b"half of the new").unwrap();
    drop(replacement);
    assert_eq!(fs.read_file("/f").unwrap(), b"old");
    assert_eq!(names(&fs, "/"), ["f"]);
    // A new file that is never committed never appears.
    drop(fs.create_replace("/g").unwrap());
    assert_eq!(names(&fs, "/"), ["f"]);
}

#[test]
fn a_replacement_follows_a_symlink_and_refuses_a_directory() {
    let (_dir, ws) = workspace();
    let fs = ws.fs();
    fs.mkdir("/d", MkdirOptions::default()).unwrap();
    fs.write_file("/d/target", "old").unwrap();
    fs.symlink("d/target", "/link").unwrap();
    let mut replacement = fs.create_replace("/link").unwrap();
    replacement.write_at(0, b"new").unwrap();
    replacement.commit().unwrap();
    assert_eq!(
        fs.readlink("/link").unwrap(),
        "d/target",
        "the link stays a link"
    );
    assert_eq!(fs.read_file("/d/target").unwrap(), b"new");
    assert!(matches!(fs.create_replace("/d"), Err(Error::IsDir(_))));
    assert!(matches!(fs.create_replace("/"), Err(Error::IsDir(_))));
    assert!(matches!(
        fs.create_replace("/missing/f"),
        Err(Error::NotFound(_))
    ));
}

#[test]
fn a_replacement_of_a_name_at_the_limit_fits_its_hidden_name() {
    let (_dir, ws) = workspace();
    let fs = ws.fs();
    let name = format!("/{}", "n".repeat(NAME_MAX));
    let mut replacement = fs.create_replace(&name).unwrap();
    replacement.write_at(0, b"x").unwrap();
    replacement.commit().unwrap();
    assert_eq!(fs.read_file(&name).unwrap(), b"x");
}

/// A caller's change of a staged file's times is checked before anything changes (the
/// staging file's times are the file's while it is dirty): a stranger's is refused and
/// leaves them as they were; the owner's reaches the file and is what ingestion stores.
#[test]
fn a_staged_files_times_change_only_when_the_caller_may() {
    let dir = tempfile::tempdir().unwrap();
    let ws = common::staging_workspace(dir.path());
    let owner = NewNode {
        perm: 0o644,
        uid: 1000,
        gid: 1000,
    };
    let (attr, opened) = ws
        .create_for_kernel(
            Who::Trusted,
            InodeNo::ROOT,
            b"f",
            owner,
            OpenFlags::WRITE,
            true,
        )
        .unwrap();
    let staged = opened.staged.as_ref().expect("a new file is staged");
    std::os::unix::fs::FileExt::write_all_at(staged.file(), b"written", 0).unwrap();
    let written = ws.getattr(attr.ino).unwrap();
    let set_mtime = SetAttr {
        mtime: Some(SetTime::At(1_000_000_000_000_000_000)),
        ..SetAttr::default()
    };
    let stranger = KnownCaller::with_groups(&[]);
    let who = Who::Caller(Credentials::new(2000, 2000, &stranger));
    let refused = ws.setattr(who, attr.ino, &set_mtime).unwrap_err();
    assert_eq!(refused.errno(), libc::EPERM);
    assert_eq!(ws.getattr(attr.ino).unwrap().mtime, written.mtime);

    let owner_caller = KnownCaller::with_groups(&[]);
    let who = Who::Caller(Credentials::new(1000, 1000, &owner_caller));
    let changed = ws.setattr(who, attr.ino, &set_mtime).unwrap();
    assert_eq!(changed.mtime, 1_000_000_000_000_000_000);
    ws.release(opened.handle).unwrap();
    drop(ws);
    // Opening it again ingests whatever is still staged.
    let ws = common::staging_workspace(dir.path());
    assert_eq!(ws.staged_files().unwrap(), 0);
    let stored = ws.getattr(attr.ino).unwrap();
    assert_eq!((stored.mtime, stored.size), (1_000_000_000_000_000_000, 7));
}

/// A refused change of times leaves a buffered write's mtime, which an allowed one
/// replaces.
#[test]
fn a_refused_times_change_keeps_a_buffered_writes_mtime() {
    let dir = tempfile::tempdir().unwrap();
    let ws = Workspace::open(dir.path().join("ws.db"), Options::default()).unwrap();
    let owner = NewNode {
        perm: 0o644,
        uid: 1000,
        gid: 1000,
    };
    let (attr, handle) = ws
        .create(Who::Trusted, InodeNo::ROOT, b"f", owner, OpenFlags::WRITE)
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2));
    ws.write(handle, 0, b"buffered").unwrap();
    let written = ws.getattr(attr.ino).unwrap();
    assert!(written.mtime > attr.mtime, "the write's time shows");
    let set_mtime = SetAttr {
        mtime: Some(SetTime::At(1_000_000_000)),
        ..SetAttr::default()
    };
    let nobody = KnownCaller::with_groups(&[]);
    let stranger = Who::Caller(Credentials::new(2000, 2000, &nobody));
    assert_eq!(
        ws.setattr(stranger, attr.ino, &set_mtime)
            .unwrap_err()
            .errno(),
        libc::EPERM
    );
    assert_eq!(ws.getattr(attr.ino).unwrap().mtime, written.mtime);
    let owner = Who::Caller(Credentials::new(1000, 1000, &nobody));
    ws.setattr(owner, attr.ino, &set_mtime).unwrap();
    ws.release(handle).unwrap();
    assert_eq!(ws.getattr(attr.ino).unwrap().mtime, 1_000_000_000);
}
