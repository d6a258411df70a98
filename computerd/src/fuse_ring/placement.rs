//! Where a queue's thread runs, so that the caller keeps its CPU.
//!
//! The kernel queues a request on the caller's CPU, and that CPU's thread (pinned there)
//! answers it while the caller sleeps. When the answer wakes the caller, the scheduler
//! looks for a CPU for it: the caller's own is busy with the thread that woke it, so a
//! caller of another scheduling group (another autogroup, another cpu cgroup: every
//! caller of a `--daemon` mount) is moved to the idle CPU, and its next request goes to
//! that CPU's queue, whose thread wakes it back. Every request then crosses CPUs twice,
//! and a round trip costs more than over `/dev/fuse` (docs/benchmarks.md, "FUSE over
//! io_uring, measured").
//!
//! A CPU whose only runnable threads are `SCHED_IDLE` counts as idle to the scheduler,
//! so a queue thread under that policy leaves the caller on its CPU, and the caller
//! preempts it at once. But `SCHED_IDLE` weighs almost nothing against the threads of
//! its own group: a busy thread of the daemon on that CPU would starve the queue. So
//! the queues first move into a cpu cgroup of their own, a child of the daemon's own
//! (so that the limits of a service manager's group still hold); in it they compete
//! with nothing but each other, and the group competes as a whole, as any group does.
//! Without such a group (no cpu controller, no permission) the threads keep the normal
//! policy.
//!
//! The group is named after the process and removed when the queues stop; one left by
//! a killed daemon is removed by the next one that starts.

use std::io;
use std::path::{Path, PathBuf};

/// The unified (v2) hierarchy, when the host has one with controllers.
const V2_ROOT: &str = "/sys/fs/cgroup";
/// The v1 hierarchy of the cpu controller (a link to `cpu,cpuacct` where combined).
const V1_CPU_ROOT: &str = "/sys/fs/cgroup/cpu";
/// How long removing the group waits for the last queue thread to leave it.
const REMOVE_PATIENCE: std::time::Duration = std::time::Duration::from_millis(200);
/// Groups are `<prefix><pid>`.
const GROUP_PREFIX: &str = "computerd-fuse-ring-";

/// The cpu cgroup the queue threads of this process run in.
#[derive(Debug)]
pub(super) struct RingGroup {
    dir: PathBuf,
    /// Where a thread id is written to move that thread in: `tasks` (v1) or
    /// `cgroup.threads` (v2).
    threads_file: PathBuf,
}

impl RingGroup {
    /// Makes this process's group under its own cpu cgroup, after removing groups of
    /// daemons that are gone. On a unified (v2) hierarchy only with `allow_v2`: there
    /// the daemon's own group becomes the root of a threaded subtree, which no host of
    /// the ones measured had, so only a mount that asks for the ring uses it.
    pub fn create(allow_v2: bool) -> io::Result<RingGroup> {
        let unified = Path::new(V2_ROOT).join("cgroup.controllers");
        let cgroups = std::fs::read_to_string("/proc/self/cgroup")?;
        if unified.exists() {
            if !allow_v2 {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "placing the queues on cgroup v2 is untested (--io-uring uses it)",
                ));
            }
            Self::create_v2(&cgroups)
        } else {
            Self::create_v1(&cgroups)
        }
    }

    fn create_v1(cgroups: &str) -> io::Result<RingGroup> {
        let own = own_cgroup(cgroups, Some("cpu"))
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no cgroup v1 cpu hierarchy"))?;
        let parent = Path::new(V1_CPU_ROOT).join(own.trim_start_matches('/'));
        let dir = make_group(&parent)?;
        let threads_file = dir.join("tasks");
        Ok(RingGroup { dir, threads_file })
    }

    fn create_v2(cgroups: &str) -> io::Result<RingGroup> {
        let own = own_cgroup(cgroups, None)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no cgroup v2 membership"))?;
        let parent = Path::new(V2_ROOT).join(own.trim_start_matches('/'));
        let dir = make_group(&parent)?;
        // Threads of one process may sit in different groups only of a threaded subtree,
        // and the cpu controller must reach it.
        let group = RingGroup {
            threads_file: dir.join("cgroup.threads"),
            dir,
        };
        write(&group.dir.join("cgroup.type"), "threaded")?;
        write(&parent.join("cgroup.subtree_control"), "+cpu")?;
        Ok(group)
    }

    /// Moves the calling thread into the group, then lowers its policy to `SCHED_IDLE`
    /// (only once it is in: in the daemon's own group that policy could starve it).
    pub fn enter(&self) -> io::Result<()> {
        // SAFETY: gettid has no arguments and cannot fail.
        let tid = unsafe { libc::gettid() };
        write(&self.threads_file, &tid.to_string())?;
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: a valid sched_param for the calling thread (0); lowering a policy
        // needs no privilege.
        if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for RingGroup {
    /// Removes the group; its owner drops it once the threads in it have been joined.
    /// A joined thread may still be leaving the group (a thread is joined when it
    /// releases its memory, and leaves its cgroup later in its exit), so an EBUSY is
    /// retried for a while.
    fn drop(&mut self) {
        let deadline = std::time::Instant::now() + REMOVE_PATIENCE;
        loop {
            match std::fs::remove_dir(&self.dir) {
                Err(err)
                    if err.raw_os_error() == Some(libc::EBUSY)
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err(err) => {
                    tracing::debug!("{}: {err} (the next mount removes it)", self.dir.display());
                    return;
                }
                Ok(()) => return,
            }
        }
    }
}

/// The path of this process's group in the hierarchy with `controller` (v1), or in the
/// unified one (`None`), from `/proc/self/cgroup`.
fn own_cgroup(cgroups: &str, controller: Option<&str>) -> Option<String> {
    cgroups.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (_id, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        let wanted = match controller {
            Some(name) => controllers.split(',').any(|c| c == name),
            None => controllers.is_empty(),
        };
        wanted.then(|| path.to_string())
    })
}

/// Creates `<parent>/<prefix><pid>`, first removing the groups of processes that are
/// gone (an empty group is all a killed daemon leaves).
fn make_group(parent: &Path) -> io::Result<PathBuf> {
    remove_orphans(parent);
    let dir = parent.join(format!("{GROUP_PREFIX}{}", std::process::id()));
    match std::fs::create_dir(&dir) {
        Ok(()) => Ok(dir),
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => Ok(dir),
        Err(err) => Err(io::Error::new(
            err.kind(),
            format!("{}: {err}", dir.display()),
        )),
    }
}

fn remove_orphans(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(GROUP_PREFIX)) else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir(entry.path());
        }
    }
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    std::fs::write(path, value)
        .map_err(|err| io::Error::new(err.kind(), format!("{}: {err}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::own_cgroup;

    #[test]
    fn own_cgroup_reads_v1_and_v2_lines() {
        let v1 = "12:pids:/user.slice\n3:cpu,cpuacct:/system.slice/x.service\n0::/\n";
        assert_eq!(
            own_cgroup(v1, Some("cpu")).as_deref(),
            Some("/system.slice/x.service")
        );
        assert_eq!(
            own_cgroup(v1, Some("cpuacct")).as_deref(),
            Some("/system.slice/x.service")
        );
        assert_eq!(own_cgroup(v1, Some("cpuset")), None);
        assert_eq!(own_cgroup(v1, None).as_deref(), Some("/"));
        assert_eq!(own_cgroup("0::/a/b:c\n", None).as_deref(), Some("/a/b:c"));
        assert_eq!(own_cgroup("", None), None);
    }
}
