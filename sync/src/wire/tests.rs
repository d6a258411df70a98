//! Hostile messages built with the raw builders: every bound and rule of the decoders is
//! refused with a typed error. Round trips and random input are in `sync/tests/wire.rs`.

use super::*;

fn message_bytes(fill: impl FnOnce(&mut Builder<HeapAllocator>)) -> Vec<u8> {
    let mut message = Builder::new_default();
    fill(&mut message);
    serialize(&message)
}

fn entry_bytes(path: &[u8], fill: impl FnOnce(entry::state::Builder<'_>)) -> Vec<u8> {
    message_bytes(|m| {
        let mut entry = m.init_root::<entry::Builder>();
        entry.set_revision(7);
        entry.set_path(path);
        fill(entry.init_state());
    })
}

fn removed_at(path: &[u8]) -> Vec<u8> {
    entry_bytes(path, |mut s| s.set_removed(()))
}

fn file_bytes(perm: u32, size: u64, refs: &[([u8; 32], u32)]) -> Vec<u8> {
    entry_bytes(b"/f", |s| {
        let mut file = s.init_file();
        file.set_perm(perm);
        file.set_size(size);
        let mut list = file.init_blocks(refs.len() as u32);
        for (i, (hash, len)) in refs.iter().enumerate() {
            let mut item = list.reborrow().get(i as u32);
            item.set_hash(hash);
            item.set_len(*len);
        }
    })
}

fn block_bytes(hash: &[u8], codec: u8, raw_len: u32, data: &[u8]) -> Vec<u8> {
    message_bytes(|m| {
        let mut block = m.init_root::<block::Builder>();
        block.set_hash(hash);
        block.set_codec(codec);
        block.set_raw_len(raw_len);
        block.set_data(data);
    })
}

#[track_caller]
fn assert_malformed<T: Wire + std::fmt::Debug>(bytes: &[u8], what: &str, why: &str) {
    match T::from_bytes(bytes) {
        Err(Error::Malformed { what: w, why: y }) if w == what && y.contains(why) => {}
        other => panic!("expected Malformed {{ {what}: {why} }}, got {other:?}"),
    }
}

#[track_caller]
fn assert_too_large<T: Wire + std::fmt::Debug>(bytes: &[u8], what: &str, max: usize) {
    match T::from_bytes(bytes) {
        Err(Error::TooLarge {
            what: w, max: m, ..
        }) if w == what && m == max as u64 => {}
        other => panic!("expected TooLarge {{ {what}, max {max} }}, got {other:?}"),
    }
}

#[track_caller]
fn assert_capnp_error<T: Wire + std::fmt::Debug>(bytes: &[u8]) {
    match T::from_bytes(bytes) {
        Err(Error::Capnp(_)) => {}
        other => panic!("expected a Cap'n Proto error, got {other:?}"),
    }
}

const HASH: [u8; 32] = [0xAB; 32];
const HOLE: [u8; 32] = [0; 32];

#[test]
fn a_well_formed_entry_decodes() {
    let entry = ChangeEntry::from_bytes(&file_bytes(0o644, 10, &[(HASH, 4), (HOLE, 6)])).unwrap();
    assert_eq!(entry.path, b"/f");
    assert_eq!(entry.revision, Revision(7));
}

#[test]
fn hashes_must_be_32_bytes() {
    for len in [0, 1, 31, 33, 64] {
        let hash = vec![7u8; len];
        let bytes = message_bytes(|m| {
            let mut r = m.init_root::<block_ref::Builder>();
            r.set_hash(&hash);
            r.set_len(1);
        });
        assert_malformed::<BlockRef>(&bytes, "block ref hash", "not 32 bytes");
        assert_malformed::<StoredBlock>(&block_bytes(&hash, 0, 0, b""), "block hash", "32");
        let bytes = message_bytes(|m| {
            let mut list = m.initn_root::<data_list::Builder>(2);
            list.set(0, &HASH);
            list.set(1, &hash);
        });
        assert_malformed::<Vec<BlockHash>>(&bytes, "hash", "not 32 bytes");
    }
    // Inside a file's block list too.
    let bytes = entry_bytes(b"/f", |s| {
        let mut file = s.init_file();
        file.set_size(1);
        file.init_blocks(1).get(0).set_hash(&[1; 16]);
    });
    assert_malformed::<ChangeEntry>(&bytes, "block ref hash", "not 32 bytes");
}

#[test]
fn the_all_zero_hash_names_no_block() {
    assert_malformed::<StoredBlock>(&block_bytes(&HOLE, 0, 0, b""), "block hash", "all-zero");
    let bytes = message_bytes(|m| m.initn_root::<data_list::Builder>(1).set(0, &HOLE));
    assert_malformed::<Vec<BlockHash>>(&bytes, "hash", "all-zero");
}

#[test]
fn codecs_must_be_known() {
    for codec in [2u8, 3, 0x7F, 0xFF] {
        assert_malformed::<StoredBlock>(
            &block_bytes(&HASH, codec, 3, b"abc"),
            "block codec",
            "unknown",
        );
    }
    assert!(StoredBlock::from_bytes(&block_bytes(&HASH, 0, 3, b"abc")).is_ok());
    assert!(StoredBlock::from_bytes(&block_bytes(&HASH, 1, 100, b"abc")).is_ok());
}

#[test]
fn block_bounds() {
    let big = vec![0u8; BLOCK_DATA_BYTES_MAX + 1];
    assert_too_large::<StoredBlock>(
        &block_bytes(&HASH, 1, 10, &big),
        "block data",
        BLOCK_DATA_BYTES_MAX,
    );
    assert_too_large::<StoredBlock>(
        &block_bytes(&HASH, 1, CHUNK_BYTES_MAX + 1, b"x"),
        "block",
        CHUNK_BYTES_MAX as usize,
    );
    // A raw block's bytes are its content.
    assert_malformed::<StoredBlock>(&block_bytes(&HASH, 0, 4, b"abc"), "raw block", "rawLen");
    // At the bounds.
    let data = vec![1u8; BLOCK_DATA_BYTES_MAX];
    assert!(StoredBlock::from_bytes(&block_bytes(&HASH, 1, CHUNK_BYTES_MAX, &data)).is_ok());
}

#[test]
fn paths_must_be_absolute_and_canonical() {
    let malformed: &[(&[u8], &str)] = &[
        (b"", "not absolute"),
        (b"a", "not absolute"),
        (b"a/b", "not absolute"),
        (b"/a\0b", "NUL"),
        (b"/\0", "NUL"),
        (b"//", "empty component"),
        (b"/a//b", "empty component"),
        (b"/a/", "empty component"),
        (b"/.", ". or .."),
        (b"/a/../b", ". or .."),
    ];
    for (path, why) in malformed {
        assert_malformed::<ChangeEntry>(&removed_at(path), "entry path", why);
        let bytes = message_bytes(|m| {
            let mut c = m.init_root::<conflict::Builder>();
            c.set_path(path);
            c.set_kept_as(b"/ok");
        });
        assert_malformed::<Conflict>(&bytes, "conflict path", why);
        let bytes = message_bytes(|m| {
            let mut c = m.init_root::<conflict::Builder>();
            c.set_path(b"/ok");
            c.set_kept_as(path);
        });
        assert_malformed::<Conflict>(&bytes, "conflict keptAs", why);
        if !path.is_empty() {
            let bytes = message_bytes(|m| m.init_root::<cursor::Builder>().set_path(path));
            assert_malformed::<Cursor>(&bytes, "cursor path", why);
        }
    }
    for path in [&b"/"[..], b"/a", b"/a/b c/\xff\xfe", b"/.a/..b/..."] {
        assert!(
            ChangeEntry::from_bytes(&removed_at(path)).is_ok(),
            "{path:?}"
        );
    }
    // A cursor may have an empty path (Cursor::START).
    let bytes = message_bytes(|m| m.init_root::<cursor::Builder>().set_revision(3));
    assert_eq!(
        Cursor::from_bytes(&bytes).unwrap(),
        Cursor {
            revision: Revision(3),
            path: Vec::new()
        }
    );
}

#[test]
fn an_entry_base_is_a_cursor() {
    let bytes = message_bytes(|m| {
        let mut entry = m.init_root::<entry::Builder>();
        entry.set_path(b"/x");
        entry.reborrow().init_state().set_removed(());
        let mut base = entry.init_base();
        base.set_revision(5);
        base.set_path(b"/y");
    });
    let entry = ChangeEntry::from_bytes(&bytes).unwrap();
    assert_eq!(
        entry.base,
        Cursor {
            revision: Revision(5),
            path: b"/y".to_vec()
        }
    );
    // Absent: the start.
    assert_eq!(
        ChangeEntry::from_bytes(&removed_at(b"/x")).unwrap().base,
        Cursor::START
    );
    let bytes = message_bytes(|m| {
        let mut entry = m.init_root::<entry::Builder>();
        entry.set_path(b"/x");
        entry.reborrow().init_state().set_removed(());
        entry.init_base().set_path(b"y");
    });
    assert_malformed::<ChangeEntry>(&bytes, "cursor path", "not absolute");
}

#[test]
fn path_bounds() {
    let name = vec![b'n'; NAME_BYTES_MAX];
    let mut path = b"/".to_vec();
    path.extend_from_slice(&name);
    assert!(ChangeEntry::from_bytes(&removed_at(&path)).is_ok());
    path.push(b'n');
    assert_too_large::<ChangeEntry>(&removed_at(&path), "entry path", NAME_BYTES_MAX);

    // Exactly PATH_BYTES_MAX, then one more.
    let mut path = Vec::new();
    while path.len() < PATH_BYTES_MAX {
        path.extend_from_slice(b"/abcdefg");
    }
    path.truncate(PATH_BYTES_MAX);
    assert!(ChangeEntry::from_bytes(&removed_at(&path)).is_ok());
    path.push(b'x');
    assert_too_large::<ChangeEntry>(&removed_at(&path), "entry path", PATH_BYTES_MAX);
    let bytes = message_bytes(|m| m.init_root::<cursor::Builder>().set_path(&path));
    assert_too_large::<Cursor>(&bytes, "cursor path", PATH_BYTES_MAX);
}

#[test]
fn perm_has_no_kind_bits() {
    assert_malformed::<ChangeEntry>(&file_bytes(0o100644, 0, &[]), "file state", "0o7777");
    let bytes = entry_bytes(b"/d", |s| s.init_directory().set_perm(0o40755));
    assert_malformed::<ChangeEntry>(&bytes, "directory state", "0o7777");
    let bytes = entry_bytes(b"/d", |s| s.init_directory().set_perm(0o7777));
    assert!(ChangeEntry::from_bytes(&bytes).is_ok());
}

#[test]
fn symlink_targets() {
    let symlink = |target: &[u8]| entry_bytes(b"/l", |mut s| s.set_symlink(target));
    assert_malformed::<ChangeEntry>(&symlink(b""), "symlink target", "empty");
    assert_malformed::<ChangeEntry>(&symlink(b"a\0b"), "symlink target", "NUL");
    let long = vec![b'x'; SYMLINK_TARGET_BYTES_MAX];
    assert!(ChangeEntry::from_bytes(&symlink(&long)).is_ok());
    let longer = vec![b'x'; SYMLINK_TARGET_BYTES_MAX + 1];
    assert_too_large::<ChangeEntry>(
        &symlink(&longer),
        "symlink target",
        SYMLINK_TARGET_BYTES_MAX,
    );
    // Relative targets, `..` and all, are what symlinks are for.
    assert!(ChangeEntry::from_bytes(&symlink(b"../x//y/")).is_ok());
}

#[test]
fn block_refs_are_bounded() {
    assert_too_large::<ChangeEntry>(
        &file_bytes(0o644, u64::MAX, &[(HASH, CHUNK_BYTES_MAX + 1)]),
        "block ref",
        CHUNK_BYTES_MAX as usize,
    );
    // A hole may be of any length.
    assert!(ChangeEntry::from_bytes(&file_bytes(0o644, u64::MAX, &[(HOLE, u32::MAX)])).is_ok());
    // The list's length is checked before anything is read from it.
    let bytes = entry_bytes(b"/f", |s| {
        s.init_file()
            .init_blocks(BLOCK_REFS_PER_FILE_MAX as u32 + 1);
    });
    assert_too_large::<ChangeEntry>(&bytes, "file block list", BLOCK_REFS_PER_FILE_MAX);
}

#[test]
fn the_largest_file_state_fits_in_a_message() {
    let blocks = vec![
        BlockRef {
            hash: BlockHash(HASH),
            len: CHUNK_BYTES_MAX,
        };
        BLOCK_REFS_PER_FILE_MAX
    ];
    let entry = ChangeEntry {
        revision: Revision(1),
        base: Cursor::START,
        path: b"/big".to_vec(),
        state: EntryState::File {
            perm: 0o600,
            mtime: 0,
            size: u64::from(CHUNK_BYTES_MAX) * BLOCK_REFS_PER_FILE_MAX as u64,
            blocks,
        },
    };
    let bytes = entry.to_bytes().unwrap();
    assert!(bytes.len() <= MESSAGE_BYTES_MAX);
    assert_eq!(ChangeEntry::from_bytes(&bytes).unwrap(), entry);
}

#[test]
fn blocks_must_end_within_the_size() {
    assert_malformed::<ChangeEntry>(
        &file_bytes(0o644, 9, &[(HASH, 4), (HOLE, 6)]),
        "file state",
        "exceed its size",
    );
    // A trailing hole beyond the blocks is fine.
    assert!(ChangeEntry::from_bytes(&file_bytes(0o644, 1 << 40, &[(HASH, 4)])).is_ok());
}

#[test]
fn unknown_state_variants_are_refused() {
    let mut bytes = removed_at(b"/x");
    // Segment table (8 bytes), root pointer (8), then the entry's data section: the
    // union's discriminant is its 7th u16 (generated code: `get_data_field::<u16>(6)`).
    let at = 8 + 8 + 2 * 6;
    assert_eq!(&bytes[at..at + 2], &3u16.to_le_bytes());
    bytes[at..at + 2].copy_from_slice(&4u16.to_le_bytes());
    assert_malformed::<ChangeEntry>(&bytes, "entry state", "unknown variant");
    bytes[at..at + 2].copy_from_slice(&0xFFFFu16.to_le_bytes());
    assert_malformed::<ChangeEntry>(&bytes, "entry state", "unknown variant");
}

#[test]
fn list_bounds() {
    let bytes = message_bytes(|m| {
        m.init_root::<page::Builder>()
            .init_entries(ENTRIES_PER_PAGE_MAX as u32 + 1);
    });
    assert_too_large::<ChangePage>(&bytes, "entry list", ENTRIES_PER_PAGE_MAX);
    let bytes = message_bytes(|m| {
        m.initn_root::<struct_list::Builder<entry::Owned>>(ENTRIES_PER_PAGE_MAX as u32 + 1);
    });
    assert_too_large::<Vec<ChangeEntry>>(&bytes, "entry list", ENTRIES_PER_PAGE_MAX);
    let bytes = message_bytes(|m| {
        m.initn_root::<data_list::Builder>(HASHES_PER_CALL_MAX as u32 + 1);
    });
    assert_too_large::<Vec<BlockHash>>(&bytes, "hash list", HASHES_PER_CALL_MAX);
    let bytes = message_bytes(|m| {
        m.initn_root::<primitive_list::Builder<bool>>(HASHES_PER_CALL_MAX as u32 + 1);
    });
    assert_too_large::<Vec<bool>>(&bytes, "have list", HASHES_PER_CALL_MAX);
    let bytes = message_bytes(|m| {
        m.initn_root::<struct_list::Builder<block::Owned>>(BLOCKS_PER_CALL_MAX as u32 + 1);
    });
    assert_too_large::<Vec<StoredBlock>>(&bytes, "block list", BLOCKS_PER_CALL_MAX);
    let bytes = message_bytes(|m| {
        m.initn_root::<struct_list::Builder<conflict::Owned>>(CONFLICTS_PER_CALL_MAX as u32 + 1);
    });
    assert_too_large::<Vec<Conflict>>(&bytes, "conflict list", CONFLICTS_PER_CALL_MAX);
}

#[test]
fn block_bytes_per_call_are_bounded() {
    let data = vec![0u8; BLOCK_DATA_BYTES_MAX];
    let count = BLOCK_DATA_BYTES_PER_CALL_MAX / BLOCK_DATA_BYTES_MAX + 1;
    let bytes = message_bytes(|m| {
        let mut list = m.initn_root::<struct_list::Builder<block::Owned>>(count as u32);
        for i in 0..count as u32 {
            let mut block = list.reborrow().get(i);
            block.set_hash(&HASH);
            block.set_codec(1);
            block.set_raw_len(CHUNK_BYTES_MAX);
            block.set_data(&data);
        }
    });
    assert_too_large::<Vec<StoredBlock>>(&bytes, "block list", BLOCK_DATA_BYTES_PER_CALL_MAX);
    // One block fewer is exactly the bound.
    let blocks = vec![
        StoredBlock {
            hash: BlockHash(HASH),
            codec: Codec::Zstd,
            raw_len: CHUNK_BYTES_MAX,
            data,
        };
        count - 1
    ];
    let bytes = blocks.to_bytes().unwrap();
    assert_eq!(Vec::<StoredBlock>::from_bytes(&bytes).unwrap(), blocks);
}

#[test]
fn ids_are_bounded_utf8_without_nul() {
    let info = |replica: &[u8], peer: &str| {
        message_bytes(|m| {
            let mut info = m.init_root::<client_info::Builder>();
            info.reborrow()
                .init_replica_id(replica.len() as u32)
                .as_bytes_mut()
                .copy_from_slice(replica);
            info.set_peer(peer);
        })
    };
    assert!(ClientInfo::from_bytes(&info(b"r-1", "p")).is_ok());
    assert_malformed::<ClientInfo>(&info(b"\xff\xfe", ""), "replica id", "UTF-8");
    assert_malformed::<ClientInfo>(&info(b"a\0b", ""), "replica id", "NUL");
    let long = vec![b'r'; ID_BYTES_MAX + 1];
    assert_too_large::<ClientInfo>(&info(&long, ""), "replica id", ID_BYTES_MAX);
    let long = "p".repeat(ID_BYTES_MAX + 1);
    assert_too_large::<ClientInfo>(&info(b"r", &long), "peer", ID_BYTES_MAX);
}

#[test]
fn server_chunk_sizes_must_be_usable() {
    let info = |min: u32, avg: u32, max: u32| {
        message_bytes(|m| {
            let mut info = m.init_root::<server_info::Builder>();
            info.set_workspace_id("w");
            info.set_chunk_min(min);
            info.set_chunk_avg(avg);
            info.set_chunk_max(max);
        })
    };
    let d = ChunkSizes::DEFAULT;
    assert!(ServerInfo::from_bytes(&info(d.min as u32, d.avg as u32, d.max as u32)).is_ok());
    // An empty ServerInfo (zero sizes) would make the chunker panic.
    assert_malformed::<ServerInfo>(&info(0, 0, 0), "chunk sizes", "chunker");
    assert_malformed::<ServerInfo>(
        &info(d.avg as u32, d.min as u32, d.max as u32),
        "chunk sizes",
        "",
    );
    // Valid for the chunker, but larger blocks than the protocol carries.
    assert_too_large::<ServerInfo>(
        &info(64 << 10, 256 << 10, 1 << 20),
        "chunk max",
        CHUNK_BYTES_MAX as usize,
    );
}

#[test]
fn tokens_are_bounded() {
    let token = |len: usize| {
        let mut message = Builder::new_default();
        message
            .set_root::<data::Owned>(&vec![1u8; len][..])
            .unwrap();
        let bytes = serialize(&message);
        let frame = read_message(&bytes).unwrap();
        read_token(frame.root().unwrap())
    };
    assert_eq!(token(TOKEN_BYTES_MAX).unwrap().len(), TOKEN_BYTES_MAX);
    assert!(matches!(
        token(TOKEN_BYTES_MAX + 1),
        Err(Error::TooLarge { what: "token", .. })
    ));
}

#[test]
fn message_framing() {
    let good = removed_at(b"/x");
    assert!(ChangeEntry::from_bytes(&good).is_ok());
    // Nothing may follow the message.
    let mut trailing = good.clone();
    trailing.extend_from_slice(&[0; 8]);
    assert_malformed::<ChangeEntry>(&trailing, "message", "follow");
    // Every truncation fails.
    for len in 0..good.len() {
        assert!(ChangeEntry::from_bytes(&good[..len]).is_err(), "{len}");
    }
    // Segment tables: too many segments, a segment longer than the bytes, a message
    // larger than the traversal limit.
    assert_capnp_error::<ChangeEntry>(&[0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0]);
    let mut long = good.clone();
    long[4..8].copy_from_slice(&1000u32.to_le_bytes());
    assert_capnp_error::<ChangeEntry>(&long);
    let mut huge = vec![0u8; 16];
    huge[4..8].copy_from_slice(&(MESSAGE_WORDS_MAX as u32 + 1).to_le_bytes());
    assert_capnp_error::<ChangeEntry>(&huge);
    let too_many_bytes = vec![0u8; MESSAGE_BYTES_MAX + 1];
    assert_too_large::<ChangeEntry>(&too_many_bytes, "message", MESSAGE_BYTES_MAX);
}

#[test]
fn wrong_pointer_kinds_are_errors() {
    // A list where a struct is expected, and a struct where a list is.
    let list = message_bytes(|m| {
        m.initn_root::<data_list::Builder>(1).set(0, &HASH);
    });
    assert_capnp_error::<ChangeEntry>(&list);
    assert_capnp_error::<ChangePage>(&list);
    let entry = removed_at(b"/x");
    assert_capnp_error::<Vec<ChangeEntry>>(&entry);
    assert_capnp_error::<Vec<BlockHash>>(&entry);
}

#[test]
fn the_traversal_limit_charges_every_read() {
    // What keeps aliasing harmless: a hostile message may point many list elements at one
    // blob, but every read is charged against the traversal limit, so decoding copies at
    // most MESSAGE_WORDS_MAX words whatever the message's size. Here a 12-word limit on an
    // 11-word message: the list (2 words) and one read of its 64-byte blob (8 words) fit,
    // a second read of the same blob does not.
    let mut options = reader_options();
    options.traversal_limit_in_words(Some(12));
    let bytes = message_bytes(|m| {
        m.initn_root::<data_list::Builder>(2).set(0, &[7u8; 64]);
    });
    let mut rest = &bytes[..];
    let reader = capnp::serialize::read_message(&mut rest, options).unwrap();
    let list: data_list::Reader = reader.get_root().unwrap();
    assert!(list.get(0).is_ok());
    assert!(list.get(0).is_err());
}

#[test]
fn writers_refuse_what_readers_refuse() {
    let entry = |path: &[u8], state: EntryState| ChangeEntry {
        revision: Revision(1),
        path: path.to_vec(),
        state,
        base: Cursor::START,
    };
    let bad = [
        entry(b"rel", EntryState::Removed),
        entry(b"/a\0", EntryState::Removed),
        entry(b"/l", EntryState::Symlink { target: Vec::new() }),
        entry(
            b"/d",
            EntryState::Directory {
                perm: 0o40755,
                mtime: 0,
            },
        ),
        entry(
            b"/f",
            EntryState::File {
                perm: 0o644,
                mtime: 0,
                size: 1,
                blocks: vec![BlockRef {
                    hash: BlockHash(HASH),
                    len: 2,
                }],
            },
        ),
        entry(
            b"/f",
            EntryState::File {
                perm: 0o644,
                mtime: 0,
                size: u64::MAX,
                blocks: vec![
                    BlockRef {
                        hash: BlockHash(HOLE),
                        len: 1,
                    };
                    BLOCK_REFS_PER_FILE_MAX + 1
                ],
            },
        ),
    ];
    let mut bad = bad.to_vec();
    let mut relative_base = entry(b"/ok", EntryState::Removed);
    relative_base.base.path = b"rel".to_vec();
    bad.push(relative_base);
    for entry in &bad {
        assert!(entry.to_bytes().is_err(), "{:?}", entry.path);
        assert!(vec![entry.clone()].to_bytes().is_err());
    }
    let block = StoredBlock {
        hash: BlockHash(HASH),
        codec: Codec::Raw,
        raw_len: 4,
        data: b"abc".to_vec(),
    };
    assert!(block.to_bytes().is_err());
    assert!(Cursor {
        revision: Revision(0),
        path: b"x".to_vec()
    }
    .to_bytes()
    .is_err());
    assert!(vec![BlockHash(HOLE)].to_bytes().is_err());
    assert!(vec![true; HASHES_PER_CALL_MAX + 1].to_bytes().is_err());
    let info = ServerInfo {
        version: PROTOCOL_VERSION,
        workspace_id: "w".into(),
        revision: Revision(0),
        chunk_sizes: ChunkSizes {
            min: 0,
            avg: 0,
            max: 0,
        },
        replaced: false,
    };
    assert!(info.to_bytes().is_err());
}
