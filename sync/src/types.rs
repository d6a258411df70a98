//! Domain types of the protocol that the store does not have (the others, entries,
//! blocks, cursors and conflicts, are `computer_vfs`'s).

use computer_vfs::{ChunkSizes, Revision};

/// Who connects (the `client` of `Gate.hello`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientInfo {
    /// Identity of this replica's local state: a replica whose disk was lost and recreated
    /// gets a new one, so changes held by the old one are never taken as synced.
    pub replica_id: String,
    /// The peer this client syncs as (its cursor on the server); empty for plain clients.
    pub peer: String,
}

/// What the server tells a client that passed the gate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerInfo {
    /// The server's protocol version ([`crate::PROTOCOL_VERSION`] on ours).
    pub version: u32,
    pub workspace_id: String,
    /// The server's current revision.
    pub revision: Revision,
    /// The chunk sizes of the server's workspace: a replica must cut blocks the same way.
    pub chunk_sizes: ChunkSizes,
    /// The server knew this peer under another replica id: that replica's cursors were
    /// reset, and whatever it held unpushed is lost to the workspace.
    pub replaced: bool,
}

/// A node as the typed file operations give it: its attributes, and a symlink's target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    pub attr: computer_vfs::Attr,
    /// A symlink's target; `None` for other kinds.
    pub target: Option<Vec<u8>>,
}

/// One entry of a directory listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirItem {
    pub name: Vec<u8>,
    pub node: NodeInfo,
}

/// A page of a directory listing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DirPage {
    pub items: Vec<DirItem>,
    /// Where the next page starts.
    pub next: u64,
    /// Whether this was the last page.
    pub complete: bool,
}

/// Items that may be fewer than there were: a bounded answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bounded<T> {
    pub items: Vec<T>,
    /// False if more matched than the answer holds.
    pub complete: bool,
}

/// What `stats` answers: the workspace's id and its figures.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkspaceStats {
    pub workspace_id: String,
    pub stats: computer_vfs::Stats,
}
