//! Arbitrary bytes as protocol messages: the message reader, then every decoder of
//! `computer_sync::wire`. Each must return `Ok` or `Err`, never panic, hang or allocate
//! beyond its bounds; a value that decodes must encode again to a message that decodes to
//! the same value.

#![no_main]

use computer_sync::wire::{self, Wire};
use computer_sync::{ClientInfo, DirItem, NodeInfo, ServerInfo, WorkspaceStats};
use computer_vfs::{
    BlockHash, BlockRef, ChangeEntry, ChangePage, CheckReport, CompactReport, Conflict, Cursor,
    GrepMatch, StoredBlock,
};
use libfuzzer_sys::fuzz_target;

/// Decodes `data` as a `T` (a fresh frame each time: decoding charges the frame's
/// traversal budget); whatever decodes must survive a round trip.
fn check<T: Wire + PartialEq + std::fmt::Debug>(data: &[u8]) {
    let Ok(frame) = wire::read_message(data) else {
        return;
    };
    let Ok(value) = frame.decode::<T>() else {
        return;
    };
    let bytes = value.to_bytes().expect("a decoded value encodes again");
    let again = T::from_bytes(&bytes).expect("a re-encoded value decodes");
    assert_eq!(again, value);
}

fuzz_target!(|data: &[u8]| {
    check::<Cursor>(data);
    check::<BlockRef>(data);
    check::<ChangeEntry>(data);
    check::<StoredBlock>(data);
    check::<ChangePage>(data);
    check::<ClientInfo>(data);
    check::<ServerInfo>(data);
    check::<Conflict>(data);
    check::<Vec<BlockHash>>(data);
    check::<Vec<bool>>(data);
    check::<Vec<StoredBlock>>(data);
    check::<Vec<ChangeEntry>>(data);
    check::<Vec<Conflict>>(data);
    check::<NodeInfo>(data);
    check::<DirItem>(data);
    check::<GrepMatch>(data);
    check::<Vec<DirItem>>(data);
    check::<Vec<GrepMatch>>(data);
    check::<WorkspaceStats>(data);
    check::<CheckReport>(data);
    check::<CompactReport>(data);
    // A file stream's path: what decodes is the same bytes, as a path.
    if let Ok(path) = wire::file_path(data) {
        assert_eq!(path.as_bytes(), data);
        assert!(path.starts_with('/') && !path.contains('\0'));
    }
});
