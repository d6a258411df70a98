//! The change log's values: cursors, the state of a path, pages of such states, and
//! blocks as they travel between workspaces. Plain data with its order; reading the log
//! is `log.rs`'s, applying it `changes.rs`'s.

use crate::block::{self, BlockHash, Codec};
use crate::error::Result;
use crate::types::{Revision, TimestampNs};

/// A position in a workspace's change log: everything up to revision `revision`, and
/// within that revision every path up to `path`, has been seen. Within a revision,
/// paths are in post-order (children before their directory, see [`order_key`]): a
/// directory's own state (its mtime) is applied after the changes inside it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Cursor {
    pub revision: Revision,
    pub path: Vec<u8>,
}

impl Cursor {
    /// Before everything.
    pub const START: Cursor = Cursor {
        revision: Revision(0),
        path: Vec::new(),
    };

    /// The cursor just after `entry`.
    pub fn after(entry: &ChangeEntry) -> Cursor {
        Cursor {
            revision: entry.revision,
            path: entry.path.clone(),
        }
    }
}

/// One block of a file's content, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockRef {
    pub hash: BlockHash,
    pub len: u32,
}

impl BlockRef {
    /// The hash that marks a hole of `len` bytes: all zeros, which no block has.
    pub const HOLE: BlockHash = BlockHash([0; 32]);

    /// Whether this marks a hole of `len` bytes.
    pub fn is_hole(&self) -> bool {
        self.hash == Self::HOLE
    }
}

/// The distinct blocks the file states of `entries` name (holes aside), in the order
/// they first appear: what a receiver of the entries must have.
pub fn file_blocks(entries: &[ChangeEntry]) -> Vec<BlockHash> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for entry in entries {
        if let EntryState::File { blocks, .. } = &entry.state {
            for block in blocks {
                if !block.is_hole() && seen.insert(block.hash) {
                    out.push(block.hash);
                }
            }
        }
    }
    out
}

/// The state of one path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryState {
    File {
        perm: u32,
        mtime: TimestampNs,
        size: u64,
        blocks: Vec<BlockRef>,
    },
    Directory {
        perm: u32,
        mtime: TimestampNs,
    },
    Symlink {
        target: Vec<u8>,
    },
    /// Nothing is at this path, nor below it.
    Removed,
}

/// The state of one path as of `revision`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangeEntry {
    pub revision: Revision,
    /// Absolute path, `/` first.
    pub path: Vec<u8>,
    pub state: EntryState,
    /// How far the sender had applied the receiver's changes when it made this one (the
    /// receiver's cursor): what the change was made *against*. Anything the receiver
    /// changed after it is news to the sender and must not be overwritten unseen.
    /// [`Cursor::START`] (assume nothing was seen) outside replication with a peer.
    pub base: Cursor,
}

impl ChangeEntry {
    /// Bytes this entry stands for (what a page budget counts): a file's size.
    pub fn weight(&self) -> u64 {
        match &self.state {
            EntryState::File { size, .. } => *size,
            _ => 0,
        }
    }
}

/// A page of changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangePage {
    pub entries: Vec<ChangeEntry>,
    /// Where the next page starts.
    pub next: Cursor,
    /// Whether this page reaches the current end of the log.
    pub complete: bool,
    /// The revision the page was read at.
    pub revision: Revision,
}

/// A block as stored: what travels between workspaces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredBlock {
    pub hash: BlockHash,
    pub codec: Codec,
    pub raw_len: u32,
    pub data: Vec<u8>,
}

impl StoredBlock {
    /// Checks that the bytes decode to content with this hash and length.
    pub fn verify(&self) -> Result<()> {
        let mut out = Vec::new();
        block::decode_into(
            &self.hash,
            self.codec,
            self.raw_len as usize,
            &self.data,
            &mut out,
        )
    }
}

/// The order of paths within a revision: byte order with a 0xFF byte appended, which puts
/// `/a/x` (`/a/x\xff`) before `/a` (`/a\xff`), since `/` < 0xFF. Distinct paths give
/// distinct keys.
pub fn order_key(path: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(path.len() + 1);
    key.extend_from_slice(path);
    key.push(0xFF);
    key
}

/// Whether `cursor` is at or past `other` in the change log's order.
pub fn cursor_at_or_after(cursor: &Cursor, other: &Cursor) -> bool {
    (cursor.revision, order_key(&cursor.path)) >= (other.revision, order_key(&other.path))
}
