//! The execution half of `computer`: one exec entry point over the backends that run
//! commands on a workspace.
//!
//! [`Runtimes`] holds the registered backends (the first is the default) and the execs
//! they run. [`Runtimes::exec`] returns an [`ExecHandle`]: the exec's events (output
//! chunks with sequence numbers, then the exit), its [`ExecResult`], and kill. Every
//! exec is bracketed by its backend's [`Connection`]: the backend's view of the
//! workspace is brought up to date before the command runs, and what the command wrote
//! is sent to the authoritative side before the result says [`SyncOutcome::Complete`].
//!
//! Backends: [`linux`], a bubblewrap sandbox per command over a [`linux::WorkspaceView`];
//! [`shell`], a bash-compatible interpreter in this process on the workspace store. The
//! id [`AUTO`] routes each script to the cheapest backend that can run it.
//! This crate knows processes, not FUSE or RPC: `computerd` provides the views (its
//! mounts) and the wire and command-line surfaces.

pub mod audit;
pub mod backend;
pub mod cgroup;
pub mod error;
pub mod exec;
pub mod js;
pub mod linux;
mod log;
pub mod policy;
pub mod seccomp;
pub mod shell;
mod spine;
pub mod tools;
mod warm;

pub use audit::{AuditEntry, AuditSink, WorkspaceAudit};
pub use backend::{Backend, Connection, Description, Process, SpawnRequest, Spawned};
pub use error::{Error, Result};
pub use exec::{Event, ExecOptions, ExecResult, ExecStatus, Stream, SyncOutcome, EXIT_NOT_STARTED};
pub use log::EXEC_LOG_BYTES_MAX;
pub use policy::{Policies, PolicyFile};
pub use spine::{
    normalize_cwd, ExecHandle, Runtimes, AUTO, CHUNK_BYTES_MAX, FINISHED_KEPT_FOR,
    FINISHED_KEPT_MAX, KILL_GRACE, RUNNING_MAX,
};
