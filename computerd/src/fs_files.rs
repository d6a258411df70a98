//! The file operations the `computerd fs` commands are written against, whatever the
//! route: the path API of a workspace this process opened ([`computer_vfs::Fs`]), or
//! the typed calls of a server or a database's owner ([`RemoteFiles`]: `fs --remote`,
//! and `fs DB` on a mounted or served database). One implementation of each command,
//! so a command prints the same whichever way it went.

use std::fmt;

use computer_sync::rpc::{Address, RemoteUpstream};
use computer_sync::{ClientInfo, DirItem, NodeInfo, WorkspaceStats};
use computer_vfs::{
    CheckProgress, CheckReport, CompactProgress, CompactReport, Fs, GrepMatch, GrepOptions,
    MkdirOptions, RmOptions,
};
use tokio::runtime::Runtime;
use tokio::task::LocalSet;

use crate::fs_error::describe;

/// Entries asked for per page of a remote listing.
const LIST_PAGE_ENTRIES: u32 = computer_sync::wire::LIST_ENTRIES_MAX as u32;

/// Why a file operation failed: one line naming the path, and its errno.
#[derive(Debug)]
pub struct FileError {
    pub errno: i32,
    pub message: String,
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for FileError {}

impl From<computer_vfs::Error> for FileError {
    fn from(err: computer_vfs::Error) -> FileError {
        FileError {
            errno: err.errno(),
            message: describe(&err),
        }
    }
}

impl FileError {
    pub fn is_not_found(&self) -> bool {
        self.errno == libc::ENOENT
    }
}

pub type FileResult<T> = Result<T, FileError>;

/// What a command may do to a workspace: its tree (paths are absolute), and the store
/// as a whole.
pub trait Files {
    /// A node's attributes (a final symlink followed if `follow`) and a symlink's target.
    fn node(&self, path: &str, follow: bool) -> FileResult<NodeInfo>;
    /// Every entry of a directory (a final symlink followed), in no particular order.
    fn list(&self, dir: &str) -> FileResult<Vec<DirItem>>;
    fn mkdir(&self, path: &str, options: MkdirOptions) -> FileResult<()>;
    fn rm(&self, path: &str, options: RmOptions) -> FileResult<()>;
    fn rename(&self, from: &str, to: &str) -> FileResult<()>;
    fn copy(&self, from: &str, to: &str, recursive: bool) -> FileResult<()>;
    fn symlink(&self, target: &str, path: &str) -> FileResult<()>;
    fn link(&self, existing: &str, path: &str) -> FileResult<()>;
    fn chmod(&self, path: &str, perm: u32) -> FileResult<()>;
    fn truncate(&self, path: &str, size: u64) -> FileResult<()>;
    /// Makes an empty file where nothing is.
    fn create_empty(&self, path: &str) -> FileResult<()>;
    fn glob(&self, pattern: &str) -> FileResult<Vec<String>>;
    fn grep(&self, pattern: &str, path: &str, options: &GrepOptions) -> FileResult<Vec<GrepMatch>>;
    /// The workspace's id and figures.
    fn stats(&self) -> FileResult<WorkspaceStats>;
    /// Verifies the database from scratch; `progress` hears how far, where it runs here.
    fn check(&self, progress: &mut dyn FnMut(CheckProgress)) -> FileResult<CheckReport>;
    /// Gives freed pages back to the disk; `progress` hears how far, where it runs here.
    fn compact(&self, progress: &mut dyn FnMut(CompactProgress)) -> FileResult<CompactReport>;
}

impl Files for Fs {
    fn node(&self, path: &str, follow: bool) -> FileResult<NodeInfo> {
        Ok(computer_sync::files::node_info(self, path, follow)?)
    }

    fn list(&self, dir: &str) -> FileResult<Vec<DirItem>> {
        // The pages a server answers with, read here: one listing, whichever the route.
        let mut items = Vec::new();
        let mut after = 0;
        loop {
            let page =
                computer_sync::files::list_page(self, dir, after, LIST_PAGE_ENTRIES as usize)?;
            items.extend(page.items);
            if page.complete {
                return Ok(items);
            }
            after = page.next;
        }
    }

    fn mkdir(&self, path: &str, options: MkdirOptions) -> FileResult<()> {
        Ok(Fs::mkdir(self, path, options)?)
    }

    fn rm(&self, path: &str, options: RmOptions) -> FileResult<()> {
        Ok(Fs::rm(self, path, options)?)
    }

    fn rename(&self, from: &str, to: &str) -> FileResult<()> {
        Ok(Fs::rename(self, from, to)?)
    }

    fn copy(&self, from: &str, to: &str, recursive: bool) -> FileResult<()> {
        Ok(Fs::copy(self, from, to, recursive)?)
    }

    fn symlink(&self, target: &str, path: &str) -> FileResult<()> {
        Ok(Fs::symlink(self, target, path)?)
    }

    fn link(&self, existing: &str, path: &str) -> FileResult<()> {
        Ok(Fs::link(self, existing, path)?)
    }

    fn chmod(&self, path: &str, perm: u32) -> FileResult<()> {
        Ok(Fs::chmod(self, path, perm)?)
    }

    fn truncate(&self, path: &str, size: u64) -> FileResult<()> {
        Ok(Fs::truncate(self, path, size)?)
    }

    fn create_empty(&self, path: &str) -> FileResult<()> {
        Ok(self.write_file(path, [])?)
    }

    fn glob(&self, pattern: &str) -> FileResult<Vec<String>> {
        Ok(Fs::glob(self, pattern)?)
    }

    fn grep(&self, pattern: &str, path: &str, options: &GrepOptions) -> FileResult<Vec<GrepMatch>> {
        Ok(Fs::grep(self, pattern, path, options)?)
    }

    fn stats(&self) -> FileResult<WorkspaceStats> {
        let ws = self.workspace();
        Ok(WorkspaceStats {
            workspace_id: ws.id().to_owned(),
            stats: ws.stats()?,
        })
    }

    fn check(&self, progress: &mut dyn FnMut(CheckProgress)) -> FileResult<CheckReport> {
        Ok(self.workspace().check_with_progress(progress)?)
    }

    fn compact(&self, progress: &mut dyn FnMut(CompactProgress)) -> FileResult<CompactReport> {
        Ok(self.workspace().compact(progress)?)
    }
}

/// The typed calls of a server (or an owner's channel), made one at a time on an event
/// loop of this thread's own.
pub struct RemoteFiles {
    runtime: Runtime,
    local: LocalSet,
    upstream: RemoteUpstream,
    address: Address,
}

impl RemoteFiles {
    /// Connects to the server at `address`.
    pub fn connect(address: &Address, token: &[u8]) -> anyhow::Result<RemoteFiles> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let local = LocalSet::new();
        let (upstream, _) = local
            .block_on(
                &runtime,
                computer_sync::rpc::connect(address, token, ClientInfo::default()),
            )
            .map_err(|err| connection_error(address, err))?;
        Ok(RemoteFiles {
            runtime,
            local,
            upstream,
            address: address.clone(),
        })
    }

    /// The connection, for the calls that are not file operations.
    pub fn upstream(&self) -> &RemoteUpstream {
        &self.upstream
    }

    /// Runs `future` (a call on [`RemoteFiles::upstream`]) to its end.
    pub fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.local.block_on(&self.runtime, future)
    }

    fn call<T>(
        &self,
        future: impl std::future::Future<Output = computer_sync::Result<T>>,
    ) -> FileResult<T> {
        self.block_on(future).map_err(|err| match err {
            computer_sync::Error::File { errno, message } => FileError { errno, message },
            other => FileError {
                errno: other.errno(),
                message: connection_error(&self.address, other).to_string(),
            },
        })
    }
}

/// A failure of the connection or the server, naming the address once.
pub fn connection_error(address: &Address, err: computer_sync::Error) -> anyhow::Error {
    match err {
        // It names the address already.
        computer_sync::Error::Disconnected { .. } => anyhow::anyhow!("{err}"),
        _ => anyhow::anyhow!("{address}: {err}"),
    }
}

/// Answers cut short by the protocol's bounds are refused whole: printing part of what
/// was asked as if it were all would mislead.
fn whole<T>(what: &str, answer: computer_sync::Bounded<T>, narrow: &str) -> FileResult<Vec<T>> {
    if answer.complete {
        return Ok(answer.items);
    }
    Err(FileError {
        errno: libc::E2BIG,
        message: format!(
            "{what}: more than one answer holds ({} items); {narrow}",
            answer.items.len()
        ),
    })
}

impl Files for RemoteFiles {
    fn node(&self, path: &str, follow: bool) -> FileResult<NodeInfo> {
        self.call(self.upstream.stat(path, follow))
    }

    fn list(&self, dir: &str) -> FileResult<Vec<DirItem>> {
        let mut items = Vec::new();
        let mut after = 0;
        loop {
            let page = self.call(self.upstream.list(dir, after, LIST_PAGE_ENTRIES))?;
            items.extend(page.items);
            if page.complete {
                return Ok(items);
            }
            after = page.next;
        }
    }

    fn mkdir(&self, path: &str, options: MkdirOptions) -> FileResult<()> {
        self.call(self.upstream.mkdir(path, options.recursive, options.mode))
    }

    fn rm(&self, path: &str, options: RmOptions) -> FileResult<()> {
        self.call(self.upstream.remove(path, options.recursive, options.force))
    }

    fn rename(&self, from: &str, to: &str) -> FileResult<()> {
        self.call(self.upstream.rename(from, to))
    }

    fn copy(&self, from: &str, to: &str, recursive: bool) -> FileResult<()> {
        self.call(self.upstream.copy(from, to, recursive))
    }

    fn symlink(&self, target: &str, path: &str) -> FileResult<()> {
        self.call(self.upstream.symlink(target, path))
    }

    fn link(&self, existing: &str, path: &str) -> FileResult<()> {
        self.call(self.upstream.link(existing, path))
    }

    fn chmod(&self, path: &str, perm: u32) -> FileResult<()> {
        self.call(self.upstream.chmod(path, perm))
    }

    fn truncate(&self, path: &str, size: u64) -> FileResult<()> {
        self.call(self.upstream.truncate(path, size))
    }

    fn create_empty(&self, path: &str) -> FileResult<()> {
        self.call(async {
            let writer = self.upstream.open_write(path, true).await?;
            writer.commit().await.map(drop)
        })
    }

    fn glob(&self, pattern: &str) -> FileResult<Vec<String>> {
        let answer = self.call(self.upstream.glob(pattern, u32::MAX))?;
        whole(pattern, answer, "narrow the pattern")
    }

    fn grep(&self, pattern: &str, path: &str, options: &GrepOptions) -> FileResult<Vec<GrepMatch>> {
        let answer = self.call(self.upstream.grep(pattern, path, options))?;
        whole(path, answer, "narrow the search or pass --max-count")
    }

    fn stats(&self) -> FileResult<WorkspaceStats> {
        self.call(self.upstream.stats())
    }

    fn check(&self, _progress: &mut dyn FnMut(CheckProgress)) -> FileResult<CheckReport> {
        self.call(self.upstream.check())
    }

    fn compact(&self, _progress: &mut dyn FnMut(CompactProgress)) -> FileResult<CompactReport> {
        self.call(self.upstream.compact())
    }
}
