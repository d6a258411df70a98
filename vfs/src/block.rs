//! Blocks: content-addressed, compressed pieces of file content.
//!
//! A block's key is the BLAKE3 hash of its raw bytes. It is stored compressed with zstd
//! when that saves at least 1/16 of the bytes, raw otherwise (random data would only pay
//! the decompression cost). Decoding always re-hashes: bytes that do not match their key
//! are a [`Error::Corrupt`], never returned as data.

use std::cell::RefCell;
use std::fmt;

use crate::error::{Error, Result};

/// Length of a block hash in bytes.
pub const HASH_LEN: usize = 32;

/// The most raw bytes any block holds: the largest maximum the chunker accepts
/// ([`crate::ChunkSizes::is_valid`]). A stored length above it is corruption, refused
/// before anything is allocated for it.
pub const BLOCK_BYTES_MAX: usize = fastcdc::v2020::MAXIMUM_MAX;

/// The BLAKE3 hash of a block's raw bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub [u8; HASH_LEN]);

impl BlockHash {
    pub fn of(bytes: &[u8]) -> BlockHash {
        BlockHash(*blake3::hash(bytes).as_bytes())
    }

    pub fn from_slice(bytes: &[u8]) -> Result<BlockHash> {
        let array: [u8; HASH_LEN] = bytes
            .try_into()
            .map_err(|_| Error::corrupt(format!("block hash of {} bytes", bytes.len())))?;
        Ok(BlockHash(array))
    }

    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Debug for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlockHash({})", &self.to_hex()[..16])
    }
}

impl fmt::Display for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// How a block's bytes are stored. The numeric values are on disk; never renumber.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    Raw = 0,
    Zstd = 1,
}

impl Codec {
    pub fn from_code(code: i64) -> Result<Codec> {
        match code {
            0 => Ok(Codec::Raw),
            1 => Ok(Codec::Zstd),
            other => Err(Error::corrupt(format!("unknown block codec {other}"))),
        }
    }
}

/// A block ready to be stored: its key and its encoded bytes.
pub struct EncodedBlock {
    pub raw_len: usize,
    pub codec: Codec,
    pub data: Vec<u8>,
}

thread_local! {
    static COMPRESSOR: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> =
        const { RefCell::new(None) };
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { RefCell::new(None) };
}

/// Compresses `raw` with zstd at `level` if that pays, else keeps it raw.
/// `hash` must be `BlockHash::of(raw)`; the caller has it already for the dedup probe.
pub fn encode(raw: &[u8], hash: BlockHash, level: i32) -> EncodedBlock {
    debug_assert_eq!(
        hash,
        BlockHash::of(raw),
        "encode takes the hash of the bytes it encodes"
    );
    assert!(
        raw.len() <= BLOCK_BYTES_MAX,
        "a block of {} bytes",
        raw.len()
    );
    let compressed = if looks_incompressible(raw, level) {
        None
    } else {
        compress(raw, level)
    };
    match compressed {
        Some(data) if data.len() < raw.len() - raw.len() / 16 => EncodedBlock {
            raw_len: raw.len(),
            codec: Codec::Zstd,
            data,
        },
        _ => EncodedBlock {
            raw_len: raw.len(),
            codec: Codec::Raw,
            data: raw.to_vec(),
        },
    }
}

/// Bytes of a large block compressed first to guess whether the rest is worth trying.
const SAMPLE_LEN: usize = 4096;

/// Whether a sample from the start of `raw` fails to compress: random and already
/// compressed data (archives, images) is then stored raw without spending the time to
/// compress all of it. Text and most binaries compress in any sample.
fn looks_incompressible(raw: &[u8], level: i32) -> bool {
    if raw.len() < 4 * SAMPLE_LEN {
        return false;
    }
    match compress(&raw[..SAMPLE_LEN], level) {
        Some(sample) => sample.len() >= SAMPLE_LEN - SAMPLE_LEN / 32,
        None => false,
    }
}

fn compress(raw: &[u8], level: i32) -> Option<Vec<u8>> {
    COMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        let stale = !matches!(&*slot, Some((l, _)) if *l == level);
        if stale {
            *slot = Some((level, zstd::bulk::Compressor::new(level).ok()?));
        }
        let (_, compressor) = slot.as_mut().expect("compressor was just set");
        let mut out = Vec::with_capacity(zstd::zstd_safe::compress_bound(raw.len()));
        compressor.compress_to_buffer(raw, &mut out).ok()?;
        Some(out)
    })
}

/// Decodes stored bytes, taking them over (a raw block is its own content: no copy),
/// and checks the content against `hash`.
pub fn decode(hash: &BlockHash, codec: Codec, raw_len: usize, data: Vec<u8>) -> Result<Vec<u8>> {
    check_stored_len(hash, raw_len)?;
    match codec {
        Codec::Raw => {
            verify(hash, raw_len, &data)?;
            Ok(data)
        }
        Codec::Zstd => {
            let mut out = Vec::new();
            decode_into(hash, codec, raw_len, &data, &mut out)?;
            Ok(out)
        }
    }
}

/// Decodes stored bytes into `out` (cleared first) and checks them against `hash`.
pub fn decode_into(
    hash: &BlockHash,
    codec: Codec,
    raw_len: usize,
    data: &[u8],
    out: &mut Vec<u8>,
) -> Result<()> {
    out.clear();
    check_stored_len(hash, raw_len)?;
    match codec {
        Codec::Raw => out.extend_from_slice(data),
        Codec::Zstd => {
            out.reserve(raw_len);
            DECOMPRESSOR.with(|cell| -> Result<()> {
                let mut slot = cell.borrow_mut();
                if slot.is_none() {
                    let decompressor = zstd::bulk::Decompressor::new()
                        .map_err(|e| Error::corrupt(format!("zstd context: {e}")))?;
                    *slot = Some(decompressor);
                }
                let decompressor = slot.as_mut().expect("decompressor was just set");
                decompressor
                    .decompress_to_buffer(data, out)
                    .map_err(|e| Error::corrupt(format!("block {hash}: zstd: {e}")))?;
                Ok(())
            })?;
        }
    }
    verify(hash, raw_len, out)
}

/// Refuses a stored length no block can have, before anything is reserved for it.
fn check_stored_len(hash: &BlockHash, raw_len: usize) -> Result<()> {
    if raw_len > BLOCK_BYTES_MAX {
        return Err(Error::corrupt(format!(
            "block {hash}: length {raw_len} is above the largest block, {BLOCK_BYTES_MAX}"
        )));
    }
    Ok(())
}

/// Checks decoded content against the length and hash it was stored under.
fn verify(hash: &BlockHash, raw_len: usize, content: &[u8]) -> Result<()> {
    if content.len() != raw_len {
        return Err(Error::corrupt(format!(
            "block {hash}: {} bytes decoded, {raw_len} expected",
            content.len()
        )));
    }
    let actual = BlockHash::of(content);
    if actual != *hash {
        return Err(Error::corrupt(format!(
            "block {hash}: content hashes to {actual}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_decode_round_trips_and_compresses_text() {
        let raw = b"hello hello hello hello hello hello hello hello".repeat(100);
        let hash = BlockHash::of(&raw);
        let block = encode(&raw, hash, 1);
        assert_eq!(block.codec, Codec::Zstd);
        assert!(block.data.len() < raw.len() / 4);
        let mut out = Vec::new();
        decode_into(&hash, block.codec, block.raw_len, &block.data, &mut out).unwrap();
        assert_eq!(out, raw);
    }

    #[test]
    fn incompressible_block_is_kept_raw() {
        let raw: Vec<u8> = (0..65536u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        let hash = BlockHash::of(&raw);
        let block = encode(&raw, hash, 1);
        let mut out = Vec::new();
        decode_into(&hash, block.codec, block.raw_len, &block.data, &mut out).unwrap();
        assert_eq!(out, raw);
    }

    #[test]
    fn corrupted_bytes_are_refused() {
        let raw = vec![7u8; 4096];
        let hash = BlockHash::of(&raw);
        let mut out = Vec::new();
        let mut bad = raw.clone();
        bad[100] = 8;
        let err = decode_into(&hash, Codec::Raw, raw.len(), &bad, &mut out).unwrap_err();
        assert_eq!(err.errno(), libc::EIO);
        // Garbage that is not zstd at all is also corruption, not a panic.
        let err = decode_into(&hash, Codec::Zstd, raw.len(), &bad, &mut out).unwrap_err();
        assert!(matches!(err, Error::Corrupt { .. }));
        // A wrong length is caught too.
        let err = decode_into(&hash, Codec::Raw, raw.len() + 1, &raw, &mut out).unwrap_err();
        assert!(matches!(err, Error::Corrupt { .. }));
    }

    #[test]
    fn a_corrupt_length_is_refused_before_it_is_allocated() {
        let raw = vec![7u8; 4096];
        let hash = BlockHash::of(&raw);
        let block = encode(&raw, hash, 1);
        assert_eq!(block.codec, Codec::Zstd);
        let mut out = Vec::new();
        // A terabyte, or more than the address space: an error, not an abort.
        for raw_len in [1 << 40, usize::MAX, BLOCK_BYTES_MAX + 1] {
            let err = decode_into(&hash, Codec::Zstd, raw_len, &block.data, &mut out);
            assert!(
                matches!(err, Err(Error::Corrupt { .. })),
                "{raw_len}: {err:?}"
            );
            let err = decode(&hash, Codec::Raw, raw_len, raw.clone());
            assert!(matches!(err, Err(Error::Corrupt { .. })), "{raw_len}");
        }
        assert!(out.capacity() < BLOCK_BYTES_MAX);
    }
}
