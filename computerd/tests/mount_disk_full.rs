//! A mount whose disk fills up: the database and the staging files share a small tmpfs.
//! Writes past the end fail with ENOSPC, nothing answered before is lost, `rm` frees the
//! space, and the workspace then takes changes again and checks clean.
//!
//! Needs root (to mount the tmpfs), as every mount test here does.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::{Mount, SmallDisk};

#[test]
fn a_full_disk_says_enospc_and_loses_nothing() {
    let disk = SmallDisk::mount("160m");
    let source = tempfile::tempdir().unwrap();
    let twenty = source.path().join("twenty");
    std::fs::write(&twenty, common::pseudo_random(20 << 20)).unwrap();
    let mut m = Mount::with_args_in(disk.path(), &[]);

    // dd's complaint goes outside the full disk, where it can be written.
    let out = m.sh(&format!(
        "for i in $(seq 1 50); do echo $i > f$i; done
         echo victim > victim
         if dd if=/dev/urandom of=big bs=1M count=300 status=none 2> {err}; then
             echo 'dd: wrote 300 MiB to a 160 MiB disk'; exit 1
         fi
         cat {err}
         # Nor does a new file take its content (the create itself may get in before
         # the store notices the disk is full, as on ext4 an inode may: it stays empty).
         if echo x > refused 2> /dev/null; then echo 'refused: created'; fi
         # A deletion still commits, from the ballast: the disk has not a byte left.
         rm victim && sync -f .
         rm big",
        err = source.path().join("dd.err").display()
    ));
    assert!(out.contains("No space left on device"), "{out}");
    assert!(!out.contains("refused: created"), "{out}");

    // Room again. The kernel sends the release of dd's last handle without waiting for
    // it, so the daemon may take the unlink first and free the staging file's space a
    // moment later, at that release: wait for it, as a user would find it, then new
    // files go in, and an fsync makes them durable.
    wait_for_room(disk.path(), 40 << 20);
    m.sh(&format!(
        "echo after > after
         cp {} twenty && sync twenty && cmp {} twenty",
        twenty.display(),
        twenty.display()
    ));
    // The ballast gave up room for commits while the disk was full, and has it back.
    let mut ballast = m.db.as_os_str().to_owned();
    ballast.push("-reserve");
    let held = std::fs::metadata(&ballast).unwrap().blocks() * 512;
    assert!(held >= 64 << 20, "the ballast holds only {held} bytes");
    m.unmount();
    assert!(
        !Path::new(&ballast).exists(),
        "the ballast outlived the mount"
    );
    m.check_db();

    m.mount(&[]);
    let listing = m.sh("for i in $(seq 1 50); do cat f$i; done | sum; cat after
         if [ -s refused ]; then echo 'refused has content'; fi; rm -f refused; ls");
    let expected = common::sh(
        source.path(),
        "for i in $(seq 1 50); do echo $i; done | sum",
    );
    assert!(listing.starts_with(&expected), "{listing}");
    assert!(listing.contains("after\n"), "{listing}");
    assert!(!listing.contains("big"), "{listing}");
    assert!(!listing.contains("refused"), "{listing}");
    assert!(!listing.contains("victim"), "{listing}");
    m.sh(&format!("cmp {} twenty", twenty.display()));
    m.unmount();
    m.check_db();
}

/// Waits until the file system at `path` has `bytes` free, at most 10 s.
fn wait_for_room(path: &Path, bytes: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let stat = nix::sys::statvfs::statvfs(path).unwrap();
        let free = stat.blocks_available() as u64 * stat.fragment_size() as u64;
        if free >= bytes {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{}: {free} bytes free 10 s after the rm, {bytes} wanted",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Under `--cached-opens` the kernel sends no FLUSH, so no close could report a failed
/// commit: a write the daemon buffers (a set-id file is kept off the staging files),
/// answered while there was room, must still commit when the disk fills before the
/// daemon lets go of the file a second later (from the room held for commits).
#[test]
fn a_full_disk_drops_no_write_of_a_file_opened_without_asking() {
    let disk = SmallDisk::mount("160m");
    let mut m = Mount::with_args_in(disk.path(), &["--cached-opens"]);
    m.sh("echo s > s && chmod 4644 s");
    m.py("import os
fd = os.open('s', os.O_WRONLY)
assert os.write(fd, b'N' * 100000) == 100000
os.close(fd)");
    // Filled beside the mount before the daemon commits the write, a second later.
    let filler = disk.path().join("filler");
    common::sh(
        disk.path(),
        &format!(
            "dd if=/dev/zero of={} bs=1M count=300 status=none 2> /dev/null || true",
            filler.display()
        ),
    );
    std::thread::sleep(std::time::Duration::from_secs(3));
    std::fs::remove_file(&filler).unwrap();
    std::thread::sleep(std::time::Duration::from_secs(3));
    m.unmount();
    m.check_db();
    m.mount(&["--cached-opens"]);
    let stored = std::fs::read(m.path("s")).unwrap();
    assert!(
        stored == vec![b'N'; 100000],
        "an answered write was dropped: {:?}",
        &stored[..stored.len().min(16)]
    );
    m.unmount();
}
