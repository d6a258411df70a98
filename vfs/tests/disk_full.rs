//! A disk that fills up under a batch of mutations (`Options::commit_delay`, as
//! `computerd mount` opens a workspace). SQLite answers a full disk inside a transaction
//! by rolling back the whole transaction, not only the failing statement, so a batch's
//! earlier mutations, already answered, could vanish with it. They must not: either they
//! are committed, or the workspace refuses further changes instead of going on as if
//! they were there.
//!
//! The database lives on a small tmpfs, which needs root (`common::has_root`).

use computer_vfs::Who;
use std::ffi::CString;
use std::path::Path;
use std::time::Duration;

use computer_vfs::{InodeNo, NewNode, OpenFlags, Options, Workspace};

mod common;
use common::random_bytes;

/// True (and says the test is skipped) unless root, who alone can mount a tmpfs;
/// see `common::has_root`.
fn lacks_root() -> bool {
    !common::has_root("disk_full", "it mounts a small tmpfs to fill")
}

/// A tmpfs of `bytes` mounted on a fresh directory; unmounted on drop, failed test or not.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(bytes: u64) -> SmallDisk {
        let disk = SmallDisk {
            dir: tempfile::tempdir().unwrap(),
        };
        disk.mount_tmpfs(bytes, 0);
        disk
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Makes the disk `bytes` large (a remount keeps its files).
    fn grow(&self, bytes: u64) {
        self.mount_tmpfs(bytes, libc::MS_REMOUNT);
    }

    fn mount_tmpfs(&self, bytes: u64, flags: libc::c_ulong) {
        let target = CString::new(self.dir.path().as_os_str().as_encoded_bytes()).unwrap();
        let options = CString::new(format!("size={bytes}")).unwrap();
        // SAFETY: valid NUL-terminated strings that outlive the call.
        let rc = unsafe {
            libc::mount(
                c"tmpfs".as_ptr(),
                target.as_ptr(),
                c"tmpfs".as_ptr(),
                flags,
                options.as_ptr().cast(),
            )
        };
        assert_eq!(rc, 0, "mount tmpfs: {}", std::io::Error::last_os_error());
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let target = CString::new(self.dir.path().as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path. MNT_DETACH: a workspace still open in a
        // failing test must not keep the mount.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}

fn open(db: &Path, disk_reserve_bytes: u64) -> Workspace {
    Workspace::open(
        db,
        Options {
            create: true,
            // Long enough that no batch commits on its own during the test: only the
            // batch bounds and the failure decide.
            commit_delay: Some(Duration::from_secs(3600)),
            disk_reserve_bytes,
            ..Options::default()
        },
    )
    .unwrap()
}

/// Makes directory `small-i` and then writes the `i`th MiB of `data` into the open file
/// `fh`, for every MiB, until something fails: answered mutations of every kind end up
/// in every batch, the last one included. Returns the directories answered and the
/// first error.
fn fill(ws: &Workspace, data: &[u8]) -> (Vec<(String, InodeNo)>, computer_vfs::Error) {
    let (_, fh) = ws
        .create(
            Who::Trusted,
            InodeNo::ROOT,
            b"big",
            NewNode::new(0o644),
            OpenFlags::from_libc(libc::O_WRONLY),
        )
        .unwrap();
    let mut made = Vec::new();
    let mut failed = None;
    for (i, piece) in data.chunks(1 << 20).enumerate() {
        let name = format!("small-{i}");
        match ws.mkdir(
            Who::Trusted,
            InodeNo::ROOT,
            name.as_bytes(),
            NewNode::new(0o755),
        ) {
            Ok(attr) => made.push((name, attr.ino)),
            Err(err) => {
                failed = Some(err);
                break;
            }
        }
        // The write buffer stores a file's writes in pieces of its own; flushing each
        // MiB makes each a mutation of its own here.
        if let Err(err) = ws
            .write(fh, (i << 20) as u64, piece)
            .and_then(|_| ws.flush(fh))
        {
            failed = Some(err);
            break;
        }
    }
    let released = ws.release(fh);
    let err = failed
        .or(released.err())
        .expect("the data cannot fit on the disk");
    (made, err)
}

fn assert_clean(ws: &Workspace) {
    let report = ws.check().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

#[test]
fn the_reserve_turns_a_full_disk_into_enospc_and_loses_nothing() {
    if lacks_root() {
        return;
    }
    let disk = SmallDisk::mount(12 << 20);
    let db = disk.path().join("ws.db");
    let ws = open(&db, 1 << 20);
    let (made, err) = fill(&ws, &random_bytes(40 << 20, 7));
    assert_eq!(err.errno(), libc::ENOSPC, "{err}");
    assert!(
        err.to_string().contains("reserve"),
        "the reserve, not SQLite, should refuse: {err}"
    );
    assert!(made.len() >= 2, "only {} directories fitted", made.len());

    // Every answered directory is there, the workspace goes on taking changes that free
    // space (and small ones, inside the reserve's estimate), and all of it is durable.
    for (name, ino) in &made {
        assert_eq!(
            ws.lookup(Who::Trusted, InodeNo::ROOT, name.as_bytes())
                .unwrap()
                .ino,
            *ino
        );
    }
    ws.unlink(Who::Trusted, InodeNo::ROOT, b"big").unwrap();
    ws.rmdir(Who::Trusted, InodeNo::ROOT, made[0].0.as_bytes())
        .unwrap();
    ws.sync().unwrap();
    assert_clean(&ws);
    drop(ws);

    let ws = open(&db, 1 << 20);
    assert!(ws
        .lookup(Who::Trusted, InodeNo::ROOT, made[0].0.as_bytes())
        .is_err());
    for (name, ino) in &made[1..] {
        assert_eq!(
            ws.lookup(Who::Trusted, InodeNo::ROOT, name.as_bytes())
                .unwrap()
                .ino,
            *ino
        );
    }
    assert_clean(&ws);
}

#[test]
fn without_the_reserve_a_lost_batch_halts_the_workspace() {
    if lacks_root() {
        return;
    }
    let disk = SmallDisk::mount(12 << 20);
    let db = disk.path().join("ws.db");
    let ws = open(&db, 0);
    let (made, err) = fill(&ws, &random_bytes(40 << 20, 8));
    // SQLite itself found the disk full, and the batch it rolled back held answered
    // mutations (a directory and a MiB each): the workspace must not go on from there.
    assert_eq!(err.errno(), libc::ENOSPC, "{err}");
    let refused = ws
        .mkdir(Who::Trusted, InodeNo::ROOT, b"after", NewNode::new(0o755))
        .unwrap_err();
    assert_eq!(refused.errno(), libc::EIO, "{refused}");
    assert!(
        matches!(refused, computer_vfs::Error::Halted { .. }),
        "{refused}"
    );
    let why = ws.halted().expect("halted() says why");
    assert!(why.contains("undid"), "{why}");
    // Reads still answer, from what was committed.
    ws.getattr(InodeNo::ROOT).unwrap();
    drop(ws);

    // Reopened, the workspace is whole (without the lost batch) and takes changes again.
    let ws = open(&db, 0);
    assert_clean(&ws);
    assert_eq!(ws.halted(), None);
    let kept = made
        .iter()
        .filter(|(name, _)| {
            ws.lookup(Who::Trusted, InodeNo::ROOT, name.as_bytes())
                .is_ok()
        })
        .count();
    assert!(kept < made.len(), "nothing was lost, so nothing was tested");
    ws.unlink(Who::Trusted, InodeNo::ROOT, b"big").ok();
    ws.mkdir(Who::Trusted, InodeNo::ROOT, b"after", NewNode::new(0o755))
        .unwrap();
}

/// xorshift64: the test's only randomness, from its seed.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Random whole-file writes, deletions and syncs on small disks until they fill, for
/// several seeds and sizes, with and without the reserve. Whatever fails: either every
/// answered change is there after a reopen, exactly, or the workspace halted and says
/// so; with the reserve it never halts.
#[test]
fn answered_changes_survive_random_work_on_full_disks() {
    if lacks_root() {
        return;
    }
    let mut halts = 0;
    let mut refusals = 0;
    for seed in 1..=8u64 {
        for reserve in [0u64, 1 << 20] {
            let disk = SmallDisk::mount((8 + (seed % 4) * 8) << 20);
            let db = disk.path().join("ws.db");
            let ws = open(&db, reserve);
            let fs = ws.fs();
            let mut model = std::collections::BTreeMap::<String, Vec<u8>>::new();
            let mut rng = seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1;
            for _ in 0..300 {
                let name = format!("/f{}", next(&mut rng) % 48);
                match next(&mut rng) % 10 {
                    0..=5 => {
                        let len = (next(&mut rng) % (1 << 20)) as usize;
                        let data = random_bytes(len, next(&mut rng));
                        // One mutation: it happened entirely or not at all.
                        match fs.write_file(&name, &data) {
                            Ok(()) => {
                                model.insert(name, data);
                            }
                            Err(err) => {
                                assert_eq!(err.errno(), libc::ENOSPC, "{name}: {err}");
                                refusals += 1;
                            }
                        }
                    }
                    6..=8 => {
                        if fs.unlink(&name).is_ok() {
                            model.remove(&name);
                        }
                    }
                    _ => {
                        let _ = ws.sync();
                    }
                }
                if ws.halted().is_some() {
                    break;
                }
            }
            let halted = ws.halted();
            assert!(
                reserve == 0 || halted.is_none(),
                "seed {seed}: halted with a reserve: {halted:?}"
            );
            let _ = ws.sync();
            drop(fs);
            drop(ws);

            // Without a reserve the disk may be too full even to open the database
            // (SQLite's shared-memory file must grow): room is made first, as an
            // administrator would.
            if reserve == 0 {
                disk.grow(64 << 20);
            }
            let ws = open(&db, reserve);
            assert_clean(&ws);
            if halted.is_some() {
                halts += 1;
                continue;
            }
            let fs = ws.fs();
            let mut names: Vec<String> = fs
                .readdir("/")
                .unwrap()
                .into_iter()
                .map(|e| format!("/{}", String::from_utf8(e.name).unwrap()))
                .collect();
            names.sort();
            let expected: Vec<String> = model.keys().cloned().collect();
            assert_eq!(names, expected, "seed {seed}, reserve {reserve}");
            for (name, data) in &model {
                assert!(
                    fs.read_file(name).unwrap() == *data,
                    "seed {seed}: {name} differs"
                );
            }
        }
    }
    eprintln!("disk_full: {refusals} writes refused, {halts} halts without a reserve");
    assert!(refusals > 0, "no disk ever filled: nothing was tested");
}
