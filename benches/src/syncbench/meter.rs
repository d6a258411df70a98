//! An [`Upstream`] that passes every call to the RPC client and records, per kind of call,
//! how many were made, the bytes the proxy forwarded each way while each was in flight,
//! and the time each took (the client's wait: the server's work plus the transfer).
//!
//! Calls are sequential in a sync, so the bytes forwarded during a call are its request
//! and answer. capnp-rpc sends a small `Finish` message (about 40 bytes) after each
//! answer is dropped; it lands in the next call's count, or in "other".

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use computer_sync::rpc::RemoteUpstream;
use computer_sync::{Result, Upstream};
use computer_vfs::{Applied, BlockHash, ChangeEntry, ChangePage, Cursor, StoredBlock};

use super::proxy::Counters;

/// Totals for one kind of call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallStat {
    pub calls: u64,
    pub up: u64,
    pub down: u64,
    pub time: Duration,
    /// Entries (changes, push), hashes (have, get) or blocks (put) the calls carried.
    pub items: u64,
}

/// Every call of one sync.
#[derive(Clone, Debug, Default)]
pub struct CallLog {
    pub by_kind: BTreeMap<&'static str, CallStat>,
    /// Each `changes` call in order: its time, the entries it returned, and where the
    /// next page starts.
    pub pages: Vec<(Duration, usize, Cursor)>,
}

impl CallLog {
    pub fn get(&self, kind: &str) -> CallStat {
        self.by_kind.get(kind).cloned().unwrap_or_default()
    }

    /// Time spent waiting for the upstream, all calls.
    pub fn wait(&self) -> Duration {
        self.by_kind.values().map(|s| s.time).sum()
    }

    /// (up, down) over all calls.
    pub fn bytes(&self) -> (u64, u64) {
        self.by_kind
            .values()
            .fold((0, 0), |(u, d), s| (u + s.up, d + s.down))
    }
}

pub struct Metered<'a> {
    inner: &'a RemoteUpstream,
    wire: &'a Counters,
    log: RefCell<CallLog>,
}

impl<'a> Metered<'a> {
    pub fn new(inner: &'a RemoteUpstream, wire: &'a Counters) -> Metered<'a> {
        Metered {
            inner,
            wire,
            log: RefCell::new(CallLog::default()),
        }
    }

    pub fn into_log(self) -> CallLog {
        self.log.into_inner()
    }

    async fn call<T>(
        &self,
        kind: &'static str,
        items: usize,
        call: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let (up, down) = self.wire.snapshot();
        let start = Instant::now();
        let result = call.await;
        let time = start.elapsed();
        let (up2, down2) = self.wire.snapshot();
        let mut log = self.log.borrow_mut();
        let stat = log.by_kind.entry(kind).or_default();
        stat.calls += 1;
        stat.up += up2 - up;
        stat.down += down2 - down;
        stat.time += time;
        stat.items += items as u64;
        result
    }
}

impl Upstream for Metered<'_> {
    async fn changes(
        &self,
        after: &Cursor,
        max_entries: u32,
        max_bytes: u64,
    ) -> Result<ChangePage> {
        let start = Instant::now();
        let page = self
            .call(
                "changes",
                0,
                self.inner.changes(after, max_entries, max_bytes),
            )
            .await?;
        let mut log = self.log.borrow_mut();
        log.pages
            .push((start.elapsed(), page.entries.len(), page.next.clone()));
        if let Some(stat) = log.by_kind.get_mut("changes") {
            stat.items += page.entries.len() as u64;
        }
        Ok(page)
    }

    async fn have_blocks(&self, hashes: &[BlockHash]) -> Result<Vec<bool>> {
        self.call("have_blocks", hashes.len(), self.inner.have_blocks(hashes))
            .await
    }

    async fn get_blocks(&self, hashes: &[BlockHash]) -> Result<Vec<StoredBlock>> {
        let start = self.log.borrow().get("get_blocks").items;
        let blocks = self
            .call("get_blocks", 0, self.inner.get_blocks(hashes))
            .await?;
        // Count the blocks answered, not the hashes asked (an answer may stop early).
        if let Some(stat) = self.log.borrow_mut().by_kind.get_mut("get_blocks") {
            stat.items = start + blocks.len() as u64;
        }
        Ok(blocks)
    }

    async fn put_blocks(&self, blocks: &[StoredBlock]) -> Result<usize> {
        self.call("put_blocks", blocks.len(), self.inner.put_blocks(blocks))
            .await
    }

    async fn push(
        &self,
        entries: &[ChangeEntry],
        blocks: &[StoredBlock],
        through: &Cursor,
    ) -> Result<Applied> {
        self.call(
            "push",
            entries.len(),
            self.inner.push(entries, blocks, through),
        )
        .await
    }

    async fn ack(&self, cursor: &Cursor) -> Result<Cursor> {
        self.call("ack", 0, self.inner.ack(cursor)).await
    }
}
