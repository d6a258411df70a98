//! A staging file handed to the kernel for passthrough may be mapped by a process,
//! shared and writable, and written through that mapping after the file's last release:
//! no request tells the store. Here a mapping of this process, made through an open of
//! its own (as the kernel's passthrough open is), stands for one.

mod common;

use std::os::fd::AsRawFd;

use computer_vfs::{InodeNo, OpenFlags, Options, Who, Workspace};

const FILE_BYTES: usize = 64 << 10;

/// The content the store holds for `/name` (the staging files left aside: a read-only
/// open does not ingest them).
fn stored(dir: &std::path::Path, name: &str) -> Vec<u8> {
    let options = Options {
        read_only: true,
        ..Options::default()
    };
    let ws = Workspace::open(dir.join("ws.db"), options).unwrap();
    ws.fs().read_file(name).unwrap()
}

/// A staging workspace in `dir` holding `/m` (`FILE_BYTES` of `a`), opened as the mount
/// opens it for a process that reads and writes (staged, for passthrough), and a shared
/// writable mapping of its staging file.
fn mapped_through_a_writer(dir: &std::path::Path) -> (Workspace, computer_vfs::Opened, Mapping) {
    let ws = common::staging_workspace(dir);
    ws.fs().write_file("/m", vec![b'a'; FILE_BYTES]).unwrap();
    let ino = ws.lookup(Who::Trusted, InodeNo::ROOT, b"m").unwrap().ino;
    let read_write = OpenFlags {
        read: true,
        ..OpenFlags::WRITE
    };
    let opened = (ws.open_for_kernel(Who::Trusted, ino, read_write, true)).unwrap();
    let staged = opened.staged.as_ref().expect("staged for passthrough");
    let mapping = Mapping::of(staged.file(), FILE_BYTES);
    (ws, opened, mapping)
}

#[test]
fn writes_through_a_mapping_after_the_last_release_reach_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let (ws, opened, mapping) = mapped_through_a_writer(dir.path());
    ws.release(opened.handle).unwrap();
    // What the store takes at the release: the file as it was.
    ws.sync().unwrap();
    mapping.write(0, b"AFTER-RELEASE");
    // Still mapped: the mapping counts as a writer; nothing is lost by settling now.
    ws.sync().unwrap();
    drop(mapping);
    ws.sync().unwrap();
    let mut expected = vec![b'a'; FILE_BYTES];
    expected[..13].copy_from_slice(b"AFTER-RELEASE");
    assert!(
        stored(dir.path(), "/m") == expected,
        "the mapping's write is stored"
    );
}

/// The writer that made the mapping is released while a reader still has the file open
/// (the store may take the file in meanwhile); the mapping is written after both.
#[test]
fn a_mapping_outlives_its_writer_while_a_reader_stays() {
    let dir = tempfile::tempdir().unwrap();
    let (ws, writer, mapping) = mapped_through_a_writer(dir.path());
    let ino = ws.lookup(Who::Trusted, InodeNo::ROOT, b"m").unwrap().ino;
    let reader = (ws.open_for_kernel(Who::Trusted, ino, OpenFlags::READ, true)).unwrap();
    ws.release(writer.handle).unwrap();
    ws.sync().unwrap();
    mapping.write(FILE_BYTES - 5, b"LATE!");
    ws.release(reader.handle).unwrap();
    ws.sync().unwrap();
    drop(mapping);
    ws.sync().unwrap();
    let mut expected = vec![b'a'; FILE_BYTES];
    expected[FILE_BYTES - 5..].copy_from_slice(b"LATE!");
    assert!(
        stored(dir.path(), "/m") == expected,
        "the mapping's write is stored"
    );
}

/// A shared, writable mapping of `file` through an open of its own (the descriptor
/// closed at once, as a process may), unmapped when dropped.
struct Mapping {
    addr: *mut libc::c_void,
    size: usize,
}

impl Mapping {
    fn of(file: &std::fs::File, size: usize) -> Mapping {
        let own = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
            .unwrap();
        // SAFETY: a shared mapping of `size` bytes of a file at least that long,
        // unmapped on drop.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                own.as_raw_fd(),
                0,
            )
        };
        assert_ne!(
            addr,
            libc::MAP_FAILED,
            "{}",
            std::io::Error::last_os_error()
        );
        Mapping { addr, size }
    }

    fn write(&self, offset: usize, data: &[u8]) {
        assert!(offset + data.len() <= self.size);
        // SAFETY: within the mapping, which lives as long as `self`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.addr.cast::<u8>().add(offset),
                data.len(),
            )
        };
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `Mapping::of`, unmapped once.
        unsafe { libc::munmap(self.addr, self.size) };
    }
}
