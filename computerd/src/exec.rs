//! `computerd exec DB -- CMD...`: runs a command on a workspace through the runtimes'
//! exec spine, streams its output as it comes and exits with its code.
//!
//! The Linux backend's sandbox sees the workspace through a computerd mount: the
//! running owner's own mount when the database is mounted here, or, on a free database,
//! a mount this command makes for its duration in a private directory and takes down
//! afterwards, returning once that daemon finished with the database. Either way the
//! sandbox writes into the authoritative workspace itself, so a finished command's
//! writes are there (sync outcome: complete).

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use computer_runtimes::linux::{LinuxBackend, LinuxPolicy, LocalView};
use computer_runtimes::{
    Event, ExecOptions, ExecResult, ExecStatus, Runtimes, Stream, SyncOutcome,
};

use crate::owner::{self, Role};

/// Exit status when the command ran but its writes have not all reached the
/// workspace yet (EX_TEMPFAIL, as `computerd sync`).
const EXIT_PENDING: u8 = 75;
/// The most of this command's own stdin handed to the command, bytes.
const STDIN_BYTES_MAX: u64 = 64 << 20;
/// How long the mount made for one command may take to let go of the database.
const UNMOUNT_WAIT: Duration = owner::OWNER_WAIT;

#[derive(clap::Args, Debug)]
pub struct ExecArgs {
    /// The workspace database.
    #[arg(value_name = "DB")]
    db: PathBuf,
    /// The backend to run it (default: the first registered, `linux`).
    #[arg(long, value_name = "ID")]
    backend: Option<String>,
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
    /// The command, run by `sh -c`; its words are joined by spaces, as ssh joins them.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

pub fn run(args: ExecArgs) -> anyhow::Result<ExitCode> {
    let options = ExecOptions {
        backend: args.backend.clone(),
        cwd: args.cwd.clone(),
        stdin: own_stdin()?,
        env: parse_env(&args.env)?,
        timeout: timeout(args.timeout)?,
        id: None,
    };
    let view = WorkspaceDir::for_db(&args.db)?;
    let result = run_in(view.root(), &args.command.join(" "), options);
    view.finish()?;
    Ok(report(&result?))
}

/// Runs `script` with the sandbox over `root` and streams its output to ours.
fn run_in(root: &Path, script: &str, options: ExecOptions) -> anyhow::Result<ExecResult> {
    let mut runtimes = Runtimes::new();
    let view = Arc::new(LocalView::new(root));
    runtimes.register(Arc::new(LinuxBackend::new(view, LinuxPolicy::default())))?;
    let runtimes = Arc::new(runtimes);
    // Before any thread starts, so that all inherit the mask: a signal to this process
    // is passed on to the command, and the bracket still ends (a mount made for the
    // command is taken down).
    let signals = termination_signals();
    signals.thread_block().context("blocking signals")?;
    let mut handle = runtimes.exec(script, options)?;
    pass_signals_on(signals, runtimes.clone(), handle.id().to_owned());
    let (mut stdout, mut stderr) = (std::io::stdout().lock(), std::io::stderr());
    for event in handle.by_ref() {
        // A closed stdout (`| head`) must not stop the command's bracket: keep reading.
        match event {
            Event::Output {
                stream: Stream::Stdout,
                data,
                ..
            } => {
                let _ = stdout.write_all(&data).and_then(|()| stdout.flush());
            }
            Event::Output { data, .. } => {
                let _ = stderr.write_all(&data);
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
    Ok(handle.result())
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

/// Says on stderr what the exit code alone does not, and picks the exit code.
fn report(result: &ExecResult) -> ExitCode {
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
        SyncOutcome::Pending { intent } => {
            eprintln!(
                "computerd: the command's changes are not all in the workspace yet: {intent}"
            );
            ExitCode::from(EXIT_PENDING)
        }
        SyncOutcome::Lost { reason } => {
            eprintln!("computerd: the command's changes were lost: {reason}");
            ExitCode::FAILURE
        }
    }
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

/// The directory the sandbox binds at /workspace: a mount of the workspace.
enum WorkspaceDir {
    /// The running owner's mount.
    Borrowed(PathBuf),
    /// A mount made for this command, in a directory of its own.
    Own { mountpoint: PathBuf, dir: PathBuf },
}

impl WorkspaceDir {
    fn for_db(db: &Path) -> anyhow::Result<WorkspaceDir> {
        if !db.exists() {
            bail!(
                "{}: no such workspace database (computerd init makes one)",
                db.display()
            );
        }
        if owner::is_held(db) {
            return Self::borrowed(db);
        }
        Self::own(db)
    }

    fn borrowed(db: &Path) -> anyhow::Result<WorkspaceDir> {
        let holder = owner::read_holder(&owner::owner_path(db)).ok_or_else(|| {
            anyhow!(
                "{}: in use by a process that does not say who it is",
                db.display()
            )
        })?;
        match &holder.role {
            Role::Mount {
                mountpoint,
                replica: false,
            } => Ok(WorkspaceDir::Borrowed(mountpoint.clone())),
            _ => bail!(
                "{}: in use by {holder}; exec runs on a database mounted here or free",
                db.display()
            ),
        }
    }

    fn own(db: &Path) -> anyhow::Result<WorkspaceDir> {
        let dir = std::env::temp_dir().join(format!("computerd-exec-{}", std::process::id()));
        let mountpoint = dir.join("workspace");
        std::fs::create_dir_all(&mountpoint)
            .with_context(|| format!("{}: cannot make a mount point", mountpoint.display()))?;
        let exe = std::env::current_exe().context("finding the computerd program")?;
        let status = Command::new(exe)
            .arg("mount")
            .args([db.as_os_str(), mountpoint.as_os_str()])
            .args(["--daemon", "--quiet"])
            .stdin(Stdio::null())
            // It prints the daemon's pid: not part of the command's output.
            .stdout(Stdio::null())
            .status()
            .context("starting a mount for the command")?;
        if !status.success() {
            let _ = std::fs::remove_dir_all(&dir);
            bail!("{}: could not mount it for the command", db.display());
        }
        Ok(WorkspaceDir::Own { mountpoint, dir })
    }

    fn root(&self) -> &Path {
        match self {
            WorkspaceDir::Borrowed(root) => root,
            WorkspaceDir::Own { mountpoint, .. } => mountpoint,
        }
    }

    /// Takes down a mount made for the command, once its daemon is done.
    fn finish(self) -> anyhow::Result<()> {
        let WorkspaceDir::Own { mountpoint, dir } = self else {
            return Ok(());
        };
        crate::umount::unmount_and_wait(&mountpoint, UNMOUNT_WAIT)?;
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
