//! Where `computerd status` finds the mounts and servers running: each of them keeps a
//! file named by its pid in a runtime directory, holding its database's path, for as
//! long as it owns the database. A process that died leaves its file behind; status
//! tells it from a live one by the database's owner lock and removes it.

use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The directory: `$COMPUTERD_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/computerd`, else
/// `/run/computerd` for root and `/tmp/computerd-UID` for anyone else.
pub fn dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("COMPUTERD_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("computerd");
    }
    let uid = nix::unistd::geteuid();
    if uid.is_root() {
        PathBuf::from("/run/computerd")
    } else {
        PathBuf::from(format!("/tmp/computerd-{uid}"))
    }
}

/// This process's entry, removed when dropped.
#[derive(Debug)]
pub struct Registration {
    path: PathBuf,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Lists this process as the owner of `db` (an absolute path). Best effort: without an
/// entry everything works but `status`, so a failure is only logged.
pub fn register(db: &Path) -> Option<Registration> {
    let dir = dir();
    let path = dir.join(std::process::id().to_string());
    let made = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .and_then(|()| {
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&path)
        })
        .and_then(|mut file| std::io::Write::write_all(&mut file, db.as_os_str().as_bytes()));
    match made {
        Ok(()) => Some(Registration { path }),
        Err(err) => {
            tracing::debug!(
                "{}: cannot list this process for status: {err}",
                path.display()
            );
            None
        }
    }
}

/// One entry: a process that said it owns a database.
#[derive(Clone, Debug)]
pub struct Entry {
    pub pid: u32,
    pub db: PathBuf,
    pub file: PathBuf,
}

/// Every entry, by pid.
pub fn entries() -> Vec<Entry> {
    let Ok(dir) = std::fs::read_dir(dir()) else {
        return Vec::new();
    };
    let mut out: Vec<Entry> = dir
        .filter_map(|item| {
            let item = item.ok()?;
            let pid: u32 = item.file_name().to_str()?.parse().ok()?;
            let db = std::fs::read(item.path()).ok()?;
            Some(Entry {
                pid,
                db: PathBuf::from(std::ffi::OsString::from_vec(db)),
                file: item.path(),
            })
        })
        .collect();
    out.sort_by_key(|e| e.pid);
    out
}
