//! What the store promises from outside: dedup you can see in `stats`, quotas that refuse
//! without damage, and readers and writers on several threads without SQLITE_BUSY.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::random_bytes;

use computer_vfs::*;

fn workspace() -> (tempfile::TempDir, Workspace) {
    let dir = tempfile::tempdir().unwrap();
    let ws = Workspace::open(dir.path().join("ws.db"), Options::default()).unwrap();
    (dir, ws)
}

const MIB: u64 = 1 << 20;

#[test]
fn same_content_at_ten_paths_is_stored_once() {
    let (_dir, ws) = workspace();
    let fs = ws.fs();
    let size = if cfg!(debug_assertions) {
        8 * MIB
    } else {
        64 * MIB
    };
    let data = random_bytes(size as usize, 1);
    for i in 0..10 {
        fs.write_file(&format!("/copy{i}"), &data).unwrap();
    }
    let stats = ws.stats().unwrap();
    assert_eq!(stats.logical_bytes, 10 * size);
    // Random data does not compress: one copy's worth, plus a little framing.
    assert!(
        stats.stored_bytes <= size + size / 50,
        "{} stored for {size}",
        stats.stored_bytes
    );
    assert!(
        stats.stored_bytes >= size,
        "{} stored for {size}",
        stats.stored_bytes
    );

    // One byte changed in the middle of one copy adds about one block.
    let before = ws.stats().unwrap().stored_bytes;
    let middle = size / 2;
    fs.write_at("/copy3", middle, [data[middle as usize] ^ 0x5a])
        .unwrap();
    let added = ws.stats().unwrap().stored_bytes - before;
    let block_max = ws.chunk_sizes().max as u64;
    assert!(
        added > 0 && added <= 2 * block_max,
        "{added} bytes added by a one-byte change"
    );
    assert!(ws.check().unwrap().is_ok());
}

#[test]
fn byte_quota_refuses_without_damage() {
    let (_dir, ws) = workspace();
    let fs = ws.fs();
    let kept = random_bytes(256 << 10, 2);
    fs.write_file("/kept", &kept).unwrap();
    let used = ws.stats().unwrap().stored_bytes;
    ws.set_quota(Quota {
        bytes_max: Some(used + (512 << 10)),
        inodes_max: None,
    })
    .unwrap();

    let too_big = random_bytes(1 << 20, 3);
    let err = fs.write_file("/big", &too_big).unwrap_err();
    assert_eq!(err.errno(), libc::ENOSPC, "{err}");
    assert!(
        !fs.exists("/big").unwrap(),
        "a refused write left a file behind"
    );
    // Overwriting what exists past the quota fails too, and keeps the old bytes.
    let err = fs.write_file("/kept", &too_big).unwrap_err();
    assert_eq!(err.errno(), libc::ENOSPC);
    assert_eq!(fs.read_file("/kept").unwrap(), kept);
    // Deleting always works, and makes room.
    fs.rm("/kept", RmOptions::default()).unwrap();
    fs.write_file("/fits", &too_big[..700 << 10]).unwrap();
    assert!(ws.check().unwrap().is_ok());
}

#[test]
fn inode_quota_refuses_new_nodes() {
    let (_dir, ws) = workspace();
    let fs = ws.fs();
    ws.set_quota(Quota {
        bytes_max: None,
        inodes_max: Some(4),
    })
    .unwrap();
    fs.mkdir("/a", MkdirOptions::default()).unwrap();
    fs.write_file("/a/1", "1").unwrap();
    fs.write_file("/a/2", "2").unwrap();
    let err = fs.write_file("/a/3", "3").unwrap_err();
    assert_eq!(err.errno(), libc::ENOSPC);
    assert_eq!(fs.readdir("/a").unwrap().len(), 2);
    let statfs = ws.statfs().unwrap();
    assert_eq!((statfs.inodes_total, statfs.inodes_free), (4, 0));
    fs.unlink("/a/2").unwrap();
    fs.write_file("/a/3", "3").unwrap();
    assert!(ws.check().unwrap().is_ok());
}

/// Readers and writers on several threads for a while: no error but the expected
/// ENOENT of a reader racing a delete, in particular no SQLITE_BUSY.
#[test]
fn readers_and_writers_share_the_workspace() {
    let (_dir, ws) = workspace();
    let fs = ws.fs();
    fs.mkdir("/shared", MkdirOptions::default()).unwrap();
    for i in 0..20 {
        fs.write_file(&format!("/shared/f{i}"), format!("initial {i}"))
            .unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for writer in 0..2u64 {
        let (fs, stop) = (fs.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let i = (n * 7 + writer) % 20;
                let path = format!("/shared/f{i}");
                let tmp = format!("/shared/tmp-{writer}");
                fs.write_file(&tmp, random_bytes(1000 + (n as usize % 5000), n))
                    .unwrap();
                fs.rename(&tmp, &path).unwrap();
                fs.append(&path, b"+").unwrap();
                n += 1;
            }
            n
        }));
    }
    for _reader in 0..4 {
        let (fs, stop) = (fs.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for entry in fs.readdir("/shared").unwrap() {
                    let path = format!("/shared/{}", entry.name_lossy());
                    match fs.read_file(&path) {
                        Ok(_) => {}
                        Err(err) if err.errno() == libc::ENOENT => {}
                        Err(err) => panic!("reading {path}: {err}"),
                    }
                    n += 1;
                }
            }
            n
        }));
    }
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    let counts: Vec<u64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(
        counts.iter().all(|&n| n > 0),
        "a thread made no progress: {counts:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    let report = ws.check().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
}
