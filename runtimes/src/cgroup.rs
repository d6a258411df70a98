//! Limits on one command's processes and memory through a cgroup of its own, where the
//! host offers one to root: the v1 `pids` and `memory` hierarchies (this kind of
//! machine), or the unified v2 hierarchy.
//!
//! The sandbox's first process joins the group before it runs bubblewrap (it writes 0,
//! "myself", to each `cgroup.procs` between fork and exec), so nothing of the command
//! starts outside it. The group is removed once the command's processes are gone.
//!
//! A command that joins a warm sandbox has a group whatever its limits: the group is
//! how its processes are told from the other commands' in the same pid namespace (a
//! process cannot leave it: the sandbox has no cgroup file system).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Why the limits cannot be set here (the caller refuses the command with it).
pub type Unavailable = String;

type Result<T> = std::result::Result<T, Unavailable>;

const V1_ROOT: &str = "/sys/fs/cgroup";
const V2_CONTROLLERS: &str = "/sys/fs/cgroup/cgroup.controllers";

/// What one command may use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    pub processes: Option<u64>,
    pub memory_bytes: Option<u64>,
}

impl Limits {
    pub fn any(&self) -> bool {
        self.processes.is_some() || self.memory_bytes.is_some()
    }
}

/// The cgroup directories of one command (one per v1 hierarchy, or one v2 group).
pub(crate) struct ExecCgroup {
    dirs: Vec<PathBuf>,
    /// `cgroup.procs` of each, ready for the child between fork and exec.
    procs: Vec<CString>,
}

impl ExecCgroup {
    /// Makes the group for the command `name` with `limits` (none: a group that only
    /// holds the command's processes).
    pub fn create(name: &str, limits: Limits) -> Result<ExecCgroup> {
        // Unique in this process: exec ids are unique per `Runtimes` only.
        static GROUPS_MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let made = GROUPS_MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let leaf = format!("computer-exec-{}-{made}-{name}", std::process::id());
        let mut group = ExecCgroup {
            dirs: Vec::new(),
            procs: Vec::new(),
        };
        if Path::new(V2_CONTROLLERS).exists() {
            group.add_v2(&leaf, limits)?;
        } else {
            group.add_v1(&leaf, limits)?;
        }
        Ok(group)
    }

    fn add_v1(&mut self, leaf: &str, limits: Limits) -> Result<()> {
        // The pids hierarchy always, first: its group is the one whose members are read.
        let settings = [
            ("pids", "pids.max", limits.processes, true),
            (
                "memory",
                "memory.limit_in_bytes",
                limits.memory_bytes,
                false,
            ),
        ];
        for (hierarchy, knob, value, always) in settings {
            if value.is_none() && !always {
                continue;
            }
            let root = Path::new(V1_ROOT).join(hierarchy);
            if !root.join("cgroup.procs").exists() {
                return Err(unavailable(&format!("no cgroup v1 {hierarchy} hierarchy")));
            }
            let dir = self.make(root.join(leaf))?;
            let Some(value) = value else { continue };
            write(&dir.join(knob), &value.to_string())?;
            if hierarchy == "memory" {
                // Without swap accounting this file is absent: the limit holds for RAM.
                let _ = std::fs::write(dir.join("memory.memsw.limit_in_bytes"), value.to_string());
            }
        }
        Ok(())
    }

    fn add_v2(&mut self, leaf: &str, limits: Limits) -> Result<()> {
        let root = Path::new(V2_CONTROLLERS)
            .parent()
            .expect("a file in a directory");
        // The root group may delegate controllers whatever processes it holds.
        let wanted = [("pids", limits.processes), ("memory", limits.memory_bytes)];
        for (controller, value) in wanted {
            if value.is_some() {
                let enable = format!("+{controller}");
                write(&root.join("cgroup.subtree_control"), &enable)?;
            }
        }
        let dir = self.make(root.join(leaf))?;
        if let Some(processes) = limits.processes {
            write(&dir.join("pids.max"), &processes.to_string())?;
        }
        if let Some(bytes) = limits.memory_bytes {
            write(&dir.join("memory.max"), &bytes.to_string())?;
            let _ = std::fs::write(dir.join("memory.swap.max"), "0");
        }
        Ok(())
    }

    fn make(&mut self, dir: PathBuf) -> Result<PathBuf> {
        std::fs::create_dir(&dir)
            .map_err(|err| unavailable(&format!("{}: {err}", dir.display())))?;
        let procs = CString::new(dir.join("cgroup.procs").as_os_str().as_bytes())
            .expect("a cgroup path has no NUL");
        self.dirs.push(dir.clone());
        self.procs.push(procs);
        Ok(dir)
    }

    /// Moves the calling process into the group. Runs in the child between fork and
    /// exec, so only async-signal-safe calls: open, write, close.
    pub fn join_self(&self) -> std::io::Result<()> {
        for procs in &self.procs {
            // SAFETY: a valid C string; the descriptor is closed below.
            let fd = unsafe { libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // SAFETY: writes one byte from a static buffer to the descriptor opened above.
            let written = unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) };
            let err = std::io::Error::last_os_error();
            // SAFETY: closes the descriptor opened above.
            unsafe { libc::close(fd) };
            if written != 1 {
                return Err(err);
            }
        }
        Ok(())
    }
}

impl ExecCgroup {
    /// The processes in the group now.
    pub fn members(&self) -> Vec<nix::unistd::Pid> {
        let procs = self.dirs[0].join("cgroup.procs");
        let text = std::fs::read_to_string(procs).unwrap_or_default();
        (text.lines())
            .filter_map(|line| line.trim().parse().ok())
            .map(nix::unistd::Pid::from_raw)
            .collect()
    }

    /// Sends `signal` to every process of the group, and to those that join it while
    /// it does (a shell that has the signal blocked may still be forking), for at most
    /// [`SIGNAL_ROUNDS_MAX`] reads of the group.
    pub fn signal_all(&self, signal: nix::sys::signal::Signal) {
        let mut signalled = std::collections::HashSet::new();
        for _ in 0..SIGNAL_ROUNDS_MAX {
            let newcomers: Vec<_> = (self.members().into_iter())
                .filter(|pid| signalled.insert(*pid))
                .collect();
            if newcomers.is_empty() {
                return;
            }
            for pid in newcomers {
                // A process may end meanwhile (ESRCH): that is what was wanted.
                let _ = nix::sys::signal::kill(pid, signal);
            }
        }
    }

    /// Kills every process of the group, again while some fork faster than they die,
    /// at most [`KILL_ROUNDS_MAX`] times (a group under a process limit cannot outgrow
    /// that; each round kills all it finds).
    pub fn kill_all(&self) {
        for _ in 0..KILL_ROUNDS_MAX {
            let members = self.members();
            if members.is_empty() {
                return;
            }
            for pid in members {
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        tracing::warn!(group = %self.dirs[0].display(), "processes still in a killed group");
    }
}

/// Reads of a group while signalling it.
const SIGNAL_ROUNDS_MAX: usize = 8;
/// Rounds of SIGKILL over a group before giving up on it.
const KILL_ROUNDS_MAX: usize = 100;

impl Drop for ExecCgroup {
    fn drop(&mut self) {
        for dir in &self.dirs {
            // Empty once the command's namespace is gone; the kernel may take a moment
            // to let go of the last exited task.
            for _ in 0..50 {
                match std::fs::remove_dir(dir) {
                    Err(err) if err.raw_os_error() == Some(libc::EBUSY) => {
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                    _ => break,
                }
            }
        }
    }
}

fn write(path: &Path, value: &str) -> Result<()> {
    std::fs::write(path, value).map_err(|err| unavailable(&format!("{}: {err}", path.display())))
}

fn unavailable(why: &str) -> Unavailable {
    why.to_owned()
}
