//! Helpers shared by the store's integration tests.

use computer_vfs::{file_blocks, ChangeEntry, Conflict, Error, Options, StoredBlock, Workspace};

/// Set to 1 to let the tests that need root skip (each says so) where they run without
/// it. Unset, such a test fails instead: a suite that should run as root (CI does) must
/// not pass without checking anything.
pub const WITHOUT_ROOT_ENV: &str = "COMPUTER_TESTS_WITHOUT_ROOT";

/// Whether the test `what` (which needs root for `why`) runs: true as root; without
/// root it panics, or with [`WITHOUT_ROOT_ENV`] set says it is skipped and returns false.
#[allow(dead_code)] // Not every test binary that shares this module needs root.
pub fn has_root(what: &str, why: &str) -> bool {
    // SAFETY: no arguments, no memory.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    if std::env::var_os(WITHOUT_ROOT_ENV).is_some_and(|v| v == "1") {
        eprintln!("{what}: skipped: needs root ({why})");
        return false;
    }
    panic!("{what} needs root ({why}): run as root, or set {WITHOUT_ROOT_ENV}=1 to skip it");
}

/// `n` bytes no block store can shrink or share (xorshift64), different for each
/// `seed`: the one source of random content for these tests.
#[allow(dead_code)] // Not every test binary that shares this module writes content.
pub fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(n);
    out
}

/// The stored blocks `entries` need that `to` lacks, read from `from`.
#[allow(dead_code)] // Only the replication tests sync.
pub fn missing_blocks(
    from: &Workspace,
    to: &Workspace,
    entries: &[ChangeEntry],
) -> Vec<StoredBlock> {
    let wanted = file_blocks(entries);
    let have = to.has_blocks(&wanted).unwrap();
    wanted
        .iter()
        .zip(have)
        .filter(|(_, h)| !h)
        // A block freed by a change since the page was read is left out: the apply
        // then fails, and the round reads a fresh page.
        .filter_map(|(h, _)| from.stored_block(h).unwrap())
        .collect()
}

/// The replica applies the server's changes (`peer` and `replica_id`: the replica's
/// names on the server), page by page until it has them all.
#[allow(dead_code)] // Only the replication tests sync.
pub fn pull(
    server: &Workspace,
    replica: &Workspace,
    peer: &str,
    replica_id: &str,
) -> Vec<Conflict> {
    let mut conflicts = Vec::new();
    loop {
        let from = replica.peer("upstream").unwrap().unwrap().applied;
        let page = server.changes_for(peer, &from, 5, 1 << 20).unwrap();
        let blocks = missing_blocks(server, replica, &page.entries);
        let applied =
            match replica.apply_pull("upstream", server.id(), &page.entries, &blocks, &page.next) {
                Ok(applied) => applied,
                // Local writes kept landing: a real replica retries later, so do we.
                Err(Error::Busy(_)) => continue,
                // A local write freed a block of the page between the probe and the
                // apply (only the racing test writes during a round): probe again, as
                // `Replica::pull` does.
                Err(Error::Corrupt { .. }) => continue,
                Err(e) => panic!("{e}"),
            };
        conflicts.extend(applied.conflicts);
        server
            .mark_delivered(peer, replica_id, &applied.through)
            .unwrap();
        if page.complete {
            break;
        }
    }
    conflicts
}

/// A workspace at `dir/ws.db` with its staging files in `dir/ws.db.staging`, as a mount
/// with passthrough has it.
#[allow(dead_code)] // Not every test binary that shares this module stages files.
pub fn staging_workspace(dir: &std::path::Path) -> Workspace {
    let options = Options {
        staging_dir: Some(dir.join("ws.db.staging")),
        ..Options::default()
    };
    Workspace::open(dir.join("ws.db"), options).unwrap()
}
