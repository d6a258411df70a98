//! `UPDATE … RETURNING` inside a savepoint slows down with the size of the savepoint's
//! sub-journal, in plain SQLite (the store's bundled version, no store code).
//!
//! The store runs every mutation inside `SAVEPOINT mutation` (`vfs/src/db.rs`), and
//! changes reference counts with `UPDATE blocks … RETURNING` (`content::release_block`,
//! `content::retain_by_hash`). A statement that needs a statement journal opens a
//! nested savepoint and, when it ends, truncates the in-memory sub-journal back to where
//! it started; `memjrnlTruncate` finds that point by walking the journal's chunk list
//! from its first chunk. So each such statement costs time in proportion to everything
//! the mutation journaled before it: the pages of existing rows it rewrote. Found in a
//! profile of syncbench (`docs/benchmarks.md`, "Sync on the wire").
//!
//! ```sh
//! cargo run --release -p computer-benches --example sqlite_returning
//! ```
//!
//! For each size: a table of rows of 1 KB is created and committed; then, in one
//! transaction, every row of it is rewritten (journaling its pages), and 4000 one-row
//! updates of another table are timed, with and without a savepoint and `RETURNING`.

use std::time::Instant;

use rusqlite::Connection;

const UPDATES: i64 = 4000;

fn hash(i: i64) -> Vec<u8> {
    let mut x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..32)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Microseconds per update.
fn run(dir: &std::path::Path, pad_rows: i64, savepoint: bool, returning: bool) -> f64 {
    let path = dir.join(format!("t-{pad_rows}-{savepoint}-{returning}.db"));
    let conn = Connection::open(&path).expect("opening");
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA temp_store = MEMORY;
         PRAGMA cache_size = -16384;
         CREATE TABLE blocks (id INTEGER PRIMARY KEY, hash BLOB NOT NULL UNIQUE,
                              refcount INTEGER NOT NULL);
         CREATE TABLE pad (n INTEGER NOT NULL, x BLOB NOT NULL);
         BEGIN;",
    )
    .expect("schema");
    {
        let mut insert = conn
            .prepare("INSERT INTO blocks VALUES (?1, ?2, 1)")
            .expect("prepare");
        for i in 0..UPDATES {
            insert
                .execute(rusqlite::params![i, hash(i)])
                .expect("insert");
        }
        let mut pad = conn
            .prepare("INSERT INTO pad VALUES (0, zeroblob(1000))")
            .expect("prepare");
        for _ in 0..pad_rows {
            pad.execute([]).expect("insert");
        }
    }
    conn.execute_batch("COMMIT; BEGIN IMMEDIATE;")
        .expect("begin");
    if savepoint {
        conn.execute_batch("SAVEPOINT mutation").expect("savepoint");
    }
    conn.execute_batch("UPDATE pad SET n = n + 1")
        .expect("rewrite");
    let sql = if returning {
        "UPDATE blocks SET refcount = refcount + 1 WHERE hash = ?1 RETURNING id"
    } else {
        "UPDATE blocks SET refcount = refcount + 1 WHERE hash = ?1"
    };
    let mut update = conn.prepare(sql).expect("prepare");
    let start = Instant::now();
    for i in 0..UPDATES {
        let h = hash((i * 7919) % UPDATES);
        if returning {
            let _: i64 = update.query_row([&h], |r| r.get(0)).expect("update");
        } else {
            update.execute([&h]).expect("update");
        }
    }
    let took = start.elapsed();
    drop(update);
    conn.execute_batch("ROLLBACK").expect("rollback");
    took.as_secs_f64() * 1e6 / UPDATES as f64
}

fn main() {
    let dir = tempfile::Builder::new()
        .prefix("sqlite-returning.")
        .tempdir()
        .expect("temp dir");
    println!(
        "| rewritten before, in the same transaction | plain | RETURNING | savepoint | \
         savepoint + RETURNING |\n|---|---:|---:|---:|---:|"
    );
    for pad_rows in [0i64, 12_000, 48_000] {
        let cells: Vec<String> = [(false, false), (false, true), (true, false), (true, true)]
            .iter()
            .map(|&(savepoint, returning)| {
                format!("{:.1} µs", run(dir.path(), pad_rows, savepoint, returning))
            })
            .collect();
        println!(
            "| {pad_rows} rows of 1 KB (~{} MB) | {} |",
            pad_rows / 1000,
            cells.join(" | ")
        );
    }
}
