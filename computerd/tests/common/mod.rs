//! Shared harness of the mount tests: a [`Mount`] guard that mounts a fresh workspace
//! with the built `computerd` binary and always takes it down again, and helpers that run
//! commands with a timeout and fail with everything needed to understand the failure.
//!
//! Every test binary includes this module (`mod common;`) and uses a different subset of
//! it, hence the `dead_code` allowance.
#![allow(dead_code)]

pub mod versions;

use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_computerd");

/// How long a command run by a test may take before it is killed.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(600);
/// How long the daemon may take to exit after its filesystem was unmounted.
pub const DAEMON_EXIT_TIMEOUT: Duration = Duration::from_secs(60);
/// Log filter of the daemons started by the tests.
const DAEMON_LOG: &str = "info,fuser=error";
/// Extra `computerd mount` arguments for every mount of a run, split at whitespace: the
/// same tests over another configuration (`COMPUTERD_TEST_MOUNT_ARGS=--no-io-uring`, as
/// scripts/test.sh runs them).
const EXTRA_MOUNT_ARGS_ENV: &str = "COMPUTERD_TEST_MOUNT_ARGS";

/// What a daemon that carried requests over io_uring logs at unmount (the last one in
/// `log`): the requests each CPU's queue served, and how many large reads the read
/// workers served.
pub fn ring_counts(log: &str) -> Option<(Vec<u64>, u64)> {
    let line = log.lines().rev().find_map(|line| {
        line.split("FUSE requests served over io_uring, per CPU: ")
            .nth(1)
    })?;
    let (per_cpu, rest) = line.strip_prefix('[')?.split_once(']')?;
    let served = per_cpu
        .split(", ")
        .map(|n| n.parse().ok())
        .collect::<Option<_>>()?;
    let large_reads = rest.rsplit(": ").next()?.trim().parse().ok()?;
    Some((served, large_reads))
}

/// `computerd fs DB ARGS` fed `stdin` (run by the database's owner if it has one).
pub fn fs_db(db: &Path, args: &[&str], stdin: &[u8]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.arg("fs").arg(db).args(args);
    run_with_stdin(&mut cmd, stdin)
}

/// Like [`fs_db`], asserting success; returns stdout.
pub fn fs_db_ok(db: &Path, args: &[&str], stdin: &[u8]) -> Vec<u8> {
    let out = fs_db(db, args, stdin);
    assert!(
        out.status.success(),
        "{}",
        describe_failure(&format!("computerd fs {args:?}"), None, &out)
    );
    out.stdout
}

/// How many requests of `op` a daemon served, from the table `--op-stats` logs at
/// unmount (the last one in `log`; 0 if none of that kind came).
pub fn served(log: &str, op: &str) -> u64 {
    let table = log
        .rsplit("FUSE requests served:")
        .next()
        .unwrap_or_else(|| panic!("no table of requests in the log:\n{log}"));
    table
        .lines()
        .find_map(|line| {
            let mut columns = line.split_whitespace();
            (columns.next() == Some(op)).then(|| columns.next()?.parse().ok())?
        })
        .unwrap_or(0)
}

/// The arguments of [`EXTRA_MOUNT_ARGS_ENV`].
pub fn extra_mount_args() -> Vec<String> {
    std::env::var(EXTRA_MOUNT_ARGS_ENV)
        .map(|args| args.split_whitespace().map(String::from).collect())
        .unwrap_or_default()
}

/// Whether this run's extra mount arguments include `arg`.
pub fn mounts_with(arg: &str) -> bool {
    extra_mount_args().iter().any(|extra| extra == arg)
}

/// Whether this kernel has FUSE over io_uring (its switch, which the daemon turns on).
pub fn kernel_has_fuse_io_uring() -> bool {
    Path::new("/sys/module/fuse/parameters/enable_uring").exists()
}

static SUBREAPER: Once = Once::new();

/// Makes this test process the reaper of orphaned descendants, so the daemon (whose
/// parent, `computerd mount --daemon`, exits at once) becomes our child and its exit
/// status can be collected with `waitpid`.
fn become_subreaper() {
    SUBREAPER.call_once(|| {
        // SAFETY: plain prctl with integer arguments.
        let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
        if rc != 0 {
            eprintln!(
                "warning: PR_SET_CHILD_SUBREAPER failed ({}); daemon exit statuses will not be checked",
                std::io::Error::last_os_error()
            );
        }
    });
}

/// `setpriv` arguments for root without the capabilities that override file
/// permissions: its effective set comes from the bounding set at exec.
pub const WEAK_ROOT: &str = "--bounding-set=-dac_override,-dac_read_search,-fowner,-chown,-fsetid";

/// A mounted workspace in its own temporary directory:
///
/// ```text
/// <root>/ws.db        the database
/// <root>/mnt/         the mount point
/// <root>/daemon.log   the daemon's log (printed when a test fails)
/// <root>/scratch/     room for files that must live outside the mount
/// ```
///
/// Dropping it unmounts (`umount`, then `umount -l` if busy), waits for the daemon to
/// exit (SIGKILL after a timeout) and removes the directory, unless a mount could not be
/// removed, in which case the directory is left alone rather than emptied through it.
pub struct Mount {
    dir: Option<tempfile::TempDir>,
    pub root: PathBuf,
    pub db: PathBuf,
    pub mnt: PathBuf,
    pub log: PathBuf,
    pub scratch: PathBuf,
    pid: Option<i32>,
    /// For a replica mount: `--remote ADDR --token-file FILE ...`; the database is its
    /// cache.
    replica_of: Option<Vec<String>>,
}

impl Mount {
    /// Mounts a new, empty workspace read-write.
    pub fn new() -> Mount {
        Mount::with_args(&[])
    }

    /// Mounts a new workspace with extra `computerd mount` arguments.
    pub fn with_args(args: &[&str]) -> Mount {
        Mount::start(None, "computerd-test-", "ws.db", None, args)
    }

    /// Mounts a new workspace whose directory (database, staging files) is made inside
    /// `parent`, with extra `computerd mount` arguments.
    pub fn with_args_in(parent: &Path, args: &[&str]) -> Mount {
        Mount::start(Some(parent), "computerd-test-", "ws.db", None, args)
    }

    /// Mounts a replica of `server`'s workspace, its cache a new database, with extra
    /// `computerd mount` arguments.
    pub fn replica(server: &Server, args: &[&str]) -> Mount {
        let remote = vec![
            "--remote".into(),
            server.address.clone(),
            "--token-file".into(),
            server.token_file.display().to_string(),
        ];
        Mount::start(None, "computerd-replica-", "cache.db", Some(remote), args)
    }

    /// A new temporary directory with a database named `db` and a mount point, mounted
    /// (as a replica when `replica_of` says of what).
    fn start(
        parent: Option<&Path>,
        prefix: &str,
        db: &str,
        replica_of: Option<Vec<String>>,
        args: &[&str],
    ) -> Mount {
        become_subreaper();
        let mut builder = tempfile::Builder::new();
        builder.prefix(prefix);
        let dir = match parent {
            Some(parent) => builder.tempdir_in(parent),
            None => builder.tempdir(),
        }
        .expect("creating a temporary directory");
        let root = dir.path().to_path_buf();
        let mut mount = Mount {
            db: root.join(db),
            mnt: root.join("mnt"),
            log: root.join("daemon.log"),
            scratch: root.join("scratch"),
            root,
            dir: Some(dir),
            pid: None,
            replica_of,
        };
        std::fs::create_dir(&mount.mnt).unwrap();
        std::fs::create_dir(&mount.scratch).unwrap();
        mount.mount(args);
        mount
    }

    /// Replaces the replica's cache with a new, empty database (its disk was lost).
    pub fn lose_cache(&mut self) {
        assert!(
            self.pid.is_none(),
            "lose_cache(): the daemon is still running"
        );
        for suffix in [
            "",
            "-wal",
            "-shm",
            ".staging",
            ".control",
            ".owner",
            ".owner.sock",
        ] {
            let mut path = self.db.clone().into_os_string();
            path.push(suffix);
            let path = PathBuf::from(path);
            if path.is_dir() {
                let _ = std::fs::remove_dir_all(&path);
            } else {
                let _ = std::fs::remove_file(&path);
            }
        }
    }

    /// `computerd sync` on this replica (its output whatever the status).
    pub fn sync(&self, extra: &[&str]) -> Output {
        let mut cmd = Command::new(BIN);
        cmd.arg("sync").arg(&self.mnt).args(extra);
        run_cmd(&mut cmd, "computerd sync", COMMAND_TIMEOUT)
    }

    /// Mounts the workspace (again), with extra `computerd mount` arguments.
    pub fn mount(&mut self, args: &[&str]) {
        assert!(self.pid.is_none(), "mount(): the daemon is still running");
        let mut cmd = Command::new(BIN);
        cmd.arg("--log").arg(DAEMON_LOG).arg("mount");
        match &self.replica_of {
            Some(remote) => cmd.args(remote).arg("--cache").arg(&self.db),
            None => cmd.arg(&self.db),
        };
        cmd.arg(&self.mnt)
            .arg("--daemon")
            .arg("--log-file")
            .arg(&self.log)
            .args(args)
            .args(
                extra_mount_args()
                    .iter()
                    .filter(|extra| !args.contains(&extra.as_str())),
            )
            .env("NO_COLOR", "1");
        let what = format!("computerd mount {} {args:?}", self.mnt.display());
        let out = run_cmd(&mut cmd, &what, Duration::from_secs(60));
        if !out.status.success() {
            panic!(
                "{}\n--- daemon log ---\n{}",
                describe_failure(&what, None, &out),
                self.daemon_log()
            );
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let pid: i32 = stdout
            .trim()
            .lines()
            .last()
            .and_then(|l| l.trim().parse().ok())
            .unwrap_or_else(|| panic!("{what}: expected the daemon pid on stdout, got {stdout:?}"));
        self.pid = Some(pid);
        assert!(
            is_mounted(&self.mnt),
            "{what} returned but {} is not in /proc/mounts",
            self.mnt.display()
        );
    }

    /// The daemon's pid.
    pub fn pid(&self) -> i32 {
        self.pid.expect("the daemon is not running")
    }

    /// `<mnt>/<rel>`.
    pub fn path(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.mnt.join(rel)
    }

    /// Unmounts with `umount` and asserts the daemon then exits with status 0.
    pub fn unmount(&mut self) {
        let pid = self.unmount_without_waiting();
        let status = wait_exit(pid, DAEMON_EXIT_TIMEOUT);
        match status {
            Exited::Status(status) if status.success() => {}
            other => panic!(
                "the daemon (pid {pid}) did not exit cleanly after umount: {other:?}\n--- daemon log ---\n{}",
                self.daemon_log()
            ),
        }
        assert!(
            !is_mounted(&self.mnt),
            "{} still mounted after umount",
            self.mnt.display()
        );
    }

    /// Unmounts with `computerd umount` (which returns once the daemon let go of the
    /// database), asserts the daemon then exits cleanly, and returns the command's
    /// output.
    pub fn unmount_with_computerd(&mut self) -> Output {
        let pid = self.pid();
        let mut cmd = Command::new(BIN);
        cmd.arg("umount").arg(&self.mnt);
        let out = run_cmd(&mut cmd, "computerd umount", Duration::from_secs(180));
        if !out.status.success() {
            panic!("{}", describe_failure("computerd umount", None, &out));
        }
        self.pid = None;
        match wait_exit(pid, DAEMON_EXIT_TIMEOUT) {
            Exited::Status(status) if status.success() => {}
            other => panic!(
                "the daemon (pid {pid}) did not exit cleanly after computerd umount: {other:?}\n\
                 --- daemon log ---\n{}",
                self.daemon_log()
            ),
        }
        out
    }

    /// Unmounts with `umount` and returns the daemon's pid at once, without waiting for
    /// it to exit (the caller waits, with [`wait_exit`]).
    pub fn unmount_without_waiting(&mut self) -> i32 {
        let pid = self.pid();
        let out = umount_when_free(&self.mnt);
        if !out.status.success() {
            panic!("{}", describe_failure("umount", None, &out));
        }
        self.pid = None;
        pid
    }

    /// Stops the daemon with `signal` and asserts it unmounts and exits with status 0.
    pub fn stop_with_signal(&mut self, signal: i32) {
        let pid = self.pid();
        // SAFETY: sending a signal to a process we started.
        assert_eq!(
            unsafe { libc::kill(pid, signal) },
            0,
            "kill({pid}, {signal})"
        );
        let status = wait_exit(pid, DAEMON_EXIT_TIMEOUT);
        self.pid = None;
        match status {
            Exited::Status(status) if status.success() => {}
            other => panic!(
                "the daemon (pid {pid}) did not exit cleanly on signal {signal}: {other:?}\n--- daemon log ---\n{}",
                self.daemon_log()
            ),
        }
        assert!(
            !is_mounted(&self.mnt),
            "{} still mounted after the daemon exited on signal {signal}",
            self.mnt.display()
        );
    }

    /// Kills the daemon with SIGKILL and waits until it is gone; the mount stays (stale).
    pub fn kill_daemon(&mut self) {
        let pid = self.pid();
        // SAFETY: sending a signal to a process we started.
        assert_eq!(
            unsafe { libc::kill(pid, libc::SIGKILL) },
            0,
            "kill -9 {pid}"
        );
        let status = wait_exit(pid, DAEMON_EXIT_TIMEOUT);
        self.pid = None;
        if let Exited::Status(status) = status {
            assert_eq!(
                status.signal(),
                Some(libc::SIGKILL),
                "daemon status {status:?}"
            );
        }
    }

    /// The daemon's log so far.
    pub fn daemon_log(&self) -> String {
        match std::fs::read(&self.log) {
            Ok(bytes) => tail(&String::from_utf8_lossy(&bytes), 64 << 10),
            Err(err) => format!("(no log: {err})"),
        }
    }

    /// `computerd fs DB ARGS` on this mount's database (run by the mount's daemon),
    /// fed `stdin`.
    pub fn fs(&self, args: &[&str], stdin: &[u8]) -> Output {
        fs_db(&self.db, args, stdin)
    }

    /// Like [`Mount::fs`], asserting success; returns stdout.
    pub fn fs_ok(&self, args: &[&str], stdin: &[u8]) -> Vec<u8> {
        fs_db_ok(&self.db, args, stdin)
    }

    /// Runs a bash script in the mount, asserting success; returns stdout.
    pub fn sh(&self, script: &str) -> String {
        sh(&self.mnt, script)
    }

    /// Runs a python3 script in the mount, asserting success; returns stdout.
    pub fn py(&self, script: &str) -> String {
        py(&self.mnt, script)
    }

    /// Verifies the database with `computerd fs <db> check`; the mount must be down.
    pub fn check_db(&self) {
        assert!(self.pid.is_none(), "check_db(): unmount first");
        check_db(&self.db);
    }

    fn teardown(&mut self) -> Vec<String> {
        let mut problems = Vec::new();
        // After a lazy unmount of a busy mount the daemon serves until the last user is
        // gone, which may be never: then it gets only a short while before SIGKILL.
        let mut exit_timeout = DAEMON_EXIT_TIMEOUT;
        if is_mounted(&self.mnt) {
            let out = umount_when_free(&self.mnt);
            if !out.status.success() {
                problems.push(describe_failure("umount (teardown)", None, &out));
                exit_timeout = Duration::from_secs(5);
                let out = run_cmd(
                    Command::new("umount").arg("-l").arg(&self.mnt),
                    "umount -l",
                    Duration::from_secs(60),
                );
                if !out.status.success() {
                    problems.push(describe_failure("umount -l (teardown)", None, &out));
                }
            }
        }
        if let Some(pid) = self.pid.take() {
            match wait_exit(pid, exit_timeout) {
                Exited::Status(status) if status.success() => {}
                Exited::Unknown => {}
                Exited::TimedOut => {
                    // SAFETY: sending a signal to a process we started.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    let again = wait_exit(pid, Duration::from_secs(10));
                    problems.push(format!(
                        "the daemon (pid {pid}) did not exit within {exit_timeout:?} of the unmount; killed it ({again:?})"
                    ));
                }
                other => problems.push(format!("the daemon (pid {pid}) exited with {other:?}")),
            }
        }
        // A stale mount (daemon killed) or a lazily detached one: make sure nothing stays.
        for _ in 0..10 {
            if !is_mounted(&self.mnt) {
                break;
            }
            let _ = Command::new("umount")
                .arg("-l")
                .arg(&self.mnt)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        if is_mounted(&self.mnt) {
            problems.push(format!(
                "{} is still mounted; leaving {} in place",
                self.mnt.display(),
                self.root.display()
            ));
            if let Some(dir) = self.dir.take() {
                let _ = dir.keep();
            }
        }
        problems
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        let problems = self.teardown();
        if panicking {
            eprintln!(
                "--- daemon log ({}) ---\n{}--- end of daemon log ---",
                self.log.display(),
                self.daemon_log()
            );
        }
        if !problems.is_empty() {
            let text = problems.join("\n");
            if panicking {
                eprintln!("teardown problems:\n{text}");
            } else {
                panic!(
                    "teardown problems:\n{text}\n--- daemon log ---\n{}",
                    self.daemon_log()
                );
            }
        }
    }
}

/// A `computerd serve` of a workspace in its own temporary directory, on a Unix socket
/// (or `tcp:127.0.0.1:0`), with a token file. Killed (SIGTERM, then SIGKILL) when
/// dropped; its log is printed if the test is failing.
pub struct Server {
    dir: Option<tempfile::TempDir>,
    pub db: PathBuf,
    pub token_file: PathBuf,
    /// The address as clients give it (the bound port for TCP).
    pub address: String,
    listen: String,
    pub log: PathBuf,
    child: Option<std::process::Child>,
    /// More arguments of `computerd serve`.
    extra: Vec<String>,
    /// More environment of `computerd serve`.
    env: Vec<(String, String)>,
}

/// The token of the test servers.
pub const TOKEN: &str = "test-token-0123456789";

impl Server {
    /// Serves a new workspace on a Unix socket.
    pub fn start() -> Server {
        Server::start_on(None)
    }

    /// Serves a new workspace on `listen` (`None`: a Unix socket in its directory).
    pub fn start_on(listen: Option<&str>) -> Server {
        Server::start_serving(listen, &[], &[])
    }

    /// Serves a new workspace on a Unix socket, with `extra` arguments.
    pub fn start_with(extra: &[&str]) -> Server {
        Server::start_serving(None, extra, &[])
    }

    /// Serves a new workspace on a Unix socket, with `env` added to its environment.
    pub fn start_with_env(env: &[(&str, &str)]) -> Server {
        Server::start_serving(None, &[], env)
    }

    fn start_serving(listen: Option<&str>, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let dir = tempfile::Builder::new()
            .prefix("computerd-server-")
            .tempdir()
            .expect("creating a temporary directory");
        let root = dir.path().to_path_buf();
        let token_file = root.join("token");
        std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
        let listen = listen
            .map(str::to_owned)
            .unwrap_or_else(|| root.join("sock").display().to_string());
        let mut server = Server {
            db: root.join("server.db"),
            token_file,
            address: listen.clone(),
            listen,
            log: root.join("server.log"),
            dir: Some(dir),
            child: None,
            extra: extra.iter().map(|arg| arg.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        server.restart();
        server
    }

    /// Starts the server process (again) and waits for its `listening on` line.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "restart(): the server is running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut child = Command::new(BIN)
            .arg("--log")
            .arg(DAEMON_LOG)
            .arg("serve")
            .arg(&self.db)
            .arg("--listen")
            .arg(&self.listen)
            .arg("--token-file")
            .arg(&self.token_file)
            .args(&self.extra)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("starting computerd serve");
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
        let Some(address) = line.trim().strip_prefix("listening on ") else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "computerd serve did not start: {line:?}\n--- server log ---\n{}",
                self.server_log()
            );
        };
        self.address = address.to_owned();
        if self.listen.starts_with("tcp:") && self.listen.ends_with(":0") {
            // Come back on the same port after a restart.
            self.listen = self.address.clone();
        }
        self.child = Some(child);
    }

    /// A handle that reaches `server` at another `address` (through a proxy), with its
    /// token; it runs no process of its own.
    pub fn client_of(server: &Server, address: &str) -> Server {
        Server {
            dir: None,
            db: server.db.clone(),
            token_file: server.token_file.clone(),
            address: address.to_owned(),
            listen: address.to_owned(),
            log: server.log.clone(),
            child: None,
            extra: Vec::new(),
            env: Vec::new(),
        }
    }

    /// The server process's pid.
    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("the server is not running").id() as i32
    }

    /// Reaps the server after someone else killed it.
    pub fn forget_killed(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
    }

    /// SIGKILL: the server dies mid-whatever.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, and asserts a clean exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let status = child.wait().unwrap();
            assert!(
                status.success(),
                "computerd serve exited with {status:?}\n--- server log ---\n{}",
                self.server_log()
            );
        }
    }

    /// `computerd fs --remote ADDR <args>` with `stdin`, returning its output.
    pub fn fs(&self, args: &[&str], stdin: &[u8]) -> Output {
        let mut cmd = Command::new(BIN);
        cmd.arg("fs")
            .arg("--remote")
            .arg(&self.address)
            .arg("--token-file")
            .arg(&self.token_file)
            .args(args);
        run_with_stdin(&mut cmd, stdin)
    }

    /// Like [`Server::fs`], asserting success; returns stdout.
    pub fn fs_ok(&self, args: &[&str], stdin: &[u8]) -> Vec<u8> {
        let out = self.fs(args, stdin);
        if !out.status.success() {
            panic!(
                "{}\n--- server log ---\n{}",
                describe_failure(&format!("computerd fs --remote {args:?}"), None, &out),
                self.server_log()
            );
        }
        out.stdout
    }

    pub fn server_log(&self) -> String {
        match std::fs::read(&self.log) {
            Ok(bytes) => tail(&String::from_utf8_lossy(&bytes), 64 << 10),
            Err(err) => format!("(no log: {err})"),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- server log ---\n{}--- end of server log ---",
                self.server_log()
            );
        }
        if let Some(mut child) = self.child.take() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        drop(self.dir.take());
    }
}

/// Runs `cmd` feeding it `stdin`, with the usual timeout; never panics on its status.
pub fn run_with_stdin(cmd: &mut Command, stdin: &[u8]) -> Output {
    use std::io::Write;
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("starting a command");
    let mut pipe = child.stdin.take().unwrap();
    let input = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = pipe.write_all(&input);
    });
    let out = child.wait_with_output().expect("waiting for a command");
    let _ = writer.join();
    out
}

/// Polls `probe` until it returns `Some` or `timeout` passes; returns the value and how
/// long it took.
pub fn wait_for<T>(
    timeout: Duration,
    mut probe: impl FnMut() -> Option<T>,
) -> Option<(T, Duration)> {
    let start = Instant::now();
    loop {
        if let Some(value) = probe() {
            return Some((value, start.elapsed()));
        }
        if start.elapsed() > timeout {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// How a waited-for process ended.
#[derive(Debug)]
pub enum Exited {
    Status(ExitStatus),
    /// Gone, but not our child: its status is unknown.
    Unknown,
    TimedOut,
}

/// Waits for `pid` (normally our child through the subreaper) to exit.
pub fn wait_exit(pid: i32, timeout: Duration) -> Exited {
    let deadline = Instant::now() + timeout;
    loop {
        let mut status = 0;
        // SAFETY: waitpid with a valid status pointer.
        let rc = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if rc == pid {
            return Exited::Status(ExitStatus::from_raw(status));
        }
        if rc < 0 {
            // Not our child: poll for the process to disappear (or turn zombie).
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"));
            match stat {
                Err(_) => return Exited::Unknown,
                Ok(s)
                    if s.rsplit(')')
                        .next()
                        .is_some_and(|r| r.trim().starts_with('Z')) =>
                {
                    return Exited::Unknown
                }
                Ok(_) => {}
            }
        }
        if Instant::now() > deadline {
            return Exited::TimedOut;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The names in directory `dir`, sorted: what `ls` shows, read through `readdir(3)`.
pub fn list_dir(dir: &Path) -> Vec<String> {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("listing {dir:?}: {e}"));
    let mut names: Vec<String> = entries
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Whether `path` is a mount point according to /proc/mounts.
pub fn is_mounted(path: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let want = path.to_string_lossy();
    mounts
        .lines()
        .filter_map(|line| line.split(' ').nth(1))
        .any(|field| unescape_mount_field(field) == want)
}

fn unescape_mount_field(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 4 <= bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Environment every command of the tests gets: a fixed git identity and no user or
/// system git configuration, the C locale, no npm update checks.
fn base_env(cmd: &mut Command) {
    cmd.env("LC_ALL", "C")
        .env("GIT_AUTHOR_NAME", "Test")
        .env("GIT_AUTHOR_EMAIL", "test@example.invalid")
        .env("GIT_COMMITTER_NAME", "Test")
        .env("GIT_COMMITTER_EMAIL", "test@example.invalid")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("npm_config_update_notifier", "false")
        .env("npm_config_fund", "false")
        .env("npm_config_audit", "false")
        .env("PYTHONDONTWRITEBYTECODE", "1");
}

/// How long an unmount that finds the mount busy is tried again. A process another test
/// thread is starting holds a copy of this process's descriptors, those of files in
/// this mount included, from its clone until its exec: a moment, but longer on a
/// loaded machine. A mount still busy after this is reported.
const UMOUNT_BUSY_GRACE: Duration = Duration::from_secs(2);

/// `umount MNT`, tried again every few milliseconds while the kernel answers that the
/// mount is busy, for up to [`UMOUNT_BUSY_GRACE`]; the last attempt's output.
fn umount_when_free(mnt: &Path) -> Output {
    let started = Instant::now();
    loop {
        let out = run_cmd(
            Command::new("umount").arg(mnt).env("LC_ALL", "C"),
            "umount",
            Duration::from_secs(60),
        );
        let busy = String::from_utf8_lossy(&out.stderr).contains("target is busy");
        if out.status.success() || !busy || started.elapsed() >= UMOUNT_BUSY_GRACE {
            return out;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `cmd` with a timeout, capturing its output; kills its whole process group if it
/// takes longer. Never panics on a non-zero status; panics on a timeout.
pub fn run_cmd(cmd: &mut Command, what: &str, timeout: Duration) -> Output {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|err| panic!("{what}: cannot start: {err}"));
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stdout.read_to_end(&mut buf);
        buf
    });
    let err_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stderr.read_to_end(&mut buf);
        buf
    });
    let deadline = Instant::now() + timeout;
    let mut timed_out = false;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for a command") {
            break status;
        }
        if Instant::now() > deadline {
            timed_out = true;
            // SAFETY: the child leads its own process group.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            break child.wait().expect("waiting for a killed command");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    // Descendants that kept the pipes open were killed with the group on a timeout; on a
    // normal exit the pipes close when the last writer is gone.
    let out = Output {
        status,
        stdout: out_reader.join().unwrap(),
        stderr: err_reader.join().unwrap(),
    };
    if timed_out {
        panic!(
            "{}",
            describe_failure(&format!("{what} (TIMED OUT after {timeout:?})"), None, &out)
        );
    }
    out
}

/// A failure report: the command, where it ran, its status, stdout and stderr.
pub fn describe_failure(what: &str, cwd: Option<&Path>, out: &Output) -> String {
    let mut text = format!("command failed: {what}\n");
    if let Some(cwd) = cwd {
        text += &format!("  cwd: {}\n", cwd.display());
    }
    text += &format!("  status: {}\n", out.status);
    text += &format!(
        "--- stdout ---\n{}\n--- stderr ---\n{}\n--- end ---",
        tail(&String::from_utf8_lossy(&out.stdout), 16 << 10),
        tail(&String::from_utf8_lossy(&out.stderr), 16 << 10)
    );
    text
}

fn tail(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("[... {start} bytes cut ...]\n{}", &text[start..])
}

/// A bash command (`bash -euo pipefail -c script`) run in `dir` with the test environment.
pub fn bash(dir: &Path, script: &str) -> Command {
    let mut cmd = Command::new("bash");
    cmd.arg("-euo")
        .arg("pipefail")
        .arg("-c")
        .arg(script)
        .current_dir(dir);
    base_env(&mut cmd);
    cmd
}

/// Runs a bash script in `dir` and returns its output, whatever its status.
pub fn try_sh(dir: &Path, script: &str) -> Output {
    run_cmd(&mut bash(dir, script), script, COMMAND_TIMEOUT)
}

/// Runs a bash script in `dir`, asserting success; returns stdout.
pub fn sh(dir: &Path, script: &str) -> String {
    let out = try_sh(dir, script);
    if !out.status.success() {
        panic!("{}", describe_failure(script, Some(dir), &out));
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A `python3 -c script` command run in `dir` with the test environment.
pub fn python(dir: &Path, script: &str) -> Command {
    let mut cmd = Command::new("python3");
    cmd.arg("-c").arg(script).current_dir(dir);
    base_env(&mut cmd);
    cmd
}

/// Runs a python3 script in `dir`, asserting success; returns stdout.
pub fn py(dir: &Path, script: &str) -> String {
    let numbered: Vec<String> = script
        .lines()
        .enumerate()
        .map(|(i, line)| format!("{:4} {line}", i + 1))
        .collect();
    let what = format!("python3 -c <<EOF\n{}\nEOF", numbered.join("\n"));
    let out = run_cmd(&mut python(dir, script), &what, COMMAND_TIMEOUT);
    if !out.status.success() {
        panic!("{}", describe_failure(&what, Some(dir), &out));
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `computerd` with `args`, returning its output whatever its status.
pub fn computerd<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    run_cmd(&mut cmd, "computerd", COMMAND_TIMEOUT)
}

/// Verifies a (not mounted) database: `computerd fs <db> check`, or the library's check
/// if this build has no such command.
pub fn check_db(db: &Path) {
    let out = computerd([
        OsStr::new("fs"),
        db.as_os_str(),
        OsStr::new("check"),
        OsStr::new("--no-progress"),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let unknown_command = out.status.code() == Some(2)
        && (stderr.contains("unrecognized subcommand") || stderr.contains("unexpected argument"));
    if !unknown_command {
        let what = format!("computerd fs {} check --no-progress", db.display());
        if !out.status.success() {
            panic!("{}", describe_failure(&what, None, &out));
        }
        eprintln!("{what}: {}", String::from_utf8_lossy(&out.stdout).trim());
        return;
    }
    eprintln!("`computerd fs check` unavailable; checking with the library");
    let ws = computer_vfs::Workspace::open(
        db,
        computer_vfs::Options {
            create: false,
            ..Default::default()
        },
    )
    .unwrap_or_else(|err| panic!("opening {}: {err}", db.display()));
    let report = ws.check().expect("running check");
    assert!(
        report.is_ok(),
        "check of {} found problems: {:#?} (+{} unlisted)",
        db.display(),
        report.problems,
        report.problems_unlisted
    );
}

/// A manifest of a tree, one line per entry, sorted: relative path, type, permission
/// bits, owner, size, content hash or symlink target, modification time in seconds (not
/// for symlinks), and for files with several links the first path of their link group
/// (found through the inode number).
pub fn manifest(dir: &Path, with_mtime: bool) -> String {
    let script = format!(
        r#"
import hashlib, os, stat, sys
root = sys.argv[1]
with_mtime = {with_mtime}
lines = []
first_of_inode = {{}}
for dirpath, dirnames, filenames in os.walk(root):
    dirnames.sort()
    for name in sorted(dirnames + filenames):
        p = os.path.join(dirpath, name)
        rel = os.path.relpath(p, root)
        st = os.lstat(p)
        kind = stat.S_IFMT(st.st_mode)
        fields = [rel, oct(stat.S_IMODE(st.st_mode)), f"{{st.st_uid}}:{{st.st_gid}}"]
        if stat.S_ISLNK(st.st_mode):
            fields += ["link", os.readlink(p)]
        elif stat.S_ISDIR(st.st_mode):
            fields += ["dir"]
        elif stat.S_ISREG(st.st_mode):
            with open(p, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            fields += ["file", str(st.st_size), digest, f"nlink={{st.st_nlink}}"]
            if st.st_nlink > 1:
                group = first_of_inode.setdefault(st.st_ino, rel)
                fields += [f"group={{group}}"]
        else:
            fields += [f"kind={{kind:o}}"]
        if with_mtime and not stat.S_ISLNK(st.st_mode):
            fields += [f"mtime={{int(st.st_mtime)}}"]
        lines.append(" ".join(fields))
print("\n".join(sorted(lines)))
"#,
        with_mtime = if with_mtime { "True" } else { "False" },
    );
    let mut cmd = python(Path::new("/"), &script);
    cmd.arg(dir);
    let what = format!("manifest of {}", dir.display());
    let out = run_cmd(&mut cmd, &what, COMMAND_TIMEOUT);
    if !out.status.success() {
        panic!("{}", describe_failure(&what, None, &out));
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Asserts two manifests are equal, showing the lines that differ.
pub fn assert_same_manifest(what: &str, expected: &str, actual: &str) {
    if expected == actual {
        return;
    }
    let exp: std::collections::BTreeSet<&str> = expected.lines().collect();
    let act: std::collections::BTreeSet<&str> = actual.lines().collect();
    let missing: Vec<&&str> = exp.difference(&act).collect();
    let extra: Vec<&&str> = act.difference(&exp).collect();
    panic!(
        "{what}: trees differ\n--- only in expected ---\n{}\n--- only in actual ---\n{}",
        missing
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join("\n"),
        extra
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Asserts two texts are equal, showing `diff -u` of them if not.
pub fn assert_same_text(what: &str, expected: &str, actual: &str) {
    if expected == actual {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("expected"), expected).unwrap();
    std::fs::write(dir.path().join("actual"), actual).unwrap();
    let out = try_sh(dir.path(), "diff -U8 expected actual || true");
    panic!(
        "{what}: texts differ\n{}",
        tail(&String::from_utf8_lossy(&out.stdout), 32 << 10)
    );
}

/// Deterministic bytes that do not repeat (so they span several content blocks, and zstd
/// cannot shrink them).
pub fn pseudo_random(len: usize) -> Vec<u8> {
    pseudo_random_seeded(len, 0)
}

/// Like [`pseudo_random`], different for each `seed` (so blocks do not deduplicate).
pub fn pseudo_random_seeded(len: usize, seed: u64) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ seed.wrapping_mul(0x2545_f491_4f6c_dd1d);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A tmpfs of `size` (as `mount -o size=` takes it) on a fresh directory; detached on
/// drop, after the FUSE mount made inside it (declare it first).
pub struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    pub fn mount(size: &str) -> SmallDisk {
        let dir = tempfile::Builder::new()
            .prefix("computerd-small-disk-")
            .tempdir()
            .unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("running mount");
        assert!(status.success(), "mount -t tmpfs failed: {status}");
        SmallDisk { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// A child process, killed and reaped when dropped: a test that fails while it runs
/// leaves nothing behind.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `computerd exec DB EXTRA... -- SCRIPT`.
pub fn exec(db: &Path, extra: &[&str], script: &str) -> Output {
    let mut args: Vec<&str> = vec!["exec", db.to_str().unwrap()];
    args.extend(extra);
    args.extend(["--", script]);
    computerd(args)
}

/// Output bytes as text, lossily.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
