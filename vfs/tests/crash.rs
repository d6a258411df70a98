//! Crash test: a child process mutates a workspace and is killed with SIGKILL at a random
//! point; the database must open again, pass `check()`, and hold every mutation the child
//! acknowledged.
//!
//! The test binary runs itself as the child (`crash_child`, selected by an environment
//! variable). The child performs a seeded sequence of mutations through the path API and
//! prints `ACK <n> <mutation>` after each call returns. The parent derives the same
//! sequence from the same seed, reads the acknowledgements, kills the child (after some
//! acknowledgement plus a delay, in the middle of a big write, or at a random time after
//! start), reopens the database and compares it with the acknowledged prefix replayed on
//! a model. The mutation in flight may or may not be there: either state is accepted.
//!
//! Rounds take turns among three ways of writing. Plain: the path API, each mutation
//! committed before it returns. Bulk: the same in bulk-load mode, as `fs import` writes
//! (a rollback journal instead of the WAL, `Options::bulk_load`); the parent then first
//! opens the database read-only, which must roll back what the kill cut short before it
//! reads, and see the same tree as the writable open after it. Staged: as a mount
//! writes, with staging on: file writes open the file for the kernel, write its staging
//! file directly (passthrough) and release it, and the store ingests the staged
//! content in the background; a kill lands before, during or after ingestion, and the
//! reopened workspace must hold every released write all the same. A third of those
//! writes are fsync'd and never released, as a database keeps its file open: nothing
//! ingests them but the worker once they are quiet, or the next open.
//!
//! Replay: `VFS_CRASH_SEED=<seed> cargo test -p computer-vfs --test crash`. Timing makes
//! the kill point differ between runs, but the sequence of mutations is the same.
//! `VFS_CRASH_ROUNDS=<n>` runs more rounds.

use computer_vfs::Who;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use std::os::unix::fs::FileExt;

use computer_vfs::{Error, Fs, MkdirOptions, NewNode, OpenFlags, Options, RmOptions, Workspace};

const CHILD_DB_ENV: &str = "VFS_CRASH_CHILD_DB";
const CHILD_SEED_ENV: &str = "VFS_CRASH_CHILD_SEED";
const CHILD_MODE_ENV: &str = "VFS_CRASH_CHILD_MODE";
const SEED_ENV: &str = "VFS_CRASH_SEED";
const ROUNDS_ENV: &str = "VFS_CRASH_ROUNDS";

/// Mutations in one child's sequence; it is normally killed long before the end.
const STEPS: usize = 400;
/// Rounds by default; `VFS_CRASH_ROUNDS` sets another number.
const ROUNDS: u64 = 12;

/// How a round's child writes (see the module's documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Plain,
    Bulk,
    Staged,
}

impl Mode {
    fn of_round(round: u64) -> Mode {
        [Mode::Plain, Mode::Bulk, Mode::Staged][(round % 3) as usize]
    }

    fn name(self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::Bulk => "bulk",
            Mode::Staged => "staged",
        }
    }

    fn from_name(name: &str) -> Mode {
        match name {
            "bulk" => Mode::Bulk,
            "staged" => Mode::Staged,
            _ => Mode::Plain,
        }
    }

    fn options(self, db: &Path) -> Options {
        let mut staging = db.as_os_str().to_owned();
        staging.push(".staging");
        Options {
            bulk_load: self == Mode::Bulk,
            staging_dir: (self == Mode::Staged).then(|| staging.into()),
            ..Options::default()
        }
    }
}

// =====================================================================================
// A seeded sequence of mutations
// =====================================================================================

/// splitmix64: small, seedable, the same in parent and child.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

#[derive(Clone, Debug)]
enum Mutation {
    Write {
        path: String,
        len: u64,
        seed: u64,
    },
    Append {
        path: String,
        len: u64,
        seed: u64,
    },
    WriteAt {
        path: String,
        offset: u64,
        len: u64,
        seed: u64,
    },
    Truncate {
        path: String,
        len: u64,
    },
    Mkdir {
        path: String,
    },
    Rename {
        from: String,
        to: String,
    },
    Remove {
        path: String,
    },
}

impl Mutation {
    fn is_big_write(&self) -> bool {
        matches!(self, Mutation::Write { len, .. } if *len >= 1 << 20)
    }
}

/// Content: compressible text for even seeds, random bytes for odd ones.
fn content(len: u64, seed: u64) -> Vec<u8> {
    let len = len as usize;
    if seed.is_multiple_of(2) {
        let mut out = Vec::with_capacity(len + 64);
        let mut line = 0u64;
        while out.len() < len {
            out.extend_from_slice(format!("{seed:x} line {line} of some text\n").as_bytes());
            line += 1;
        }
        out.truncate(len);
        return out;
    }
    let mut rng = Rng(seed);
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        out.extend_from_slice(&rng.next().to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The workspace as paths: `None` is a directory, `Some(bytes)` a file.
type Tree = BTreeMap<String, Option<Vec<u8>>>;

/// The same with file sizes only: enough to generate valid mutations cheaply.
type Shape = BTreeMap<String, Option<u64>>;

fn new_tree() -> Tree {
    BTreeMap::from([("/".to_string(), None)])
}

fn join(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

fn is_under(path: &str, dir: &str) -> bool {
    path == dir || path.starts_with(&format!("{dir}/"))
}

fn apply_model(tree: &mut Tree, m: &Mutation) {
    match m {
        Mutation::Write { path, len, seed } => {
            tree.insert(path.clone(), Some(content(*len, *seed)));
        }
        Mutation::Append { path, len, seed } => {
            let data = tree.get_mut(path).unwrap().as_mut().unwrap();
            data.extend_from_slice(&content(*len, *seed));
        }
        Mutation::WriteAt {
            path,
            offset,
            len,
            seed,
        } => {
            let data = tree.get_mut(path).unwrap().as_mut().unwrap();
            let (offset, end) = (*offset as usize, (*offset + *len) as usize);
            if data.len() < end {
                data.resize(end, 0);
            }
            data[offset..end].copy_from_slice(&content(*len, *seed));
        }
        Mutation::Truncate { path, len } => {
            let data = tree.get_mut(path).unwrap().as_mut().unwrap();
            data.resize(*len as usize, 0);
        }
        Mutation::Mkdir { path } => {
            tree.insert(path.clone(), None);
        }
        Mutation::Rename { from, to } => {
            let moved: Vec<String> = tree.keys().filter(|p| is_under(p, from)).cloned().collect();
            for path in moved {
                let value = tree.remove(&path).unwrap();
                tree.insert(format!("{to}{}", &path[from.len()..]), value);
            }
        }
        Mutation::Remove { path } => tree.retain(|p, _| !is_under(p, path)),
    }
}

fn apply_shape(shape: &mut Shape, m: &Mutation) {
    let size = |shape: &mut Shape, path: &str| -> u64 { shape[path].unwrap() };
    match m {
        Mutation::Write { path, len, .. } => {
            shape.insert(path.clone(), Some(*len));
        }
        Mutation::Append { path, len, .. } => {
            let old = size(shape, path);
            shape.insert(path.clone(), Some(old + len));
        }
        Mutation::WriteAt {
            path, offset, len, ..
        } => {
            let old = size(shape, path);
            shape.insert(path.clone(), Some(old.max(offset + len)));
        }
        Mutation::Truncate { path, len } => {
            shape.insert(path.clone(), Some(*len));
        }
        Mutation::Mkdir { path } => {
            shape.insert(path.clone(), None);
        }
        Mutation::Rename { from, to } => {
            let moved: Vec<String> = shape
                .keys()
                .filter(|p| is_under(p, from))
                .cloned()
                .collect();
            for path in moved {
                let value = shape.remove(&path).unwrap();
                shape.insert(format!("{to}{}", &path[from.len()..]), value);
            }
        }
        Mutation::Remove { path } => shape.retain(|p, _| !is_under(p, path)),
    }
}

fn apply_real(fs: &Fs, m: &Mutation) -> computer_vfs::Result<()> {
    match m {
        Mutation::Write { path, len, seed } => fs.write_file(path, content(*len, *seed)),
        Mutation::Append { path, len, seed } => fs.append(path, content(*len, *seed)),
        Mutation::WriteAt {
            path,
            offset,
            len,
            seed,
        } => fs.write_at(path, *offset, content(*len, *seed)),
        Mutation::Truncate { path, len } => fs.truncate(path, *len),
        Mutation::Mkdir { path } => fs.mkdir(
            path,
            MkdirOptions {
                recursive: true,
                mode: 0o755,
            },
        ),
        Mutation::Rename { from, to } => fs.rename(from, to),
        Mutation::Remove { path } => fs.rm(
            path,
            RmOptions {
                recursive: true,
                force: false,
            },
        ),
    }
}

/// Where a kernel write lands in its file.
enum At {
    /// The file replaced (opened with O_TRUNC, created if missing).
    Whole,
    Offset(u64),
    End,
}

/// A write as the kernel makes it on a mount with passthrough: open for the kernel,
/// write the staging file directly (or through the store where the file is not
/// staged), release.
fn kernel_write(ws: &Workspace, path: &str, at: At, data: &[u8]) -> computer_vfs::Result<()> {
    let fs = ws.fs();
    let flags = OpenFlags {
        truncate: matches!(at, At::Whole),
        ..OpenFlags::WRITE
    };
    let (ino, opened) = match fs.lstat(path) {
        Ok(attr) => (
            attr.ino,
            ws.open_for_kernel(Who::Trusted, attr.ino, flags, true)?,
        ),
        Err(Error::NotFound(_)) if matches!(at, At::Whole) => {
            let (dir, name) = path.rsplit_once('/').expect("an absolute path");
            let dir = fs.stat(if dir.is_empty() { "/" } else { dir })?;
            let owner = NewNode {
                perm: 0o644,
                uid: 0,
                gid: 0,
            };
            let (attr, opened) =
                ws.create_for_kernel(Who::Trusted, dir.ino, name.as_bytes(), owner, flags, true)?;
            (attr.ino, opened)
        }
        Err(err) => return Err(err),
    };
    let io = |source| Error::Io {
        path: computer_vfs::ErrorPath::of(path),
        source,
    };
    // Told to the parent, which counts how many writes took the staged path.
    println!(
        "{}",
        if opened.staged.is_some() {
            "STAGED"
        } else {
            "BUFFERED"
        }
    );
    let written = match &opened.staged {
        Some(staged) => {
            let file = staged.file();
            let offset = match at {
                At::Whole => 0,
                At::Offset(offset) => offset,
                At::End => file.metadata().map_err(io)?.len(),
            };
            file.write_all_at(data, offset).map_err(io)
        }
        None => {
            let offset = match at {
                At::Whole => 0,
                At::Offset(offset) => offset,
                At::End => ws.getattr(ino)?.size,
            };
            ws.write(opened.handle, offset, data).map(drop)
        }
    };
    // A third of the staged writes end as a database's commit does: fsync'd and left
    // open. Their content reaches the store only by the worker (once quiet) or by the
    // recovery at the next open, which must find it all the same.
    if opened.staged.is_some() && data.len().is_multiple_of(3) {
        return written.and_then(|()| ws.fsync(opened.handle, true));
    }
    let released = ws.release(opened.handle);
    written.and(released)
}

fn apply_staged(ws: &Workspace, m: &Mutation) -> computer_vfs::Result<()> {
    match m {
        Mutation::Write { path, len, seed } => {
            kernel_write(ws, path, At::Whole, &content(*len, *seed))
        }
        Mutation::Append { path, len, seed } => {
            kernel_write(ws, path, At::End, &content(*len, *seed))
        }
        Mutation::WriteAt {
            path,
            offset,
            len,
            seed,
        } => kernel_write(ws, path, At::Offset(*offset), &content(*len, *seed)),
        other => apply_real(&ws.fs(), other),
    }
}

/// Whether `actual` is `before` with the file write `m` cut short by the kill, as a
/// kernel write on any filesystem may be: the file holds its old content with a prefix
/// of the new bytes written where they go (a replacing write having emptied the file,
/// or not yet; one to a new path having created it, or not yet). Everything else is as
/// before.
fn cut_write_matches(before: &Tree, actual: &Tree, m: &Mutation) -> bool {
    let (path, at, data) = match m {
        Mutation::Write { path, len, seed } => (path, At::Whole, content(*len, *seed)),
        Mutation::Append { path, len, seed } => (path, At::End, content(*len, *seed)),
        Mutation::WriteAt {
            path,
            offset,
            len,
            seed,
        } => (path, At::Offset(*offset), content(*len, *seed)),
        _ => return false,
    };
    let others = |tree: &Tree| -> Vec<(String, Option<Vec<u8>>)> {
        tree.iter()
            .filter(|(p, _)| *p != path)
            .map(|(p, v)| (p.clone(), v.clone()))
            .collect()
    };
    if others(before) != others(actual) {
        return false;
    }
    let old = before.get(path).cloned().flatten();
    let Some(Some(found)) = actual.get(path) else {
        // Not there: only a write that would have created it, not yet begun.
        return old.is_none() && matches!(at, At::Whole) && !actual.contains_key(path);
    };
    if old.as_ref() == Some(found) {
        return true;
    }
    let (base, offset) = match at {
        At::Whole => (Vec::new(), 0),
        At::End => {
            let base = old.unwrap_or_default();
            let end = base.len();
            (base, end)
        }
        At::Offset(offset) => (old.unwrap_or_default(), offset as usize),
    };
    // The longest prefix of the new bytes found in place; a shorter cut would leave
    // old bytes equal to the new ones there, which this prefix covers too.
    let written = (0..data.len())
        .take_while(|&i| found.get(offset + i) == Some(&data[i]))
        .count();
    let mut expected = base;
    if written > 0 {
        let end = offset + written;
        if expected.len() < end {
            expected.resize(end, 0);
        }
        expected[offset..end].copy_from_slice(&data[..written]);
    }
    expected == *found
}

/// Sizes: mostly small, some medium, a few of several MiB, some of them larger than one
/// ingestion batch (4 MiB), which ingestion and recovery store in several transactions.
fn size(rng: &mut Rng) -> u64 {
    match rng.below(20) {
        0..=11 => rng.below(8 << 10),
        12..=17 => rng.below(512 << 10),
        18 => (1 << 20) + rng.below(3 << 20),
        _ => (5 << 20) + rng.below(4 << 20),
    }
}

/// The next mutation: always valid for `tree`.
fn next_mutation(rng: &mut Rng, tree: &Shape) -> Mutation {
    let dirs: Vec<&String> = tree
        .iter()
        .filter(|(p, v)| v.is_none() && p.matches('/').count() < 4)
        .map(|(p, _)| p)
        .collect();
    let files: Vec<(&String, u64)> = tree
        .iter()
        .filter_map(|(p, v)| v.map(|len| (p, len)))
        .collect();
    let total: u64 = files.iter().map(|f| f.1).sum();
    let fresh = |rng: &mut Rng, prefix: &str| -> Option<String> {
        let dir = rng.pick(&dirs);
        let path = join(dir, &format!("{prefix}{}", rng.below(12)));
        (!tree.contains_key(&path)).then_some(path)
    };
    loop {
        let choice = if total > (40 << 20) {
            // Keep memory and time bounded: shrink.
            *rng.pick(&[4, 6, 6])
        } else {
            rng.below(10)
        };
        let seed = rng.next();
        match choice {
            0 | 1 => {
                let path = if !files.is_empty() && rng.below(2) == 0 {
                    Some(rng.pick(&files).0.clone())
                } else {
                    fresh(rng, "f")
                };
                if let Some(path) = path {
                    let len = size(rng);
                    return Mutation::Write { path, len, seed };
                }
            }
            2 if !files.is_empty() => {
                let path = rng.pick(&files).0.clone();
                let len = rng.below(64 << 10);
                return Mutation::Append { path, len, seed };
            }
            3 if !files.is_empty() => {
                let &(path, old) = rng.pick(&files);
                let offset = rng.below(old + (256 << 10));
                let len = 1 + rng.below(128 << 10);
                let path = path.clone();
                return Mutation::WriteAt {
                    path,
                    offset,
                    len,
                    seed,
                };
            }
            4 if !files.is_empty() => {
                let &(path, old) = rng.pick(&files);
                let len = rng.below(old + old / 2 + 4096);
                return Mutation::Truncate {
                    path: path.clone(),
                    len,
                };
            }
            5 => {
                if let Some(path) = fresh(rng, "d") {
                    return Mutation::Mkdir { path };
                }
            }
            6 => {
                let victims: Vec<&String> = tree.keys().filter(|p| *p != "/").collect();
                if !victims.is_empty() {
                    let path = rng.pick(&victims).to_string();
                    return Mutation::Remove { path };
                }
            }
            7 | 8 => {
                let sources: Vec<&String> = tree.keys().filter(|p| *p != "/").collect();
                if sources.is_empty() {
                    continue;
                }
                let from = rng.pick(&sources).to_string();
                let is_file = tree[&from].is_some();
                // Over an existing file (files only), or to a fresh name.
                let to = if is_file && files.len() > 1 && rng.below(3) == 0 {
                    Some(rng.pick(&files).0.clone())
                } else {
                    fresh(rng, if is_file { "f" } else { "d" })
                };
                match to {
                    Some(to) if to != from && !is_under(&to, &from) => {
                        return Mutation::Rename { from, to }
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }
}

fn plan(seed: u64) -> Vec<Mutation> {
    let mut rng = Rng(seed);
    let mut shape = Shape::from([("/".to_string(), None)]);
    (0..STEPS)
        .map(|_| {
            let m = next_mutation(&mut rng, &shape);
            apply_shape(&mut shape, &m);
            m
        })
        .collect()
}

// =====================================================================================
// The child
// =====================================================================================

/// The child's side: does nothing unless the parent started this process for it.
#[test]
fn crash_child() {
    let Ok(db) = std::env::var(CHILD_DB_ENV) else {
        return;
    };
    let seed: u64 = std::env::var(CHILD_SEED_ENV).unwrap().parse().unwrap();
    let mode = Mode::from_name(&std::env::var(CHILD_MODE_ENV).unwrap_or_default());
    let ws = Workspace::open(&db, mode.options(Path::new(&db))).unwrap();
    let fs = ws.fs();
    let mut out = std::io::stdout();
    writeln!(out, "READY").unwrap();
    out.flush().unwrap();
    for (n, m) in plan(seed).iter().enumerate() {
        let applied = match mode {
            Mode::Staged => apply_staged(&ws, m),
            Mode::Plain | Mode::Bulk => apply_real(&fs, m),
        };
        if let Err(err) = applied {
            panic!("mutation {n} {m:?} failed: {err}");
        }
        writeln!(out, "ACK {n} {m:?}").unwrap();
        out.flush().unwrap();
    }
    writeln!(out, "DONE").unwrap();
    out.flush().unwrap();
}

// =====================================================================================
// The parent
// =====================================================================================

/// When to kill the child.
#[derive(Debug)]
enum KillAt {
    /// After this many acknowledgements, plus a delay.
    Acks(usize, Duration),
    /// A delay after starting the child, whatever it is doing (even creating the database).
    Time(Duration),
}

fn kill_point(rng: &mut Rng, round: u64, plan: &[Mutation]) -> KillAt {
    if Mode::of_round(round) == Mode::Staged && round.is_multiple_of(2) {
        // Just after a write larger than one ingestion batch was released, before the
        // worker ingests it (a second later): the next open must recover it whole.
        let huge: Vec<usize> = (1..60)
            .filter(|&i| matches!(plan[i], Mutation::Write { len, .. } if len > 4 << 20))
            .collect();
        if let Some(&at) = (!huge.is_empty()).then(|| rng.pick(&huge)) {
            return KillAt::Acks(at + 1, Duration::from_micros(rng.below(2_000)));
        }
    }
    match round % 4 {
        0 => KillAt::Acks(1 + rng.below(60) as usize, Duration::ZERO),
        1 => KillAt::Acks(
            1 + rng.below(60) as usize,
            Duration::from_micros(rng.below(3000)),
        ),
        2 => {
            // Just after a big write started.
            let bigs: Vec<usize> = (1..60).filter(|&i| plan[i].is_big_write()).collect();
            let at = if bigs.is_empty() {
                1 + rng.below(60) as usize
            } else {
                *rng.pick(&bigs)
            };
            KillAt::Acks(at, Duration::from_micros(rng.below(40_000)))
        }
        _ => KillAt::Time(Duration::from_micros(rng.below(300_000))),
    }
}

fn snapshot(fs: &Fs) -> Tree {
    let mut tree = Tree::new();
    let mut stack = vec!["/".to_string()];
    while let Some(path) = stack.pop() {
        let attr = fs.lstat(&path).unwrap();
        if attr.is_dir() {
            for entry in fs.readdir(&path).unwrap() {
                stack.push(join(&path, &entry.name_lossy()));
            }
            tree.insert(path, None);
        } else {
            let data = fs.read_file(&path).unwrap();
            tree.insert(path, Some(data));
        }
    }
    tree
}

fn describe(tree: &Tree) -> String {
    tree.iter()
        .map(|(p, v)| match v {
            None => format!("  {p}/\n"),
            Some(d) => format!("  {p} ({} bytes)\n", d.len()),
        })
        .collect()
}

fn first_difference(expected: &Tree, actual: &Tree) -> String {
    for (path, value) in expected {
        match actual.get(path) {
            None => return format!("{path} is missing"),
            Some(v) if v != value => {
                let (e, a) = (value.as_deref(), v.as_deref());
                return match (e, a) {
                    (Some(e), Some(a)) => format!(
                        "{path}: {} bytes expected, {} found, first difference at byte {:?}",
                        e.len(),
                        a.len(),
                        e.iter().zip(a).position(|(x, y)| x != y)
                    ),
                    _ => format!("{path}: wrong kind"),
                };
            }
            _ => {}
        }
    }
    match actual.keys().find(|p| !expected.contains_key(*p)) {
        Some(path) => format!("{path} should not exist"),
        None => "no difference".into(),
    }
}

/// One round: run a child, kill it, verify what it left. Returns a description of what
/// happened.
fn crash_round(dir: &Path, seed: u64, round: u64) -> Result<String, String> {
    let db = dir.join(format!("round{round}.db"));
    let plan = plan(seed);
    let mut rng = Rng(seed ^ 0x5EED);
    let kill_at = kill_point(&mut rng, round, &plan);

    let mode = Mode::of_round(round);
    let bulk = mode == Mode::Bulk;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut command = Command::new(exe);
    command
        .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_DB_ENV, &db)
        .env(CHILD_SEED_ENV, seed.to_string())
        .env(CHILD_MODE_ENV, mode.name());
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawning the child: {e}"))?;
    let pid = child.id() as libc::pid_t;
    let started = Instant::now();
    let timer = match kill_at {
        KillAt::Time(delay) => Some(std::thread::spawn(move || {
            std::thread::sleep(delay);
            // SAFETY: plain kill(2); the child is not reaped before this thread is joined.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        })),
        KillAt::Acks(..) => None,
    };

    let stdout = BufReader::new(child.stdout.take().unwrap());
    let mut acked = 0usize;
    let mut done = false;
    let mut killed = false;
    let mut ready = false;
    let mut staged_writes = 0usize;
    for line in stdout.lines() {
        let Ok(line) = line else { break };
        ready |= line.contains("READY");
        staged_writes += usize::from(line == "STAGED");
        if line.contains("DONE") {
            done = true;
        }
        let Some(at) = line.find("ACK ") else {
            continue;
        };
        let n: usize = line[at + 4..]
            .split(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| format!("bad line from the child: {line:?}"))?;
        if n != acked {
            return Err(format!(
                "acknowledgement {n} out of order, expected {acked}"
            ));
        }
        acked += 1;
        if let KillAt::Acks(count, delay) = kill_at {
            if acked == count && !killed {
                std::thread::sleep(delay);
                child
                    .kill()
                    .map_err(|e| format!("killing the child: {e}"))?;
                killed = true;
                // Keep reading: lines already written were acknowledged.
            }
        }
    }
    if let Some(timer) = timer {
        timer.join().unwrap();
    }
    if mode == Mode::Staged {
        eprintln!("round {round}: {staged_writes} writes through staging files");
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).ok();
    let signalled = std::os::unix::process::ExitStatusExt::signal(&status) == Some(libc::SIGKILL);
    let finished = done && status.success();
    if !(signalled || finished) {
        return Err(format!("the child failed on its own ({status}):\n{stderr}"));
    }

    // A bulk load killed mid-commit leaves a rollback journal: a read-only open rolls
    // it back before it reads, and sees what the writable open below sees. (A child
    // killed before it was ready may have left no workspace yet.)
    let journal = db.with_file_name(format!("round{round}.db-journal"));
    let journal_left = std::fs::metadata(&journal).is_ok_and(|m| m.len() > 0);
    let read_only = if bulk && ready {
        let options = Options {
            create: false,
            read_only: true,
            ..Options::default()
        };
        let ws = Workspace::open(&db, options)
            .map_err(|e| format!("reopening read-only after the crash: {e}"))?;
        let report = ws.check().map_err(|e| format!("read-only check: {e}"))?;
        if !report.is_ok() {
            return Err(format!(
                "read-only check after the crash: {:#?}",
                report.problems
            ));
        }
        Some(snapshot(&ws.fs()))
    } else {
        None
    };
    // The database must open, check clean, and hold every acknowledged mutation. A
    // staged round's reopens as a mount does, with staging on: the recovered files
    // become the inodes' staging files.
    let reopen = match Mode::of_round(round) {
        Mode::Staged => Mode::Staged.options(&db),
        Mode::Plain | Mode::Bulk => Options::default(),
    };
    let ws = Workspace::open(&db, reopen).map_err(|e| format!("reopening after the crash: {e}"))?;
    let report = ws.check().map_err(|e| format!("check: {e}"))?;
    if !report.is_ok() {
        return Err(format!("check after the crash: {:#?}", report.problems));
    }
    let actual = snapshot(&ws.fs());
    if read_only.as_ref().is_some_and(|seen| *seen != actual) {
        return Err(format!(
            "the read-only open saw another tree: {}",
            first_difference(read_only.as_ref().unwrap(), &actual)
        ));
    }
    let mut expected = new_tree();
    for m in &plan[..acked] {
        apply_model(&mut expected, m);
    }
    let mut outcome = "without the mutation in flight";
    if actual != expected {
        let before = first_difference(&expected, &actual);
        let in_flight = plan.get(acked).filter(|_| !done);
        let Some(in_flight) = in_flight else {
            return Err(format!(
                "after {acked} acknowledged mutations: {before}\nexpected:\n{}found:\n{}",
                describe(&expected),
                describe(&actual)
            ));
        };
        let without = expected.clone();
        apply_model(&mut expected, in_flight);
        if actual != expected
            && mode == Mode::Staged
            && cut_write_matches(&without, &actual, in_flight)
        {
            return Ok(format!(
                "staged, kill {kill_at:?}: {acked} acknowledged, state matches part of the \
                 write in flight"
            ));
        }
        if actual != expected {
            return Err(format!(
                "after {acked} acknowledged mutations (in flight: {in_flight:?}):\n\
                 without it: {before}\nwith it: {}\nfound:\n{}",
                first_difference(&expected, &actual),
                describe(&actual)
            ));
        }
        outcome = "with the mutation in flight";
    }
    Ok(format!(
        "{}kill {kill_at:?} after {:?}: {acked} acknowledged, state matches {outcome}{}",
        match (mode, journal_left) {
            (Mode::Bulk, true) => "bulk load, a journal left, ",
            (Mode::Bulk, false) => "bulk load, ",
            (Mode::Staged, _) => "staged, ",
            (Mode::Plain, _) => "",
        },
        started.elapsed(),
        if done { " (the child finished)" } else { "" }
    ))
}

#[test]
fn crash_recovery() {
    if std::env::var(CHILD_DB_ENV).is_ok() {
        return;
    }
    let base = match std::env::var(SEED_ENV) {
        Ok(seed) => seed.parse().expect("VFS_CRASH_SEED is a number"),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    };
    let rounds = std::env::var(ROUNDS_ENV)
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(ROUNDS);
    let dir = tempfile::tempdir().unwrap();
    for round in 0..rounds {
        let seed = base.wrapping_add(round);
        match crash_round(dir.path(), seed, round) {
            Ok(summary) => eprintln!("round {round} (seed {seed}): {summary}"),
            Err(err) => panic!(
                "crash round {round} failed; replay with {SEED_ENV}={base}\n(round seed {seed}): {err}"
            ),
        }
    }
}

// =====================================================================================
// A staging file recycled before its unbinding is durable
// =====================================================================================

const RECYCLE_CHILD_ENV: &str = "VFS_RECYCLE_CHILD_DB";

/// As a mount opens the store: batched commits, staging on.
fn batching_staged(db: &Path) -> Options {
    Options {
        commit_delay: Some(Duration::from_secs(10)),
        ..Mode::Staged.options(db)
    }
}

/// The child's side of [`an_fsynced_file_survives_the_recycling_of_its_staging_file`].
#[test]
fn recycle_child() {
    let Ok(db) = std::env::var(RECYCLE_CHILD_ENV) else {
        return;
    };
    let ws = Workspace::open(&db, batching_staged(Path::new(&db))).unwrap();
    let write = |name: &[u8], content: &[u8], sync: bool| {
        let (_, opened) = ws
            .create_for_kernel(
                Who::Trusted,
                computer_vfs::InodeNo::ROOT,
                name,
                NewNode::new(0o644),
                OpenFlags::WRITE,
                true,
            )
            .unwrap();
        let staged = opened.staged.as_ref().expect("staging is on");
        staged.file().write_all_at(content, 0).unwrap();
        if sync {
            ws.fsync(opened.handle, false).unwrap();
        }
        ws.release(opened.handle).unwrap();
    };
    write(b"f", b"fsynced", true);
    // The worker ingests `f` a second after its release and recycles its small staging
    // file; the next create takes that file from the pool.
    std::thread::sleep(Duration::from_millis(2500));
    write(b"g", b"another file's bytes", false);
    println!("READY");
    std::io::stdout().flush().unwrap();
    std::thread::sleep(Duration::from_secs(60));
}

/// A file fsync'd through its staging file and ingested in a batch not yet committed:
/// its staging file must not be emptied and handed to another file before that batch
/// is durable, or a crash brings back the binding and the next open ingests the other
/// file's bytes (or none) as this file's content.
#[test]
fn an_fsynced_file_survives_the_recycling_of_its_staging_file() {
    if std::env::var(RECYCLE_CHILD_ENV).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ws.db");
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([
            "--exact",
            "recycle_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(RECYCLE_CHILD_ENV, &db)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let ready = stdout
        .lines()
        .map_while(|line| line.ok())
        .any(|l| l.ends_with("READY"));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(ready, "the child ended before it was ready");
    let ws = Workspace::open(&db, batching_staged(&db)).unwrap();
    assert_eq!(ws.fs().read_file("/f").unwrap(), b"fsynced");
    assert!(ws.check().unwrap().problems.is_empty());
}
