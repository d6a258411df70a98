//! The Cap'n Proto RPC transport (capnp-rpc on tokio): [`serve`] an [`Authority`] on a
//! Unix socket or a TCP port, [`connect`] to one and get a [`RemoteUpstream`], which a
//! [`crate::Replica`] syncs against as it would against an in-process
//! [`crate::PeerSession`].
//!
//! What this module does: sockets, connections, the `Gate`/`Session`/`Listener`
//! capabilities, bounds on connections and calls, timeouts, and the mapping of errors
//! across the wire. What it leaves to others: every conversion between Cap'n Proto
//! structs and domain values is [`crate::wire`]'s (this module only moves scalars and
//! capabilities), and every decision about the workspace is [`Authority`]'s and
//! [`crate::PeerSession`]'s.
//!
//! # Threads
//!
//! capnp-rpc is `!Send`: a connection's `RpcSystem`, its capabilities and the futures of
//! its calls live on one thread, in a tokio [`LocalSet`]. [`serve`] makes its own;
//! [`connect`] and every [`RemoteUpstream`] call must run inside one (on a runtime with
//! time and IO enabled): [`run_local`] builds both. Work on the store never runs on the
//! event loop: the server runs each call's [`crate::PeerSession`] method (SQLite,
//! possibly for 100s of ms) on tokio's blocking pool.
//!
//! # Errors across the wire
//!
//! A failed call reaches the client as a Cap'n Proto exception whose reason starts with
//! a tag naming the kind of failure, then `": "` and a message for people:
//!
//! | the server's [`Error`] | reason | the client's [`Error`] |
//! | --- | --- | --- |
//! | `Refused(why)` | `refused: {why}` | `Refused(why)` |
//! | `Replaced { .. }` | `replaced: {error}` | `Replaced` (peer and replica id are the client's own) |
//! | `Malformed`, `TooLarge`, `Capnp` (the request broke a rule) | `rejected: {error}` | `Refused("the server rejected the request: {error}")` |
//! | `Remote`, `Store`, `Disconnected` (the server failed) | `failed: {message}` | `Remote(message)` |
//! | `File { errno, message }` (a file stream's path failed in the store) | `file: {errno}: {message}` | `File { errno, message }` |
//!
//! A reason without a known tag (capnp-rpc's own errors) becomes `Remote`. Whatever fails
//! on the client's side of the connection (the socket closed or broke, no answer within
//! the call timeout, the connection's task ended) is [`Error::Disconnected`] naming the
//! address, for the call that saw it and for every later call on that [`RemoteUpstream`]:
//! a retry loop reconnects.
//!
//! # Bounds
//!
//! Every message read on a connection, either side, is within [`wire::reader_options`]
//! (64 MiB traversal limit, checked against the segment table before anything is
//! allocated; nesting depth 32); a message beyond them, or bytes that are not Cap'n
//! Proto, end that connection and nothing else. Within a message, [`crate::wire`]'s
//! decoders check every list and blob. The server holds at most
//! [`ServeOptions::connections_max`] connections (more are closed at once), each with at
//! most [`ServeOptions::calls_per_connection_max`] calls in flight (more fail at once,
//! transiently: capnp-rpc has no flow limit to hold them back), at most
//! [`ServeOptions::listeners_per_connection_max`] listeners, and closes a connection that
//! opens no session within [`ServeOptions::hello_timeout`]. It reads a connection only
//! while its answers go out (`backpressure.rs`): a peer that stops reading its answers
//! stops being read, so what waits to be written to it is bounded by the calls read
//! before. A connection gets one hello refusal: a client guessing tokens must reconnect
//! for every guess.

mod backpressure;
mod client;
mod server;
#[cfg(test)]
mod tests;

use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::str::FromStr;

use tokio::io::{BufReader, BufWriter};
use tokio::task::LocalSet;
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

#[cfg(doc)]
use crate::{wire, Authority};
use crate::{ClientInfo, Error};

pub use client::{
    connect, connect_with, ConnectOptions, RemoteFileReader, RemoteFileWriter, RemoteUpstream,
};
pub use server::{serve, RunnerMaker, ServeOptions, ServerSocket};

/// Where a server listens and a client connects: `tcp:HOST:PORT` is TCP, anything else
/// is the path of a Unix socket.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Address {
    Unix(PathBuf),
    /// `HOST:PORT`, as `tcp:HOST:PORT` had it (a name, an IPv4 address, or an IPv6
    /// address in brackets).
    Tcp(String),
}

/// Longest Unix socket path, in bytes: `sun_path` holds 108 bytes with the final NUL.
pub const UNIX_SOCKET_PATH_BYTES_MAX: usize = 107;

/// Why a string is not an [`Address`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad address {text:?}: {why}")]
pub struct AddressError {
    text: String,
    why: &'static str,
}

impl FromStr for Address {
    type Err = AddressError;

    fn from_str(text: &str) -> Result<Address, AddressError> {
        let refuse = |why| AddressError {
            text: text.to_owned(),
            why,
        };
        if let Some(host_port) = text.strip_prefix("tcp:") {
            let Some((host, port)) = host_port.rsplit_once(':') else {
                return Err(refuse("a TCP address is tcp:HOST:PORT"));
            };
            if host.is_empty() {
                return Err(refuse("a TCP address is tcp:HOST:PORT, and names no host"));
            }
            if port.parse::<u16>().is_err() {
                return Err(refuse("the port is not a number from 0 to 65535"));
            }
            return Ok(Address::Tcp(host_port.to_owned()));
        }
        if text.is_empty() {
            return Err(refuse("give a Unix socket path or tcp:HOST:PORT"));
        }
        if text.contains('\0') {
            return Err(refuse("a Unix socket path cannot hold a NUL byte"));
        }
        if text.len() > UNIX_SOCKET_PATH_BYTES_MAX {
            return Err(refuse("a Unix socket path is at most 107 bytes"));
        }
        Ok(Address::Unix(PathBuf::from(text)))
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Unix(path) => write!(f, "{}", path.display()),
            Address::Tcp(host_port) => write!(f, "tcp:{host_port}"),
        }
    }
}

/// Runs `future` to completion on a new single-threaded tokio runtime (time and IO
/// enabled), inside a [`LocalSet`]: what [`connect`], [`RemoteUpstream`] and [`serve`]
/// need. Fails only if the runtime cannot be built.
pub fn run_local<F: Future>(future: F) -> std::io::Result<F::Output> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    Ok(LocalSet::new().block_on(&runtime, future))
}

// ---------------------------------------------------------------------------------------
// Streams.

/// Buffer of each direction of a connection: many small RPC messages become one write,
/// and capnp-rpc flushes after every message.
const STREAM_BUFFER_BYTES: usize = 64 << 10;

type Reader = Box<dyn futures::io::AsyncRead + Unpin>;
type Writer = Box<dyn futures::io::AsyncWrite + Unpin>;

fn buffered<R, W>(reader: R, writer: W) -> (Reader, Writer)
where
    R: tokio::io::AsyncRead + Unpin + 'static,
    W: tokio::io::AsyncWrite + Unpin + 'static,
{
    (
        Box::new(BufReader::with_capacity(STREAM_BUFFER_BYTES, reader).compat()),
        Box::new(BufWriter::with_capacity(STREAM_BUFFER_BYTES, writer).compat_write()),
    )
}

fn unix_stream(stream: tokio::net::UnixStream) -> (Reader, Writer) {
    let (reader, writer) = stream.into_split();
    buffered(reader, writer)
}

fn tcp_stream(stream: tokio::net::TcpStream) -> std::io::Result<(Reader, Writer)> {
    // Calls are small request/answer exchanges: Nagle's delay would add to each.
    stream.set_nodelay(true)?;
    let (reader, writer) = stream.into_split();
    Ok(buffered(reader, writer))
}

// ---------------------------------------------------------------------------------------
// Errors across the wire (the table in the module doc).

const TAG_REFUSED: &str = "refused";
const TAG_REPLACED: &str = "replaced";
const TAG_REJECTED: &str = "rejected";
const TAG_FAILED: &str = "failed";
const TAG_FILE: &str = "file";

/// What capnp-rpc puts before the reason of an exception that came from the peer.
const REMOTE_EXCEPTION_PREFIX: &str = "remote exception: ";

/// The exception the server answers a failed call with.
/// How a capability implemented above this crate (the runner) fails a call so that the
/// client reads it as the error it was: the sync [`Error`] a client's call returns.
pub fn error_answer(error: &Error) -> capnp::Error {
    exception(error)
}

fn exception(error: &Error) -> capnp::Error {
    let reason = match error {
        Error::Refused(why) => format!("{TAG_REFUSED}: {why}"),
        Error::Replaced { .. } => format!("{TAG_REPLACED}: {error}"),
        Error::Malformed { .. } | Error::TooLarge { .. } | Error::Capnp(_) => {
            format!("{TAG_REJECTED}: {error}")
        }
        Error::Remote(why) => format!("{TAG_FAILED}: {why}"),
        Error::Disconnected { .. } | Error::Store(_) => format!("{TAG_FAILED}: {error}"),
        Error::File { errno, message } => format!("{TAG_FILE}: {errno}: {message}"),
    };
    capnp::Error::failed(reason)
}

/// What a failed call means to the client. `peer` names the server; `client` is who the
/// client said it was (a replacement names it).
fn call_error(error: capnp::Error, peer: &str, client: &ClientInfo) -> Error {
    let Some(reason) = error.extra.strip_prefix(REMOTE_EXCEPTION_PREFIX) else {
        // Raised on this side: the connection broke or ended.
        let reason = if error.extra.is_empty() {
            error.kind.to_string()
        } else {
            error.extra
        };
        return Error::disconnected(peer, reason);
    };
    if error.kind == capnp::ErrorKind::Disconnected {
        return Error::disconnected(peer, reason);
    }
    match reason.split_once(": ") {
        Some((TAG_REFUSED, why)) => Error::Refused(why.to_owned()),
        Some((TAG_REPLACED, _)) => Error::Replaced {
            peer: client.peer.clone(),
            replica_id: client.replica_id.clone(),
        },
        Some((TAG_REJECTED, why)) => {
            Error::Refused(format!("the server rejected the request: {why}"))
        }
        Some((TAG_FAILED, why)) => Error::Remote(why.to_owned()),
        Some((TAG_FILE, rest)) => match rest.split_once(": ") {
            Some((errno, message)) if errno.parse::<i32>().is_ok_and(|e| e > 0) => Error::File {
                errno: errno.parse().unwrap_or(libc::EIO),
                message: message.to_owned(),
            },
            _ => Error::Remote(reason.to_owned()),
        },
        _ => Error::Remote(reason.to_owned()),
    }
}
