//! The daemon never holds a whole file in memory: a 4 GiB file written through the mount
//! (and fsynced, so it is ingested into the store before we look) leaves the daemon's
//! peak resident memory under a fixed bound, with passthrough and without it.

mod common;

use common::Mount;

/// Peak resident memory of a process, from /proc.
fn peak_rss_bytes(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .expect("VmHWM");
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// The bound stated in docs/SEMANTICS.md: block cache (64 MiB), write buffers
/// (128 MiB), SQLite page caches, the FUSE threads' 16 MiB receive buffers.
const DAEMON_PEAK_RSS_MAX: u64 = 400 << 20;

fn write_big_file(args: &[&str], mib: u64) {
    let mut m = Mount::with_args(args);
    // Every MiB differs (dd of zeros would dedup to one block): a counter stamped into
    // each 1 MiB piece by a small generator, streamed into dd.
    let script = format!(
        "python3 -c '
import sys
piece = bytearray(1 << 20)
out = sys.stdout.buffer
for i in range({mib}):
    piece[0:8] = i.to_bytes(8, \"little\")
    piece[4096:4104] = i.to_bytes(8, \"little\")
    out.write(piece)
' | dd of=big bs=1M iflag=fullblock conv=fsync status=none && stat -c %s big && md5sum < big"
    );
    let out = m.sh(&script);
    let size: u64 = out.lines().next().unwrap().trim().parse().unwrap();
    assert_eq!(size, mib << 20);
    let peak = peak_rss_bytes(m.pid());
    eprintln!(
        "daemon peak RSS {} MiB after writing {mib} MiB ({args:?})",
        peak >> 20
    );
    assert!(
        peak < DAEMON_PEAK_RSS_MAX,
        "daemon peak RSS {} MiB after writing {mib} MiB ({args:?})",
        peak >> 20
    );
    m.unmount();
    m.check_db();
}

#[test]
fn four_gib_through_passthrough_keeps_the_daemon_small() {
    write_big_file(&[], if cfg!(debug_assertions) { 512 } else { 4096 });
}

#[test]
fn one_gib_through_the_daemon_keeps_it_small() {
    // Without passthrough every byte goes through the daemon's write buffer.
    write_big_file(
        &["--no-passthrough"],
        if cfg!(debug_assertions) { 256 } else { 1024 },
    );
}
