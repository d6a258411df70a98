//! The simulated network between the replicas and the authoritative process: a
//! [`Link`] is one replica's connection, an [`Upstream`] whose every call may lose its
//! request, lose its answer, be delivered twice, or be held back and delivered later,
//! after newer calls (a request stuck in an old connection while the client retried on a
//! new one).
//!
//! Every call yields twice (request in flight, answer in flight), so the simulation can
//! run other replicas' calls, local file operations and crashes in between: calls of
//! different replicas interleave, and a server crash between executing a call and
//! answering it loses the answer. Sessions belong to the server *process*: when it
//! crashes, every connection and every message held back dies with it, and later calls
//! on those connections fail with [`Error::Disconnected`].
//!
//! Nothing here decides by wall clock, thread or hash order: the faults come from the
//! run's [`Choices`].

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use computer_vfs::{Applied, BlockHash, ChangeEntry, ChangePage, Cursor, EntryState, StoredBlock};

use super::choices::Choices;
use crate::{Authority, ClientInfo, Error, PeerSession, Result, ServerInfo, Upstream};

/// The shared token of the simulated deployment.
pub(crate) const TOKEN: &[u8] = b"sim-token";

/// Percent of calls that meet a fault while faults are on.
const FAULT_PERCENT: u64 = 12;
/// Messages held back at most; past it a new delay drops the request instead.
pub(crate) const DELAYED_MAX: usize = 16;

/// What happens to one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    None,
    /// The request never reaches the server.
    DropRequest,
    /// The server executes the call; its answer is lost.
    DropAnswer,
    /// The server executes the call twice; the client sees one answer.
    Duplicate,
    /// The request arrives later, after newer ones; the client gives up waiting.
    Delay,
}

/// A call that changes the server, held back to be delivered later.
#[derive(Clone, Debug)]
pub(crate) enum Request {
    PutBlocks(Vec<StoredBlock>),
    Push {
        entries: Vec<ChangeEntry>,
        blocks: Vec<StoredBlock>,
        through: Cursor,
    },
    Ack(Cursor),
}

impl Request {
    fn name(&self) -> &'static str {
        match self {
            Request::PutBlocks(_) => "put_blocks",
            Request::Push { .. } => "push",
            Request::Ack(_) => "ack",
        }
    }

    /// Runs the request on the server, as if it had just arrived.
    pub(crate) fn run(&self, session: &PeerSession) -> Result<String> {
        Ok(match self {
            Request::PutBlocks(blocks) => format!("{} new", session.put_blocks(blocks)?),
            Request::Push {
                entries,
                blocks,
                through,
            } => {
                let applied = session.push(entries, blocks, through)?;
                format!(
                    "{} changed, {} conflicts",
                    applied.changed,
                    applied.conflicts.len()
                )
            }
            Request::Ack(cursor) => format!("at {}", show_cursor(&session.ack(cursor)?)),
        })
    }
}

/// A message held back, with the server-side session it was sent on.
pub(crate) struct Delayed {
    pub(crate) replica: usize,
    pub(crate) session: PeerSession,
    pub(crate) request: Request,
}

/// One open connection: the server side of it.
struct Connection {
    session: PeerSession,
    replica: usize,
}

/// Counts of what the network did, for the run's summary.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetStats {
    pub calls: u64,
    pub dropped_requests: u64,
    pub dropped_answers: u64,
    pub duplicated: u64,
    pub delayed: u64,
    pub delivered_late: u64,
}

/// Everything the replicas' in-flight syncs share with the simulation driving them:
/// the choices, the server process and its connections, the messages held back, the
/// log. One per run, behind `Rc<RefCell<..>>`; never borrowed across an `.await`.
pub(crate) struct World {
    pub(crate) choices: Box<dyn Choices>,
    pub(crate) faults: bool,
    /// The server process; `None` only inside a restart.
    pub(crate) authority: Option<Authority>,
    connections: BTreeMap<u64, Connection>,
    next_connection: u64,
    pub(crate) delayed: Vec<Delayed>,
    pub(crate) log: Vec<String>,
    pub(crate) stats: NetStats,
}

pub(crate) type Shared = Rc<RefCell<World>>;

impl World {
    pub(crate) fn new(choices: Box<dyn Choices>) -> World {
        World {
            choices,
            faults: true,
            authority: None,
            connections: BTreeMap::new(),
            next_connection: 1,
            delayed: Vec::new(),
            log: Vec::new(),
            stats: NetStats::default(),
        }
    }

    pub(crate) fn note(&mut self, line: String) {
        self.log.push(line);
    }

    fn fault(&mut self, writes: bool) -> Fault {
        self.stats.calls += 1;
        if !self.faults || !self.choices.chance(FAULT_PERCENT) {
            return Fault::None;
        }
        let weights: &[u64] = if writes && self.delayed.len() < DELAYED_MAX {
            &[3, 3, 2, 3]
        } else {
            &[3, 3, 2]
        };
        match self.choices.weighted(weights) {
            0 => Fault::DropRequest,
            1 => Fault::DropAnswer,
            2 => Fault::Duplicate,
            _ => Fault::Delay,
        }
    }

    fn session(&self, connection: u64) -> Option<PeerSession> {
        self.connections.get(&connection).map(|c| c.session.clone())
    }

    /// The server process died: every connection and every message in flight to it go
    /// with it (they hold its workspace, which must be closed before it is reopened).
    pub(crate) fn server_died(&mut self) {
        self.authority = None;
        self.connections.clear();
        self.delayed.clear();
    }

    /// A replica process died or dropped its connection. What it already sent stays in
    /// the network: a held-back message may still arrive.
    pub(crate) fn close(&mut self, connection: u64) {
        self.connections.remove(&connection);
    }

    /// Closes every connection of `replica` (its process died).
    pub(crate) fn close_all_of(&mut self, replica: usize) {
        self.connections.retain(|_, c| c.replica != replica);
    }
}

/// Returns `Pending` once, so the driver runs something else before the call goes on.
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

fn disconnected(why: &str) -> Error {
    Error::disconnected("sim-server", why)
}

/// What a server-side error becomes on the client's side of a connection: the RPC
/// transport's mapping (`rpc.rs`, "Errors across the wire"), so that the simulated
/// replicas meet the errors real ones do (the server's store failing is `Remote` to
/// them, a transient failure, never their own store's error).
fn across_the_wire(error: Error) -> Error {
    match error {
        Error::Refused(_) | Error::Replaced { .. } | Error::Remote(_) | Error::File { .. } => error,
        Error::Malformed { .. } | Error::TooLarge { .. } | Error::Capnp(_) => {
            Error::Refused(format!("the server rejected the request: {error}"))
        }
        Error::Disconnected { .. } | Error::Store(_) => Error::Remote(error.to_string()),
    }
}

/// Connects replica `replica` (its id `replica_id`, its peer name `peer`) through the
/// faulty network: the gate registers the peer, so a lost answer still registered it.
pub(crate) async fn hello(
    world: &Shared,
    replica: usize,
    peer: &str,
    replica_id: &str,
) -> Result<(u64, ServerInfo)> {
    YieldOnce(false).await;
    let (authority, fault) = {
        let mut w = world.borrow_mut();
        let fault = w.fault(false);
        (w.authority.clone(), fault)
    };
    let authority = authority.ok_or_else(|| disconnected("server down"))?;
    note_fault(world, replica, "hello", fault);
    if fault == Fault::DropRequest || fault == Fault::Delay {
        return Err(disconnected("hello lost"));
    }
    let client = ClientInfo {
        replica_id: replica_id.to_owned(),
        peer: peer.to_owned(),
    };
    if fault == Fault::Duplicate {
        // The first registration's session is simply never used.
        authority
            .hello(crate::PROTOCOL_VERSION, TOKEN, &client)
            .map_err(across_the_wire)?;
    }
    let (session, info) = authority
        .hello(crate::PROTOCOL_VERSION, TOKEN, &client)
        .map_err(across_the_wire)?;
    drop(authority);
    // The connection exists on the server from here on, so that a restart before the
    // answer arrives closes it like any other (and releases the server's workspace).
    let connection = {
        let mut w = world.borrow_mut();
        let id = w.next_connection;
        w.next_connection += 1;
        w.connections.insert(id, Connection { session, replica });
        id
    };
    YieldOnce(false).await;
    let mut w = world.borrow_mut();
    if !w.connections.contains_key(&connection) {
        return Err(disconnected("the server restarted before answering hello"));
    }
    if fault == Fault::DropAnswer {
        w.close(connection);
        return Err(disconnected("hello answer lost"));
    }
    Ok((connection, info))
}

fn note_fault(world: &Shared, replica: usize, call: &str, fault: Fault) {
    let mut w = world.borrow_mut();
    match fault {
        Fault::None => {}
        Fault::DropRequest => w.stats.dropped_requests += 1,
        Fault::DropAnswer => w.stats.dropped_answers += 1,
        Fault::Duplicate => w.stats.duplicated += 1,
        Fault::Delay => w.stats.delayed += 1,
    }
    let line = format!("    net r{replica} {call}: {fault:?}");
    w.note(line);
}

/// One replica's connection to the server, as its sync sees it.
pub(crate) struct Link {
    pub(crate) world: Shared,
    pub(crate) replica: usize,
    pub(crate) connection: u64,
}

impl Link {
    /// One call through the network: `run` executes it on the server; `held` is the
    /// request to hold back if the network delays it (`None` for calls that change
    /// nothing, whose delay is a loss).
    async fn call<T>(
        &self,
        name: &str,
        run: impl Fn(&PeerSession) -> Result<T>,
        held: impl FnOnce() -> Option<Request>,
    ) -> Result<T> {
        YieldOnce(false).await;
        let (session, fault) = {
            let mut w = self.world.borrow_mut();
            let session = w.session(self.connection);
            let fault = w.fault(true);
            (session, fault)
        };
        let session = session.ok_or_else(|| disconnected("connection closed"))?;
        note_fault(&self.world, self.replica, name, fault);
        match fault {
            Fault::DropRequest => return Err(disconnected("request lost")),
            Fault::Delay => {
                let request = held();
                let mut w = self.world.borrow_mut();
                if let Some(request) = request {
                    w.delayed.push(Delayed {
                        replica: self.replica,
                        session,
                        request,
                    });
                }
                return Err(disconnected("request delayed"));
            }
            _ => {}
        }
        let mut result = run(&session).map_err(across_the_wire);
        if fault == Fault::Duplicate {
            // The client sees one of the two answers.
            let second = run(&session).map_err(across_the_wire);
            if self.world.borrow_mut().choices.chance(50) {
                result = second;
            }
        }
        // The session holds the server's workspace: not across a possible restart.
        drop(session);
        YieldOnce(false).await;
        if self.world.borrow().session(self.connection).is_none() {
            return Err(disconnected("the server restarted before answering"));
        }
        if fault == Fault::DropAnswer {
            return Err(disconnected("answer lost"));
        }
        result
    }
}

impl Upstream for Link {
    async fn changes(
        &self,
        after: &Cursor,
        max_entries: u32,
        max_bytes: u64,
    ) -> Result<ChangePage> {
        let page = self
            .call(
                "changes",
                |s| s.changes(after, max_entries, max_bytes),
                || None,
            )
            .await?;
        let line = format!(
            "    r{} changes after {}: [{}] next {}{}",
            self.replica,
            show_cursor(after),
            show_entries(&page.entries),
            show_cursor(&page.next),
            if page.complete { ", complete" } else { "" }
        );
        self.world.borrow_mut().note(line);
        Ok(page)
    }

    async fn have_blocks(&self, hashes: &[BlockHash]) -> Result<Vec<bool>> {
        self.call("have_blocks", |s| s.have_blocks(hashes), || None)
            .await
    }

    async fn get_blocks(&self, hashes: &[BlockHash]) -> Result<Vec<StoredBlock>> {
        self.call("get_blocks", |s| s.get_blocks(hashes), || None)
            .await
    }

    async fn put_blocks(&self, blocks: &[StoredBlock]) -> Result<usize> {
        self.call(
            "put_blocks",
            |s| s.put_blocks(blocks),
            || Some(Request::PutBlocks(blocks.to_vec())),
        )
        .await
    }

    async fn push(
        &self,
        entries: &[ChangeEntry],
        blocks: &[StoredBlock],
        through: &Cursor,
    ) -> Result<Applied> {
        let line = format!(
            "    r{} push [{}] through {}",
            self.replica,
            show_entries(entries),
            show_cursor(through)
        );
        self.world.borrow_mut().note(line);
        let applied = self
            .call(
                "push",
                |s| s.push(entries, blocks, through),
                || {
                    Some(Request::Push {
                        entries: entries.to_vec(),
                        blocks: blocks.to_vec(),
                        through: through.clone(),
                    })
                },
            )
            .await?;
        let server_revision = {
            let w = self.world.borrow();
            w.authority
                .as_ref()
                .and_then(|a| a.workspace().revision().ok())
                .map_or(0, |r| r.0)
        };
        let line = format!(
            "    r{} pushed: {} changed (server at revision {server_revision}), through {}, \
             conflicts [{}]",
            self.replica,
            applied.changed,
            show_cursor(&applied.through),
            applied
                .conflicts
                .iter()
                .map(|c| format!(
                    "{} kept as {}",
                    String::from_utf8_lossy(&c.path),
                    String::from_utf8_lossy(&c.kept_as)
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
        self.world.borrow_mut().note(line);
        Ok(applied)
    }

    async fn ack(&self, cursor: &Cursor) -> Result<Cursor> {
        self.call(
            "ack",
            |s| s.ack(cursor),
            || Some(Request::Ack(cursor.clone())),
        )
        .await
    }
}

/// Delivers the held-back message at `index` now; returns a line for the log.
pub(crate) fn deliver_late(world: &Shared, index: usize) -> String {
    let delayed = world.borrow_mut().delayed.remove(index);
    world.borrow_mut().stats.delivered_late += 1;
    let outcome = match delayed.request.run(&delayed.session) {
        Ok(what) => what,
        Err(e) => format!("failed: {e}"),
    };
    format!(
        "late {} of r{} delivered: {outcome}",
        delayed.request.name(),
        delayed.replica
    )
}

/// Entries as `path@revision kind`, for the log.
pub(crate) fn show_entries(entries: &[ChangeEntry]) -> String {
    entries
        .iter()
        .map(|e| {
            let kind = match &e.state {
                EntryState::File { size, perm, .. } => format!("file {size}B {perm:o}"),
                EntryState::Directory { perm, .. } => format!("dir {perm:o}"),
                EntryState::Symlink { target } => {
                    format!("link {}", String::from_utf8_lossy(target))
                }
                EntryState::Removed => "removed".into(),
            };
            format!(
                "{}@{} {kind} (base {})",
                String::from_utf8_lossy(&e.path),
                e.revision.0,
                show_cursor(&e.base)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

pub(crate) fn show_cursor(cursor: &Cursor) -> String {
    format!(
        "{}:{}",
        cursor.revision.0,
        String::from_utf8_lossy(&cursor.path)
    )
}
