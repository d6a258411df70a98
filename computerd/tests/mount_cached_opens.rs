//! `--cached-opens`: the kernel opens files without asking the daemon and keeps their
//! pages; writes reach the store through writers the daemon holds (`fuse/unopened.rs`).
//! Nothing written is lost, nothing deleted is left behind, and files read again cost no
//! request. The other mount tests run over this configuration too (scripts/test.sh).

mod common;

use common::{served, Mount};

const CACHED_OPENS: &str = "--cached-opens";

#[test]
fn files_read_again_cost_no_request() {
    let mut m = Mount::with_args(&[CACHED_OPENS, "--op-stats"]);
    m.sh("mkdir d && for i in $(seq 1 50); do echo line $i > d/f$i; done");
    for _ in 0..5 {
        m.sh("grep -rq 'line 7$' d && cat d/* > /dev/null");
    }
    m.unmount();
    let log = m.daemon_log();
    // 500 opens of 50 files: only the first asks, and is told not to (ENOSYS).
    assert!(
        served(&log, "open") <= 1,
        "OPENs reached the daemon:\n{log}"
    );
    // The files created before that first OPEN are released (with handle 0), no other.
    assert!(served(&log, "release") <= 50, "RELEASEs of reads:\n{log}");
    // Each file's pages are read from the daemon once at most.
    assert!(served(&log, "read") <= 50, "READs past the first:\n{log}");
    m.check_db();
}

/// A file that existed before it was opened is written through the daemon's held
/// writer: an fsync'd change survives the daemon's death at once after the fsync.
#[test]
fn writes_to_existing_files_survive_kill_after_fsync() {
    let mut m = Mount::with_args(&[CACHED_OPENS]);
    m.py(r#"
import os
with open('big', 'wb') as f:
    f.write(bytes(range(256)) * 4096)
fd = os.open('big', os.O_RDWR)
os.pwrite(fd, b'CHANGED', 500000)
os.fsync(fd)
os.close(fd)
"#);
    m.kill_daemon();
    m.mount(&[CACHED_OPENS]);
    let mut expected: Vec<u8> = (0..1 << 20).map(|i| i as u8).collect();
    expected[500_000..500_007].copy_from_slice(b"CHANGED");
    let big = std::fs::read(m.path("big")).unwrap();
    assert!(big == expected, "big differs after the daemon was killed");
    m.unmount();
    m.check_db();
}

/// The kernel sends no RELEASE for a file it creates once it opens files without
/// asking; a daemon that kept a handle for each would keep every deleted file (and its
/// staging file) until unmount. `check` reports nodes left with no links.
#[test]
fn files_created_and_deleted_leave_nothing_behind() {
    let mut m = Mount::with_args(&[CACHED_OPENS]);
    // An open: from here on the kernel asks for none.
    m.sh("echo first > first && cat first > /dev/null");
    m.sh("mkdir t && for i in $(seq 1 300); do echo $i > t/f$i; done && cat t/f7 && rm -r t");
    m.sh("seq 1 1000 > kept && echo more >> kept && rm first");
    m.unmount();
    m.check_db();
    m.mount(&[CACHED_OPENS]);
    let kept = std::fs::read_to_string(m.path("kept")).unwrap();
    let expected: String = (1..=1000).map(|i| format!("{i}\n")).collect::<String>() + "more\n";
    assert_eq!(kept, expected);
    assert_eq!(common::list_dir(&m.mnt), ["kept"]);
}

/// A file deleted while a process holds it open stays readable and writable through
/// that descriptor, as on any filesystem, though no handle of the kernel's keeps it;
/// once the descriptor is closed it is gone (`check` finds no orphan after unmount).
#[test]
fn deleted_open_files_stay_usable_until_closed() {
    let mut m = Mount::with_args(&[CACHED_OPENS]);
    m.sh("echo old > replaced && cat replaced > /dev/null");
    let out = m.py(r#"
import os
fd = os.open('scratch', os.O_RDWR | os.O_CREAT, 0o600)
os.write(fd, b'x' * 100000)
os.unlink('scratch')
os.pwrite(fd, b'after unlink', 50000)
kept = os.open('replaced', os.O_RDONLY)
with open('new', 'w') as f:
    f.write('new\n')
os.rename('new', 'replaced')
print(os.pread(fd, 12, 50000).decode(), os.pread(kept, 100, 0).decode().strip(),
      open('replaced').read().strip(), os.fstat(fd).st_size)
os.close(fd)
os.close(kept)
"#);
    assert_eq!(out.trim(), "after unlink old new 100000");
    m.unmount();
    m.check_db();
}
