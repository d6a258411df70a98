//! The measurements behind the store's chunk sizes (and its SQLite page size).
//!
//! ```sh
//! cargo run --release -p computer-benches --example block_size
//! cargo run --release -p computer-benches --example block_size -- --reps 1 --no-tree
//! ```
//!
//! For each chunk-size configuration, on a database in a temp dir on disk:
//! - a 64 MiB file of random bytes: write throughput (`Fs::write_file`, fresh workspace),
//!   cold sequential read throughput (freshly opened workspace, inode `read` in 1 MiB
//!   pieces), random 4 KiB reads with the block cache off (each read decodes its block),
//!   and the rows that file takes;
//! - edits of that file: one byte changed (`Fs::write_at`; median of 5 places) and 100 bytes
//!   inserted at the head (the whole file rewritten with `Fs::write_file`), each with the
//!   blocks and bytes newly stored (blocks with an id above the largest before the edit);
//! - a realistic tree imported with `transfer::import` (default `/usr/share/doc`): stored
//!   bytes, rows and database size, then a few edits of its files (a line inserted at the
//!   head, a byte changed in the middle, a line appended; each file saved whole with
//!   `write_file`, as an editor does) and the bytes they newly store;
//! - a crate upgrade: one version of a crate's source imported, then the next one beside
//!   it; the bytes the second import newly stores.
//!
//! Then the same 64 MiB and tree measurements with the default chunk sizes and other
//! SQLite page sizes (set by creating the empty database file first: the store keeps
//! whatever page size the file has), and what sharing a block costs (refcount updates).
//! Write and read repetitions are interleaved across configurations, so load from other
//! processes spreads over all of them. Output: markdown tables on stdout, progress on
//! stderr.
//! docs/benchmarks.md has results.

#[path = "../benches/common/mod.rs"]
mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Parser;
use common::{random_bytes, scratch, MIB};
use computer_vfs::{transfer, ChunkSizes, OpenFlags, Options, Workspace};

const BIG: usize = 64 * MIB;
const KIB: usize = 1 << 10;
/// Random 4 KiB reads timed per configuration (the median is reported).
const RANDOM_READS: usize = 2000;

#[derive(Parser)]
#[command(about = "Chunk-size and page-size study of the workspace store")]
struct Args {
    /// Timed repetitions of the 64 MiB write and read (median reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// The host tree to import.
    #[arg(long, default_value = "/usr/share/doc")]
    tree: PathBuf,
    /// Skip the tree and crate measurements.
    #[arg(long)]
    no_tree: bool,
    /// A crate's source tree, then a later version of it (default: syn 2.0.111 and
    /// 2.0.119 from ~/.cargo/registry/src, if present).
    #[arg(long, num_args = 2, value_names = ["OLD", "NEW"])]
    upgrade: Vec<PathBuf>,
    /// Skip the SQLite page-size table.
    #[arg(long)]
    no_page_size: bool,
}

fn sizes(min: usize, avg: usize, max: usize) -> ChunkSizes {
    ChunkSizes { min, avg, max }
}

fn label(s: ChunkSizes) -> String {
    let k = |n: usize| {
        if n >= MIB {
            format!("{}M", n / MIB)
        } else {
            format!("{}K", n / KIB)
        }
    };
    format!("{}/{}/{}", k(s.min), k(s.avg), k(s.max))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn mib_per_s(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / MIB as f64 / secs
}

/// Creates an empty database file with `page_size`, which `Workspace::open` then fills.
fn precreate(path: &Path, page_size: u32) {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch(&format!(
        "PRAGMA page_size = {page_size}; CREATE TABLE t (x); DROP TABLE t; VACUUM;"
    ))
    .unwrap();
}

fn open_ws(path: &Path, chunk_sizes: ChunkSizes, cache: Option<usize>) -> Workspace {
    let mut options = Options {
        chunk_sizes,
        ..Options::default()
    };
    if let Some(bytes) = cache {
        options.block_cache_bytes = bytes;
    }
    Workspace::open(path, options).unwrap()
}

/// Row counts and sizes, read with a separate connection.
#[derive(Clone, Copy, Debug, Default)]
struct Db {
    blocks: u64,
    stored: u64,
    extents: u64,
    nodes: u64,
    page_size: u64,
    live_bytes: u64,
    max_block: i64,
}

fn db_stats(path: &Path) -> Db {
    let conn =
        rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let q = |sql: &str| -> i64 { conn.query_row(sql, [], |r| r.get(0)).unwrap() };
    let page_size = q("PRAGMA page_size") as u64;
    Db {
        blocks: q("SELECT count(*) FROM blocks") as u64,
        stored: q("SELECT coalesce(sum(length(data)), 0) FROM blocks") as u64,
        extents: q("SELECT count(*) FROM extents") as u64,
        nodes: q("SELECT count(*) FROM nodes") as u64,
        page_size,
        live_bytes: (q("PRAGMA page_count") - q("PRAGMA freelist_count")) as u64 * page_size,
        max_block: q("SELECT coalesce(max(id), 0) FROM blocks"),
    }
}

/// Blocks (count, stored bytes) with an id above `after`: what a change newly stored.
fn new_blocks(path: &Path, after: i64) -> (u64, u64) {
    let conn =
        rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    conn.query_row(
        "SELECT count(*), coalesce(sum(length(data)), 0) FROM blocks WHERE id > ?1",
        [after],
        |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64)),
    )
    .unwrap()
}

fn read_all(ws: &Workspace, path: &str) -> usize {
    let ino = ws.fs().stat(path).unwrap().ino;
    let fh = ws.open_file(ino, OpenFlags::READ).unwrap();
    let mut offset = 0;
    loop {
        let piece = ws.read(fh, offset, MIB).unwrap();
        if piece.is_empty() {
            break;
        }
        offset += piece.len() as u64;
    }
    ws.release(fh).unwrap();
    offset as usize
}

#[derive(Default)]
struct BigResult {
    rand_read_us: f64,
    blocks: u64,
    extents: u64,
    byte_new: (u64, u64),
    byte_ms: f64,
    head_new: (u64, u64),
    head_ms: f64,
}

/// A chunk-size configuration and, if not the default, a SQLite page size.
type Setup = (ChunkSizes, Option<u32>);

/// A new workspace database for `setup` in a new temp dir.
fn create(setup: Setup) -> (tempfile::TempDir, PathBuf, Workspace) {
    let dir = scratch();
    let path = dir.path().join("ws.db");
    if let Some(page_size) = setup.1 {
        precreate(&path, page_size);
    }
    let ws = open_ws(&path, setup.0, None);
    (dir, path, ws)
}

/// Median write and cold-read throughput (MiB/s) of `data` for each setup. Repetitions are
/// interleaved across setups, so load from other processes spreads over all of them.
fn throughput(setups: &[Setup], data: &[u8], reps: usize) -> Vec<(f64, f64)> {
    let mut writes = vec![Vec::new(); setups.len()];
    let mut reads = vec![Vec::new(); setups.len()];
    for rep in 0..reps {
        eprintln!("  write/read repetition {}/{reps}", rep + 1);
        for (i, &setup) in setups.iter().enumerate() {
            let (_dir, path, ws) = create(setup);
            let started = Instant::now();
            ws.fs().write_file("/big", data).unwrap();
            writes[i].push(started.elapsed().as_secs_f64());
            ws.checkpoint().unwrap();
            drop(ws);
            let ws = open_ws(&path, setup.0, None);
            let started = Instant::now();
            assert_eq!(read_all(&ws, "/big"), data.len());
            reads[i].push(started.elapsed().as_secs_f64());
        }
    }
    writes
        .into_iter()
        .zip(reads)
        .map(|(w, r)| {
            (
                mib_per_s(data.len(), median(w)),
                mib_per_s(data.len(), median(r)),
            )
        })
        .collect()
}

/// Everything but throughput for one setup: random reads, rows, edits.
fn big_file(setup: Setup, data: &[u8]) -> BigResult {
    let chunk_sizes = setup.0;
    let mut result = BigResult::default();
    let (_dir, path, ws) = create(setup);
    ws.fs().write_file("/big", data).unwrap();
    ws.checkpoint().unwrap();
    drop(ws);

    // Random 4 KiB reads with the block cache off: each one decodes (and verifies) a block.
    {
        let ws = open_ws(&path, chunk_sizes, Some(0));
        let ino = ws.fs().stat("/big").unwrap().ino;
        let fh = ws.open_file(ino, OpenFlags::READ).unwrap();
        let offsets = random_bytes(8 * RANDOM_READS, 12);
        let mut times = Vec::with_capacity(RANDOM_READS);
        for o in offsets.chunks(8) {
            let at = u64::from_le_bytes(o.try_into().unwrap()) % (BIG - 4 * KIB) as u64;
            let started = Instant::now();
            assert_eq!(ws.read(fh, at, 4 * KIB).unwrap().len(), 4 * KIB);
            times.push(started.elapsed().as_secs_f64());
        }
        result.rand_read_us = median(times) * 1e6;
        ws.release(fh).unwrap();
    }

    let stats = db_stats(&path);
    result.blocks = stats.blocks;
    result.extents = stats.extents;

    let ws = open_ws(&path, chunk_sizes, None);
    let fs = ws.fs();
    // One byte changed at each of 5 places, one change at a time; medians.
    let (mut times, mut blocks, mut bytes) = (Vec::new(), Vec::new(), Vec::new());
    for k in 0..5 {
        let at = BIG / 2 + k * BIG / 11;
        let before = db_stats(&path).max_block;
        let started = Instant::now();
        fs.write_at("/big", at as u64, [data[at] ^ 0xff]).unwrap();
        times.push(started.elapsed().as_secs_f64() * 1e3);
        ws.checkpoint().unwrap();
        let (b, n) = new_blocks(&path, before);
        blocks.push(b as f64);
        bytes.push(n as f64);
        // Put the byte back, so the head insertion below sees the original content.
        fs.write_at("/big", at as u64, [data[at]]).unwrap();
    }
    result.byte_ms = median(times);
    result.byte_new = (median(blocks) as u64, median(bytes) as u64);

    let mut shifted = b"100 bytes inserted at the head of the file. ".repeat(3);
    shifted.truncate(100);
    shifted.extend_from_slice(data);
    let before = db_stats(&path).max_block;
    let started = Instant::now();
    fs.write_file("/big", &shifted).unwrap();
    result.head_ms = started.elapsed().as_secs_f64() * 1e3;
    ws.checkpoint().unwrap();
    result.head_new = new_blocks(&path, before);
    result
}

#[derive(Default)]
struct TreeResult {
    files: u64,
    logical: u64,
    import_s: f64,
    after: Db,
    edits: usize,
    edit_new: (u64, u64),
    upgrade: Option<(u64, u64, u64)>,
}

fn host_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                out.push(entry.path());
            }
        }
    }
    out.sort();
    out
}

fn tree_logical(dir: &Path) -> u64 {
    host_files(dir)
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum()
}

fn edit(content: &[u8], kind: usize) -> Vec<u8> {
    match kind {
        0 => {
            let mut out = b"An inserted first line, as an editor would add one.\n".to_vec();
            out.extend_from_slice(content);
            out
        }
        1 => {
            let mut out = content.to_vec();
            let mid = out.len() / 2;
            out[mid] ^= 0x20;
            out
        }
        _ => {
            let mut out = content.to_vec();
            out.extend_from_slice(b"\nA line appended at the end.\n");
            out
        }
    }
}

fn tree(
    chunk_sizes: ChunkSizes,
    page_size: Option<u32>,
    source: &Path,
    upgrade: Option<(&Path, &Path)>,
) -> TreeResult {
    let dir = scratch();
    let path = dir.path().join("ws.db");
    if let Some(page_size) = page_size {
        precreate(&path, page_size);
    }
    let ws = open_ws(&path, chunk_sizes, None);
    let fs = ws.fs();
    let started = Instant::now();
    let summary = transfer::import(&fs, source, "/tree", &mut |_| {}).unwrap();
    let import_s = started.elapsed().as_secs_f64();
    ws.checkpoint().unwrap();
    let after = db_stats(&path);

    // A few edits: every n-th non-empty file, saved whole.
    let files: Vec<PathBuf> = host_files(source)
        .into_iter()
        .filter(|p| std::fs::metadata(p).map(|m| m.len() > 0).unwrap_or(false))
        .collect();
    let step = (files.len() / 24).max(1);
    let before = after.max_block;
    let mut edits = 0;
    for (i, host) in files.iter().enumerate().step_by(step) {
        let relative = host.strip_prefix(source).unwrap().to_str().unwrap();
        let ws_path = format!("/tree/{relative}");
        let content = fs.read_file(&ws_path).unwrap();
        fs.write_file(&ws_path, edit(&content, i / step % 3))
            .unwrap();
        edits += 1;
    }
    ws.checkpoint().unwrap();
    let edit_new = new_blocks(&path, before);

    let upgrade = upgrade.map(|(old, new)| {
        transfer::import(&fs, old, "/crate-old", &mut |_| {}).unwrap();
        ws.checkpoint().unwrap();
        let before = db_stats(&path).max_block;
        transfer::import(&fs, new, "/crate-new", &mut |_| {}).unwrap();
        ws.checkpoint().unwrap();
        let (blocks, bytes) = new_blocks(&path, before);
        (tree_logical(new), blocks, bytes)
    });
    TreeResult {
        files: summary.files,
        logical: summary.bytes,
        import_s,
        after,
        edits,
        edit_new,
        upgrade,
    }
}

fn wal_bytes(path: &Path) -> u64 {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    std::fs::metadata(wal).map_or(0, |m| m.len())
}

/// What sharing blocks costs: each step's time and the WAL it writes (the WAL is
/// truncated before each step), for a 64 MiB file of 64 KiB-average blocks.
fn sharing(out: &mut impl Write) {
    let dir = scratch();
    let path = dir.path().join("ws.db");
    let ws = open_ws(&path, ChunkSizes::DEFAULT, None);
    let fs = ws.fs();
    let data = random_bytes(BIG, 13);
    let mut step = |name: &str, f: &dyn Fn()| {
        ws.checkpoint().unwrap();
        let started = Instant::now();
        f();
        let ms = started.elapsed().as_secs_f64() * 1e3;
        writeln!(out, "| {name} | {ms:.0} | {} |", mib(wal_bytes(&path))).unwrap();
    };
    step("write_file 64 MiB (new blocks)", &|| {
        fs.write_file("/big", &data).unwrap()
    });
    step("copy #1 (refcount 1 -> 2)", &|| {
        fs.copy("/big", "/c1", false).unwrap()
    });
    step("copy #2 (refcount 2 -> 3)", &|| {
        fs.copy("/big", "/c2", false).unwrap()
    });
    step("unlink copy #2 (3 -> 2)", &|| fs.unlink("/c2").unwrap());
    step("unlink copy #1 (2 -> 1)", &|| fs.unlink("/c1").unwrap());
    step("write_file same bytes to a new file (dedup hits)", &|| {
        fs.write_file("/same", &data).unwrap()
    });
}

/// The same refcount update in plain SQLite, with the count in the row of a 64 KiB
/// blob and in a table of its own: 1000 rows from 1 to 2, then from 2 to 3.
fn refcount_sqlite(out: &mut impl Write) {
    let dir = scratch();
    let path = dir.path().join("plain.db");
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;
         CREATE TABLE inline (id INTEGER PRIMARY KEY, refcount INTEGER, data BLOB);
         CREATE TABLE data (id INTEGER PRIMARY KEY, data BLOB);
         CREATE TABLE refs (id INTEGER PRIMARY KEY, refcount INTEGER);",
    )
    .unwrap();
    let blob = random_bytes(64 * KIB, 14);
    conn.execute_batch("BEGIN").unwrap();
    for id in 0..1000 {
        conn.execute(
            "INSERT INTO inline VALUES (?1, 1, ?2)",
            rusqlite::params![id, blob],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO data VALUES (?1, ?2)",
            rusqlite::params![id, blob],
        )
        .unwrap();
        conn.execute("INSERT INTO refs VALUES (?1, 1)", [id])
            .unwrap();
    }
    conn.execute_batch("COMMIT").unwrap();
    for (table, from) in [("inline", 1), ("inline", 2), ("refs", 1), ("refs", 2)] {
        conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
            .unwrap();
        let started = Instant::now();
        conn.execute_batch("BEGIN").unwrap();
        for id in 0..1000 {
            conn.execute(
                &format!("UPDATE {table} SET refcount = refcount + 1 WHERE id = ?1"),
                [id],
            )
            .unwrap();
        }
        conn.execute_batch("COMMIT").unwrap();
        let ms = started.elapsed().as_secs_f64() * 1e3;
        writeln!(
            out,
            "| refcount in `{table}`, {from} -> {} | {ms:.0} | {} |",
            from + 1,
            mib(wal_bytes(&path))
        )
        .unwrap();
    }
}

fn kib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / KIB as f64)
}

fn mib(bytes: u64) -> String {
    format!("{:.2}", bytes as f64 / MIB as f64)
}

fn default_upgrade() -> Option<(PathBuf, PathBuf)> {
    let home = std::env::var_os("HOME")?;
    let registry = Path::new(&home).join(".cargo/registry/src");
    for index in std::fs::read_dir(registry).ok()? {
        let index = index.ok()?.path();
        let (old, new) = (index.join("syn-2.0.111"), index.join("syn-2.0.119"));
        if old.is_dir() && new.is_dir() {
            return Some((old, new));
        }
    }
    None
}

fn main() {
    let args = Args::parse();
    let configs = [
        sizes(4 * KIB, 16 * KIB, 64 * KIB),
        ChunkSizes::DEFAULT,
        sizes(64 * KIB, 256 * KIB, MIB),
        sizes(128 * KIB, 512 * KIB, 2 * MIB),
    ];
    let upgrade = match args.upgrade.as_slice() {
        [old, new] => Some((old.clone(), new.clone())),
        _ => default_upgrade(),
    };
    let upgrade_ref = upgrade.as_ref().map(|(o, n)| (o.as_path(), n.as_path()));
    let out = std::io::stdout();
    let mut out = out.lock();

    writeln!(
        out,
        "### 64 MiB of random bytes\n\n\
         | chunks min/avg/max | write MiB/s | cold read MiB/s | 4 KiB random read, no cache (µs, median) \
         | blocks | 1-byte change: new blocks, KiB (ms) | +100 B at head: new blocks, KiB (ms) |\n\
         |---|---:|---:|---:|---:|---|---|"
    )
    .unwrap();
    let data = random_bytes(BIG, 11);
    eprintln!("64 MiB file: throughput");
    let setups: Vec<Setup> = configs.iter().map(|&c| (c, None)).collect();
    let rates = throughput(&setups, &data, args.reps);
    for (&setup, (write_mbps, read_mbps)) in setups.iter().zip(rates) {
        let config = setup.0;
        eprintln!("64 MiB file, chunks {}", label(config));
        let r = big_file(setup, &data);
        writeln!(
            out,
            "| {} | {:.0} | {:.0} | {:.0} | {} | {}, {} ({:.1}) | {}, {} ({:.0}) |",
            label(config),
            write_mbps,
            read_mbps,
            r.rand_read_us,
            r.blocks,
            r.byte_new.0,
            kib(r.byte_new.1),
            r.byte_ms,
            r.head_new.0,
            kib(r.head_new.1),
            r.head_ms
        )
        .unwrap();
        out.flush().unwrap();
    }

    if !args.no_tree {
        let logical = tree_logical(&args.tree);
        writeln!(
            out,
            "\n### Tree: {} ({} MiB of files)\n\n\
             | chunks min/avg/max | import s | stored MiB | blocks | extents | database MiB \
             | edits: new blocks, KiB (files) | crate upgrade: new blocks, KiB of MiB |\n\
             |---|---:|---:|---:|---:|---:|---|---|",
            args.tree.display(),
            mib(logical),
        )
        .unwrap();
        for &config in &configs {
            eprintln!("tree, chunks {}", label(config));
            let r = tree(config, None, &args.tree, upgrade_ref);
            let upgrade = r
                .upgrade
                .map_or("-".to_owned(), |(logical, blocks, bytes)| {
                    format!("{blocks}, {} of {}", kib(bytes), mib(logical))
                });
            writeln!(
                out,
                "| {} | {:.1} | {} | {} | {} | {} | {}, {} ({} files) | {} |",
                label(config),
                r.import_s,
                mib(r.after.stored),
                r.after.blocks,
                r.after.extents,
                mib(r.after.live_bytes),
                r.edit_new.0,
                kib(r.edit_new.1),
                r.edits,
                upgrade
            )
            .unwrap();
            eprintln!(
                "  {} files, {} logical bytes, {} nodes",
                r.files, r.logical, r.after.nodes
            );
            out.flush().unwrap();
        }
        if let Some((old, new)) = &upgrade {
            writeln!(
                out,
                "\nCrate upgrade: {} imported, then {}.",
                old.display(),
                new.display()
            )
            .unwrap();
        }
    }

    writeln!(
        out,
        "\n### Sharing blocks: refcount updates (chunks {})\n\n\
         | step | ms | WAL MiB |\n|---|---:|---:|",
        label(ChunkSizes::DEFAULT)
    )
    .unwrap();
    eprintln!("sharing");
    sharing(&mut out);
    writeln!(
        out,
        "\nPlain SQLite, 1000 rows of 64 KiB, one transaction:\n\n| update | ms | WAL MiB |\n|---|---:|---:|"
    )
    .unwrap();
    refcount_sqlite(&mut out);
    out.flush().unwrap();

    if !args.no_page_size {
        writeln!(
            out,
            "\n### SQLite page size (chunks {})\n\n\
             | page size | write MiB/s | cold read MiB/s | 4 KiB random read, no cache (µs, median) \
             | tree import s | tree database MiB |\n|---:|---:|---:|---:|---:|---:|",
            label(ChunkSizes::DEFAULT)
        )
        .unwrap();
        let page_sizes = [4096u32, 8192, 16384, 65536];
        let setups: Vec<Setup> = page_sizes
            .iter()
            .map(|&p| (ChunkSizes::DEFAULT, Some(p)))
            .collect();
        eprintln!("page sizes: throughput");
        let rates = throughput(&setups, &data, args.reps);
        for (&setup, (write_mbps, read_mbps)) in setups.iter().zip(rates) {
            let page_size = setup.1.expect("page-size setups have one");
            eprintln!("page size {page_size}");
            let r = big_file(setup, &data);
            let (import_s, db) = if args.no_tree {
                ("-".to_owned(), "-".to_owned())
            } else {
                let t = tree(ChunkSizes::DEFAULT, Some(page_size), &args.tree, None);
                assert_eq!(t.after.page_size, page_size as u64);
                (format!("{:.1}", t.import_s), mib(t.after.live_bytes))
            };
            writeln!(
                out,
                "| {page_size} | {write_mbps:.0} | {read_mbps:.0} | {:.0} | {import_s} | {db} |",
                r.rand_read_us
            )
            .unwrap();
            out.flush().unwrap();
        }
    }
}
