//! The replica side of the protocol, without a transport: pull the server's changes,
//! push ours, each in bounded batches whose cursor is recorded in the transaction that
//! applies them. Works against any [`Upstream`]: the RPC client, or the simulation's
//! faulty network.

use computer_vfs::{
    file_blocks, Applied, BlockHash, ChangeEntry, ChangePage, Conflict, Cursor, StoredBlock,
    Workspace,
};

use crate::wire::{BLOCK_DATA_BYTES_PER_CALL_MAX, ENTRIES_PER_PAGE_MAX, HASHES_PER_CALL_MAX};
use crate::{Error, Result, ServerInfo};

/// The name a replica knows its upstream by (its one peer record).
pub const UPSTREAM: &str = "upstream";

/// How often a pull applies one page, fetching again the blocks local changes freed
/// in between, before it gives up on the sync.
const PULL_APPLY_ATTEMPTS: usize = 4;

/// The calls a replica makes on the authoritative side. Every call may fail with
/// [`Error::Disconnected`]; whatever was applied before stays applied.
#[allow(async_fn_in_trait)]
pub trait Upstream {
    async fn changes(&self, after: &Cursor, max_entries: u32, max_bytes: u64)
        -> Result<ChangePage>;
    async fn have_blocks(&self, hashes: &[BlockHash]) -> Result<Vec<bool>>;
    async fn get_blocks(&self, hashes: &[BlockHash]) -> Result<Vec<StoredBlock>>;
    async fn put_blocks(&self, blocks: &[StoredBlock]) -> Result<usize>;
    async fn push(
        &self,
        entries: &[ChangeEntry],
        blocks: &[StoredBlock],
        through: &Cursor,
    ) -> Result<Applied>;
    async fn ack(&self, cursor: &Cursor) -> Result<Cursor>;
}

/// How much one batch carries, each way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchLimits {
    pub entries: u32,
    /// File content a page stands for (a page has at least one entry, whatever its size).
    pub bytes: u64,
    /// Block data per call (a get or a put).
    pub block_bytes: usize,
}

impl Default for BatchLimits {
    fn default() -> BatchLimits {
        BatchLimits {
            entries: 1024,
            bytes: 16 << 20,
            block_bytes: 8 << 20,
        }
    }
}

/// What one sync did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Entries pulled and applied here, and pushed and applied upstream.
    pub pulled: usize,
    pub pushed: usize,
    /// Blocks and their stored bytes that travelled, each way.
    pub blocks_in: usize,
    pub bytes_in: u64,
    pub blocks_out: usize,
    pub bytes_out: u64,
    /// Conflicts resolved here (pull) and upstream (push).
    pub conflicts: Vec<Conflict>,
}

impl SyncReport {
    /// Whether the sync moved anything.
    pub fn moved(&self) -> bool {
        self.pulled > 0 || self.pushed > 0
    }
}

/// Told the paths each applied page of a pull may have changed (a mount tells the
/// kernel to forget what it cached of them).
pub type AppliedObserver = std::sync::Arc<dyn Fn(&[Vec<u8>]) + Send + Sync>;

/// A local workspace replicating an upstream one.
#[derive(Clone)]
pub struct Replica {
    workspace: Workspace,
    upstream_id: String,
    limits: BatchLimits,
    observer: Option<AppliedObserver>,
}

impl Replica {
    /// Binds `workspace` to the upstream that answered `hello` with `server`. A
    /// workspace that already replicates another upstream workspace is refused: mixing
    /// two workspaces' trees would be silent damage.
    pub fn attach(
        workspace: Workspace,
        server: &ServerInfo,
        limits: BatchLimits,
    ) -> Result<Replica> {
        match workspace.peer(UPSTREAM)? {
            Some(record) if record.replica_id != server.workspace_id => {
                return Err(Error::Refused(format!(
                    "this replica belongs to workspace {}, the server serves workspace {}",
                    record.replica_id, server.workspace_id
                )));
            }
            Some(_) => {}
            None => {
                workspace.register_peer(UPSTREAM, &server.workspace_id)?;
            }
        }
        if workspace.chunk_sizes() != server.chunk_sizes {
            tracing::warn!(
                "replica chunk sizes {:?} differ from the server's {:?}: blocks will not be shared",
                workspace.chunk_sizes(),
                server.chunk_sizes
            );
        }
        let limits = BatchLimits {
            entries: limits.entries.clamp(1, ENTRIES_PER_PAGE_MAX as u32),
            bytes: limits.bytes.max(1),
            block_bytes: limits.block_bytes.clamp(1, BLOCK_DATA_BYTES_PER_CALL_MAX),
        };
        Ok(Replica {
            workspace,
            upstream_id: server.workspace_id.clone(),
            limits,
            observer: None,
        })
    }

    /// Calls `observer` with the paths of every page a pull applies, right after it
    /// commits.
    pub fn with_observer(mut self, observer: AppliedObserver) -> Replica {
        self.observer = Some(observer);
        self
    }

    pub fn workspace(&self) -> &Workspace {
        &self.workspace
    }

    /// The replica's identity, which the server fences by: its workspace id, new
    /// whenever the replica's database is created anew.
    pub fn replica_id(&self) -> &str {
        self.workspace.id()
    }

    fn record(&self) -> Result<computer_vfs::PeerState> {
        self.workspace
            .peer(UPSTREAM)?
            .ok_or_else(|| Error::Refused("the replica lost its upstream record".into()))
    }

    /// Whether local changes wait to be pushed.
    pub fn has_unpushed(&self) -> Result<bool> {
        let delivered = self.record()?.delivered;
        let page = self.workspace.changes_for(UPSTREAM, &delivered, 1, 0)?;
        Ok(!page.entries.is_empty() || !page.complete)
    }

    /// Pulls, then pushes, until both sides have nothing more for the other.
    pub async fn sync<U: Upstream>(&self, upstream: &U) -> Result<SyncReport> {
        let mut report = SyncReport::default();
        self.pull(upstream, &mut report).await?;
        self.push(upstream, &mut report).await?;
        Ok(report)
    }

    /// Applies the upstream's changes, a page at a time; each page's cursor is recorded
    /// with it, so an interrupted pull resumes after the last applied page.
    pub async fn pull<U: Upstream>(&self, upstream: &U, report: &mut SyncReport) -> Result<()> {
        loop {
            let from = self.record()?.applied;
            let page = upstream
                .changes(&from, self.limits.entries, self.limits.bytes)
                .await?;
            if !computer_vfs::cursor_at_or_after(&page.next, &from) {
                return Err(Error::Remote(
                    "the server answered a page before the cursor".into(),
                ));
            }
            let wanted = file_blocks(&page.entries);
            let mut missing = self.missing(&wanted)?;
            let mut attempts = 0;
            let applied = loop {
                self.fetch(upstream, &missing, report).await?;
                attempts += 1;
                match self.workspace.apply_pull(
                    UPSTREAM,
                    &self.upstream_id,
                    &page.entries,
                    &[],
                    &page.next,
                ) {
                    Ok(applied) => break applied,
                    Err(error) => {
                        // A local change since the probe may have freed a block the page
                        // shares with a local file (fetched ones are held until the page
                        // lands; those found here were not): fetch what is missing now.
                        missing = self.missing(&wanted)?;
                        if missing.is_empty() || attempts == PULL_APPLY_ATTEMPTS {
                            return Err(error.into());
                        }
                    }
                }
            };
            report.pulled += page.entries.len();
            if let Some(observer) = &self.observer {
                if !applied.paths.is_empty() {
                    observer(&applied.paths);
                }
            }
            report.conflicts.extend(applied.conflicts);
            // The server's record of us only informs it; a lost ack costs nothing but
            // a later one.
            upstream.ack(&applied.through).await?;
            if page.complete {
                return Ok(());
            }
        }
    }

    /// Sends local changes upstream, a page at a time: the blocks the server lacks
    /// first, then the entries with the page's cursor, which the server records in the
    /// transaction that applies them.
    pub async fn push<U: Upstream>(&self, upstream: &U, report: &mut SyncReport) -> Result<()> {
        loop {
            let from = self.record()?.delivered;
            let page = self.workspace.changes_for(
                UPSTREAM,
                &from,
                self.limits.entries as usize,
                self.limits.bytes,
            )?;
            if page.entries.is_empty() {
                // Only our own echoes were left: nothing to send, but move past them.
                if page.next != from {
                    self.workspace
                        .mark_delivered(UPSTREAM, &self.upstream_id, &page.next)?;
                }
                if page.complete {
                    return Ok(());
                }
                continue;
            }
            let wanted = file_blocks(&page.entries);
            let mut missing = Vec::new();
            for chunk in wanted.chunks(HASHES_PER_CALL_MAX) {
                let have = upstream.have_blocks(chunk).await?;
                if have.len() != chunk.len() {
                    return Err(Error::Remote(
                        "the server answered a probe of another length".into(),
                    ));
                }
                missing.extend(chunk.iter().zip(have).filter(|(_, h)| !h).map(|(h, _)| *h));
            }
            let mut batch: Vec<StoredBlock> = Vec::new();
            let mut batch_bytes = 0usize;
            for hash in &missing {
                let block = self.workspace.stored_block(hash)?.ok_or_else(|| {
                    // Freed by a local change since the page was read: the next page
                    // carries the newer state.
                    Error::Store(computer_vfs::Error::Busy(Default::default()))
                })?;
                if !batch.is_empty()
                    && (batch_bytes + block.data.len() > self.limits.block_bytes
                        || batch.len() == HASHES_PER_CALL_MAX)
                {
                    self.put(upstream, &mut batch, report).await?;
                    batch_bytes = 0;
                }
                batch_bytes += block.data.len();
                batch.push(block);
            }
            // The last batch of blocks rides with the entries when it is small.
            let applied = upstream.push(&page.entries, &batch, &page.next).await?;
            report.blocks_out += batch.len();
            report.bytes_out += batch_bytes as u64;
            report.pushed += page.entries.len();
            report.conflicts.extend(applied.conflicts);
            self.workspace
                .mark_delivered(UPSTREAM, &self.upstream_id, &applied.through)?;
            if page.complete {
                return Ok(());
            }
        }
    }

    /// Which of `wanted` this workspace does not store.
    fn missing(&self, wanted: &[BlockHash]) -> Result<Vec<BlockHash>> {
        let have = self.workspace.has_blocks(wanted)?;
        Ok(wanted
            .iter()
            .zip(have)
            .filter(|(_, have)| !have)
            .map(|(h, _)| *h)
            .collect())
    }

    /// Fetches `missing` from upstream, a call's worth at a time. The blocks are held
    /// loose until the page that uses them lands: memory stays at one call's worth,
    /// however large the files.
    async fn fetch<U: Upstream>(
        &self,
        upstream: &U,
        missing: &[BlockHash],
        report: &mut SyncReport,
    ) -> Result<()> {
        let mut next = 0;
        while next < missing.len() {
            let ask = &missing[next..(next + HASHES_PER_CALL_MAX).min(missing.len())];
            let blocks = upstream.get_blocks(ask).await?;
            if blocks.is_empty() {
                return Err(Error::Remote("the server sent no blocks".into()));
            }
            for (block, hash) in blocks.iter().zip(ask) {
                if block.hash != *hash {
                    return Err(Error::Remote("the server sent blocks out of order".into()));
                }
            }
            report.blocks_in += blocks.len();
            report.bytes_in += blocks.iter().map(|b| b.data.len() as u64).sum::<u64>();
            self.workspace.put_blocks(&blocks)?;
            next += blocks.len();
        }
        Ok(())
    }

    async fn put<U: Upstream>(
        &self,
        upstream: &U,
        batch: &mut Vec<StoredBlock>,
        report: &mut SyncReport,
    ) -> Result<()> {
        upstream.put_blocks(batch).await?;
        report.blocks_out += batch.len();
        report.bytes_out += batch.iter().map(|b| b.data.len() as u64).sum::<u64>();
        batch.clear();
        Ok(())
    }
}
