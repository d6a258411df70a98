//! The authoritative side of the protocol, without a transport: what each `Gate` and
//! `Session` call does to the served workspace. The RPC server (`rpc.rs`) and the
//! simulation (`sim/`) both drive these.

use computer_vfs::{Applied, BlockHash, ChangeEntry, ChangePage, Cursor, StoredBlock, Workspace};

use crate::wire::{
    BLOCKS_PER_CALL_MAX, BLOCK_DATA_BYTES_PER_CALL_MAX, ENTRIES_PER_PAGE_MAX, HASHES_PER_CALL_MAX,
    PROTOCOL_VERSION,
};
use crate::{ClientInfo, Error, Result, ServerInfo};

/// Loose blocks (sent ahead of their push) older than this are given up on.
pub const LOOSE_BLOCK_TTL: std::time::Duration = std::time::Duration::from_secs(3600);

/// A served workspace and the secret a client must present.
#[derive(Clone)]
pub struct Authority {
    workspace: Workspace,
    token: Vec<u8>,
}

impl Authority {
    pub fn new(workspace: Workspace, token: impl Into<Vec<u8>>) -> Authority {
        Authority {
            workspace,
            token: token.into(),
        }
    }

    pub fn workspace(&self) -> &Workspace {
        &self.workspace
    }

    /// The gate: checks the version and the token before anything else, then registers
    /// the client's peer (a replica) if it names one.
    pub fn hello(
        &self,
        version: u32,
        token: &[u8],
        client: &ClientInfo,
    ) -> Result<(PeerSession, ServerInfo)> {
        if version != PROTOCOL_VERSION {
            return Err(Error::Refused(format!(
                "protocol version mismatch: the client speaks version {version}, this server \
                 speaks version {PROTOCOL_VERSION}; run the same computerd release on both sides"
            )));
        }
        if !constant_time_eq(token, &self.token) {
            return Err(Error::Refused("wrong or missing token".into()));
        }
        let mut replaced = false;
        let peer = if client.peer.is_empty() {
            None
        } else {
            if client.replica_id.is_empty() {
                return Err(Error::Refused("a peer needs a replica id".into()));
            }
            let (_, reset) = self
                .workspace
                .register_peer(&client.peer, &client.replica_id)?;
            if reset {
                tracing::warn!(
                    peer = %client.peer,
                    replica = %client.replica_id,
                    "peer came back as a new replica: what the old one held unpushed is lost"
                );
            }
            replaced = reset;
            Some(client.peer.clone())
        };
        let info = ServerInfo {
            version: PROTOCOL_VERSION,
            workspace_id: self.workspace.id().to_owned(),
            revision: self.workspace.revision()?,
            chunk_sizes: self.workspace.chunk_sizes(),
            replaced,
        };
        let session = PeerSession {
            workspace: self.workspace.clone(),
            peer,
            replica_id: client.replica_id.clone(),
        };
        Ok((session, info))
    }
}

/// One client's session after the gate.
#[derive(Clone)]
pub struct PeerSession {
    workspace: Workspace,
    /// The peer the client syncs as; `None` for plain clients (`fs --remote`).
    peer: Option<String>,
    replica_id: String,
}

impl PeerSession {
    pub fn workspace(&self) -> &Workspace {
        &self.workspace
    }

    pub fn peer(&self) -> Option<&str> {
        self.peer.as_deref()
    }

    fn require_peer(&self) -> Result<&str> {
        self.peer
            .as_deref()
            .ok_or_else(|| Error::Refused("this call needs a session opened as a peer".into()))
    }

    /// The states changed after `after` that the peer does not have.
    pub fn changes(&self, after: &Cursor, max_entries: u32, max_bytes: u64) -> Result<ChangePage> {
        let peer = self.require_peer()?;
        let entries = (max_entries as usize).clamp(1, ENTRIES_PER_PAGE_MAX);
        Ok(self
            .workspace
            .changes_for(peer, after, entries, max_bytes)?)
    }

    /// Which of `hashes` the workspace stores. Loose blocks past their time are given
    /// up on first: the probe must not promise a push blocks that the same push's
    /// `put_blocks`, which sweeps, would take away before they are used.
    pub fn have_blocks(&self, hashes: &[BlockHash]) -> Result<Vec<bool>> {
        check_count("hashes", hashes.len(), HASHES_PER_CALL_MAX)?;
        self.workspace.sweep_loose_blocks(LOOSE_BLOCK_TTL)?;
        Ok(self.workspace.has_blocks(hashes)?)
    }

    /// Stored blocks for `hashes`, in order, as many as fit one answer: the caller asks
    /// again for the rest. A hash the store lacks (freed since it was listed) ends the
    /// answer there too; the caller learns of it when it asks for that hash alone.
    pub fn get_blocks(&self, hashes: &[BlockHash]) -> Result<Vec<StoredBlock>> {
        check_count("hashes", hashes.len(), HASHES_PER_CALL_MAX)?;
        let mut out = Vec::new();
        let mut bytes = 0usize;
        for hash in hashes.iter().take(BLOCKS_PER_CALL_MAX) {
            let Some(block) = self.workspace.stored_block(hash)? else {
                if out.is_empty() {
                    return Err(Error::Remote(format!("block {hash} is no longer stored")));
                }
                break;
            };
            if !out.is_empty() && bytes + block.data.len() > BLOCK_DATA_BYTES_PER_CALL_MAX {
                break;
            }
            bytes += block.data.len();
            out.push(block);
        }
        Ok(out)
    }

    /// Stores blocks ahead of the push that uses them.
    pub fn put_blocks(&self, blocks: &[StoredBlock]) -> Result<usize> {
        self.require_peer()?;
        check_count("blocks", blocks.len(), BLOCKS_PER_CALL_MAX)?;
        verify_all(blocks)?;
        self.workspace.sweep_loose_blocks(LOOSE_BLOCK_TTL)?;
        Ok(self.workspace.put_blocks(blocks)?)
    }

    /// Applies a batch of the peer's changes atomically with its cursor.
    pub fn push(
        &self,
        entries: &[ChangeEntry],
        blocks: &[StoredBlock],
        through: &Cursor,
    ) -> Result<Applied> {
        let peer = self.require_peer()?;
        check_count("entries", entries.len(), ENTRIES_PER_PAGE_MAX)?;
        check_count("blocks", blocks.len(), BLOCKS_PER_CALL_MAX)?;
        verify_all(blocks)?;
        match self
            .workspace
            .apply_push(peer, &self.replica_id, entries, blocks, through)
        {
            Err(computer_vfs::Error::StaleReplica(_)) => Err(Error::Replaced {
                peer: peer.to_owned(),
                replica_id: self.replica_id.clone(),
            }),
            other => Ok(other?),
        }
    }

    /// The peer applied our changes through `cursor`; returns the record.
    pub fn ack(&self, cursor: &Cursor) -> Result<Cursor> {
        let peer = self.require_peer()?;
        match self
            .workspace
            .mark_delivered(peer, &self.replica_id, cursor)
        {
            Err(computer_vfs::Error::StaleReplica(_)) => Err(Error::Replaced {
                peer: peer.to_owned(),
                replica_id: self.replica_id.clone(),
            }),
            other => Ok(other?),
        }
    }
}

/// Refuses blocks whose bytes do not decode to their hash: the peer's fault, said as
/// such (the store checks again, but its error could not tell a peer's bad block from
/// damage of its own).
fn verify_all(blocks: &[StoredBlock]) -> Result<()> {
    for block in blocks {
        if block.verify().is_err() {
            return Err(Error::malformed(
                "block",
                "its bytes do not match its hash (or do not decode)",
            ));
        }
    }
    Ok(())
}

fn check_count(what: &'static str, len: usize, max: usize) -> Result<()> {
    if len > max {
        return Err(Error::TooLarge {
            what,
            unit: "items",
            len: len as u64,
            max: max as u64,
        });
    }
    Ok(())
}

/// Compares secrets in time that does not depend on where they differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// In process, a session is its own upstream: a replica syncs with no transport between.
impl crate::Upstream for PeerSession {
    async fn changes(
        &self,
        after: &Cursor,
        max_entries: u32,
        max_bytes: u64,
    ) -> Result<ChangePage> {
        PeerSession::changes(self, after, max_entries, max_bytes)
    }
    async fn have_blocks(&self, hashes: &[BlockHash]) -> Result<Vec<bool>> {
        PeerSession::have_blocks(self, hashes)
    }
    async fn get_blocks(&self, hashes: &[BlockHash]) -> Result<Vec<StoredBlock>> {
        PeerSession::get_blocks(self, hashes)
    }
    async fn put_blocks(&self, blocks: &[StoredBlock]) -> Result<usize> {
        PeerSession::put_blocks(self, blocks)
    }
    async fn push(
        &self,
        entries: &[ChangeEntry],
        blocks: &[StoredBlock],
        through: &Cursor,
    ) -> Result<Applied> {
        PeerSession::push(self, entries, blocks, through)
    }
    async fn ack(&self, cursor: &Cursor) -> Result<Cursor> {
        PeerSession::ack(self, cursor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret!"));
        assert!(!constant_time_eq(b"", b"x"));
    }
}
