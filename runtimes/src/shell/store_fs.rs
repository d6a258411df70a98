//! The shell's view of the workspace: bashkit's file system trait over the store's
//! path API.
//!
//! Mounted at [`SANDBOX_WORKSPACE`](crate::linux::SANDBOX_WORKSPACE) in the shell's own
//! namespace, so paths arrive here relative to the workspace root (`/src/main.rs`).
//! bashkit's outermost layer follows symlinks itself, in its namespace (an absolute
//! target starts at the shell's root, as it starts at the sandbox's root on the Linux
//! backend); this layer refuses to go through one ([`Symlinks::Refuse`]: ELOOP, which
//! makes that layer resolve the link and ask again), and its `stat` is `lstat`.
//!
//! Every call is one store operation: a write is a store mutation, visible at once to
//! every other backend and replica. The policy's path rules are checked here, on the
//! path the store is asked about, and bytes written are counted against the exec's
//! budget. After each mutation the observer (the mount's kernel cache) is told which
//! paths changed. A listing's attributes answer the one `stat` of each entry that
//! follows it (a tool walking a tree), as a snapshot as fresh as the listing.

use std::collections::HashMap;
use std::io::{Error as IoError, ErrorKind};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bashkit::{async_trait, DirEntry, FileSystem, FileSystemExt, FileType, Metadata};
use computer_vfs::{Attr, FileKind, Fs, MkdirOptions, RmOptions, Symlinks, Workspace};

use super::policy::{PathRules, ShellLimits};

/// Told the workspace paths (absolute, from its root) that a mutation changed.
pub type ChangeObserver = Arc<dyn Fn(&[Vec<u8>]) + Send + Sync>;

/// The most entries of one listing kept to answer the `stat` that follows it.
const LISTED_ENTRIES_MAX: usize = 4096;

/// The store's path API as bashkit's file system, for one exec.
pub(crate) struct StoreFs {
    fs: Fs,
    rules: Arc<PathRules>,
    /// Bytes this exec may still write to the workspace.
    write_budget: AtomicU64,
    /// The largest file it reads.
    read_bytes_max: u64,
    changed: Option<ChangeObserver>,
    /// The entries of the last listing, by path, each answering one `stat` of it:
    /// bashkit's `grep -r`, `find` and `ls -R` list a directory and then stat every
    /// entry, which the listing's snapshot answers without a second trip to the store.
    /// Emptied by every mutation of this exec.
    listed: Mutex<HashMap<String, Metadata>>,
}

impl StoreFs {
    pub(crate) fn new(
        ws: &Workspace,
        rules: Arc<PathRules>,
        limits: &ShellLimits,
        changed: Option<ChangeObserver>,
    ) -> StoreFs {
        StoreFs {
            fs: ws.fs().with_symlinks(Symlinks::Refuse),
            rules,
            write_budget: AtomicU64::new(limits.write_bytes_max),
            read_bytes_max: limits.read_bytes_max,
            changed,
            listed: Mutex::new(HashMap::new()),
        }
    }

    fn readable<'p>(&self, path: &'p Path) -> bashkit::Result<&'p str> {
        let path = utf8(path)?;
        self.rules.check_read(path).map_err(denied)?;
        Ok(path)
    }

    fn writable<'p>(&self, path: &'p Path) -> bashkit::Result<&'p str> {
        let path = utf8(path)?;
        self.rules.check_write(path).map_err(denied)?;
        Ok(path)
    }

    /// Takes `bytes` from the exec's write budget, or fails with EFBIG naming the limit.
    fn spend(&self, bytes: usize) -> bashkit::Result<()> {
        let bytes = bytes as u64;
        let taken = self
            .write_budget
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                left.checked_sub(bytes)
            });
        taken.map(drop).map_err(|_| {
            IoError::new(
                ErrorKind::FileTooLarge,
                "the shell's limit on bytes written to the workspace by one command was reached",
            )
            .into()
        })
    }

    fn changed(&self, paths: &[&str]) {
        self.listed().clear();
        if let Some(observer) = &self.changed {
            let paths: Vec<Vec<u8>> = paths.iter().map(|p| p.as_bytes().to_vec()).collect();
            observer(&paths);
        }
    }

    fn listed(&self) -> std::sync::MutexGuard<'_, HashMap<String, Metadata>> {
        self.listed.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl FileSystemExt for StoreFs {
    fn backend_kind(&self) -> &'static str {
        "computer-workspace"
    }
}

#[async_trait]
impl FileSystem for StoreFs {
    async fn read_file(&self, path: &Path) -> bashkit::Result<Vec<u8>> {
        let path = self.readable(path)?;
        // bashkit reads whole files: a file larger than the limit would be that much
        // of the daemon's memory.
        let read = self.fs.read_file_at_most(path, self.read_bytes_max);
        read.map_err(|err| match err {
            computer_vfs::Error::FileTooBig(_) => {
                let why = format!(
                    "the shell reads whole files, at most {} bytes (shell.read_mib); \
                     run it on linux",
                    self.read_bytes_max
                );
                IoError::new(ErrorKind::FileTooLarge, why).into()
            }
            other => store_error(other),
        })
    }

    async fn write_file(&self, path: &Path, content: &[u8]) -> bashkit::Result<()> {
        let path = self.writable(path)?;
        self.spend(content.len())?;
        self.fs.write_file(path, content).map_err(store_error)?;
        self.changed(&[path]);
        Ok(())
    }

    async fn append_file(&self, path: &Path, content: &[u8]) -> bashkit::Result<()> {
        let path = self.writable(path)?;
        self.spend(content.len())?;
        self.fs.append(path, content).map_err(store_error)?;
        self.changed(&[path]);
        Ok(())
    }

    async fn mkdir(&self, path: &Path, recursive: bool) -> bashkit::Result<()> {
        let path = self.writable(path)?;
        let options = MkdirOptions {
            recursive,
            ..MkdirOptions::default()
        };
        self.fs.mkdir(path, options).map_err(store_error)?;
        self.changed(&[path]);
        Ok(())
    }

    async fn remove(&self, path: &Path, recursive: bool) -> bashkit::Result<()> {
        let path = self.writable(path)?;
        let attr = self.fs.lstat(path).map_err(store_error)?;
        if attr.is_dir() && !recursive {
            self.fs.rmdir(path).map_err(store_error)?;
        } else {
            let options = RmOptions {
                recursive,
                force: false,
            };
            self.fs.rm(path, options).map_err(store_error)?;
        }
        self.changed(&[path]);
        Ok(())
    }

    async fn stat(&self, path: &Path) -> bashkit::Result<Metadata> {
        self.lstat(path).await
    }

    async fn lstat(&self, path: &Path) -> bashkit::Result<Metadata> {
        let path = utf8(path)?;
        if let Some(listed) = self.listed().remove(path) {
            return Ok(listed);
        }
        self.fs.lstat(path).map(metadata).map_err(store_error)
    }

    async fn read_dir(&self, path: &Path) -> bashkit::Result<Vec<DirEntry>> {
        let path = self.readable(path)?;
        let entries = self.fs.readdir_plus(path).map_err(store_error)?;
        let entries: Vec<DirEntry> = (entries.into_iter())
            .map(|(entry, attr)| DirEntry {
                name: entry.name_lossy(),
                metadata: metadata(attr),
            })
            .collect();
        let mut listed = self.listed();
        listed.clear();
        for entry in entries.iter().take(LISTED_ENTRIES_MAX) {
            let entry_path = computer_vfs::join(path, &entry.name);
            listed.insert(entry_path, entry.metadata.clone());
        }
        Ok(entries)
    }

    async fn exists(&self, path: &Path) -> bashkit::Result<bool> {
        let path = utf8(path)?;
        Ok(self.fs.lstat(path).is_ok())
    }

    async fn rename(&self, from: &Path, to: &Path) -> bashkit::Result<()> {
        let (from, to) = (self.writable(from)?, self.writable(to)?);
        self.fs.rename(from, to).map_err(store_error)?;
        self.changed(&[from, to]);
        Ok(())
    }

    async fn copy(&self, from: &Path, to: &Path) -> bashkit::Result<()> {
        let (from, to) = (self.readable(from)?, self.writable(to)?);
        let size = self.fs.lstat(from).map_err(store_error)?.size;
        self.spend(usize::try_from(size).unwrap_or(usize::MAX))?;
        self.fs.copy_replacing(from, to).map_err(store_error)?;
        self.changed(&[to]);
        Ok(())
    }

    async fn symlink(&self, target: &Path, link: &Path) -> bashkit::Result<()> {
        let link = self.writable(link)?;
        let target = utf8(target)?;
        self.fs.symlink(target, link).map_err(store_error)?;
        self.changed(&[link]);
        Ok(())
    }

    async fn read_link(&self, path: &Path) -> bashkit::Result<PathBuf> {
        let path = utf8(path)?;
        self.fs
            .readlink(path)
            .map(PathBuf::from)
            .map_err(store_error)
    }

    async fn chmod(&self, path: &Path, mode: u32) -> bashkit::Result<()> {
        let path = self.writable(path)?;
        self.fs.chmod(path, mode).map_err(store_error)?;
        self.changed(&[path]);
        Ok(())
    }

    async fn set_modified_time(&self, path: &Path, time: SystemTime) -> bashkit::Result<()> {
        let path = self.writable(path)?;
        let attr = self.fs.lstat(path).map_err(store_error)?;
        self.fs
            .utimes(path, attr.atime, nanos_since_epoch(time))
            .map_err(store_error)?;
        self.changed(&[path]);
        Ok(())
    }
}

fn utf8(path: &Path) -> bashkit::Result<&str> {
    path.to_str().ok_or_else(|| {
        IoError::new(
            ErrorKind::InvalidInput,
            format!("{}: the workspace names paths in UTF-8", path.display()),
        )
        .into()
    })
}

fn denied(why: String) -> bashkit::Error {
    IoError::new(ErrorKind::PermissionDenied, why).into()
}

/// A store error as the I/O error a shell command reports: the kind from its errno, the
/// text the C library gives it (commands prefix the path themselves).
fn store_error(err: computer_vfs::Error) -> bashkit::Error {
    let errno = nix::errno::Errno::from_raw(err.errno());
    let kind = IoError::from_raw_os_error(err.errno()).kind();
    IoError::new(kind, errno.desc()).into()
}

fn metadata(attr: Attr) -> Metadata {
    let file_type = match attr.kind {
        FileKind::Directory => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::Fifo,
        _ => FileType::File,
    };
    Metadata {
        file_type,
        size: attr.size,
        mode: attr.perm,
        modified: system_time(attr.mtime),
        created: system_time(attr.ctime),
    }
}

fn system_time(nanos: i64) -> SystemTime {
    match u64::try_from(nanos) {
        Ok(after) => UNIX_EPOCH + Duration::from_nanos(after),
        Err(_) => UNIX_EPOCH - Duration::from_nanos(nanos.unsigned_abs()),
    }
}

fn nanos_since_epoch(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_nanos()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_nanos()).map_or(i64::MIN, |n| -n),
    }
}
