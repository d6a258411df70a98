//! Round trips of every wire type through a message, and decoding of arbitrary bytes:
//! always an `Err` or a value, never a panic. Bound violations built by hand are in
//! `src/wire/tests.rs`.

use computer_sync::wire::{self, Wire, CHUNK_BYTES_MAX, ENTRIES_PER_PAGE_MAX};
use computer_sync::{ClientInfo, DirItem, NodeInfo, ServerInfo, WorkspaceStats, PROTOCOL_VERSION};
use computer_vfs::{
    Attr, BlockHash, BlockRef, ChangeEntry, ChangePage, CheckReport, ChunkSizes, Codec,
    CompactReport, Conflict, Cursor, EntryState, FileKind, GrepMatch, InodeNo, Problem, Revision,
    Stats, StoredBlock,
};
use proptest::prelude::*;

#[track_caller]
fn round_trip<T: Wire + PartialEq + std::fmt::Debug>(value: &T) {
    let bytes = value.to_bytes().expect("encodes");
    assert_eq!(bytes.len() % 8, 0);
    let back = T::from_bytes(&bytes).expect("decodes");
    assert_eq!(&back, value);
    // And through an explicit frame.
    assert_eq!(
        &wire::read_message(&bytes).unwrap().decode::<T>().unwrap(),
        value
    );
}

fn hash(byte: u8) -> BlockHash {
    BlockHash([byte; 32])
}

fn entry(path: &str, state: EntryState) -> ChangeEntry {
    ChangeEntry {
        revision: Revision(42),
        path: path.as_bytes().to_vec(),
        state,
        base: Cursor {
            revision: Revision(17),
            path: b"/elsewhere".to_vec(),
        },
    }
}

fn all_states() -> Vec<ChangeEntry> {
    vec![
        entry(
            "/src/main.rs",
            EntryState::File {
                perm: 0o644,
                mtime: 1_700_000_000_123_456_789,
                size: 500_000,
                blocks: vec![
                    BlockRef {
                        hash: hash(1),
                        len: 100_000,
                    },
                    BlockRef {
                        hash: BlockHash([0; 32]),
                        len: 50_000,
                    },
                    BlockRef {
                        hash: hash(2),
                        len: CHUNK_BYTES_MAX,
                    },
                ],
            },
        ),
        entry(
            "/empty",
            EntryState::File {
                perm: 0,
                mtime: -1,
                size: 0,
                blocks: Vec::new(),
            },
        ),
        entry(
            "/",
            EntryState::Directory {
                perm: 0o755,
                mtime: i64::MIN,
            },
        ),
        entry(
            "/src",
            EntryState::Directory {
                perm: 0o7777,
                mtime: i64::MAX,
            },
        ),
        entry(
            "/link",
            EntryState::Symlink {
                target: b"../elsewhere/\xff".to_vec(),
            },
        ),
        entry("/gone/deep", EntryState::Removed),
    ]
}

#[test]
fn cursors() {
    round_trip(&Cursor::START);
    round_trip(&Cursor {
        revision: Revision(u64::MAX),
        path: b"/a/b".to_vec(),
    });
    round_trip(&Cursor::after(&all_states()[0]));
}

#[test]
fn block_refs() {
    round_trip(&BlockRef {
        hash: hash(9),
        len: 1,
    });
    round_trip(&BlockRef {
        hash: BlockHash([0; 32]),
        len: u32::MAX,
    });
}

#[test]
fn entries_in_every_state() {
    for entry in all_states() {
        round_trip(&entry);
    }
    round_trip(&all_states());
    round_trip(&Vec::<ChangeEntry>::new());
}

#[test]
fn stored_blocks() {
    let raw = b"hello world".to_vec();
    let blocks = vec![
        StoredBlock {
            hash: BlockHash::of(&raw),
            codec: Codec::Raw,
            raw_len: raw.len() as u32,
            data: raw,
        },
        StoredBlock {
            hash: hash(3),
            codec: Codec::Zstd,
            raw_len: CHUNK_BYTES_MAX,
            data: vec![0x28, 0xb5, 0x2f, 0xfd, 1, 2, 3],
        },
        StoredBlock {
            hash: hash(4),
            codec: Codec::Raw,
            raw_len: 0,
            data: Vec::new(),
        },
    ];
    for block in &blocks {
        round_trip(block);
    }
    round_trip(&blocks);
}

#[test]
fn pages() {
    let entries = all_states();
    round_trip(&ChangePage {
        next: Cursor::after(entries.last().unwrap()),
        entries,
        complete: false,
        revision: Revision(43),
    });
    round_trip(&ChangePage {
        entries: Vec::new(),
        next: Cursor::START,
        complete: true,
        revision: Revision(0),
    });
    // A full page.
    let entries: Vec<ChangeEntry> = (0..ENTRIES_PER_PAGE_MAX)
        .map(|i| entry(&format!("/d/{i}"), EntryState::Removed))
        .collect();
    round_trip(&ChangePage {
        next: Cursor::after(entries.last().unwrap()),
        entries,
        complete: true,
        revision: Revision(7),
    });
}

#[test]
fn hello_types() {
    round_trip(&ClientInfo {
        replica_id: "5f0c2a7e-replica".into(),
        peer: "laptop".into(),
    });
    round_trip(&ClientInfo::default());
    round_trip(&ServerInfo {
        version: PROTOCOL_VERSION,
        workspace_id: "ws-1".into(),
        revision: Revision(12),
        chunk_sizes: ChunkSizes::DEFAULT,
        replaced: false,
    });
    round_trip(&ServerInfo {
        version: u32::MAX,
        workspace_id: String::new(),
        revision: Revision(0),
        chunk_sizes: ChunkSizes {
            min: 2 << 10,
            avg: 8 << 10,
            max: 32 << 10,
        },
        replaced: true,
    });
}

#[test]
fn conflicts_and_call_lists() {
    let conflict = Conflict {
        path: b"/notes.txt".to_vec(),
        kept_as: b"/notes (conflict laptop 2025-01-01).txt".to_vec(),
    };
    round_trip(&conflict);
    round_trip(&vec![conflict.clone(), conflict]);
    round_trip(&vec![hash(1), hash(2), BlockHash::of(b"x")]);
    round_trip(&Vec::<BlockHash>::new());
    round_trip(&vec![true, false, true, true]);
    round_trip(&Vec::<bool>::new());
}

fn node(kind: FileKind, target: Option<&[u8]>) -> NodeInfo {
    NodeInfo {
        attr: Attr {
            ino: InodeNo(7),
            kind,
            perm: 0o4755,
            uid: 1000,
            gid: 100,
            nlink: 2,
            size: 12345,
            atime: -5,
            mtime: 1_700_000_000_000_000_001,
            ctime: 1_700_000_000_000_000_002,
            rdev: 0x0801,
            revision: Revision(99),
        },
        target: target.map(<[u8]>::to_vec),
    }
}

#[test]
fn typed_file_answers() {
    for kind in [
        FileKind::File,
        FileKind::Directory,
        FileKind::Fifo,
        FileKind::Socket,
        FileKind::CharDevice,
        FileKind::BlockDevice,
    ] {
        round_trip(&node(kind, None));
    }
    let link = node(FileKind::Symlink, Some(b"../t\xff"));
    round_trip(&link);
    let item = DirItem {
        name: b"n\xffame".to_vec(),
        node: link,
    };
    round_trip(&item);
    round_trip(&vec![item.clone(), item]);
    let found = GrepMatch {
        path: "/a/b.txt".into(),
        line_number: 3,
        line: "a needle here".into(),
    };
    round_trip(&found);
    round_trip(&vec![found]);
    // What breaks a rule is refused by the encoder.
    assert!(node(FileKind::Symlink, None).to_bytes().is_err());
    assert!(node(FileKind::File, Some(b"t")).to_bytes().is_err());
    for bad in [&b""[..], b".", b"..", b"a/b", b"a\0b"] {
        let item = DirItem {
            name: bad.to_vec(),
            node: node(FileKind::File, None),
        };
        assert!(item.to_bytes().is_err(), "{bad:?}");
    }
    let relative = GrepMatch {
        path: "a".into(),
        line_number: 1,
        line: String::new(),
    };
    assert!(relative.to_bytes().is_err());
}

fn workspace_stats() -> WorkspaceStats {
    WorkspaceStats {
        workspace_id: "workspace".into(),
        stats: Stats {
            files: 3,
            directories: 2,
            symlinks: 1,
            other_nodes: 0,
            logical_bytes: 3 << 20,
            unique_bytes: 1 << 20,
            stored_bytes: 1 << 19,
            blocks: 16,
            database_bytes: 2 << 20,
            free_bytes: 4096,
            staged_files: 1,
            revision: Revision(77),
        },
    }
}

fn check_report() -> CheckReport {
    CheckReport {
        problems: vec![Problem("block 3: refcount 2, used 1".into())],
        problems_unlisted: 5,
        nodes: 7,
        blocks: 16,
        block_bytes: 1 << 20,
    }
}

#[test]
fn workspace_answers() {
    round_trip(&workspace_stats());
    round_trip(&check_report());
    round_trip(&CheckReport::default());
    round_trip(&CompactReport {
        bytes_before: 1 << 30,
        bytes_after: 110_592,
        rewrote: true,
    });
    // More problems than an answer lists are refused; a long line is cut, not refused.
    let mut many = check_report();
    many.problems = vec![Problem("p".into()); wire::CHECK_PROBLEMS_MAX + 1];
    assert!(many.to_bytes().is_err());
    let mut long = check_report();
    long.problems = vec![Problem("é".repeat(wire::CHECK_PROBLEM_BYTES_MAX))];
    let cut = CheckReport::from_bytes(&long.to_bytes().unwrap()).unwrap();
    let line = &cut.problems[0].0;
    assert!(
        line.len() <= wire::CHECK_PROBLEM_BYTES_MAX
            && line.len() + 2 > wire::CHECK_PROBLEM_BYTES_MAX
    );
    let mut nul = workspace_stats();
    nul.workspace_id = "a\0b".into();
    assert!(nul.to_bytes().is_err());
}

/// A deterministic stream of pseudo-random bytes (xorshift64*).
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            (state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
        })
        .collect()
}

/// Decodes `bytes` as every wire type; returns how many decoded.
fn decode_all(bytes: &[u8]) -> usize {
    let results = [
        Cursor::from_bytes(bytes).is_ok(),
        BlockRef::from_bytes(bytes).is_ok(),
        ChangeEntry::from_bytes(bytes).is_ok(),
        StoredBlock::from_bytes(bytes).is_ok(),
        ChangePage::from_bytes(bytes).is_ok(),
        ClientInfo::from_bytes(bytes).is_ok(),
        ServerInfo::from_bytes(bytes).is_ok(),
        Conflict::from_bytes(bytes).is_ok(),
        Vec::<BlockHash>::from_bytes(bytes).is_ok(),
        Vec::<bool>::from_bytes(bytes).is_ok(),
        Vec::<StoredBlock>::from_bytes(bytes).is_ok(),
        Vec::<ChangeEntry>::from_bytes(bytes).is_ok(),
        Vec::<Conflict>::from_bytes(bytes).is_ok(),
        NodeInfo::from_bytes(bytes).is_ok(),
        DirItem::from_bytes(bytes).is_ok(),
        GrepMatch::from_bytes(bytes).is_ok(),
        Vec::<DirItem>::from_bytes(bytes).is_ok(),
        Vec::<GrepMatch>::from_bytes(bytes).is_ok(),
        WorkspaceStats::from_bytes(bytes).is_ok(),
        CheckReport::from_bytes(bytes).is_ok(),
        CompactReport::from_bytes(bytes).is_ok(),
    ];
    results.iter().filter(|ok| **ok).count()
}

#[test]
fn random_bytes_are_refused() {
    for seed in 0..2000 {
        let bytes = noise(seed, (seed as usize * 7) % 700);
        assert_eq!(decode_all(&bytes), 0, "seed {seed}");
    }
}

#[test]
fn mutated_messages_never_panic() {
    // Every single-byte change of a real page: some still decode (a changed mtime), none
    // panics.
    let page = ChangePage {
        next: Cursor::after(all_states().last().unwrap()),
        entries: all_states(),
        complete: true,
        revision: Revision(50),
    };
    let bytes = page.to_bytes().unwrap();
    for at in 0..bytes.len() {
        for value in [0x00, 0x01, 0x7F, 0x80, 0xFF] {
            let mut mutated = bytes.clone();
            mutated[at] = value;
            decode_all(&mutated);
        }
    }
    for len in 0..bytes.len() {
        assert_eq!(decode_all(&bytes[..len]), 0, "truncated to {len}");
    }
}

// ---------------------------------------------------------------------------------------
// Property tests.

fn name() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        any::<u8>().prop_filter("no / or NUL", |b| *b != b'/' && *b != 0),
        1..12,
    )
    .prop_filter("not . or ..", |n| n != b"." && n != b"..")
}

fn path() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        1 => Just(b"/".to_vec()),
        9 => prop::collection::vec(name(), 1..6).prop_map(|names| {
            let mut path = Vec::new();
            for name in names {
                path.push(b'/');
                path.extend(name);
            }
            path
        }),
    ]
}

fn block_ref() -> impl Strategy<Value = BlockRef> {
    prop_oneof![
        4 => (any::<[u8; 32]>(), 0..=CHUNK_BYTES_MAX)
            .prop_filter("not the hole hash", |(h, _)| *h != [0; 32])
            .prop_map(|(h, len)| BlockRef { hash: BlockHash(h), len }),
        1 => any::<u32>().prop_map(|len| BlockRef { hash: BlockHash([0; 32]), len }),
    ]
}

fn state() -> impl Strategy<Value = EntryState> {
    prop_oneof![
        (
            0..=0o7777u32,
            any::<i64>(),
            prop::collection::vec(block_ref(), 0..24),
            0..(1u64 << 40)
        )
            .prop_map(|(perm, mtime, blocks, tail)| {
                let covered: u64 = blocks.iter().map(|b| u64::from(b.len)).sum();
                EntryState::File {
                    perm,
                    mtime,
                    size: covered + tail,
                    blocks,
                }
            }),
        (0..=0o7777u32, any::<i64>())
            .prop_map(|(perm, mtime)| EntryState::Directory { perm, mtime }),
        prop::collection::vec(1u8..=255, 1..64).prop_map(|target| EntryState::Symlink { target }),
        Just(EntryState::Removed),
    ]
}

fn cursor() -> impl Strategy<Value = Cursor> {
    (any::<u64>(), prop_oneof![Just(Vec::new()), path()]).prop_map(|(revision, path)| Cursor {
        revision: Revision(revision),
        path,
    })
}

fn change_entry() -> impl Strategy<Value = ChangeEntry> {
    (any::<u64>(), path(), state(), cursor()).prop_map(|(revision, path, state, base)| {
        ChangeEntry {
            revision: Revision(revision),
            path,
            state,
            base,
        }
    })
}

fn stored_block() -> impl Strategy<Value = StoredBlock> {
    (
        any::<[u8; 32]>().prop_filter("not the hole hash", |h| *h != [0; 32]),
        prop::collection::vec(any::<u8>(), 0..256),
        any::<bool>(),
        0..=CHUNK_BYTES_MAX,
    )
        .prop_map(|(hash, data, zstd, raw_len)| StoredBlock {
            hash: BlockHash(hash),
            codec: if zstd { Codec::Zstd } else { Codec::Raw },
            raw_len: if zstd { raw_len } else { data.len() as u32 },
            data,
        })
}

proptest! {
    #[test]
    fn entries_round_trip(entry in change_entry()) {
        round_trip(&entry);
    }

    #[test]
    fn pages_round_trip(
        entries in prop::collection::vec(change_entry(), 0..16),
        next in cursor(),
        complete in any::<bool>(),
        revision in any::<u64>(),
    ) {
        round_trip(&ChangePage { entries, next, complete, revision: Revision(revision) });
    }

    #[test]
    fn blocks_round_trip(blocks in prop::collection::vec(stored_block(), 0..8)) {
        round_trip(&blocks);
    }

    #[test]
    fn cursors_and_conflicts_round_trip(cursor in cursor(), path in path(), kept_as in path()) {
        round_trip(&cursor);
        round_trip(&Conflict { path, kept_as });
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        decode_all(&bytes);
    }

    /// Random segments behind a valid one-segment table: the pointers are random, the
    /// framing is not, so this reaches the decoders.
    #[test]
    fn arbitrary_segments_never_panic(words in prop::collection::vec(any::<u64>(), 0..96)) {
        let mut bytes = Vec::with_capacity(8 + words.len() * 8);
        bytes.extend_from_slice(&0u32.to_le_bytes());
        bytes.extend_from_slice(&(words.len() as u32).to_le_bytes());
        for word in words {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        decode_all(&bytes);
    }
}

/// Writes one encoded message of every wire type into `fuzz/seeds/wire_decode/`, the
/// checked-in seeds of the `wire_decode` fuzz target (so it starts from valid framing).
/// Run after a schema change:
/// `cargo test -p computer-sync --test wire -- --ignored write_fuzz_seeds`
#[test]
#[ignore = "writes fuzz/seeds/wire_decode; run by hand"]
fn write_fuzz_seeds() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/wire_decode");
    std::fs::create_dir_all(&dir).unwrap();
    let mut seeds: Vec<(String, Vec<u8>)> = Vec::new();
    let mut add = |name: &str, bytes: Vec<u8>| seeds.push((name.to_owned(), bytes));
    add(
        "cursor",
        Cursor::after(&all_states()[0]).to_bytes().unwrap(),
    );
    add("cursor-start", Cursor::START.to_bytes().unwrap());
    add(
        "block-ref",
        BlockRef {
            hash: hash(5),
            len: 4096,
        }
        .to_bytes()
        .unwrap(),
    );
    for (i, entry) in all_states().iter().enumerate() {
        add(&format!("entry-{i}"), entry.to_bytes().unwrap());
    }
    add("entries", all_states().to_bytes().unwrap());
    let page = ChangePage {
        next: Cursor::after(all_states().last().unwrap()),
        entries: all_states(),
        complete: false,
        revision: Revision(43),
    };
    add("page", page.to_bytes().unwrap());
    let blocks = vec![
        StoredBlock {
            hash: BlockHash::of(b"seed"),
            codec: Codec::Raw,
            raw_len: 4,
            data: b"seed".to_vec(),
        },
        StoredBlock {
            hash: hash(6),
            codec: Codec::Zstd,
            raw_len: 100,
            data: vec![0x28, 0xb5, 0x2f, 0xfd, 0, 1, 2, 3],
        },
    ];
    add("block", blocks[0].to_bytes().unwrap());
    add("blocks", blocks.to_bytes().unwrap());
    add(
        "client-info",
        ClientInfo {
            replica_id: "replica".into(),
            peer: "peer".into(),
        }
        .to_bytes()
        .unwrap(),
    );
    add(
        "server-info",
        ServerInfo {
            version: PROTOCOL_VERSION,
            workspace_id: "workspace".into(),
            revision: Revision(9),
            chunk_sizes: ChunkSizes::DEFAULT,
            replaced: false,
        }
        .to_bytes()
        .unwrap(),
    );
    let conflict = Conflict {
        path: b"/a".to_vec(),
        kept_as: b"/a.conflict".to_vec(),
    };
    add("conflict", conflict.to_bytes().unwrap());
    add("conflicts", vec![conflict].to_bytes().unwrap());
    add("hashes", vec![hash(1), hash(2)].to_bytes().unwrap());
    add("have", vec![true, false, true].to_bytes().unwrap());
    add("node", node(FileKind::File, None).to_bytes().unwrap());
    let item = DirItem {
        name: b"name".to_vec(),
        node: node(FileKind::Symlink, Some(b"target")),
    };
    add("dir-item", item.to_bytes().unwrap());
    add("dir-items", vec![item].to_bytes().unwrap());
    let found = GrepMatch {
        path: "/a".into(),
        line_number: 1,
        line: "line".into(),
    };
    add("grep-match", found.to_bytes().unwrap());
    add("grep-matches", vec![found].to_bytes().unwrap());
    add("stats", workspace_stats().to_bytes().unwrap());
    add("check-report", check_report().to_bytes().unwrap());
    let compacted = CompactReport {
        bytes_before: 8192,
        bytes_after: 4096,
        rewrote: false,
    };
    add("compact-report", compacted.to_bytes().unwrap());
    for (name, bytes) in seeds {
        std::fs::write(dir.join(format!("{name}.bin")), bytes).unwrap();
    }
}
