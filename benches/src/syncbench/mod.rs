//! syncbench: bytes on the wire and time to sync, over the real RPC transport.
//!
//! One process holds an authoritative workspace on disk served by
//! [`computer_sync::rpc::serve`] on its own thread, a byte-counting [`proxy`] in front of
//! it, and replicas that connect through the proxy and sync with
//! [`computer_sync::Replica`], each call metered ([`meter`]). The scenarios of issue 4:
//! (a) a fresh replica pulls a tree of many files ([`tree`], npm-like), (b) one byte
//! changed in the middle of a big random file, (c) many small files changed, (d) bytes
//! inserted at the head of the big file; (b) to (d) both ways (made on the replica and
//! pushed, made on the server and pulled). `src/bin/syncbench.rs` is the command line;
//! `benches/README.md` tells how to run it.

pub mod meter;
pub mod proxy;
pub mod report;
pub mod tree;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _, Result};
use computer_sync::rpc::{
    connect_with, run_local, serve, ConnectOptions, ServeOptions, ServerSocket,
};
use computer_sync::{Address, Authority, BatchLimits, ClientInfo, Replica, SyncReport};
use computer_vfs::{MkdirOptions, Options, Workspace};

use meter::{CallLog, Metered};
use proxy::Proxy;
use report::thousands;

const TOKEN: &[u8] = b"syncbench-token";

/// What to run.
#[derive(Clone, Debug)]
pub struct Config {
    /// Files of the generated tree (ignored with `tree_dir`).
    pub files: usize,
    /// Import this host directory as the tree instead of generating one.
    pub tree_dir: Option<PathBuf>,
    /// Size of the big random file of (b) and (d).
    pub big_bytes: usize,
    /// Small files changed in (c), each way.
    pub small_files: usize,
    /// Bytes inserted at the head in (d).
    pub head_bytes: usize,
    /// Repetitions of (b) to (d) and of the no-op sync, each way.
    pub reps: usize,
    /// Fresh replicas pulling the tree in (a).
    pub tree_reps: usize,
    pub seed: u64,
    /// TCP on loopback instead of a Unix socket.
    pub tcp: bool,
    /// Parent of the run's temp dir (default: the system temp dir).
    pub work_dir: Option<PathBuf>,
    /// Which scenarios: letters of "abcd", and "m" (the tree's top directory renamed on
    /// the server, then a no-op sync).
    pub scenarios: String,
    /// Compare every file of (a) on both sides (else every 53rd, and the counts).
    pub verify_all: bool,
    /// Progress on stderr.
    pub progress: bool,
}

impl Config {
    /// Issue 4's sizes.
    pub fn full() -> Config {
        Config {
            files: 36_000,
            tree_dir: None,
            big_bytes: 64 << 20,
            small_files: 1000,
            head_bytes: 100,
            reps: 5,
            tree_reps: 1,
            seed: 1,
            tcp: false,
            work_dir: None,
            scenarios: "abcdm".into(),
            verify_all: false,
            progress: true,
        }
    }

    /// Tiny sizes: every scenario in a few seconds (a smoke test).
    pub fn quick() -> Config {
        Config {
            files: 400,
            big_bytes: 2 << 20,
            small_files: 40,
            reps: 2,
            verify_all: true,
            ..Config::full()
        }
    }

    fn runs(&self, scenario: char) -> bool {
        self.scenarios.contains(scenario)
    }
}

/// One measured sync.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    /// Bytes on the wire during the sync, replica to server and back (the hello, made
    /// before, is apart).
    pub up: u64,
    pub down: u64,
    pub hello_up: u64,
    pub hello_down: u64,
    /// Wall time of the sync (pull and push), and of the pull alone.
    pub time: Duration,
    pub pull: Duration,
    pub report: SyncReport,
    pub calls: CallLog,
}

impl Sample {
    pub fn wire(&self) -> u64 {
        self.up + self.down
    }

    pub fn push(&self) -> Duration {
        self.time.saturating_sub(self.pull)
    }
}

/// One scenario, one direction, all its repetitions.
#[derive(Clone, Debug)]
pub struct Row {
    pub id: &'static str,
    pub name: String,
    /// Bytes that changed, and the size of the files they changed in.
    pub changed: u64,
    pub touched: u64,
    /// Files changed.
    pub files: u64,
    pub samples: Vec<Sample>,
}

impl Row {
    /// The sample of median time (the lower middle one for an even count).
    pub fn median(&self) -> &Sample {
        let mut order: Vec<&Sample> = self.samples.iter().collect();
        order.sort_by_key(|s| s.time);
        order[(order.len() - 1) / 2]
    }

    pub fn time_range(&self) -> (Duration, Duration) {
        let min = self
            .samples
            .iter()
            .map(|s| s.time)
            .min()
            .unwrap_or_default();
        let max = self
            .samples
            .iter()
            .map(|s| s.time)
            .max()
            .unwrap_or_default();
        (min, max)
    }
}

/// The tree of (a) as the server stores it.
#[derive(Clone, Debug, Default)]
pub struct TreeInfo {
    pub source: String,
    /// The tree's top directory in the workspace.
    pub root: String,
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub bytes: u64,
    pub unique_bytes: u64,
    pub stored_bytes: u64,
    pub blocks: u64,
    pub duplicate_files: u64,
    /// File sizes: median, 90th and 99th percentile, largest.
    pub size_percentiles: [u64; 4],
    pub write_time: Duration,
}

/// Everything a run measured.
#[derive(Clone, Debug, Default)]
pub struct Results {
    pub rows: Vec<Row>,
    /// How long reading the change log takes, on each side, after (a).
    pub log_scans: Vec<LogScan>,
    pub tree: Option<TreeInfo>,
    pub transport: &'static str,
    pub big_bytes: usize,
    pub reps: usize,
}

/// One side's change log read in-process (no RPC) with `Workspace::changes_after`, as a
/// sync pages through it: every page of [`BatchLimits::default`]'s size from the start,
/// then pages of one entry from a few places.
#[derive(Clone, Debug, Default)]
pub struct LogScan {
    pub side: &'static str,
    pub entries: usize,
    pub revision: u64,
    /// Each full page: its time and entries.
    pub pages: Vec<(Duration, usize)>,
    /// (entries after the cursor, time of a page of 1 entry, time of a full page there).
    pub probes: Vec<(usize, Duration, Duration)>,
}

impl LogScan {
    pub fn total(&self) -> Duration {
        self.pages.iter().map(|p| p.0).sum()
    }
}

/// Reads `workspace`'s whole change log as a sync would (see [`LogScan`]).
fn scan_log(side: &'static str, workspace: &Workspace) -> Result<LogScan> {
    let limits = BatchLimits::default();
    let mut scan = LogScan {
        side,
        revision: workspace.revision()?.0,
        ..LogScan::default()
    };
    let mut cursors = vec![computer_vfs::Cursor::START];
    loop {
        let from = cursors.last().expect("starts with one").clone();
        let start = Instant::now();
        let page = workspace.changes_after(&from, limits.entries as usize, limits.bytes)?;
        scan.pages.push((start.elapsed(), page.entries.len()));
        scan.entries += page.entries.len();
        cursors.push(page.next);
        if page.complete {
            break;
        }
    }
    let pages = scan.pages.len();
    let mut at: Vec<usize> = vec![0, pages / 2, pages * 9 / 10];
    at.dedup();
    for index in at {
        let after: usize = scan.pages[index..].iter().map(|p| p.1).sum();
        let start = Instant::now();
        workspace.changes_after(&cursors[index], 1, limits.bytes)?;
        let one = start.elapsed();
        scan.probes.push((after, one, scan.pages[index].0));
    }
    Ok(scan)
}

/// Progress lines on stderr.
struct Progress {
    start: Instant,
    on: bool,
}

impl Progress {
    fn note(&self, message: impl AsRef<str>) {
        if self.on {
            eprintln!(
                "syncbench [{:7.1}s] {}",
                self.start.elapsed().as_secs_f64(),
                message.as_ref()
            );
        }
    }
}

/// The server on its own thread and event loop, stopped when dropped.
struct ServerThread {
    address: Address,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ServerThread {
    fn start(workspace: &Workspace, listen: Address) -> Result<ServerThread> {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (bound, is_bound) = std::sync::mpsc::channel();
        let authority = Authority::new(workspace.clone(), TOKEN.to_vec());
        let thread = std::thread::Builder::new()
            .name("sync-server".into())
            .spawn(move || {
                let served = run_local(async move {
                    let socket = match ServerSocket::bind(&listen).await {
                        Ok(socket) => socket,
                        Err(error) => {
                            let _ = bound.send(Err(error.to_string()));
                            return;
                        }
                    };
                    let address = socket.local_address().map_err(|e| e.to_string());
                    let _ = bound.send(address);
                    serve(socket, authority, ServeOptions::default(), async {
                        let _ = stopped.await;
                    })
                    .await;
                });
                if let Err(error) = served {
                    eprintln!("syncbench: the server's runtime failed: {error}");
                }
            })?;
        let address = match is_bound.recv() {
            Ok(Ok(address)) => address,
            Ok(Err(error)) => bail!("the server could not listen: {error}"),
            Err(_) => bail!("the server thread ended before listening"),
        };
        Ok(ServerThread {
            address,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A file of the tree: workspace path and size.
#[derive(Clone, Debug)]
struct TreeFile {
    path: String,
    size: u64,
}

struct Bench<'c> {
    config: &'c Config,
    progress: Progress,
    server: Workspace,
    proxy: Proxy,
    work: PathBuf,
}

/// Runs the scenarios `config` asks for.
pub fn run(config: &Config) -> Result<Results> {
    ensure!(config.reps >= 1, "--reps must be at least 1");
    ensure!(config.tree_reps >= 1, "--tree-reps must be at least 1");
    ensure!(
        config.big_bytes >= 1 << 20,
        "the big file must be at least 1 MiB"
    );
    let work = match &config.work_dir {
        Some(parent) => tempfile::Builder::new()
            .prefix("syncbench.")
            .tempdir_in(parent)?,
        None => tempfile::Builder::new().prefix("syncbench.").tempdir()?,
    };
    let progress = Progress {
        start: Instant::now(),
        on: config.progress,
    };
    progress.note(format!("temp dir {}", work.path().display()));
    let server = Workspace::open(work.path().join("server.db"), Options::default())
        .context("opening the server's workspace")?;
    let listen = if config.tcp {
        Address::Tcp("127.0.0.1:0".into())
    } else {
        Address::Unix(work.path().join("server.sock"))
    };
    // Dropped in reverse order: the proxy, then the server, then the workspace.
    let server_thread = ServerThread::start(&server, listen)?;
    let proxy = Proxy::start(&server_thread.address, &work.path().join("proxy.sock"))?;
    progress.note(format!(
        "server on {}, proxy on {}",
        server_thread.address,
        proxy.address()
    ));
    let bench = Bench {
        config,
        progress,
        server,
        proxy,
        work: work.path().to_owned(),
    };
    let results = bench.run_all()?;
    drop(bench);
    drop(server_thread);
    Ok(results)
}

impl Bench<'_> {
    fn run_all(&self) -> Result<Results> {
        let config = self.config;
        let mut results = Results {
            transport: if config.tcp {
                "TCP on loopback"
            } else {
                "Unix socket"
            },
            big_bytes: config.big_bytes,
            reps: config.reps,
            ..Results::default()
        };
        let mut files = Vec::new();
        if config.runs('a') || config.runs('c') || config.runs('m') {
            let (info, list) = self.make_tree()?;
            results.tree = Some(info);
            files = list;
        }

        // (a): fresh replicas pull the tree; the last one stays for the rest.
        let mut replica: Option<(Workspace, String)> = None;
        if config.runs('a') {
            let tree = results.tree.as_ref().expect("made above");
            let mut row = Row {
                id: "a",
                name: format!(
                    "fresh replica of a {}-file tree (pull)",
                    thousands(tree.files)
                ),
                changed: tree.bytes,
                touched: tree.bytes,
                files: tree.files,
                samples: Vec::new(),
            };
            for rep in 0..config.tree_reps {
                if let Some((old, _)) = replica.take() {
                    drop(old);
                    let _ = std::fs::remove_dir_all(self.work.join(format!("fresh-{}", rep - 1)));
                }
                let dir = self.work.join(format!("fresh-{rep}"));
                std::fs::create_dir(&dir)?;
                let local = Workspace::open(dir.join("replica.db"), Options::default())?;
                let peer = format!("fresh-{rep}");
                self.progress.note(format!(
                    "(a) rep {}/{}: a fresh replica pulls the tree",
                    rep + 1,
                    config.tree_reps
                ));
                let sample = self.sync(&local, &peer)?;
                self.progress.note(format!(
                    "(a) {} entries, {} blocks, {} up / {} down in {:.2} s",
                    sample.report.pulled,
                    sample.report.blocks_in,
                    report::bytes(sample.up),
                    report::bytes(sample.down),
                    sample.time.as_secs_f64()
                ));
                self.verify_tree(&local, &files)?;
                row.samples.push(sample);
                replica = Some((local, peer));
            }
            results.rows.push(row);
            let local = &replica.as_ref().expect("one rep at least").0;
            for (side, workspace) in [("server", &self.server), ("replica", local)] {
                self.progress
                    .note(format!("reading the {side}'s change log in-process"));
                let scan = scan_log(side, workspace)?;
                self.progress.note(format!(
                    "  {} entries in {} pages, {:.2} s",
                    scan.entries,
                    scan.pages.len(),
                    scan.total().as_secs_f64()
                ));
                results.log_scans.push(scan);
            }
        }
        let (local, peer) = match replica {
            Some(replica) => replica,
            None => {
                let dir = self.work.join("replica");
                std::fs::create_dir(&dir)?;
                let local = Workspace::open(dir.join("replica.db"), Options::default())?;
                self.progress
                    .note("a replica pulls the tree (not measured)");
                self.sync(&local, "replica")?;
                (local, "replica".to_owned())
            }
        };
        let replica = Side {
            workspace: local,
            peer,
        };

        results
            .rows
            .push(self.noop(&replica, "no change (a sync that finds nothing)")?);
        if config.runs('b') || config.runs('d') {
            results.rows.push(self.new_big_file(&replica)?);
        }
        if config.runs('b') {
            results.rows.push(self.one_byte(&replica, true)?);
            results.rows.push(self.one_byte(&replica, false)?);
        }
        if config.runs('c') {
            let small = small_files(&files, config.small_files);
            ensure!(
                !small.is_empty(),
                "the tree has no small files to change for (c)"
            );
            let (push, pull): (Vec<_>, Vec<_>) =
                small.iter().enumerate().partition(|(i, _)| i % 2 == 0);
            let push: Vec<&TreeFile> = push.into_iter().map(|(_, f)| *f).collect();
            let pull: Vec<&TreeFile> = pull.into_iter().map(|(_, f)| *f).collect();
            results.rows.push(self.small_files(&replica, &push, true)?);
            results.rows.push(self.small_files(&replica, &pull, false)?);
        }
        if config.runs('d') {
            results.rows.push(self.head_insert(&replica, true)?);
            results.rows.push(self.head_insert(&replica, false)?);
        }
        if config.runs('m') {
            let tree = results.tree.as_ref().expect("made for (m) too");
            results.rows.push(self.move_tree(&replica, tree)?);
            results.rows.push(self.noop(
                &replica,
                "no change, right after (m) (the cursor is inside the move's revision)",
            )?);
        }
        Ok(results)
    }

    /// (m): the tree's top directory renamed on the server; the replica pulls.
    fn move_tree(&self, replica: &Side, tree: &TreeInfo) -> Result<Row> {
        let to = format!("{}.moved", tree.root);
        self.progress
            .note(format!("(m) {} renamed to {to} on the server", tree.root));
        self.server.fs().rename(&tree.root, &to)?;
        let sample = self.sync(&replica.workspace, &replica.peer)?;
        ensure!(
            !replica.workspace.fs().exists(&tree.root)?,
            "the old name is still there"
        );
        let (ours, theirs) = (replica.workspace.stats()?, self.server.stats()?);
        ensure!(
            (ours.files, ours.logical_bytes) == (theirs.files, theirs.logical_bytes),
            "the replica's tree differs after the move"
        );
        Ok(Row {
            id: "m",
            name: format!(
                "the tree's top directory renamed ({} files below it), made on the server, pulled",
                thousands(tree.files)
            ),
            changed: 0,
            touched: tree.bytes,
            files: tree.files,
            samples: vec![sample],
        })
    }

    /// Writes the tree into the server: generated, or imported from `--tree`.
    fn make_tree(&self) -> Result<(TreeInfo, Vec<TreeFile>)> {
        let fs = self.server.fs();
        let start = Instant::now();
        let mut info = TreeInfo::default();
        let mut list = Vec::new();
        if let Some(dir) = &self.config.tree_dir {
            self.progress
                .note(format!("importing {} into /tree", dir.display()));
            let summary = computer_vfs::transfer::import(&fs, dir, "/tree", &mut |_| {})?;
            info.source = format!("`{}` imported", dir.display());
            info.root = "/tree".into();
            info.symlinks = summary.symlinks;
            list_host_files(dir, "/tree", &mut list)?;
        } else {
            let spec = tree::TreeSpec::npm(self.config.files, self.config.seed);
            let tree = tree::generate(&spec, "/node_modules");
            self.progress.note(format!(
                "writing a generated tree: {} files, {} directories, {} symlinks, {}",
                tree.files,
                tree.dirs,
                tree.symlinks,
                report::bytes(tree.bytes)
            ));
            let dir_options = MkdirOptions {
                recursive: true,
                mode: 0o755,
            };
            let mut written = 0usize;
            for op in &tree.ops {
                match op {
                    tree::Op::Mkdir(path) => fs.mkdir(path, dir_options)?,
                    tree::Op::Write(path, content) => {
                        fs.write_file(path, content.bytes())?;
                        list.push(TreeFile {
                            path: path.clone(),
                            size: content.len() as u64,
                        });
                        written += 1;
                        if written.is_multiple_of(5000) {
                            self.progress
                                .note(format!("  {written} of {} files", tree.files));
                        }
                    }
                    tree::Op::Symlink(target, path) => fs.symlink(target, path)?,
                }
            }
            info.source = format!(
                "generated npm-like `node_modules` (seed {})",
                self.config.seed
            );
            info.duplicate_files = tree.duplicate_files as u64;
            info.root = "/node_modules".into();
        }
        info.write_time = start.elapsed();
        let mut sizes: Vec<u64> = list.iter().map(|f| f.size).collect();
        sizes.sort_unstable();
        if let Some(&largest) = sizes.last() {
            let at = |q: f64| sizes[((sizes.len() - 1) as f64 * q) as usize];
            info.size_percentiles = [at(0.5), at(0.9), at(0.99), largest];
        }
        let stats = self.server.stats()?;
        info.files = stats.files;
        info.dirs = stats.directories;
        info.symlinks = stats.symlinks;
        info.bytes = stats.logical_bytes;
        info.unique_bytes = stats.unique_bytes;
        info.stored_bytes = stats.stored_bytes;
        info.blocks = stats.blocks;
        self.progress.note(format!(
            "tree written in {:.1} s: {} files, {} dirs, {} stored as {} in {} blocks",
            info.write_time.as_secs_f64(),
            info.files,
            info.dirs,
            report::bytes(info.bytes),
            report::bytes(info.stored_bytes),
            info.blocks
        ));
        Ok((info, list))
    }

    /// Connects a new session through the proxy, syncs `local` (pull, then push) as
    /// `peer`, closes the connection, and returns what it measured.
    fn sync(&self, local: &Workspace, peer: &str) -> Result<Sample> {
        let counters = self.proxy.counters().clone();
        counters.wait_closed(Duration::from_secs(30))?;
        let (up0, down0) = counters.snapshot();
        let client = ClientInfo {
            replica_id: local.id().to_owned(),
            peer: peer.to_owned(),
        };
        let options = ConnectOptions {
            // Measure a slow call rather than fail on it (the default is 60 s).
            call_timeout: Duration::from_secs(3600),
            ..ConnectOptions::default()
        };
        let address = self.proxy.address().clone();
        let mut sample = run_local(async {
            let (upstream, info) = connect_with(&address, TOKEN, client, options).await?;
            let replica = Replica::attach(local.clone(), &info, BatchLimits::default())?;
            // Let the hello's trailing messages out before counting the sync.
            tokio::time::sleep(Duration::from_millis(5)).await;
            let (hello_up, hello_down) = counters.snapshot();
            let metered = Metered::new(&upstream, &counters);
            let mut report = SyncReport::default();
            let start = Instant::now();
            replica
                .pull(&metered, &mut report)
                .await
                .context("pulling")?;
            let pull = start.elapsed();
            replica
                .push(&metered, &mut report)
                .await
                .context("pushing")?;
            let time = start.elapsed();
            anyhow::Ok(Sample {
                up: 0,
                down: 0,
                hello_up: hello_up - up0,
                hello_down: hello_down - down0,
                time,
                pull,
                report,
                calls: metered.into_log(),
            })
        })??;
        // The connection is closed (the runtime is gone): every byte of it is counted.
        counters.wait_closed(Duration::from_secs(30))?;
        let (up1, down1) = counters.snapshot();
        sample.up = up1 - up0 - sample.hello_up;
        sample.down = down1 - down0 - sample.hello_down;
        ensure!(
            sample.report.conflicts.is_empty(),
            "the sync resolved conflicts: {:?}",
            sample.report.conflicts
        );
        Ok(sample)
    }

    /// The replica holds the server's tree: same counts, same bytes, same content.
    fn verify_tree(&self, local: &Workspace, files: &[TreeFile]) -> Result<()> {
        let (ours, theirs) = (local.stats()?, self.server.stats()?);
        ensure!(
            (
                ours.files,
                ours.directories,
                ours.symlinks,
                ours.logical_bytes
            ) == (
                theirs.files,
                theirs.directories,
                theirs.symlinks,
                theirs.logical_bytes
            ),
            "the replica's tree differs: {ours:?} vs the server's {theirs:?}"
        );
        let step = if self.config.verify_all { 1 } else { 53 };
        for file in files.iter().step_by(step) {
            same_file(&self.server, local, &file.path)?;
        }
        Ok(())
    }

    fn sides<'s>(&'s self, replica: &'s Side, on_replica: bool) -> (&'s Workspace, &'s Workspace) {
        if on_replica {
            (&replica.workspace, &self.server)
        } else {
            (&self.server, &replica.workspace)
        }
    }

    fn direction(on_replica: bool) -> &'static str {
        if on_replica {
            "made on the replica, pushed"
        } else {
            "made on the server, pulled"
        }
    }

    fn noop(&self, replica: &Side, name: &str) -> Result<Row> {
        self.progress.note(format!("no-op syncs: {name}"));
        let mut row = Row {
            id: "-",
            name: name.into(),
            changed: 0,
            touched: 0,
            files: 0,
            samples: Vec::new(),
        };
        for _ in 0..self.config.reps {
            let sample = self.sync(&replica.workspace, &replica.peer)?;
            ensure!(
                !sample.report.moved(),
                "a no-op sync moved {:?}",
                sample.report
            );
            row.samples.push(sample);
        }
        Ok(row)
    }

    fn new_big_file(&self, replica: &Side) -> Result<Row> {
        let size = self.config.big_bytes;
        self.progress.note(format!(
            "a new {} random file on the server",
            report::bytes(size as u64)
        ));
        let data = tree::random_bytes(size, self.config.seed ^ 0xB16);
        self.server.fs().write_file(BIG, &data)?;
        let sample = self.sync(&replica.workspace, &replica.peer)?;
        same_file(&self.server, &replica.workspace, BIG)?;
        Ok(Row {
            id: "+",
            name: format!("new {} random file (pull)", report::bytes(size as u64)),
            changed: size as u64,
            touched: size as u64,
            files: 1,
            samples: vec![sample],
        })
    }

    fn one_byte(&self, replica: &Side, on_replica: bool) -> Result<Row> {
        let size = self.config.big_bytes as u64;
        let (writer, reader) = self.sides(replica, on_replica);
        self.progress.note(format!(
            "(b) one byte in the middle, {}",
            Self::direction(on_replica)
        ));
        let mut row = Row {
            id: "b",
            name: format!(
                "1 byte changed in the middle of a {} file, {}",
                report::bytes(size),
                Self::direction(on_replica)
            ),
            changed: 1,
            touched: size,
            files: 1,
            samples: Vec::new(),
        };
        for rep in 0..self.config.reps as u64 {
            // A new place each time, so no content ever comes back.
            let offset = if on_replica {
                size / 2 + rep * 4099
            } else {
                size / 2 - 1 - rep * 4099
            };
            let old = writer.fs().read_range(BIG, offset, 1)?;
            writer.fs().write_at(BIG, offset, [old[0] ^ 0x5A])?;
            let sample = self.sync(&replica.workspace, &replica.peer)?;
            ensure!(
                reader.fs().read_range(BIG, offset, 1)? == [old[0] ^ 0x5A],
                "the changed byte did not arrive"
            );
            row.samples.push(sample);
        }
        ensure!(
            reader.fs().stat(BIG)?.size == size,
            "the file's size changed"
        );
        Ok(row)
    }

    fn small_files(&self, replica: &Side, files: &[&TreeFile], on_replica: bool) -> Result<Row> {
        let (writer, reader) = self.sides(replica, on_replica);
        self.progress.note(format!(
            "(c) {} small files changed, {}",
            files.len(),
            Self::direction(on_replica)
        ));
        let mut row = Row {
            id: "c",
            name: format!(
                "{} small files changed ({EDIT_BYTES} B inserted in the middle of each), {}",
                thousands(files.len() as u64),
                Self::direction(on_replica)
            ),
            changed: 0,
            touched: 0,
            files: files.len() as u64,
            samples: Vec::new(),
        };
        for rep in 0..self.config.reps {
            let (mut changed, mut touched) = (0u64, 0u64);
            for (i, file) in files.iter().enumerate() {
                let mut data = writer.fs().read_file(&file.path)?;
                let edit = edit_line(rep, i, on_replica);
                let at = data.len() / 2;
                data.splice(at..at, edit.iter().copied());
                changed += edit.len() as u64;
                touched += data.len() as u64;
                writer.fs().write_file(&file.path, &data)?;
            }
            let sample = self.sync(&replica.workspace, &replica.peer)?;
            for file in files {
                same_file(writer, reader, &file.path)?;
            }
            row.changed = changed;
            row.touched = touched;
            row.samples.push(sample);
        }
        Ok(row)
    }

    fn head_insert(&self, replica: &Side, on_replica: bool) -> Result<Row> {
        let (writer, reader) = self.sides(replica, on_replica);
        let head = self.config.head_bytes;
        self.progress.note(format!(
            "(d) {head} bytes inserted at the head, {}",
            Self::direction(on_replica)
        ));
        let mut row = Row {
            id: "d",
            name: String::new(),
            changed: head as u64,
            touched: 0,
            files: 1,
            samples: Vec::new(),
        };
        for rep in 0..self.config.reps as u64 {
            let old = writer.fs().read_file(BIG)?;
            let seed = self.config.seed ^ ((rep + 1) << 8) ^ u64::from(on_replica);
            let mut data = tree::random_bytes(head, seed);
            data.extend_from_slice(&old);
            drop(old);
            // As an editor saves: the whole file rewritten.
            writer.fs().write_file(BIG, &data)?;
            let sample = self.sync(&replica.workspace, &replica.peer)?;
            let size = data.len() as u64;
            ensure!(
                reader.fs().stat(BIG)?.size == size,
                "the file's size did not arrive"
            );
            for offset in [0, size / 2, size - 4096] {
                ensure!(
                    reader.fs().read_range(BIG, offset, 4096)?
                        == data[offset as usize..(offset as usize + 4096).min(data.len())],
                    "the file differs at {offset}"
                );
            }
            row.touched = size;
            row.samples.push(sample);
        }
        row.name = format!(
            "{head} B inserted at the head of a {} file (whole file rewritten), {}",
            report::bytes(self.config.big_bytes as u64),
            Self::direction(on_replica)
        );
        Ok(row)
    }
}

/// The big file of (b) and (d).
const BIG: &str = "/big.bin";

/// Bytes each small file of (c) gets inserted.
pub const EDIT_BYTES: usize = 32;

/// A line of exactly [`EDIT_BYTES`] bytes, new for every repetition and file.
fn edit_line(rep: usize, file: usize, on_replica: bool) -> Vec<u8> {
    let side = if on_replica { 'r' } else { 's' };
    let mut line = format!("/* edit {side}{rep} f{file} */").into_bytes();
    line.resize(EDIT_BYTES - 1, b' ');
    line.push(b'\n');
    line
}

/// The replica's workspace and the peer name it syncs as.
struct Side {
    workspace: Workspace,
    peer: String,
}

/// Up to `count * 2` small files (64 B to 16 KiB), spread over the tree.
fn small_files(files: &[TreeFile], count: usize) -> Vec<&TreeFile> {
    let small: Vec<&TreeFile> = files
        .iter()
        .filter(|f| (64..=16 << 10).contains(&f.size))
        .collect();
    let want = (count * 2).min(small.len());
    if want == 0 {
        return Vec::new();
    }
    (0..want).map(|i| small[i * small.len() / want]).collect()
}

fn same_file(a: &Workspace, b: &Workspace, path: &str) -> Result<()> {
    let (x, y) = (a.fs().read_file(path)?, b.fs().read_file(path)?);
    ensure!(x == y, "{path} differs between the two sides");
    Ok(())
}

/// The regular files below host `dir`, as paths below `dest` in the workspace.
fn list_host_files(dir: &Path, dest: &str, out: &mut Vec<TreeFile>) -> Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<std::io::Result<_>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let meta = std::fs::symlink_metadata(entry.path())?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        let path = computer_vfs::join(dest, &name);
        if meta.is_dir() {
            list_host_files(&entry.path(), &path, out)?;
        } else if meta.is_file() {
            out.push(TreeFile {
                path,
                size: meta.len(),
            });
        }
    }
    Ok(())
}
