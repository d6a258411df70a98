//! The commands `computerd serve` runs: a Linux sandbox over a replica mount of the
//! served workspace, which the server makes on the first exec (a `computerd mount
//! --remote` of its own address, with a cache database in a private directory) and
//! keeps between commands. The replica syncs with the server as a peer of its own,
//! before every command (or the command does not run) and after it (complete, pending
//! or lost): the bracket, as for `computerd exec --remote`, but with the replica warm.
//!
//! A replica that died is noticed before the next command (it is no longer a mount)
//! and mounted again; the backend's connection, and its warm sandbox, go with it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use anyhow::Context;
use computer_runtimes::linux::WorkspaceView;
use computer_runtimes::SyncOutcome;

use crate::exec::{run_quietly, sync_after, sync_before, UNMOUNT_WAIT};

/// The server's replica, mounted on first use.
pub struct ServedReplica {
    /// The server's address, as the replica dials it.
    address: String,
    /// A file of the server's token, for the replica to present.
    token_file: PathBuf,
    /// A directory of the server's own: the mount point and the cache.
    dir: PathBuf,
    mountpoint: PathBuf,
    cache: PathBuf,
    control: PathBuf,
    /// Held while mounting, so two commands do not mount it twice.
    mounting: Mutex<()>,
}

impl ServedReplica {
    /// A replica of the workspace served at `address` (as bound: a wildcard host is
    /// dialled on the loopback), in a new private directory.
    pub fn new(address: &str, token: &[u8]) -> anyhow::Result<ServedReplica> {
        let dir = std::env::temp_dir().join(format!("computerd-serve-{}", std::process::id()));
        make_private_dir(&dir)?;
        let cache = dir.join("replica.db");
        // In the private directory (0700), read by the replica daemon only.
        let token_file = dir.join("token");
        write_private(&token_file, token)?;
        Ok(ServedReplica {
            address: dialable(address),
            token_file,
            mountpoint: dir.join("workspace"),
            control: crate::replica::control_path(&cache),
            cache,
            dir,
            mounting: Mutex::new(()),
        })
    }

    fn is_mounted(&self) -> bool {
        crate::mounts::table()
            .is_some_and(|table| table.iter().any(|m| m.mountpoint == self.mountpoint))
    }

    /// Mounts the replica unless it is mounted.
    fn ensure_mounted(&self) -> anyhow::Result<()> {
        let _mounting = self.mounting.lock().unwrap_or_else(|e| e.into_inner());
        if self.is_mounted() {
            return Ok(());
        }
        tracing::info!(mountpoint = %self.mountpoint.display(), "mounting the server's replica");
        let mut mount = Command::new(std::env::current_exe().context("finding computerd")?);
        mount
            .args(["mount", "--remote", &self.address, "--cache"])
            .args([self.cache.as_os_str(), self.mountpoint.as_os_str()])
            .args(["--daemon", "--quiet", "--token-file"])
            .arg(&self.token_file);
        run_quietly(&mut mount, "mounting the server's replica")
    }

    /// Takes the replica down, while the server still answers its last push. Its
    /// directory goes only if nothing in the cache waits to be pushed.
    pub fn close(&self) {
        let _mounting = self.mounting.lock().unwrap_or_else(|e| e.into_inner());
        if !self.is_mounted() {
            let _ = std::fs::remove_dir_all(&self.dir);
            return;
        }
        let synced = sync_after(&self.control) == SyncOutcome::Complete;
        if let Err(err) = crate::umount::unmount_and_wait(&self.mountpoint, UNMOUNT_WAIT) {
            tracing::warn!("unmounting the server's replica: {err:#}");
            return;
        }
        if synced {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            tracing::warn!(
                cache = %self.cache.display(),
                "the replica keeps changes not yet pushed; mount it with --cache to push them"
            );
        }
    }
}

impl WorkspaceView for ServedReplica {
    fn root(&self) -> &Path {
        &self.mountpoint
    }

    fn before_exec(&self) -> computer_runtimes::Result<()> {
        self.ensure_mounted()
            .map_err(|err| computer_runtimes::Error::NotSynced(format!("{err:#}")))?;
        sync_before(&self.control)
    }

    fn after_exec(&self) -> SyncOutcome {
        sync_after(&self.control)
    }

    fn is_alive(&self) -> bool {
        self.is_mounted()
    }
}

/// `tcp:0.0.0.0:P` (or `[::]`) is where the server listens, not where to dial it.
fn dialable(address: &str) -> String {
    for wildcard in ["tcp:0.0.0.0:", "tcp:[::]:"] {
        if let Some(port) = address.strip_prefix(wildcard) {
            return format!("tcp:127.0.0.1:{port}");
        }
    }
    address.to_owned()
}

fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("{}: cannot make", path.display()))?;
    file.write_all(bytes)
        .with_context(|| format!("{}: cannot write", path.display()))
}

fn make_private_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("{}: cannot make a private directory", dir.display()))?;
    std::fs::create_dir(dir.join("workspace"))
        .with_context(|| format!("{}: cannot make the mount point", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wildcard_listener_is_dialled_on_the_loopback() {
        assert_eq!(dialable("tcp:0.0.0.0:4000"), "tcp:127.0.0.1:4000");
        assert_eq!(dialable("tcp:[::]:4000"), "tcp:127.0.0.1:4000");
        assert_eq!(dialable("tcp:10.0.0.1:4000"), "tcp:10.0.0.1:4000");
        assert_eq!(dialable("/run/ws.sock"), "/run/ws.sock");
    }
}
