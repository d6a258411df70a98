//! Memory stays bounded whatever the file size: a 4 GiB file is written and read back as
//! streams through the path API while the process's peak resident memory is watched.
//! (Its own test binary, so no other test shares the process.)

use std::io::{Read, Write};

use computer_vfs::*;

/// Peak resident memory of this process, from /proc.
fn peak_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .expect("VmHWM in /proc/self/status");
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// The bound this test holds the store to: its block cache (64 MiB), its write buffers
/// (128 MiB), SQLite's page caches and the test's own buffers fit well inside it.
const PEAK_RSS_MAX: u64 = 400 << 20;

#[test]
fn four_gib_file_streams_in_bounded_memory() {
    let size: u64 = if cfg!(debug_assertions) {
        256 << 20
    } else {
        4 << 30
    };
    let dir = tempfile::tempdir().unwrap();
    let ws = Workspace::open(dir.path().join("ws.db"), Options::default()).unwrap();
    let fs = ws.fs();

    // A pattern that changes every MiB, so blocks differ and dedup cannot hide the work.
    let mut piece = vec![0u8; 1 << 20];
    let mut writer = fs.create_write("/huge").unwrap();
    let mut written = 0u64;
    while written < size {
        let mark = (written >> 20).to_le_bytes();
        for (i, byte) in piece.iter_mut().enumerate().step_by(4096) {
            *byte = mark[i / 4096 % 8];
        }
        writer.write_all(&piece).unwrap();
        written += piece.len() as u64;
    }
    writer.finish().unwrap();
    assert_eq!(fs.stat("/huge").unwrap().size, size);

    let mut reader = fs.open_read("/huge").unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut read = 0u64;
    loop {
        let n = reader.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        let mark = (read >> 20).to_le_bytes();
        assert_eq!(buf[0], mark[0], "wrong byte at {read}");
        read += n as u64;
    }
    assert_eq!(read, size);
    let peak = peak_rss_bytes();
    eprintln!(
        "peak RSS {} MiB for a {} MiB file written and read",
        peak >> 20,
        size >> 20
    );
    assert!(
        peak < PEAK_RSS_MAX,
        "peak RSS {} MiB for a {} MiB file",
        peak >> 20,
        size >> 20
    );
}
