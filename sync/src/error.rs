//! The one error type of the protocol layer.

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a message could not be encoded or decoded. Decoding a peer's bytes never panics:
/// whatever they hold ends here.
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
}

impl Error {
    pub(crate) fn malformed(what: &'static str, why: &'static str) -> Error {
        Error::Malformed { what, why }
    }
}
