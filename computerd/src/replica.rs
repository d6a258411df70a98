//! The replica side of `computerd mount --remote ADDR --cache DB MOUNTPOINT`, and
//! `computerd sync`.
//!
//! A replica mount serves its cache database through FUSE exactly like a local
//! workspace, while a [`Follower`] keeps the cache in sync with the server. This module
//! is the glue: it turns the command line into follow options, tells the kernel to
//! forget what it cached of every path a pull changed (the mount lets the kernel cache
//! entries and attributes for an hour, which is right only while nobody else writes),
//! and answers `computerd sync` on a control socket beside the cache.
//!
//! The control socket speaks one line each way. Requests: `sync TIMEOUT_MS`,
//! `wait INTENT TIMEOUT_MS`. Answers: the outcome's name (`complete`, `pending`,
//! `lost`, `refused`), then `key=value` fields, `reason=` last (it holds spaces). A
//! pending answer says with `pulled=yes` that the attempt brought everything the server
//! had: only this replica's own changes wait.

use computer_vfs::Who;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use clap::Args;
use computer_sync::{
    AppliedObserver, BacklogLimits, FollowOptions, FollowStatus, Intent, RetryPolicy, SyncClient,
    SyncOutcome,
};
use computer_vfs::{InodeNo, Workspace};
use fuser::{INodeNo, Notifier};

use crate::kernel_pages::KernelPages;

use crate::remote;

/// `--remote` and what goes with it.
#[derive(Args, Debug, Clone)]
pub struct RemoteArgs {
    /// Mount a replica of the workspace served at ADDR (a Unix socket path, or
    /// tcp:HOST:PORT) instead of a local database; needs --cache.
    #[arg(long, value_name = "ADDR", requires = "cache")]
    pub remote: Option<String>,
    /// With --remote: the local database the replica lives in (created if missing).
    #[arg(long, value_name = "DB", requires = "remote")]
    pub cache: Option<PathBuf>,
    /// With --remote: the file holding the server's token (else $COMPUTERD_TOKEN).
    #[arg(long, value_name = "FILE", requires = "remote")]
    pub token_file: Option<PathBuf>,
    /// With --remote: the name the server keeps this replica's cursors under (default:
    /// the cache's own id). A new cache under a name in use replaces the old replica.
    #[arg(long, value_name = "NAME", requires = "remote")]
    pub peer: Option<String>,
    /// First delay before a failed sync is retried, in milliseconds.
    #[arg(long, default_value_t = 1000, value_name = "MS")]
    pub retry_initial_ms: u64,
    /// Each retry waits this many times longer than the one before.
    #[arg(long, default_value_t = 2.0, value_name = "X")]
    pub retry_multiplier: f64,
    /// Longest delay between retries, in milliseconds.
    #[arg(long, default_value_t = 60_000, value_name = "MS")]
    pub retry_max_ms: u64,
    /// Attempts of a pending sync before it is given up (the first included); the
    /// replica still tries every maximum delay afterwards.
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub retry_attempts: u32,
    /// Shortens each delay by up to this fraction, at random (0 to 1).
    #[arg(long, default_value_t = 0.0, value_name = "FRACTION")]
    pub retry_jitter: f64,
    /// Changed paths the replica may hold unsynced before writers are held back.
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    pub backlog_max_paths: u64,
    /// Content of changed files the replica may hold unsynced before writers are held
    /// back (bytes, or with K, M, G, T).
    #[arg(long, default_value = "1G", value_name = "SIZE")]
    pub backlog_max_bytes: String,
    /// How long a held-back writer waits before its operation fails with ENOSPC.
    #[arg(long, default_value_t = 60, value_name = "SECS")]
    pub backlog_wait_secs: u64,
}

impl RemoteArgs {
    pub fn retry_policy(&self) -> anyhow::Result<RetryPolicy> {
        let policy = RetryPolicy {
            initial: Duration::from_millis(self.retry_initial_ms),
            multiplier: self.retry_multiplier,
            max_delay: Duration::from_millis(self.retry_max_ms),
            max_attempts: self.retry_attempts,
            jitter: self.retry_jitter,
        };
        policy
            .validate()
            .map_err(|why| anyhow!("retry options: {why}"))?;
        Ok(policy)
    }

    /// The follow options for `address`, as a replica of workspace `ws`.
    pub fn follow_options(&self, address: &str, ws: &Workspace) -> anyhow::Result<FollowOptions> {
        let address = remote::address(address)?;
        let token = remote::read_token(self.token_file.as_deref())?;
        let peer = match &self.peer {
            Some(peer) if peer.is_empty() || peer.len() > 200 => {
                bail!("--peer must be 1 to 200 bytes long")
            }
            Some(peer) => peer.clone(),
            None => format!("replica-{}", ws.id()),
        };
        let mut options = FollowOptions::new(address, token, peer);
        options.retry = self.retry_policy()?;
        options.backlog = BacklogLimits {
            nodes: self.backlog_max_paths.max(1),
            bytes: crate::fs_format::parse_size(&self.backlog_max_bytes)
                .ok_or_else(|| {
                    anyhow!(
                        "--backlog-max-bytes {}: expected bytes, optionally with K, M, G or T",
                        self.backlog_max_bytes
                    )
                })?
                .max(1),
            wait_max: Duration::from_secs(self.backlog_wait_secs),
        };
        Ok(options)
    }
}

/// Tells the kernel to forget its cached entries, attributes and pages of paths a pull
/// changed. Until the mount exists there is nothing to forget.
#[derive(Clone)]
pub struct KernelCache {
    ws: Workspace,
    notifier: Arc<OnceLock<Notifier>>,
    pages: Arc<KernelPages>,
}

impl KernelCache {
    pub fn new(ws: Workspace) -> KernelCache {
        KernelCache {
            ws,
            notifier: Arc::new(OnceLock::new()),
            pages: Arc::default(),
        }
    }

    /// Where the session's notifier is kept once it runs, shared with whoever else
    /// tells the kernel to forget or fills its pages (the FUSE handlers), and what the
    /// kernel's page cache holds.
    pub fn kernel_link(&self) -> (Arc<OnceLock<Notifier>>, Arc<KernelPages>) {
        (self.notifier.clone(), self.pages.clone())
    }

    /// From now on, invalidations go to this session's kernel connection.
    pub fn attach(&self, notifier: Notifier) {
        let _ = self.notifier.set(notifier);
    }

    pub fn observer(&self) -> AppliedObserver {
        let cache = self.clone();
        Arc::new(move |paths: &[Vec<u8>]| cache.forget(paths))
    }

    /// For each path: its entry in its parent (new, gone, or another node now), its
    /// node's attributes and pages, and the parent's attributes. Errors are expected
    /// (the kernel never looked the name up) and ignored.
    fn forget(&self, paths: &[Vec<u8>]) {
        let Some(notifier) = self.notifier.get() else {
            return;
        };
        let mut parents = std::collections::BTreeSet::new();
        for path in paths {
            let (parent_path, name) = split(path);
            let parent = parent_path.and_then(|p| self.resolve(p));
            if let (Some(parent), Some(name)) = (parent, name) {
                let _ = notifier.inval_entry(INodeNo(parent.0), OsStr::from_bytes(name));
                parents.insert(parent.0);
            }
            if let Some(ino) = self.resolve(path) {
                self.pages.await_fills(ino.0);
                let _ = notifier.inval_inode(INodeNo(ino.0), 0, 0);
                self.pages.changed(ino.0);
            }
        }
        for parent in parents {
            let _ = notifier.inval_inode(INodeNo(parent), 0, 0);
        }
    }

    /// The node at `path`, following no symlink.
    fn resolve(&self, path: &[u8]) -> Option<InodeNo> {
        let mut ino = InodeNo::ROOT;
        for part in path.split(|&b| b == b'/').filter(|p| !p.is_empty()) {
            ino = self.ws.lookup(Who::Trusted, ino, part).ok()?.ino;
        }
        Some(ino)
    }
}

/// `(parent, name)` of an absolute path; the root has neither.
fn split(path: &[u8]) -> (Option<&[u8]>, Option<&[u8]>) {
    let trimmed = path.strip_suffix(b"/").unwrap_or(path);
    match trimmed.iter().rposition(|&b| b == b'/') {
        Some(at) if at + 1 < trimmed.len() => {
            let parent = if at == 0 { &b"/"[..] } else { &trimmed[..at] };
            (Some(parent), Some(&trimmed[at + 1..]))
        }
        _ => (None, None),
    }
}

// ----------------------------------------------------------------------- control socket

/// Where the control socket of a replica with cache `db` lives.
pub fn control_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(".control");
    PathBuf::from(name)
}

/// Answers `computerd sync` for one replica, on a thread of its own, until dropped.
pub struct ControlServer {
    path: PathBuf,
    stopping: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ControlServer {
    pub fn start(path: PathBuf, client: SyncClient) -> anyhow::Result<ControlServer> {
        if path.as_os_str().len() > computer_sync::rpc::UNIX_SOCKET_PATH_BYTES_MAX {
            bail!(
                "{}: the control socket's path is too long for a Unix socket; use a shorter \
                 --cache path",
                path.display()
            );
        }
        match std::fs::remove_file(&path) {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
                return Err(err).with_context(|| format!("{}: cannot replace", path.display()))
            }
            _ => {}
        }
        let listener = UnixListener::bind(&path)
            .with_context(|| format!("{}: cannot listen", path.display()))?;
        let stopping = Arc::new(AtomicBool::new(false));
        let stop = stopping.clone();
        let thread = std::thread::Builder::new()
            .name("control".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    // Dropping the server sets the flag, then connects to wake us.
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(stream) = stream else { continue };
                    let client = client.clone();
                    // One thread per caller: a `wait` may take minutes.
                    let _ = std::thread::Builder::new()
                        .name("control-call".into())
                        .spawn(move || answer(stream, &client));
                }
            })
            .context("starting the control thread")?;
        Ok(ControlServer {
            path,
            stopping,
            thread: Some(thread),
        })
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        let _ = UnixStream::connect(&self.path);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn answer(stream: UnixStream, client: &SyncClient) {
    let mut reader = BufReader::new(&stream);
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let words: Vec<&str> = line.split_whitespace().collect();
    let reply = match words.as_slice() {
        ["sync", timeout] => match timeout.parse::<u64>() {
            Ok(ms) => render(&client.sync(Duration::from_millis(ms))),
            Err(_) => "error reason=bad timeout".to_owned(),
        },
        ["wait", intent, timeout] => match (intent.parse::<Intent>(), timeout.parse::<u64>()) {
            (Ok(intent), Ok(ms)) => render(&client.wait(intent, Duration::from_millis(ms))),
            (Err(why), _) => format!("error reason={why}"),
            (_, Err(_)) => "error reason=bad timeout".to_owned(),
        },
        ["status"] => render_status(&client.status()),
        _ => "error reason=unknown request".to_owned(),
    };
    let mut stream = &stream;
    let _ = writeln!(stream, "{reply}");
}

/// The sync loop's state as `status key=value ...`, the last error (if failures go on)
/// last, after `reason=`.
fn render_status(status: &FollowStatus) -> String {
    let mut line = format!(
        "status connected={} failures={} syncs={} backlog_nodes={} backlog_bytes={} \
         held_back={} replaced={}",
        u8::from(status.connected),
        status.failures,
        status.syncs,
        status.backlog.nodes,
        status.backlog.bytes,
        u8::from(status.held_back),
        u8::from(status.replaced),
    );
    if let Some(error) = &status.last_error {
        line += &format!(" reason={}", error.replace('\n', " "));
    }
    line
}

/// A replica daemon's sync loop, as its control socket tells it.
pub struct SyncState {
    /// `key=value` fields: connected, failures, syncs, backlog_nodes, backlog_bytes,
    /// held_back, replaced (flags as 0 or 1).
    pub fields: Vec<(String, String)>,
    /// Why the last attempt failed, while failures go on.
    pub last_error: Option<String>,
}

impl SyncState {
    /// A field's value, `?` if the daemon did not say.
    pub fn field(&self, key: &str) -> &str {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map_or("?", |(_, v)| v.as_str())
    }
}

/// Asks the replica daemon of the cache `db` for its sync loop's state; `None` if no
/// daemon answers.
pub fn sync_status(db: &Path) -> Option<SyncState> {
    let mut stream = UnixStream::connect(control_path(db)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream.write_all(b"status\n").ok()?;
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line).ok()?;
    let line = line.trim_end().strip_prefix("status ")?;
    let (fields, reason) = match line.split_once(" reason=") {
        Some((fields, reason)) => (fields, Some(reason.to_owned())),
        None => (line, None),
    };
    let fields = fields
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    Some(SyncState {
        fields,
        last_error: reason,
    })
}

fn render(outcome: &SyncOutcome) -> String {
    let one_line = |s: &str| s.replace('\n', " ");
    match outcome {
        SyncOutcome::Complete { intent, report } => format!(
            "complete intent={intent} pulled={} pushed={} conflicts={} bytes_in={} bytes_out={}",
            report.pulled,
            report.pushed,
            report.conflicts.len(),
            report.bytes_in,
            report.bytes_out
        ),
        SyncOutcome::Pending {
            intent,
            reason,
            failures,
            retry_in,
            pulled,
        } => format!(
            "pending intent={intent} failures={failures} retry_in_ms={} pulled={} reason={}",
            retry_in.map_or(-1, |d| d.as_millis() as i64),
            if *pulled { "yes" } else { "no" },
            one_line(reason)
        ),
        SyncOutcome::Lost { intent, reason } => {
            format!("lost intent={intent} reason={}", one_line(reason))
        }
        SyncOutcome::Refused { intent, reason } => {
            format!("refused intent={intent} reason={}", one_line(reason))
        }
    }
}

// ------------------------------------------------------------------------ computerd sync

/// Exit status of a pending sync: EX_TEMPFAIL, "try again later".
const EXIT_PENDING: u8 = 75;

#[derive(Args, Debug)]
pub struct SyncArgs {
    /// The replica's mount point (or give --cache, --remote or --workspace).
    #[arg(
        required_unless_present_any = ["cache", "remote", "workspace"],
        conflicts_with_all = ["cache", "remote", "workspace"]
    )]
    pub mountpoint: Option<PathBuf>,
    /// The replica's cache database, instead of its mount point.
    #[arg(long, value_name = "DB", conflicts_with_all = ["remote", "workspace"])]
    pub cache: Option<PathBuf>,
    /// With --intent: wait on the server at ADDR for a pending result of
    /// `computerd exec --remote ADDR` (the server's replica pushes it).
    #[arg(
        long,
        value_name = "ADDR",
        requires = "intent",
        conflicts_with = "workspace"
    )]
    pub remote: Option<String>,
    /// With --remote: the file holding the server's token (else $COMPUTERD_TOKEN).
    #[arg(long, value_name = "FILE", requires = "remote")]
    pub token_file: Option<PathBuf>,
    /// With --intent: wait on the owner of DB (served here) for a pending result of
    /// `computerd exec DB`.
    #[arg(long, value_name = "DB", requires = "intent")]
    pub workspace: Option<PathBuf>,
    /// How long to wait, in seconds.
    #[arg(long, default_value_t = 60, value_name = "SECS")]
    pub timeout: u64,
    /// Wait for an earlier pending sync (as `computerd sync` printed it,
    /// REPLICA_ID@REVISION) to complete, instead of syncing now.
    #[arg(long, value_name = "INTENT")]
    pub intent: Option<String>,
}

/// `computerd sync`: 0 once complete, 75 while pending (the daemon goes on retrying),
/// 1 when the changes are lost or the server refuses the replica.
pub fn run_sync(args: SyncArgs) -> anyhow::Result<ExitCode> {
    let socket = match (&args.cache, &args.mountpoint) {
        (Some(cache), _) => control_path(&std::path::absolute(cache)?),
        (None, Some(mountpoint)) => control_path(&cache_of_mount(mountpoint)?),
        (None, None) => bail!("name a mount point or --cache"),
    };
    let timeout_ms = args.timeout.saturating_mul(1000);
    let request = match &args.intent {
        Some(intent) => {
            let intent: Intent = intent.parse().map_err(|why: String| anyhow!(why))?;
            format!("wait {intent} {timeout_ms}\n")
        }
        None => format!("sync {timeout_ms}\n"),
    };
    let answer = ask_replica(&socket, &request)?;
    let field = |key: &str| answer.field(key);
    let reason = answer.reason.as_str();
    let target = args
        .mountpoint
        .as_ref()
        .map(|m| m.display().to_string())
        .unwrap_or_else(|| {
            format!(
                "--cache {}",
                args.cache.as_deref().unwrap_or(Path::new("?")).display()
            )
        });
    match answer.kind.as_str() {
        "complete" => {
            println!(
                "synced: pulled {} entries, pushed {}, {} conflicts (intent {})",
                field("pulled"),
                field("pushed"),
                field("conflicts"),
                field("intent")
            );
            Ok(ExitCode::SUCCESS)
        }
        "pending" => {
            let retry = match field("retry_in_ms").parse::<i64>() {
                Ok(ms) if ms >= 0 => format!("the daemon retries in {:.1} s", ms as f64 / 1000.0),
                _ => "the daemon keeps retrying".to_owned(),
            };
            eprintln!(
                "computerd: sync pending: {reason} ({} failed attempts; {retry}). Wait for it \
                 with: computerd sync {target} --intent {}",
                field("failures"),
                field("intent")
            );
            Ok(ExitCode::from(EXIT_PENDING))
        }
        "lost" => {
            eprintln!(
                "computerd: sync lost: {reason} (intent {})",
                field("intent")
            );
            Ok(ExitCode::FAILURE)
        }
        "refused" => {
            eprintln!("computerd: sync refused: {reason}");
            Ok(ExitCode::FAILURE)
        }
        _ => bail!("the daemon answered: {}", answer.line),
    }
}

/// A replica daemon's answer on its control socket: `KIND key=value... reason=TEXT`.
pub struct ControlAnswer {
    /// `complete`, `pending`, `lost` or `refused`.
    pub kind: String,
    fields: String,
    /// Why it is not complete, as the daemon says it (empty when complete).
    pub reason: String,
    /// The whole line, for an answer not understood.
    pub line: String,
}

impl ControlAnswer {
    /// The value of `key`, or `?`.
    pub fn field(&self, key: &str) -> &str {
        self.fields
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
            .unwrap_or("?")
    }
}

/// Sends `request` (a line: `sync TIMEOUT_MS`, or `wait INTENT TIMEOUT_MS`) to the
/// replica daemon listening on `socket` and reads its answer.
pub fn ask_replica(socket: &Path, request: &str) -> anyhow::Result<ControlAnswer> {
    let mut stream = UnixStream::connect(socket).with_context(|| {
        format!(
            "{}: no replica daemon answers (is it a replica mount, still running?)",
            socket.display()
        )
    })?;
    stream.write_all(request.as_bytes())?;
    let mut line = String::new();
    BufReader::new(&stream)
        .read_line(&mut line)
        .context("reading the daemon's answer")?;
    let line = line.trim_end().to_owned();
    let (kind, fields) = line.split_once(' ').unwrap_or((&line, ""));
    let (fields, reason) = fields.split_once("reason=").unwrap_or((fields, ""));
    Ok(ControlAnswer {
        kind: kind.to_owned(),
        fields: fields.to_owned(),
        reason: reason.to_owned(),
        line: line.clone(),
    })
}

/// The cache database of the replica mounted at `mountpoint`, from the mount's source
/// in the mount table (`mounts.rs`).
fn cache_of_mount(mountpoint: &Path) -> anyhow::Result<PathBuf> {
    let wanted = std::fs::canonicalize(mountpoint)
        .with_context(|| format!("{}: cannot resolve", mountpoint.display()))?;
    let table = crate::mounts::table().ok_or_else(|| anyhow!("cannot read the mount table"))?;
    let entry = table
        .iter()
        .rev()
        .find(|m| m.mountpoint == wanted)
        .ok_or_else(|| anyhow!("{}: not a mount point", mountpoint.display()))?;
    entry
        .computer_db()
        .ok_or_else(|| anyhow!("{}: not a computer mount", mountpoint.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_split_into_parent_and_name() {
        assert_eq!(split(b"/a"), (Some(&b"/"[..]), Some(&b"a"[..])));
        assert_eq!(split(b"/a/b/c"), (Some(&b"/a/b"[..]), Some(&b"c"[..])));
        assert_eq!(split(b"/"), (None, None));
    }
}
