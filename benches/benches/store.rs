//! Criterion benchmarks of the store (`computer-vfs`) through its two APIs, on a database
//! in a temp dir on disk.
//!
//! ```sh
//! cargo bench -p computer-benches --bench store
//! cargo bench -p computer-benches --bench store -- read_64MiB   # one group
//! ```
//!
//! Groups: `write_64MiB` (path API `write_file` and `create_write` in 1 MiB writes, inode
//! API open/write 1 MiB/flush/release; random and zero data; a fresh workspace for every
//! iteration so nothing deduplicates against an earlier one), `read_64MiB` (`read_file` and
//! inode `read` in 1 MiB pieces; cold = a freshly opened workspace, so an empty block
//! cache, warm = the same workspace again), `small_files` (1000 files: create, stat,
//! unlink), `listing_100` (one directory of 100 files listed with and without
//! attributes, and past its end: what READDIRPLUS and READDIR cost), `copy_64MiB`
//! (`Fs::copy`, which shares blocks), `overwrite_1_byte` (in the middle of a 64 MiB
//! file), and `raw` (BLAKE3, zstd, FastCDC, memcpy: the per-byte work under the store).
//! docs/benchmarks.md has results.

mod common;

use computer_vfs::Who;
use std::hint::black_box;
use std::io::Write;
use std::time::Duration;

use common::{open, random_bytes, scratch, text_bytes, MIB};
use computer_vfs::{BlockHash, ChunkSizes, Chunker, FileKind, InodeNo, NewNode, OpenFlags};
use criterion::{
    criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, SamplingMode, Throughput,
};

const BIG: usize = 64 * MIB;

fn fresh() -> (tempfile::TempDir, computer_vfs::Workspace) {
    let dir = scratch();
    let ws = open(&dir.path().join("ws.db"), ChunkSizes::DEFAULT);
    (dir, ws)
}

fn slow_group<'a>(
    c: &'a mut Criterion,
    name: &str,
) -> criterion::BenchmarkGroup<'a, criterion::measurement::WallTime> {
    let mut group = c.benchmark_group(name);
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(5));
    group
}

fn write(c: &mut Criterion) {
    let random = random_bytes(BIG, 1);
    let zeros = vec![0u8; BIG];
    let mut group = slow_group(c, "write_64MiB");
    group.throughput(Throughput::Bytes(BIG as u64));
    for (kind, data) in [("random", &random), ("zeros", &zeros)] {
        group.bench_function(BenchmarkId::new("path_write_file", kind), |b| {
            b.iter_batched(
                fresh,
                |(dir, ws)| {
                    ws.fs().write_file("/f", data).unwrap();
                    (dir, ws)
                },
                BatchSize::PerIteration,
            )
        });
        group.bench_function(BenchmarkId::new("path_create_write_1MiB", kind), |b| {
            b.iter_batched(
                fresh,
                |(dir, ws)| {
                    let mut writer = ws.fs().create_write("/f").unwrap();
                    for piece in data.chunks(MIB) {
                        writer.write_all(piece).unwrap();
                    }
                    writer.finish().unwrap();
                    (dir, ws)
                },
                BatchSize::PerIteration,
            )
        });
        group.bench_function(BenchmarkId::new("inode_write_1MiB", kind), |b| {
            b.iter_batched(
                || {
                    let (dir, ws) = fresh();
                    let attr = ws
                        .mknod(
                            Who::Trusted,
                            InodeNo::ROOT,
                            b"f",
                            FileKind::File,
                            NewNode::new(0o644),
                            0,
                        )
                        .unwrap();
                    (dir, ws, attr.ino)
                },
                |(dir, ws, ino)| {
                    let fh = ws.open_file(ino, OpenFlags::WRITE).unwrap();
                    for (i, piece) in data.chunks(MIB).enumerate() {
                        ws.write(fh, (i * MIB) as u64, piece).unwrap();
                    }
                    ws.flush(fh).unwrap();
                    ws.release(fh).unwrap();
                    (dir, ws)
                },
                BatchSize::PerIteration,
            )
        });
    }
    group.finish();
}

fn read(c: &mut Criterion) {
    let dir = scratch();
    let path = dir.path().join("ws.db");
    {
        let ws = open(&path, ChunkSizes::DEFAULT);
        ws.fs().write_file("/random", random_bytes(BIG, 2)).unwrap();
        ws.fs().write_file("/zeros", vec![0u8; BIG]).unwrap();
        ws.checkpoint().unwrap();
    }
    let read_inode = |ws: &computer_vfs::Workspace, ino: InodeNo| {
        let fh = ws.open_file(ino, OpenFlags::READ).unwrap();
        let mut offset = 0;
        loop {
            let piece = ws.read(fh, offset, MIB).unwrap();
            if piece.is_empty() {
                break;
            }
            offset += piece.len() as u64;
            black_box(&piece);
        }
        ws.release(fh).unwrap();
        assert_eq!(offset, BIG as u64);
    };
    let warm = open(&path, ChunkSizes::DEFAULT);
    let mut group = slow_group(c, "read_64MiB");
    group.throughput(Throughput::Bytes(BIG as u64));
    for kind in ["random", "zeros"] {
        let file = format!("/{kind}");
        let ino = warm.fs().stat(&file).unwrap().ino;
        group.bench_function(BenchmarkId::new("path_read_file_cold", kind), |b| {
            b.iter_batched(
                || open(&path, ChunkSizes::DEFAULT),
                |ws| {
                    assert_eq!(black_box(ws.fs().read_file(&file).unwrap()).len(), BIG);
                    ws
                },
                BatchSize::PerIteration,
            )
        });
        group.bench_function(BenchmarkId::new("path_read_file_warm", kind), |b| {
            b.iter(|| assert_eq!(black_box(warm.fs().read_file(&file).unwrap()).len(), BIG))
        });
        group.bench_function(BenchmarkId::new("inode_read_1MiB_cold", kind), |b| {
            b.iter_batched(
                || open(&path, ChunkSizes::DEFAULT),
                |ws| {
                    read_inode(&ws, ino);
                    ws
                },
                BatchSize::PerIteration,
            )
        });
        group.bench_function(BenchmarkId::new("inode_read_1MiB_warm", kind), |b| {
            b.iter(|| read_inode(&warm, ino))
        });
    }
    group.finish();
}

fn small_files(c: &mut Criterion) {
    const N: usize = 1000;
    let paths: Vec<String> = (0..N).map(|i| format!("/d/f{i}")).collect();
    let populated = || {
        let (dir, ws) = fresh();
        let fs = ws.fs();
        fs.mkdir("/d", Default::default()).unwrap();
        for (i, path) in paths.iter().enumerate() {
            fs.write_file(path, format!("{i}\n")).unwrap();
        }
        (dir, ws)
    };
    let mut group = slow_group(c, "small_files_1000");
    group.throughput(Throughput::Elements(N as u64));
    group.bench_function("path_create", |b| {
        b.iter_batched(
            || {
                let (dir, ws) = fresh();
                ws.fs().mkdir("/d", Default::default()).unwrap();
                (dir, ws)
            },
            |(dir, ws)| {
                let fs = ws.fs();
                for (i, path) in paths.iter().enumerate() {
                    fs.write_file(path, format!("{i}\n")).unwrap();
                }
                (dir, ws)
            },
            BatchSize::PerIteration,
        )
    });
    let (_dir, ws) = populated();
    let fs = ws.fs();
    group.bench_function("path_stat", |b| {
        b.iter(|| {
            for path in &paths {
                black_box(fs.stat(path).unwrap());
            }
        })
    });
    group.bench_function("path_unlink", |b| {
        b.iter_batched(
            populated,
            |(dir, ws)| {
                let fs = ws.fs();
                for path in &paths {
                    fs.unlink(path).unwrap();
                }
                (dir, ws)
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

/// What a READDIRPLUS and the READDIR after it cost the daemon in the store: one
/// directory of 100 files (the shape of fsbench's reads tree), listed whole with
/// attributes, then asked for what follows its last entry (the empty answer that tells
/// the kernel the listing ended).
fn listing(c: &mut Criterion) {
    const ENTRIES: usize = 100;
    const BATCH: usize = 256;
    let (_dir, ws) = fresh();
    let fs = ws.fs();
    fs.mkdir("/d", Default::default()).unwrap();
    for i in 0..ENTRIES {
        fs.write_file(&format!("/d/f{i:03}.txt"), format!("{i}\n"))
            .unwrap();
    }
    let dir = fs.stat("/d").unwrap().ino;
    let last = ws
        .readdir(Who::Trusted, dir, 0, BATCH)
        .unwrap()
        .last()
        .unwrap()
        .cookie;
    let mut group = c.benchmark_group("listing_100");
    group.throughput(Throughput::Elements(ENTRIES as u64));
    group.bench_function("inode_readdir_plus", |b| {
        b.iter(|| black_box(ws.readdir_plus(Who::Trusted, dir, 0, BATCH).unwrap()))
    });
    group.bench_function("inode_readdir", |b| {
        b.iter(|| black_box(ws.readdir(Who::Trusted, dir, 0, BATCH).unwrap()))
    });
    group.bench_function("inode_readdir_past_end", |b| {
        b.iter(|| black_box(ws.readdir(Who::Trusted, dir, last, BATCH).unwrap()))
    });
    group.bench_function("inode_opendir", |b| {
        b.iter(|| black_box(ws.opendir(Who::Trusted, dir).unwrap()))
    });
    group.finish();
}

fn copy_and_overwrite(c: &mut Criterion) {
    let (_dir, ws) = fresh();
    let fs = ws.fs();
    fs.write_file("/big", random_bytes(BIG, 3)).unwrap();
    ws.checkpoint().unwrap();

    let mut group = slow_group(c, "copy_64MiB");
    group.throughput(Throughput::Bytes(BIG as u64));
    group.bench_function("path_copy", |b| {
        b.iter_batched(
            || {
                let _ = fs.unlink("/copy");
            },
            |()| fs.copy("/big", "/copy", false).unwrap(),
            BatchSize::PerIteration,
        )
    });
    group.finish();
    let _ = fs.unlink("/copy");

    let mut group = slow_group(c, "overwrite_1_byte");
    group.throughput(Throughput::Elements(1));
    let mut value = 0u8;
    group.bench_function("path_write_at_middle_of_64MiB", |b| {
        b.iter(|| {
            value = value.wrapping_add(1);
            fs.write_at("/big", (BIG / 2) as u64, [value]).unwrap();
        })
    });
    group.finish();
}

fn raw(c: &mut Criterion) {
    let random = random_bytes(BIG, 4);
    let text = text_bytes(BIG, 5);
    let mut group = c.benchmark_group("raw");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));

    for len in [64 << 10, 256 << 10, MIB] {
        group.throughput(Throughput::Bytes(len as u64));
        group.bench_function(
            BenchmarkId::new("blake3", format!("{}KiB", len >> 10)),
            |b| b.iter(|| BlockHash::of(black_box(&random[..len]))),
        );
    }

    // zstd as block.rs uses it: a reused bulk context, one 64 KiB block (the default
    // average) at a time.
    const BLOCK: usize = 64 << 10;
    group.throughput(Throughput::Bytes(BLOCK as u64));
    for level in [1, 3] {
        let mut compressor = zstd::bulk::Compressor::new(level).unwrap();
        for (kind, data) in [("random", &random[..BLOCK]), ("text", &text[..BLOCK])] {
            let mut out = Vec::with_capacity(zstd::zstd_safe::compress_bound(BLOCK));
            compressor.compress_to_buffer(data, &mut out).unwrap();
            eprintln!(
                "zstd level {level}, {kind} 64 KiB -> {} bytes ({:.2}x)",
                out.len(),
                BLOCK as f64 / out.len() as f64
            );
            group.bench_function(
                BenchmarkId::new(format!("zstd{level}_compress_64KiB"), kind),
                |b| {
                    b.iter(|| {
                        out.clear();
                        compressor
                            .compress_to_buffer(black_box(data), &mut out)
                            .unwrap();
                    })
                },
            );
        }
    }
    let compressed = zstd::bulk::compress(&text[..BLOCK], 1).unwrap();
    let mut decompressor = zstd::bulk::Decompressor::new().unwrap();
    let mut out = Vec::with_capacity(BLOCK);
    group.bench_function(BenchmarkId::new("zstd_decompress_64KiB", "text"), |b| {
        b.iter(|| {
            out.clear();
            decompressor
                .decompress_to_buffer(black_box(&compressed), &mut out)
                .unwrap();
        })
    });

    group.throughput(Throughput::Bytes(BIG as u64));
    group.sample_size(10);
    let chunker = Chunker::new(ChunkSizes::DEFAULT);
    for (kind, data) in [("random", &random), ("text", &text)] {
        group.bench_function(BenchmarkId::new("fastcdc_64MiB", kind), |b| {
            b.iter(|| chunker.chunks(black_box(data)).len())
        });
    }
    let mut dst = vec![0u8; BIG];
    group.bench_function("memcpy_64MiB", |b| {
        b.iter(|| dst.copy_from_slice(black_box(&random)))
    });
    group.finish();
}

criterion_group!(
    benches,
    write,
    read,
    small_files,
    listing,
    copy_and_overwrite,
    raw
);
criterion_main!(benches);
