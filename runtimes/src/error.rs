//! The one error type of the runtimes, and its mapping to errno.

use std::time::Duration;

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A caller chose the id of an exec that is still running.
    #[error("exec {0}: an exec with this id is still running; choose another id or wait")]
    Busy(String),
    /// No exec with this id is running or was kept after it finished.
    #[error("exec {0}: no such exec (finished ones are kept {1:?})")]
    NoSuchExec(String, Duration),
    /// As many execs as allowed are running.
    #[error("{0} execs are running, the most allowed; wait for one to end")]
    TooMany(usize),
    #[error("backend {0:?}: not registered (registered: {1})")]
    UnknownBackend(String, String),
    #[error("backend {0:?}: registered twice")]
    DuplicateBackend(String),
    /// A backend could not be reached or started; the next exec tries again.
    #[error("backend {backend}: cannot connect: {reason}")]
    Connect { backend: String, reason: String },
    /// The backend's view of the workspace could not be brought up to date before the
    /// command; it did not run.
    #[error("the workspace could not be brought up to date, so the command did not run: {0}")]
    NotSynced(String),
    /// The backend's policy refuses what the call asked for.
    #[error("backend {backend}: refused by policy: {what}")]
    Refused { backend: String, what: String },
    #[error("{0}")]
    Invalid(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// The errno a caller on the other side of a system interface should see.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Busy(_) => libc::EBUSY,
            Error::NoSuchExec(..) => libc::ESRCH,
            Error::TooMany(_) => libc::EAGAIN,
            Error::UnknownBackend(..) => libc::ENOENT,
            Error::DuplicateBackend(_) => libc::EEXIST,
            Error::Connect { .. } => libc::EHOSTDOWN,
            Error::Refused { .. } => libc::EPERM,
            Error::NotSynced(_) => libc::EAGAIN,
            Error::Invalid(_) => libc::EINVAL,
            Error::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        }
    }

    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_errno() {
        assert_eq!(Error::Busy("a".into()).errno(), libc::EBUSY);
        let io = std::io::Error::from_raw_os_error(libc::ENOSPC);
        assert_eq!(Error::io("writing")(io).errno(), libc::ENOSPC);
        let refused = Error::Refused {
            backend: "linux".into(),
            what: "environment variable X".into(),
        };
        assert_eq!(
            refused.to_string(),
            "backend linux: refused by policy: environment variable X"
        );
    }
}
