//! Helpers shared by the store benchmarks (`benches/store.rs`) and the block-size study
//! (`examples/block_size.rs`). A directory module, so cargo does not take it for a bench.
#![allow(dead_code)]

use std::path::Path;

use computer_vfs::{ChunkSizes, Options, Workspace};

pub const MIB: usize = 1 << 20;

/// `n` bytes of seeded xorshift64* output: incompressible, and different for each seed.
pub fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        out.extend_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(n);
    out
}

/// `n` bytes of seeded source-code-like text: words, identifiers, numbers and punctuation
/// from a small vocabulary. zstd -1 compresses it about 3-4x, like real source code.
pub fn text_bytes(n: usize, seed: u64) -> Vec<u8> {
    const WORDS: &[&str] = &[
        "fn",
        "let",
        "mut",
        "self",
        "pub",
        "struct",
        "impl",
        "match",
        "return",
        "if",
        "else",
        "for",
        "in",
        "while",
        "loop",
        "break",
        "Ok",
        "Err",
        "Some",
        "None",
        "Result",
        "Option",
        "Vec",
        "String",
        "u64",
        "usize",
        "i64",
        "bool",
        "true",
        "false",
        "the",
        "a",
        "of",
        "to",
        "and",
        "is",
        "that",
        "block",
        "file",
        "offset",
        "len",
        "data",
        "extent",
        "chunk",
        "hash",
        "store",
        "read",
        "write",
        "commit",
        "buffer",
        "inode",
        "cache",
        "size",
        "workspace",
        "error",
        "path",
        "name",
        "parent",
        "revision",
        "//",
        "///",
        "=",
        "==",
        "=>",
        "->",
        "::",
        ".",
        ",",
        ";",
        "&",
        "&mut",
        "(",
        ")",
        "{",
        "}",
        "[",
        "]",
        "<",
        ">",
        "+",
        "-",
        "*",
        "?",
        "!",
        "#[derive(Debug)]",
        "use",
        "crate",
        "mod",
        "const",
        "static",
    ];
    let random = random_bytes(n / 2 + 64, seed);
    let mut out = Vec::with_capacity(n + 64);
    let mut i = 0;
    let mut column = 0;
    while out.len() < n {
        let r = random[i % random.len()] as usize;
        let r2 = random[(i + 1) % random.len()] as usize;
        i += 2;
        if r.is_multiple_of(17) {
            let number = format!("{}", (r * 257 + r2) % 100_000);
            out.extend_from_slice(number.as_bytes());
        } else if r.is_multiple_of(23) {
            // An identifier made of two words.
            out.extend_from_slice(WORDS[r2 % WORDS.len()].as_bytes());
            out.push(b'_');
            out.extend_from_slice(WORDS[(r2 * 7 + r) % WORDS.len()].as_bytes());
        } else {
            out.extend_from_slice(WORDS[(r + r2 * 256) % WORDS.len()].as_bytes());
        }
        column += 6;
        if column > 70 || r2.is_multiple_of(11) {
            out.push(b'\n');
            let indent = (r2 % 4) * 4;
            out.extend(std::iter::repeat_n(b' ', indent));
            column = indent;
        } else {
            out.push(b' ');
        }
    }
    out.truncate(n);
    out
}

/// Options with the given chunk sizes, everything else default.
pub fn options(chunk_sizes: ChunkSizes) -> Options {
    Options {
        chunk_sizes,
        ..Options::default()
    }
}

/// Opens (creating) a workspace database at `path`.
pub fn open(path: &Path, chunk_sizes: ChunkSizes) -> Workspace {
    Workspace::open(path, options(chunk_sizes)).expect("opening the workspace")
}

/// A scratch directory on disk (the system temp dir: the ext4 root here, not tmpfs).
pub fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("computer-bench-")
        .tempdir()
        .expect("creating a temp dir")
}
