//! The one error type of the sync crate.

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a sync step failed. Decoding a peer's bytes never panics: whatever they hold ends
/// here. [`Error::is_transient`] tells a retry loop which failures to retry.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A field breaks a rule of the protocol (a hash that is not 32 bytes, an unknown
    /// codec, a relative path, ...).
    #[error("malformed {what}: {why}")]
    Malformed {
        what: &'static str,
        why: &'static str,
    },
    /// A list or a blob is longer than the protocol allows (checked before anything is
    /// allocated for it).
    #[error("{what} too large: {len} {unit}, at most {max}")]
    TooLarge {
        what: &'static str,
        unit: &'static str,
        len: u64,
        max: u64,
    },
    /// The bytes are not a readable Cap'n Proto message within the limits (truncated,
    /// out-of-bounds pointers, traversal or nesting limit exceeded, wrong pointer kinds).
    #[error("unreadable message: {0}")]
    Capnp(#[from] capnp::Error),
    /// The server turned the client away: wrong token, another protocol version, or a
    /// replica of another workspace. Retrying cannot help.
    #[error("refused: {0}")]
    Refused(String),
    /// This replica was replaced by another one under the same peer name (its disk was
    /// lost and recreated): its cursors are void and nothing it holds is synced.
    #[error("replica {replica_id} was replaced under peer {peer:?}: register again")]
    Replaced { peer: String, replica_id: String },
    /// The connection could not be made, failed, or the peer did not answer. Retrying
    /// may help.
    #[error("{peer}: {}{reason}", connection_phase(*.connected))]
    Disconnected {
        peer: String,
        reason: String,
        /// Whether the connection had been made (else it was never opened).
        connected: bool,
    },
    /// The other side failed to do what was asked and said why.
    #[error("the server failed: {0}")]
    Remote(String),
    /// The local workspace failed.
    #[error(transparent)]
    Store(#[from] computer_vfs::Error),
    /// A file operation on the server's workspace failed (a missing path, a directory
    /// where a file was asked for, a full disk): what the store said, and its errno.
    #[error("{message}")]
    File { errno: i32, message: String },
}

impl Error {
    /// A file operation's failure in the store, as it travels to the client.
    pub(crate) fn file(error: &computer_vfs::Error) -> Error {
        Error::File {
            errno: error.errno(),
            message: error.to_string(),
        }
    }

    pub(crate) fn malformed(what: &'static str, why: &'static str) -> Error {
        Error::Malformed { what, why }
    }

    pub fn disconnected(peer: impl Into<String>, reason: impl std::fmt::Display) -> Error {
        Error::Disconnected {
            peer: peer.into(),
            reason: reason.to_string(),
            connected: true,
        }
    }

    /// The connection to `peer` could not be opened.
    pub fn unreachable(peer: impl Into<String>, reason: impl std::fmt::Display) -> Error {
        Error::Disconnected {
            peer: peer.into(),
            reason: reason.to_string(),
            connected: false,
        }
    }

    /// Whether trying the same sync again later may succeed: the transport failed, or
    /// the server failed in a way that may pass (it is restarting, its disk was full).
    /// Refusals, replacement and malformed messages are final.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Disconnected { .. } | Error::Remote(_) => true,
            Error::Store(e) => matches!(
                e,
                computer_vfs::Error::Storage { .. }
                    | computer_vfs::Error::Io { .. }
                    | computer_vfs::Error::NoSpace { .. }
                    | computer_vfs::Error::Busy(_)
            ),
            Error::Malformed { .. }
            | Error::TooLarge { .. }
            | Error::Capnp(_)
            | Error::Refused(_)
            | Error::Replaced { .. }
            | Error::File { .. } => false,
        }
    }

    /// The errno that best describes the failure (for a CLI exit or a FUSE reply).
    pub fn errno(&self) -> i32 {
        match self {
            Error::Malformed { .. } | Error::Capnp(_) => libc::EPROTO,
            Error::TooLarge { .. } => libc::EMSGSIZE,
            Error::Refused(_) => libc::EACCES,
            Error::Replaced { .. } => libc::ESTALE,
            Error::Disconnected { .. } => libc::ENOTCONN,
            Error::Remote(_) => libc::EIO,
            Error::Store(e) => e.errno(),
            Error::File { errno, .. } => *errno,
        }
    }
}

/// How a [`Error::Disconnected`] begins: what failed.
fn connection_phase(connected: bool) -> &'static str {
    if connected {
        "connection lost: "
    } else {
        "cannot connect: "
    }
}
