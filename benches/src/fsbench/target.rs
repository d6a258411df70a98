//! Benchmark targets and the guards that mount and unmount them.
//!
//! Guards unmount in `Drop`, so an error, a panic or an interrupt (which the harness turns
//! into an error, see [`super::exec`]) still leaves no mount behind.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::statfs::{statfs, FsType};

use super::exec::{self, tail};

/// One place the scenarios run.
#[derive(Debug)]
pub struct Target {
    /// Column name: "tmpfs", "ext4", "computerd" or a `--target` name.
    pub name: String,
    /// The mount or directory given.
    pub root: PathBuf,
    /// `root/.fsbench-<pid>`: the harness's own directory, holding one directory per run.
    pub work: PathBuf,
    /// File system type found under `root`, e.g. "ext4".
    pub fs_type: String,
}

impl Target {
    /// Creates the harness's directory under `root`.
    pub fn new(name: &str, root: &Path) -> Result<Target> {
        let root = root
            .canonicalize()
            .with_context(|| format!("target {name}: {} is not usable", root.display()))?;
        if !root.is_dir() {
            bail!("target {name}: {} is not a directory", root.display());
        }
        let work = root.join(format!(".fsbench-{}", std::process::id()));
        if work.exists() {
            fs::remove_dir_all(&work).with_context(|| format!("clearing {}", work.display()))?;
        }
        fs::create_dir(&work)
            .with_context(|| format!("target {name}: creating {}", work.display()))?;
        Ok(Target {
            name: name.to_string(),
            fs_type: fs_type(&root),
            root,
            work,
        })
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_dir_all(&self.work) {
            if e.kind() != std::io::ErrorKind::NotFound {
                eprintln!(
                    "fsbench: warning: could not remove {}: {e}",
                    self.work.display()
                );
            }
        }
    }
}

/// Name of the file system holding `path` ("ext4", "tmpfs", "fuse", or the magic in hex).
pub fn fs_type(path: &Path) -> String {
    use nix::sys::statfs::{
        BTRFS_SUPER_MAGIC, EXT4_SUPER_MAGIC, FUSE_SUPER_MAGIC, OVERLAYFS_SUPER_MAGIC, TMPFS_MAGIC,
        XFS_SUPER_MAGIC,
    };
    let Ok(st) = statfs(path) else {
        return "?".into();
    };
    let t = st.filesystem_type();
    let known: [(FsType, &str); 6] = [
        (EXT4_SUPER_MAGIC, "ext4"),
        (TMPFS_MAGIC, "tmpfs"),
        (FUSE_SUPER_MAGIC, "fuse"),
        (BTRFS_SUPER_MAGIC, "btrfs"),
        (XFS_SUPER_MAGIC, "xfs"),
        (OVERLAYFS_SUPER_MAGIC, "overlay"),
    ];
    known
        .iter()
        .find(|(m, _)| *m == t)
        .map(|(_, n)| n.to_string())
        .unwrap_or_else(|| format!("0x{:x}", t.0))
}

/// Whether `path` is a mount point according to /proc/self/mounts.
pub fn is_mounted(path: &Path) -> bool {
    let Ok(mounts) = fs::read_to_string("/proc/self/mounts") else {
        return false;
    };
    let want = path.to_string_lossy();
    mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(1))
        .any(|m| unescape_mount_field(m) == want)
}

/// /proc/mounts writes space, tab, newline and backslash as `\ooo`.
fn unescape_mount_field(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = b[i + 1..i + 4]
                .iter()
                .fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
            if let Ok(v) = u8::try_from(v) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A tmpfs the harness mounted; unmounted on drop.
#[derive(Debug)]
pub struct TmpfsMount {
    path: PathBuf,
}

impl TmpfsMount {
    /// Mounts a fresh tmpfs on `path` (created if missing) with mount(2).
    pub fn mount(path: &Path) -> Result<TmpfsMount> {
        fs::create_dir_all(path).with_context(|| format!("creating {}", path.display()))?;
        mount(
            Some("fsbench"),
            path,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("mode=0755"),
        )
        .with_context(|| {
            format!(
                "mounting a tmpfs on {} (mount(2) needs root; or pass --no-tmpfs)",
                path.display()
            )
        })?;
        Ok(TmpfsMount {
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TmpfsMount {
    fn drop(&mut self) {
        if let Err(e) = umount2(&self.path, MntFlags::empty()) {
            eprintln!(
                "fsbench: umount {} failed ({e}); detaching it lazily",
                self.path.display()
            );
            if let Err(e) = umount2(&self.path, MntFlags::MNT_DETACH) {
                eprintln!(
                    "fsbench: error: lazy umount {} failed: {e}",
                    self.path.display()
                );
                return;
            }
        }
        eprintln!("fsbench: unmounted tmpfs {}", self.path.display());
    }
}

/// How long `computerd mount --daemon` may take to return.
const COMPUTERD_MOUNT_TIMEOUT: Duration = Duration::from_secs(120);

/// A workspace mounted by `computerd mount DB MNT --daemon`; unmounted on drop with
/// `umount MNT` (falling back to `umount -l MNT`).
#[derive(Debug)]
pub struct ComputerdMount {
    mnt: PathBuf,
    log: PathBuf,
}

impl ComputerdMount {
    /// Runs `bin mount dir/bench.db dir/mnt --daemon` and checks that `dir/mnt` is then a
    /// mount point. The daemon's output goes to `dir/computerd.log`.
    pub fn start(bin: &Path, dir: &Path) -> Result<ComputerdMount> {
        let db = dir.join("bench.db");
        let mnt = dir.join("mnt");
        let log = dir.join("computerd.log");
        fs::create_dir_all(&mnt).with_context(|| format!("creating {}", mnt.display()))?;
        let log_file =
            fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut cmd = Command::new(bin);
        cmd.arg("mount")
            .arg(&db)
            .arg(&mnt)
            .arg("--daemon")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file);
        // Own process group: a terminal Ctrl-C must not kill the daemon before we unmount.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let shown = format!(
            "{} mount {} {} --daemon",
            bin.display(),
            db.display(),
            mnt.display()
        );
        eprintln!("fsbench: starting computerd: {shown}");
        // From here on the guard exists, so whatever got mounted is unmounted on failure.
        let guard = ComputerdMount {
            mnt: mnt.clone(),
            log: log.clone(),
        };
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot run computerd: {shown}"))?;
        let start = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if exec::interrupted() || start.elapsed() > COMPUTERD_MOUNT_TIMEOUT {
                let _ = child.kill();
                let _ = child.wait();
                exec::check_interrupted()?;
                bail!(
                    "computerd mount did not return within {:?}: {shown}\n{}",
                    COMPUTERD_MOUNT_TIMEOUT,
                    guard.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        if !status.success() {
            bail!(
                "computerd mount failed ({status}): {shown}\n{}",
                guard.log_tail()
            );
        }
        if !is_mounted(&mnt) {
            bail!(
                "computerd mount returned success but {} is not a mount point: {shown}\n{}",
                mnt.display(),
                guard.log_tail()
            );
        }
        Ok(guard)
    }

    pub fn mount_point(&self) -> &Path {
        &self.mnt
    }

    fn log_tail(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        if text.trim().is_empty() {
            format!("  (no output in {})", self.log.display())
        } else {
            format!(
                "  output ({}):\n{}",
                self.log.display(),
                tail(&text, 15, 2000)
            )
        }
    }
}

impl Drop for ComputerdMount {
    fn drop(&mut self) {
        if !is_mounted(&self.mnt) {
            return;
        }
        let umount = |lazy: bool| {
            let mut c = Command::new("umount");
            if lazy {
                c.arg("-l");
            }
            c.arg(&self.mnt).stdin(Stdio::null());
            c.status().map(|s| s.success()).unwrap_or(false)
        };
        if umount(false) {
            eprintln!("fsbench: unmounted computerd {}", self.mnt.display());
        } else if umount(true) {
            eprintln!(
                "fsbench: unmounted computerd {} lazily (umount -l)",
                self.mnt.display()
            );
        } else {
            eprintln!("fsbench: error: could not unmount {}", self.mnt.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_fields_unescape() {
        assert_eq!(unescape_mount_field(r"/tmp/a\040b"), "/tmp/a b");
        assert_eq!(unescape_mount_field("/plain"), "/plain");
        assert_eq!(unescape_mount_field(r"/end\04"), r"/end\04");
    }

    #[test]
    fn root_is_mounted() {
        assert!(is_mounted(Path::new("/")));
    }
}
