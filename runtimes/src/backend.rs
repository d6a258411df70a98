//! What a backend provides to the exec spine: a description, a lazily made connection,
//! the bracket around each command, and started commands as processes with pipes.

use std::io::{Read, Write};
use std::sync::Arc;

use nix::sys::signal::Signal;
use nix::sys::wait::{waitid, waitpid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::error::{Error, Result};
use crate::exec::SyncOutcome;

/// What a backend tells callers (and, later, a model) about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Description {
    pub id: String,
    /// One line: what it is.
    pub summary: String,
    /// What it can run.
    pub runs: String,
    /// What a command may touch.
    pub touches: String,
}

/// A kind of place commands run, registered under a stable id.
pub trait Backend: Send + Sync {
    fn id(&self) -> &str;
    fn describe(&self) -> Description;
    /// Makes the backend ready to run commands. Called on the first exec that needs it,
    /// and again after a failure (a failed connect is not kept) or once the connection
    /// says it is dead.
    fn connect(&self) -> Result<Arc<dyn Connection>>;
    /// Whether this backend can run `script`, judged from its text alone and the same
    /// way every time (`auto` asks, cheapest backend first); else why not, one line.
    fn can_run(&self, script: &str) -> std::result::Result<(), String> {
        let _ = script;
        Ok(())
    }
    /// Waits up to `timeout` for the writes a pending result named by `intent` to
    /// reach the authoritative side. A backend that never leaves a sync pending (it
    /// writes to the workspace itself) has none to wait for.
    fn wait_sync(&self, intent: &str, timeout: std::time::Duration) -> Result<SyncOutcome> {
        let _ = timeout;
        Err(Error::Invalid(format!(
            "intent {intent}: backend {} leaves no sync pending",
            self.id()
        )))
    }
}

/// A ready backend.
pub trait Connection: Send + Sync {
    /// Brings the backend's view of the workspace up to everything the authoritative
    /// side held when this was called. A command runs only after this succeeded.
    fn before_exec(&self, exec_id: &str) -> Result<()>;
    fn spawn(&self, request: &SpawnRequest) -> Result<Spawned>;
    /// Sends everything the command wrote to the authoritative side, or says why it
    /// has not arrived. Called once for every `before_exec` that succeeded, also when
    /// `spawn` then failed.
    fn after_exec(&self, exec_id: &str) -> SyncOutcome;
    /// False once the connection cannot run commands any more: the next exec connects
    /// anew.
    fn is_alive(&self) -> bool {
        true
    }
    /// The longest a command may run on this backend (its policy); `None`: no limit.
    fn timeout_max(&self) -> Option<std::time::Duration> {
        None
    }
}

/// One command for a backend to start.
#[derive(Clone, Debug)]
pub struct SpawnRequest {
    pub exec_id: String,
    /// The script as the caller wrote it.
    pub script: String,
    /// The working directory inside the workspace, normalised: `/` or `/a/b`.
    pub cwd: String,
    /// Variables the caller added (the backend's policy decides which may pass).
    pub env: Vec<(String, String)>,
}

/// A started command.
pub struct Spawned {
    pub stdin: Option<Box<dyn Write + Send>>,
    pub stdout: Box<dyn Read + Send>,
    pub stderr: Box<dyn Read + Send>,
    pub process: Arc<dyn Process>,
}

impl Spawned {
    /// A command run inside this process (a backend's thread), on pipes like a
    /// process's.
    pub(crate) fn in_process(
        stdin: std::io::PipeWriter,
        stdout: std::io::PipeReader,
        stderr: std::io::PipeReader,
        process: Arc<dyn Process>,
    ) -> Spawned {
        Spawned {
            stdin: Some(Box::new(stdin)),
            stdout: Box::new(stdout),
            stderr: Box::new(stderr),
            process,
        }
    }
}

/// The running command and everything it started.
pub trait Process: Send + Sync {
    /// Sends `signal` to every process of the command's tree.
    fn signal(&self, signal: i32) -> Result<()>;
    /// Ends the whole tree at once (SIGKILL); nothing of it outlives this.
    fn kill_all(&self) -> Result<()>;
    /// Waits for the command to end: its exit status, or 128 + the signal that ended it.
    fn wait(&self) -> Result<i32>;
    /// What a callable command returned (JSON text), once it ended; `None` for a command
    /// that returns nothing but its exit status.
    fn value(&self) -> Option<String> {
        None
    }
}

/// `signal` as a signal, or why not.
pub(crate) fn signal_of(signal: i32) -> Result<Signal> {
    Signal::try_from(signal).map_err(|_| Error::Invalid(format!("signal {signal}: not a signal")))
}

/// Waits for the child `pid` to end without reaping it, so that signals sent meanwhile
/// cannot reach a reused pid; then, under `reaped`, runs `before_reap` (the pid still
/// names the ended child), reaps it and marks it reaped. Its exit status, or 128 + the
/// signal that ended it.
pub(crate) fn wait_and_reap(
    pid: Pid,
    reaped: &std::sync::Mutex<bool>,
    before_reap: impl FnOnce(),
    what: &str,
) -> Result<i32> {
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT;
    loop {
        match waitid(Id::Pid(pid), flags) {
            Ok(_) => break,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(err) => return Err(Error::io(format!("waiting for {what}"))(err.into())),
        }
    }
    let mut reaped = reaped.lock().unwrap_or_else(|e| e.into_inner());
    before_reap();
    let status =
        waitpid(pid, None).map_err(|err| Error::io(format!("reaping {what}"))(err.into()))?;
    *reaped = true;
    match status {
        WaitStatus::Exited(_, code) => Ok(code),
        WaitStatus::Signaled(_, signal, _) => Ok(128 + signal as i32),
        other => Err(Error::Invalid(format!("unexpected wait status {other:?}"))),
    }
}
