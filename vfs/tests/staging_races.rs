//! Routes that change a file while the mount stages it for a writer: the staging file
//! is filled from the store, and a change made behind the fill must not be undone by
//! it (the writer's handle, then ingestion, would put the old content back).

mod common;

use computer_vfs::{InodeNo, OpenFlags, Options, Who, Workspace};
use std::os::unix::fs::FileExt;

/// Large enough that filling the staging file takes a few milliseconds here.
const FILE_BYTES: usize = 8 << 20;
/// Rounds, each with the other route's change at another moment of the fill.
const ROUNDS: u64 = 24;

/// Opens `/name` for writing as the mount does (staged where it can be) and writes
/// `X` at offset 0 through the handle, while `change` runs on another thread after
/// `delay`.
fn open_and_write_during(
    ws: &Workspace,
    name: &str,
    delay: std::time::Duration,
    change: impl FnOnce() + Send,
) {
    let ino = ws
        .lookup(Who::Trusted, InodeNo::ROOT, name.as_bytes())
        .unwrap()
        .ino;
    let start = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        s.spawn(|| {
            start.wait();
            std::thread::sleep(delay);
            change();
        });
        start.wait();
        let opened = ws
            .open_for_kernel(Who::Trusted, ino, OpenFlags::WRITE, true)
            .unwrap();
        match &opened.staged {
            // The kernel writes to the staging file itself.
            Some(staged) => staged.file().write_all_at(b"X", 0).unwrap(),
            None => assert_eq!(ws.write(opened.handle, 0, b"X").unwrap(), 1),
        }
        ws.release(opened.handle).unwrap();
    });
}

/// `bytes` past its first, which the writer's `X` may or may not have replaced.
fn tail(bytes: &[u8]) -> &[u8] {
    &bytes[1..]
}

/// Runs the rounds on `ws`, each on a file of its own: `prepare(path)` makes it, an open
/// for writing then races `change(path)` at a later moment of the fill each round, and
/// `check(round, content)` judges what the file holds after.
fn race_each_round(
    ws: &Workspace,
    prepare: impl Fn(&str),
    change: impl Fn(&str) + Sync,
    check: impl Fn(u64, &[u8]),
) {
    for round in 0..ROUNDS {
        let name = format!("f{round}");
        let path = format!("/{name}");
        prepare(&path);
        let delay = std::time::Duration::from_micros(round * 500);
        open_and_write_during(ws, &name, delay, || change(&path));
        check(round, &ws.fs().read_file(&path).unwrap());
    }
}

#[test]
fn a_file_replaced_while_it_is_being_staged_keeps_the_new_content() {
    let dir = tempfile::tempdir().unwrap();
    let ws = common::staging_workspace(dir.path());
    let old = common::random_bytes(FILE_BYTES, 1);
    let new = common::random_bytes(FILE_BYTES, 2);
    race_each_round(
        &ws,
        |path| ws.fs().write_file(path, &old).unwrap(),
        |path| ws.fs().write_file(path, &new).unwrap(),
        |round, now| {
            assert!(
                tail(now) == tail(&new),
                "round {round}: the replacement was undone by the fill"
            );
        },
    );
}

#[test]
fn a_file_truncated_while_it_is_being_staged_stays_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let ws = common::staging_workspace(dir.path());
    let old = common::random_bytes(FILE_BYTES, 3);
    race_each_round(
        &ws,
        |path| ws.fs().write_file(path, &old).unwrap(),
        |path| ws.fs().truncate(path, 1).unwrap(),
        // Truncated after the writer's X, or before it (then only X is left).
        |round, now| assert_eq!(now.len(), 1, "round {round}: the truncation was undone"),
    );
}

#[test]
fn a_file_a_pull_replaces_while_it_is_being_staged_keeps_the_pulled_content() {
    let dir = tempfile::tempdir().unwrap();
    let server = Workspace::open(dir.path().join("server.db"), Options::default()).unwrap();
    let replica = common::staging_workspace(dir.path());
    server.register_peer("r1", "replica-1").unwrap();
    replica.register_peer("upstream", server.id()).unwrap();
    let old = common::random_bytes(FILE_BYTES, 4);
    let new = common::random_bytes(FILE_BYTES, 5);
    race_each_round(
        &replica,
        |path| {
            server.fs().write_file(path, &old).unwrap();
            common::pull(&server, &replica, "r1", "replica-1");
            server.fs().write_file(path, &new).unwrap();
        },
        |_| {
            common::pull(&server, &replica, "r1", "replica-1");
        },
        // Pulled after the writer's X, or before it; or, if the writer had the file
        // first, the server's version stays at the path and the replica's goes beside
        // it as a conflict copy.
        |round, now| {
            assert!(
                tail(now) == tail(&new),
                "round {round}: the pulled content was undone by the fill"
            );
        },
    );
}
