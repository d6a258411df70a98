//! File operations on one side, through the path API ([`computer_vfs::Fs`]), as a tool
//! or the mount would make them: over a few paths, so that sides often change the same
//! one, and with files large enough to have dozens of blocks, often sharing them.
//!
//! Log writes go to `/log/<writer>/<n>`, which no other operation can reach (no path of
//! the pool lies under `/log`, and no symlink target leads there): their content is
//! unique, so whether each one survived is exact.

use computer_vfs::{Error, MkdirOptions, RmOptions, Workspace};

use super::choices::content_bytes;
use super::{Check, LogWrite, Side, Sim};

/// Directories of the pool.
const DIRS: [&str; 3] = ["/a", "/a/b", "/b"];
/// Files of the pool (their parents among [`DIRS`], or the root).
const FILES: [&str; 6] = ["/f", "/g", "/a/f", "/a/b/f", "/b/f", "/b/g"];
/// Symlink targets: relative and absolute, dangling or not, none leading to `/log`.
const LINK_TARGETS: [&str; 5] = ["f", "/a", "b", "../b", "/nowhere"];
/// Modes chmod chooses from.
const MODES: [u32; 4] = [0o644, 0o600, 0o755, 0o700];
/// Content seeds shared by many files: the same seed gives the same prefix, so blocks
/// are shared (and probed as present) across files and sides.
const SHARED_SEEDS: u64 = 4;

/// One operation on a side.
#[derive(Debug)]
enum Op {
    Write {
        path: &'static str,
        len: usize,
        seed: u64,
    },
    Append {
        path: &'static str,
        len: usize,
        seed: u64,
    },
    /// Overwrites `len` bytes at `at` percent of the file's size (and may extend it).
    Edit {
        path: &'static str,
        at: u64,
        len: usize,
        seed: u64,
    },
    Mkdir {
        path: &'static str,
    },
    Remove {
        path: &'static str,
    },
    Rename {
        from: &'static str,
        to: &'static str,
    },
    Symlink {
        target: &'static str,
        path: &'static str,
    },
    Chmod {
        path: &'static str,
        mode: u32,
    },
}

impl Op {
    fn apply(&self, ws: &Workspace) -> computer_vfs::Result<()> {
        let fs = ws.fs();
        match *self {
            Op::Write { path, len, seed } => fs.write_file(path, content_bytes(len, seed)),
            Op::Append { path, len, seed } => fs.append(path, content_bytes(len, seed)),
            Op::Edit {
                path,
                at,
                len,
                seed,
            } => {
                let size = fs.stat(path)?.size;
                fs.write_at(path, size * at / 100, content_bytes(len, seed))
            }
            Op::Mkdir { path } => fs.mkdir(
                path,
                MkdirOptions {
                    recursive: true,
                    ..MkdirOptions::default()
                },
            ),
            Op::Remove { path } => fs.rm(
                path,
                RmOptions {
                    recursive: true,
                    force: true,
                },
            ),
            Op::Rename { from, to } => fs.rename(from, to),
            Op::Symlink { target, path } => fs.symlink(target, path),
            Op::Chmod { path, mode } => fs.chmod(path, mode),
        }
    }
}

/// Errors a store must never give a well-formed operation on a sound database; any
/// other (not found, exists, not a directory, ...) is the operation being refused.
fn unexpected(error: &Error) -> bool {
    matches!(
        error,
        Error::Corrupt { .. }
            | Error::Storage { .. }
            | Error::Io { .. }
            | Error::StaleReplica(_)
            | Error::Busy(_)
            | Error::NoSpace { .. }
            | Error::ReadOnly(_)
    )
}

impl Sim {
    /// One local operation on a side chosen by the run: most often a file operation,
    /// sometimes a log write.
    pub(super) fn local_op(&mut self) -> Check {
        let side = match self.choose(1 + self.slots.len() as u64) {
            0 => Side::Server,
            n => Side::Replica(n as usize - 1),
        };
        let kind = self
            .world
            .borrow_mut()
            .choices
            .weighted(&[25, 8, 8, 6, 6, 8, 3, 4, 12]);
        if kind == 8 {
            return self.log_write(side);
        }
        let op = self.choose_op(kind);
        let ws = self.side_workspace(side);
        let result = op.apply(&ws);
        let outcome = match &result {
            Ok(()) => match ws.revision() {
                Ok(revision) => format!("ok, revision {}", revision.0),
                Err(e) => format!("ok, revision unknown: {e}"),
            },
            Err(e) => format!("refused: {e}"),
        };
        self.note(format!("{side}: {op:?}: {outcome}"));
        if let Err(e) = &result {
            if unexpected(e) {
                return Err(format!("{side}: {op:?} failed: {e}"));
            }
        }
        self.summary.local_ops += 1;
        self.count_op(side);
        if let (Side::Replica(index), Ok(())) = (side, &result) {
            self.pending_if_unpushed(index, "a local change")?;
        }
        Ok(())
    }

    fn choose_op(&self, kind: usize) -> Op {
        let file = |sim: &Sim| {
            // Mostly files; sometimes a directory, which the operation must refuse.
            if sim.chance(90) {
                FILES[sim.choose(FILES.len() as u64) as usize]
            } else {
                DIRS[sim.choose(DIRS.len() as u64) as usize]
            }
        };
        let any = |sim: &Sim| {
            let n = sim.choose((FILES.len() + DIRS.len()) as u64) as usize;
            if n < FILES.len() {
                FILES[n]
            } else {
                DIRS[n - FILES.len()]
            }
        };
        match kind {
            0 => Op::Write {
                path: file(self),
                len: self.choose_len(),
                seed: self.choose_seed(),
            },
            1 => Op::Append {
                path: file(self),
                len: self.choose_len() / 4,
                seed: self.choose_seed(),
            },
            2 => Op::Edit {
                path: file(self),
                at: self.choose(101),
                len: 1 + self.choose(16 << 10) as usize,
                seed: self.choose_seed(),
            },
            3 => Op::Mkdir {
                path: DIRS[self.choose(DIRS.len() as u64) as usize],
            },
            4 => Op::Remove { path: any(self) },
            5 => Op::Rename {
                from: any(self),
                to: any(self),
            },
            6 => Op::Symlink {
                target: LINK_TARGETS[self.choose(LINK_TARGETS.len() as u64) as usize],
                path: any(self),
            },
            _ => Op::Chmod {
                path: any(self),
                mode: MODES[self.choose(MODES.len() as u64) as usize],
            },
        }
    }

    /// A file length: mostly small, sometimes tens of KiB, now and then a few hundred
    /// (dozens of blocks at the simulation's chunk sizes).
    fn choose_len(&self) -> usize {
        let kind = self.world.borrow_mut().choices.weighted(&[6, 3, 1]);
        (match kind {
            0 => self.choose(2 << 10),
            1 => (2 << 10) + self.choose(62 << 10),
            _ => (64 << 10) + self.choose(336 << 10),
        }) as usize
    }

    fn choose_seed(&self) -> u64 {
        if self.chance(40) {
            self.choose(SHARED_SEEDS)
        } else {
            SHARED_SEEDS + self.choose(1 << 32)
        }
    }

    /// A write of unique content to `/log/<writer>/<n>`. Nothing else touches `/log`,
    /// so it cannot be refused.
    fn log_write(&mut self, side: Side) -> Check {
        let (writer, generation) = match side {
            Side::Server => ("server".to_owned(), 0),
            Side::Replica(index) => {
                let generation = self.slots[index].generation;
                (format!("r{index}.g{generation}"), generation)
            }
        };
        let counter = self.log_counters.entry(writer.clone()).or_insert(0);
        *counter += 1;
        let n = *counter;
        let path = format!("/log/{writer}/{n}");
        let mut content = format!("{writer} #{n}, step {}\n", self.step).into_bytes();
        let len = if self.chance(20) {
            self.choose_len()
        } else {
            self.choose(256) as usize
        };
        content.extend_from_slice(&content_bytes(len, self.choose_seed()));
        let ws = self.side_workspace(side);
        let fs = ws.fs();
        let dir = format!("/log/{writer}");
        let result = fs
            .mkdir(
                &dir,
                MkdirOptions {
                    recursive: true,
                    ..MkdirOptions::default()
                },
            )
            .and_then(|()| fs.write_file(&path, &content));
        if let Err(e) = result {
            return Err(format!("{side}: the log write {path} failed: {e}"));
        }
        self.note(format!(
            "{side}: log write {path} ({} bytes)",
            content.len()
        ));
        self.summary.log_writes += 1;
        self.summary.local_ops += 1;
        let ops_at = self.count_op(side);
        self.writes.push(LogWrite {
            side,
            generation,
            ops_at,
            path,
            content,
            on_server: side == Side::Server,
            lost: false,
        });
        if let Side::Replica(index) = side {
            self.pending_if_unpushed(index, "a local change")?;
        }
        Ok(())
    }

    /// Counts one more local operation of `side`; returns its count.
    fn count_op(&mut self, side: Side) -> u64 {
        match side {
            Side::Server => {
                self.server_ops += 1;
                self.server_ops
            }
            Side::Replica(index) => {
                self.slots[index].ops += 1;
                self.slots[index].ops
            }
        }
    }

    fn side_workspace(&self, side: Side) -> Workspace {
        match side {
            Side::Server => self.server(),
            Side::Replica(index) => self.slots[index].workspace().clone(),
        }
    }
}
