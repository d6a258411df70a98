//! Moving content between staging files and the store.
//!
//! *Ingesting* streams a staging file through the chunker into blocks and makes them the
//! inode's content. Hashing and compression happen outside the write lock, with the
//! cheap existence probe on a reader connection; the store is then changed in bounded
//! transactions, so a large file never holds the writer for long. A file that needs more
//! than one batch is assembled on a *shadow* node (a node with no links, which a crash
//! leaves as an orphan that the next open deletes) and swapped in by the last
//! transaction. Holes in the staging file (`SEEK_HOLE`) stay holes.
//!
//! *Materialising* writes an inode's stored content into a staging file, for a file
//! opened for writing that is not staged yet.

use std::os::fd::AsRawFd;
use std::sync::Arc;

use crate::base::lock;
use crate::block::{self, BlockHash, EncodedBlock};
use crate::content::{self, ContentCtx, Extent};
use crate::db::WriteTxn;
use crate::error::{Error, Result};
use crate::staged_rows;
use crate::staging::{StagedFile, StagedState};
use crate::store;
use crate::types::{FileKind, InodeNo, NewNode, TimestampNs};
use crate::workspace::Workspace;

/// Bytes of new, encoded blocks collected before a transaction stores them.
const INGEST_BATCH_BYTES: usize = 4 << 20;
/// Bytes read from a staging file at a time.
const READ_PIECE: usize = 1 << 20;
/// Files up to this size are ingested together, many per transaction.
pub(crate) const SMALL_FILE_BYTES: u64 = 1 << 20;
/// Files ingested in one transaction at most.
pub(crate) const SMALL_FILES_PER_BATCH: usize = 256;

// A small file is read in one piece.
const _: () = assert!(SMALL_FILE_BYTES <= READ_PIECE as u64);

/// A chunk hashed (and, if the store lacked it, compressed) outside the write lock.
struct PreparedChunk {
    offset: u64,
    len: u64,
    hash: BlockHash,
    /// The encoded block, if the store did not have it when we looked.
    encoded: Option<EncodedBlock>,
    /// The raw bytes of a chunk the store had, in case it vanished since.
    raw: Option<Vec<u8>>,
}

/// What an ingestion did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IngestOutcome {
    /// The store now holds the staged content and nothing changed it meanwhile.
    Clean,
    /// The store holds a snapshot, but the file may have changed since (a writer is
    /// open, or it was reopened for writing): it stays dirty.
    StillDirty,
    /// The inode no longer exists.
    Gone,
    /// A writer changed the file while it was read: nothing was stored, it stays dirty.
    Torn,
}

/// `[start, end)` ranges of a file that hold data (holes skipped), via SEEK_DATA/HOLE.
fn data_segments(file: &std::fs::File, size: u64) -> Vec<(u64, u64)> {
    let fd = file.as_raw_fd();
    let mut out = Vec::new();
    let mut pos: i64 = 0;
    while (pos as u64) < size {
        // SAFETY: lseek on a valid fd has no memory effects.
        let data = unsafe { libc::lseek(fd, pos, libc::SEEK_DATA) };
        if data < 0 {
            let errno = std::io::Error::last_os_error().raw_os_error();
            if errno == Some(libc::ENXIO) {
                break; // only a hole up to the end
            }
            // No SEEK_DATA support: treat it all as data.
            return vec![(0, size)];
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        let end = if hole < 0 {
            size as i64
        } else {
            hole.min(size as i64)
        };
        if end > data {
            out.push((data as u64, end as u64));
        }
        pos = end.max(data + 1);
    }
    out
}

/// A small staged file read for [`Workspace::ingest_small`].
struct SmallWork<'a> {
    file: &'a Arc<StagedFile>,
    _serial: std::sync::MutexGuard<'a, ()>,
    version: u64,
    size: u64,
    mtime: crate::types::TimestampNs,
    ctime: crate::types::TimestampNs,
    chunks: Vec<PreparedChunk>,
}

impl Workspace {
    /// Ingests a staging file into the store. Safe to call concurrently with passthrough
    /// writers: what they change after the snapshot keeps the file dirty.
    pub(crate) fn ingest(&self, staged: &Arc<StagedFile>) -> Result<IngestOutcome> {
        let _one_at_a_time = lock(&staged.ingest_serial);
        let version = {
            let mut state = lock(&staged.state);
            if !state.dirty {
                return Ok(IngestOutcome::Clean);
            }
            state.ingesting = true;
            state.version
        };
        let result = self.ingest_snapshot(staged, version);
        lock(&staged.state).ingesting = false;
        result
    }

    fn ingest_snapshot(&self, staged: &Arc<StagedFile>, version: u64) -> Result<IngestOutcome> {
        let mut shadow = None;
        let result = self.ingest_through_shadow(staged, version, &mut shadow);
        if result.is_err() && shadow.is_some() {
            // The blocks stored so far hang off a node without links: drop them now (a
            // failed ingestion is retried from the staging file, which still holds all).
            if let Err(err) = self.abandon_shadow(shadow) {
                tracing::warn!(
                    "failed to drop the partial ingestion of {}: {err}",
                    staged.ino
                );
            }
        }
        result
    }

    /// [`Workspace::ingest_snapshot`]; `shadow` is the node that holds the blocks stored
    /// so far of a large file, while it exists.
    fn ingest_through_shadow(
        &self,
        staged: &Arc<StagedFile>,
        version: u64,
        shadow: &mut Option<InodeNo>,
    ) -> Result<IngestOutcome> {
        let (size, mtime, ctime) = staged.stat()?;
        let mut batch: Vec<PreparedChunk> = Vec::new();
        let mut batch_bytes = 0usize;
        let max = self.chunk_sizes().max;
        let mut window: Vec<u8> = Vec::with_capacity(max + READ_PIECE);
        for (start, end) in data_segments(staged.file(), size) {
            window.clear();
            let mut window_start = start;
            let mut read_pos = start;
            loop {
                while window.len() < max && read_pos < end {
                    let want = READ_PIECE.min((end - read_pos) as usize);
                    let at = window.len();
                    window.resize(at + want, 0);
                    let got = staged.read_at(&mut window[at..], read_pos)?;
                    window.truncate(at + got);
                    if got == 0 {
                        // The file shrank under us: ingest what is there; it stays dirty.
                        read_pos = end;
                        break;
                    }
                    read_pos += got as u64;
                }
                let at_end = read_pos >= end;
                let Some(cut) = self.chunker().next_cut(&window, at_end) else {
                    break;
                };
                let chunk = &window[..cut];
                batch_bytes += cut;
                batch.push(self.prepare_chunk(window_start, chunk)?);
                window.drain(..cut);
                window_start += cut as u64;
                if batch_bytes >= INGEST_BATCH_BYTES {
                    if !self.still_staged(staged) {
                        // Deleted while we worked: drop what we stored so far.
                        return self.abandon_shadow(shadow.take());
                    }
                    let target = match *shadow {
                        Some(s) => s,
                        None => {
                            let s = self.create_shadow()?;
                            *shadow = Some(s);
                            s
                        }
                    };
                    self.store_batch(target, std::mem::take(&mut batch))?;
                    batch_bytes = 0;
                }
            }
        }
        let ingested = Ingested {
            size,
            mtime,
            ctime,
            chunks: std::mem::take(&mut batch),
        };
        self.commit_snapshot(staged, version, shadow, ingested)
    }

    /// The final transaction of an ingestion: swaps the content read from `staged` (when
    /// its state was `version`) in, with the staged state held so that no writer can
    /// open in between and be forgotten.
    fn commit_snapshot(
        &self,
        staged: &StagedFile,
        version: u64,
        shadow: &mut Option<InodeNo>,
        ingested: Ingested,
    ) -> Result<IngestOutcome> {
        let mut state = lock(&staged.state);
        let changed = state.version != version;
        let clean = !changed && state.writers == 0;
        let read = (ingested.size, ingested.mtime, ingested.ctime);
        if (changed || state.writers > 0) && staged.stat()? != read {
            // A snapshot of a file that changed while it was read may hold a state the
            // file never had (half of one write): store none.
            drop(state);
            self.abandon_shadow(shadow.take())?;
            return Ok(IngestOutcome::Torn);
        }
        let ctx = self.ctx();
        let (ino, size, shadow_ino) = (staged.ino, ingested.size, *shadow);
        let outcome = self
            .db()
            .write(|txn| commit_ingested(txn, &ctx, ino, shadow_ino, ingested, clean))?;
        // Deleted by the transaction, whichever way it went.
        *shadow = None;
        if outcome == IngestOutcome::Clean {
            self.files().overlay_ended();
            state.dirty = false;
            state.size = size;
        }
        Ok(outcome)
    }

    /// After the commit of an ingestion of several files (`committed`: it succeeded),
    /// each of `states` ingested clean at the size `stored` gives (`None`: changed
    /// while read) is clean, and each may be ingested again.
    fn end_ingesting(
        &self,
        states: &mut [std::sync::MutexGuard<'_, StagedState>],
        stored: impl Iterator<Item = Option<u64>>,
        committed: bool,
    ) {
        for (state, stored) in states.iter_mut().zip(stored) {
            if let Some(size) = stored.filter(|_| committed) {
                self.files().overlay_ended();
                state.dirty = false;
                state.size = size;
            }
            state.ingesting = false;
        }
    }

    /// Ingests several small staged files (each at most [`SMALL_FILE_BYTES`]) in one
    /// transaction: a build or `git checkout` writes thousands of them.
    pub(crate) fn ingest_small(&self, files: &[Arc<StagedFile>]) -> Result<()> {
        let mut work: Vec<SmallWork<'_>> = files
            .iter()
            .filter_map(|file| self.read_small(file))
            .collect();
        if work.is_empty() {
            return Ok(());
        }
        work.sort_by_key(|w| w.file.ino);
        // Hold every file's state through the commit, as `ingest` does for one. A file
        // that changed since it was read may have been read half-changed: it is stored
        // by a later round (it is dirty and queued again), not now.
        let mut states: Vec<_> = work.iter().map(|w| lock(&w.file.state)).collect();
        let clean: Vec<bool> = work
            .iter()
            .zip(&states)
            .map(|(w, state)| state.version == w.version && state.writers == 0)
            .collect();
        let ctx = self.ctx();
        let result = self.db().write(|txn| {
            for (w, &clean) in work.iter_mut().zip(&clean) {
                if !clean {
                    continue;
                }
                let ingested = Ingested {
                    size: w.size,
                    mtime: w.mtime,
                    ctime: w.ctime,
                    chunks: std::mem::take(&mut w.chunks),
                };
                commit_ingested(txn, &ctx, w.file.ino, None, ingested, clean)?;
            }
            Ok(())
        });
        let stored = work
            .iter()
            .zip(clean)
            .map(|(w, clean)| clean.then_some(w.size));
        self.end_ingesting(&mut states, stored, result.is_ok());
        result
    }

    /// Reads (and chunks) a small staged file for [`Workspace::ingest_small`], marked as
    /// being ingested. `None`: nothing to do now (clean, written, or being ingested
    /// elsewhere: it will be clean or queued again), or it could not be read.
    fn read_small<'a>(&self, file: &'a Arc<StagedFile>) -> Option<SmallWork<'a>> {
        let serial = file.ingest_serial.try_lock().ok()?;
        let version = {
            let mut state = lock(&file.state);
            if !state.dirty || state.writers > 0 {
                return None;
            }
            state.ingesting = true;
            state.version
        };
        let prepared = file.stat().and_then(|(size, mtime, ctime)| {
            let chunks = self.prepare_whole(file, size)?;
            Ok((size, mtime, ctime, chunks))
        });
        match prepared {
            Ok((size, mtime, ctime, chunks)) => Some(SmallWork {
                file,
                _serial: serial,
                version,
                size,
                mtime,
                ctime,
                chunks,
            }),
            Err(err) => {
                lock(&file.state).ingesting = false;
                tracing::warn!("failed to read the staging file of {}: {err}", file.ino);
                None
            }
        }
    }

    /// Chunks (and hashes, and compresses what is new) a whole small staging file.
    fn prepare_whole(&self, staged: &StagedFile, size: u64) -> Result<Vec<PreparedChunk>> {
        let mut chunks = Vec::new();
        for (start, end) in data_segments(staged.file(), size) {
            let mut data = vec![0u8; (end - start) as usize];
            let got = staged.read_at(&mut data, start)?;
            data.truncate(got);
            let mut rest = &data[..];
            let mut offset = start;
            while let Some(cut) = self.chunker().next_cut(rest, true) {
                chunks.push(self.prepare_chunk(offset, &rest[..cut])?);
                rest = &rest[cut..];
                offset += cut as u64;
            }
        }
        Ok(chunks)
    }

    /// Whether `staged` is still its inode's staging file (not deleted or replaced since
    /// its ingestion began). Without staging on, only a recovery at open ingests, with
    /// nothing else running.
    fn still_staged(&self, staged: &Arc<StagedFile>) -> bool {
        if self.staging().is_none() {
            return true;
        }
        self.staged_entry(staged.ino)
            .is_some_and(|current| Arc::ptr_eq(&current, staged))
    }

    fn abandon_shadow(&self, shadow: Option<InodeNo>) -> Result<IngestOutcome> {
        if let Some(s) = shadow {
            let cache = self.block_cache();
            self.db().write(|txn| {
                txn.skip_quota();
                content::release_all(txn, cache, s)?;
                store::delete_node_row(txn, s)
            })?;
        }
        Ok(IngestOutcome::Gone)
    }

    /// Hashes a chunk and, if the store lacks it, compresses it.
    fn prepare_chunk(&self, offset: u64, chunk: &[u8]) -> Result<PreparedChunk> {
        let hash = BlockHash::of(chunk);
        let known = self.db().read(|conn| content::has_block(conn, &hash))?;
        let len = chunk.len() as u64;
        if known {
            Ok(PreparedChunk {
                offset,
                len,
                hash,
                encoded: None,
                raw: Some(chunk.to_vec()),
            })
        } else {
            let encoded = block::encode(chunk, hash, self.zstd_level());
            Ok(PreparedChunk {
                offset,
                len,
                hash,
                encoded: Some(encoded),
                raw: None,
            })
        }
    }

    /// A node without links that collects the blocks of a large ingestion.
    fn create_shadow(&self) -> Result<InodeNo> {
        let now = self.now();
        self.db().write(|txn| {
            txn.skip_quota();
            let ino = store::insert_node(txn, FileKind::File, NewNode::new(0o600), 0, None, now)?;
            // Without links: a crash leaves it an orphan, deleted at the next open.
            store::add_nlink(txn, ino, -1, now)?;
            Ok(ino)
        })
    }

    fn store_batch(&self, shadow: InodeNo, batch: Vec<PreparedChunk>) -> Result<()> {
        let ctx = self.ctx();
        self.db().write(|txn| {
            for chunk in &batch {
                let block = store_prepared(txn, &ctx, chunk_ref(chunk))?;
                content::insert_extent(
                    txn,
                    shadow,
                    Extent {
                        offset: chunk.offset,
                        len: chunk.len,
                        block,
                    },
                )?;
            }
            Ok(())
        })
    }

    /// Writes the stored content of `ino` (`size` bytes) into an empty staging file.
    pub(crate) fn materialize(&self, ino: InodeNo, staged: &StagedFile, size: u64) -> Result<()> {
        staged.set_len(0)?;
        staged.set_len(size)?;
        let mut from = 0u64;
        loop {
            let extents = self
                .db()
                .read(|conn| content::extents_from(conn, ino, from, 256))?;
            let Some(last) = extents.last() else { break };
            from = last.offset + 1;
            for extent in &extents {
                if extent.offset >= size {
                    continue;
                }
                let bytes = self
                    .db()
                    .read(|conn| content::load_block(conn, self.block_cache(), extent.block))?;
                let keep = (size - extent.offset).min(bytes.len() as u64) as usize;
                staged.write_at(&bytes[..keep], extent.offset)?;
            }
        }
        Ok(())
    }
}

/// The parts of a prepared chunk the store needs.
struct ChunkRef<'a> {
    hash: &'a BlockHash,
    encoded: Option<&'a EncodedBlock>,
    raw: Option<&'a [u8]>,
}

/// What an ingestion read from a staging file, to commit.
struct Ingested {
    size: u64,
    mtime: TimestampNs,
    ctime: TimestampNs,
    /// Chunks not stored yet (a large file's earlier ones hang off its shadow).
    chunks: Vec<PreparedChunk>,
}

/// The last transaction of an ingestion, the same for one large file and for each of a
/// batch of small ones: the node's content becomes what its staging file held (the
/// blocks `shadow` collected, then `ingested`'s chunks), with its size and times, and
/// the staging file is unbound if it is `clean` (nothing written since the snapshot).
/// A node deleted meanwhile only loses its binding and its shadow.
fn commit_ingested(
    txn: &mut WriteTxn<'_>,
    ctx: &ContentCtx<'_>,
    ino: InodeNo,
    shadow: Option<InodeNo>,
    ingested: Ingested,
    clean: bool,
) -> Result<IngestOutcome> {
    let Some(mut attr) = store::load_attr(txn, ino)? else {
        if let Some(s) = shadow {
            content::release_all(txn, ctx.cache, s)?;
            store::delete_node_row(txn, s)?;
        }
        staged_rows::unbind(txn, ino)?;
        return Ok(IngestOutcome::Gone);
    };
    if attr.kind != FileKind::File {
        return Err(Error::corrupt(format!(
            "{ino}: staged but not a regular file"
        )));
    }
    content::release_all(txn, ctx.cache, ino)?;
    if let Some(s) = shadow {
        content::move_extents(txn, s, ino)?;
        store::delete_node_row(txn, s)?;
    }
    for chunk in ingested.chunks {
        let block = store_prepared(txn, ctx, chunk_ref(&chunk))?;
        let extent = Extent {
            offset: chunk.offset,
            len: chunk.len,
            block,
        };
        content::insert_extent(txn, ino, extent)?;
    }
    attr.size = ingested.size;
    attr.mtime = ingested.mtime;
    attr.ctime = attr.ctime.max(ingested.ctime);
    store::store_attr(txn, &attr)?;
    if !clean {
        return Ok(IngestOutcome::StillDirty);
    }
    staged_rows::unbind(txn, ino)?;
    Ok(IngestOutcome::Clean)
}

fn chunk_ref(chunk: &PreparedChunk) -> ChunkRef<'_> {
    ChunkRef {
        hash: &chunk.hash,
        encoded: chunk.encoded.as_ref(),
        raw: chunk.raw.as_deref(),
    }
}

/// Adds a reference to the block with this hash, inserting it if needed.
fn store_prepared(
    txn: &mut WriteTxn<'_>,
    ctx: &ContentCtx<'_>,
    chunk: ChunkRef<'_>,
) -> Result<i64> {
    if let Some(id) = content::retain_by_hash(txn, chunk.hash)? {
        return Ok(id);
    }
    match (chunk.encoded, chunk.raw) {
        (Some(encoded), _) => content::insert_block(txn, chunk.hash, encoded),
        (None, Some(raw)) => {
            // The block went away between the probe and now: encode it here.
            let encoded = block::encode(raw, *chunk.hash, ctx.zstd_level);
            content::insert_block(txn, chunk.hash, &encoded)
        }
        (None, None) => Err(Error::corrupt("prepared chunk without bytes")),
    }
}
