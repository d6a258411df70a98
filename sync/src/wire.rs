//! The only module that touches Cap'n Proto types: conversions, written by hand, between
//! the schema's structs (`schema/sync.capnp`) and the domain types, in both directions.
//!
//! - `write_*` fill a builder from a domain value. They check the value against the same
//!   rules the receiver applies, so a value the peer would refuse fails here, named, rather
//!   than there. On an error the builder holds a partial value: drop the message.
//! - `read_*` turn a reader into a domain value. A peer's bytes are hostile: every list and
//!   blob is checked against its bound (the `*_MAX` constants below) *before* anything is
//!   allocated for it, hashes must be exactly 32 bytes, codecs known, paths absolute and
//!   canonical, and any violation is an [`Error`], never a panic.
//! - [`Wire`] serializes a domain value as a standalone message and back, and
//!   [`read_message`] reads a message from bytes with the traversal and nesting limits
//!   of [`reader_options`] (the limits also meant for the RPC connection): tests and the
//!   fuzz target go through these.
//!
//! Whole-message limits: Cap'n Proto charges every read against the traversal limit
//! ([`MESSAGE_WORDS_MAX`]), so whatever aliasing a hostile message uses, decoding one
//! message copies at most that much; the per-field bounds keep each allocation small.

use capnp::message::{Builder, HeapAllocator, ReaderOptions};
use capnp::serialize::NoAllocBufferSegments;
use capnp::{data, data_list, primitive_list, struct_list, text};
use computer_vfs::{
    Attr, BlockHash, BlockRef, ChangeEntry, ChangePage, ChunkSizes, Codec, Conflict, Cursor,
    EntryState, FileKind, GrepMatch, InodeNo, Revision, StoredBlock, HASH_LEN, NAME_MAX, PATH_MAX,
    SYMLINK_MAX,
};
use computer_vfs::{CheckReport, CompactReport, Problem, Stats, CHECK_PROBLEMS_LISTED_MAX};

use crate::sync_capnp::{
    block, block_ref, check_report, client_info, compact_report, conflict, cursor, dir_item, entry,
    grep_match, node, page, server_info, stats,
};
use crate::{ClientInfo, DirItem, Error, NodeInfo, Result, ServerInfo, WorkspaceStats};

/// The protocol version of this build (`protocolVersion` in the schema): peers that
/// differ refuse to talk.
pub const PROTOCOL_VERSION: u32 = crate::sync_capnp::PROTOCOL_VERSION;

/// Longest path, in bytes: the store's `PATH_MAX` (what its path API accepts).
pub const PATH_BYTES_MAX: usize = PATH_MAX;
/// Longest component of a path, in bytes: the store's `NAME_MAX`.
pub const NAME_BYTES_MAX: usize = NAME_MAX;
/// Longest symlink target, in bytes: the store's `SYMLINK_MAX`.
pub const SYMLINK_TARGET_BYTES_MAX: usize = SYMLINK_MAX;
/// Permission bits a file or directory state may carry (no kind bits).
pub const PERM_BITS_MAX: u32 = 0o7777;
/// Most entries in a page of changes, and in one `push`.
pub const ENTRIES_PER_PAGE_MAX: usize = 4096;
/// Longest block (raw bytes) the protocol carries: the store's default (and largest
/// supported) maximum chunk size. A workspace created with a larger `chunk_max` cannot
/// replicate: its [`ServerInfo`] is refused.
pub const CHUNK_BYTES_MAX: u32 = 256 << 10;
/// Most stored bytes of one block: twice [`CHUNK_BYTES_MAX`], far above zstd's worst-case
/// expansion of a 256 KiB block (about 1 KiB; and the store keeps a block raw unless
/// compressing saves 1/16).
pub const BLOCK_DATA_BYTES_MAX: usize = 512 << 10;
/// Most block references in one file state. Holes count too. 2^20 references are 48 MiB
/// of message, within [`MESSAGE_WORDS_MAX`]; they cover any file up to 16 GiB (at the
/// 16 KiB minimum chunk size) and typically 64 GiB (at the 64 KiB average). A larger
/// file (the store allows 16 TiB) cannot travel as one entry in protocol version 1: the
/// sender gets [`Error::TooLarge`].
pub const BLOCK_REFS_PER_FILE_MAX: usize = 1 << 20;
/// Most hashes in one `haveBlocks` or `getBlocks` call (and answers in `have`).
pub const HASHES_PER_CALL_MAX: usize = 4096;
/// Most blocks in one `getBlocks` answer or `push`.
pub const BLOCKS_PER_CALL_MAX: usize = HASHES_PER_CALL_MAX;
/// Most stored block bytes in one `getBlocks` answer or `push`: half of
/// [`MESSAGE_WORDS_MAX`], leaving room for a push's entries. Callers ask for blocks in
/// batches that fit.
pub const BLOCK_DATA_BYTES_PER_CALL_MAX: usize = 32 << 20;
/// Most conflicts reported by one `push` (at most one per entry).
pub const CONFLICTS_PER_CALL_MAX: usize = ENTRIES_PER_PAGE_MAX;
/// Longest identifier (replica id, peer name, workspace id), in bytes of UTF-8.
pub const ID_BYTES_MAX: usize = 256;
/// Longest access token, in bytes.
pub const TOKEN_BYTES_MAX: usize = 1024;
/// Traversal limit of one message, in 8-byte words: 64 MiB (Cap'n Proto's default).
pub const MESSAGE_WORDS_MAX: usize = 8 << 20;
/// Longest accepted message, in bytes: [`MESSAGE_WORDS_MAX`] words and a segment table.
pub const MESSAGE_BYTES_MAX: usize = MESSAGE_WORDS_MAX * 8 + 4096;
/// Nesting limit of one message (pointer depth). Our deepest standalone message (a page:
/// page, entries, entry, blocks, block ref, hash) nests 6 deep; the RPC envelope adds a
/// few levels.
pub const NESTING_DEPTH_MAX: i32 = 32;

/// The reader options of every message this crate reads: [`MESSAGE_WORDS_MAX`] and
/// [`NESTING_DEPTH_MAX`]. The RPC connection uses them too.
pub fn reader_options() -> ReaderOptions {
    let mut options = ReaderOptions::new();
    options
        .traversal_limit_in_words(Some(MESSAGE_WORDS_MAX))
        .nesting_limit(NESTING_DEPTH_MAX);
    options
}

// ---------------------------------------------------------------------------------------
// Messages from bytes.

/// A copy of a message's bytes, aligned to words as Cap'n Proto requires.
struct AlignedBytes {
    words: Vec<capnp::Word>,
    len: usize,
}

impl AsRef<[u8]> for AlignedBytes {
    fn as_ref(&self) -> &[u8] {
        &capnp::Word::words_to_bytes(&self.words)[..self.len]
    }
}

/// One whole message read from bytes with the limits of [`reader_options`], ready to be
/// decoded as any [`Wire`] type. Each decode charges the same traversal budget: decode a
/// frame once.
pub struct Frame {
    reader: capnp::message::Reader<NoAllocBufferSegments<AlignedBytes>>,
}

impl Frame {
    /// Decodes the message's root as a `T`.
    pub fn decode<T: Wire>(&self) -> Result<T> {
        T::from_frame(self)
    }

    fn root<'a, T: capnp::traits::FromPointerReader<'a>>(&'a self) -> Result<T> {
        Ok(self.reader.get_root()?)
    }
}

/// Reads one whole message (segment table and segments, as [`Wire::to_bytes`] writes
/// it) from `bytes`: the segment table must fit the bytes and the limits, and nothing may
/// follow the message. Pointers are only followed, and checked, when decoding.
pub fn read_message(bytes: &[u8]) -> Result<Frame> {
    check_len("message", "bytes", bytes.len(), MESSAGE_BYTES_MAX)?;
    let options = reader_options();
    let mut words = capnp::Word::allocate_zeroed_vec(bytes.len().div_ceil(8));
    capnp::Word::words_to_bytes_mut(&mut words)[..bytes.len()].copy_from_slice(bytes);
    let buffer = AlignedBytes {
        words,
        len: bytes.len(),
    };
    let trailing = {
        let mut rest = buffer.as_ref();
        NoAllocBufferSegments::from_slice(&mut rest, options)?;
        rest.len()
    };
    if trailing != 0 {
        return Err(Error::malformed("message", "bytes follow the message"));
    }
    let segments = NoAllocBufferSegments::from_buffer(buffer, options)?;
    Ok(Frame {
        reader: capnp::message::Reader::new(segments, options),
    })
}

mod sealed {
    pub trait Sealed {}
}

/// A domain value that travels as a standalone message: as the root struct of its schema
/// type, or for `Vec`s as a root list (`List(Data)` of hashes, `List(Bool)`,
/// `List(Block)`, `List(Entry)`, `List(Conflict)`).
pub trait Wire: Sized + sealed::Sealed {
    /// The message (segment table and segments) holding this value; fails if the value
    /// breaks a rule of the protocol.
    fn to_bytes(&self) -> Result<Vec<u8>>;

    /// Decodes a message's root.
    fn from_frame(frame: &Frame) -> Result<Self>;

    /// Reads a message ([`read_message`]) and decodes its root.
    fn from_bytes(bytes: &[u8]) -> Result<Self> {
        Self::from_frame(&read_message(bytes)?)
    }
}

fn serialize(message: &Builder<HeapAllocator>) -> Vec<u8> {
    capnp::serialize::write_message_to_words(message)
}

macro_rules! wire_struct {
    ($ty:ty, $module:ident, $write:ident, $read:ident) => {
        impl sealed::Sealed for $ty {}

        impl Wire for $ty {
            fn to_bytes(&self) -> Result<Vec<u8>> {
                let mut message = Builder::new_default();
                $write(self, message.init_root::<$module::Builder>())?;
                Ok(serialize(&message))
            }

            fn from_frame(frame: &Frame) -> Result<Self> {
                $read(frame.root::<$module::Reader>()?)
            }
        }
    };
}

wire_struct!(Cursor, cursor, write_cursor, read_cursor);
wire_struct!(BlockRef, block_ref, write_block_ref, read_block_ref);
wire_struct!(ChangeEntry, entry, write_entry, read_entry);
wire_struct!(StoredBlock, block, write_block, read_block);
wire_struct!(ChangePage, page, write_page, read_page);
wire_struct!(ClientInfo, client_info, write_client_info, read_client_info);
wire_struct!(ServerInfo, server_info, write_server_info, read_server_info);
wire_struct!(Conflict, conflict, write_conflict, read_conflict);
wire_struct!(NodeInfo, node, write_node, read_node);
wire_struct!(DirItem, dir_item, write_dir_item, read_dir_item);
wire_struct!(GrepMatch, grep_match, write_grep_match, read_grep_match);
wire_struct!(WorkspaceStats, stats, write_stats, read_stats);
wire_struct!(
    CheckReport,
    check_report,
    write_check_report,
    read_check_report
);
wire_struct!(
    CompactReport,
    compact_report,
    write_compact_report,
    read_compact_report
);

macro_rules! wire_list {
    ($item:ty, $list:ty, $write:ident, $read:ident) => {
        impl sealed::Sealed for Vec<$item> {}

        impl Wire for Vec<$item> {
            fn to_bytes(&self) -> Result<Vec<u8>> {
                let mut message = Builder::new_default();
                let root = &mut message;
                $write(self, move |len| root.initn_root::<$list>(len))?;
                Ok(serialize(&message))
            }

            fn from_frame(frame: &Frame) -> Result<Self> {
                $read(frame.root()?)
            }
        }
    };
}

wire_list!(BlockHash, data_list::Builder<'_>, write_hashes, read_hashes);
wire_list!(
    bool,
    primitive_list::Builder<'_, bool>,
    write_bools,
    read_bools
);
wire_list!(
    StoredBlock,
    struct_list::Builder<'_, block::Owned>,
    write_blocks,
    read_blocks
);
wire_list!(
    ChangeEntry,
    struct_list::Builder<'_, entry::Owned>,
    write_entries,
    read_entries
);
wire_list!(
    Conflict,
    struct_list::Builder<'_, conflict::Owned>,
    write_conflicts,
    read_conflicts
);
wire_list!(
    DirItem,
    struct_list::Builder<'_, dir_item::Owned>,
    write_dir_items,
    read_dir_items
);
wire_list!(
    GrepMatch,
    struct_list::Builder<'_, grep_match::Owned>,
    write_grep_matches,
    read_grep_matches
);

// ---------------------------------------------------------------------------------------
// Rules shared by both directions.

fn too_large(what: &'static str, unit: &'static str, len: usize, max: usize) -> Error {
    Error::TooLarge {
        what,
        unit,
        len: len as u64,
        max: max as u64,
    }
}

fn check_len(what: &'static str, unit: &'static str, len: usize, max: usize) -> Result<()> {
    if len > max {
        return Err(too_large(what, unit, len, max));
    }
    Ok(())
}

/// Items to reserve for a decoded list of `len` (already within its bound). A list of
/// empty structs takes no bytes whatever its length, so a tiny message could make us
/// reserve the whole bound (36 MiB for a file's block list) only to fail on the first
/// item: reserve at most this many, and let real items grow the vector.
const PREALLOCATED_ITEMS_MAX: usize = 1024;

fn preallocated(len: u32) -> usize {
    (len as usize).min(PREALLOCATED_ITEMS_MAX)
}

/// A list's length checked against its bound, as a Cap'n Proto list length.
fn list_len(what: &'static str, unit: &'static str, len: usize, max: usize) -> Result<u32> {
    check_len(what, unit, len, max)?;
    u32::try_from(len).map_err(|_| too_large(what, unit, len, u32::MAX as usize))
}

/// An absolute, canonical path: `/`, or `/` and components separated by single `/`, none
/// empty, `.` or `..`, none longer than [`NAME_BYTES_MAX`], no NUL anywhere.
fn check_path(what: &'static str, path: &[u8]) -> Result<()> {
    check_len(what, "bytes", path.len(), PATH_BYTES_MAX)?;
    let Some(rest) = path.strip_prefix(b"/") else {
        return Err(Error::malformed(what, "path is not absolute"));
    };
    if rest.is_empty() {
        return Ok(());
    }
    if path.contains(&0) {
        return Err(Error::malformed(what, "path contains NUL"));
    }
    for name in rest.split(|&b| b == b'/') {
        if name.is_empty() {
            return Err(Error::malformed(what, "path has an empty component"));
        }
        if name == b"." || name == b".." {
            return Err(Error::malformed(what, "path has a . or .. component"));
        }
        check_len(what, "bytes in a component", name.len(), NAME_BYTES_MAX)?;
    }
    Ok(())
}

/// A cursor's path: empty (before everything in its revision) or a path.
fn check_cursor_path(path: &[u8]) -> Result<()> {
    if path.is_empty() {
        return Ok(());
    }
    check_path("cursor path", path)
}

fn check_perm(what: &'static str, perm: u32) -> Result<()> {
    if perm & !PERM_BITS_MAX != 0 {
        return Err(Error::malformed(what, "permission has bits beyond 0o7777"));
    }
    Ok(())
}

fn check_symlink_target(target: &[u8]) -> Result<()> {
    check_len(
        "symlink target",
        "bytes",
        target.len(),
        SYMLINK_TARGET_BYTES_MAX,
    )?;
    if target.is_empty() {
        return Err(Error::malformed("symlink target", "empty"));
    }
    if target.contains(&0) {
        return Err(Error::malformed("symlink target", "contains NUL"));
    }
    Ok(())
}

fn is_hole(hash: &BlockHash) -> bool {
    hash.0 == [0; HASH_LEN]
}

fn read_hash(what: &'static str, bytes: &[u8]) -> Result<BlockHash> {
    let array: [u8; HASH_LEN] = bytes
        .try_into()
        .map_err(|_| Error::malformed(what, "hash is not 32 bytes"))?;
    Ok(BlockHash(array))
}

/// A hash naming a stored block: the all-zero hash only marks holes.
fn check_block_hash(what: &'static str, hash: &BlockHash) -> Result<()> {
    if is_hole(hash) {
        return Err(Error::malformed(what, "the all-zero hash names no block"));
    }
    Ok(())
}

/// A hole (all-zero hash) of any length, or a block of at most [`CHUNK_BYTES_MAX`].
fn check_block_ref(block: &BlockRef) -> Result<()> {
    if !is_hole(&block.hash) && block.len > CHUNK_BYTES_MAX {
        return Err(too_large(
            "block ref",
            "bytes",
            block.len as usize,
            CHUNK_BYTES_MAX as usize,
        ));
    }
    Ok(())
}

/// A file's blocks end within its size (a hole may follow them, up to `size`).
fn check_file_extent(size: u64, blocks: &[BlockRef]) -> Result<()> {
    // At most 2^20 lengths of at most 2^32 - 1: the sum cannot overflow.
    let covered: u64 = blocks.iter().map(|b| u64::from(b.len)).sum();
    if covered > size {
        return Err(Error::malformed("file state", "its blocks exceed its size"));
    }
    Ok(())
}

fn codec_code(codec: Codec) -> Result<u8> {
    u8::try_from(codec as i64).map_err(|_| Error::malformed("block codec", "code above 255"))
}

fn codec_of(code: u8) -> Result<Codec> {
    Codec::from_code(i64::from(code)).map_err(|_| Error::malformed("block codec", "unknown codec"))
}

/// The block rules that do not need its bytes.
fn check_block_header(hash: &BlockHash, raw_len: u32, data_len: usize) -> Result<()> {
    check_block_hash("block hash", hash)?;
    if raw_len > CHUNK_BYTES_MAX {
        return Err(too_large(
            "block",
            "raw bytes",
            raw_len as usize,
            CHUNK_BYTES_MAX as usize,
        ));
    }
    check_len("block data", "bytes", data_len, BLOCK_DATA_BYTES_MAX)
}

fn check_block_body(codec: Codec, raw_len: u32, data_len: usize) -> Result<()> {
    if codec == Codec::Raw && data_len != raw_len as usize {
        return Err(Error::malformed(
            "raw block",
            "data length differs from rawLen",
        ));
    }
    Ok(())
}

fn check_id(what: &'static str, id: &[u8]) -> Result<()> {
    check_len(what, "bytes", id.len(), ID_BYTES_MAX)?;
    if id.contains(&0) {
        return Err(Error::malformed(what, "contains NUL"));
    }
    Ok(())
}

fn read_id(what: &'static str, reader: text::Reader<'_>) -> Result<String> {
    check_id(what, reader.as_bytes())?;
    reader
        .to_str()
        .map(str::to_owned)
        .map_err(|_| Error::malformed(what, "not UTF-8"))
}

fn check_chunk_sizes(sizes: &ChunkSizes) -> Result<()> {
    if !sizes.is_valid() {
        return Err(Error::malformed(
            "chunk sizes",
            "not sizes the chunker accepts",
        ));
    }
    if sizes.max > CHUNK_BYTES_MAX as usize {
        return Err(too_large(
            "chunk max",
            "bytes",
            sizes.max,
            CHUNK_BYTES_MAX as usize,
        ));
    }
    Ok(())
}

fn chunk_size_u32(size: usize) -> Result<u32> {
    u32::try_from(size).map_err(|_| too_large("chunk size", "bytes", size, u32::MAX as usize))
}

// ---------------------------------------------------------------------------------------
// Cursor.

pub(crate) fn write_cursor(value: &Cursor, mut builder: cursor::Builder<'_>) -> Result<()> {
    check_cursor_path(&value.path)?;
    builder.set_revision(value.revision.0);
    builder.set_path(&value.path);
    Ok(())
}

pub(crate) fn read_cursor(reader: cursor::Reader<'_>) -> Result<Cursor> {
    let path = reader.get_path()?;
    check_cursor_path(path)?;
    Ok(Cursor {
        revision: Revision(reader.get_revision()),
        path: path.to_vec(),
    })
}

// ---------------------------------------------------------------------------------------
// BlockRef.

pub(crate) fn write_block_ref(value: &BlockRef, mut builder: block_ref::Builder<'_>) -> Result<()> {
    check_block_ref(value)?;
    builder.set_hash(&value.hash.0);
    builder.set_len(value.len);
    Ok(())
}

pub(crate) fn read_block_ref(reader: block_ref::Reader<'_>) -> Result<BlockRef> {
    let block = BlockRef {
        hash: read_hash("block ref hash", reader.get_hash()?)?,
        len: reader.get_len(),
    };
    check_block_ref(&block)?;
    Ok(block)
}

// ---------------------------------------------------------------------------------------
// ChangeEntry and its states.

pub(crate) fn write_entry(value: &ChangeEntry, mut builder: entry::Builder<'_>) -> Result<()> {
    check_path("entry path", &value.path)?;
    builder.set_revision(value.revision.0);
    builder.set_path(&value.path);
    write_cursor(&value.base, builder.reborrow().init_base())?;
    let mut state = builder.init_state();
    match &value.state {
        EntryState::File {
            perm,
            mtime,
            size,
            blocks,
        } => {
            check_perm("file state", *perm)?;
            let len = list_len(
                "file block list",
                "block refs",
                blocks.len(),
                BLOCK_REFS_PER_FILE_MAX,
            )?;
            for block in blocks {
                check_block_ref(block)?;
            }
            check_file_extent(*size, blocks)?;
            let mut file = state.init_file();
            file.set_perm(*perm);
            file.set_mtime(*mtime);
            file.set_size(*size);
            let mut list = file.init_blocks(len);
            for (i, block) in (0..len).zip(blocks) {
                let mut item = list.reborrow().get(i);
                item.set_hash(&block.hash.0);
                item.set_len(block.len);
            }
        }
        EntryState::Directory { perm, mtime } => {
            check_perm("directory state", *perm)?;
            let mut dir = state.init_directory();
            dir.set_perm(*perm);
            dir.set_mtime(*mtime);
        }
        EntryState::Symlink { target } => {
            check_symlink_target(target)?;
            state.set_symlink(target);
        }
        EntryState::Removed => state.set_removed(()),
    }
    Ok(())
}

pub(crate) fn read_entry(reader: entry::Reader<'_>) -> Result<ChangeEntry> {
    use crate::sync_capnp::entry::state::Which;

    let path = reader.get_path()?;
    check_path("entry path", path)?;
    let which = reader
        .get_state()
        .which()
        .map_err(|_| Error::malformed("entry state", "unknown variant"))?;
    let state = match which {
        Which::File(file) => {
            let perm = file.get_perm();
            check_perm("file state", perm)?;
            let size = file.get_size();
            let list = file.get_blocks()?;
            check_len(
                "file block list",
                "block refs",
                list.len() as usize,
                BLOCK_REFS_PER_FILE_MAX,
            )?;
            let mut blocks = Vec::with_capacity(preallocated(list.len()));
            for item in list.iter() {
                blocks.push(read_block_ref(item)?);
            }
            check_file_extent(size, &blocks)?;
            EntryState::File {
                perm,
                mtime: file.get_mtime(),
                size,
                blocks,
            }
        }
        Which::Directory(dir) => {
            let perm = dir.get_perm();
            check_perm("directory state", perm)?;
            EntryState::Directory {
                perm,
                mtime: dir.get_mtime(),
            }
        }
        Which::Symlink(target) => {
            let target = target?;
            check_symlink_target(target)?;
            EntryState::Symlink {
                target: target.to_vec(),
            }
        }
        Which::Removed(()) => EntryState::Removed,
    };
    Ok(ChangeEntry {
        revision: Revision(reader.get_revision()),
        path: path.to_vec(),
        state,
        base: read_cursor(reader.get_base()?)?,
    })
}

// ---------------------------------------------------------------------------------------
// StoredBlock.

pub(crate) fn write_block(value: &StoredBlock, mut builder: block::Builder<'_>) -> Result<()> {
    check_block_header(&value.hash, value.raw_len, value.data.len())?;
    check_block_body(value.codec, value.raw_len, value.data.len())?;
    builder.set_hash(&value.hash.0);
    builder.set_codec(codec_code(value.codec)?);
    builder.set_raw_len(value.raw_len);
    builder.set_data(&value.data);
    Ok(())
}

pub(crate) fn read_block(reader: block::Reader<'_>) -> Result<StoredBlock> {
    read_block_with(reader, reader.get_data()?)
}

/// [`read_block`] with its data already read (reading it again would charge the traversal
/// limit twice).
fn read_block_with(reader: block::Reader<'_>, data: &[u8]) -> Result<StoredBlock> {
    let hash = read_hash("block hash", reader.get_hash()?)?;
    let raw_len = reader.get_raw_len();
    check_block_header(&hash, raw_len, data.len())?;
    let codec = codec_of(reader.get_codec())?;
    check_block_body(codec, raw_len, data.len())?;
    Ok(StoredBlock {
        hash,
        codec,
        raw_len,
        data: data.to_vec(),
    })
}

// ---------------------------------------------------------------------------------------
// ChangePage.

pub(crate) fn write_page(value: &ChangePage, mut builder: page::Builder<'_>) -> Result<()> {
    write_entries(&value.entries, |len| builder.reborrow().init_entries(len))?;
    write_cursor(&value.next, builder.reborrow().init_next())?;
    builder.set_complete(value.complete);
    builder.set_revision(value.revision.0);
    Ok(())
}

pub(crate) fn read_page(reader: page::Reader<'_>) -> Result<ChangePage> {
    Ok(ChangePage {
        entries: read_entries(reader.get_entries()?)?,
        next: read_cursor(reader.get_next()?)?,
        complete: reader.get_complete(),
        revision: Revision(reader.get_revision()),
    })
}

// ---------------------------------------------------------------------------------------
// ClientInfo, ServerInfo, Conflict, token.

pub(crate) fn write_client_info(
    value: &ClientInfo,
    mut builder: client_info::Builder<'_>,
) -> Result<()> {
    check_id("replica id", value.replica_id.as_bytes())?;
    check_id("peer", value.peer.as_bytes())?;
    builder.set_replica_id(value.replica_id.as_str());
    builder.set_peer(value.peer.as_str());
    Ok(())
}

pub(crate) fn read_client_info(reader: client_info::Reader<'_>) -> Result<ClientInfo> {
    Ok(ClientInfo {
        replica_id: read_id("replica id", reader.get_replica_id()?)?,
        peer: read_id("peer", reader.get_peer()?)?,
    })
}

pub(crate) fn write_server_info(
    value: &ServerInfo,
    mut builder: server_info::Builder<'_>,
) -> Result<()> {
    check_id("workspace id", value.workspace_id.as_bytes())?;
    check_chunk_sizes(&value.chunk_sizes)?;
    builder.set_version(value.version);
    builder.set_workspace_id(value.workspace_id.as_str());
    builder.set_revision(value.revision.0);
    builder.set_chunk_min(chunk_size_u32(value.chunk_sizes.min)?);
    builder.set_chunk_avg(chunk_size_u32(value.chunk_sizes.avg)?);
    builder.set_chunk_max(chunk_size_u32(value.chunk_sizes.max)?);
    builder.set_replaced(value.replaced);
    Ok(())
}

pub(crate) fn read_server_info(reader: server_info::Reader<'_>) -> Result<ServerInfo> {
    let chunk_sizes = ChunkSizes {
        min: reader.get_chunk_min() as usize,
        avg: reader.get_chunk_avg() as usize,
        max: reader.get_chunk_max() as usize,
    };
    check_chunk_sizes(&chunk_sizes)?;
    Ok(ServerInfo {
        version: reader.get_version(),
        workspace_id: read_id("workspace id", reader.get_workspace_id()?)?,
        revision: Revision(reader.get_revision()),
        chunk_sizes,
        replaced: reader.get_replaced(),
    })
}

pub(crate) fn write_conflict(value: &Conflict, mut builder: conflict::Builder<'_>) -> Result<()> {
    check_path("conflict path", &value.path)?;
    check_path("conflict keptAs", &value.kept_as)?;
    builder.set_path(&value.path);
    builder.set_kept_as(&value.kept_as);
    Ok(())
}

pub(crate) fn read_conflict(reader: conflict::Reader<'_>) -> Result<Conflict> {
    let path = reader.get_path()?;
    check_path("conflict path", path)?;
    let kept_as = reader.get_kept_as()?;
    check_path("conflict keptAs", kept_as)?;
    Ok(Conflict {
        path: path.to_vec(),
        kept_as: kept_as.to_vec(),
    })
}

/// The token of `Gate.hello` (compared by the caller, not checked here beyond its bound).
pub(crate) fn read_token(reader: data::Reader<'_>) -> Result<Vec<u8>> {
    check_len("token", "bytes", reader.len(), TOKEN_BYTES_MAX)?;
    Ok(reader.to_vec())
}

pub(crate) fn write_token(token: &[u8], set: impl FnOnce(&[u8])) -> Result<()> {
    check_len("token", "bytes", token.len(), TOKEN_BYTES_MAX)?;
    set(token);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Operations on the whole workspace (`stats`, `check`, `compact`).

/// Most problems one `check` answer lists: as many as the store lists; it counts the rest.
pub const CHECK_PROBLEMS_MAX: usize = CHECK_PROBLEMS_LISTED_MAX;
/// Longest problem line a `check` answer carries; the encoder cuts longer ones.
pub const CHECK_PROBLEM_BYTES_MAX: usize = 8 << 10;

const _: () = assert!(CHECK_PROBLEMS_MAX * (CHECK_PROBLEM_BYTES_MAX + 16) <= MESSAGE_WORDS_MAX * 8);

pub(crate) fn write_stats(value: &WorkspaceStats, mut builder: stats::Builder<'_>) -> Result<()> {
    check_id("workspace id", value.workspace_id.as_bytes())?;
    let s = &value.stats;
    builder.set_workspace_id(value.workspace_id.as_str());
    builder.set_files(s.files);
    builder.set_directories(s.directories);
    builder.set_symlinks(s.symlinks);
    builder.set_other_nodes(s.other_nodes);
    builder.set_logical_bytes(s.logical_bytes);
    builder.set_unique_bytes(s.unique_bytes);
    builder.set_stored_bytes(s.stored_bytes);
    builder.set_blocks(s.blocks);
    builder.set_database_bytes(s.database_bytes);
    builder.set_free_bytes(s.free_bytes);
    builder.set_staged_files(s.staged_files);
    builder.set_revision(s.revision.0);
    Ok(())
}

pub(crate) fn read_stats(reader: stats::Reader<'_>) -> Result<WorkspaceStats> {
    Ok(WorkspaceStats {
        workspace_id: read_id("workspace id", reader.get_workspace_id()?)?,
        stats: Stats {
            files: reader.get_files(),
            directories: reader.get_directories(),
            symlinks: reader.get_symlinks(),
            other_nodes: reader.get_other_nodes(),
            logical_bytes: reader.get_logical_bytes(),
            unique_bytes: reader.get_unique_bytes(),
            stored_bytes: reader.get_stored_bytes(),
            blocks: reader.get_blocks(),
            database_bytes: reader.get_database_bytes(),
            free_bytes: reader.get_free_bytes(),
            staged_files: reader.get_staged_files(),
            revision: Revision(reader.get_revision()),
        },
    })
}

/// `line` cut to at most [`CHECK_PROBLEM_BYTES_MAX`] bytes, at a character boundary.
fn problem_line(line: &str) -> &str {
    let mut end = line.len().min(CHECK_PROBLEM_BYTES_MAX);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    &line[..end]
}

pub(crate) fn write_check_report(
    value: &CheckReport,
    mut builder: check_report::Builder<'_>,
) -> Result<()> {
    let len = list_len(
        "check report",
        "problems",
        value.problems.len(),
        CHECK_PROBLEMS_MAX,
    )?;
    builder.set_nodes(value.nodes);
    builder.set_blocks(value.blocks);
    builder.set_block_bytes(value.block_bytes);
    builder.set_problems_unlisted(value.problems_unlisted as u64);
    let mut list = builder.init_problems(len);
    for (i, problem) in (0..len).zip(&value.problems) {
        list.set(i, problem_line(&problem.0));
    }
    Ok(())
}

pub(crate) fn read_check_report(reader: check_report::Reader<'_>) -> Result<CheckReport> {
    const WHAT: &str = "check report";
    let list = reader.get_problems()?;
    check_len(WHAT, "problems", list.len() as usize, CHECK_PROBLEMS_MAX)?;
    let mut problems = Vec::with_capacity(preallocated(list.len()));
    for line in list.iter() {
        let line = line?;
        check_len(WHAT, "problem bytes", line.len(), CHECK_PROBLEM_BYTES_MAX)?;
        let line = line
            .to_str()
            .map_err(|_| Error::malformed(WHAT, "problem not UTF-8"))?;
        problems.push(Problem(line.to_owned()));
    }
    let problems_unlisted = usize::try_from(reader.get_problems_unlisted())
        .map_err(|_| Error::malformed(WHAT, "problem count beyond this machine's"))?;
    Ok(CheckReport {
        problems,
        problems_unlisted,
        nodes: reader.get_nodes(),
        blocks: reader.get_blocks(),
        block_bytes: reader.get_block_bytes(),
    })
}

pub(crate) fn write_compact_report(
    value: &CompactReport,
    mut builder: compact_report::Builder<'_>,
) -> Result<()> {
    builder.set_bytes_before(value.bytes_before);
    builder.set_bytes_after(value.bytes_after);
    builder.set_rewrote(value.rewrote);
    Ok(())
}

pub(crate) fn read_compact_report(reader: compact_report::Reader<'_>) -> Result<CompactReport> {
    Ok(CompactReport {
        bytes_before: reader.get_bytes_before(),
        bytes_after: reader.get_bytes_after(),
        rewrote: reader.get_rewrote(),
    })
}

// ---------------------------------------------------------------------------------------
// File streams (`openRead`, `openWrite`): a path, then pieces at offsets.

/// Most bytes one `read` answers or one `write` carries: a stream of any size moves in
/// pieces this large, a few in flight.
pub const FILE_PIECE_BYTES_MAX: usize = 1 << 20;

/// A file stream's path as the path API takes it: absolute, UTF-8, no NUL, at most
/// [`PATH_BYTES_MAX`] bytes. Unlike a replicated entry's path it need not be canonical
/// (`/a/./b` and `/a/../b` resolve in the store, as on the command line).
pub fn file_path(bytes: &[u8]) -> Result<&str> {
    const WHAT: &str = "file path";
    check_len(WHAT, "bytes", bytes.len(), PATH_BYTES_MAX)?;
    let path = std::str::from_utf8(bytes).map_err(|_| Error::malformed(WHAT, "not UTF-8"))?;
    if !path.starts_with('/') {
        return Err(Error::malformed(WHAT, "path is not absolute"));
    }
    if path.contains('\0') {
        return Err(Error::malformed(WHAT, "path contains NUL"));
    }
    Ok(path)
}

/// A piece of a file stream (`what` names it), checked against [`FILE_PIECE_BYTES_MAX`].
pub(crate) fn file_piece<'a>(what: &'static str, bytes: &'a [u8]) -> Result<&'a [u8]> {
    check_len(what, "bytes", bytes.len(), FILE_PIECE_BYTES_MAX)?;
    Ok(bytes)
}

/// A piece's length as the protocol asks for it: at most [`FILE_PIECE_BYTES_MAX`].
pub(crate) fn file_piece_len(max_bytes: u32) -> usize {
    (max_bytes as usize).min(FILE_PIECE_BYTES_MAX)
}

/// Most entries one `list` answer holds.
pub const LIST_ENTRIES_MAX: usize = 4096;
/// Most paths one `glob` answer holds, and most matches one `grep` answer holds.
pub const FOUND_ITEMS_MAX: usize = 1 << 16;
/// Most bytes of paths (and lines) one `glob` or `grep` answer holds.
pub const FOUND_BYTES_MAX: usize = 16 << 20;
/// Longest line a `grep` match carries (longer lines are refused by the encoder).
pub const GREP_LINE_BYTES_MAX: usize = 1 << 20;

const _: () = assert!(
    LIST_ENTRIES_MAX * (PATH_BYTES_MAX + SYMLINK_TARGET_BYTES_MAX + 256) <= MESSAGE_WORDS_MAX * 8
);
const _: () = assert!(FOUND_BYTES_MAX + FOUND_ITEMS_MAX * 64 <= MESSAGE_WORDS_MAX * 8);

pub(crate) fn write_node(value: &NodeInfo, mut builder: node::Builder<'_>) -> Result<()> {
    let attr = &value.attr;
    if attr.perm > 0o7777 {
        return Err(Error::malformed("node", "permission bits above 0o7777"));
    }
    match (&value.target, attr.kind) {
        (Some(target), FileKind::Symlink) => check_symlink_target(target)?,
        (None, FileKind::Symlink) => {
            return Err(Error::malformed("node", "a symlink without its target"))
        }
        (Some(_), _) => return Err(Error::malformed("node", "a target on a non-symlink")),
        (None, _) => {}
    }
    builder.set_mode(attr.mode());
    builder.set_ino(attr.ino.0);
    builder.set_nlink(attr.nlink);
    builder.set_uid(attr.uid);
    builder.set_gid(attr.gid);
    builder.set_size(attr.size);
    builder.set_atime(attr.atime);
    builder.set_mtime(attr.mtime);
    builder.set_ctime(attr.ctime);
    builder.set_rdev(attr.rdev);
    builder.set_revision(attr.revision.0);
    builder.set_target(value.target.as_deref().unwrap_or_default());
    Ok(())
}

pub(crate) fn read_node(reader: node::Reader<'_>) -> Result<NodeInfo> {
    let mode = reader.get_mode();
    let kind = FileKind::from_mode(mode).ok_or(Error::malformed("node", "unknown kind"))?;
    if mode & !(libc::S_IFMT | 0o7777) != 0 {
        return Err(Error::malformed(
            "node",
            "mode bits beyond kind and permission",
        ));
    }
    let target = reader.get_target()?;
    let target = if kind == FileKind::Symlink {
        check_symlink_target(target)?;
        Some(target.to_vec())
    } else if target.is_empty() {
        None
    } else {
        return Err(Error::malformed("node", "a target on a non-symlink"));
    };
    Ok(NodeInfo {
        attr: Attr {
            ino: InodeNo(reader.get_ino()),
            kind,
            perm: mode & 0o7777,
            uid: reader.get_uid(),
            gid: reader.get_gid(),
            nlink: reader.get_nlink(),
            size: reader.get_size(),
            atime: reader.get_atime(),
            mtime: reader.get_mtime(),
            ctime: reader.get_ctime(),
            rdev: reader.get_rdev(),
            revision: Revision(reader.get_revision()),
        },
        target,
    })
}

fn check_dir_item_name(name: &[u8]) -> Result<()> {
    const WHAT: &str = "directory entry name";
    check_len(WHAT, "bytes", name.len(), NAME_BYTES_MAX)?;
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0)
    {
        return Err(Error::malformed(WHAT, "not a name a directory holds"));
    }
    Ok(())
}

pub(crate) fn write_dir_item(value: &DirItem, mut builder: dir_item::Builder<'_>) -> Result<()> {
    check_dir_item_name(&value.name)?;
    write_node(&value.node, builder.reborrow().init_node())?;
    builder.set_name(&value.name);
    Ok(())
}

pub(crate) fn read_dir_item(reader: dir_item::Reader<'_>) -> Result<DirItem> {
    let name = reader.get_name()?;
    check_dir_item_name(name)?;
    Ok(DirItem {
        name: name.to_vec(),
        node: read_node(reader.get_node()?)?,
    })
}

pub(crate) fn write_dir_items<'a>(
    items: &[DirItem],
    init: impl FnOnce(u32) -> struct_list::Builder<'a, dir_item::Owned>,
) -> Result<()> {
    let len = list_len(
        "directory listing",
        "entries",
        items.len(),
        LIST_ENTRIES_MAX,
    )?;
    for item in items {
        check_dir_item_name(&item.name)?;
    }
    let mut list = init(len);
    for (i, item) in (0..len).zip(items) {
        write_dir_item(item, list.reborrow().get(i))?;
    }
    Ok(())
}

pub(crate) fn read_dir_items(
    list: struct_list::Reader<'_, dir_item::Owned>,
) -> Result<Vec<DirItem>> {
    check_len(
        "directory listing",
        "entries",
        list.len() as usize,
        LIST_ENTRIES_MAX,
    )?;
    list.iter().map(read_dir_item).collect()
}

/// A found path (`glob`, `grep`): a path as the path API gives it.
fn found_path(what: &'static str, bytes: &[u8]) -> Result<String> {
    Ok(file_path(bytes)
        .map_err(|_| Error::malformed(what, "not an absolute UTF-8 path"))?
        .to_owned())
}

pub(crate) fn write_found_paths<'a>(
    paths: &[String],
    init: impl FnOnce(u32) -> data_list::Builder<'a>,
) -> Result<()> {
    let len = list_len("found paths", "paths", paths.len(), FOUND_ITEMS_MAX)?;
    let total: usize = paths.iter().map(String::len).sum();
    check_len("found paths", "bytes", total, FOUND_BYTES_MAX)?;
    for path in paths {
        file_path(path.as_bytes())?;
    }
    let mut list = init(len);
    for (i, path) in (0..len).zip(paths) {
        list.set(i, path.as_bytes());
    }
    Ok(())
}

pub(crate) fn read_found_paths(list: data_list::Reader<'_>) -> Result<Vec<String>> {
    check_len("found paths", "paths", list.len() as usize, FOUND_ITEMS_MAX)?;
    let mut paths = Vec::with_capacity(preallocated(list.len()));
    let mut total = 0usize;
    for item in list.iter() {
        let bytes = item?;
        total = total.saturating_add(bytes.len());
        check_len("found paths", "bytes", total, FOUND_BYTES_MAX)?;
        paths.push(found_path("found path", bytes)?);
    }
    Ok(paths)
}

pub(crate) fn write_grep_match(
    value: &GrepMatch,
    mut builder: grep_match::Builder<'_>,
) -> Result<()> {
    file_path(value.path.as_bytes())?;
    check_len("grep line", "bytes", value.line.len(), GREP_LINE_BYTES_MAX)?;
    builder.set_path(value.path.as_bytes());
    builder.set_line_number(value.line_number);
    builder.set_line(value.line.as_bytes());
    Ok(())
}

pub(crate) fn read_grep_match(reader: grep_match::Reader<'_>) -> Result<GrepMatch> {
    let line = reader.get_line()?;
    check_len("grep line", "bytes", line.len(), GREP_LINE_BYTES_MAX)?;
    Ok(GrepMatch {
        path: found_path("grep match path", reader.get_path()?)?,
        line_number: reader.get_line_number(),
        line: std::str::from_utf8(line)
            .map_err(|_| Error::malformed("grep line", "not UTF-8"))?
            .to_owned(),
    })
}

pub(crate) fn write_grep_matches<'a>(
    matches: &[GrepMatch],
    init: impl FnOnce(u32) -> struct_list::Builder<'a, grep_match::Owned>,
) -> Result<()> {
    let len = list_len("grep matches", "matches", matches.len(), FOUND_ITEMS_MAX)?;
    let total: usize = matches.iter().map(|m| m.path.len() + m.line.len()).sum();
    check_len("grep matches", "bytes", total, FOUND_BYTES_MAX)?;
    let mut list = init(len);
    for (i, m) in (0..len).zip(matches) {
        write_grep_match(m, list.reborrow().get(i))?;
    }
    Ok(())
}

pub(crate) fn read_grep_matches(
    list: struct_list::Reader<'_, grep_match::Owned>,
) -> Result<Vec<GrepMatch>> {
    check_len(
        "grep matches",
        "matches",
        list.len() as usize,
        FOUND_ITEMS_MAX,
    )?;
    let mut out = Vec::with_capacity(preallocated(list.len()));
    let mut total = 0usize;
    for reader in list.iter() {
        let m = read_grep_match(reader)?;
        total = total.saturating_add(m.path.len() + m.line.len());
        check_len("grep matches", "bytes", total, FOUND_BYTES_MAX)?;
        out.push(m);
    }
    Ok(out)
}

/// The longest prefix of `items` an answer holds: at most `max_items`, and at most
/// `max_bytes` by `size`. Returns it and whether it holds them all.
pub(crate) fn bounded_prefix<T>(
    items: &[T],
    max_items: usize,
    max_bytes: usize,
    size: impl Fn(&T) -> usize,
) -> (&[T], bool) {
    let mut bytes = 0usize;
    let mut end = 0;
    for item in items.iter().take(max_items) {
        bytes = bytes.saturating_add(size(item));
        if bytes > max_bytes {
            break;
        }
        end += 1;
    }
    (&items[..end], end == items.len())
}

// ---------------------------------------------------------------------------------------
// Lists of calls. Writers take the list's initializer, called once the length is known to
// be within its bound.

pub(crate) fn write_hashes<'a>(
    hashes: &[BlockHash],
    init: impl FnOnce(u32) -> data_list::Builder<'a>,
) -> Result<()> {
    let len = list_len("hash list", "hashes", hashes.len(), HASHES_PER_CALL_MAX)?;
    for hash in hashes {
        check_block_hash("hash", hash)?;
    }
    let mut list = init(len);
    for (i, hash) in (0..len).zip(hashes) {
        list.set(i, &hash.0);
    }
    Ok(())
}

pub(crate) fn read_hashes(list: data_list::Reader<'_>) -> Result<Vec<BlockHash>> {
    check_len(
        "hash list",
        "hashes",
        list.len() as usize,
        HASHES_PER_CALL_MAX,
    )?;
    let mut hashes = Vec::with_capacity(preallocated(list.len()));
    for item in list.iter() {
        let hash = read_hash("hash", item?)?;
        check_block_hash("hash", &hash)?;
        hashes.push(hash);
    }
    Ok(hashes)
}

pub(crate) fn write_bools<'a>(
    values: &[bool],
    init: impl FnOnce(u32) -> primitive_list::Builder<'a, bool>,
) -> Result<()> {
    let len = list_len("have list", "answers", values.len(), HASHES_PER_CALL_MAX)?;
    let mut list = init(len);
    for (i, value) in (0..len).zip(values) {
        list.set(i, *value);
    }
    Ok(())
}

pub(crate) fn read_bools(list: primitive_list::Reader<'_, bool>) -> Result<Vec<bool>> {
    check_len(
        "have list",
        "answers",
        list.len() as usize,
        HASHES_PER_CALL_MAX,
    )?;
    Ok(list.iter().collect())
}

pub(crate) fn write_blocks<'a>(
    blocks: &[StoredBlock],
    init: impl FnOnce(u32) -> struct_list::Builder<'a, block::Owned>,
) -> Result<()> {
    let len = list_len("block list", "blocks", blocks.len(), BLOCKS_PER_CALL_MAX)?;
    let total: usize = blocks.iter().map(|b| b.data.len()).sum();
    check_len(
        "block list",
        "data bytes",
        total,
        BLOCK_DATA_BYTES_PER_CALL_MAX,
    )?;
    let mut list = init(len);
    for (i, block) in (0..len).zip(blocks) {
        write_block(block, list.reborrow().get(i))?;
    }
    Ok(())
}

pub(crate) fn read_blocks(list: struct_list::Reader<'_, block::Owned>) -> Result<Vec<StoredBlock>> {
    check_len(
        "block list",
        "blocks",
        list.len() as usize,
        BLOCKS_PER_CALL_MAX,
    )?;
    let mut blocks = Vec::with_capacity(preallocated(list.len()));
    let mut total = 0usize;
    for item in list.iter() {
        // Counted before the block's bytes are copied.
        let data = item.get_data()?;
        total = total.saturating_add(data.len());
        check_len(
            "block list",
            "data bytes",
            total,
            BLOCK_DATA_BYTES_PER_CALL_MAX,
        )?;
        blocks.push(read_block_with(item, data)?);
    }
    Ok(blocks)
}

pub(crate) fn write_entries<'a>(
    entries: &[ChangeEntry],
    init: impl FnOnce(u32) -> struct_list::Builder<'a, entry::Owned>,
) -> Result<()> {
    let len = list_len("entry list", "entries", entries.len(), ENTRIES_PER_PAGE_MAX)?;
    let mut list = init(len);
    for (i, entry) in (0..len).zip(entries) {
        write_entry(entry, list.reborrow().get(i))?;
    }
    Ok(())
}

pub(crate) fn read_entries(
    list: struct_list::Reader<'_, entry::Owned>,
) -> Result<Vec<ChangeEntry>> {
    check_len(
        "entry list",
        "entries",
        list.len() as usize,
        ENTRIES_PER_PAGE_MAX,
    )?;
    let mut entries = Vec::with_capacity(preallocated(list.len()));
    for item in list.iter() {
        entries.push(read_entry(item)?);
    }
    Ok(entries)
}

pub(crate) fn write_conflicts<'a>(
    conflicts: &[Conflict],
    init: impl FnOnce(u32) -> struct_list::Builder<'a, conflict::Owned>,
) -> Result<()> {
    let len = list_len(
        "conflict list",
        "conflicts",
        conflicts.len(),
        CONFLICTS_PER_CALL_MAX,
    )?;
    let mut list = init(len);
    for (i, conflict) in (0..len).zip(conflicts) {
        write_conflict(conflict, list.reborrow().get(i))?;
    }
    Ok(())
}

pub(crate) fn read_conflicts(
    list: struct_list::Reader<'_, conflict::Owned>,
) -> Result<Vec<Conflict>> {
    check_len(
        "conflict list",
        "conflicts",
        list.len() as usize,
        CONFLICTS_PER_CALL_MAX,
    )?;
    let mut conflicts = Vec::with_capacity(preallocated(list.len()));
    for item in list.iter() {
        conflicts.push(read_conflict(item)?);
    }
    Ok(conflicts)
}

#[cfg(test)]
mod tests;
