//! The one error type of the store, and its mapping to errno.
//!
//! Every fallible call returns [`Error`]. User-facing kinds (`NotFound`, `Exists`, ...)
//! carry the path they concern when one is known, so a message names what went wrong;
//! the inode API does not know paths and leaves them empty, the path API fills them in.
//! [`Error::errno`] is an exhaustive match: a new variant forces a decision.

use std::fmt;

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A path attached to an error, shown as text (lossily for non-UTF-8 names).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ErrorPath(pub Option<String>);

impl ErrorPath {
    pub fn none() -> ErrorPath {
        ErrorPath(None)
    }
    pub fn of(path: impl Into<String>) -> ErrorPath {
        ErrorPath(Some(path.into()))
    }
}

impl fmt::Display for ErrorPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(path) => write!(f, "{path}: "),
            None => Ok(()),
        }
    }
}

impl fmt::Debug for ErrorPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

/// Every way a store operation can fail.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("{0}no such file or directory")]
    NotFound(ErrorPath),
    #[error("{0}file exists")]
    Exists(ErrorPath),
    #[error("{0}not a directory")]
    NotDir(ErrorPath),
    #[error("{0}is a directory")]
    IsDir(ErrorPath),
    #[error("{0}directory not empty")]
    NotEmpty(ErrorPath),
    #[error("{path}invalid argument: {reason}")]
    Invalid {
        path: ErrorPath,
        reason: &'static str,
    },
    /// The file opened is not a workspace database (an empty file, another program's
    /// database), and the caller did not ask to make one.
    #[error("{0}not a workspace database")]
    NotWorkspace(ErrorPath),
    /// A read-only open found changes in the database's write-ahead log that it cannot
    /// read: the log's index (`-shm`) is missing and cannot be made (read-only media).
    #[error(
        "{0}its write-ahead log holds changes this read-only storage cannot read: open it \
         once where it can be written"
    )]
    UnreadableLog(ErrorPath),
    /// A read-only open found a rollback journal that a killed bulk load left (see
    /// `Options::bulk_load`), and cannot roll it back (read-only media).
    #[error(
        "{0}an interrupted import left a rollback journal this read-only storage cannot \
         roll back: open it once where it can be written"
    )]
    HotJournal(ErrorPath),
    #[error("{0}too many levels of symbolic links")]
    Loop(ErrorPath),
    #[error("{0}file name too long")]
    NameTooLong(ErrorPath),
    #[error("{0}invalid cross-device link")]
    CrossDevice(ErrorPath),
    #[error("{0}read-only workspace")]
    ReadOnly(ErrorPath),
    #[error("{path}no space left: {what}")]
    NoSpace { path: ErrorPath, what: &'static str },
    #[error("{0}file too large")]
    FileTooBig(ErrorPath),
    #[error("{0}operation not permitted")]
    NotPermitted(ErrorPath),
    /// The caller's permissions do not allow it (mode bits, search permission).
    #[error("{0}permission denied")]
    PermissionDenied(ErrorPath),
    #[error("{0}too many links")]
    TooManyLinks(ErrorPath),
    #[error("{0}no such attribute")]
    NoAttribute(ErrorPath),
    #[error("{0}result does not fit the buffer")]
    Range(ErrorPath),
    #[error("{0}bad file handle")]
    BadHandle(ErrorPath),
    #[error("{0}not a symbolic link")]
    NotSymlink(ErrorPath),
    #[error("{0}operation not supported")]
    NotSupported(ErrorPath),
    #[error("{0}argument too large")]
    TooBig(ErrorPath),
    #[error("{0}busy, try again")]
    Busy(ErrorPath),
    /// A replication peer presented a replica id the workspace no longer knows it by:
    /// the peer came back as a new replica, and the old one's cursors are void.
    #[error("{0}stale replica: the peer was replaced by another replica")]
    StaleReplica(ErrorPath),
    /// Bytes read from the database do not check out: a block whose hash does not match,
    /// a row that breaks an invariant. Never papered over with wrong data.
    #[error("{path}corrupt workspace: {detail}")]
    Corrupt { path: ErrorPath, detail: String },
    /// A storage failure undid mutations that had already been answered (SQLite rolled
    /// back a whole batch): the workspace refuses every further change rather than go
    /// on from a state its callers never saw, until it is opened again.
    #[error("{path}workspace takes no more changes until reopened: {detail}")]
    Halted { path: ErrorPath, detail: String },
    /// SQLite failed (I/O error, disk full, locked beyond the busy timeout, ...).
    #[error("{path}storage error while {context}: {source}")]
    Storage {
        path: ErrorPath,
        context: &'static str,
        source: rusqlite::Error,
    },
    /// An operating-system I/O error (import/export, staging files).
    #[error("{path}{source}")]
    Io {
        path: ErrorPath,
        source: std::io::Error,
    },
}

impl Error {
    /// The errno a POSIX caller should see.
    pub fn errno(&self) -> i32 {
        match self {
            Error::NotFound(_) => libc::ENOENT,
            Error::Exists(_) => libc::EEXIST,
            Error::NotDir(_) => libc::ENOTDIR,
            Error::IsDir(_) => libc::EISDIR,
            Error::NotEmpty(_) => libc::ENOTEMPTY,
            Error::Invalid { .. } => libc::EINVAL,
            Error::NotWorkspace(_) => libc::EINVAL,
            Error::UnreadableLog(_) | Error::HotJournal(_) => libc::EROFS,
            Error::Loop(_) => libc::ELOOP,
            Error::NameTooLong(_) => libc::ENAMETOOLONG,
            Error::CrossDevice(_) => libc::EXDEV,
            Error::ReadOnly(_) => libc::EROFS,
            Error::NoSpace { .. } => libc::ENOSPC,
            Error::FileTooBig(_) => libc::EFBIG,
            Error::NotPermitted(_) => libc::EPERM,
            Error::PermissionDenied(_) => libc::EACCES,
            Error::TooManyLinks(_) => libc::EMLINK,
            Error::NoAttribute(_) => libc::ENODATA,
            Error::Range(_) => libc::ERANGE,
            Error::BadHandle(_) => libc::EBADF,
            Error::NotSymlink(_) => libc::EINVAL,
            Error::NotSupported(_) => libc::EOPNOTSUPP,
            Error::TooBig(_) => libc::E2BIG,
            Error::Busy(_) => libc::EBUSY,
            Error::StaleReplica(_) => libc::ESTALE,
            Error::Corrupt { .. } => libc::EIO,
            Error::Halted { .. } => libc::EIO,
            Error::Storage { source, .. } => storage_errno(source),
            Error::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        }
    }

    /// The path this error concerns, if known.
    pub fn path(&self) -> Option<&str> {
        self.path_slot().and_then(|p| p.0.as_deref())
    }

    /// Attaches `path` unless the error already names one. The path API calls this so
    /// errors from the inode layer name the path the caller gave.
    pub fn at(mut self, path: &str) -> Error {
        if let Some(slot) = self.path_slot_mut() {
            if slot.0.is_none() {
                slot.0 = Some(path.to_owned());
            }
        }
        self
    }

    fn path_slot(&self) -> Option<&ErrorPath> {
        match self {
            Error::NotFound(p)
            | Error::Exists(p)
            | Error::NotDir(p)
            | Error::IsDir(p)
            | Error::NotEmpty(p)
            | Error::Loop(p)
            | Error::NameTooLong(p)
            | Error::CrossDevice(p)
            | Error::ReadOnly(p)
            | Error::FileTooBig(p)
            | Error::NotPermitted(p)
            | Error::PermissionDenied(p)
            | Error::TooManyLinks(p)
            | Error::NoAttribute(p)
            | Error::Range(p)
            | Error::BadHandle(p)
            | Error::NotSymlink(p)
            | Error::NotSupported(p)
            | Error::TooBig(p)
            | Error::Busy(p)
            | Error::StaleReplica(p)
            | Error::NotWorkspace(p)
            | Error::UnreadableLog(p)
            | Error::HotJournal(p) => Some(p),
            Error::Invalid { path, .. }
            | Error::NoSpace { path, .. }
            | Error::Corrupt { path, .. }
            | Error::Halted { path, .. }
            | Error::Storage { path, .. }
            | Error::Io { path, .. } => Some(path),
        }
    }

    fn path_slot_mut(&mut self) -> Option<&mut ErrorPath> {
        match self {
            Error::NotFound(p)
            | Error::Exists(p)
            | Error::NotDir(p)
            | Error::IsDir(p)
            | Error::NotEmpty(p)
            | Error::Loop(p)
            | Error::NameTooLong(p)
            | Error::CrossDevice(p)
            | Error::ReadOnly(p)
            | Error::FileTooBig(p)
            | Error::NotPermitted(p)
            | Error::PermissionDenied(p)
            | Error::TooManyLinks(p)
            | Error::NoAttribute(p)
            | Error::Range(p)
            | Error::BadHandle(p)
            | Error::NotSymlink(p)
            | Error::NotSupported(p)
            | Error::TooBig(p)
            | Error::Busy(p)
            | Error::StaleReplica(p)
            | Error::NotWorkspace(p)
            | Error::UnreadableLog(p)
            | Error::HotJournal(p) => Some(p),
            Error::Invalid { path, .. }
            | Error::NoSpace { path, .. }
            | Error::Corrupt { path, .. }
            | Error::Halted { path, .. }
            | Error::Storage { path, .. }
            | Error::Io { path, .. } => Some(path),
        }
    }

    pub(crate) fn invalid(reason: &'static str) -> Error {
        Error::Invalid {
            path: ErrorPath::none(),
            reason,
        }
    }

    pub(crate) fn corrupt(detail: impl Into<String>) -> Error {
        Error::Corrupt {
            path: ErrorPath::none(),
            detail: detail.into(),
        }
    }

    pub(crate) fn no_space(what: &'static str) -> Error {
        Error::NoSpace {
            path: ErrorPath::none(),
            what,
        }
    }

    pub(crate) fn halted(detail: impl Into<String>) -> Error {
        Error::Halted {
            path: ErrorPath::none(),
            detail: detail.into(),
        }
    }

    pub(crate) fn io(path: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            path: ErrorPath::of(path),
            source,
        }
    }
}

/// Shorthands for the path-less kinds, used by the inode layer.
#[allow(non_snake_case)]
pub(crate) mod kind {
    use super::{Error, ErrorPath};
    pub fn NotFound() -> Error {
        Error::NotFound(ErrorPath::none())
    }
    pub fn Exists() -> Error {
        Error::Exists(ErrorPath::none())
    }
    pub fn NotDir() -> Error {
        Error::NotDir(ErrorPath::none())
    }
    pub fn IsDir() -> Error {
        Error::IsDir(ErrorPath::none())
    }
    pub fn NotEmpty() -> Error {
        Error::NotEmpty(ErrorPath::none())
    }
    pub fn Loop() -> Error {
        Error::Loop(ErrorPath::none())
    }
    pub fn NameTooLong() -> Error {
        Error::NameTooLong(ErrorPath::none())
    }
    pub fn ReadOnly() -> Error {
        Error::ReadOnly(ErrorPath::none())
    }
    pub fn FileTooBig() -> Error {
        Error::FileTooBig(ErrorPath::none())
    }
    pub fn NotPermitted() -> Error {
        Error::NotPermitted(ErrorPath::none())
    }
    pub fn PermissionDenied() -> Error {
        Error::PermissionDenied(ErrorPath::none())
    }
    pub fn TooManyLinks() -> Error {
        Error::TooManyLinks(ErrorPath::none())
    }
    pub fn NoAttribute() -> Error {
        Error::NoAttribute(ErrorPath::none())
    }
    pub fn Range() -> Error {
        Error::Range(ErrorPath::none())
    }
    pub fn BadHandle() -> Error {
        Error::BadHandle(ErrorPath::none())
    }
    pub fn NotSymlink() -> Error {
        Error::NotSymlink(ErrorPath::none())
    }
    pub fn TooBig() -> Error {
        Error::TooBig(ErrorPath::none())
    }
    pub fn NotSupported() -> Error {
        Error::NotSupported(ErrorPath::none())
    }
}

fn storage_errno(source: &rusqlite::Error) -> i32 {
    use rusqlite::ErrorCode;
    match source.sqlite_error_code() {
        Some(ErrorCode::DiskFull) => libc::ENOSPC,
        Some(ErrorCode::ReadOnly) => libc::EROFS,
        Some(ErrorCode::TooBig) => libc::EFBIG,
        Some(ErrorCode::DatabaseBusy) | Some(ErrorCode::DatabaseLocked) => libc::EBUSY,
        Some(ErrorCode::NotADatabase) | Some(ErrorCode::DatabaseCorrupt) => libc::EIO,
        Some(ErrorCode::OutOfMemory) => libc::ENOMEM,
        Some(ErrorCode::PermissionDenied) => libc::EACCES,
        _ => libc::EIO,
    }
}

/// Adds context to a rusqlite result: what the store was doing when SQLite failed.
pub(crate) trait StorageContext<T> {
    fn ctx(self, context: &'static str) -> Result<T>;
}

impl<T> StorageContext<T> for std::result::Result<T, rusqlite::Error> {
    fn ctx(self, context: &'static str) -> Result<T> {
        self.map_err(|source| Error::Storage {
            path: ErrorPath::none(),
            context,
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_names_path_and_maps_errno() {
        let err = kind::NotFound().at("/a/b");
        assert_eq!(err.errno(), libc::ENOENT);
        assert_eq!(err.to_string(), "/a/b: no such file or directory");
        // A path already attached is kept.
        let err = err.at("/other");
        assert_eq!(err.path(), Some("/a/b"));
    }

    #[test]
    fn error_without_path_has_plain_message() {
        assert_eq!(kind::NotEmpty().to_string(), "directory not empty");
        assert_eq!(Error::no_space("quota bytes").errno(), libc::ENOSPC);
    }
}
