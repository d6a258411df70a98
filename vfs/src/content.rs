//! File content: extents, blocks, and rewriting only what changed.
//!
//! A file's content is a sorted list of extents `(offset, len, block)`; ranges no extent
//! covers are holes and read as zeros. Each extent names one whole block, so `len` always
//! equals the block's raw length.
//!
//! A change ([`apply`]) never rewrites a file: it re-chunks a *region* from the start of
//! the first block the change touches until the chunker cuts at an old block boundary
//! past the change (the content after that point is unchanged, so are its blocks), or a
//! hole, or the end of the file. Cut points are content-defined, so they resynchronise
//! with the old ones within a block or two. A one-byte write in a 64 MiB file stores about
//! one new block; an append re-chunks only the old tail block.
//!
//! Blocks are shared by hash: a chunk already stored only gains a reference. Reference
//! counts change in the same transaction as the extents that hold them, so they are
//! right after any crash; a block whose count reaches zero is deleted there too.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

use lru::LruCache;
use rusqlite::{params, Connection, OptionalExtension};

use crate::block::{self, BlockHash, Codec};
use crate::block_store;
use crate::change_page::StoredBlock;
use crate::chunker::Chunker;
use crate::db::WriteTxn;
use crate::error::{Error, Result, StorageContext};
use crate::types::InodeNo;

/// One extent of a file: `len` bytes at `offset` are the content of block `block`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Extent {
    pub offset: u64,
    pub len: u64,
    pub block: i64,
}

impl Extent {
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// Decoded, verified blocks, most recently used first, bounded in bytes. Keyed by block
/// id: ids are never reused (they come from a counter), so an id always means the same
/// bytes.
pub(crate) struct BlockCache {
    inner: Mutex<CacheInner>,
}

struct CacheInner {
    map: LruCache<i64, Arc<Vec<u8>>>,
    bytes: usize,
    bytes_max: usize,
}

impl BlockCache {
    pub fn new(bytes_max: usize) -> BlockCache {
        BlockCache {
            inner: Mutex::new(CacheInner {
                map: LruCache::unbounded(),
                bytes: 0,
                bytes_max,
            }),
        }
    }

    fn get(&self, id: i64) -> Option<Arc<Vec<u8>>> {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map
            .get(&id)
            .cloned()
    }

    fn put(&self, id: i64, bytes: Arc<Vec<u8>>) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if bytes.len() > inner.bytes_max / 4 {
            return;
        }
        inner.bytes += bytes.len();
        if let Some(old) = inner.map.put(id, bytes) {
            inner.bytes -= old.len();
        }
        while inner.bytes > inner.bytes_max {
            match inner.map.pop_lru() {
                Some((_, evicted)) => inner.bytes -= evicted.len(),
                None => break,
            }
        }
    }

    fn forget(&self, id: i64) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = inner.map.pop(&id) {
            inner.bytes -= old.len();
        }
    }
}

// `LruCache::unbounded` needs no capacity; keep the import of NonZeroUsize honest for
// callers that want a count bound later.
#[allow(dead_code)]
fn _capacity(n: usize) -> Option<NonZeroUsize> {
    NonZeroUsize::new(n)
}

/// What [`apply`] needs besides the transaction.
pub(crate) struct ContentCtx<'a> {
    pub cache: &'a BlockCache,
    pub chunker: &'a Chunker,
    pub zstd_level: i32,
}

/// A block's hash, raw length and codec.
type BlockRow = (Vec<u8>, i64, i64);

/// Reads, decodes and verifies block `id`.
pub(crate) fn load_block(conn: &Connection, cache: &BlockCache, id: i64) -> Result<Arc<Vec<u8>>> {
    if let Some(bytes) = cache.get(id) {
        return Ok(bytes);
    }
    let row: Option<BlockRow> = conn
        .prepare_cached("SELECT hash, raw_len, codec FROM blocks WHERE id = ?1")
        .and_then(|mut stmt| {
            stmt.query_row([id], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
                .optional()
        })
        .ctx("reading a block")?;
    let Some((hash, raw_len, codec)) = row else {
        return Err(Error::corrupt(format!("missing block {id}")));
    };
    let Some(data) = block_store::get(conn, id)? else {
        return Err(Error::corrupt(format!("block {id} has no data")));
    };
    let hash = BlockHash::from_slice(&hash)?;
    let raw_len = usize::try_from(raw_len).map_err(|_| Error::corrupt("negative block length"))?;
    let bytes = Arc::new(block::decode(
        &hash,
        Codec::from_code(codec)?,
        raw_len,
        data,
    )?);
    cache.put(id, bytes.clone());
    Ok(bytes)
}

/// Extents of `ino` that overlap `[start, end)`, in offset order.
pub(crate) fn extents_overlapping(
    conn: &Connection,
    ino: InodeNo,
    start: u64,
    end: u64,
) -> Result<Vec<Extent>> {
    let mut out = Vec::new();
    if start >= end {
        return Ok(out);
    }
    if let Some(first) = extent_at_or_before(conn, ino, start)? {
        if first.end() > start {
            out.push(first);
        }
    }
    let mut stmt = conn
        .prepare_cached(
            "SELECT offset, len, block FROM extents WHERE ino = ?1 AND offset > ?2 AND offset < ?3
             ORDER BY offset",
        )
        .ctx("reading extents")?;
    let rows = stmt
        .query_map(
            params![ino.0 as i64, start as i64, end as i64],
            extent_from_row,
        )
        .ctx("reading extents")?;
    for row in rows {
        out.push(row.ctx("reading extents")?);
    }
    Ok(out)
}

fn extent_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Extent> {
    Ok(Extent {
        offset: row.get::<_, i64>(0)? as u64,
        len: row.get::<_, i64>(1)? as u64,
        block: row.get(2)?,
    })
}

/// The extent with the greatest offset `<= at`.
fn extent_at_or_before(conn: &Connection, ino: InodeNo, at: u64) -> Result<Option<Extent>> {
    conn.prepare_cached(
        "SELECT offset, len, block FROM extents WHERE ino = ?1 AND offset <= ?2
         ORDER BY offset DESC LIMIT 1",
    )
    .and_then(|mut stmt| {
        stmt.query_row(params![ino.0 as i64, at as i64], extent_from_row)
            .optional()
    })
    .ctx("reading extents")
}

/// The first extent starting after `at`.
fn extent_after(conn: &Connection, ino: InodeNo, at: u64) -> Result<Option<Extent>> {
    conn.prepare_cached(
        "SELECT offset, len, block FROM extents WHERE ino = ?1 AND offset > ?2 ORDER BY offset LIMIT 1",
    )
    .and_then(|mut stmt| stmt.query_row(params![ino.0 as i64, at as i64], extent_from_row).optional())
    .ctx("reading extents")
}

fn extent_starts_at(conn: &Connection, ino: InodeNo, at: u64) -> Result<bool> {
    conn.prepare_cached("SELECT 1 FROM extents WHERE ino = ?1 AND offset = ?2")
        .and_then(|mut stmt| stmt.exists(params![ino.0 as i64, at as i64]))
        .ctx("reading extents")
}

/// Up to `limit` extents of a file starting at or after `from`, in offset order.
pub(crate) fn extents_from(
    conn: &Connection,
    ino: InodeNo,
    from: u64,
    limit: usize,
) -> Result<Vec<Extent>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT offset, len, block FROM extents WHERE ino = ?1 AND offset >= ?2
             ORDER BY offset LIMIT ?3",
        )
        .ctx("reading extents")?;
    let rows = stmt
        .query_map(
            params![ino.0 as i64, from as i64, limit as i64],
            extent_from_row,
        )
        .ctx("reading extents")?;
    rows.map(|r| r.ctx("reading extents")).collect()
}

/// Every extent of a file.
pub(crate) fn all_extents(conn: &Connection, ino: InodeNo) -> Result<Vec<Extent>> {
    let mut stmt = conn
        .prepare_cached("SELECT offset, len, block FROM extents WHERE ino = ?1 ORDER BY offset")
        .ctx("reading extents")?;
    let rows = stmt
        .query_map([ino.0 as i64], extent_from_row)
        .ctx("reading extents")?;
    rows.map(|r| r.ctx("reading extents")).collect()
}

/// Copies committed content `[offset, offset + out.len())` into `out`; holes read as
/// zeros. The caller clamps the range to the file size.
pub(crate) fn read_into(
    conn: &Connection,
    cache: &BlockCache,
    ino: InodeNo,
    offset: u64,
    out: &mut [u8],
) -> Result<()> {
    let end = offset + out.len() as u64;
    // Holes read as zeros; the rest is written once, from the blocks.
    let mut filled = 0;
    for extent in extents_overlapping(conn, ino, offset, end)? {
        let bytes = load_block(conn, cache, extent.block)?;
        if bytes.len() as u64 != extent.len {
            return Err(Error::corrupt(format!(
                "{ino}: extent at {} is {} bytes, its block {}",
                extent.offset,
                extent.len,
                bytes.len()
            )));
        }
        let from = offset.max(extent.offset);
        let to = end.min(extent.end());
        let src = &bytes[(from - extent.offset) as usize..(to - extent.offset) as usize];
        let at = (from - offset) as usize;
        if at < filled {
            return Err(Error::corrupt(format!("{ino}: extents overlap at {from}")));
        }
        out[filled..at].fill(0);
        out[at..at + src.len()].copy_from_slice(src);
        filled = at + src.len();
    }
    out[filled..].fill(0);
    Ok(())
}

/// Stores one chunk: a new reference to an existing block, or a new block.
fn store_chunk(txn: &mut WriteTxn<'_>, ctx: &ContentCtx<'_>, chunk: &[u8]) -> Result<i64> {
    let hash = BlockHash::of(chunk);
    if let Some(id) = retain_by_hash(txn, &hash)? {
        return Ok(id);
    }
    let encoded = block::encode(chunk, hash, ctx.zstd_level);
    insert_block(txn, &hash, &encoded)
}

// No `RETURNING` in the statements below: inside the savepoint every mutation runs in,
// SQLite gives such a statement a statement journal and, as it ends, walks the whole
// in-memory sub-journal of the mutation so far, so each one costs time in proportion to
// what the mutation already rewrote (5 us on a fresh mutation, 1 ms after 48 MB;
// `benches/examples/sqlite_returning.rs`). A plain single-row statement and a lookup
// cost a few microseconds whatever came before.

/// Adds a reference to the block with `hash`, if the store has it.
pub(crate) fn retain_by_hash(txn: &WriteTxn<'_>, hash: &BlockHash) -> Result<Option<i64>> {
    let id: Option<i64> = txn
        .prepare_cached("SELECT id FROM blocks WHERE hash = ?1")
        .and_then(|mut stmt| stmt.query_row([&hash.0[..]], |row| row.get(0)).optional())
        .ctx("referencing a block")?;
    if let Some(id) = id {
        retain_block(txn, id)?;
    }
    Ok(id)
}

/// [`retain_by_hash`] for a reference of `len` bytes, which must be the stored block's
/// length (a peer names blocks by hash and length; a length that is not the block's
/// would make an extent its block cannot fill). A query of its own: the ingest path's
/// lookup, by a hash it computed over the bytes, reads the id from the hash index
/// alone.
pub(crate) fn retain_by_hash_of_len(
    txn: &WriteTxn<'_>,
    hash: &BlockHash,
    len: u32,
) -> Result<Option<i64>> {
    let found: Option<(i64, i64)> = txn
        .prepare_cached("SELECT id, raw_len FROM blocks WHERE hash = ?1")
        .and_then(|mut stmt| {
            stmt.query_row([&hash.0[..]], |row| Ok((row.get(0)?, row.get(1)?)))
                .optional()
        })
        .ctx("referencing a block")?;
    let Some((id, raw_len)) = found else {
        return Ok(None);
    };
    if raw_len != i64::from(len) {
        return Err(Error::corrupt(format!(
            "block {hash} is {raw_len} bytes, referenced as {len}"
        )));
    }
    retain_block(txn, id)?;
    Ok(Some(id))
}

/// Inserts a new block with one reference; its bytes go to the block store.
pub(crate) fn insert_block(
    txn: &mut WriteTxn<'_>,
    hash: &BlockHash,
    encoded: &block::EncodedBlock,
) -> Result<i64> {
    // Before anything is written: even undone, what a mutation wrote stays dirty in the
    // batch and goes to the WAL at its commit.
    txn.check_room(encoded.data.len() as u64)?;
    let id = txn.allocate_block();
    txn.prepare_cached(
        "INSERT INTO blocks (id, hash, refcount, raw_len, codec, stored_len)
         VALUES (?1, ?2, 1, ?3, ?4, ?5)",
    )
    .and_then(|mut stmt| {
        stmt.execute(params![
            id,
            &hash.0[..],
            encoded.raw_len as i64,
            encoded.codec as i64,
            encoded.data.len() as i64
        ])
    })
    .ctx("storing a block")?;
    block_store::put(txn, id, &encoded.data)?;
    txn.stored_bytes += encoded.data.len() as u64;
    txn.written_bytes += encoded.data.len() as u64;
    Ok(id)
}

/// Drops one reference to block `id`, deleting the block when none is left.
pub(crate) fn release_block(txn: &mut WriteTxn<'_>, cache: &BlockCache, id: i64) -> Result<()> {
    txn.prepare_cached("UPDATE blocks SET refcount = refcount - 1 WHERE id = ?1")
        .and_then(|mut stmt| stmt.execute([id]))
        .ctx("releasing a block")?;
    let row: Option<(i64, i64)> = txn
        .prepare_cached("SELECT refcount, stored_len FROM blocks WHERE id = ?1")
        .and_then(|mut stmt| {
            stmt.query_row([id], |row| Ok((row.get(0)?, row.get(1)?)))
                .optional()
        })
        .ctx("releasing a block")?;
    let Some((refcount, stored)) = row else {
        return Err(Error::corrupt(format!("extent names missing block {id}")));
    };
    if refcount < 0 {
        return Err(Error::corrupt(format!(
            "block {id} has a negative reference count"
        )));
    }
    if refcount == 0 {
        txn.prepare_cached("DELETE FROM blocks WHERE id = ?1")
            .and_then(|mut stmt| stmt.execute([id]))
            .ctx("deleting a block")?;
        block_store::delete(txn, id)?;
        txn.stored_bytes -= stored as u64;
        cache.forget(id);
    }
    Ok(())
}

/// Adds one reference to block `id` (sharing it with another extent).
fn retain_block(txn: &WriteTxn<'_>, id: i64) -> Result<()> {
    let changed = txn
        .prepare_cached("UPDATE blocks SET refcount = refcount + 1 WHERE id = ?1")
        .and_then(|mut stmt| stmt.execute([id]))
        .ctx("referencing a block")?;
    if changed != 1 {
        return Err(Error::corrupt(format!("extent names missing block {id}")));
    }
    Ok(())
}

/// Moves every extent of `from` to `to` (a shadow node's content becoming its file's);
/// block references stay as they are.
pub(crate) fn move_extents(txn: &WriteTxn<'_>, from: InodeNo, to: InodeNo) -> Result<()> {
    txn.execute(
        "UPDATE extents SET ino = ?1 WHERE ino = ?2",
        params![to.0 as i64, from.0 as i64],
    )
    .ctx("moving ingested content")?;
    Ok(())
}

/// Whether the store has a block with `hash` (a probe on a reader, before the writer
/// is taken: it may be gone by then).
pub(crate) fn has_block(conn: &Connection, hash: &BlockHash) -> Result<bool> {
    conn.prepare_cached("SELECT 1 FROM blocks WHERE hash = ?1")
        .and_then(|mut stmt| stmt.exists([&hash.0[..]]))
        .ctx("probing for a block")
}

/// A stored block as it is on disk (compressed or not), to send elsewhere.
pub(crate) fn stored_block(conn: &Connection, hash: &BlockHash) -> Result<Option<StoredBlock>> {
    let row: Option<(i64, i64, i64)> = conn
        .prepare_cached("SELECT id, raw_len, codec FROM blocks WHERE hash = ?1")
        .and_then(|mut s| {
            s.query_row([&hash.0[..]], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .optional()
        })
        .ctx("reading a block")?;
    let Some((id, raw_len, codec)) = row else {
        return Ok(None);
    };
    let data = block_store::get(conn, id)?
        .ok_or_else(|| Error::corrupt(format!("block {hash} has no data")))?;
    let raw_len =
        u32::try_from(raw_len).map_err(|_| Error::corrupt(format!("block {hash}: bad length")))?;
    Ok(Some(StoredBlock {
        hash: *hash,
        codec: Codec::from_code(codec)?,
        raw_len,
        data,
    }))
}

/// The extents of `ino` in offset order, with their blocks' hashes: (offset, length,
/// hash).
pub(crate) fn extent_hashes(conn: &Connection, ino: InodeNo) -> Result<Vec<(u64, u64, BlockHash)>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT e.offset, e.len, b.hash FROM extents e JOIN blocks b ON b.id = e.block
             WHERE e.ino = ?1 ORDER BY e.offset",
        )
        .ctx("reading extents")?;
    let rows = stmt
        .query_map([ino.0 as i64], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, Vec<u8>>(2)?,
            ))
        })
        .ctx("reading extents")?;
    let mut out = Vec::new();
    for row in rows {
        let (offset, len, hash) = row.ctx("reading extents")?;
        out.push((offset as u64, len as u64, BlockHash::from_slice(&hash)?));
    }
    Ok(out)
}

pub(crate) fn insert_extent(txn: &WriteTxn<'_>, ino: InodeNo, extent: Extent) -> Result<()> {
    txn.prepare_cached("INSERT INTO extents (ino, offset, len, block) VALUES (?1, ?2, ?3, ?4)")
        .and_then(|mut stmt| {
            stmt.execute(params![
                ino.0 as i64,
                extent.offset as i64,
                extent.len as i64,
                extent.block
            ])
        })
        .ctx("writing an extent")?;
    Ok(())
}

/// Deletes the extents of `ino` starting in `[start, end)` and returns them.
fn take_extents(txn: &WriteTxn<'_>, ino: InodeNo, start: u64, end: u64) -> Result<Vec<Extent>> {
    let range = params![ino.0 as i64, start as i64, end.min(i64::MAX as u64) as i64];
    let taken: Vec<Extent> = {
        let mut stmt = txn
            .prepare_cached(
                "SELECT offset, len, block FROM extents
                 WHERE ino = ?1 AND offset >= ?2 AND offset < ?3",
            )
            .ctx("removing extents")?;
        let rows = stmt
            .query_map(range, extent_from_row)
            .ctx("removing extents")?;
        rows.map(|r| r.ctx("removing extents"))
            .collect::<Result<_>>()?
    };
    if !taken.is_empty() {
        txn.prepare_cached("DELETE FROM extents WHERE ino = ?1 AND offset >= ?2 AND offset < ?3")
            .and_then(|mut stmt| stmt.execute(range))
            .ctx("removing extents")?;
    }
    Ok(taken)
}

/// Releases all content of `ino` (the file is being deleted or fully replaced).
pub(crate) fn release_all(txn: &mut WriteTxn<'_>, cache: &BlockCache, ino: InodeNo) -> Result<()> {
    for extent in take_extents(txn, ino, 0, u64::MAX)? {
        release_block(txn, cache, extent.block)?;
    }
    Ok(())
}

/// Makes `dst` share every block of `src`: a copy that moves no data. `dst` must have no
/// content.
pub(crate) fn share_all(txn: &WriteTxn<'_>, src: InodeNo, dst: InodeNo) -> Result<()> {
    for extent in all_extents(txn, src)? {
        retain_block(txn, extent.block)?;
        insert_extent(txn, dst, extent)?;
    }
    Ok(())
}

/// Changed bytes to apply: sorted, non-overlapping `(offset, bytes)` runs.
pub(crate) type Patch<'a> = [(u64, &'a [u8])];

/// Changes the content of `ino` from `old_size` to `new_size` bytes, overlaying `patch`.
/// Bytes neither in `patch` nor in old content are holes. Only the regions around the
/// patch and the truncation point are re-chunked.
pub(crate) fn apply(
    txn: &mut WriteTxn<'_>,
    ctx: &ContentCtx<'_>,
    ino: InodeNo,
    old_size: u64,
    new_size: u64,
    patch: &Patch<'_>,
) -> Result<()> {
    debug_assert!(patch
        .windows(2)
        .all(|w| w[0].0 + w[0].1.len() as u64 <= w[1].0));
    debug_assert!(patch.iter().all(|(o, d)| o + d.len() as u64 <= new_size));
    // Each seed is (first changed byte, end of the change): a region must be re-chunked
    // from the block holding the first byte until at least the end.
    let mut seeds: Vec<(u64, u64)> = Vec::new();
    if new_size < old_size {
        for extent in take_extents(txn, ino, new_size, u64::MAX)? {
            release_block(txn, ctx.cache, extent.block)?;
        }
        if let Some(straddling) = extent_at_or_before(txn, ino, new_size)? {
            if straddling.end() > new_size {
                seeds.push((straddling.offset, new_size));
            }
        }
    }
    seeds.extend(
        patch
            .iter()
            .filter(|(_, d)| !d.is_empty())
            .map(|(o, d)| (*o, o + d.len() as u64)),
    );
    seeds.sort_unstable();

    let mut next_seed = 0;
    while next_seed < seeds.len() {
        let (first, mut need) = seeds[next_seed];
        next_seed += 1;
        let start = region_start(txn, ino, first)?;
        let mut view = ContentView {
            ino,
            patch,
            new_size,
        };
        let mut window: Vec<u8> = Vec::with_capacity(ctx.chunker.sizes().max * 2);
        let mut window_start = start;
        let mut at_end = false;
        let mut new_extents: Vec<Extent> = Vec::new();
        loop {
            while window.len() < ctx.chunker.sizes().max && !at_end {
                let want = ctx.chunker.sizes().max - window.len();
                let pos = window_start + window.len() as u64;
                if !view.append(txn, ctx.cache, pos, want, &mut window)? {
                    at_end = true;
                }
            }
            let Some(cut) = ctx.chunker.next_cut(&window, at_end) else {
                break;
            };
            let block = store_chunk(txn, ctx, &window[..cut])?;
            new_extents.push(Extent {
                offset: window_start,
                len: cut as u64,
                block,
            });
            window.drain(..cut);
            window_start += cut as u64;
            while next_seed < seeds.len() && seeds[next_seed].0 <= window_start {
                need = need.max(seeds[next_seed].1);
                next_seed += 1;
            }
            if window.is_empty() && at_end {
                break;
            }
            if window_start >= need && extent_starts_at(txn, ino, window_start)? {
                break;
            }
        }
        let region_end = window_start;
        for extent in &new_extents {
            debug_assert!(extent.offset >= start && extent.end() <= region_end);
        }
        let old = take_extents(txn, ino, start, region_end)?;
        for extent in &new_extents {
            insert_extent(txn, ino, *extent)?;
        }
        for extent in old {
            // Only the extent cut by a truncation may reach past the region.
            if extent.end() > region_end && region_end < new_size {
                return Err(Error::corrupt(format!(
                    "{ino}: extent at {} overlaps the rewritten region ending at {region_end}",
                    extent.offset
                )));
            }
            release_block(txn, ctx.cache, extent.block)?;
        }
    }
    assert_file_content(txn, ino, new_size)
}

/// Debug builds: what a content change must leave, checked in its transaction. The
/// file's extents are in order, do not overlap and end by its `size`; each names a
/// block that exists, is as long as it, and counts at least as many references as
/// this file's extents naming it. (That every count is exact needs all files: `check`,
/// which the model test runs after every operation.)
#[cfg(debug_assertions)]
fn assert_file_content(conn: &Connection, ino: InodeNo, size: u64) -> Result<()> {
    let extents = all_extents(conn, ino)?;
    let mut end = 0;
    let mut uses: std::collections::HashMap<i64, i64> = Default::default();
    for extent in &extents {
        assert!(
            extent.offset >= end,
            "{ino}: extent at {} overlaps",
            extent.offset
        );
        end = extent.end();
        *uses.entry(extent.block).or_default() += 1;
    }
    assert!(
        end <= size,
        "{ino}: extents end at {end}, past the size {size}"
    );
    for extent in &extents {
        let (refcount, raw_len): (i64, i64) = conn
            .prepare_cached("SELECT refcount, raw_len FROM blocks WHERE id = ?1")
            .and_then(|mut s| s.query_row([extent.block], |r| Ok((r.get(0)?, r.get(1)?))))
            .ctx("checking a block")?;
        assert_eq!(
            raw_len as u64, extent.len,
            "{ino}: extent at {}",
            extent.offset
        );
        assert!(
            refcount >= uses[&extent.block],
            "{ino}: block {} undercounted",
            extent.block
        );
    }
    Ok(())
}

#[cfg(not(debug_assertions))]
#[inline]
fn assert_file_content(_conn: &Connection, _ino: InodeNo, _size: u64) -> Result<()> {
    Ok(())
}

/// Where re-chunking for a change at `first` starts: the start of the old extent holding
/// `first`, or of the one ending right at it (an append re-chunks the old tail so cut
/// points do not depend on how writes were split), else `first` itself.
fn region_start(conn: &Connection, ino: InodeNo, first: u64) -> Result<u64> {
    if let Some(extent) = extent_at_or_before(conn, ino, first)? {
        if extent.end() > first || (extent.end() == first && first > 0) {
            return Ok(extent.offset);
        }
    }
    Ok(first)
}

/// The new content of a file during [`apply`]: the patch over the old extents.
struct ContentView<'p, 'a> {
    ino: InodeNo,
    patch: &'p Patch<'a>,
    new_size: u64,
}

impl ContentView<'_, '_> {
    /// Appends up to `want` bytes of new content at `pos` to `out`. Returns false, having
    /// appended nothing, when `pos` is in a hole or at the end of the file.
    fn append(
        &mut self,
        conn: &Connection,
        cache: &BlockCache,
        pos: u64,
        want: usize,
        out: &mut Vec<u8>,
    ) -> Result<bool> {
        if pos >= self.new_size || want == 0 {
            return Ok(false);
        }
        let limit = self.new_size.min(pos + want as u64);
        // Patched bytes win.
        let idx = self
            .patch
            .partition_point(|(o, d)| o + d.len() as u64 <= pos);
        let next_patch_start = match self.patch.get(idx) {
            Some((o, d)) if *o <= pos => {
                let end = limit.min(o + d.len() as u64);
                out.extend_from_slice(&d[(pos - o) as usize..(end - o) as usize]);
                return Ok(true);
            }
            Some((o, _)) => *o,
            None => u64::MAX,
        };
        let limit = limit.min(next_patch_start);
        match extent_at_or_before(conn, self.ino, pos)? {
            Some(extent) if extent.end() > pos => {
                let bytes = load_block(conn, cache, extent.block)?;
                if bytes.len() as u64 != extent.len {
                    return Err(Error::corrupt(format!(
                        "{}: extent at {} does not match its block",
                        self.ino, extent.offset
                    )));
                }
                let end = limit.min(extent.end());
                out.extend_from_slice(
                    &bytes[(pos - extent.offset) as usize..(end - extent.offset) as usize],
                );
                Ok(true)
            }
            _ => {
                // A hole. Re-chunking stops here rather than materialising zeros: a hole
                // may be terabytes long.
                let _ = extent_after(conn, self.ino, pos)?;
                Ok(false)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    // Content is exercised through the Workspace API in workspace.rs and tests/.
}
