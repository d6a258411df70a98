//! The commands `computerd serve` runs: a Linux sandbox over a replica mount of the
//! served workspace, which the server makes on the first exec (a `computerd mount
//! --remote` of its own address, with a cache database in a private directory) and
//! keeps between commands. The replica syncs with the server as a peer of its own,
//! before every command (or the command does not run) and after it (complete, pending
//! or lost): the bracket, as for `computerd exec --remote`, but with the replica warm.
//!
//! A replica that died is noticed before the next command (it is no longer a mount, or
//! its mount answers ENOTCONN) and mounted again over its cache; the backend's
//! connection, and its warm sandbox, go with it (the view's generation changed). When
//! the backend reaps its warm sandbox for idleness (whose view would have kept the mount
//! alive), the replica is taken down too, and mounted again by the next command.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context;
use computer_runtimes::linux::WorkspaceView;
use computer_runtimes::SyncOutcome;

use crate::exec::{
    private_dir_named, run_quietly, sync_after, sync_before, wait_intent, UNMOUNT_WAIT,
};

/// The server's replica, mounted on first use.
pub struct ServedReplica {
    /// The server's address, as the replica dials it.
    address: String,
    /// The server's token, for the replica to present.
    token: Vec<u8>,
    /// Where the token is written for the replica daemon to read as it starts.
    token_file: PathBuf,
    /// A directory of the server's own: the mount point and the cache.
    dir: PathBuf,
    mountpoint: PathBuf,
    cache: PathBuf,
    control: PathBuf,
    /// Commands between their bracket's two halves; held while mounting or taking down,
    /// so that neither happens under a command.
    running: Mutex<usize>,
    /// How many times the replica was mounted: a sandbox over an earlier mount sees a
    /// dead or detached one.
    mounts: AtomicU64,
}

impl ServedReplica {
    /// A replica of the workspace served at `address` (as bound: a wildcard host is
    /// dialled on the loopback), in a new private directory.
    pub fn new(address: &str, token: &[u8]) -> anyhow::Result<ServedReplica> {
        let dir = private_dir_named("computerd-serve")?;
        let cache = dir.join("replica.db");
        Ok(ServedReplica {
            address: dialable(address),
            token: token.to_vec(),
            token_file: dir.join("token"),
            mountpoint: dir.join("workspace"),
            control: crate::replica::control_path(&cache),
            cache,
            dir,
            running: Mutex::new(0),
            mounts: AtomicU64::new(0),
        })
    }

    fn running(&self) -> std::sync::MutexGuard<'_, usize> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn is_mounted(&self) -> bool {
        crate::mounts::table()
            .is_some_and(|table| table.iter().any(|m| m.mountpoint == self.mountpoint))
    }

    /// Mounted, and its daemon answers: a daemon killed with SIGKILL leaves its mount in
    /// the table, answering ENOTCONN.
    fn is_live(&self) -> bool {
        self.is_mounted() && !crate::mount::is_stale_mount(&self.mountpoint)
    }

    /// Mounts the replica unless it is mounted, and counts a command in.
    fn enter(&self) -> anyhow::Result<()> {
        let mut running = self.running();
        self.ensure_mounted()?;
        *running += 1;
        Ok(())
    }

    /// Counts a command out.
    fn leave(&self) {
        let mut running = self.running();
        *running = running.saturating_sub(1);
    }

    /// Mounts the replica unless it is mounted and answering (the caller holds the
    /// count). A dead one is cleared by the mount, which starts over its cache.
    fn ensure_mounted(&self) -> anyhow::Result<()> {
        if self.is_live() {
            return Ok(());
        }
        tracing::info!(mountpoint = %self.mountpoint.display(), "mounting the server's replica");
        let mut mount = Command::new(std::env::current_exe().context("finding computerd")?);
        mount
            .args(["mount", "--remote", &self.address, "--cache"])
            .args([self.cache.as_os_str(), self.mountpoint.as_os_str()])
            .args(["--daemon", "--quiet", "--token-file"])
            .arg(&self.token_file);
        // In the private directory (0700), and only while the daemon starts (it keeps
        // what it read): a server killed later leaves no secret behind.
        let _ = std::fs::remove_file(&self.token_file);
        write_private(&self.token_file, &self.token)?;
        let mounted = run_quietly(&mut mount, "mounting the server's replica");
        let _ = std::fs::remove_file(&self.token_file);
        if mounted.is_ok() {
            self.mounts.fetch_add(1, Ordering::SeqCst);
        }
        mounted
    }

    /// Takes the replica down for good, while the server still answers its last push.
    /// Its directory goes only if nothing in the cache waits to be pushed.
    pub fn close(&self) {
        let _running = self.running();
        if self.is_mounted() && !self.take_down() {
            tracing::warn!(
                cache = %self.cache.display(),
                "the replica keeps changes not yet pushed; mount it with --cache to push them"
            );
            return;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    /// Unmounts the replica after a last sync (the caller holds the count);
    /// whether everything had reached the server. The cache stays for the next mount.
    fn take_down(&self) -> bool {
        let synced = sync_after(&self.control) == SyncOutcome::Complete;
        if let Err(err) = crate::umount::unmount_and_wait(&self.mountpoint, UNMOUNT_WAIT) {
            tracing::warn!("unmounting the server's replica: {err:#}");
        }
        synced
    }
}

impl WorkspaceView for ServedReplica {
    fn root(&self) -> &Path {
        &self.mountpoint
    }

    fn before_exec(&self) -> computer_runtimes::Result<()> {
        self.enter()
            .map_err(|err| computer_runtimes::Error::NotSynced(format!("{err:#}")))?;
        let synced = sync_before(&self.control);
        if synced.is_err() {
            self.leave();
        }
        synced
    }

    fn after_exec(&self) -> SyncOutcome {
        let outcome = sync_after(&self.control);
        self.leave();
        outcome
    }

    /// Mounts the replica again if it was taken down meanwhile (its cache keeps what
    /// was pending, and pushes it once mounted), and waits for it there.
    fn wait_sync(&self, intent: &str, timeout: Duration) -> computer_runtimes::Result<SyncOutcome> {
        self.enter()
            .map_err(|err| computer_runtimes::Error::NotSynced(format!("{err:#}")))?;
        let outcome = wait_intent(&self.control, intent, timeout);
        self.leave();
        outcome
    }

    fn generation(&self) -> u64 {
        self.mounts.load(Ordering::SeqCst)
    }

    /// A replica found dead is taken off its mount point at once: the sandbox that
    /// replaces the one over it needs the directory there, and the next `before_exec`
    /// mounts the replica again over its cache.
    fn is_alive(&self) -> bool {
        if self.is_live() {
            return true;
        }
        if let Err(err) = crate::mount::clear_stale_mount(&self.mountpoint) {
            tracing::warn!("the server's replica died: {err:#}");
        }
        false
    }

    fn idle(&self) {
        let running = self.running();
        if *running == 0 && self.is_mounted() {
            tracing::info!("the server's sandbox was idle; taking its replica down");
            self.take_down();
        }
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
