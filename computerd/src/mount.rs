//! `computerd mount <DB> <MOUNTPOINT>`: serve a workspace as a FUSE filesystem.
//!
//! Lifecycle: clear a stale mount left by a killed daemon (ENOTCONN), open (or create)
//! the database, mount, wait until the mount answers, then serve until SIGINT, SIGTERM or
//! an external `umount`; unmount, commit and checkpoint, exit 0.
//!
//! `--daemon` makes scripts independent of timing: the command returns only once the
//! mount answers (exit 0) or has failed (non-zero, with the daemon's error), leaving the
//! daemon running in its own session.

use std::ffi::CString;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use clap::Args;
use computer_runtimes::linux::LocalView;
use computer_runtimes::{Policies, PolicyFile};
use computer_vfs::{Options, Workspace};
use fuser::{Config, MountOption, SessionACL};

use computer_sync::{Follower, SyncOutcome};

use crate::channel::ChannelServer;
use crate::exec_wire::{self, RuntimesSlot};
use crate::fuse::{MountConfig, WorkspaceFs};
use crate::fuse_ring::{RingPlan, RingTransport};
use crate::owner::{self, Holder, OwnerLock, Role};
use crate::poll::RequestPolling;
use crate::replica::{ControlServer, KernelCache, RemoteArgs};

/// Environment variable naming the pipe a daemonised child reports readiness on.
const READY_FD_ENV: &str = "COMPUTERD_READY_FD";
/// `statfs` magic of FUSE filesystems.
const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;
/// How long `--daemon` and the readiness check wait for the mount to answer.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the serving thread looks at the session and the mount table unwoken.
const UNMOUNT_POLL: Duration = Duration::from_millis(250);
/// The signal that wakes the serving thread to look again, sent when the mount table
/// changes.
const LOOK_AGAIN: nix::sys::signal::Signal = nix::sys::signal::Signal::SIGUSR1;
/// How long a replica waits for its first sync before it mounts the cache as it is.
const INITIAL_SYNC_TIMEOUT: Duration = Duration::from_secs(120);

/// How far ahead the kernel reads a file read in sequence, KiB: 1 MiB, the largest FUSE
/// read request (256 pages), instead of the kernel's 128 KiB for a new FUSE mount, so a
/// file outside the page cache arrives in requests the workers decode in parallel
/// (docs/benchmarks.md, "Cold reads of a large file").
const READ_AHEAD_KIB: u32 = 1024;

#[derive(Args, Debug, Clone)]
pub struct MountArgs {
    /// The workspace database (made, and said so, if nothing is at that path). With
    /// --remote, leave it out: the replica lives in --cache.
    #[arg(value_name = "DB")]
    pub first: PathBuf,
    /// Where to mount it (a directory, created if missing).
    #[arg(value_name = "MOUNTPOINT")]
    pub second: Option<PathBuf>,
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Refuse every change (EROFS). The kernel then opens files without asking the
    /// daemon and keeps their pages: warm reads at the page cache's speed.
    #[arg(long)]
    pub read_only: bool,
    /// Mount over a directory that is not empty (its files are hidden while mounted).
    #[arg(long)]
    pub nonempty: bool,
    /// Let users other than the one mounting use the filesystem.
    #[arg(long)]
    pub allow_other: bool,
    /// Return once the mount answers and keep serving in the background.
    #[arg(long)]
    pub daemon: bool,
    /// With --daemon: write the daemon's log here (default: discard).
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
    /// FUSE worker threads (over io_uring: the workers that serve large reads, at most
    /// one fewer than the online CPUs).
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Do not let the kernel cache writes (every write(2) becomes a request). Only used
    /// where passthrough is off or unavailable.
    #[arg(long)]
    pub no_writeback_cache: bool,
    /// Serve every byte through the daemon instead of letting the kernel read and write
    /// staged files directly (FUSE passthrough).
    #[arg(long)]
    pub no_passthrough: bool,
    /// Commit changes to the database in batches at most this many milliseconds old
    /// (0: one transaction per change). fsync always commits at once.
    #[arg(long, default_value_t = 25, value_name = "MS")]
    pub commit_delay_ms: u64,
    /// Keep this much free on the disk holding the database: changes that would store
    /// more fail with ENOSPC first, so the last batch of changes can always be committed
    /// and deletions still work (bytes, or with K, M, G, T; 0: no reserve).
    #[arg(long, default_value = "64M", value_name = "SIZE")]
    pub disk_reserve: String,
    /// At unmount, log how many requests of each kind were served and the time spent.
    #[arg(long)]
    pub op_stats: bool,
    /// Let the kernel ask for the attributes of a listing's entries with its first page
    /// of several hundred only (its own default rule), not with every page: a walk that
    /// only wants names (`find`, `ls`) over a very large directory costs less, one that
    /// stats, opens or deletes what it lists (`du`, `grep -r`, `rm -r`) a LOOKUP per
    /// entry past the first page.
    #[arg(long)]
    pub readdirplus_auto: bool,
    /// Never poll the FUSE device: every worker sleeps until the kernel wakes it. By
    /// default one worker polls once requests have kept coming for about 12 ms, while
    /// the machine has a CPU to spare, which shortens each round trip by about a third.
    #[arg(long)]
    pub no_poll: bool,
    /// Carry FUSE requests over io_uring even where its queue threads get no cpu cgroup
    /// of their own: callers outside the daemon's scheduling group then pay more than
    /// over /dev/fuse. By default requests go over io_uring wherever the kernel offers
    /// it (6.14 or later; the daemon, as root, turns on the kernel's switch) and such a
    /// group can be made in a cgroup v1 cpu hierarchy (on cgroup v2, untested, only with
    /// this option): a queue and a thread per CPU under SCHED_IDLE, each request served
    /// on its caller's CPU, about 13 µs a round trip against 20 (docs/benchmarks.md);
    /// else over /dev/fuse.
    #[arg(long, overrides_with = "no_io_uring")]
    pub io_uring: bool,
    /// Carry FUSE requests over /dev/fuse, never io_uring.
    #[arg(long, overrides_with = "io_uring")]
    pub no_io_uring: bool,
    /// Let the kernel open files without asking the daemon and keep their pages across
    /// opens, as on a read-only mount: a `grep -r` or `cat` of many small files, run
    /// again, costs no round trip per file. In exchange every write(2) reaches the
    /// daemon (no passthrough, no writeback cache), and a written file is committed a
    /// second after its last write rather than at its close. Not on a replica.
    #[arg(long)]
    pub cached_opens: bool,
    /// The policy of the commands this mount runs for `computerd exec`: a TOML file
    /// with [linux], [shell] and [js] tables (docs/RUNTIMES.md). Default: no network,
    /// the default limits.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
}

impl MountArgs {
    /// The database and the mount point: `DB MOUNTPOINT`, or with --remote `MOUNTPOINT`
    /// and the database from --cache.
    fn paths(&self) -> anyhow::Result<(PathBuf, PathBuf)> {
        match (&self.remote.cache, &self.second) {
            (Some(cache), None) => Ok((cache.clone(), self.first.clone())),
            (Some(_), Some(_)) => {
                bail!("with --remote, give only the mount point: the database is --cache's")
            }
            (None, Some(mountpoint)) => Ok((self.first.clone(), mountpoint.clone())),
            (None, None) => bail!("give the database and the mount point"),
        }
    }
}

/// The policy of the commands this mount runs, read before mounting so that a mistake
/// in it stops the mount with its message.
fn exec_policy(args: &MountArgs) -> anyhow::Result<Policies> {
    Ok(PolicyFile::policies_at(args.policy.as_deref())?)
}

pub fn run(args: MountArgs) -> anyhow::Result<ExitCode> {
    args.paths()?;
    if args.remote.remote.is_some() {
        args.remote.retry_policy()?;
    }
    if args.threads == 0 || args.threads > 64 {
        bail!("--threads must be between 1 and 64, not {}", args.threads);
    }
    let ready_fd = std::env::var(READY_FD_ENV)
        .ok()
        .and_then(|v| v.parse::<i32>().ok());
    if ready_fd.is_none() && !args.read_only && args.remote.remote.is_none() {
        // Said here, where the user sees it (a daemon's stderr is its log).
        crate::init::announce_new(&args.paths()?.0);
    }
    if args.daemon && ready_fd.is_none() {
        return spawn_daemon(&args);
    }
    // SAFETY: the fd number came from our parent, which left it open for us alone.
    let ready = ready_fd.map(|fd| unsafe { std::fs::File::from_raw_fd(fd) });
    if ready.is_some() {
        // Our own session: the shell that started `--daemon` may exit.
        let _ = nix::unistd::setsid();
    }
    match serve(&args, ready) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(err) => Err(err),
    }
}

/// Starts this command again as a background daemon and waits for its readiness report.
fn spawn_daemon(args: &MountArgs) -> anyhow::Result<ExitCode> {
    let (read_end, write_end) = nix::unistd::pipe().context("creating the readiness pipe")?;
    let exe = std::env::current_exe().context("finding the computerd binary")?;
    let log = match &args.log_file {
        Some(path) => Stdio::from(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("opening the log file {}", path.display()))?,
        ),
        None => Stdio::null(),
    };
    let log_err = match &args.log_file {
        Some(path) => Stdio::from(std::fs::OpenOptions::new().append(true).open(path)?),
        None => Stdio::null(),
    };
    clear_cloexec(&write_end)?;
    let mut child = Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env(READY_FD_ENV, write_end.as_raw_fd().to_string())
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .spawn()
        .context("starting the daemon")?;
    drop(write_end);
    let mut report = String::new();
    std::fs::File::from(read_end)
        .read_to_string(&mut report)
        .context("waiting for the daemon")?;
    let report = report.trim();
    if report == "ready" {
        println!("{}", child.id());
        return Ok(ExitCode::SUCCESS);
    }
    let status = child.wait().ok();
    if report.is_empty() {
        bail!("the daemon exited before the mount was ready ({status:?})");
    }
    bail!("{report}")
}

fn clear_cloexec(fd: &OwnedFd) -> anyhow::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag};
    fcntl(fd, FcntlArg::F_SETFD(FdFlag::empty())).context("passing the readiness pipe")?;
    Ok(())
}

fn serve(args: &MountArgs, mut ready: Option<std::fs::File>) -> anyhow::Result<()> {
    let result = mount_and_wait(args, &mut ready);
    if let (Err(err), Some(pipe)) = (&result, ready.as_mut()) {
        let _ = writeln!(pipe, "{err:#}");
    }
    result
}

/// Clears a stale mount at `mountpoint`, makes it if missing, and checks it is a
/// directory that mounting would not hide files in. A mount that fails leaves no mount
/// point it made behind: the returned guard removes it unless kept.
fn prepare_mount_point(args: &MountArgs, mountpoint: &Path) -> anyhow::Result<MadeDir> {
    clear_stale_mount(mountpoint)?;
    let made = MadeDir::new(mountpoint)?;
    let meta = std::fs::metadata(mountpoint)
        .with_context(|| format!("{}: cannot use as a mount point", mountpoint.display()))?;
    if !meta.is_dir() {
        bail!("{}: not a directory", mountpoint.display());
    }
    if !args.nonempty && has_entries(mountpoint)? {
        bail!(
            "{}: not empty; mounting would hide its files (--nonempty mounts over them)",
            mountpoint.display()
        );
    }
    Ok(made)
}

fn mount_and_wait(args: &MountArgs, ready: &mut Option<std::fs::File>) -> anyhow::Result<()> {
    // Signals are taken synchronously by this thread; block them before any thread starts
    // so the FUSE workers inherit the mask.
    let signals = termination_signals();
    signals.thread_block().context("blocking signals")?;

    let (db, mountpoint) = args.paths()?;
    let exec_policy = exec_policy(args)?;
    // Held until this function returns, after the last handle on the database closed.
    let mut owner = take_ownership(args, &db, &mountpoint)?;
    let mut made = prepare_mount_point(args, &mountpoint)?;
    let options = workspace_options(args, &db, owner.is_some())?;
    let ws = Workspace::open(&db, options).map_err(crate::fs_error::vfs_err)?;
    // The source names the database by its absolute path: `computerd sync MOUNTPOINT`
    // finds a replica's control socket from it.
    let db = std::path::absolute(&db).unwrap_or(db);

    let kernel = KernelCache::new(ws.clone());
    // Other processes' file commands and execs run here from now on (a replica's cache
    // takes none: its changes must come from the server or through the mount). Execs
    // wait for the mount to answer: their sandboxes see the workspace through it.
    let runtimes = RuntimesSlot::default();
    let channel = match (&mut owner, &args.remote.remote) {
        (Some(owner), None) => {
            let runner = exec_wire::runner_maker(runtimes.clone(), ws.clone());
            let changed = Some(kernel.observer());
            let (server, channel) = ChannelServer::start(&db, ws.clone(), changed, Some(runner))?;
            owner.offer(channel)?;
            Some(server)
        }
        _ => None,
    };
    // A replica catches up before it is mounted, so tools find the tree there when the
    // mount is ready; if the server cannot be reached it serves the cache meanwhile.
    let replica = match &args.remote.remote {
        Some(address) => Some(start_replica(&args.remote, address, &ws, &kernel)?),
        None => None,
    };

    let config = session_config(args, &db);
    // Kept to ask, after the unmount, whether the workspace had to stop taking changes.
    let watched = ws.clone();
    let ring_plan = plan_ring(args);
    let (fs, polling) = workspace_fs(args, ws, &kernel, ring_plan.is_some());
    // A clone shares everything with the session's: the queues serve through it.
    let ring_fs = ring_plan.map(|plan| (plan, fs.clone()));
    let session = start_session(fs, &mountpoint, &config)?;
    let ring = ring_fs.and_then(|(plan, fs)| start_ring(plan, fs, &session, args));
    if let Some(polling) = &polling {
        // Every worker reads the session's own descriptor; a duplicate shares its mode.
        let device = session
            .as_fd()
            .try_clone_to_owned()
            .context("duplicating the FUSE device")?;
        polling.attach(device).context("starting the FUSE poller")?;
    }
    let background = session.spawn().context("starting the FUSE workers")?;
    kernel.attach(background.notifier());
    let control = match &replica {
        Some(replica) => Some(ControlServer::start(
            crate::replica::control_path(&db),
            replica.follower.client(),
        )?),
        None => None,
    };
    wait_until_answering(&mountpoint)?;
    widen_read_ahead(&mountpoint);
    if channel.is_some() {
        start_exec(&runtimes, &mountpoint, exec_policy, &watched, &kernel)?;
    }
    made.keep();
    if let Some(owner) = &mut owner {
        owner.serving(Some(RingTransport::name(ring.as_ref())))?;
    }
    tracing::info!(mountpoint = %mountpoint.display(), "mounted");
    if let Some(mut pipe) = ready.take() {
        let _ = pipe.write_all(b"ready\n");
    }

    let served = serve_until_unmounted(&signals, background, &runtimes, &mountpoint);
    // A newcomer now waits for this process instead of being refused.
    if let Some(owner) = &mut owner {
        owner.finishing();
    }
    drop(channel);
    drop(control);
    stop_transports(polling.as_deref(), ring);
    if let Some(replica) = replica {
        // What the last writers left goes up now; what does not make it in time stays
        // in the cache and syncs at the next mount.
        replica.follower.stop();
    }
    served?;
    if let Some(why) = watched.halted() {
        // Scripts must not take this unmount for a clean one: answered changes are gone.
        bail!(
            "{why}; the workspace stopped taking changes, and the database holds what was \
             committed before"
        );
    }
    Ok(())
}

/// Mounts `fs` and gives it the session's device, which passthrough registrations go
/// through whichever transport answers the open.
fn start_session(
    fs: WorkspaceFs,
    mountpoint: &Path,
    config: &Config,
) -> anyhow::Result<fuser::Session<WorkspaceFs>> {
    let device_slot = fs.device_slot();
    let session = fuser::Session::new(fs, mountpoint, config)
        .with_context(|| format!("mounting {}", mountpoint.display()))?;
    let device = session
        .as_fd()
        .try_clone_to_owned()
        .context("duplicating the FUSE device")?;
    let _ = device_slot.set(Arc::new(device));
    Ok(session)
}

/// The filesystem the kernel will talk to, and the poller of its device if any.
fn workspace_fs(
    args: &MountArgs,
    ws: Workspace,
    kernel: &KernelCache,
    over_ring: bool,
) -> (WorkspaceFs, Option<Arc<RequestPolling>>) {
    let polling = request_polling(args, over_ring);
    let config = mount_config(args, over_ring);
    let fs = WorkspaceFs::new(ws, config, polling.clone(), kernel.kernel_link());
    (fs, polling)
}

/// The poller of the FUSE device, unless told not to poll or the requests travel over
/// io_uring (the device then carries almost nothing).
fn request_polling(args: &MountArgs, over_ring: bool) -> Option<Arc<RequestPolling>> {
    (!args.no_poll && !over_ring).then(|| RequestPolling::new(args.threads))
}

/// After the session ended: back to blocking reads, and the ring's queues joined.
fn stop_transports(polling: Option<&RequestPolling>, ring: Option<RingTransport>) {
    if let Some(polling) = polling {
        polling.stop();
    }
    if let Some(ring) = ring {
        ring.stop();
    }
}

/// Whether requests will travel over io_uring, decided before the mount's INIT asks
/// for it: never with --no-io-uring; with --io-uring wherever the kernel offers it; by
/// default only where the queues also get a cpu cgroup of their own, without which
/// /dev/fuse serves most callers faster.
fn plan_ring(args: &MountArgs) -> Option<RingPlan> {
    if args.no_io_uring {
        return None;
    }
    match RingPlan::prepare(!args.io_uring) {
        Ok(plan) => Some(plan),
        Err(err) if args.io_uring => {
            tracing::warn!("FUSE over io_uring {err}; serving over /dev/fuse");
            None
        }
        Err(err) => {
            tracing::info!("serving over /dev/fuse: FUSE over io_uring {err}");
            None
        }
    }
}

/// Starts the io_uring queues on the session's device, INIT being answered by now, if
/// the kernel agreed to the ring in it. On failure the mount goes on over /dev/fuse.
fn start_ring(
    plan: RingPlan,
    fs: WorkspaceFs,
    session: &fuser::Session<WorkspaceFs>,
    args: &MountArgs,
) -> Option<RingTransport> {
    if !fs.ring_agreed() {
        // Said in INIT (`fuse.rs`).
        return None;
    }
    let owner_only = (!args.allow_other).then(|| nix::unistd::geteuid().as_raw());
    let started = session
        .as_fd()
        .try_clone_to_owned()
        .and_then(|device| RingTransport::start(plan, fs, device, owner_only, args.threads));
    match started {
        Ok(ring) => Some(ring),
        Err(err) => {
            tracing::warn!("FUSE over io_uring did not start ({err}); serving over /dev/fuse");
            None
        }
    }
}

/// How the filesystem answers requests, as the arguments say.
fn mount_config(args: &MountArgs, over_ring: bool) -> MountConfig {
    MountConfig {
        read_only: args.read_only,
        replica: args.remote.remote.is_some(),
        writeback_cache: !args.no_writeback_cache,
        passthrough: !args.no_passthrough,
        op_stats: args.op_stats,
        readdirplus_auto: args.readdirplus_auto,
        io_uring: over_ring,
        cached_opens: args.cached_opens,
        kernel_checks_permissions: crate::fuse::kernel_checks_permissions(
            args.allow_other,
            args.cached_opens,
        ),
    }
}

/// The FUSE session's settings for a mount of `db`.
fn session_config(args: &MountArgs, db: &Path) -> Config {
    let mut config = Config::default();
    config.n_threads = Some(args.threads);
    // One descriptor for all workers (the kernel queues requests once either way), so
    // that the poller switches them all (poll.rs); cloned descriptors measured no
    // different.
    config.clone_fd = false;
    config.acl = if args.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.mount_options = vec![
        // What `computerd umount` and `status` find it by (`mounts.rs`).
        MountOption::FSName(format!("{}{}", crate::mounts::SOURCE_PREFIX, db.display())),
        MountOption::Subtype("computer".into()),
        crate::fuse::permission_option(args.allow_other, args.cached_opens),
        if args.read_only {
            MountOption::RO
        } else {
            MountOption::RW
        },
    ];
    config
}

/// Joins a session whose mount the kernel already took down (`umount` from outside).
///
/// Dropping a fuser 0.18 session unmounts its mount point unless the connection is
/// gone, and its check reads a connection the kernel aborted as alive; so it would
/// unmount whatever is mounted at that path by now, such as the next `computerd mount`
/// of the same point. The session is forgotten instead of dropped: this process is about
/// to exit, and its device descriptor goes with it.
/// Serves until a signal asks for the unmount (then unmounts) or the mount point goes
/// from outside. A warm sandbox holds a view of the mount in its own namespace, so the
/// session would not end when the mount point goes: the mount table tells, and the
/// sandbox goes first.
fn serve_until_unmounted(
    signals: &nix::sys::signal::SigSet,
    background: fuser::BackgroundSession,
    runtimes: &RuntimesSlot,
    mountpoint: &Path,
) -> anyhow::Result<()> {
    let mounted_at = computer_vfs::real_path(mountpoint);
    wake_when_mounts_change();
    loop {
        // Else woken by LOOK_AGAIN, or by none within UNMOUNT_POLL: look.
        let asked = wait_signal(signals, UNMOUNT_POLL).filter(|&s| s != LOOK_AGAIN as i32);
        if let Some(signal) = asked {
            tracing::info!("received signal {signal}, unmounting");
            close_runtimes(runtimes);
            return background.umount_and_join().context("unmounting");
        }
        if background.guard.is_finished() || !crate::mounts::is_mount_point(&mounted_at) {
            tracing::info!("unmounted from outside");
            close_runtimes(runtimes);
            return join_unmounted(background);
        }
    }
}

/// Lets the mount run the commands asked of it: the Linux backend over the mount itself,
/// the shell on the store (what it changes, the kernel forgets).
fn start_exec(
    runtimes: &RuntimesSlot,
    mountpoint: &Path,
    policies: Policies,
    ws: &Workspace,
    kernel: &KernelCache,
) -> anyhow::Result<()> {
    let local = Arc::new(LocalView::new(mountpoint));
    let made = exec_wire::owner_runtimes(local, policies, ws, Some(kernel.observer()))?;
    let _ = runtimes.set(made);
    Ok(())
}

/// Ends the commands this mount runs and their sandboxes, before the unmount.
fn close_runtimes(runtimes: &RuntimesSlot) {
    if let Some(runtimes) = runtimes.get() {
        runtimes.close(RUNTIMES_CLOSE_WAIT);
    }
}

/// How long an unmount waits for the commands it killed to end.
const RUNTIMES_CLOSE_WAIT: Duration = Duration::from_secs(10);

fn join_unmounted(mut background: fuser::BackgroundSession) -> anyhow::Result<()> {
    let placeholder = std::thread::spawn(|| Ok(()));
    let session = std::mem::replace(&mut background.guard, placeholder);
    std::mem::forget(background);
    match session.join() {
        Ok(served) => served.context("stopping the FUSE workers"),
        Err(_) => bail!("the FUSE session thread panicked"),
    }
}

/// Takes the database's owner lock for this mount, waiting for an owner that is
/// finishing (the previous mount of it, still committing after its unmount) or is a file
/// command; refuses when another mount or server holds it. `None` for a read-only mount
/// on read-only media, where no lock can be made and nobody can write.
fn take_ownership(
    args: &MountArgs,
    db: &Path,
    mountpoint: &Path,
) -> anyhow::Result<Option<OwnerLock>> {
    let holder = Holder::me(Role::Mount {
        mountpoint: computer_vfs::real_path(mountpoint),
        replica: args.remote.remote.is_some(),
    });
    match OwnerLock::acquire(db, holder, args.read_only, Holder::will_leave)? {
        Ok(lock) => Ok(lock),
        Err(other) => Err(owner::held_error(db, &other)),
    }
}

/// Whether the directory at `path` holds anything.
fn has_entries(path: &Path) -> anyhow::Result<bool> {
    let mut entries = std::fs::read_dir(path)
        .with_context(|| format!("{}: cannot list the mount point", path.display()))?;
    Ok(entries.next().is_some())
}

/// A mount point this mount made (with any missing parents), removed again unless
/// kept: a mount that fails leaves nothing behind.
struct MadeDir {
    /// The directories made, the deepest last.
    made: Vec<PathBuf>,
}

impl MadeDir {
    fn new(path: &Path) -> anyhow::Result<MadeDir> {
        let mut missing = Vec::new();
        let mut at = Some(path);
        while let Some(dir) = at.filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
            missing.push(dir.to_owned());
            at = dir.parent();
        }
        missing.reverse();
        let mut made = MadeDir { made: Vec::new() };
        for dir in missing {
            std::fs::create_dir(&dir)
                .with_context(|| format!("{}: cannot create the mount point", dir.display()))?;
            made.made.push(dir);
        }
        Ok(made)
    }

    fn keep(&mut self) {
        self.made.clear();
    }
}

impl Drop for MadeDir {
    fn drop(&mut self) {
        for dir in self.made.iter().rev() {
            // Only if still empty: whatever someone put there stays.
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// A replica's sync loop.
struct ReplicaMount {
    follower: Follower,
}

fn start_replica(
    remote: &RemoteArgs,
    address: &str,
    ws: &Workspace,
    kernel: &KernelCache,
) -> anyhow::Result<ReplicaMount> {
    let options = remote.follow_options(address, ws)?;
    let follower = Follower::start(ws.clone(), options, Some(kernel.observer()))
        .context("starting the sync loop")?;
    match follower.sync(INITIAL_SYNC_TIMEOUT) {
        SyncOutcome::Complete { report, .. } => tracing::info!(
            pulled = report.pulled,
            pushed = report.pushed,
            "replica caught up with {address}"
        ),
        SyncOutcome::Pending { reason, .. } => {
            tracing::warn!("{address}: not synced yet ({reason}); serving the cache and retrying")
        }
        SyncOutcome::Lost { reason, .. } | SyncOutcome::Refused { reason, .. } => {
            bail!("{address}: {reason}")
        }
    }
    Ok(ReplicaMount { follower })
}

/// The signals the serving thread waits for: the three that ask for the unmount, and
/// [`LOOK_AGAIN`].
fn termination_signals() -> nix::sys::signal::SigSet {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGHUP);
    set.add(LOOK_AGAIN);
    set
}

/// Wakes the serving thread (this one) whenever this namespace's mount table changes,
/// which the kernel tells a poll of `/proc/self/mountinfo` with POLLPRI: an unmount
/// from outside is noticed at once, also when it ends no session (a sandbox's view of
/// the mount keeps it alive). The watching thread lives until the process exits.
fn wake_when_mounts_change() {
    // SAFETY: pthread_self has no preconditions.
    let serving = unsafe { libc::pthread_self() };
    let table = match std::fs::File::open("/proc/self/mountinfo") {
        Ok(table) => table,
        Err(err) => return tracing::debug!("not watching the mount table: {err}"),
    };
    let watch = move || loop {
        let mut ready = libc::pollfd {
            fd: table.as_raw_fd(),
            events: libc::POLLPRI,
            revents: 0,
        };
        // SAFETY: one valid pollfd; each poll re-arms the table's change event.
        let rc = unsafe { libc::poll(&mut ready, 1, -1) };
        let failed =
            rc < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted;
        if failed || ready.revents & libc::POLLNVAL != 0 {
            return;
        }
        if rc > 0 {
            // SAFETY: the serving thread is the process's; it ends with the process.
            unsafe { libc::pthread_kill(serving, LOOK_AGAIN as i32) };
        }
    };
    if let Err(err) = std::thread::Builder::new()
        .name("mount-watch".into())
        .spawn(watch)
    {
        tracing::debug!("not watching the mount table: {err}");
    }
}

fn wait_signal(set: &nix::sys::signal::SigSet, timeout: Duration) -> Option<i32> {
    let spec = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as _,
    };
    // SAFETY: `set` is a valid sigset and `spec` a valid timespec; no siginfo is requested.
    let signal = unsafe { libc::sigtimedwait(set.as_ref(), std::ptr::null_mut(), &spec) };
    (signal > 0).then_some(signal)
}

/// Where the staging files of the workspace at `db` live: beside the file SQLite
/// opens, on the same disk, whatever name of it `db` is.
pub fn staging_dir(db: &Path) -> PathBuf {
    let mut name = computer_vfs::real_path(db).into_os_string();
    name.push(".staging");
    PathBuf::from(name)
}

/// A daemon killed with SIGKILL leaves its mount point answering ENOTCONN (or, over
/// io_uring while the kernel takes the dead daemon's queues down, ECONNABORTED or
/// ECANCELED); detach it.
pub fn clear_stale_mount(mountpoint: &Path) -> anyhow::Result<()> {
    if !is_stale_mount(mountpoint) {
        return Ok(());
    }
    tracing::warn!(mountpoint = %mountpoint.display(), "clearing a stale mount");
    let path = CString::new(mountpoint.as_os_str().as_bytes())?;
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } != 0 {
        let err = std::io::Error::last_os_error();
        bail!(
            "{}: clearing the stale mount failed: {err}",
            mountpoint.display()
        );
    }
    Ok(())
}

/// Whether `mountpoint` is a FUSE mount whose daemon is gone. `stat` alone cannot tell:
/// the kernel answers it from the root's cached attributes (valid for the attribute TTL)
/// without asking anyone, while `statfs` always goes to the daemon.
pub(crate) fn is_stale_mount(mountpoint: &Path) -> bool {
    const GONE: [i32; 3] = [libc::ENOTCONN, libc::ECONNABORTED, libc::ECANCELED];
    let gone = |errno: Option<i32>| errno.is_some_and(|errno| GONE.contains(&errno));
    match std::fs::metadata(mountpoint) {
        Err(err) => gone(err.raw_os_error()),
        Ok(meta) if !meta.is_dir() => false,
        Ok(_) => match nix::sys::statfs::statfs(mountpoint) {
            Err(errno) => gone(Some(errno as i32)),
            Ok(_) => false,
        },
    }
}

/// How the mount opens its workspace; `owner_held`: this process holds the owner lock.
fn workspace_options(args: &MountArgs, db: &Path, owner_held: bool) -> anyhow::Result<Options> {
    let disk_reserve_bytes = crate::fs_format::parse_size(&args.disk_reserve).ok_or_else(|| {
        anyhow!(
            "--disk-reserve {}: expected bytes, optionally with K, M, G or T",
            args.disk_reserve
        )
    })?;
    Ok(Options {
        disk_reserve_bytes,
        // Only where nothing is: an existing file that is not a workspace is an error.
        create: !args.read_only && db.symlink_metadata().is_err(),
        read_only: args.read_only,
        // The owner lock keeps every other computerd from writing it.
        no_other_writer: owner_held,
        staging_dir: (!args.read_only).then(|| staging_dir(db)),
        commit_delay: (args.commit_delay_ms > 0)
            .then(|| Duration::from_millis(args.commit_delay_ms)),
        ..Options::default()
    })
}

/// Sets the mount's read-ahead to [`READ_AHEAD_KIB`] through its backing device info in
/// sysfs. The FUSE INIT reply can only lower the kernel's default, and only root may
/// write sysfs: another user's mount keeps the default, which is slower, not wrong.
fn widen_read_ahead(mountpoint: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(dev) = std::fs::metadata(mountpoint).map(|meta| meta.dev()) else {
        return;
    };
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let knob = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
    if let Err(err) = std::fs::write(&knob, READ_AHEAD_KIB.to_string()) {
        tracing::info!("read-ahead stays at the kernel's default ({knob}: {err})");
    }
}

/// Waits until `mountpoint` is a FUSE filesystem that answers `stat`.
fn wait_until_answering(mountpoint: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let path = CString::new(mountpoint.as_os_str().as_bytes())?;
    loop {
        let mut out: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: valid path and output buffer.
        let rc = unsafe { libc::statfs(path.as_ptr(), &mut out) };
        if rc == 0 && out.f_type as i64 == FUSE_SUPER_MAGIC && std::fs::metadata(mountpoint).is_ok()
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{}: the mount did not answer within {READY_TIMEOUT:?}",
                mountpoint.display()
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
