//! The Linux backend: commands in a sandbox of fresh namespaces made by bubblewrap,
//! which sees the host's programs read-only and the workspace at `/workspace`. One
//! sandbox per connection stays warm and every command joins it (`warm.rs`), reaped
//! after an idle time and replaced when it died; where the host offers no cgroup to
//! tell one command's processes from another's (or the policy says `warm = false`),
//! each command gets a sandbox of its own.
//!
//! Why bubblewrap rather than namespaces set up here with `nix`: it is Debian's
//! well-kept, audited tool for exactly this (Flatpak's sandbox), it sets up the mount
//! tree, pid 1, no_new_privs, dropped capabilities and a user namespace in one exec, and
//! what it does is one argument list a test can read.
//!
//! Inside: uid 0 of a user namespace without capabilities, no_new_privs, nested user
//! namespaces disabled (so no capabilities can be regained: mount fails), its own pid,
//! ipc, uts, cgroup and (unless the policy allows the network) network namespace, /usr
//! and a short list of /etc read-only, its own /proc, a minimal /dev and a private
//! /tmp. Nothing else of the host: not /root, /home, /var, other workspaces or their
//! databases. A symlink in the workspace that points outside resolves inside the
//! sandbox, where there is nothing of the host to find.

use std::ffi::OsString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::backend::{
    signal_of, wait_and_reap, Backend, Connection, Description, Process, SpawnRequest, Spawned,
};
use crate::cgroup::{ExecCgroup, Limits};
use crate::error::{Error, Result};
use crate::exec::SyncOutcome;
use crate::warm::WarmSandbox;

/// The backend's id in the registry.
pub const LINUX_BACKEND_ID: &str = "linux";

pub use crate::warm::SCRIPT_SHELL;

/// Where a sandbox sees the workspace.
pub const SANDBOX_WORKSPACE: &str = "/workspace";

/// The environment every command starts from; a caller's variables are added to it.
pub const BASE_ENV: &[(&str, &str)] = &[
    (
        "PATH",
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    ),
    ("HOME", "/tmp"),
    ("TMPDIR", "/tmp"),
    ("LANG", "C.UTF-8"),
];

/// What of the host's /etc programs need (name lookup, the dynamic linker's cache,
/// certificates, time zones); the rest (shadow, ssh keys, the host's own settings)
/// stays out.
const ETC_KEPT: &[&str] = &[
    "passwd",
    "group",
    "nsswitch.conf",
    "hosts",
    "host.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "localtime",
    "timezone",
    "mime.types",
    "gitconfig",
    "os-release",
    "debian_version",
    "protocols",
    "services",
    "bash.bashrc",
    "profile",
    "inputrc",
    "magic",
    "magic.mime",
    "perl",
    "python3",
];

/// Opens `rel` (relative) beneath the directory `root` as a path descriptor; EXDEV if
/// resolving it would leave `root` (RESOLVE_BENEATH), by `..` or by a symlink.
fn open_beneath(root: &std::fs::File, rel: &str) -> std::io::Result<OwnedFd> {
    let path = std::ffi::CString::new(if rel.is_empty() { "." } else { rel })?;
    // SAFETY: open_how is plain data; zero is "no flags" for every field.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: valid descriptor, C string and open_how of the size given.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// How many user namespaces may exist; 0 turns them off.
const USER_NAMESPACES_MAX: &str = "/proc/sys/user/max_user_namespaces";

/// The top-level directories of a merged-/usr host (links into /usr) or of an older
/// one (directories of their own, bound read-only).
const USERLAND_TOP: &[&str] = &["bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// What a sandbox may do, per backend.
#[derive(Clone, Debug)]
pub struct LinuxPolicy {
    /// Whether commands reach the network (the host's); otherwise only a loopback of
    /// their own.
    pub network: bool,
    /// Names of the variables a caller may pass; `*` at the end matches a prefix, `*`
    /// alone any name. The daemon's own environment never reaches a command.
    pub env_allow: Vec<String>,
    /// Workspace paths (relative to its root) the sandbox sees read-only.
    pub read_only: Vec<String>,
    /// The bubblewrap program.
    pub bwrap: PathBuf,
    /// The longest a command runs; a caller may ask for less.
    pub timeout: Option<Duration>,
    /// Processes of one command at once, and its memory (a cgroup of its own; a
    /// command is refused where the host offers none).
    pub processes_max: Option<u64>,
    pub memory_bytes_max: Option<u64>,
    /// Whether commands join one warm sandbox (else each gets its own).
    pub warm: bool,
    /// How long a warm sandbox may go without a command before it is reaped.
    pub sandbox_idle: Duration,
}

/// The default of [`LinuxPolicy::sandbox_idle`].
pub const SANDBOX_IDLE_DEFAULT: Duration = Duration::from_secs(300);
/// Whether joining a sandbox failed because its pid namespace has ended: fork(2) into
/// a pid namespace whose init is gone fails with ENOMEM, before the kernel has ended
/// (and the pidfd shows the end of) every other process of it.
fn namespace_ended(err: &Error) -> bool {
    matches!(err, Error::Io { source, .. } if source.raw_os_error() == Some(libc::ENOMEM))
}

/// How often the reaper looks at a connection's warm sandbox, at most.
const REAP_INTERVAL_MAX: Duration = Duration::from_secs(1);

impl Default for LinuxPolicy {
    fn default() -> LinuxPolicy {
        LinuxPolicy {
            network: false,
            env_allow: vec!["*".into()],
            read_only: Vec::new(),
            bwrap: PathBuf::from("/usr/bin/bwrap"),
            timeout: None,
            processes_max: None,
            memory_bytes_max: None,
            warm: true,
            sandbox_idle: SANDBOX_IDLE_DEFAULT,
        }
    }
}

impl LinuxPolicy {
    fn limits(&self) -> Limits {
        Limits {
            processes: self.processes_max,
            memory_bytes: self.memory_bytes_max,
        }
    }

    fn allows_env(&self, name: &str) -> bool {
        self.env_allow
            .iter()
            .any(|pattern| match pattern.strip_suffix('*') {
                Some(prefix) => name.starts_with(prefix),
                None => pattern == name,
            })
    }
}

/// The workspace as a sandbox sees it: a directory on the host, kept in step with the
/// authoritative workspace around each command.
pub trait WorkspaceView: Send + Sync {
    /// The directory bound at `/workspace`.
    fn root(&self) -> &Path;
    /// Brings the directory up to everything the authoritative side holds now.
    fn before_exec(&self) -> Result<()>;
    /// Sends what commands wrote there to the authoritative side.
    fn after_exec(&self) -> SyncOutcome;
    fn is_alive(&self) -> bool {
        true
    }
    /// Changes whenever the directory at [`WorkspaceView::root`] is replaced by another
    /// (a replica mounted again): a sandbox set up before binds the old one.
    fn generation(&self) -> u64 {
        0
    }
    /// The warm sandbox was reaped for idleness: nothing of the backend holds the view
    /// now, and a view holding something costly (a replica mount) may let it go, to
    /// bring it back at the next `before_exec`. A command may be between its own
    /// `before_exec` and its start: the view must not let go under it.
    fn idle(&self) {}
    /// Waits up to `timeout` for the writes of a pending `after_exec` (named by its
    /// intent) to reach the authoritative side. A view that never leaves one pending
    /// has none to wait for.
    fn wait_sync(&self, intent: &str, timeout: std::time::Duration) -> Result<SyncOutcome> {
        let _ = timeout;
        Err(Error::Invalid(format!(
            "intent {intent}: the sandbox works on the authoritative workspace here; \
             nothing of it is pending"
        )))
    }
}

/// A directory that is the authoritative workspace itself (its owner's own mount, or a
/// plain directory): nothing to bring up to date, and a command's writes are there
/// when it exits.
pub struct LocalView {
    root: PathBuf,
}

impl LocalView {
    pub fn new(root: impl Into<PathBuf>) -> LocalView {
        LocalView { root: root.into() }
    }
}

impl WorkspaceView for LocalView {
    fn root(&self) -> &Path {
        &self.root
    }
    fn before_exec(&self) -> Result<()> {
        Ok(())
    }
    fn after_exec(&self) -> SyncOutcome {
        SyncOutcome::Complete
    }
}

/// The Linux backend over one workspace view.
pub struct LinuxBackend {
    view: Arc<dyn WorkspaceView>,
    policy: LinuxPolicy,
}

impl LinuxBackend {
    pub fn new(view: Arc<dyn WorkspaceView>, policy: LinuxPolicy) -> LinuxBackend {
        LinuxBackend { view, policy }
    }
}

impl Backend for LinuxBackend {
    fn id(&self) -> &str {
        LINUX_BACKEND_ID
    }

    fn describe(&self) -> Description {
        let network = if self.policy.network {
            "the network"
        } else {
            "no network"
        };
        Description {
            id: LINUX_BACKEND_ID.into(),
            summary: "a Linux sandbox (namespaces, by bubblewrap) with the host's programs".into(),
            runs: "any program installed on the host, by `bash -c`".into(),
            touches: format!("the workspace at {SANDBOX_WORKSPACE}, a private /tmp, {network}"),
        }
    }

    fn connect(&self) -> Result<Arc<dyn Connection>> {
        let connection = Arc::new(LinuxConnection {
            view: self.view.clone(),
            generation: self.view.generation(),
            policy: self.policy.clone(),
            warm: Arc::new(Mutex::new(None)),
        });
        connection.probe()?;
        if self.policy.warm {
            let (slot, view) = (Arc::downgrade(&connection.warm), self.view.clone());
            reap_when_idle(slot, view, self.policy.sandbox_idle);
        }
        Ok(connection)
    }

    fn wait_sync(&self, intent: &str, timeout: std::time::Duration) -> Result<SyncOutcome> {
        self.view.wait_sync(intent, timeout)
    }
}

/// A connection's warm sandbox, once a command started it.
type WarmSlot = Mutex<Option<Arc<WarmSandbox>>>;

struct LinuxConnection {
    view: Arc<dyn WorkspaceView>,
    /// The view's generation this connection's sandboxes were set up over.
    generation: u64,
    policy: LinuxPolicy,
    warm: Arc<WarmSlot>,
}

/// Ends the warm sandbox of `slot` once it has been idle for `idle` (then tells `view`
/// it is idle), or died; returns when the connection is gone.
fn reap_when_idle(slot: std::sync::Weak<WarmSlot>, view: Arc<dyn WorkspaceView>, idle: Duration) {
    let interval = (idle / 2).min(REAP_INTERVAL_MAX);
    let reaper = move || {
        while let Some(slot) = slot.upgrade() {
            let (reaped, idled) = {
                let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
                let dead = slot.as_ref().is_some_and(|sandbox| !sandbox.is_alive());
                let idled = slot.as_ref().is_some_and(|sandbox| {
                    sandbox.idle_for().is_some_and(|idle_for| idle_for >= idle)
                });
                let reaped = if dead || idled { slot.take() } else { None };
                (reaped, idled)
            };
            // Ended outside the lock: a command may start another meanwhile.
            if reaped.is_some() {
                tracing::debug!("reaping the warm sandbox");
            }
            drop(reaped);
            drop(slot);
            if idled {
                view.idle();
            }
            std::thread::sleep(interval);
        }
    };
    let spawned = std::thread::Builder::new()
        .name("sandbox-reaper".into())
        .spawn(reaper);
    if let Err(err) = spawned {
        tracing::warn!(
            "no reaper for the warm sandbox ({err}): it lasts as long as its connection"
        );
    }
}

impl LinuxConnection {
    /// Checks what a sandbox needs without making one (that would double the cost of a
    /// one-command connection): bubblewrap, the workspace's directory, and user
    /// namespaces. A sandbox that still cannot be set up fails its command with
    /// bubblewrap's message on stderr.
    fn probe(&self) -> Result<()> {
        let unreachable = |reason: String| Error::Connect {
            backend: LINUX_BACKEND_ID.into(),
            reason,
        };
        if !self.policy.bwrap.exists() {
            return Err(unreachable(format!(
                "{} not found (Debian: apt-get install bubblewrap)",
                self.policy.bwrap.display()
            )));
        }
        if !self.view.root().is_dir() {
            return Err(unreachable(format!(
                "{}: the workspace's directory is missing",
                self.view.root().display()
            )));
        }
        let limit = std::fs::read_to_string(USER_NAMESPACES_MAX).unwrap_or_default();
        if limit.trim() == "0" {
            return Err(unreachable(format!(
                "user namespaces are disabled here ({USER_NAMESPACES_MAX} is 0)"
            )));
        }
        Ok(())
    }
}

impl Connection for LinuxConnection {
    fn before_exec(&self, _exec_id: &str) -> Result<()> {
        self.view.before_exec()
    }

    fn spawn(&self, request: &SpawnRequest) -> Result<Spawned> {
        let env = self.checked_env(&request.env)?;
        self.check_cwd(&request.cwd)?;
        if self.policy.warm {
            if let Some(spawned) = self.spawn_warm(request, &env)? {
                return Ok(spawned);
            }
        }
        self.spawn_alone(request, &env)
    }

    fn after_exec(&self, _exec_id: &str) -> SyncOutcome {
        self.view.after_exec()
    }

    /// The view is alive and still the one the sandbox was set up over: a sandbox bound
    /// a directory that was replaced since (a replica mounted again) sees the old one.
    fn is_alive(&self) -> bool {
        self.view.is_alive() && self.view.generation() == self.generation
    }

    fn timeout_max(&self) -> Option<Duration> {
        self.policy.timeout
    }
}

impl LinuxConnection {
    /// The command in the warm sandbox; `None` where the host offers no cgroup to keep
    /// its processes apart (the caller makes it a sandbox of its own).
    fn spawn_warm(
        &self,
        request: &SpawnRequest,
        env: &[(String, String)],
    ) -> Result<Option<Spawned>> {
        let cgroup = match ExecCgroup::create(&request.exec_id, self.policy.limits()) {
            Ok(cgroup) => cgroup,
            Err(why) => {
                tracing::debug!("no warm sandbox without a cgroup: {why}");
                return Ok(None);
            }
        };
        let workdir = sandbox_workdir(&request.cwd);
        let base = BASE_ENV.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        let env: Vec<(String, String)> = base.chain(env.iter().cloned()).collect();
        let cgroup = Arc::new(cgroup);
        let sandbox = self.warm_sandbox()?;
        match sandbox.spawn(&request.script, &workdir, &env, cgroup.clone()) {
            Ok(spawned) => Ok(Some(spawned)),
            // It died between the look and the join: the command never started (a
            // failed join is reported before exec), so it may go to a new sandbox.
            Err(err) if !sandbox.is_alive() || namespace_ended(&err) => {
                tracing::warn!("the warm sandbox died as a command joined it ({err}); again");
                self.forget_warm_sandbox(&sandbox);
                let sandbox = self.warm_sandbox()?;
                Ok(Some(sandbox.spawn(
                    &request.script,
                    &workdir,
                    &env,
                    cgroup,
                )?))
            }
            Err(err) => Err(err),
        }
    }

    /// The connection's warm sandbox: the running one, or a new one if there is none,
    /// it died, or a read-only path is no longer the directory it bound (the policy's
    /// paths are checked before every command, as a sandbox of its own would be).
    fn warm_sandbox(&self) -> Result<Arc<WarmSandbox>> {
        let read_only = self.open_read_only()?;
        let bound = identities(&read_only)?;
        let mut slot = self.warm.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(sandbox) = slot.as_ref() {
            match (sandbox.is_alive(), sandbox.read_only == bound) {
                (true, true) => return Ok(sandbox.clone()),
                (false, _) => tracing::warn!("the warm sandbox died; starting another"),
                (true, false) => tracing::info!("a read-only path changed; a new warm sandbox"),
            }
        }
        let binds: Vec<(RawFd, String)> = (read_only.iter())
            .map(|(fd, dest)| (fd.as_raw_fd(), dest.clone()))
            .collect();
        let sandbox = Sandbox {
            read_only: &binds,
            seccomp: None,
        };
        let args = sandbox_args(self.view.root(), &self.policy, "/", &[], &sandbox)?;
        let inherited = binds.iter().map(|(fd, _)| *fd).collect();
        let started = WarmSandbox::start(&self.policy.bwrap, args, inherited, bound)?;
        let started = Arc::new(started);
        *slot = Some(started.clone());
        Ok(started)
    }

    /// Lets go of `sandbox` if it is still the connection's warm one: the next command
    /// starts another, though this one's holder may not have been seen to end yet.
    fn forget_warm_sandbox(&self, sandbox: &Arc<WarmSandbox>) {
        let mut slot = self.warm.lock().unwrap_or_else(|e| e.into_inner());
        if slot
            .as_ref()
            .is_some_and(|current| Arc::ptr_eq(current, sandbox))
        {
            *slot = None;
        }
    }

    /// The command in a sandbox of its own.
    fn spawn_alone(&self, request: &SpawnRequest, env: &[(String, String)]) -> Result<Spawned> {
        let read_only = self.open_read_only()?;
        let binds: Vec<(RawFd, String)> = (read_only.iter())
            .map(|(fd, dest)| (fd.as_raw_fd(), dest.clone()))
            .collect();
        let seccomp = crate::seccomp::filter()?;
        let seccomp_fd = seccomp.as_ref().map(|fd| fd.as_raw_fd());
        let sandbox = Sandbox {
            read_only: &binds,
            seccomp: seccomp_fd,
        };
        let root = self.view.root();
        let mut args = sandbox_args(root, &self.policy, &request.cwd, env, &sandbox)?;
        args.extend([SCRIPT_SHELL, "-c"].map(OsString::from));
        args.push(OsString::from(&request.script));
        let cgroup = self.cgroup_for(&request.exec_id)?;
        let mut command = Command::new(&self.policy.bwrap);
        command
            .args(args)
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let inherited: Vec<RawFd> = (binds.iter().map(|(fd, _)| *fd))
            .chain(seccomp_fd)
            .collect();
        let joined = cgroup.clone();
        // SAFETY: only async-signal-safe calls between fork and exec: signal, fcntl on
        // descriptors opened before the fork, and `join_self` (open, write, close).
        unsafe {
            command.pre_exec(move || {
                crate::warm::reset_signals();
                for &fd in &inherited {
                    if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                joined.as_ref().map_or(Ok(()), |cgroup| cgroup.join_self())
            })
        };
        let mut child = command.spawn().map_err(Error::io(format!(
            "starting {}",
            self.policy.bwrap.display()
        )))?;
        // The pid is reaped by `Sandboxed::wait`, not through `child`.
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            unreachable!("all three pipes were asked for");
        };
        Ok(Spawned {
            stdin: Some(Box::new(stdin)),
            stdout: Box::new(stdout),
            stderr: Box::new(stderr),
            process: Arc::new(Sandboxed::new(Pid::from_raw(child.id() as i32), cgroup)),
        })
    }

    fn check_cwd(&self, cwd: &str) -> Result<()> {
        if !self.view.root().join(cwd.trim_start_matches('/')).is_dir() {
            return Err(Error::Invalid(format!(
                "working directory {cwd}: not a directory in the workspace"
            )));
        }
        Ok(())
    }

    /// The policy's read-only paths, each opened beneath the workspace's root (a
    /// symlink a command left there may not lead out of it) and handed to bubblewrap as
    /// a descriptor, so nothing can swap the path between this check and the mount.
    /// A path that does not exist is skipped.
    fn open_read_only(&self) -> Result<Vec<(OwnedFd, String)>> {
        if self.policy.read_only.is_empty() {
            return Ok(Vec::new());
        }
        let root = std::fs::File::open(self.view.root())
            .map_err(Error::io(format!("opening {}", self.view.root().display())))?;
        let mut opened = Vec::new();
        for path in &self.policy.read_only {
            let inside = crate::spine::normalize_cwd(path)?;
            let dest = format!("{SANDBOX_WORKSPACE}{inside}");
            match open_beneath(&root, inside.trim_start_matches('/')) {
                Ok(fd) => opened.push((fd, dest)),
                Err(err) if err.raw_os_error() == Some(libc::ENOENT) => {}
                Err(err) if err.raw_os_error() == Some(libc::EXDEV) => {
                    return Err(Error::Refused {
                        backend: LINUX_BACKEND_ID.into(),
                        what: format!(
                            "read-only path {path}: a symlink leads out of the workspace"
                        ),
                    })
                }
                Err(err) => return Err(Error::io(format!("read-only path {path}"))(err)),
            }
        }
        Ok(opened)
    }

    fn cgroup_for(&self, exec_id: &str) -> Result<Option<Arc<ExecCgroup>>> {
        let limits = self.policy.limits();
        if !limits.any() {
            return Ok(None);
        }
        let cgroup = ExecCgroup::create(exec_id, limits).map_err(|why| Error::Refused {
            backend: LINUX_BACKEND_ID.into(),
            what: format!("process and memory limits need a cgroup, unavailable here ({why})"),
        })?;
        Ok(Some(Arc::new(cgroup)))
    }

    fn checked_env(&self, env: &[(String, String)]) -> Result<Vec<(String, String)>> {
        for (name, value) in env {
            let malformed = name.is_empty() || name.contains(['=', '\0']) || value.contains('\0');
            if malformed {
                return Err(Error::Invalid(format!(
                    "environment variable {name:?}: malformed"
                )));
            }
            if !self.policy.allows_env(name) {
                return Err(Error::Refused {
                    backend: LINUX_BACKEND_ID.into(),
                    what: format!("environment variable {name} (not in env_allow)"),
                });
            }
        }
        Ok(env.to_vec())
    }
}

/// Descriptors bubblewrap inherits for one sandbox.
pub struct Sandbox<'a> {
    /// Workspace paths opened beneath its root, and where they go in the sandbox.
    pub read_only: &'a [(RawFd, String)],
    /// A pipe holding the seccomp program.
    pub seccomp: Option<RawFd>,
}

/// bubblewrap's arguments for a sandbox over `root` with the working directory `cwd`
/// (inside the workspace) and the caller's `env`, up to the command.
pub fn sandbox_args(
    root: &Path,
    policy: &LinuxPolicy,
    cwd: &str,
    env: &[(String, String)],
    sandbox: &Sandbox<'_>,
) -> Result<Vec<OsString>> {
    let mut args: Vec<OsString> = Vec::new();
    let mut push = |items: &[&str]| args.extend(items.iter().map(OsString::from));
    push(&["--unshare-all", "--unshare-user", "--disable-userns"]);
    if policy.network {
        push(&["--share-net"]);
    }
    push(&["--die-with-parent", "--new-session", "--cap-drop", "ALL"]);
    push(&["--hostname", "computer", "--ro-bind", "/usr", "/usr"]);
    for top in USERLAND_TOP {
        let host = Path::new("/").join(top);
        match std::fs::read_link(&host) {
            Ok(target) => push(&[
                "--symlink",
                &target.to_string_lossy(),
                &host.to_string_lossy(),
            ]),
            Err(_) if host.is_dir() => push(&[
                "--ro-bind",
                &host.to_string_lossy(),
                &host.to_string_lossy(),
            ]),
            Err(_) => {}
        }
    }
    let resolv = policy.network.then_some("resolv.conf");
    for name in ETC_KEPT.iter().copied().chain(resolv) {
        let path = format!("/etc/{name}");
        push(&["--ro-bind-try", &path, &path]);
    }
    push(&["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]);
    push(&["--dir", "/var", "--symlink", "../tmp", "/var/tmp"]);
    args.extend([
        "--bind".into(),
        root.as_os_str().to_owned(),
        SANDBOX_WORKSPACE.into(),
    ]);
    for (fd, dest) in sandbox.read_only {
        args.extend(["--ro-bind-fd".into(), fd.to_string().into(), dest.into()]);
    }
    if let Some(fd) = sandbox.seccomp {
        args.extend(["--seccomp".into(), fd.to_string().into()]);
    }
    args.extend([
        "--chdir".into(),
        sandbox_workdir(cwd).into(),
        "--clearenv".into(),
    ]);
    let base = BASE_ENV.iter().map(|(k, v)| (k.to_string(), v.to_string()));
    for (name, value) in base.chain(env.iter().cloned()) {
        args.extend(["--setenv".into(), name.into(), value.into()]);
    }
    args.push("--".into());
    Ok(args)
}

/// The device and inode of each opened read-only path, in order.
fn identities(opened: &[(OwnedFd, String)]) -> Result<Vec<(u64, u64)>> {
    let mut ids = Vec::with_capacity(opened.len());
    for (fd, dest) in opened {
        let stat = nix::sys::stat::fstat(fd)
            .map_err(|err| Error::io(format!("read-only path {dest}"))(err.into()))?;
        ids.push((stat.st_dev, stat.st_ino));
    }
    Ok(ids)
}

/// The working directory `cwd` of the workspace, as the sandbox names it.
fn sandbox_workdir(cwd: &str) -> String {
    format!("{SANDBOX_WORKSPACE}{}", if cwd == "/" { "" } else { cwd })
}

/// A sandbox's process tree: bubblewrap outside, pid 1 of the namespace (bubblewrap's
/// reaper) its child, the command below.
struct Sandboxed {
    bwrap: Pid,
    /// Set once the outer process was reaped: its pid may then belong to another.
    reaped: Mutex<bool>,
    /// The command's limits; removed once it is reaped.
    cgroup: Mutex<Option<Arc<ExecCgroup>>>,
}

impl Sandboxed {
    fn new(bwrap: Pid, cgroup: Option<Arc<ExecCgroup>>) -> Sandboxed {
        Sandboxed {
            bwrap,
            reaped: Mutex::new(false),
            cgroup: Mutex::new(cgroup),
        }
    }

    fn reaped(&self) -> std::sync::MutexGuard<'_, bool> {
        self.reaped.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The namespace's pid 1 (host pid), once bubblewrap started it.
    fn namespace_init(&self) -> Option<Pid> {
        let children = format!("/proc/{0}/task/{0}/children", self.bwrap);
        let text = std::fs::read_to_string(children).ok()?;
        text.split_whitespace()
            .next()?
            .parse()
            .ok()
            .map(Pid::from_raw)
    }

    /// Every process in the sandbox's pid namespace but its pid 1.
    fn members(&self, init: Pid) -> Vec<Pid> {
        let ns_of = |pid: &str| std::fs::metadata(format!("/proc/{pid}/ns/pid")).map(|m| m.ino());
        let Ok(namespace) = ns_of(&init.to_string()) else {
            return Vec::new();
        };
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|&pid| pid != init.as_raw())
            .filter(|pid| ns_of(&pid.to_string()).is_ok_and(|ns| ns == namespace))
            .map(Pid::from_raw)
            .collect()
    }
}

impl Process for Sandboxed {
    fn signal(&self, signal: i32) -> Result<()> {
        let signal = signal_of(signal)?;
        let reaped = self.reaped();
        if *reaped {
            return Ok(());
        }
        if let Some(init) = self.namespace_init() {
            for pid in self.members(init) {
                // A process may end meanwhile (ESRCH): that is what was wanted.
                let _ = kill(pid, signal);
            }
        }
        Ok(())
    }

    fn kill_all(&self) -> Result<()> {
        let reaped = self.reaped();
        if *reaped {
            return Ok(());
        }
        // The namespace ends with its pid 1; bubblewrap's own end would take it too
        // (--die-with-parent), both for when one is not there yet.
        if let Some(init) = self.namespace_init() {
            let _ = kill(init, Signal::SIGKILL);
        }
        let _ = kill(self.bwrap, Signal::SIGKILL);
        Ok(())
    }

    fn wait(&self) -> Result<i32> {
        let status = wait_and_reap(self.bwrap, &self.reaped, || {}, "a sandbox");
        // The namespace ended with bubblewrap: the group is empty, and goes.
        drop(self.cgroup.lock().unwrap_or_else(|e| e.into_inner()).take());
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(policy: &LinuxPolicy, cwd: &str, env: &[(String, String)]) -> Vec<String> {
        let read_only = [(7, "/workspace/ref".to_string())];
        let sandbox = Sandbox {
            read_only: &read_only,
            seccomp: Some(9),
        };
        let args = sandbox_args(Path::new("/srv/ws"), policy, cwd, env, &sandbox).unwrap();
        args.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    fn has(args: &[String], window: &[&str]) -> bool {
        args.windows(window.len()).any(|w| w == window)
    }

    #[test]
    fn the_sandbox_gets_the_workspace_the_userland_and_nothing_of_the_daemon() {
        let env = [("FOO".to_string(), "bar".to_string())];
        let a = args(&LinuxPolicy::default(), "/src", &env);
        assert!(has(&a, &["--bind", "/srv/ws", "/workspace"]));
        assert!(has(&a, &["--ro-bind", "/usr", "/usr"]));
        assert!(has(&a, &["--chdir", "/workspace/src", "--clearenv"]));
        assert!(has(&a, &["--setenv", "FOO", "bar"]));
        assert!(has(&a, &["--cap-drop", "ALL"]));
        assert!(has(&a, &["--seccomp", "9"]));
        assert!(a.contains(&"--unshare-all".to_string()));
        assert!(a.contains(&"--disable-userns".to_string()));
        assert!(!a.contains(&"--share-net".to_string()));
        assert!(!a
            .iter()
            .any(|arg| arg == "/etc" || arg.starts_with("/etc/shadow")));
        assert!(!a.iter().any(|arg| arg.contains("resolv.conf")));
        assert_eq!(a.last().map(String::as_str), Some("--"));
    }

    #[test]
    fn the_policy_opens_the_network_and_closes_paths() {
        let policy = LinuxPolicy {
            network: true,
            ..LinuxPolicy::default()
        };
        let a = args(&policy, "/", &[]);
        assert!(a.contains(&"--share-net".to_string()));
        assert!(has(
            &a,
            &["--ro-bind-try", "/etc/resolv.conf", "/etc/resolv.conf"]
        ));
        assert!(has(&a, &["--ro-bind-fd", "7", "/workspace/ref"]));
        assert!(has(&a, &["--chdir", "/workspace", "--clearenv"]));
    }

    #[test]
    fn the_warm_sandbox_names_this_backend_in_its_errors() {
        assert_eq!(crate::warm::BACKEND_ID, LINUX_BACKEND_ID);
    }

    #[test]
    fn environment_names_match_the_allowlist() {
        let policy = LinuxPolicy {
            env_allow: vec!["LC_*".into(), "TZ".into()],
            ..LinuxPolicy::default()
        };
        assert!(policy.allows_env("LC_ALL"));
        assert!(policy.allows_env("TZ"));
        assert!(!policy.allows_env("TZX"));
        assert!(!policy.allows_env("SECRET"));
        assert!(LinuxPolicy::default().allows_env("ANYTHING"));
    }
}
