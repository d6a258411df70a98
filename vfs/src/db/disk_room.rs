//! Room on the disk that holds the database, so a batch of answered mutations can
//! always be committed.
//!
//! SQLite meets a full disk inside a transaction by rolling back the whole transaction,
//! not just the failing statement, and at COMMIT it cannot do otherwise. With batched
//! commits that transaction holds mutations already answered, so running out of disk
//! would undo them. Two things keep that from happening:
//! - **A ballast file**, `<db>-reserve`, holds `reserve` bytes of the disk. Staging files
//!   are written by the kernel directly (passthrough) and can take a disk to its last
//!   byte; the ballast keeps that last part for the database. Before a commit finds too
//!   little free space, the ballast gives up what the commit needs; once space is freed
//!   again it grows back.
//! - **Growth stops first.** A mutation that stores data fails with ENOSPC when the free
//!   space, less the ballast's missing part and what the open batch will write at
//!   COMMIT, would not cover it. Mutations that only free space (unlink, rmdir,
//!   truncate) always run, so space can be freed.
//!
//! The free space is asked of the kernel (`statvfs`) at most every `RECHECK` for the
//! growth check, and before every commit. Only a batched writer needs any of this: a
//! mutation committed on its own loses only itself to a full disk.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a reading of the free space is trusted by the growth check.
const RECHECK: Duration = Duration::from_millis(50);

/// What a mutation is assumed to write besides its block data (pages of the node,
/// entry and index rows it touches), when estimating what a batch will commit.
pub(crate) const METADATA_BYTES_PER_MUTATION: u64 = 4096;

/// Under this much room, every growth check reads the free space anew, and the writer
/// waits for space being freed (`Db::wait_for_room`).
const SHORT_BYTES: u64 = 8 << 20;

/// Room a commit wants beyond its estimate: WAL frame headers, the index pages its
/// estimate misses, the `-shm` file growing.
const COMMIT_SLACK_BYTES: u64 = 1 << 20;

pub(crate) struct DiskRoom {
    /// The database file: what `statvfs` asks about.
    db: PathBuf,
    ballast_path: PathBuf,
    /// `None` if the ballast could not be made (the disk has no room even for it, or
    /// does not support allocation); the growth check still runs.
    ballast: Option<File>,
    /// Bytes the ballast holds now, and should hold.
    ballast_len: u64,
    reserve: u64,
    /// Free bytes (as `f_bavail`) at the last reading, less what was committed since.
    free: u64,
    checked_at: Option<Instant>,
    /// Whether the ballast had to give way: said once in the log, until it is whole.
    drawing_on_reserve: bool,
}

impl DiskRoom {
    /// Holds `reserve` bytes of the disk under `db` in its ballast file.
    pub(crate) fn new(db: &Path, reserve: u64) -> DiskRoom {
        let ballast_path = super::sibling(db, "-reserve");
        let ballast = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&ballast_path)
            .map_err(|err| tracing::warn!("{}: {err}", ballast_path.display()))
            .ok();
        let mut room = DiskRoom {
            db: db.to_path_buf(),
            ballast_path,
            ballast,
            ballast_len: 0,
            reserve,
            free: 0,
            checked_at: None,
            drawing_on_reserve: false,
        };
        room.refill_ballast();
        room
    }

    /// Bytes the open batch may still grow by, given that it already holds `pending`
    /// uncommitted bytes.
    pub(crate) fn allowance(&mut self, pending: u64) -> u64 {
        let stale = self.checked_at.is_none_or(|at| at.elapsed() >= RECHECK);
        if stale && !self.read_free() {
            // Unknown room is no reason to refuse writes: SQLite reports a full disk
            // itself, and the halt keeps that from losing anything silently.
            return u64::MAX;
        }
        let allowance = self.room_beyond(pending);
        // Short of room on an old reading: space may have been freed since.
        if allowance < SHORT_BYTES && !stale && self.read_free() {
            return self.room_beyond(pending);
        }
        allowance
    }

    /// Whether the disk is nearly down to the reserve: time to free what can be freed.
    pub(crate) fn is_short(&mut self, pending: u64) -> bool {
        self.allowance(pending) < SHORT_BYTES
    }

    fn room_beyond(&self, pending: u64) -> u64 {
        self.free
            .saturating_sub(self.reserve - self.ballast_len)
            .saturating_sub(pending)
            .saturating_sub(COMMIT_SLACK_BYTES)
    }

    /// A batch of about `pending` bytes is about to commit: makes sure the disk has room
    /// for it, from the ballast if need be.
    pub(crate) fn before_commit(&mut self, pending: u64) {
        if !self.read_free() {
            return;
        }
        let wanted = pending.saturating_add(COMMIT_SLACK_BYTES);
        if self.free >= wanted || self.ballast_len == 0 {
            return;
        }
        let give = (wanted - self.free).min(self.ballast_len);
        if !self.drawing_on_reserve {
            self.drawing_on_reserve = true;
            tracing::warn!(
                "the disk holding the workspace is full: committing from its reserve ({})",
                self.ballast_path.display()
            );
        }
        self.set_ballast(self.ballast_len - give);
        self.read_free();
    }

    /// A batch of about `bytes` committed: they are on the disk now. Grows the ballast
    /// back as far as the disk has room again: as long as it is short, kernel writes
    /// into staging files could take the room the next commit needs.
    pub(crate) fn committed(&mut self, bytes: u64) {
        self.free = self.free.saturating_sub(bytes);
        if self.ballast_len < self.reserve && self.free > 2 * COMMIT_SLACK_BYTES {
            self.refill_ballast();
        }
    }

    /// Whether the writer should checkpoint now, the database being `logical_bytes`
    /// large as of the last commit: the disk has little room (under 128 MiB for the WAL
    /// and what is free), the WAL has outgrown a quarter of it
    /// (`db::checkpoint_threshold`, which the background checkpointer looks at only
    /// every 200 ms), and the database file can grow to that size (a checkpoint writes
    /// the pages past its end) without touching the reserve. Past that, a checkpoint
    /// would only fill the disk.
    pub(crate) fn wants_checkpoint(&mut self, logical_bytes: impl FnOnce() -> u64) -> bool {
        let Ok(wal_bytes) = std::fs::metadata(super::wal_path(&self.db)).map(|m| m.len()) else {
            return false;
        };
        // `free` was read before this commit and lowered by it (`committed`).
        let threshold = super::checkpoint_threshold(Some(self.free), wal_bytes);
        // With room to spare the background checkpointer does it, off the writer: the
        // WAL file keeps its size, so this would otherwise checkpoint after every
        // commit once it had ever reached the threshold.
        if threshold >= super::WAL_CHECKPOINT_BYTES || wal_bytes < threshold {
            return false;
        }
        let growth = super::checkpoint_growth(&self.db, logical_bytes());
        let margin = (self.reserve - self.ballast_len).saturating_add(COMMIT_SLACK_BYTES);
        growth.saturating_add(margin) <= self.free
    }

    fn refill_ballast(&mut self) {
        if !self.read_free() {
            return;
        }
        // Never take the disk's last bytes for the ballast itself.
        let room = self.free.saturating_sub(COMMIT_SLACK_BYTES);
        let target = self.reserve.min(self.ballast_len + room);
        if target > self.ballast_len {
            self.set_ballast(target);
            self.read_free();
        }
        if self.ballast_len == self.reserve {
            self.drawing_on_reserve = false;
        }
    }

    /// Makes the ballast hold `len` bytes (allocated, not just sized).
    fn set_ballast(&mut self, len: u64) {
        let Some(file) = &self.ballast else { return };
        let done = if len < self.ballast_len {
            file.set_len(len).map_err(|e| e.to_string())
        } else {
            // SAFETY: fallocate on a descriptor we own; it only allocates file blocks.
            let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len as libc::off_t) };
            if rc == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error().to_string())
            }
        };
        match done {
            Ok(()) => self.ballast_len = len,
            Err(err) => {
                tracing::warn!("{}: sizing to {len}: {err}", self.ballast_path.display());
                // Sized as the file says, whatever happened.
                if let Ok(meta) = file.metadata() {
                    self.ballast_len = meta.len().min(self.reserve);
                }
            }
        }
    }

    /// Reads the free space now; false if the kernel would not say.
    fn read_free(&mut self) -> bool {
        match free_bytes(&self.db) {
            Ok(free) => {
                self.free = free;
                self.checked_at = Some(Instant::now());
                true
            }
            Err(err) => {
                tracing::debug!("statvfs {}: {err}", self.db.display());
                false
            }
        }
    }
}

impl Drop for DiskRoom {
    fn drop(&mut self) {
        // The space goes back to the disk with the workspace closed; the next open
        // makes the ballast again.
        if self.ballast.take().is_some() {
            let _ = std::fs::remove_file(&self.ballast_path);
        }
    }
}

/// Free bytes for unprivileged users (`f_bavail`) on the file system holding `path`.
pub(crate) fn free_bytes(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: all-zero is a valid statvfs to be filled in.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a statvfs to fill, both alive for the call.
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((stat.f_bavail as u64).saturating_mul(stat.f_frsize as u64))
}
