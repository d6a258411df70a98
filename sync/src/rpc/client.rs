//! The connecting side: opens a connection, passes the gate, and makes the session's
//! calls, each bounded in time, as an [`Upstream`].

use std::collections::VecDeque;
use std::future::Future;
use std::rc::Rc;
use std::time::Duration;

use capnp_rpc::rpc_twoparty_capnp::Side;
use capnp_rpc::twoparty::VatNetwork;
use capnp_rpc::RpcSystem;
use computer_vfs::{Applied, BlockHash, ChangeEntry, ChangePage, Cursor, Revision, StoredBlock};
use tokio::sync::watch;
use tokio::task::{spawn_local, JoinHandle};

use super::{call_error, tcp_stream, unix_stream, Address, Reader, Writer};
use crate::sync_capnp::{file_reader, file_writer, gate, listener, session};
use crate::{
    wire, Bounded, ClientInfo, DirPage, Error, NodeInfo, Result, ServerInfo, Upstream,
    WorkspaceStats, PROTOCOL_VERSION,
};
use computer_vfs::{CheckReport, CompactReport, GrepMatch, GrepOptions};

/// How long a client waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectOptions {
    /// For the connection and the hello together.
    pub connect_timeout: Duration,
    /// For the answer to each call. A call that gets none in time fails
    /// [`Error::Disconnected`] and ends the connection: a server that does not answer is
    /// treated as gone.
    pub call_timeout: Duration,
}

impl Default for ConnectOptions {
    fn default() -> ConnectOptions {
        ConnectOptions {
            connect_timeout: Duration::from_secs(10),
            call_timeout: Duration::from_secs(60),
        }
    }
}

/// Connects to the server at `address` and passes its gate with `token`, as `client`,
/// with the default [`ConnectOptions`]. See [`connect_with`].
pub async fn connect(
    address: &Address,
    token: &[u8],
    client: ClientInfo,
) -> Result<(RemoteUpstream, ServerInfo)> {
    connect_with(address, token, client, ConnectOptions::default()).await
}

/// Connects to the server at `address` and passes its gate with `token`, as `client`
/// (a replica names its peer and replica id; a plain client leaves both empty).
///
/// Fails [`Error::Refused`] if the server turns the client away (wrong token, another
/// protocol version: the message says which), [`Error::Disconnected`] if the server
/// cannot be reached or does not answer within [`ConnectOptions::connect_timeout`].
///
/// # Panics
///
/// Outside a tokio [`LocalSet`](tokio::task::LocalSet) (see [`super::run_local`]): the
/// connection runs as a local task.
pub async fn connect_with(
    address: &Address,
    token: &[u8],
    client: ClientInfo,
    options: ConnectOptions,
) -> Result<(RemoteUpstream, ServerInfo)> {
    let peer = address.to_string();
    match tokio::time::timeout(
        options.connect_timeout,
        open_session(address, token, client, options),
    )
    .await
    {
        Ok(opened) => opened,
        Err(_) => Err(Error::disconnected(
            peer,
            format!("no session opened within {:?}", options.connect_timeout),
        )),
    }
}

async fn open_stream(address: &Address) -> std::io::Result<(Reader, Writer)> {
    match address {
        Address::Unix(path) => Ok(unix_stream(tokio::net::UnixStream::connect(path).await?)),
        Address::Tcp(host_port) => {
            tcp_stream(tokio::net::TcpStream::connect(host_port.as_str()).await?)
        }
    }
}

async fn open_session(
    address: &Address,
    token: &[u8],
    client: ClientInfo,
    options: ConnectOptions,
) -> Result<(RemoteUpstream, ServerInfo)> {
    let peer = address.to_string();
    let (reader, writer) = open_stream(address)
        .await
        .map_err(|error| Error::unreachable(&peer, plain_io(&error)))?;
    let network = VatNetwork::new(reader, writer, Side::Client, wire::reader_options());
    let mut rpc = RpcSystem::new(Box::new(network), None);
    let gate: gate::Client = rpc.bootstrap(Side::Server);
    let (lost, _) = watch::channel(None);
    let task = spawn_local({
        let lost = lost.clone();
        async move {
            let reason = match rpc.await {
                Ok(()) => "the connection was closed".to_owned(),
                Err(error) => error.to_string(),
            };
            lost.send_replace(Some(reason));
        }
    });
    // From here on, returning drops the link, which closes the connection.
    let link = Rc::new(Link {
        peer,
        call_timeout: options.call_timeout,
        lost,
        task,
        client,
    });
    let mut hello = gate.hello_request();
    {
        let mut params = hello.get();
        params.set_version(PROTOCOL_VERSION);
        wire::write_token(token, |token| params.set_token(token))?;
        wire::write_client_info(&link.client, params.init_client())?;
    }
    let response = match link.answer(hello.send().promise).await {
        Ok(response) => response,
        Err(error) => return Err(not_our_protocol(error)),
    };
    let results = response.get()?;
    let info = wire::read_server_info(results.get_server()?)?;
    if info.version != PROTOCOL_VERSION {
        return Err(Error::Refused(format!(
            "the server speaks protocol version {}, this client version {PROTOCOL_VERSION}",
            info.version
        )));
    }
    let session = results.get_session()?;
    let upstream = RemoteUpstream {
        session,
        link,
        revision: info.revision,
    };
    Ok((upstream, info))
}

/// An I/O error in lower case, without Rust's `(os error N)` tail.
fn plain_io(error: &std::io::Error) -> String {
    let text = error.to_string();
    let text = match text.rfind(" (os error ") {
        Some(at) => &text[..at],
        None => &text,
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// A hello whose answer could not even be framed came from a server of another kind (an
/// HTTP server answers with text): that is final, and says so.
fn not_our_protocol(error: Error) -> Error {
    let framing = |reason: &str| {
        ["segment", "too large", "prematurely"]
            .iter()
            .any(|sign| reason.contains(sign))
    };
    match &error {
        Error::Disconnected { reason, .. } if framing(reason) => Error::Refused(
            "its answer is not in the computerd protocol (is it another kind of server?)".into(),
        ),
        _ => error,
    }
}

/// One connection: its task, and why it ended once it has.
struct Link {
    /// The server's address, as errors name it.
    peer: String,
    call_timeout: Duration,
    /// Why the connection ended, once it has.
    lost: watch::Sender<Option<String>>,
    task: JoinHandle<()>,
    /// Who the hello said we are (an [`Error::Replaced`] names it).
    client: ClientInfo,
}

impl Link {
    fn lost_reason(&self) -> Option<String> {
        self.lost.borrow().clone()
    }

    /// Ends the connection for `reason` (kept if it ended already for another).
    fn lose(&self, reason: &str) {
        self.lost.send_if_modified(|lost| {
            if lost.is_some() {
                return false;
            }
            *lost = Some(reason.to_owned());
            true
        });
        self.task.abort();
    }

    /// Waits for a call's answer: within the call timeout, and no longer than the
    /// connection lives.
    async fn answer<T>(&self, call: impl Future<Output = capnp::Result<T>>) -> Result<T> {
        if let Some(reason) = self.lost_reason() {
            return Err(Error::disconnected(&self.peer, reason));
        }
        let mut lost = self.lost.subscribe();
        let answered = tokio::select! {
            answered = tokio::time::timeout(self.call_timeout, call) => answered,
            _ = lost.wait_for(Option::is_some) => {
                let reason = self.lost_reason().unwrap_or_default();
                return Err(Error::disconnected(&self.peer, reason));
            }
        };
        match answered {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(error)) => {
                let error = call_error(error, &self.peer, &self.client);
                if let Error::Disconnected { reason, .. } = &error {
                    self.lose(reason);
                }
                Err(error)
            }
            Err(_) => {
                let reason = format!("no answer within {:?}", self.call_timeout);
                self.lose(&reason);
                Err(Error::disconnected(&self.peer, reason))
            }
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        // Closes the socket: the server forgets the session and its listeners.
        self.task.abort();
    }
}

/// A session on a server, over one connection: what a [`crate::Replica`] syncs against,
/// and what a client runs file commands through. Clones share the connection, which
/// closes when the last clone is dropped.
///
/// Every call fails [`Error::Disconnected`] once the connection is lost (or a call got
/// no answer within [`ConnectOptions::call_timeout`]); connect again to go on. Must be
/// used inside the [`LocalSet`](tokio::task::LocalSet) it was connected in.
#[derive(Clone)]
pub struct RemoteUpstream {
    session: session::Client,
    link: Rc<Link>,
    /// The server's revision at the hello: where a watch starts.
    revision: Revision,
}

impl RemoteUpstream {
    /// The server's runner (`exec_capnp`), to run commands on its workspace. A server
    /// that runs none fails it with its reason.
    pub async fn runner(&self) -> Result<crate::exec_capnp::runner::Client> {
        let request = self.session.runner_request();
        let answer = self.link.answer(request.send().promise).await?;
        Ok(answer.get()?.get_runner()?)
    }

    /// Waits for the answer to a call on a capability this session handed out (the
    /// runner's), bounded by the connection's call timeout; a lost connection fails it.
    pub async fn answer<T>(&self, call: impl Future<Output = capnp::Result<T>>) -> Result<T> {
        self.link.answer(call).await
    }

    /// The server's address.
    pub fn peer(&self) -> &str {
        &self.link.peer
    }

    /// Asks the server to tell this client whenever its revision moves. The receiver
    /// starts at the revision of the hello and sees the server's revision soon after
    /// every change (changes close together may be seen once, as the last); it closes
    /// when the connection is lost or closed.
    pub async fn watch(&self) -> Result<watch::Receiver<Revision>> {
        let (sender, receiver) = watch::channel(self.revision);
        let listener: listener::Client = capnp_rpc::new_client(RevisionListener { sender });
        let mut request = self.session.watch_request();
        request.get().set_listener(listener);
        self.link.answer(request.send().promise).await?;
        Ok(receiver)
    }
}

impl RemoteUpstream {
    /// Opens the file at `path` on the server's workspace (a final symlink followed) for
    /// reading in pieces. Fails [`Error::File`] (with the store's errno) if it cannot.
    pub async fn open_read(&self, path: &str) -> Result<RemoteFileReader> {
        let mut request = self.session.open_read_request();
        request
            .get()
            .set_path(wire::file_path(path.as_bytes())?.as_bytes());
        let response = self.link.answer(request.send().promise).await?;
        let results = response.get()?;
        Ok(RemoteFileReader {
            reader: results.get_reader()?,
            link: self.link.clone(),
            size: results.get_size(),
            next_offset: 0,
            ahead: VecDeque::new(),
            at_end: false,
        })
    }

    /// Opens a stream to the file at `path` on the server's workspace: without `append`
    /// it replaces the file whole at [`RemoteFileWriter::commit`] (dropped before, it
    /// leaves the file as it was); with `append` it adds past the file's current end
    /// (created if missing).
    pub async fn open_write(&self, path: &str, append: bool) -> Result<RemoteFileWriter> {
        let mut request = self.session.open_write_request();
        {
            let mut params = request.get();
            params.set_path(wire::file_path(path.as_bytes())?.as_bytes());
            params.set_append(append);
        }
        let response = self.link.answer(request.send().promise).await?;
        Ok(RemoteFileWriter {
            writer: response.get()?.get_writer()?,
            link: self.link.clone(),
            offset: 0,
            ahead: VecDeque::new(),
        })
    }
}

/// Typed file operations on the server's workspace. Each fails [`Error::File`] (the
/// store's errno and one line naming the path) when the store refuses it.
impl RemoteUpstream {
    /// A node's attributes (`follow`: a final symlink followed), with a symlink's target.
    pub async fn stat(&self, path: &str, follow: bool) -> Result<NodeInfo> {
        let mut request = self.session.stat_request();
        {
            let mut params = request.get();
            params.set_path(wire::file_path(path.as_bytes())?.as_bytes());
            params.set_follow(follow);
        }
        let response = self.link.answer(request.send().promise).await?;
        wire::read_node(response.get()?.get_node()?)
    }

    /// A page of directory `path`'s entries after position `after` (0 starts), at most
    /// `max_entries` (and [`wire::LIST_ENTRIES_MAX`]).
    pub async fn list(&self, path: &str, after: u64, max_entries: u32) -> Result<DirPage> {
        let mut request = self.session.list_request();
        {
            let mut params = request.get();
            params.set_path(wire::file_path(path.as_bytes())?.as_bytes());
            params.set_after(after);
            params.set_max_entries(max_entries);
        }
        let response = self.link.answer(request.send().promise).await?;
        let results = response.get()?;
        Ok(DirPage {
            items: wire::read_dir_items(results.get_entries()?)?,
            next: results.get_next(),
            complete: results.get_complete(),
        })
    }

    pub async fn mkdir(&self, path: &str, parents: bool, perm: u32) -> Result<()> {
        let mut request = self.session.mkdir_request();
        {
            let mut params = request.get();
            params.set_path(wire::file_path(path.as_bytes())?.as_bytes());
            params.set_parents(parents);
            params.set_perm(perm);
        }
        self.link.answer(request.send().promise).await.map(drop)
    }

    pub async fn remove(&self, path: &str, recursive: bool, force: bool) -> Result<()> {
        let mut request = self.session.remove_request();
        {
            let mut params = request.get();
            params.set_path(wire::file_path(path.as_bytes())?.as_bytes());
            params.set_recursive(recursive);
            params.set_force(force);
        }
        self.link.answer(request.send().promise).await.map(drop)
    }

    pub async fn rename(&self, from: &str, to: &str) -> Result<()> {
        let mut request = self.session.rename_request();
        {
            let mut params = request.get();
            params.set_from(wire::file_path(from.as_bytes())?.as_bytes());
            params.set_to(wire::file_path(to.as_bytes())?.as_bytes());
        }
        self.link.answer(request.send().promise).await.map(drop)
    }

    pub async fn copy(&self, from: &str, to: &str, recursive: bool) -> Result<()> {
        let mut request = self.session.copy_request();
        {
            let mut params = request.get();
            params.set_from(wire::file_path(from.as_bytes())?.as_bytes());
            params.set_to(wire::file_path(to.as_bytes())?.as_bytes());
            params.set_recursive(recursive);
        }
        self.link.answer(request.send().promise).await.map(drop)
    }

    pub async fn symlink(&self, target: &str, path: &str) -> Result<()> {
        let mut request = self.session.symlink_request();
        {
            let mut params = request.get();
            params.set_target(target.as_bytes());
            params.set_path(wire::file_path(path.as_bytes())?.as_bytes());
        }
        self.link.answer(request.send().promise).await.map(drop)
    }

    pub async fn link(&self, existing: &str, path: &str) -> Result<()> {
        let mut request = self.session.link_request();
        {
            let mut params = request.get();
            params.set_existing(wire::file_path(existing.as_bytes())?.as_bytes());
            params.set_path(wire::file_path(path.as_bytes())?.as_bytes());
        }
        self.link.answer(request.send().promise).await.map(drop)
    }

    pub async fn chmod(&self, path: &str, perm: u32) -> Result<()> {
        let mut request = self.session.chmod_request();
        {
            let mut params = request.get();
            params.set_path(wire::file_path(path.as_bytes())?.as_bytes());
            params.set_perm(perm);
        }
        self.link.answer(request.send().promise).await.map(drop)
    }

    pub async fn truncate(&self, path: &str, size: u64) -> Result<()> {
        let mut request = self.session.truncate_request();
        {
            let mut params = request.get();
            params.set_path(wire::file_path(path.as_bytes())?.as_bytes());
            params.set_size(size);
        }
        self.link.answer(request.send().promise).await.map(drop)
    }

    /// The paths matching the absolute glob `pattern`, at most `max_paths` (and what an
    /// answer holds: [`wire::FOUND_ITEMS_MAX`] paths, [`wire::FOUND_BYTES_MAX`] bytes).
    pub async fn glob(&self, pattern: &str, max_paths: u32) -> Result<Bounded<String>> {
        let mut request = self.session.glob_request();
        {
            let mut params = request.get();
            params.set_pattern(wire::file_path(pattern.as_bytes())?.as_bytes());
            params.set_max_paths(max_paths);
        }
        let response = self.link.answer(request.send().promise).await?;
        let results = response.get()?;
        Ok(Bounded {
            items: wire::read_found_paths(results.get_paths()?)?,
            complete: results.get_complete(),
        })
    }

    /// The lines matching `pattern` in the files below `path`, at most
    /// `options.max_matches` (and what an answer holds).
    pub async fn grep(
        &self,
        pattern: &str,
        path: &str,
        options: &GrepOptions,
    ) -> Result<Bounded<GrepMatch>> {
        let mut request = self.session.grep_request();
        {
            let mut params = request.get();
            params.set_pattern(pattern.as_bytes());
            params.set_path(wire::file_path(path.as_bytes())?.as_bytes());
            params.set_regex(options.regex);
            params.set_ignore_case(options.ignore_case);
            let max = options.max_matches.unwrap_or(usize::MAX);
            params.set_max_matches(u32::try_from(max).unwrap_or(u32::MAX));
            params.set_include(options.include.as_deref().unwrap_or_default().as_bytes());
        }
        let response = self.link.answer(request.send().promise).await?;
        let results = response.get()?;
        Ok(Bounded {
            items: wire::read_grep_matches(results.get_matches()?)?,
            complete: results.get_complete(),
        })
    }

    /// The workspace's id and figures.
    pub async fn stats(&self) -> Result<WorkspaceStats> {
        let request = self.session.stats_request();
        let response = self.link.answer(request.send().promise).await?;
        wire::read_stats(response.get()?.get_stats()?)
    }

    /// Verifies the server's database from scratch (it reads every block).
    pub async fn check(&self) -> Result<CheckReport> {
        let request = self.session.check_request();
        let response = self.link.answer(request.send().promise).await?;
        wire::read_check_report(response.get()?.get_report()?)
    }

    /// Gives the pages deleted content freed in the server's database back to its disk.
    pub async fn compact(&self) -> Result<CompactReport> {
        let request = self.session.compact_request();
        let response = self.link.answer(request.send().promise).await?;
        wire::read_compact_report(response.get()?.get_report()?)
    }
}

/// Calls of one file stream in flight at once, so the next piece is read from the store
/// while this one travels. Below the server's default of 4 calls per connection
/// ([`super::ServeOptions::calls_per_connection_max`]).
const PIECES_IN_FLIGHT: usize = 3;

/// Waits for a piece's call; a task that ended without an answer lost its connection.
async fn piece_answer<T>(link: &Link, call: JoinHandle<Result<T>>) -> Result<T> {
    match call.await {
        Ok(answer) => answer,
        Err(error) => Err(Error::disconnected(
            &link.peer,
            format!("a file stream's call ended unanswered: {error}"),
        )),
    }
}

/// A file on a server, being read; see [`RemoteUpstream::open_read`]. Memory is
/// [`PIECES_IN_FLIGHT`] pieces of [`wire::FILE_PIECE_BYTES_MAX`] whatever the file's
/// size. Dropping it closes the file on the server.
pub struct RemoteFileReader {
    reader: file_reader::Client,
    link: Rc<Link>,
    size: u64,
    next_offset: u64,
    ahead: VecDeque<JoinHandle<Result<Vec<u8>>>>,
    at_end: bool,
}

impl RemoteFileReader {
    /// The file's size when it was opened.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The next piece of the file, `None` at its end. A file that grows while it is read
    /// is read to its new end.
    pub async fn next_piece(&mut self) -> Result<Option<Vec<u8>>> {
        if self.at_end {
            return Ok(None);
        }
        while self.ahead.len() < PIECES_IN_FLIGHT {
            self.ask_ahead();
        }
        let call = self.ahead.pop_front().expect("pieces were asked for above");
        let piece = piece_answer(&self.link, call).await?;
        if piece.len() < wire::FILE_PIECE_BYTES_MAX {
            // The end: what was asked beyond it is empty.
            self.at_end = true;
            self.abort_ahead();
        }
        Ok((!piece.is_empty()).then_some(piece))
    }

    fn ask_ahead(&mut self) {
        let mut request = self.reader.read_request();
        {
            let mut params = request.get();
            params.set_offset(self.next_offset);
            params.set_max_bytes(wire::FILE_PIECE_BYTES_MAX as u32);
        }
        self.next_offset += wire::FILE_PIECE_BYTES_MAX as u64;
        let link = self.link.clone();
        self.ahead.push_back(spawn_local(async move {
            let response = link.answer(request.send().promise).await?;
            let data = response.get()?.get_data()?;
            Ok(wire::file_piece("file piece", data)?.to_vec())
        }));
    }

    fn abort_ahead(&mut self) {
        for call in self.ahead.drain(..) {
            call.abort();
        }
    }
}

impl Drop for RemoteFileReader {
    fn drop(&mut self) {
        self.abort_ahead();
    }
}

/// A stream to a file on a server; see [`RemoteUpstream::open_write`]. Memory is
/// [`PIECES_IN_FLIGHT`] pieces whatever the file's size.
pub struct RemoteFileWriter {
    writer: file_writer::Client,
    link: Rc<Link>,
    /// Where the next byte goes in the stream.
    offset: u64,
    ahead: VecDeque<JoinHandle<Result<()>>>,
}

impl RemoteFileWriter {
    /// Sends `data` as the stream's next bytes, waiting while [`PIECES_IN_FLIGHT`]
    /// pieces are unanswered.
    pub async fn write(&mut self, data: &[u8]) -> Result<()> {
        for piece in data.chunks(wire::FILE_PIECE_BYTES_MAX) {
            if self.ahead.len() >= PIECES_IN_FLIGHT {
                let call = self.ahead.pop_front().expect("the queue is full");
                piece_answer(&self.link, call).await?;
            }
            let mut request = self.writer.write_request();
            {
                let mut params = request.get();
                params.set_offset(self.offset);
                params.set_data(piece);
            }
            self.offset += piece.len() as u64;
            let link = self.link.clone();
            self.ahead.push_back(spawn_local(async move {
                link.answer(request.send().promise).await.map(drop)
            }));
        }
        Ok(())
    }

    /// Waits for every piece, then puts the stream's content in place; returns the
    /// bytes the stream wrote.
    pub async fn commit(mut self) -> Result<u64> {
        while let Some(call) = self.ahead.pop_front() {
            piece_answer(&self.link, call).await?;
        }
        let request = self.writer.commit_request();
        let response = self.link.answer(request.send().promise).await?;
        Ok(response.get()?.get_size())
    }
}

impl Drop for RemoteFileWriter {
    fn drop(&mut self) {
        for call in self.ahead.drain(..) {
            call.abort();
        }
    }
}

impl Upstream for RemoteUpstream {
    async fn changes(
        &self,
        after: &Cursor,
        max_entries: u32,
        max_bytes: u64,
    ) -> Result<ChangePage> {
        let mut request = self.session.changes_request();
        {
            let mut params = request.get();
            wire::write_cursor(after, params.reborrow().init_after())?;
            params.set_max_entries(max_entries);
            params.set_max_bytes(max_bytes);
        }
        let response = self.link.answer(request.send().promise).await?;
        wire::read_page(response.get()?.get_page()?)
    }

    async fn have_blocks(&self, hashes: &[BlockHash]) -> Result<Vec<bool>> {
        let mut request = self.session.have_blocks_request();
        let params = request.get();
        wire::write_hashes(hashes, |len| params.init_hashes(len))?;
        let response = self.link.answer(request.send().promise).await?;
        wire::read_bools(response.get()?.get_have()?)
    }

    async fn get_blocks(&self, hashes: &[BlockHash]) -> Result<Vec<StoredBlock>> {
        let mut request = self.session.get_blocks_request();
        let params = request.get();
        wire::write_hashes(hashes, |len| params.init_hashes(len))?;
        let response = self.link.answer(request.send().promise).await?;
        wire::read_blocks(response.get()?.get_blocks()?)
    }

    async fn put_blocks(&self, blocks: &[StoredBlock]) -> Result<usize> {
        let mut request = self.session.put_blocks_request();
        let params = request.get();
        wire::write_blocks(blocks, |len| params.init_blocks(len))?;
        let response = self.link.answer(request.send().promise).await?;
        Ok(response.get()?.get_added() as usize)
    }

    /// The server's record of the push: the protocol carries `through` and `conflicts`;
    /// the other fields of [`Applied`] (what the push did on the server) stay empty.
    async fn push(
        &self,
        entries: &[ChangeEntry],
        blocks: &[StoredBlock],
        through: &Cursor,
    ) -> Result<Applied> {
        let mut request = self.session.push_request();
        {
            let mut params = request.get();
            wire::write_entries(entries, |len| params.reborrow().init_entries(len))?;
            wire::write_blocks(blocks, |len| params.reborrow().init_blocks(len))?;
            wire::write_cursor(through, params.init_through())?;
        }
        let response = self.link.answer(request.send().promise).await?;
        let results = response.get()?;
        Ok(Applied {
            through: wire::read_cursor(results.get_applied()?)?,
            conflicts: wire::read_conflicts(results.get_conflicts()?)?,
            ..Applied::default()
        })
    }

    async fn ack(&self, cursor: &Cursor) -> Result<Cursor> {
        let mut request = self.session.ack_request();
        wire::write_cursor(cursor, request.get().init_cursor())?;
        let response = self.link.answer(request.send().promise).await?;
        wire::read_cursor(response.get()?.get_acked()?)
    }
}

/// The client's `Listener`: passes the server's revisions to the watch receivers.
struct RevisionListener {
    sender: watch::Sender<Revision>,
}

impl listener::Server for RevisionListener {
    async fn changed(
        self: Rc<Self>,
        params: listener::ChangedParams,
        _results: listener::ChangedResults,
    ) -> capnp::Result<()> {
        if self.sender.is_closed() {
            // Failing tells the server to stop calling.
            return Err(capnp::Error::failed("no one watches any more".into()));
        }
        let revision = Revision(params.get()?.get_revision());
        self.sender.send_if_modified(|seen| {
            let newer = revision > *seen;
            if newer {
                *seen = revision;
            }
            newer
        });
        Ok(())
    }
}
