//! A small file opened for reading with nothing else holding it comes with its whole
//! content (computerd/src/kernel_pages.rs): reading it sends no READ, and so the next
//! `stat` of it sends no GETATTR. Filling the kernel's pages is the one thing the daemon
//! does to them that the kernel does not order itself: a change by any route while
//! readers keep opening the file is never followed by a read of the older content.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::versions::{self, never_older, version, version_of, ReadLoop};
use common::{served, Mount};

/// The opens of `--cached-opens` never reach the daemon, so nothing comes with them.
fn opens_reach_the_daemon() -> bool {
    !common::mounts_with("--cached-opens")
}

#[test]
fn small_files_read_twice_send_no_read_and_no_getattr() {
    if !opens_reach_the_daemon() {
        return;
    }
    let mut m = Mount::new();
    m.sh("mkdir d && for i in $(seq 1 50); do seq 1 $((i * 20)) > d/f$i; done");
    // Past the limit of what comes with an open: read through READs as before.
    m.sh("head -c 300000 /dev/urandom > big");
    m.unmount();
    m.mount(&["--op-stats"]);
    let first = m.sh("grep -rc 7 d | sort");
    let second = m.sh("grep -rc 7 d | sort");
    assert_eq!(first, second);
    assert_eq!(m.sh("wc -l < d/f50").trim(), "1000");
    assert_eq!(m.sh("cat big | wc -c").trim(), "300000");
    m.unmount();
    let log = m.daemon_log();
    // The big file's pages only.
    let reads = served(&log, "read");
    assert!((1..10).contains(&reads), "{reads} READs:\n{log}");
    assert!(served(&log, "getattr") < 10, "GETATTRs:\n{log}");
    m.check_db();
}

/// Replaces a file through `computerd fs write` (a new node renamed over the old one)
/// while a thread keeps opening and reading it through the mount: no open fails (the
/// kernel may still name the old node, which is gone: the daemon's ESTALE makes it look
/// the name up again), and after each command returns the mount shows what it wrote.
#[test]
fn a_file_replaced_by_a_command_while_read_in_a_loop_never_vanishes() {
    let m = Mount::new();
    m.fs_ok(&["write", "/v.txt"], &version(0));
    let path = m.path("v.txt");
    let reader = ReadLoop::start(&path, never_older);
    for v in 1..=40 {
        m.fs_ok(&["write", "/v.txt"], &version(v));
        assert_eq!(version_of(&std::fs::read(&path).unwrap()), Some(v));
    }
    reader.stop();
}

/// Rewrites a file in place through the shell backend ([`versions::rewrite_in_place`])
/// while a thread keeps opening and reading it through the mount, each open filling
/// the kernel's pages: after each command returns the mount shows what it wrote, and
/// the reader never goes back to an older version (pages filled with content read
/// before the change would show it).
#[test]
fn a_file_rewritten_in_place_while_read_in_a_loop_is_never_read_stale() {
    let m = Mount::new();
    m.fs_ok(&["write", "/v.txt"], &version(0));
    let path = m.path("v.txt");
    let inode = std::fs::metadata(&path).unwrap().ino();
    let reader = ReadLoop::start(&path, never_older);
    for v in 1..=40 {
        versions::rewrite_in_place(&m.db, "v.txt", v);
        assert_eq!(version_of(&std::fs::read(&path).unwrap()), Some(v));
    }
    reader.stop();
    assert_eq!(
        std::fs::metadata(&path).unwrap().ino(),
        inode,
        "not in place"
    );
}

/// Cuts a file by path (a SETATTR, after whose reply the kernel cuts its pages) while a
/// thread keeps opening and reading it: the size and content seen after each cut are
/// the cut's.
#[test]
fn a_file_cut_by_path_while_read_in_a_loop_shows_the_new_size() {
    let m = Mount::new();
    let path = m.path("cut.txt");
    let full: Vec<u8> = (0..100_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    // Written by the command, the file has no staging file: the mount's opens of it are
    // served through the page cache, and filled.
    m.fs_ok(&["write", "/cut.txt"], &full);
    let reader = ReadLoop::start(&path, |_, _| 0);
    for cut in 1..=40 {
        let size = full.len() - cut * 2_000;
        truncate_path(&path, size);
        let read = std::fs::read(&path).unwrap();
        assert_eq!(read.len(), size, "after the cut to {size}");
        assert!(read == full[..size], "content after the cut to {size}");
    }
    reader.stop();
}

/// `truncate(2)` of a path: no open handle of the caller's own.
fn truncate_path(path: &Path, size: usize) {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path that outlives the call.
    let rc = unsafe { libc::truncate(c_path.as_ptr(), size as libc::off_t) };
    assert_eq!(rc, 0, "truncate: {}", std::io::Error::last_os_error());
}
