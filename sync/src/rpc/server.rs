//! The serving side: accepts connections, gives each a `Gate`, opens a `Session` for a
//! client that passes it, runs each call's work on the blocking pool, and tells
//! listeners when the workspace's revision moves.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use capnp_rpc::rpc_twoparty_capnp::Side;
use capnp_rpc::twoparty::VatNetwork;
use capnp_rpc::RpcSystem;
use computer_vfs::Revision;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::Notify;
use tokio::task::{spawn_local, JoinHandle, LocalSet};

use super::{exception, tcp_stream, unix_stream, Address, Reader, Writer};
use crate::files::{self, FileStreams, ReadStream, WriteStream};
use crate::sync_capnp::{file_reader, file_writer, gate, listener, runner, session};
use crate::{wire, Authority, Error, PeerSession, Result, WorkspaceStats};
use computer_vfs::{GrepOptions, MkdirOptions, RmOptions};

/// How a server behaves and what it bounds.
#[derive(Clone)]
pub struct ServeOptions {
    /// Serves the file streams (`openRead`, `openWrite`); without it they fail with
    /// "this server serves no file streams".
    pub files: Option<FileStreams>,
    /// File streams one connection may hold open; one more fails at once.
    pub streams_per_connection_max: usize,
    /// Connections open at once; one more is closed as soon as it is accepted.
    pub connections_max: usize,
    /// Calls one connection may have in flight; one more fails at once (transiently).
    pub calls_per_connection_max: usize,
    /// Listeners (`Session.watch`) one connection may register.
    pub listeners_per_connection_max: usize,
    /// A connection that opens no session within this is closed.
    pub hello_timeout: Duration,
    /// How often the workspace's revision is read for listeners.
    pub watch_interval: Duration,
    /// A listener that does not answer `changed` within this is dropped.
    pub listener_timeout: Duration,
    /// Makes the runner a session hands out (`Session.runner`), given who called (the
    /// connection's other end as the kernel tells it); without it the call fails "this
    /// server runs no commands".
    pub runner: Option<RunnerMaker>,
}

/// Makes a session's runner (`exec_capnp::runner`), on the server's thread, for the
/// caller its hello named. The runner is the caller's: sync only hands it out after the
/// gate let the caller in.
pub type RunnerMaker = Arc<dyn Fn(&str) -> runner::Client + Send + Sync>;

impl Default for ServeOptions {
    fn default() -> ServeOptions {
        ServeOptions {
            files: None,
            streams_per_connection_max: 16,
            connections_max: 64,
            calls_per_connection_max: 4,
            listeners_per_connection_max: 16,
            hello_timeout: Duration::from_secs(10),
            watch_interval: Duration::from_millis(50),
            listener_timeout: Duration::from_secs(60),
            runner: None,
        }
    }
}

/// A bound socket to [`serve`] on.
#[derive(Debug)]
pub enum ServerSocket {
    Unix(UnixListener),
    Tcp(TcpListener),
}

impl ServerSocket {
    /// Binds `address`. A Unix socket file left by a server that is gone (connecting to
    /// it is refused) is replaced; a live server's socket, or any other file, is not.
    pub async fn bind(address: &Address) -> io::Result<ServerSocket> {
        match address {
            Address::Unix(path) => bind_unix(path).map(ServerSocket::Unix),
            Address::Tcp(host_port) => TcpListener::bind(host_port.as_str())
                .await
                .map(ServerSocket::Tcp),
        }
    }

    /// Where the socket listens (for TCP, with the port the system chose for port 0).
    pub fn local_address(&self) -> io::Result<Address> {
        match self {
            ServerSocket::Unix(listener) => {
                let address = listener.local_addr()?;
                let path = address.as_pathname().ok_or_else(|| {
                    io::Error::new(io::ErrorKind::Unsupported, "the socket has no path")
                })?;
                Ok(Address::Unix(path.to_owned()))
            }
            ServerSocket::Tcp(listener) => Ok(Address::Tcp(listener.local_addr()?.to_string())),
        }
    }

    /// A new connection, and who is at its other end as the kernel tells it (a local
    /// process's user and pid, a remote address): the caller a runner is made for.
    async fn accept(&self) -> io::Result<(Reader, Writer, String)> {
        match self {
            ServerSocket::Unix(listener) => {
                let stream = listener.accept().await?.0;
                let caller = match stream.peer_cred() {
                    Ok(cred) => match cred.pid() {
                        Some(pid) => format!("uid {} pid {pid}", cred.uid()),
                        None => format!("uid {}", cred.uid()),
                    },
                    Err(_) => "a local process".to_owned(),
                };
                let (reader, writer) = unix_stream(stream);
                Ok((reader, writer, caller))
            }
            ServerSocket::Tcp(listener) => {
                let (stream, address) = listener.accept().await?;
                let (reader, writer) = tcp_stream(stream)?;
                Ok((reader, writer, address.to_string()))
            }
        }
    }
}

fn bind_unix(path: &Path) -> io::Result<UnixListener> {
    use std::os::unix::fs::FileTypeExt;

    let in_use = match UnixListener::bind(path) {
        Err(error) if error.kind() == io::ErrorKind::AddrInUse => error,
        other => return other,
    };
    let is_socket = std::fs::symlink_metadata(path)?.file_type().is_socket();
    let refused = matches!(
        std::os::unix::net::UnixStream::connect(path),
        Err(error) if error.kind() == io::ErrorKind::ConnectionRefused
    );
    if !(is_socket && refused) {
        return Err(in_use);
    }
    std::fs::remove_file(path)?;
    UnixListener::bind(path)
}

/// Serves `authority` on `socket` until `shutdown` resolves, then closes every
/// connection (calls in flight are cut; their work on the store finishes or rolls back
/// on its own). Runs its own [`LocalSet`], so it can be awaited on any tokio runtime with
/// time and IO enabled, but its future is `!Send`: await it, or `spawn_local` it.
///
/// Errors of one connection end that connection, and are logged; failures to accept
/// (out of file descriptors) are logged and retried after a pause.
pub async fn serve(
    socket: ServerSocket,
    authority: Authority,
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
) {
    LocalSet::new()
        .run_until(serve_here(socket, authority, options, shutdown))
        .await
}

/// Pause after a failed accept, so a server out of file descriptors does not spin.
const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(100);

async fn serve_here(
    socket: ServerSocket,
    authority: Authority,
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
) {
    let server = Rc::new(Server {
        authority,
        options,
        connections: Cell::new(0),
        waiting: RefCell::default(),
        watchers: RefCell::new(Watchers::default()),
    });
    let _watch = AbortOnDrop(spawn_local(watch_revisions(server.clone())));
    let mut shutdown = pin!(shutdown);
    let mut next_connection = 0u64;
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => return,
            accepted = socket.accept() => accepted,
        };
        let (reader, writer, caller) = match accepted {
            Ok(stream) => stream,
            Err(error) => {
                tracing::warn!("failed to accept a connection: {error}");
                tokio::time::sleep(ACCEPT_RETRY_DELAY).await;
                continue;
            }
        };
        let open = server.connections.get();
        if open >= server.options.connections_max && !server.evict_oldest_waiting() {
            tracing::warn!("closed a new connection: {open} are open, the most allowed");
            continue;
        }
        next_connection += 1;
        let guard = ConnectionGuard::new(server.clone(), next_connection);
        // Waiting from now: the next accept may come before this task first runs.
        let connection = Rc::new(Connection {
            id: next_connection,
            caller,
            calls: Cell::new(0),
            streams: Cell::new(0),
            hello: Cell::new(Hello::Waiting),
            opened: Notify::new(),
            evicted: Notify::new(),
        });
        server.waiting.borrow_mut().push_back(connection.clone());
        spawn_local(run_connection(guard, connection, reader, writer));
    }
}

/// What every connection of one server shares (on the server's one thread).
struct Server {
    authority: Authority,
    options: ServeOptions,
    connections: Cell<usize>,
    /// Connections that have not opened a session yet, oldest first.
    waiting: RefCell<std::collections::VecDeque<Rc<Connection>>>,
    watchers: RefCell<Watchers>,
}

impl Server {
    /// With every slot taken, a new connection closes the oldest one that has not said
    /// hello rather than being refused: otherwise anyone who can reach the socket
    /// could hold every slot with silent connections, renewed as each times out, and
    /// keep every replica out. False if every open connection has a session.
    fn evict_oldest_waiting(&self) -> bool {
        let Some(oldest) = self.waiting.borrow_mut().pop_front() else {
            return false;
        };
        tracing::debug!(
            connection = oldest.id,
            "closed a connection that had not said hello, to make room for a new one"
        );
        oldest.evicted.notify_one();
        true
    }

    fn stop_waiting(&self, id: u64) {
        self.waiting.borrow_mut().retain(|c| c.id != id);
    }
}

/// One connection's state, shared by its gate and its sessions.
struct Connection {
    id: u64,
    /// Who is at the other end, as the kernel tells it.
    caller: String,
    calls: Cell<usize>,
    /// File streams open.
    streams: Cell<usize>,
    hello: Cell<Hello>,
    /// Fired when a hello opens a session: the connection may then stay.
    opened: Notify,
    /// Fired when a newer connection needs the slot of this one, still without a session.
    evicted: Notify,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Hello {
    Waiting,
    Opened,
    Refused,
}

/// Counts a connection as open while it lives, and forgets its listeners when it ends,
/// however it ends (closed, failed, or dropped with the server).
struct ConnectionGuard {
    server: Rc<Server>,
    id: u64,
}

impl ConnectionGuard {
    fn new(server: Rc<Server>, id: u64) -> ConnectionGuard {
        server.connections.set(server.connections.get() + 1);
        ConnectionGuard { server, id }
    }
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        let server = &self.server;
        server
            .connections
            .set(server.connections.get().saturating_sub(1));
        if let Ok(mut watchers) = server.watchers.try_borrow_mut() {
            watchers.forget_connection(self.id);
        }
        server.stop_waiting(self.id);
    }
}

async fn run_connection(
    guard: ConnectionGuard,
    connection: Rc<Connection>,
    reader: Reader,
    writer: Writer,
) {
    let server = guard.server.clone();
    let gate: gate::Client = capnp_rpc::new_client(GateServer {
        server: server.clone(),
        connection: connection.clone(),
    });
    let (reader, writer) = super::backpressure::read_while_answers_flow(reader, writer);
    let network = VatNetwork::new(reader, writer, Side::Server, wire::reader_options());
    let mut rpc = pin!(RpcSystem::new(Box::new(network), Some(gate.client)));
    let opened = tokio::time::timeout(server.options.hello_timeout, connection.opened.notified());
    let ended = tokio::select! {
        ended = &mut rpc => ended,
        () = connection.evicted.notified() => return,
        opened = opened => match opened {
            Ok(()) => {
                server.stop_waiting(connection.id);
                rpc.await
            }
            Err(_) => {
                tracing::debug!(connection = guard.id, "closed a connection that opened no session in time");
                return;
            }
        },
    };
    match ended {
        Ok(()) => tracing::debug!(connection = guard.id, "connection closed"),
        // A peer's garbage or a broken socket: it ends this connection only.
        Err(error) => tracing::info!(connection = guard.id, "connection ended: {error}"),
    }
}

/// Counts a call in flight on its connection while it lives.
struct CallSlot<'a>(&'a Connection);

impl Connection {
    fn begin_call(&self, options: &ServeOptions) -> capnp::Result<CallSlot<'_>> {
        let calls = self.calls.get();
        if calls >= options.calls_per_connection_max {
            return Err(exception(&Error::Remote(format!(
                "{calls} calls are in flight on this connection, the most allowed: wait for \
                 their answers"
            ))));
        }
        self.calls.set(calls + 1);
        Ok(CallSlot(self))
    }
}

impl Drop for CallSlot<'_> {
    fn drop(&mut self) {
        self.0.calls.set(self.0.calls.get().saturating_sub(1));
    }
}

/// Counts a file stream open on its connection while it lives.
struct StreamSlot(Rc<Connection>);

impl StreamSlot {
    fn take(connection: &Rc<Connection>, options: &ServeOptions) -> capnp::Result<StreamSlot> {
        let open = connection.streams.get();
        if open >= options.streams_per_connection_max {
            return Err(exception(&Error::Refused(format!(
                "{open} file streams are open on this connection, the most allowed: finish \
                 one first"
            ))));
        }
        connection.streams.set(open + 1);
        Ok(StreamSlot(connection.clone()))
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.streams.set(self.0.streams.get().saturating_sub(1));
    }
}

/// Decodes a call's parameters: a violation is the client's, and is answered as such.
fn decode<T>(read: impl FnOnce() -> Result<T>) -> capnp::Result<T> {
    read().map_err(|error| exception(&error))
}

/// Encodes a call's results: a violation is this server's.
fn encode(write: impl FnOnce() -> Result<()>) -> capnp::Result<()> {
    write().map_err(|error| {
        tracing::error!("failed to encode an answer: {error}");
        exception(&Error::Remote(format!(
            "the server could not encode its answer: {error}"
        )))
    })
}

/// Runs `work` (a store call) on the blocking pool, off the event loop.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    match tokio::task::spawn_blocking(work).await {
        Ok(outcome) => outcome,
        Err(error) => {
            tracing::error!("failed to finish a call: its worker failed: {error}");
            Err(Error::Remote("the server's worker failed".into()))
        }
    }
}

// ---------------------------------------------------------------------------------------
// Gate.

struct GateServer {
    server: Rc<Server>,
    connection: Rc<Connection>,
}

impl gate::Server for GateServer {
    async fn hello(
        self: Rc<Self>,
        params: gate::HelloParams,
        mut results: gate::HelloResults,
    ) -> capnp::Result<()> {
        let connection = &self.connection;
        let _slot = connection.begin_call(&self.server.options)?;
        if connection.hello.get() == Hello::Refused {
            return Err(exception(&Error::Refused(
                "a hello on this connection was refused already: connect again".into(),
            )));
        }
        let (version, token, client) = decode(|| {
            let params = params.get()?;
            Ok((
                params.get_version(),
                wire::read_token(params.get_token()?)?,
                wire::read_client_info(params.get_client()?)?,
            ))
        })?;
        drop(params);
        let authority = self.server.authority.clone();
        let peer = client.peer.clone();
        let opened = blocking(move || authority.hello(version, &token, &client)).await;
        let (session, info) = match opened {
            Ok(opened) => opened,
            Err(error) => {
                if matches!(error, Error::Refused(_)) {
                    tracing::warn!(
                        connection = connection.id,
                        peer,
                        "refused a client: {error}"
                    );
                    connection.hello.set(Hello::Refused);
                }
                return Err(exception(&error));
            }
        };
        // The session exists only now, past the version and token checks.
        let session: session::Client = capnp_rpc::new_client(SessionServer {
            server: self.server.clone(),
            connection: connection.clone(),
            session,
            caller: match peer.is_empty() {
                true => connection.caller.clone(),
                false => format!("{} (peer {peer})", connection.caller),
            },
        });
        let mut out = results.get();
        encode(|| wire::write_server_info(&info, out.reborrow().init_server()))?;
        out.set_session(session);
        if connection.hello.get() == Hello::Waiting {
            connection.hello.set(Hello::Opened);
            connection.opened.notify_one();
        }
        Ok(())
    }
}

/// Declares a typed file call that changes the tree and answers nothing: decode its
/// parameters into a closure over the path API, run it on the store.
macro_rules! change_call {
    ($name:ident, $params:ty, $results:ty, |$p:ident| $decode:expr, |$fs:ident, $args:pat_param| $op:expr) => {
        async fn $name(self: Rc<Self>, params: $params, _results: $results) -> capnp::Result<()> {
            let _slot = self.begin_call()?;
            let args = decode(|| {
                let $p = params.get()?;
                Ok($decode)
            })?;
            drop(params);
            self.on_store(true, move |$fs| {
                let $args = args;
                $op
            })
            .await
        }
    };
}

// ---------------------------------------------------------------------------------------
// Session.

struct SessionServer {
    server: Rc<Server>,
    connection: Rc<Connection>,
    session: PeerSession,
    /// Who called: the connection's other end, and the peer its hello named.
    caller: String,
}

impl SessionServer {
    fn begin_call(&self) -> capnp::Result<CallSlot<'_>> {
        self.connection.begin_call(&self.server.options)
    }
}

impl session::Server for SessionServer {
    async fn changes(
        self: Rc<Self>,
        params: session::ChangesParams,
        mut results: session::ChangesResults,
    ) -> capnp::Result<()> {
        let _slot = self.begin_call()?;
        let (after, max_entries, max_bytes) = decode(|| {
            let params = params.get()?;
            Ok((
                wire::read_cursor(params.get_after()?)?,
                params.get_max_entries(),
                params.get_max_bytes(),
            ))
        })?;
        drop(params);
        let session = self.session.clone();
        let page = blocking(move || session.changes(&after, max_entries, max_bytes))
            .await
            .map_err(|error| exception(&error))?;
        encode(|| wire::write_page(&page, results.get().init_page()))
    }

    async fn have_blocks(
        self: Rc<Self>,
        params: session::HaveBlocksParams,
        mut results: session::HaveBlocksResults,
    ) -> capnp::Result<()> {
        let _slot = self.begin_call()?;
        let hashes = decode(|| wire::read_hashes(params.get()?.get_hashes()?))?;
        drop(params);
        let session = self.session.clone();
        let have = blocking(move || session.have_blocks(&hashes))
            .await
            .map_err(|error| exception(&error))?;
        let out = results.get();
        encode(|| wire::write_bools(&have, |len| out.init_have(len)))
    }

    async fn get_blocks(
        self: Rc<Self>,
        params: session::GetBlocksParams,
        mut results: session::GetBlocksResults,
    ) -> capnp::Result<()> {
        let _slot = self.begin_call()?;
        let hashes = decode(|| wire::read_hashes(params.get()?.get_hashes()?))?;
        drop(params);
        let session = self.session.clone();
        let blocks = blocking(move || session.get_blocks(&hashes))
            .await
            .map_err(|error| exception(&error))?;
        let out = results.get();
        encode(|| wire::write_blocks(&blocks, |len| out.init_blocks(len)))
    }

    async fn push(
        self: Rc<Self>,
        params: session::PushParams,
        mut results: session::PushResults,
    ) -> capnp::Result<()> {
        let _slot = self.begin_call()?;
        let (entries, blocks, through) = decode(|| {
            let params = params.get()?;
            Ok((
                wire::read_entries(params.get_entries()?)?,
                wire::read_blocks(params.get_blocks()?)?,
                wire::read_cursor(params.get_through()?)?,
            ))
        })?;
        drop(params);
        let session = self.session.clone();
        let applied = blocking(move || session.push(&entries, &blocks, &through))
            .await
            .map_err(|error| exception(&error))?;
        let mut out = results.get();
        encode(|| {
            wire::write_cursor(&applied.through, out.reborrow().init_applied())?;
            wire::write_conflicts(&applied.conflicts, |len| out.init_conflicts(len))
        })
    }

    async fn ack(
        self: Rc<Self>,
        params: session::AckParams,
        mut results: session::AckResults,
    ) -> capnp::Result<()> {
        let _slot = self.begin_call()?;
        let cursor = decode(|| wire::read_cursor(params.get()?.get_cursor()?))?;
        drop(params);
        let session = self.session.clone();
        let acked = blocking(move || session.ack(&cursor))
            .await
            .map_err(|error| exception(&error))?;
        encode(|| wire::write_cursor(&acked, results.get().init_acked()))
    }

    async fn watch(
        self: Rc<Self>,
        params: session::WatchParams,
        _results: session::WatchResults,
    ) -> capnp::Result<()> {
        let _slot = self.begin_call()?;
        let listener = decode(|| Ok(params.get()?.get_listener()?))?;
        let max = self.server.options.listeners_per_connection_max;
        let added = self
            .server
            .watchers
            .borrow_mut()
            .add(self.connection.id, listener, max);
        added.map_err(|error| exception(&error))
    }

    async fn put_blocks(
        self: Rc<Self>,
        params: session::PutBlocksParams,
        mut results: session::PutBlocksResults,
    ) -> capnp::Result<()> {
        let _slot = self.begin_call()?;
        let blocks = decode(|| wire::read_blocks(params.get()?.get_blocks()?))?;
        drop(params);
        let session = self.session.clone();
        let added = blocking(move || session.put_blocks(&blocks))
            .await
            .map_err(|error| exception(&error))?;
        // At most BLOCKS_PER_CALL_MAX.
        results
            .get()
            .set_added(u32::try_from(added).unwrap_or(u32::MAX));
        Ok(())
    }

    async fn open_read(
        self: Rc<Self>,
        params: session::OpenReadParams,
        mut results: session::OpenReadResults,
    ) -> capnp::Result<()> {
        let _slot = self.begin_call()?;
        self.files()?;
        let slot = StreamSlot::take(&self.connection, &self.server.options)?;
        let path = decode(|| Ok(wire::file_path(params.get()?.get_path()?)?.to_owned()))?;
        drop(params);
        let ws = self.session.workspace().clone();
        let (stream, size) = blocking(move || ReadStream::open(&ws, &path))
            .await
            .map_err(|error| exception(&error))?;
        let reader: file_reader::Client = capnp_rpc::new_client(ReaderServer {
            server: self.server.clone(),
            stream: Arc::new(stream),
            _slot: slot,
        });
        let mut out = results.get();
        out.set_reader(reader);
        out.set_size(size);
        Ok(())
    }

    async fn open_write(
        self: Rc<Self>,
        params: session::OpenWriteParams,
        mut results: session::OpenWriteResults,
    ) -> capnp::Result<()> {
        let _slot = self.begin_call()?;
        let streams = self.files()?.clone();
        let slot = StreamSlot::take(&self.connection, &self.server.options)?;
        let (path, append) = decode(|| {
            let params = params.get()?;
            Ok((
                wire::file_path(params.get_path()?)?.to_owned(),
                params.get_append(),
            ))
        })?;
        drop(params);
        let ws = self.session.workspace().clone();
        let stream = blocking(move || WriteStream::open(&ws, &path, append, &streams))
            .await
            .map_err(|error| exception(&error))?;
        let writer: file_writer::Client = capnp_rpc::new_client(WriterServer {
            server: self.server.clone(),
            stream: Arc::new(stream),
            _slot: slot,
        });
        results.get().set_writer(writer);
        Ok(())
    }

    async fn stat(
        self: Rc<Self>,
        params: session::StatParams,
        mut results: session::StatResults,
    ) -> capnp::Result<()> {
        let _slot = self.begin_call()?;
        let (path, follow) = decode(|| {
            let params = params.get()?;
            Ok((path_param(params.get_path())?, params.get_follow()))
        })?;
        drop(params);
        let node = self
            .on_store(false, move |fs| files::node_info(fs, &path, follow))
            .await?;
        encode(|| wire::write_node(&node, results.get().init_node()))
    }

    async fn list(
        self: Rc<Self>,
        params: session::ListParams,
        mut results: session::ListResults,
    ) -> capnp::Result<()> {
        let _slot = self.begin_call()?;
        let (path, after, max) = decode(|| {
            let params = params.get()?;
            let max = (params.get_max_entries() as usize).clamp(1, wire::LIST_ENTRIES_MAX);
            Ok((path_param(params.get_path())?, params.get_after(), max))
        })?;
        drop(params);
        let page = self
            .on_store(false, move |fs| files::list_page(fs, &path, after, max))
            .await?;
        let mut out = results.get();
        out.set_next(page.next);
        out.set_complete(page.complete);
        encode(|| wire::write_dir_items(&page.items, |len| out.init_entries(len)))
    }

    change_call!(
        mkdir,
        session::MkdirParams,
        session::MkdirResults,
        |p| (path_param(p.get_path())?, p.get_parents(), p.get_perm()),
        |fs, (path, parents, perm)| fs.mkdir(
            &path,
            MkdirOptions {
                recursive: parents,
                mode: perm & 0o7777
            }
        )
    );

    change_call!(
        remove,
        session::RemoveParams,
        session::RemoveResults,
        |p| (path_param(p.get_path())?, p.get_recursive(), p.get_force()),
        |fs, (path, recursive, force)| fs.rm(&path, RmOptions { recursive, force })
    );

    change_call!(
        rename,
        session::RenameParams,
        session::RenameResults,
        |p| (path_param(p.get_from())?, path_param(p.get_to())?),
        |fs, (from, to)| fs.rename(&from, &to)
    );

    change_call!(
        copy,
        session::CopyParams,
        session::CopyResults,
        |p| (
            path_param(p.get_from())?,
            path_param(p.get_to())?,
            p.get_recursive()
        ),
        |fs, (from, to, recursive)| fs.copy(&from, &to, recursive)
    );

    change_call!(
        symlink,
        session::SymlinkParams,
        session::SymlinkResults,
        |p| (
            symlink_target_param(p.get_target())?,
            path_param(p.get_path())?
        ),
        |fs, (target, path)| fs.symlink(&target, &path)
    );

    change_call!(
        link,
        session::LinkParams,
        session::LinkResults,
        |p| (path_param(p.get_existing())?, path_param(p.get_path())?),
        |fs, (existing, path)| fs.link(&existing, &path)
    );

    change_call!(
        chmod,
        session::ChmodParams,
        session::ChmodResults,
        |p| (path_param(p.get_path())?, p.get_perm()),
        |fs, (path, perm)| fs.chmod(&path, perm & 0o7777)
    );

    change_call!(
        truncate,
        session::TruncateParams,
        session::TruncateResults,
        |p| (path_param(p.get_path())?, p.get_size()),
        |fs, (path, size)| fs.truncate(&path, size)
    );

    async fn glob(
        self: Rc<Self>,
        params: session::GlobParams,
        mut results: session::GlobResults,
    ) -> capnp::Result<()> {
        let _slot = self.begin_call()?;
        let (pattern, max) = decode(|| {
            let params = params.get()?;
            Ok((
                path_param(params.get_pattern())?,
                params.get_max_paths() as usize,
            ))
        })?;
        drop(params);
        let paths = self.on_store(false, move |fs| fs.glob(&pattern)).await?;
        let max = max.min(wire::FOUND_ITEMS_MAX);
        let (kept, complete) =
            wire::bounded_prefix(&paths, max, wire::FOUND_BYTES_MAX, String::len);
        let mut out = results.get();
        out.set_complete(complete);
        encode(|| wire::write_found_paths(kept, |len| out.init_paths(len)))
    }

    async fn grep(
        self: Rc<Self>,
        params: session::GrepParams,
        mut results: session::GrepResults,
    ) -> capnp::Result<()> {
        let _slot = self.begin_call()?;
        let (pattern, path, options, asked) = decode(|| {
            let params = params.get()?;
            let pattern = utf8_param("grep pattern", params.get_pattern()?)?;
            let include = utf8_param("grep include", params.get_include()?)?;
            let asked = params.get_max_matches() as usize;
            let options = GrepOptions {
                regex: params.get_regex(),
                ignore_case: params.get_ignore_case(),
                // One more than an answer holds: more matched than it says.
                max_matches: Some(asked.min(wire::FOUND_ITEMS_MAX + 1)),
                include: (!include.is_empty()).then_some(include),
            };
            Ok((pattern, path_param(params.get_path())?, options, asked))
        })?;
        drop(params);
        let matches = self
            .on_store(false, move |fs| fs.grep(&pattern, &path, &options))
            .await?;
        let answer = files::grep_answer(matches, asked);
        let mut out = results.get();
        out.set_complete(answer.complete);
        encode(|| wire::write_grep_matches(&answer.items, |len| out.init_matches(len)))
    }

    async fn stats(
        self: Rc<Self>,
        _params: session::StatsParams,
        mut results: session::StatsResults,
    ) -> capnp::Result<()> {
        let _slot = self.begin_call()?;
        let stats = self
            .on_store(false, |fs| {
                let ws = fs.workspace();
                Ok(WorkspaceStats {
                    workspace_id: ws.id().to_owned(),
                    stats: ws.stats()?,
                })
            })
            .await?;
        encode(|| wire::write_stats(&stats, results.get().init_stats()))
    }

    async fn check(
        self: Rc<Self>,
        _params: session::CheckParams,
        mut results: session::CheckResults,
    ) -> capnp::Result<()> {
        let _slot = self.begin_call()?;
        let report = self.on_store(false, |fs| fs.workspace().check()).await?;
        encode(|| wire::write_check_report(&report, results.get().init_report()))
    }

    async fn compact(
        self: Rc<Self>,
        _params: session::CompactParams,
        mut results: session::CompactResults,
    ) -> capnp::Result<()> {
        let _slot = self.begin_call()?;
        let report = self
            .on_store(false, |fs| fs.workspace().compact(&mut |_| {}))
            .await?;
        encode(|| wire::write_compact_report(&report, results.get().init_report()))
    }

    async fn runner(
        self: Rc<Self>,
        _params: session::RunnerParams,
        mut results: session::RunnerResults,
    ) -> capnp::Result<()> {
        let Some(make) = &self.server.options.runner else {
            return Err(capnp::Error::unimplemented(
                "this server runs no commands".into(),
            ));
        };
        results.get().set_runner(make(&self.caller));
        Ok(())
    }
}

/// A symlink target parameter: the path API takes UTF-8 targets.
fn symlink_target_param(reader: capnp::Result<capnp::data::Reader<'_>>) -> Result<String> {
    let target = utf8_param("symlink target", reader?)?;
    if target.is_empty() || target.len() > wire::SYMLINK_TARGET_BYTES_MAX {
        return Err(Error::malformed("symlink target", "empty or too long"));
    }
    Ok(target)
}

/// A text parameter of at most a path's length.
fn utf8_param(what: &'static str, bytes: &[u8]) -> Result<String> {
    if bytes.len() > wire::PATH_BYTES_MAX {
        return Err(Error::TooLarge {
            what,
            unit: "bytes",
            len: bytes.len() as u64,
            max: wire::PATH_BYTES_MAX as u64,
        });
    }
    let text = std::str::from_utf8(bytes).map_err(|_| Error::malformed(what, "not UTF-8"))?;
    if text.contains('\0') {
        return Err(Error::malformed(what, "contains NUL"));
    }
    Ok(text.to_owned())
}

/// A path parameter of a typed file call.
fn path_param(reader: capnp::Result<capnp::data::Reader<'_>>) -> Result<String> {
    Ok(wire::file_path(reader?)?.to_owned())
}

impl SessionServer {
    /// Runs a typed file operation on the store, off the event loop (`changes`: it may
    /// change the tree, so the observer hears of it).
    async fn on_store<T: Send + 'static>(
        &self,
        changes: bool,
        op: impl FnOnce(&computer_vfs::Fs) -> computer_vfs::Result<T> + Send + 'static,
    ) -> capnp::Result<T> {
        let streams = self.files()?.clone();
        let ws = self.session.workspace().clone();
        blocking(move || files::run_op(&ws, &streams, changes, op))
            .await
            .map_err(|error| exception(&error))
    }

    /// How this server serves file streams, or the refusal if it serves none.
    fn files(&self) -> capnp::Result<&FileStreams> {
        self.server
            .options
            .files
            .as_ref()
            .ok_or_else(|| exception(&Error::Refused("this server serves no file streams".into())))
    }
}

// ---------------------------------------------------------------------------------------
// File streams.

struct ReaderServer {
    server: Rc<Server>,
    stream: Arc<ReadStream>,
    _slot: StreamSlot,
}

impl file_reader::Server for ReaderServer {
    async fn read(
        self: Rc<Self>,
        params: file_reader::ReadParams,
        mut results: file_reader::ReadResults,
    ) -> capnp::Result<()> {
        let _slot = self._slot.0.begin_call(&self.server.options)?;
        let (offset, len) = decode(|| {
            let params = params.get()?;
            Ok((
                params.get_offset(),
                wire::file_piece_len(params.get_max_bytes()),
            ))
        })?;
        drop(params);
        let stream = self.stream.clone();
        let data = blocking(move || stream.read_at(offset, len))
            .await
            .map_err(|error| exception(&error))?;
        results.get().set_data(&data);
        Ok(())
    }
}

struct WriterServer {
    server: Rc<Server>,
    stream: Arc<WriteStream>,
    _slot: StreamSlot,
}

// A stream's last owner closes its file, which is work on the store (an abandoned
// replacement is removed): off the event loop, where there is a runtime to run it.
impl Drop for ReaderServer {
    fn drop(&mut self) {
        drop_off_the_loop(self.stream.clone());
    }
}

impl Drop for WriterServer {
    fn drop(&mut self) {
        drop_off_the_loop(self.stream.clone());
    }
}

fn drop_off_the_loop<T: Send + Sync + 'static>(last: Arc<T>) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn_blocking(move || drop(last));
    }
}

impl file_writer::Server for WriterServer {
    async fn write(
        self: Rc<Self>,
        params: file_writer::WriteParams,
        _results: file_writer::WriteResults,
    ) -> capnp::Result<()> {
        let _slot = self._slot.0.begin_call(&self.server.options)?;
        let (offset, data) = decode(|| {
            let params = params.get()?;
            let data = wire::file_piece("file piece", params.get_data()?)?.to_vec();
            Ok((params.get_offset(), data))
        })?;
        drop(params);
        let stream = self.stream.clone();
        blocking(move || stream.write_at(offset, &data))
            .await
            .map_err(|error| exception(&error))
    }

    async fn commit(
        self: Rc<Self>,
        _params: file_writer::CommitParams,
        mut results: file_writer::CommitResults,
    ) -> capnp::Result<()> {
        let _slot = self._slot.0.begin_call(&self.server.options)?;
        let stream = self.stream.clone();
        let size = blocking(move || stream.commit())
            .await
            .map_err(|error| exception(&error))?;
        results.get().set_size(size);
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Listeners.

/// The listeners of every connection, and what each was last told.
#[derive(Default)]
struct Watchers {
    next_key: u64,
    by_key: HashMap<u64, Watcher>,
}

struct Watcher {
    connection: u64,
    listener: listener::Client,
    /// The last revision the listener acknowledged.
    told: Revision,
    /// A `changed` call is on its way: the next waits for its answer (coalescing).
    in_flight: bool,
}

impl Watchers {
    fn add(&mut self, connection: u64, listener: listener::Client, max: usize) -> Result<()> {
        let count = self
            .by_key
            .values()
            .filter(|w| w.connection == connection)
            .count();
        if count >= max {
            return Err(Error::TooLarge {
                what: "listeners of a connection",
                unit: "listeners",
                len: count as u64 + 1,
                max: max as u64,
            });
        }
        self.next_key += 1;
        self.by_key.insert(
            self.next_key,
            Watcher {
                connection,
                listener,
                // Told nothing yet: the next poll tells the current revision.
                told: Revision(0),
                in_flight: false,
            },
        );
        Ok(())
    }

    /// The listeners to tell about `revision` now, marked as being told.
    fn due(&mut self, revision: Revision) -> Vec<(u64, listener::Client)> {
        let mut due = Vec::new();
        for (key, watcher) in &mut self.by_key {
            if !watcher.in_flight && watcher.told < revision {
                watcher.in_flight = true;
                due.push((*key, watcher.listener.clone()));
            }
        }
        due
    }

    fn told(&mut self, key: u64, revision: Revision) {
        if let Some(watcher) = self.by_key.get_mut(&key) {
            watcher.in_flight = false;
            watcher.told = revision;
        }
    }

    fn forget(&mut self, key: u64) {
        self.by_key.remove(&key);
    }

    fn forget_connection(&mut self, connection: u64) {
        self.by_key.retain(|_, w| w.connection != connection);
    }
}

/// Reads the revision every `watch_interval` while anyone listens, and tells each
/// listener behind it.
async fn watch_revisions(server: Rc<Server>) {
    let mut ticks = tokio::time::interval(server.options.watch_interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if server.watchers.borrow().by_key.is_empty() {
            continue;
        }
        let workspace = server.authority.workspace().clone();
        let revision = match blocking(move || Ok(workspace.revision()?)).await {
            Ok(revision) => revision,
            Err(error) => {
                tracing::warn!("failed to read the revision for listeners: {error}");
                continue;
            }
        };
        let due = server.watchers.borrow_mut().due(revision);
        for (key, listener) in due {
            spawn_local(tell(server.clone(), key, listener, revision));
        }
    }
}

async fn tell(server: Rc<Server>, key: u64, listener: listener::Client, revision: Revision) {
    let mut request = listener.changed_request();
    request.get().set_revision(revision.0);
    let answer =
        tokio::time::timeout(server.options.listener_timeout, request.send().promise).await;
    let mut watchers = server.watchers.borrow_mut();
    match answer {
        Ok(Ok(_)) => watchers.told(key, revision),
        // Gone, failing, or too slow: it listens no more.
        Ok(Err(_)) | Err(_) => watchers.forget(key),
    }
}

/// Aborts a task when dropped (the server's poller, when the server stops).
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
