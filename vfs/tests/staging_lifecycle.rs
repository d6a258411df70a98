//! A workspace's last handle going waits for the staging worker's round under way: once
//! it is gone, no thread of that workspace is at work, and the caller may open the
//! database again (two instances at work on one staging directory would each take the
//! other's files for its own). One test in its own binary: it counts the process's
//! ingest threads.

mod common;

use std::os::unix::fs::FileExt;

use computer_vfs::{InodeNo, OpenFlags, Who};

const FILE_BYTES: usize = 64 << 20;

/// The threads of this process named as the staging worker names its thread.
fn ingest_threads() -> usize {
    let tasks = std::fs::read_dir("/proc/self/task").unwrap();
    (tasks.flatten())
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm"))
                .is_ok_and(|name| name.trim() == "vfs-ingest")
        })
        .count()
}

/// Whether `probe` holds within 10 s.
fn wait_for(probe: impl Fn() -> bool) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !probe() {
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    true
}

#[test]
fn the_last_handle_waits_for_the_workers_round() {
    let dir = tempfile::tempdir().unwrap();
    for round in 0..2 {
        let ws = common::staging_workspace(dir.path());
        // (A new thread takes its name a moment after it starts.)
        let named = wait_for(|| ingest_threads() == 1);
        assert!(named, "round {round}: one worker");
        let name = format!("big{round}");
        let ino = ws
            .fs()
            .write_file(&format!("/{name}"), b"")
            .map(|_| ())
            .and_then(|()| Ok(ws.lookup(Who::Trusted, InodeNo::ROOT, name.as_bytes())?.ino))
            .unwrap();
        let opened = ws
            .open_for_kernel(Who::Trusted, ino, OpenFlags::WRITE, true)
            .unwrap();
        let staged = opened.staged.clone().expect("staged");
        staged
            .file()
            .write_all_at(&common::random_bytes(FILE_BYTES, round), 0)
            .unwrap();
        ws.release(opened.handle).unwrap();
        // The worker takes a released file in a second after its release; taking in 64
        // MiB of random bytes lasts longer than the moment waited past that.
        std::thread::sleep(std::time::Duration::from_millis(1_100));
        drop(staged);
        drop(ws);
        assert_eq!(ingest_threads(), 0, "round {round}: a worker still at work");
    }
    let ws = common::staging_workspace(dir.path());
    assert_eq!(ws.fs().read_file("/big1").unwrap().len(), FILE_BYTES);
}
