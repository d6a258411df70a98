//! What an exec is asked to do, what it reports while it runs, and how it ended.

use std::time::Duration;

/// What a caller asks of one exec. Every field has a default: the registry's default
/// backend, the workspace root, no stdin, no extra environment, no timeout, a fresh id.
#[derive(Clone, Debug, Default)]
pub struct ExecOptions {
    /// A registered backend id; `None` for the default (the first registered).
    pub backend: Option<String>,
    /// The working directory, a path inside the workspace (`/` is its root; a relative
    /// path starts there too). It may not climb out with `..`.
    pub cwd: Option<String>,
    /// Bytes the command reads on its standard input; `None` gives it an empty one.
    pub stdin: Option<Vec<u8>>,
    /// Variables added to the command's environment; the backend's policy names which
    /// may pass. Nothing of the daemon's own environment reaches a command.
    pub env: Vec<(String, String)>,
    /// After this long the command's whole process tree gets SIGTERM, and SIGKILL
    /// [`crate::KILL_GRACE`] later.
    pub timeout: Option<Duration>,
    /// An id of the caller's choosing, to attach to the exec later; refused while an
    /// exec with that id runs.
    pub id: Option<String>,
    /// Who asks, for the audit record (`None`: "in-process").
    pub caller: Option<String>,
}

/// One of a command's output streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// What a reader of an exec receives, in sequence order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A chunk of output, as the command wrote it (at most [`crate::CHUNK_BYTES_MAX`]).
    Output {
        seq: u64,
        stream: Stream,
        data: Vec<u8>,
    },
    /// Events `first..next` were dropped from the exec's bounded log before this reader
    /// asked for them; the next event it receives is `next`.
    Missed { first: u64, next: u64 },
    /// The exec ended; always the last event.
    Exit { seq: u64, result: ExecResult },
}

/// How an exec ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecStatus {
    /// The command ran and exited with status 0.
    Completed,
    /// The command exited with another status, was killed by a signal nobody asked for,
    /// or could not be started.
    Failed,
    /// A caller killed it.
    Cancelled,
    /// Its timeout ran out.
    TimedOut,
}

/// Whether what the command wrote reached the authoritative workspace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SyncOutcome {
    /// Everything the command wrote is in the authoritative workspace.
    Complete,
    /// The command ran but its writes have not all arrived; `intent` names them
    /// (`REPLICA_ID@REVISION`), retried with the sync engine's bounded exponential
    /// backoff, and waited on with [`crate::Runtimes::wait_sync`]; `reason` says why the
    /// last attempt failed.
    Pending { intent: String, reason: String },
    /// The writes cannot arrive any more (the sandbox's view was replaced or lost).
    Lost { reason: String },
}

/// The end of an exec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecResult {
    pub status: ExecStatus,
    /// The exit status, or 128 + the signal's number when a signal ended the command
    /// (as a shell reports it); 127 when it could not be started.
    pub exit_code: i32,
    pub duration: Duration,
    /// The backend that ran it, and why that one.
    pub backend: String,
    pub reason: String,
    pub sync: SyncOutcome,
    /// What went wrong around the command (a spawn or sync failure), if anything.
    pub error: Option<String>,
    /// What a callable backend's command returned, as JSON text (the `js` backend's
    /// module's default export); `None` for a command of a shell.
    pub value: Option<String>,
}

/// Exit status of a command that could not be started, as shells use it.
pub const EXIT_NOT_STARTED: i32 = 127;
