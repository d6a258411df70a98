//! `computer-vfs`: the workspace store.
//!
//! A workspace is a POSIX-like tree of files, directories and symlinks kept in one SQLite
//! database. File content is cut into content-defined blocks, keyed by their BLAKE3 hash,
//! compressed with zstd and stored once however many files use them. Every committed
//! mutation takes the next revision of a change log, so a replica can ask for everything
//! after revision R.
//!
//! Two APIs over one [`Workspace`]:
//! - the inode API ([`Workspace`] methods: `lookup`, `getattr`, `open`, `write`, ...),
//!   shaped like the kernel's FUSE requests, for `computerd`;
//! - the path API ([`Fs`]: `read_file`, `write_file`, `mkdir`, `rm`, `glob`, `grep`, ...),
//!   shaped like Node's `fs`, for tools and execution backends.
//!
//! This crate knows nothing of FUSE, RPC or processes. docs/ARCHITECTURE.md has the map,
//! docs/STORAGE.md the tables and the block format.

mod access;
mod audit;
mod base;
pub mod block;
mod block_store;
mod change_page;
mod changes;
mod check;
mod chunker;
pub mod clock;
mod compact;
mod content;
mod db;
mod error;
mod fs;
mod gate;
mod ingest;
mod log;
mod loose_blocks;
mod open_files;
mod peer_rows;
mod peers;
mod resolve;
mod search;
mod staged;
mod staged_rows;
mod staging;
mod store;
pub mod transfer;
mod tree;
mod types;
mod workspace;

pub use access::{
    permits, Access, CallerInfo, Capability, Credentials, KnownCaller, Who, S_ISGID, S_ISUID,
    S_ISVTX,
};
pub use audit::{AuditRecord, AUDIT_BODY_BYTES_MAX, AUDIT_RECORDS_MAX};
pub use base::real_path;
pub use block::{BlockHash, Codec, HASH_LEN};
pub use changes::{
    cursor_at_or_after, file_blocks, order_key, BlockRef, ChangeEntry, ChangePage, Cursor,
    EntryState, StoredBlock,
};
pub use check::{CheckProgress, CheckReport, Problem, CHECK_PROBLEMS_LISTED_MAX};
pub use chunker::{ChunkSizes, Chunker};
pub use compact::{CompactProgress, CompactReport};
pub use db::SCHEMA_VERSION;
pub use error::{Error, ErrorPath, Result};
pub use fs::{join, FileReader, FileWriter, Fs, MkdirOptions, Replacement, RmOptions};
pub use gate::{Backlog, WriteGate};
pub use ingest::IngestOutcome;
pub use open_files::{FileHandle, OpenFlags};
pub use peer_rows::PeerState;
pub use peers::{Applied, Conflict};
pub use resolve::{Symlinks, SYMLINKS_MAX};
pub use search::{GrepMatch, GrepOptions};
pub use staged::Opened;
pub use staging::StagedFile;
pub use store::{check_name, LINK_MAX, NAME_MAX, PATH_MAX, SYMLINK_MAX};
pub use types::*;
pub use workspace::{
    Options, Workspace, DISK_RESERVE_BYTES_DEFAULT, FILE_SIZE_MAX_DEFAULT, XATTR_NAME_MAX,
    XATTR_VALUE_MAX,
};
