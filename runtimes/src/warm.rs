//! The warm sandbox: one bubblewrap sandbox per connection of the Linux backend, kept
//! between commands, which each command joins instead of making a sandbox of its own
//! (a namespace setup costs more than most commands agents run).
//!
//! The sandbox's process is a holder (`cat`, reading a pipe this process keeps open);
//! closing the pipe ends it, and with it the pid namespace and everything in it. A
//! command joins it this way, between fork and exec of its `sh`:
//!
//! ```text
//! daemon ─fork─► child: joins the command's cgroup, then the holder's mount, ipc,
//!                       uts, network, cgroup and pid namespaces
//!                  ─fork─► command: joins the user namespace, a new session, drops
//!                          every capability, no_new_privs, the seccomp filter, chdir,
//!                          exec sh -c SCRIPT (pid N of the sandbox's namespace)
//!                  child waits for it and exits with its status (128 + signal when a
//!                  signal ended it), ignoring every catchable signal meanwhile
//! ```
//!
//! The cgroup is what tells one command's processes from another's in the shared pid
//! namespace: signals go to its members, and whatever the command left running is
//! killed when it ends, as the per-command sandbox's namespace would take it.

use std::ffi::{CString, OsString};
use std::io::{BufRead, BufReader, Read};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use nix::unistd::Pid;

use crate::backend::{signal_of, wait_and_reap, Process, Spawned};
use crate::cgroup::ExecCgroup;
use crate::error::{Error, Result};

/// What runs a script: bash, as on the shell backend, so that a script means the same
/// whichever backend `auto` sends it to.
pub const SCRIPT_SHELL: &str = "/bin/bash";

/// The backend whose sandboxes these are, for its errors.
pub(crate) const BACKEND_ID: &str = "linux";
/// What the holder runs: says it is in place, then waits for its pipe to close.
const HOLDER_SCRIPT: &str = "echo ready; exec cat > /dev/null";

/// The namespaces a command joins before its second fork, in this order (the pid
/// namespace takes effect for the children of the joining process). The user namespace
/// comes last, in the command itself: once in it, this process would no longer hold
/// the host's capabilities the other joins need.
const JOINED: [(&str, libc::c_int); 6] = [
    ("mnt", libc::CLONE_NEWNS),
    ("ipc", libc::CLONE_NEWIPC),
    ("uts", libc::CLONE_NEWUTS),
    ("net", libc::CLONE_NEWNET),
    ("cgroup", libc::CLONE_NEWCGROUP),
    ("pid", libc::CLONE_NEWPID),
];

/// A running warm sandbox.
pub(crate) struct WarmSandbox {
    /// The outer bubblewrap process.
    bwrap: Mutex<Child>,
    /// The holder's stdin: dropping it ends the sandbox.
    keep: Mutex<Option<ChildStdin>>,
    /// The holder's pidfd: readable once it ended (its pid may be reused, this not).
    holder: OwnedFd,
    /// The holder's namespaces, opened once.
    namespaces: Vec<(OwnedFd, libc::c_int)>,
    user: OwnedFd,
    seccomp: Option<Arc<Vec<libc::sock_filter>>>,
    /// The device and inode of each read-only path bound at the start.
    pub read_only: Vec<(u64, u64)>,
    /// Commands joined and not yet reaped.
    running: AtomicUsize,
    last_used: Mutex<Instant>,
}

impl WarmSandbox {
    /// Starts a sandbox with bubblewrap's `args` (everything before the command), which
    /// may name the descriptors in `inherited`; `read_only` identifies what it binds.
    pub fn start(
        bwrap: &Path,
        mut args: Vec<OsString>,
        inherited: Vec<RawFd>,
        read_only: Vec<(u64, u64)>,
    ) -> Result<Self> {
        args.extend(["/bin/sh", "-c", HOLDER_SCRIPT].map(OsString::from));
        let mut command = Command::new(bwrap);
        command
            .args(args)
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        // SAFETY: only fcntl on descriptors opened before the fork.
        unsafe { command.pre_exec(move || inherit(&inherited)) };
        let mut child = command.spawn().map_err(Error::io(format!(
            "starting a sandbox with {}",
            bwrap.display()
        )))?;
        let keep = child.stdin.take();
        let ready = wait_ready(&mut child);
        let holder = ready.and_then(|()| holder_pid(&child));
        let holder = match holder {
            Ok(holder) => holder,
            Err(err) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(err);
            }
        };
        let open = |name: &str| -> Result<OwnedFd> {
            let path = format!("/proc/{holder}/ns/{name}");
            let file = std::fs::File::open(&path).map_err(Error::io(format!("opening {path}")))?;
            Ok(file.into())
        };
        let mut namespaces = Vec::new();
        for (name, flag) in JOINED {
            namespaces.push((open(name)?, flag));
        }
        let user = open("user")?;
        // SAFETY: pidfd_open of a pid; a new descriptor or -1.
        let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, holder, 0) } as RawFd;
        if pidfd < 0 {
            return Err(Error::io("watching the sandbox's holder")(
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: a descriptor pidfd_open just returned, owned by nothing else.
        let holder_fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(pidfd) };
        tracing::debug!(holder, "warm sandbox started");
        Ok(WarmSandbox {
            bwrap: Mutex::new(child),
            keep: Mutex::new(keep),
            holder: holder_fd,
            namespaces,
            user,
            seccomp: crate::seccomp::program().map(Arc::new),
            read_only,
            running: AtomicUsize::new(0),
            last_used: Mutex::new(Instant::now()),
        })
    }

    /// Whether the sandbox still runs (its holder may have been killed from outside,
    /// and bubblewrap not yet have noticed).
    pub fn is_alive(&self) -> bool {
        let mut poll = libc::pollfd {
            fd: self.holder.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll of one descriptor this value owns, without waiting.
        let ready = unsafe { libc::poll(&mut poll, 1, 0) };
        // Only a readable pidfd says the holder ended; an interrupted poll says nothing.
        let holder_ended = ready > 0 && poll.revents & libc::POLLIN != 0;
        let mut bwrap = self.bwrap.lock().unwrap_or_else(|e| e.into_inner());
        !holder_ended && matches!(bwrap.try_wait(), Ok(None))
    }

    /// How long nothing ran in it; `None` while a command runs.
    pub fn idle_for(&self) -> Option<std::time::Duration> {
        if self.running.load(Ordering::SeqCst) > 0 {
            return None;
        }
        Some(
            self.last_used
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .elapsed(),
        )
    }

    /// Starts `sh -c script` in the sandbox, in `workdir` (a path inside it), with
    /// exactly `env`, its processes in `cgroup`.
    pub fn spawn(
        self: &Arc<Self>,
        script: &str,
        workdir: &str,
        env: &[(String, String)],
        cgroup: Arc<ExecCgroup>,
    ) -> Result<Spawned> {
        let plan = JoinPlan {
            cgroup: cgroup.clone(),
            namespaces: (self.namespaces.iter())
                .map(|(fd, flag)| (fd.as_raw_fd(), *flag))
                .collect(),
            user: self.user.as_raw_fd(),
            workdir: CString::new(workdir.as_bytes())
                .map_err(|_| Error::Invalid(format!("working directory {workdir:?}")))?,
            seccomp: self.seccomp.clone(),
        };
        let mut command = Command::new(SCRIPT_SHELL);
        command
            .args(["-c", script])
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: `enter` makes only async-signal-safe system calls on values built
        // before the fork (see its comment).
        unsafe { command.pre_exec(move || enter(&plan)) };
        let mut child = command
            .spawn()
            .map_err(Error::io("joining the warm sandbox"))?;
        self.running.fetch_add(1, Ordering::SeqCst);
        let joined = Joined {
            pid: Pid::from_raw(child.id() as i32),
            reaped: Mutex::new(false),
            cgroup: Mutex::new(Some(cgroup)),
            sandbox: Mutex::new(Some(self.clone())),
        };
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            unreachable!("all three pipes were asked for");
        };
        Ok(Spawned {
            stdin: Some(Box::new(stdin)),
            stdout: Box::new(stdout),
            stderr: Box::new(stderr),
            process: Arc::new(joined),
        })
    }

    fn finished_one(&self) {
        *self.last_used.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        self.running.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for WarmSandbox {
    fn drop(&mut self) {
        drop(self.keep.lock().unwrap_or_else(|e| e.into_inner()).take());
        let bwrap = self.bwrap.get_mut().unwrap_or_else(|e| e.into_inner());
        // The holder ends with its pipe; a sandbox stuck in setup would not.
        let _ = bwrap.kill();
        let _ = bwrap.wait();
        tracing::debug!("warm sandbox ended");
    }
}

/// Clears close-on-exec on the descriptors bubblewrap is told about.
fn inherit(fds: &[RawFd]) -> std::io::Result<()> {
    for &fd in fds {
        // SAFETY: fcntl on a descriptor number; failure is reported.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Reads the holder's "ready"; bubblewrap's own message if it never came.
fn wait_ready(child: &mut Child) -> Result<()> {
    let stdout = child.stdout.take().expect("stdout was asked for");
    let mut line = String::new();
    let _ = BufReader::new(stdout).read_line(&mut line);
    if line == "ready\n" {
        return Ok(());
    }
    let mut message = String::new();
    if let Some(stderr) = child.stderr.as_mut() {
        let _ = stderr.take(4096).read_to_string(&mut message);
    }
    Err(Error::Connect {
        backend: BACKEND_ID.into(),
        reason: format!("the sandbox did not start: {}", message.trim()),
    })
}

/// The holder: bubblewrap's child is the namespace's pid 1, the holder its child.
fn holder_pid(child: &Child) -> Result<i32> {
    let first_child = |pid: i32| -> Option<i32> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
        text.split_whitespace().next()?.parse().ok()
    };
    let init = first_child(child.id() as i32);
    init.and_then(first_child).ok_or_else(|| Error::Connect {
        backend: BACKEND_ID.into(),
        reason: "the sandbox's holder process is missing".into(),
    })
}

/// Everything a joining command needs between fork and exec, built before the fork.
struct JoinPlan {
    cgroup: Arc<ExecCgroup>,
    namespaces: Vec<(RawFd, libc::c_int)>,
    user: RawFd,
    workdir: CString,
    seccomp: Option<Arc<Vec<libc::sock_filter>>>,
}

/// Runs in the child between fork and exec: only async-signal-safe system calls, on
/// descriptors and buffers the plan holds, no allocation. Returns in the command (which
/// std then execs); the intermediate process never returns.
fn enter(plan: &JoinPlan) -> std::io::Result<()> {
    plan.cgroup.join_self()?;
    for &(fd, flag) in &plan.namespaces {
        // SAFETY: setns on a namespace descriptor the plan holds open.
        check(unsafe { libc::setns(fd, flag) })?;
    }
    // SAFETY: fork in a single-threaded child; each side continues below.
    match unsafe { libc::fork() } {
        -1 => Err(std::io::Error::last_os_error()),
        0 => become_command(plan),
        command => wait_for_command(command),
    }
}

/// The process that will exec the command: in the pid namespace now, joins the rest.
fn become_command(plan: &JoinPlan) -> std::io::Result<()> {
    // SAFETY: each call below is a system call on values the plan holds; the
    // capability structures are on this stack.
    unsafe {
        reset_signals();
        check(libc::setns(plan.user, libc::CLONE_NEWUSER))?;
        check(libc::setsid())?;
        check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL))?;
        check(libc::chdir(plan.workdir.as_ptr()))?;
        // Every capability the join gave in the sandbox's user namespace goes.
        for cap in 0..=CAPABILITY_LAST_MAX {
            let dropped = libc::prctl(libc::PR_CAPBSET_DROP, cap);
            if dropped != 0 && *libc::__errno_location() != libc::EINVAL {
                return Err(std::io::Error::last_os_error());
            }
        }
        let clear = libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong;
        check(libc::prctl(libc::PR_CAP_AMBIENT, clear, 0, 0, 0))?;
        let header = CapHeader {
            version: LINUX_CAPABILITY_VERSION_3,
            pid: 0,
        };
        let data = [CapData::default(); 2];
        check(libc::syscall(libc::SYS_capset, &header, data.as_ptr()) as libc::c_int)?;
        check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
        if let Some(program) = &plan.seccomp {
            let fprog = libc::sock_fprog {
                len: program.len() as libc::c_ushort,
                filter: program.as_ptr() as *mut libc::sock_filter,
            };
            let mode = libc::SECCOMP_MODE_FILTER as libc::c_ulong;
            check(libc::prctl(libc::PR_SET_SECCOMP, mode, &fprog))?;
        }
    }
    Ok(())
}

/// The intermediate process: outside the sandbox's pid namespace, it waits for the
/// command and exits as it did. Catchable signals (the command's group gets them all)
/// are ignored here, so that only the command decides when it ends.
fn wait_for_command(command: libc::pid_t) -> ! {
    // SAFETY: signal dispositions, close_range, waitpid and _exit: async-signal-safe.
    unsafe {
        for signal in 1..32 {
            if ![libc::SIGKILL, libc::SIGSTOP, libc::SIGCHLD].contains(&signal) {
                libc::signal(signal, libc::SIG_IGN);
            }
        }
        // Nothing here may hold the command's pipes or std's exec-error pipe open.
        libc::syscall(libc::SYS_close_range, 0, libc::c_uint::MAX, 0);
        let mut status = 0;
        loop {
            let waited = libc::waitpid(command, &mut status, 0);
            if waited == command {
                break;
            }
            if waited < 0 && *libc::__errno_location() != libc::EINTR {
                libc::_exit(127);
            }
        }
        if libc::WIFEXITED(status) {
            libc::_exit(libc::WEXITSTATUS(status));
        }
        libc::_exit(128 + libc::WTERMSIG(status));
    }
}

/// No signal blocked, and every catchable one back to its default action. Both survive
/// fork and exec (std's spawn leaves them as they were): a daemon blocks SIGINT, SIGTERM
/// and SIGHUP in its threads to take them synchronously, and may have been started with
/// SIGINT ignored (as a background job of a shell is). A command must inherit neither,
/// or `kill` and a timeout could not end it. Dispositions by the system call, not libc's
/// wrapper, which refuses the real-time signals it keeps for itself. Async-signal-safe.
pub(crate) fn reset_signals() {
    // SAFETY: an empty set on this stack, made by sigemptyset.
    unsafe {
        let mut none = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        libc::sigemptyset(none.as_mut_ptr());
        libc::pthread_sigmask(libc::SIG_SETMASK, none.as_ptr(), std::ptr::null_mut());
    }
    /// The kernel's `struct sigaction` on x86-64 and most others.
    #[repr(C)]
    struct KernelSigaction {
        handler: usize,
        flags: libc::c_ulong,
        restorer: usize,
        mask: u64,
    }
    let default = KernelSigaction {
        handler: libc::SIG_DFL,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    for signal in 1..=SIGNAL_MAX {
        if ![libc::SIGKILL, libc::SIGSTOP].contains(&signal) {
            // SAFETY: sets a disposition from a structure on this stack; the old one
            // is not asked for.
            unsafe {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    signal,
                    &default as *const KernelSigaction,
                    std::ptr::null_mut::<KernelSigaction>(),
                    std::mem::size_of::<u64>(),
                )
            };
        }
    }
}

/// The highest signal number (`SIGRTMAX`).
const SIGNAL_MAX: libc::c_int = 64;

fn check(result: libc::c_int) -> std::io::Result<()> {
    match result {
        -1 => Err(std::io::Error::last_os_error()),
        _ => Ok(()),
    }
}

/// Capabilities are numbered below this; the kernel refuses higher ones (EINVAL).
const CAPABILITY_LAST_MAX: libc::c_int = 63;
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// A command joined to the warm sandbox: the intermediate process (`pid`) and the
/// command's group.
struct Joined {
    pid: Pid,
    /// Set once `pid` was reaped: it may then belong to another process.
    reaped: Mutex<bool>,
    /// The command's group; removed once the command is reaped.
    cgroup: Mutex<Option<Arc<ExecCgroup>>>,
    /// Kept alive while the command runs, let go once it was reaped (a finished exec's
    /// record must not keep a sandbox the reaper or `close` ends).
    sandbox: Mutex<Option<Arc<WarmSandbox>>>,
}

impl Joined {
    fn cgroup(&self) -> Option<Arc<ExecCgroup>> {
        self.cgroup
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Process for Joined {
    fn signal(&self, signal: i32) -> Result<()> {
        let signal = signal_of(signal)?;
        if let Some(cgroup) = self.cgroup() {
            cgroup.signal_all(signal);
        }
        Ok(())
    }

    fn kill_all(&self) -> Result<()> {
        if let Some(cgroup) = self.cgroup() {
            cgroup.kill_all();
        }
        Ok(())
    }

    fn wait(&self) -> Result<i32> {
        // Nothing the command started outlives it; then the group goes.
        let kill_the_rest = || {
            let cgroup = self.cgroup.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(cgroup) = cgroup {
                cgroup.kill_all();
            }
        };
        let status = wait_and_reap(self.pid, &self.reaped, kill_the_rest, "a command");
        let sandbox = self
            .sandbox
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(sandbox) = sandbox {
            sandbox.finished_one();
        }
        status
    }
}
