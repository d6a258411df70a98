//! `computerd exec DB -- CMD...`: runs a command on a workspace through the runtimes'
//! exec spine, streams its output as it comes and exits with its code.
//!
//! On a database the command goes to the workspace's owner, over the owner's channel
//! (the `runner` of its Cap'n Proto session), and the owner runs it:
//! - a running mount of the database runs it in its sandbox, which sees the workspace
//!   through that mount and stays warm between commands; `--policy` belongs to the
//!   mount then (`computerd mount --policy`), not to this command;
//! - on a free database this command starts that owner itself, a mount in a private
//!   directory with the policy given here, and takes it down afterwards, returning once
//!   that daemon finished with the database.
//!
//! Either way the sandbox writes into the authoritative workspace itself, so a finished
//! command's writes are there (sync outcome: complete), and the owner keeps the exec's
//! record in the workspace's audit trail. Output arrives by long-polled `events` calls;
//! a signal to this command (Ctrl-C, SIGTERM) becomes a `kill` of the exec.
//!
//! With `--remote ADDR` the command goes to the server at ADDR the same way, with the
//! server's token: `computerd serve` runs it in its sandbox over a replica of its own,
//! kept warm between commands. With `--remote ADDR --replica` it runs here instead, in a
//! sandbox over a replica mount of the served workspace (its cache in a private
//! directory, or `--cache DB`), synced with the server before the command (or it does
//! not run) and after it (complete, pending or lost).

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use computer_runtimes::js::JS_BACKEND_ID;
use computer_runtimes::linux::{LinuxBackend, LinuxPolicy, WorkspaceView, SANDBOX_WORKSPACE};
use computer_runtimes::{
    Event, ExecOptions, ExecResult, ExecStatus, PolicyFile, Runtimes, Stream, SyncOutcome,
};
use computer_sync::rpc::Address;

use crate::exec_wire;
use crate::fs_files::RemoteFiles;
use crate::owner::{self, Role};
use crate::replica::SyncArgs;

/// Exit status when the command ran but its writes have not all reached the
/// workspace yet (EX_TEMPFAIL, as `computerd sync`).
const EXIT_PENDING: u8 = 75;
/// The most of this command's own stdin handed to the command, bytes.
const STDIN_BYTES_MAX: u64 = 64 << 20;
/// How long the mount made for one command may take to let go of the database.
pub(crate) const UNMOUNT_WAIT: Duration = owner::OWNER_WAIT;
/// How long the end of a command waits for its sandbox to go.
const CLOSE_WAIT: Duration = Duration::from_secs(10);
/// Names tried for a private directory before giving up.
const PRIVATE_DIR_TRIES: u32 = 100;
/// The longest wait for a replica's sync with its server, before and after a command.
const SYNC_WAIT: Duration = Duration::from_secs(60);

#[derive(clap::Args, Debug)]
pub struct ExecArgs {
    /// The workspace database (or give --remote).
    #[arg(
        value_name = "DB",
        required_unless_present = "remote",
        conflicts_with = "remote"
    )]
    db: Option<PathBuf>,
    /// Run on the workspace served at ADDR (a Unix socket path, or tcp:HOST:PORT): the
    /// server runs the command, in its sandbox over a replica it keeps warm.
    #[arg(long, value_name = "ADDR")]
    remote: Option<String>,
    /// With --remote: run the command here instead, in a sandbox over a replica mount of
    /// the served workspace, synced before and after the command.
    #[arg(long, requires = "remote")]
    replica: bool,
    /// With --remote: the file holding the server's token (else $COMPUTERD_TOKEN).
    #[arg(long, value_name = "FILE", requires = "remote")]
    token_file: Option<PathBuf>,
    /// With --replica: keep the replica in this database, so that the next exec starts
    /// from it (default: a fresh one, removed once the command's changes are synced).
    #[arg(long, value_name = "DB", requires = "replica")]
    cache: Option<PathBuf>,
    /// The backend to run it: `linux` (a sandbox; the default), `shell` (bash inside
    /// the daemon, on the store), `auto` (the shell if it can run the script, else
    /// Linux) or `js` (CMD is the source of an ES module; its default export's value is
    /// printed as one line of JSON).
    #[arg(long, value_name = "ID")]
    backend: Option<String>,
    /// With --backend js: the JSON the module's default export gets (else stdin's).
    #[arg(long, value_name = "JSON")]
    input: Option<String>,
    /// With --backend js: run the module at this workspace path instead of CMD.
    #[arg(long, value_name = "WORKSPACE_PATH", conflicts_with = "command")]
    file: Option<String>,
    /// Working directory inside the workspace (default: its root).
    #[arg(long, value_name = "DIR")]
    cwd: Option<String>,
    /// Seconds after which the command's processes get SIGTERM, and SIGKILL 3 s later.
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<f64>,
    /// A variable for the command's environment (repeatable). Nothing of this
    /// process's own environment reaches the command.
    #[arg(long = "env", value_name = "NAME=VALUE")]
    env: Vec<String>,
    /// The sandbox's policy: a TOML file with [linux], [shell] and [js] tables
    /// (docs/RUNTIMES.md). Not for a
    /// workspace mounted or served, whose owner's policy applies.
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// The command, run by bash; its words are joined by spaces, as ssh joins them.
    #[arg(last = true, required_unless_present = "file", value_name = "CMD")]
    command: Vec<String>,
}

pub fn run(args: ExecArgs) -> anyhow::Result<ExitCode> {
    let options = ExecOptions {
        backend: args.backend.clone(),
        cwd: args.cwd.clone(),
        stdin: match &args.input {
            Some(input) => Some(module_input(input)?),
            None => own_stdin()?,
        },
        env: parse_env(&args.env)?,
        timeout: timeout(args.timeout)?,
        id: None,
        caller: None,
    };
    let script = script(&args)?;
    match (&args.remote, args.db.as_deref()) {
        (Some(address), _) if args.replica => {
            let policy = PolicyFile::linux_policy_at(args.policy.as_deref())?;
            let replica = Arc::new(ReplicaView::mount(address, &args)?);
            let result = run_in(replica.clone(), policy, &script, options);
            replica.finish(result.as_ref().ok())?;
            Ok(report(&result?, None))
        }
        (Some(address), _) => {
            if let Some(policy) = &args.policy {
                bail!(
                    "--policy {}: the server's policy applies to the commands it runs \
                     (computerd serve --policy); with --replica the command runs here",
                    policy.display()
                );
            }
            let waiter = match &args.token_file {
                Some(file) => format!("--remote {address} --token-file {}", file.display()),
                None => format!("--remote {address}"),
            };
            let address = crate::remote::address(address)?;
            let token = crate::remote::read_token(args.token_file.as_deref())?;
            let result = run_on_owner(&address, &token, &script, &options)?;
            Ok(report(&result, Some(&waiter)))
        }
        (None, Some(db)) => {
            let owner = Owner::for_db(db, args.policy.as_deref())?;
            let address = Address::Unix(owner.channel.socket.clone());
            let token = owner.channel.token.as_bytes();
            let result = run_on_owner(&address, token, &script, &options);
            owner.finish()?;
            Ok(report(
                &result?,
                Some(&format!("--workspace {}", db.display())),
            ))
        }
        (None, None) => unreachable!("clap requires DB or --remote"),
    }
}

/// Runs `script` in the process that owns the workspace, at `address`, and streams its
/// output to ours. A signal to this process is passed on to the command.
fn run_on_owner(
    address: &Address,
    token: &[u8],
    script: &str,
    options: &ExecOptions,
) -> anyhow::Result<ExecResult> {
    let signals = termination_signals();
    signals.thread_block().context("blocking signals")?;
    let files = RemoteFiles::connect(address, token)?;
    let upstream = files.upstream().clone();
    let (to_kill, mut kills) = tokio::sync::mpsc::unbounded_channel::<i32>();
    std::thread::spawn(move || {
        while let Ok(signal) = signals.wait() {
            if to_kill.send(signal as i32).is_err() {
                return;
            }
        }
    });
    let ran = files.block_on(async move {
        let runner = upstream.runner().await?;
        let mut request = runner.exec_request();
        exec_wire::write_request(script, options, request.get().init_request());
        let answer = upstream.answer(request.send().promise).await?;
        let exec = answer.get()?.get_exec()?;
        let (killer, link) = (exec.clone(), upstream.clone());
        let _passing = tokio::task::spawn_local(async move {
            while let Some(signal) = kills.recv().await {
                let mut request = killer.kill_request();
                request.get().set_signal(signal);
                if let Err(err) = link.answer(request.send().promise).await {
                    tracing::warn!("passing signal {signal} on to the command: {err}");
                }
            }
        });
        let mut output = Output::default();
        let show = |event: Event| {
            output.show(&event);
            std::future::ready(())
        };
        exec_wire::follow(&upstream, &exec, show).await
    });
    ran.map_err(|err| owner_call_error(address, err))
}

/// A failed call to the owner's runner, said for the user: the owner's refusal as it
/// says it, a broken connection with its address.
pub(crate) fn owner_call_error(address: &Address, err: anyhow::Error) -> anyhow::Error {
    match err.downcast::<computer_sync::Error>() {
        Ok(computer_sync::Error::File { message, .. }) => anyhow!(message),
        Ok(err) => crate::fs_files::connection_error(address, err),
        Err(err) => err,
    }
}

/// `computerd sync --remote ADDR|--workspace DB --intent INTENT`, if the arguments name
/// an owner to wait at rather than a replica mount of this machine.
pub fn run_wait_sync(args: &SyncArgs) -> Option<anyhow::Result<ExitCode>> {
    let owner = result_owner(args)?;
    let intent = args.intent.as_deref().expect("clap requires --intent");
    let timeout = Duration::from_secs(args.timeout);
    Some(wait_on_owner(owner, intent, timeout).map(|outcome| report_result_sync(&outcome)))
}

/// The owner a pending exec result is waited on at, if the arguments name one.
fn result_owner(args: &SyncArgs) -> Option<ResultOwner<'_>> {
    match (&args.remote, &args.workspace) {
        (Some(address), _) => Some(ResultOwner::Remote {
            address,
            token_file: args.token_file.as_deref(),
        }),
        (None, Some(db)) => Some(ResultOwner::Workspace(db)),
        (None, None) => None,
    }
}

/// The outcome of waiting on an exec result's sync, said as `computerd sync` says its
/// own: exit 0 complete, 75 still pending, 1 lost.
fn report_result_sync(outcome: &SyncOutcome) -> ExitCode {
    match outcome {
        SyncOutcome::Complete => {
            println!("synced");
            ExitCode::SUCCESS
        }
        SyncOutcome::Pending { intent, reason } => {
            eprintln!("computerd: sync pending: {reason} (intent {intent}); wait again later");
            ExitCode::from(EXIT_PENDING)
        }
        SyncOutcome::Lost { reason } => {
            eprintln!("computerd: sync lost: {reason}");
            ExitCode::FAILURE
        }
    }
}

/// Where a pending exec result's sync is waited on: the server at an address, or the
/// owner of a database here.
pub(crate) enum ResultOwner<'a> {
    Remote {
        address: &'a str,
        token_file: Option<&'a Path>,
    },
    Workspace(&'a Path),
}

/// Asks the owner that ran a command to wait up to `timeout` for the writes of its
/// pending result (`intent`, as the result named it) to reach the workspace.
pub(crate) fn wait_on_owner(
    owner: ResultOwner<'_>,
    intent: &str,
    timeout: Duration,
) -> anyhow::Result<SyncOutcome> {
    // Said here, before any connection, when it cannot be an intent at all.
    let intent: computer_sync::Intent = intent.parse().map_err(|why: String| anyhow!(why))?;
    let (address, token) = match owner {
        ResultOwner::Remote {
            address,
            token_file,
        } => (
            crate::remote::address(address)?,
            crate::remote::read_token(token_file)?,
        ),
        ResultOwner::Workspace(db) => {
            let channel = Owner::running(db)?;
            (Address::Unix(channel.socket), channel.token.into_bytes())
        }
    };
    let files = RemoteFiles::connect(&address, &token)?;
    let upstream = files.upstream().clone();
    let wait_ms = timeout.as_millis().min(u32::MAX as u128) as u32;
    let intent = intent.to_string();
    let waited = files.block_on(async move {
        let runner = upstream.runner().await?;
        let mut request = runner.wait_sync_request();
        request.get().set_intent(&intent);
        request.get().set_wait_ms(wait_ms);
        let answer = upstream.answer(request.send().promise).await?;
        Ok::<_, anyhow::Error>(exec_wire::read_wait_sync(answer.get()?)?)
    });
    waited.map_err(|err| owner_call_error(&address, err))
}

/// Runs `script` with the sandbox over `view` and streams its output to ours.
fn run_in(
    view: Arc<dyn WorkspaceView>,
    policy: LinuxPolicy,
    script: &str,
    options: ExecOptions,
) -> anyhow::Result<ExecResult> {
    let mut runtimes = Runtimes::new();
    runtimes.register(Arc::new(LinuxBackend::new(view, policy)))?;
    let runtimes = Arc::new(runtimes);
    // Before any thread starts, so that all inherit the mask: a signal to this process
    // is passed on to the command, and the bracket still ends (a mount made for the
    // command is taken down).
    let signals = termination_signals();
    signals.thread_block().context("blocking signals")?;
    let mut handle = runtimes.exec(script, options)?;
    pass_signals_on(signals, runtimes.clone(), handle.id().to_owned());
    let mut output = Output::default();
    for event in handle.by_ref() {
        output.show(&event);
    }
    // The sandbox's view of the replica mount must go before the mount can.
    runtimes.close(CLOSE_WAIT);
    Ok(handle.result())
}

/// Where a command's output goes: ours.
struct Output {
    stdout: std::io::Stdout,
    stderr: std::io::Stderr,
}

impl Default for Output {
    fn default() -> Output {
        Output {
            stdout: std::io::stdout(),
            stderr: std::io::stderr(),
        }
    }
}

impl Output {
    fn show(&mut self, event: &Event) {
        // A closed stdout (`| head`) must not stop the command's bracket: keep reading.
        match event {
            Event::Output {
                stream: Stream::Stdout,
                data,
                ..
            } => {
                let _ = self
                    .stdout
                    .write_all(data)
                    .and_then(|()| self.stdout.flush());
            }
            Event::Output { data, .. } => {
                let _ = self.stderr.write_all(data);
            }
            Event::Missed { first, next } => {
                eprintln!(
                    "computerd: output chunks {first} to {} were dropped",
                    next - 1
                );
            }
            Event::Exit { .. } => {}
        }
    }
}

fn termination_signals() -> nix::sys::signal::SigSet {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    for signal in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(signal);
    }
    set
}

fn pass_signals_on(signals: nix::sys::signal::SigSet, runtimes: Arc<Runtimes>, id: String) {
    std::thread::spawn(move || {
        while let Ok(signal) = signals.wait() {
            if let Err(err) = runtimes.kill(&id, signal as i32) {
                tracing::warn!("passing {signal} on to the command: {err}");
            }
        }
    });
}

/// Says on stderr what the exit code alone does not, and picks the exit code. `waiter`
/// names the owner that a pending sync can be waited on at (`computerd sync` options).
fn report(result: &ExecResult, waiter: Option<&str>) -> ExitCode {
    if let Some(value) = &result.value {
        println!("{value}");
    }
    if let Some(error) = &result.error {
        eprintln!("computerd: {error}");
    }
    if result.status == ExecStatus::TimedOut {
        eprintln!(
            "computerd: timed out after {:.1}s",
            result.duration.as_secs_f64()
        );
    }
    match &result.sync {
        SyncOutcome::Complete => ExitCode::from(result.exit_code.clamp(0, 255) as u8),
        SyncOutcome::Pending { intent, reason } => {
            eprintln!(
                "computerd: the command's changes are not all in the workspace yet: {intent} \
                 ({reason})"
            );
            if let Some(waiter) = waiter {
                eprintln!(
                    "computerd: wait for them with: computerd sync {waiter} --intent {intent}"
                );
            }
            ExitCode::from(EXIT_PENDING)
        }
        SyncOutcome::Lost { reason } => {
            eprintln!("computerd: the command's changes were lost: {reason}");
            ExitCode::FAILURE
        }
    }
}

/// The script: the command's words, or for `--file` a module that re-exports the
/// workspace module's default (its relative imports then resolve from its own place).
fn script(args: &ExecArgs) -> anyhow::Result<String> {
    let js = args.backend.as_deref() == Some(JS_BACKEND_ID);
    if (args.input.is_some() || args.file.is_some()) && !js {
        bail!("--input and --file are for --backend js");
    }
    Ok(match &args.file {
        Some(path) => {
            let path = computer_runtimes::normalize_cwd(path)
                .map_err(|_| anyhow!("--file {path}: not a path inside the workspace"))?;
            let quoted = serde_json::to_string(&format!("{SANDBOX_WORKSPACE}{path}"))?;
            format!("export {{ default }} from {quoted};\n")
        }
        None => args.command.join(" "),
    })
}

/// `--input`, checked to be JSON before anything runs.
fn module_input(input: &str) -> anyhow::Result<Vec<u8>> {
    serde_json::from_str::<serde_json::Value>(input)
        .map_err(|err| anyhow!("--input: not JSON: {err}"))?;
    Ok(input.as_bytes().to_vec())
}

/// Our stdin for the command when it is a pipe or a file; a terminal's is not read.
fn own_stdin() -> anyhow::Result<Option<Vec<u8>>> {
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        return Ok(None);
    }
    let mut bytes = Vec::new();
    stdin
        .lock()
        .take(STDIN_BYTES_MAX + 1)
        .read_to_end(&mut bytes)
        .context("reading stdin")?;
    if bytes.len() as u64 > STDIN_BYTES_MAX {
        bail!(
            "stdin: more than {} MiB; pass a file in the workspace instead",
            STDIN_BYTES_MAX >> 20
        );
    }
    Ok(Some(bytes))
}

fn parse_env(pairs: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    pairs
        .iter()
        .map(|pair| match pair.split_once('=') {
            Some((name, value)) if !name.is_empty() => Ok((name.to_owned(), value.to_owned())),
            _ => Err(anyhow!("--env {pair:?}: expected NAME=VALUE")),
        })
        .collect()
}

fn timeout(seconds: Option<f64>) -> anyhow::Result<Option<Duration>> {
    seconds
        .map(|s| {
            Duration::try_from_secs_f64(s).map_err(|_| anyhow!("--timeout {s}: not a duration"))
        })
        .transpose()
}

/// The process that runs the command: the database's running mount, or a mount made
/// for this command in a private directory.
pub(crate) struct Owner {
    channel: owner::Channel,
    /// The mount made for the command: its mount point and private directory.
    own: Option<(PathBuf, PathBuf)>,
}

impl Owner {
    pub(crate) fn for_db(db: &Path, policy: Option<&Path>) -> anyhow::Result<Owner> {
        if !db.exists() {
            bail!(
                "{}: no such workspace database (computerd init makes one)",
                db.display()
            );
        }
        if owner::is_held(db) {
            if let Some(policy) = policy {
                bail!(
                    "--policy {}: {} is mounted or served, and its owner's policy applies \
                     (computerd mount --policy, computerd serve --policy)",
                    policy.display(),
                    db.display()
                );
            }
            return Ok(Owner {
                channel: Self::running(db)?,
                own: None,
            });
        }
        Self::mount(db, policy)
    }

    /// The channel of the running mount or server of `db`.
    fn running(db: &Path) -> anyhow::Result<owner::Channel> {
        if !owner::is_held(db) {
            bail!("{}: not mounted or served here", db.display());
        }
        let holder = owner::read_holder(&owner::owner_path(db)).ok_or_else(|| {
            anyhow!(
                "{}: in use by a process that does not say who it is",
                db.display()
            )
        })?;
        match (&holder.role, &holder.channel) {
            (Role::Mount { replica: false, .. } | Role::Serve { .. }, Some(channel)) => {
                Ok(channel.clone())
            }
            _ => bail!(
                "{}: in use by {holder}; exec runs on a database mounted or served here, \
                 or free",
                db.display()
            ),
        }
    }

    fn mount(db: &Path, policy: Option<&Path>) -> anyhow::Result<Owner> {
        if let Some(policy) = policy {
            // Here, so that a mistake in it is said in one line, not as a failed mount.
            PolicyFile::load(policy)?;
        }
        let dir = private_dir()?;
        let mountpoint = dir.join("workspace");
        let mut mount = Command::new(std::env::current_exe().context("finding computerd")?);
        mount
            .arg("mount")
            .args([db.as_os_str(), mountpoint.as_os_str()])
            .args(["--daemon", "--quiet"]);
        if let Some(policy) = policy {
            mount.arg("--policy").arg(policy);
        }
        if let Err(err) = run_quietly(&mut mount, "mounting the workspace for the command") {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(err);
        }
        let owner = Owner {
            channel: owner::Channel {
                socket: PathBuf::new(),
                token: String::new(),
            },
            own: Some((mountpoint, dir)),
        };
        match Self::running(db) {
            Ok(channel) => Ok(Owner { channel, ..owner }),
            Err(err) => {
                let _ = owner.finish();
                Err(err)
            }
        }
    }

    /// Where the owner takes calls, and the token it asks for.
    pub(crate) fn address(&self) -> (Address, Vec<u8>) {
        let socket = Address::Unix(self.channel.socket.clone());
        (socket, self.channel.token.as_bytes().to_vec())
    }

    /// Takes down a mount made for the command, once its daemon is done.
    pub(crate) fn finish(self) -> anyhow::Result<()> {
        let Some((mountpoint, dir)) = self.own else {
            return Ok(());
        };
        crate::umount::unmount_and_wait(&mountpoint, UNMOUNT_WAIT)?;
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }
}

/// A replica mount of a served workspace, made for one command.
struct ReplicaView {
    mountpoint: PathBuf,
    /// Where the replica daemon takes sync requests.
    control: PathBuf,
    /// The private directory holding the mount point (and the cache, unless --cache).
    dir: PathBuf,
    /// Whether the cache is ours to remove once nothing in it waits to be pushed.
    cache_is_ours: bool,
}

impl ReplicaView {
    fn mount(address: &str, args: &ExecArgs) -> anyhow::Result<ReplicaView> {
        let dir = private_dir()?;
        let mountpoint = dir.join("workspace");
        let cache_is_ours = args.cache.is_none();
        let cache = match &args.cache {
            Some(cache) => std::path::absolute(cache)?,
            None => dir.join("replica.db"),
        };
        let mut mount = Command::new(std::env::current_exe().context("finding computerd")?);
        mount
            .args(["mount", "--remote", address, "--cache"])
            .args([cache.as_os_str(), mountpoint.as_os_str()])
            .args(["--daemon", "--quiet"]);
        if let Some(token) = &args.token_file {
            mount.arg("--token-file").arg(token);
        }
        if let Err(err) = run_quietly(&mut mount, "mounting a replica for the command") {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(err);
        }
        let control = crate::replica::control_path(&cache);
        Ok(ReplicaView {
            mountpoint,
            control,
            dir,
            cache_is_ours,
        })
    }

    /// Takes the replica down. A fresh cache is removed only when the command's changes
    /// reached the server; otherwise it stays, and the user is told where.
    fn finish(&self, result: Option<&ExecResult>) -> anyhow::Result<()> {
        crate::umount::unmount_and_wait(&self.mountpoint, UNMOUNT_WAIT)?;
        let synced = result.is_none_or(|r| r.sync == SyncOutcome::Complete);
        if self.cache_is_ours && !synced {
            eprintln!(
                "computerd: the replica keeps the unsynced changes in {}; mount it with \
                 --cache to push them",
                self.dir.join("replica.db").display()
            );
            return Ok(());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        Ok(())
    }
}

impl WorkspaceView for ReplicaView {
    fn root(&self) -> &Path {
        &self.mountpoint
    }

    fn before_exec(&self) -> computer_runtimes::Result<()> {
        sync_before(&self.control)
    }

    fn after_exec(&self) -> SyncOutcome {
        sync_after(&self.control)
    }

    fn wait_sync(&self, intent: &str, timeout: Duration) -> computer_runtimes::Result<SyncOutcome> {
        wait_intent(&self.control, intent, timeout)
    }
}

/// The first half of a replica's bracket: the replica daemon at `control` pulls what
/// its server has, or the command does not run. Only the pull must be complete: the
/// command must see the workspace as it is, but changes of earlier commands that wait
/// to be pushed (for room on a full disk, say) must not stop the one that frees it.
pub(crate) fn sync_before(control: &Path) -> computer_runtimes::Result<()> {
    let not_synced = |why: String| computer_runtimes::Error::NotSynced(why);
    let answer = ask_sync(control).map_err(|err| not_synced(format!("{err:#}")))?;
    match (answer.kind.as_str(), answer.field("pulled")) {
        ("complete", _) => Ok(()),
        ("pending", "yes") => {
            tracing::info!(
                "earlier changes wait to be pushed ({}); the command runs on what was pulled",
                answer.reason
            );
            Ok(())
        }
        (kind, _) => Err(not_synced(format!("{kind}: {}", answer.reason))),
    }
}

/// The second half: what the command wrote reached the server, waits to, or was lost.
pub(crate) fn sync_after(control: &Path) -> SyncOutcome {
    match ask_sync(control) {
        Ok(answer) => outcome_of(&answer),
        Err(err) => SyncOutcome::Lost {
            reason: format!("{err:#}"),
        },
    }
}

/// Waits up to `timeout` for the replica daemon at `control` to push what `intent`
/// names (a pending result's).
pub(crate) fn wait_intent(
    control: &Path,
    intent: &str,
    timeout: Duration,
) -> computer_runtimes::Result<SyncOutcome> {
    let intent: computer_sync::Intent = intent
        .parse()
        .map_err(|why: String| computer_runtimes::Error::Invalid(why))?;
    let request = format!("wait {intent} {}\n", timeout.as_millis());
    let answer = crate::replica::ask_replica(control, &request).map_err(|err| {
        computer_runtimes::Error::Connect {
            backend: computer_runtimes::linux::LINUX_BACKEND_ID.into(),
            reason: format!("asking its replica about {intent}: {err:#}"),
        }
    })?;
    Ok(outcome_of(&answer))
}

/// A replica daemon's answer as the outcome of a result's sync.
fn outcome_of(answer: &crate::replica::ControlAnswer) -> SyncOutcome {
    match answer.kind.as_str() {
        "complete" => SyncOutcome::Complete,
        "pending" => SyncOutcome::Pending {
            intent: answer.field("intent").to_owned(),
            reason: answer.reason.clone(),
        },
        "lost" => SyncOutcome::Lost {
            reason: answer.reason.clone(),
        },
        kind => SyncOutcome::Lost {
            reason: format!("{kind}: {}", answer.reason),
        },
    }
}

/// Asks the replica daemon at `control` to sync now and waits for its answer.
fn ask_sync(control: &Path) -> anyhow::Result<crate::replica::ControlAnswer> {
    let request = format!("sync {}\n", SYNC_WAIT.as_millis());
    crate::replica::ask_replica(control, &request)
}

/// A directory of this process's own, for a mount point and a cache.
fn private_dir() -> anyhow::Result<PathBuf> {
    private_dir_named("computerd-exec")
}

/// A new directory of this process's own in the temporary directory (0700), with an
/// empty `workspace` inside for a mount point: `PREFIX-PID`, or `PREFIX-PID.N` when a
/// process that had our pid before left one (it may hold a cache not yet pushed).
pub(crate) fn private_dir_named(prefix: &str) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    sweep_leftovers(&std::env::temp_dir(), prefix);
    let base = std::env::temp_dir().join(format!("{prefix}-{}", std::process::id()));
    let mut dir = base.clone();
    for n in 1..=PRIVATE_DIR_TRIES {
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => break,
            Err(err)
                if err.kind() == std::io::ErrorKind::AlreadyExists && n < PRIVATE_DIR_TRIES =>
            {
                let mut name = base.clone().into_os_string();
                name.push(format!(".{n}"));
                dir = name.into();
            }
            Err(err) => {
                return Err(err)
                    .with_context(|| format!("{}: cannot make a private directory", dir.display()))
            }
        }
    }
    std::fs::create_dir(dir.join("workspace"))
        .with_context(|| format!("{}: cannot make the mount point", dir.display()))?;
    Ok(dir)
}

/// Removes the private directories of `prefix` in `parent` that a process killed
/// before its own cleanup left behind: its pid is gone, and they hold nothing but an
/// empty mount point. Anything more (a replica cache with changes not pushed yet, a
/// mount still there) fails to be removed and stays, for a person to look at.
fn sweep_leftovers(parent: &Path, prefix: &str) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let pid = name
            .to_str()
            .and_then(|name| name.strip_prefix(prefix)?.strip_prefix('-'))
            .and_then(|rest| rest.split('.').next()?.parse::<u32>().ok());
        let Some(pid) = pid else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        // Each fails, harmlessly, on a directory that is not empty or is mounted on.
        let _ = std::fs::remove_dir(entry.path().join("workspace"));
        let _ = std::fs::remove_dir(entry.path());
    }
}

/// Runs a computerd child that prints a pid on success (`--daemon`), without letting
/// that into the command's output.
pub(crate) fn run_quietly(command: &mut Command, what: &str) -> anyhow::Result<()> {
    let status = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .with_context(|| what.to_owned())?;
    if !status.success() {
        bail!("{what}: failed ({status})");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_empty_leftovers_of_dead_processes_are_swept() {
        let parent = tempfile::tempdir().unwrap();
        // Past any pid_max (2^22): no such process.
        let dead = parent.path().join("computerd-serve-99999999");
        let dead_retry = parent.path().join("computerd-serve-99999999.2");
        let keeps_a_cache = parent.path().join("computerd-serve-99999998");
        let alive = parent
            .path()
            .join(format!("computerd-serve-{}", std::process::id()));
        let other = parent.path().join("computerd-exec-99999999");
        for dir in [&dead, &dead_retry, &keeps_a_cache, &alive, &other] {
            std::fs::create_dir_all(dir.join("workspace")).unwrap();
        }
        std::fs::write(keeps_a_cache.join("replica.db"), b"changes").unwrap();
        sweep_leftovers(parent.path(), "computerd-serve");
        assert!(!dead.exists() && !dead_retry.exists());
        assert!(keeps_a_cache.join("replica.db").exists());
        assert!(alive.join("workspace").exists());
        assert!(other.exists(), "another prefix is not this sweep's");
    }

    #[test]
    fn variables_and_timeouts_parse() {
        let env = parse_env(&["A=1".into(), "B=x=y".into(), "C=".into()]).unwrap();
        assert_eq!(env[1], ("B".into(), "x=y".into()));
        assert_eq!(env[2], ("C".into(), String::new()));
        assert!(parse_env(&["=1".into()]).is_err());
        assert!(parse_env(&["NOVALUE".into()]).is_err());
        assert_eq!(
            timeout(Some(1.5)).unwrap(),
            Some(Duration::from_millis(1500))
        );
        assert!(timeout(Some(-1.0)).is_err());
    }
}
