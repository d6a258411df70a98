//! The FUSE adapter: translates kernel requests into calls on the `vfs` inode API.
//!
//! It decides nothing about the filesystem: every request decodes its arguments, calls
//! one [`Workspace`] method and replies with the result or the error's errno. What it
//! does own is the conversation with the kernel: which capabilities to negotiate, how
//! long the kernel may cache entries and attributes, and the `.`/`..` entries of
//! directory listings.
//!
//! Permissions: every request is checked by the store against the caller's credentials
//! (`Who::Caller`); this module only says who the caller is. Where other users can reach
//! the mount, the kernel checks too (`default_permissions`, see [`permission_option`]).
//!
//! Caching: this daemon is the only writer of a mounted workspace, so the kernel may keep
//! entries, attributes (one hour), page cache across opens (`FOPEN_KEEP_CACHE`) and
//! directory listings (directories are opened without OPENDIR: see `opendir`), and
//! write back dirty pages in large requests (`FUSE_WRITEBACK_CACHE`); a read-only open
//! is closed without a FLUSH (`FOPEN_NOFLUSH`). Changes by other routes (a replica's
//! pull, file commands sent to this owner) are followed by invalidations
//! (`replica::KernelCache`). docs/SEMANTICS.md says what that means for someone
//! changing the database behind a mount.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

mod backing;
mod unopened;
mod write;

use crate::fuse_reply::{self as answer, errno};
use crate::kernel_pages::{self, KernelPages};
use crate::poll::RequestPolling;
use backing::BackingTable;
pub use backing::DeviceSlot;
use computer_vfs::{
    Access, Attr, CallerInfo, Capability, Credentials, Error, FileKind, InodeNo, OpenFlags, Opened,
    SetAttr, SetTime, TimestampNs, Who, Workspace,
};
use fuser::{
    AccessFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, KernelConfig, LockOwner, MountOption, Notifier, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use unopened::{DeletedHolds, UnopenedWriters};

/// How long the kernel may trust an entry or attributes it got from us.
const TTL: Duration = Duration::from_secs(3600);
/// `st_blksize`: the I/O size tools like `cp` and `cat` pick.
const BLOCK_SIZE_HINT: u32 = 128 << 10;
/// Largest write request the kernel sends (it caps at 256 pages anyway).
pub(crate) const MAX_WRITE: u32 = 1 << 20;
/// Directory entries fetched from the store per batch while filling a reply.
const READDIR_BATCH: usize = 256;

/// Mount-time settings that change how requests are answered.
#[derive(Clone, Debug)]
pub struct MountConfig {
    pub read_only: bool,
    /// A replica's mount: its server's changes arrive behind the kernel's back.
    pub replica: bool,
    pub writeback_cache: bool,
    /// Let the kernel read and write staged files directly (FUSE passthrough).
    pub passthrough: bool,
    /// Count requests and the time spent on each kind; log the table at unmount.
    pub op_stats: bool,
    /// Negotiate `FUSE_READDIRPLUS_AUTO`, the kernel's rule of asking for attributes with
    /// the first page of a listing only (docs/benchmarks.md, "Large directories").
    pub readdirplus_auto: bool,
    /// Ask the kernel to carry requests over io_uring (`fuse_ring`).
    pub io_uring: bool,
    /// Let the kernel open files without asking on a writable mount too, and keep their
    /// pages across opens (`fuse::unopened`).
    pub cached_opens: bool,
    /// The kernel checks permissions too (`default_permissions`, [`permission_option`]).
    pub kernel_checks_permissions: bool,
}

/// The filesystem the kernel talks to. A clone shares everything with the original:
/// fuser's session owns one, the io_uring queues (`fuse_ring`) serve through another.
#[derive(Clone)]
pub struct WorkspaceFs {
    ws: Workspace,
    config: MountConfig,
    /// Whether the kernel agreed to write back through its page cache.
    writeback: Arc<AtomicBool>,
    /// Whether the kernel agreed to passthrough (exclusive with `writeback`).
    passthrough: Arc<AtomicBool>,
    /// Whether the kernel agreed in INIT to carry requests over io_uring.
    ring_agreed: Arc<AtomicBool>,
    /// The kernel's registration of each staging file in use ([`backing`]).
    backing: Arc<Mutex<BackingTable>>,
    /// The session's device, which passthrough registrations go through.
    device: DeviceSlot,
    stats: Option<Arc<OpStats>>,
    /// `fs.protected_hardlinks` as this host sets it: the rule links follow.
    protected_hardlinks: bool,
    /// Told of every request; polls the device while they come close together.
    polling: Option<Arc<RequestPolling>>,
    /// The session's channel for telling the kernel to forget what it cached, set once
    /// the session runs.
    notifier: Arc<OnceLock<Notifier>>,
    /// What the kernel's page cache holds, and the locks that order filling it.
    pages: Arc<KernelPages>,
    /// The kernel opens directories without asking once OPENDIR answers ENOSYS (it said
    /// so in INIT: `FUSE_NO_OPENDIR_SUPPORT`); see `opendir`.
    opendir_skipped: Arc<AtomicBool>,
    /// A read-only mount, or one with `cached_opens`, lets the kernel open files without
    /// asking too (`FUSE_NO_OPEN_SUPPORT`); see `open`.
    open_skipped: Arc<AtomicBool>,
    /// The writers of files the kernel opened without asking ([`unopened`]).
    unopened: Arc<UnopenedWriters>,
    /// Files deleted while such a kernel may hold them open ([`unopened`]).
    deleted_holds: Arc<DeletedHolds>,
}

/// Per-operation request counts and time spent, reported at unmount with `--op-stats`.
#[derive(Default)]
struct OpStats {
    ops: Mutex<HashMap<&'static str, (u64, Duration)>>,
}

/// Adds the time until it is dropped to one operation's total.
struct OpTimer<'a> {
    stats: Option<&'a OpStats>,
    polling: Option<&'a RequestPolling>,
    op: &'static str,
    started: std::time::Instant,
}

impl Drop for OpTimer<'_> {
    fn drop(&mut self) {
        if let Some(stats) = self.stats {
            let mut ops = stats.ops.lock().unwrap_or_else(|e| e.into_inner());
            let entry = ops.entry(self.op).or_default();
            entry.0 += 1;
            entry.1 += self.started.elapsed();
        }
        // Last: the reply is sent, and a worker may rest here while another polls.
        if let Some(polling) = self.polling {
            polling.request_done();
        }
    }
}

impl WorkspaceFs {
    pub fn new(
        ws: Workspace,
        config: MountConfig,
        polling: Option<Arc<RequestPolling>>,
        (notifier, pages): (Arc<OnceLock<Notifier>>, Arc<KernelPages>),
    ) -> WorkspaceFs {
        WorkspaceFs {
            ws,
            writeback: Arc::default(),
            passthrough: Arc::default(),
            ring_agreed: Arc::default(),
            backing: Arc::default(),
            device: DeviceSlot::default(),
            stats: config.op_stats.then(Arc::default),
            config,
            protected_hardlinks: protected_hardlinks(),
            polling,
            notifier,
            pages,
            opendir_skipped: Arc::default(),
            open_skipped: Arc::default(),
            unopened: Arc::default(),
            deleted_holds: Arc::default(),
        }
    }

    /// Whether the kernel agreed in INIT to carry requests over io_uring: the queues
    /// start only then.
    pub fn ring_agreed(&self) -> bool {
        self.ring_agreed.load(Ordering::Relaxed)
    }

    /// Who the process behind a request is, for the store's permission checks.
    fn credentials<'a>(&self, sender: &Sender, process: &'a RequestProcess) -> Credentials<'a> {
        Credentials::new(sender.uid, sender.gid, process)
            .protected_hardlinks(self.protected_hardlinks)
    }

    /// The process behind a request, as the one who asks for an operation.
    fn caller<'a>(&self, sender: &Sender, process: &'a RequestProcess) -> Who<'a> {
        Who::Caller(self.credentials(sender, process))
    }

    /// Runs `op` as the process behind a request: what most handlers do, with the one
    /// store call that checks the operation.
    fn as_caller<T>(&self, sender: &Sender, op: impl FnOnce(Who<'_>) -> T) -> T {
        let process = RequestProcess::of(sender);
        op(self.caller(sender, &process))
    }

    /// Marks the start of a request: counts it (with `--op-stats`) and tells the poller.
    /// Every request handler begins with it.
    fn timer(&self, op: &'static str) -> OpTimer<'_> {
        if let Some(polling) = &self.polling {
            polling.request_arrived();
        }
        OpTimer {
            stats: self.stats.as_deref(),
            polling: self.polling.as_deref(),
            op,
            started: std::time::Instant::now(),
        }
    }

    /// The per-operation table, busiest first.
    fn op_stats_report(&self) -> Option<String> {
        let stats = self.stats.as_ref()?;
        let ops = stats.ops.lock().unwrap_or_else(|e| e.into_inner());
        let mut rows: Vec<_> = ops.iter().map(|(op, (n, t))| (*op, *n, *t)).collect();
        rows.sort_by_key(|(_, _, t)| std::cmp::Reverse(*t));
        let mut out = String::from("operation        count   total ms   mean us\n");
        for (op, n, t) in rows {
            let mean = t.as_secs_f64() * 1e6 / n.max(1) as f64;
            out.push_str(&format!(
                "{op:<15} {n:>7} {:>10.1} {mean:>9.1}\n",
                t.as_secs_f64() * 1e3
            ));
        }
        Some(out)
    }
}

fn system_time(ns: TimestampNs) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

fn timestamp(time: SystemTime) -> TimestampNs {
    match time.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_nanos()).unwrap_or(i64::MAX),
    }
}

/// A time the kernel sent in a request (setattr). fuser 0.18 decodes `(secs, nsecs)` with
/// negative `secs` as `UNIX_EPOCH - Duration::new(-secs, nsecs)`, which moves the time
/// 2 * nsecs further into the past (-86400.000000007 s, sent as (-86401, 999999993),
/// arrives as -86401.999999993 s). Undo that here: before the epoch, the whole seconds of
/// the distance are `-secs` and its nanoseconds are `nsecs`.
fn request_timestamp(time: SystemTime) -> TimestampNs {
    match time.duration_since(UNIX_EPOCH) {
        Ok(_) => timestamp(time),
        Err(e) => {
            let d = e.duration();
            let secs = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            secs.saturating_mul(-1_000_000_000)
                .saturating_add(i64::from(d.subsec_nanos()))
        }
    }
}

fn set_time(time: TimeOrNow) -> SetTime {
    match time {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(at) => SetTime::At(request_timestamp(at)),
    }
}

fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::File => FileType::RegularFile,
        FileKind::Directory => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
    }
}

fn file_attr(attr: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(attr.ino.0),
        size: attr.size,
        blocks: attr.blocks_512(),
        atime: system_time(attr.atime),
        mtime: system_time(attr.mtime),
        ctime: system_time(attr.ctime),
        crtime: system_time(attr.ctime),
        kind: file_type(attr.kind),
        perm: (attr.perm & 0o7777) as u16,
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        rdev: attr.rdev,
        blksize: BLOCK_SIZE_HINT,
        flags: 0,
    }
}

/// A negative entry: the kernel caches "no such name" for the entry TTL.
fn negative_attr() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: BLOCK_SIZE_HINT,
        flags: 0,
    }
}

fn ino(ino: INodeNo) -> InodeNo {
    InodeNo(ino.0)
}

fn fh(fh: FileHandle) -> computer_vfs::FileHandle {
    computer_vfs::FileHandle(fh.0)
}

/// The mount option for the kernel's own permission checks. Where other users can reach
/// the mount (`allow_other`, or a daemon not run by root) the kernel checks as well as
/// the store: some accesses never reach a FUSE daemon (opening a FIFO or a socket, and
/// walking through a directory whose entries the kernel has cached), so only the kernel
/// can refuse them. A mount only root can reach (no `allow_other`: the kernel and fuser
/// turn every other user away) leaves the checks to the store, which saves the kernel a
/// GETATTR of the directory before each lookup after a change of it; the mount is then
/// given `nosuid`, which it has anyway, in place of the option. Where files are opened
/// without asking (`cached_opens`), the kernel checks too: no OPEN reaches the store.
pub fn permission_option(allow_other: bool, cached_opens: bool) -> MountOption {
    if kernel_checks_permissions(allow_other, cached_opens) {
        MountOption::DefaultPermissions
    } else {
        MountOption::NoSuid
    }
}

/// Whether [`permission_option`] has the kernel check permissions.
pub fn kernel_checks_permissions(allow_other: bool, cached_opens: bool) -> bool {
    allow_other || cached_opens || !nix::unistd::geteuid().is_root()
}

/// `fs.protected_hardlinks` (1 where it cannot be read, the common setting).
fn protected_hardlinks() -> bool {
    std::fs::read_to_string("/proc/sys/fs/protected_hardlinks")
        .map_or(true, |value| value.trim() != "0")
}

/// The process behind a request, as the permission rules may need it: its supplementary
/// groups and capabilities, which FUSE does not send. They are read from
/// `/proc/<tid>/status` (the request carries the thread's id, and credentials are per
/// thread) once, and only if a rule asks; the thread waits for our reply meanwhile, so
/// the id cannot be reused under us. Nothing is cached across requests: groups and
/// capabilities change.
pub struct RequestProcess {
    tid: u32,
    uid: u32,
    status: std::cell::OnceCell<ProcessCredentials>,
}

#[derive(Default)]
struct ProcessCredentials {
    groups: Vec<u32>,
    /// `CapEff`, or `None` if it could not be read.
    capabilities: Option<u64>,
}

impl RequestProcess {
    pub fn of(sender: &Sender) -> RequestProcess {
        RequestProcess {
            tid: sender.pid,
            uid: sender.uid,
            status: std::cell::OnceCell::new(),
        }
    }

    fn status(&self) -> &ProcessCredentials {
        self.status.get_or_init(|| {
            if self.tid == 0 {
                // Not a process of our namespace: nothing to read.
                return ProcessCredentials::default();
            }
            std::fs::read_to_string(format!("/proc/{}/status", self.tid))
                .map(|text| parse_status(&text))
                .unwrap_or_default()
        })
    }
}

/// The `Groups:` and `CapEff:` lines of `/proc/<pid>/status`.
fn parse_status(text: &str) -> ProcessCredentials {
    let mut out = ProcessCredentials::default();
    for line in text.lines() {
        if let Some(groups) = line.strip_prefix("Groups:") {
            out.groups = groups
                .split_whitespace()
                .filter_map(|g| g.parse().ok())
                .collect();
        } else if let Some(caps) = line.strip_prefix("CapEff:") {
            out.capabilities = u64::from_str_radix(caps.trim(), 16).ok();
        }
    }
    out
}

impl CallerInfo for RequestProcess {
    fn in_supplementary_group(&self, gid: u32) -> bool {
        self.status().groups.contains(&gid)
    }

    fn capable(&self, cap: Capability) -> bool {
        match self.status().capabilities {
            Some(set) => set & (1 << cap.number()) != 0,
            // Unknown (the process is gone, or from another namespace): root is taken to
            // have its usual capabilities, anyone else none.
            None => self.uid == 0,
        }
    }
}

/// Who sent a request, as its header says: what a handler needs of it, whichever
/// transport carried it.
#[derive(Clone, Copy, Debug)]
pub struct Sender {
    pub uid: u32,
    pub gid: u32,
    /// The thread that made the call, in the kernel's view (0 for the kernel's own).
    pub pid: u32,
}

impl Sender {
    pub fn of(req: &Request) -> Sender {
        Sender {
            uid: req.uid(),
            gid: req.gid(),
            pid: req.pid(),
        }
    }
}

/// The cookie the kernel hands back for an entry: `.` is 1, `..` is 2, store cookies follow.
const DOT_COOKIES: u64 = 2;

impl WorkspaceFs {
    fn reply_entry(&self, reply: impl answer::Entry, result: computer_vfs::Result<Attr>) {
        reply.answer(result, |reply, attr| {
            reply.entry(&TTL, &file_attr(&attr), Generation(0))
        })
    }

    fn open_flags(&self, flags: i32) -> OpenFlags {
        let mut flags = OpenFlags::from_libc(flags);
        // With writeback caching the kernel computes append offsets itself.
        if self.writeback.load(Ordering::Relaxed) {
            flags.append = false;
        }
        flags
    }

    /// The answer to an `open`: through passthrough if the store staged the file and the
    /// kernel takes it, otherwise served by the daemon.
    /// `may_fill`: the open only reads, through the page cache.
    fn reply_opened(
        &self,
        reply: impl answer::Open,
        inode: INodeNo,
        opened: &Opened,
        (writes, may_fill): (bool, bool),
    ) {
        let (mut file, fill) = self.open_file(inode, opened);
        if opened.staged.is_none() && !writes {
            // Nothing to commit at its close: `cat`, `grep -r` and `git status` open
            // thousands of files, and each FLUSH would be a round trip (the kernel keeps
            // POSIX locks itself: this daemon implements none).
            file.flags |= FopenFlags::FOPEN_NOFLUSH;
        }
        if fill && may_fill {
            self.fill_pages(inode, opened.handle);
        }
        reply.opened(&file)
    }

    /// Stores the whole content of a small file that nothing else has open in the
    /// kernel's page cache, before the open's reply: the reads that follow send no
    /// READ (see `kernel_pages`). The caller holds the file's page lock.
    fn fill_pages(&self, inode: INodeNo, handle: computer_vfs::FileHandle) {
        let Some(notifier) = self.notifier.get() else {
            return;
        };
        let content = match self.ws.whole_if_sole(handle, kernel_pages::FILL_BYTES_MAX) {
            Ok(Some(content)) => content,
            Ok(None) => return,
            Err(err) => {
                // The reads that follow will meet it and report it.
                tracing::debug!("{inode}: not filling the page cache: {err}");
                return;
            }
        };
        match notifier.store(inode, 0, &content) {
            Ok(()) => self.pages.filled(inode.0),
            Err(err) => tracing::debug!(
                "{inode}: storing {} bytes in the page cache: {err}",
                content.len()
            ),
        }
    }

    /// The answer to a `create`, as [`WorkspaceFs::reply_opened`] with the new entry.
    /// Where files are opened without asking, the new file is too: no RELEASE would come
    /// for a handle (see `init`), so the daemon keeps none, and the kernel sends handle
    /// 0 as for any other file (`unopened`).
    fn reply_created(&self, reply: impl answer::Create, fuse_attr: &FileAttr, opened: &Opened) {
        let entry = answer::NewEntry {
            ttl: &TTL,
            attr: fuse_attr,
            generation: Generation(0),
        };
        if !self.open_skipped.load(Ordering::Relaxed) {
            let (file, _empty) = self.open_file(fuse_attr.ino, opened);
            if file.backing_id.is_some() {
                self.pages.created(fuse_attr.ino.0);
            }
            return reply.created(&entry, &file);
        }
        if let Err(err) = self.ws.release(opened.handle) {
            return reply.fail(errno(&err));
        }
        let unopened = FileHandle(computer_vfs::FileHandle::UNOPENED.0);
        reply.created(
            &entry,
            &answer::OpenFile::served(unopened, FopenFlags::FOPEN_KEEP_CACHE),
        )
    }

    /// How the kernel reaches an open file's data: a staged file through passthrough
    /// where the kernel takes it, else through the daemon without the page cache (other
    /// handles may pass through); an unstaged file through the page cache. And whether
    /// the content may come with the open (`kernel_pages`).
    fn open_file(&self, inode: INodeNo, opened: &Opened) -> (answer::OpenFile, bool) {
        let fh = FileHandle(opened.handle.0);
        let Some(staged) = &opened.staged else {
            let cached = self.pages.cached_open(inode.0);
            let flags = match cached.keep {
                true => FopenFlags::FOPEN_KEEP_CACHE,
                false => FopenFlags::empty(),
            };
            return (answer::OpenFile::served(fh, flags), cached.fill);
        };
        if !opened.passthrough {
            return (
                answer::OpenFile::served(fh, FopenFlags::FOPEN_DIRECT_IO),
                false,
            );
        }
        let file = match self.backing_id(inode, opened.handle.0, staged) {
            Some(id) => answer::OpenFile {
                fh,
                flags: FopenFlags::FOPEN_NOFLUSH,
                backing_id: Some(id),
            },
            // Served through the daemon from the staging file; no page cache to trust.
            None => answer::OpenFile::served(fh, FopenFlags::empty()),
        };
        (file, false)
    }
}

/// The handlers of the requests both transports carry: fuser's `Filesystem` methods
/// below call them with fuser's replies, the io_uring queues (`fuse_ring`) with theirs.
impl WorkspaceFs {
    pub(crate) fn serve_lookup(
        &self,
        sender: &Sender,
        parent: INodeNo,
        name: &OsStr,
        reply: impl answer::Entry,
    ) {
        let _timer = self.timer("lookup");
        let found = self.as_caller(sender, |who| {
            self.ws.lookup(who, ino(parent), name.as_bytes())
        });
        match found {
            Ok(attr) => reply.entry(&TTL, &file_attr(&attr), Generation(0)),
            // Cached as long as a positive entry: names appear only through this
            // kernel (which replaces the negative entry itself) or through a sync,
            // which invalidates each name it adds. git and compilers probe many.
            Err(Error::NotFound(_)) => reply.entry(&TTL, &negative_attr(), Generation(0)),
            Err(err) => reply.fail(errno(&err)),
        }
    }

    pub(crate) fn serve_getattr(&self, inode: INodeNo, reply: impl answer::Attr) {
        let _timer = self.timer("getattr");
        reply.answer_node(self.ws.getattr(ino(inode)), |reply, attr| {
            reply.attr(&TTL, &file_attr(&attr))
        })
    }

    pub(crate) fn serve_readlink(&self, inode: INodeNo, reply: impl answer::Data) {
        let _timer = self.timer("readlink");
        reply.answer_node(self.ws.readlink(ino(inode)), |reply, target| {
            reply.data(&target)
        })
    }

    /// On a read-only mount, answered ENOSYS where the kernel can take it, so that it
    /// opens every file of this connection without asking (`no_open`) and keeps each
    /// file's pages (`FOPEN_KEEP_CACHE`, its default then): reading a file the kernel
    /// has cached (`grep -r`, `cat`, `git status`) costs no round trip. Nothing can
    /// change a file behind such a mount, and a file it cannot write needs no handle:
    /// a read that reaches the daemon opens, reads and closes in one request
    /// ([`WorkspaceFs::read_unopened`]), checking the read permission an open checks.
    /// A writable mount keeps its opens, which hand files to passthrough, and so does a
    /// replica's, whose server changes files behind it.
    pub(crate) fn serve_open(
        &self,
        sender: &Sender,
        inode: INodeNo,
        flags: i32,
        reply: impl answer::Open,
    ) {
        let _timer = self.timer("open");
        if self.open_skipped.load(Ordering::Relaxed) {
            return reply.fail(Errno::ENOSYS);
        }
        let direct = flags & libc::O_DIRECT != 0;
        let flags = self.open_flags(flags);
        let passthrough = self.passthrough.load(Ordering::Relaxed);
        let may_fill = !flags.write && !flags.truncate && !direct;
        // Until the reply: no other open of the file may start reading or writing it
        // while its pages are filled (`kernel_pages`).
        let _pages = self.pages.lock(inode.0);
        let opened = self.as_caller(sender, |who| {
            self.ws.open_for_kernel(who, ino(inode), flags, passthrough)
        });
        reply.answer_node(opened, |reply, opened| {
            self.reply_opened(reply, inode, &opened, (flags.write, may_fill))
        });
    }

    pub(crate) fn serve_read(
        &self,
        sender: &Sender,
        inode: INodeNo,
        handle: FileHandle,
        offset: u64,
        size: u32,
        reply: impl answer::Data,
    ) {
        let _timer = self.timer("read");
        let result = if self.open_skipped.load(Ordering::Relaxed) {
            self.read_unopened(sender, inode, |handle| {
                self.ws.read(handle, offset, size as usize)
            })
        } else {
            self.ws.read(fh(handle), offset, size as usize)
        };
        reply.answer(result, |reply, data| reply.data(&data))
    }

    /// A READ into `buf`, the transport's reply in place (the ring's payload buffer):
    /// returns how many bytes it filled.
    pub(crate) fn serve_read_into(
        &self,
        sender: &Sender,
        inode: INodeNo,
        handle: FileHandle,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, Errno> {
        let _timer = self.timer("read");
        let result = if self.open_skipped.load(Ordering::Relaxed) {
            self.read_unopened(sender, inode, |handle| {
                self.ws.read_into(handle, offset, buf)
            })
        } else {
            self.ws.read_into(fh(handle), offset, buf)
        };
        result.map_err(|err| errno(&err))
    }

    /// `read` of a file the kernel opened without asking (see `serve_open`), through a
    /// handle open for it alone.
    fn read_unopened<T>(
        &self,
        sender: &Sender,
        inode: INodeNo,
        read: impl FnOnce(computer_vfs::FileHandle) -> computer_vfs::Result<T>,
    ) -> computer_vfs::Result<T> {
        // Where the kernel checks permissions, it checked the open, execute-only opens
        // included, which a READ does not tell apart.
        if self.config.kernel_checks_permissions {
            return self.with_unopened_reader(Who::Trusted, inode, read);
        }
        self.as_caller(sender, |who| self.with_unopened_reader(who, inode, read))
    }

    /// Calls `op` with a read-only handle of `inode` opened for it alone, as `who`.
    fn with_unopened_reader<T>(
        &self,
        who: Who<'_>,
        inode: INodeNo,
        op: impl FnOnce(computer_vfs::FileHandle) -> computer_vfs::Result<T>,
    ) -> computer_vfs::Result<T> {
        let read_only = OpenFlags::from_libc(libc::O_RDONLY);
        let opened = self.ws.open_for_kernel(who, ino(inode), read_only, false)?;
        let data = op(opened.handle);
        let released = self.ws.release(opened.handle);
        let data = data?;
        released?;
        Ok(data)
    }

    /// Where files are opened without asking, ENOSYS, after which the kernel stops
    /// sending FLUSH (`no_flush`): each close of such a file would be a round trip. A
    /// file created on such a mount (CREATE is still asked) commits at its release.
    pub(crate) fn serve_flush(&self, handle: FileHandle, reply: impl answer::Empty) {
        let _timer = self.timer("flush");
        if self.open_skipped.load(Ordering::Relaxed) {
            return reply.fail(Errno::ENOSYS);
        }
        reply.answer(self.ws.flush(fh(handle)), |reply, ()| reply.ok())
    }

    pub(crate) fn serve_release(
        &self,
        inode: INodeNo,
        handle: FileHandle,
        reply: impl answer::Empty,
    ) {
        let _timer = self.timer("release");
        if fh(handle) == computer_vfs::FileHandle::UNOPENED {
            // The first file the kernel opened when OPEN answered ENOSYS: no handle.
            return reply.ok();
        }
        self.forget_backing(handle.0, inode);
        reply.answer(self.ws.release(fh(handle)), |reply, ()| reply.ok())
    }

    /// On a read-only mount there is nothing to make durable. A file opened without
    /// asking is synced through the writer held for it, or a handle opened for the sync.
    pub(crate) fn serve_fsync(
        &self,
        inode: INodeNo,
        handle: FileHandle,
        datasync: bool,
        reply: impl answer::Empty,
    ) {
        let _timer = self.timer("fsync");
        if self.config.read_only {
            return reply.ok();
        }
        let sync = |handle| self.ws.fsync(handle, datasync);
        let result = if fh(handle) != computer_vfs::FileHandle::UNOPENED {
            sync(fh(handle))
        } else if let Some(writer) = self.unopened.in_use(ino(inode)) {
            sync(writer.handle)
        } else {
            self.with_unopened_reader(Who::Trusted, inode, sync)
        };
        reply.answer(result, |reply, ()| reply.ok())
    }

    /// Answered ENOSYS where the kernel can take it, so that it opens every directory of
    /// this connection without asking (`no_opendir`): a walk over a tree the kernel has
    /// cached (`find`, `git status`) then costs no round trip per directory. The kernel
    /// keeps each listing (`FOPEN_CACHE_DIR`, its default for such a connection); it
    /// drops one itself when a request through this mount changes the directory, and is
    /// told to when another route does (`replica::KernelCache`) or the directory's mode
    /// or owner changes (`setattr`). The read permission a listing needs is checked when
    /// the listing is read from the daemon (the store's `readdir` and `readdir_plus`
    /// check what `opendir` checks), and here too for a kernel that keeps asking.
    pub(crate) fn serve_opendir(&self, sender: &Sender, inode: INodeNo, reply: impl answer::Open) {
        let _timer = self.timer("opendir");
        if self.opendir_skipped.load(Ordering::Relaxed) {
            return reply.fail(Errno::ENOSYS);
        }
        let cached = FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE;
        let result = self.as_caller(sender, |who| self.ws.opendir(who, ino(inode)));
        let dir = answer::OpenFile::served(FileHandle(0), cached);
        reply.answer_node(result, |reply, _| reply.opened(&dir))
    }

    pub(crate) fn serve_readdir(
        &self,
        sender: &Sender,
        inode: INodeNo,
        offset: u64,
        mut reply: impl answer::Directory,
    ) {
        let _timer = self.timer("readdir");
        let (dir, process) = (ino(inode), RequestProcess::of(sender));
        let mut after = offset.saturating_sub(DOT_COOKIES);
        // The first page is read before anything is added: reading it checks that the
        // caller may list the directory, as `opendir` does, and a refusal must be the
        // whole answer. The later pages of this answer need no second check.
        let caller = self.caller(sender, &process);
        let mut entries = match self.ws.readdir(caller, dir, after, READDIR_BATCH) {
            Ok(entries) => entries,
            Err(err) => return reply.fail(errno(&err)),
        };
        if offset < 1 && reply.add(inode, 1, FileType::Directory, OsStr::new(".")) {
            return reply.ok();
        }
        // The kernel ignores the inode of `..` in a listing; any directory will do.
        if offset < 2 && reply.add(inode, 2, FileType::Directory, OsStr::new("..")) {
            return reply.ok();
        }
        while let Some(last) = entries.last() {
            after = last.cookie;
            for entry in entries {
                let name = OsStr::from_bytes(&entry.name);
                let (node, cookie) = (INodeNo(entry.ino.0), entry.cookie + DOT_COOKIES);
                if reply.add(node, cookie, file_type(entry.kind), name) {
                    return reply.ok();
                }
            }
            entries = match self.ws.readdir(Who::Trusted, dir, after, READDIR_BATCH) {
                Ok(entries) => entries,
                Err(err) => return reply.fail(errno(&err)),
            };
        }
        reply.ok()
    }

    pub(crate) fn serve_readdirplus(
        &self,
        sender: &Sender,
        inode: INodeNo,
        offset: u64,
        mut reply: impl answer::DirectoryPlus,
    ) {
        let _timer = self.timer("readdirplus");
        let (dir, process) = (ino(inode), RequestProcess::of(sender));
        let mut after = offset.saturating_sub(DOT_COOKIES);
        // As in `readdir`: the first page, read first, is the permission check.
        let caller = self.caller(sender, &process);
        let (dir_attr, mut entries) = match self.ws.readdir_plus(caller, dir, after, READDIR_BATCH)
        {
            Ok(page) => page,
            Err(err) => return reply.fail(errno(&err)),
        };
        // The kernel makes no dentries for `.` and `..`: their attributes are unused.
        let this = file_attr(&dir_attr);
        if offset < 1 && reply.add(inode, 1, OsStr::new("."), &TTL, &this, Generation(0)) {
            return reply.ok();
        }
        if offset < 2 && reply.add(inode, 2, OsStr::new(".."), &TTL, &this, Generation(0)) {
            return reply.ok();
        }
        while let Some((last, _)) = entries.last() {
            after = last.cookie;
            for (entry, attr) in entries {
                let name = OsStr::from_bytes(&entry.name);
                let (node, cookie) = (INodeNo(entry.ino.0), entry.cookie + DOT_COOKIES);
                let attr = file_attr(&attr);
                if reply.add(node, cookie, name, &TTL, &attr, Generation(0)) {
                    return reply.ok();
                }
            }
            entries = match self
                .ws
                .readdir_plus(Who::Trusted, dir, after, READDIR_BATCH)
            {
                Ok((_, entries)) => entries,
                Err(err) => return reply.fail(errno(&err)),
            };
        }
        reply.ok()
    }

    pub(crate) fn serve_fsyncdir(&self, reply: impl answer::Empty) {
        let _timer = self.timer("fsyncdir");
        reply.answer(self.ws.sync_entries(), |reply, ()| reply.ok())
    }

    pub(crate) fn serve_statfs(&self, reply: impl answer::Statfs) {
        let _timer = self.timer("statfs");
        reply.answer(self.ws.statfs(), |reply, s| {
            reply.statfs(&answer::FsCounts {
                blocks: s.blocks_total,
                bfree: s.blocks_free,
                bavail: s.blocks_free,
                files: s.inodes_total,
                ffree: s.inodes_free,
                bsize: s.block_size,
                namelen: s.name_max,
                frsize: s.block_size,
            })
        })
    }

    pub(crate) fn serve_getxattr(
        &self,
        sender: &Sender,
        inode: INodeNo,
        name: &OsStr,
        size: u32,
        reply: impl answer::Xattr,
    ) {
        let _timer = self.timer("getxattr");
        let result = self.as_caller(sender, |who| {
            self.ws.getxattr(who, ino(inode), name.as_bytes())
        });
        reply.answer(result, |reply, value| reply_xattr(reply, size, &value))
    }

    pub(crate) fn serve_listxattr(&self, inode: INodeNo, size: u32, reply: impl answer::Xattr) {
        let _timer = self.timer("listxattr");
        reply.answer(self.ws.listxattr(ino(inode)), |reply, names| {
            // The kernel's format: each name followed by a NUL.
            let list: Vec<u8> = names
                .iter()
                .flat_map(|name| name.iter().copied().chain([0]))
                .collect();
            reply_xattr(reply, size, &list)
        })
    }

    pub(crate) fn serve_access(
        &self,
        sender: &Sender,
        inode: INodeNo,
        mask: i32,
        reply: impl answer::Empty,
    ) {
        let _timer = self.timer("access");
        // Sent for access(2) and chdir(2) when the kernel leaves permissions to us.
        let want = Access::from_mask(mask);
        let process = RequestProcess::of(sender);
        let result = self
            .ws
            .access(&self.credentials(sender, &process), ino(inode), want);
        reply.answer_node(result, |reply, ()| reply.ok())
    }

    pub(crate) fn serve_lseek(
        &self,
        inode: INodeNo,
        offset: i64,
        whence: i32,
        reply: impl answer::Lseek,
    ) {
        let _timer = self.timer("lseek");
        // Holes are not reported: all data up to the size, one hole at the end, as
        // filesystems without hole tracking answer.
        reply.answer(self.ws.getattr(ino(inode)), |reply, attr| {
            let size = attr.size as i64;
            match whence {
                libc::SEEK_DATA if offset < size => reply.offset(offset),
                libc::SEEK_HOLE if offset < size => reply.offset(size),
                libc::SEEK_DATA | libc::SEEK_HOLE => reply.fail(Errno::ENXIO),
                _ => reply.fail(Errno::EINVAL),
            }
        })
    }

    /// Whether the kernel opens the files of this writable mount without asking, so
    /// that writes and deletions go through `unopened`'s writers and holds.
    fn writes_unopened(&self) -> bool {
        !self.config.read_only && self.open_skipped.load(Ordering::Relaxed)
    }

    /// How writes reach the store, negotiated in INIT: passthrough to staging files
    /// where the kernel offers it, else the writeback cache, else one WRITE per write(2).
    fn choose_write_path(&self, config: &mut KernelConfig, cached_opens: bool) {
        // Where files are opened without asking, the kernel sends no RELEASE for the
        // files it creates either (measured on 6.18): nothing would say when a file
        // written through passthrough is done with. Every write goes through the page
        // cache to the daemon instead (`unopened`).
        let writable = !self.config.read_only;
        if writable && self.config.passthrough && self.ws.has_staging() && !cached_opens {
            let offered = config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok();
            if offered && config.set_max_stack_depth(1).is_ok() {
                self.passthrough.store(true, Ordering::Relaxed);
            }
        }
        // Nor the writeback cache: with it the kernel marks a file's block count stale at
        // every close, and the next `stat` of it asks the daemon again (a GETATTR per
        // file in every `grep -r`, measured), which is what opening without asking saves.
        let passthrough = self.passthrough.load(Ordering::Relaxed);
        if writable && self.config.writeback_cache && !passthrough && !cached_opens {
            let writeback = config
                .add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE)
                .is_ok();
            self.writeback.store(writeback, Ordering::Relaxed);
        }
    }

    /// Which opens the kernel may do without asking, as INIT told: directories always
    /// (`serve_opendir`), files on a mount of a workspace's owner that is read-only or
    /// has `cached_opens` (`serve_open`).
    fn skip_opens(&self, config: &KernelConfig) {
        let offered = config.capabilities();
        let skip_opendir = offered.contains(InitFlags::FUSE_NO_OPENDIR_SUPPORT);
        self.opendir_skipped.store(skip_opendir, Ordering::Relaxed);
        // Not on a replica: its server's changes reach the store behind the kernel's back.
        if self.config.cached_opens && self.config.replica {
            tracing::warn!("--cached-opens is ignored on a replica: every open asks the daemon");
        }
        let wanted = (self.config.read_only || self.config.cached_opens) && !self.config.replica;
        let skip_open = wanted && offered.contains(InitFlags::FUSE_NO_OPEN_SUPPORT);
        self.open_skipped.store(skip_open, Ordering::Relaxed);
        if self.writes_unopened() {
            if let Err(err) = self.unopened.start_sweeper(self.ws.clone()) {
                tracing::warn!("cannot start the thread that commits written files: {err}");
                self.open_skipped.store(false, Ordering::Relaxed);
            }
        }
    }
}

impl Filesystem for WorkspaceFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Without `FUSE_READDIRPLUS_AUTO` every page of a listing comes with attributes:
        // a walk that stats, opens or deletes the entries of a large directory sends no
        // LOOKUP for each, and one that wants names only pays about 3 µs an entry for
        // the inode the kernel makes. With it, later pages come with attributes only
        // once a LOOKUP in the directory showed the kernel that someone looks at them:
        // for `du` or `rm -r`, after they listed the whole directory.
        let readdirplus_auto = if self.config.readdirplus_auto {
            InitFlags::FUSE_READDIRPLUS_AUTO
        } else {
            InitFlags::empty()
        };
        self.skip_opens(config);
        let cached_opens = self.writes_unopened();
        let wanted = [
            InitFlags::FUSE_DO_READDIRPLUS,
            readdirplus_auto,
            InitFlags::FUSE_PARALLEL_DIROPS,
            // The server drops set-id bits after writes (`write`); in exchange the kernel
            // stops asking for `security.capability` before every write(2) (SB_NOSEC),
            // a round trip per write. Files whose writes drop bits are never handed to
            // passthrough, so every such write reaches the store.
            InitFlags::FUSE_HANDLE_KILLPRIV_V2,
            InitFlags::FUSE_CACHE_SYMLINKS,
            InitFlags::FUSE_EXPLICIT_INVAL_DATA,
        ];
        for flag in wanted {
            if config.add_capabilities(flag).is_err() {
                tracing::info!("kernel does not offer {flag:?}");
            }
        }
        if self.config.io_uring {
            match config.add_capabilities(InitFlags::FUSE_OVER_IO_URING) {
                Ok(()) => self.ring_agreed.store(true, Ordering::Relaxed),
                Err(_) => tracing::warn!(
                    "the kernel does not offer FUSE over io_uring here; serving over /dev/fuse"
                ),
            }
        }
        // Passthrough and the writeback cache exclude each other (the kernel refuses
        // backing files once writeback is negotiated); passthrough wins where offered.
        self.choose_write_path(config, cached_opens);
        if let Err(nearest) = config.set_max_write(MAX_WRITE) {
            let _ = config.set_max_write(nearest);
        }
        let _ = config.set_max_background(64);
        let _ = config.set_time_granularity(Duration::from_nanos(1));
        tracing::info!(
            writeback = self.writeback.load(Ordering::Relaxed),
            passthrough = self.passthrough.load(Ordering::Relaxed),
            io_uring = self.ring_agreed(),
            "FUSE session initialised"
        );
        Ok(())
    }

    fn destroy(&mut self) {
        self.unopened.stop(&self.ws);
        self.deleted_holds.release_every(&self.ws);
        if let Some(report) = self.op_stats_report() {
            // Asked for, so said even where the log filter hides information (once:
            // a daemon's stderr is its log file too).
            if tracing::enabled!(tracing::Level::INFO) {
                tracing::info!("FUSE requests served:\n{report}");
            } else {
                eprintln!("FUSE requests served:\n{report}");
            }
        }
        if !self.config.read_only {
            if let Err(err) = self.ws.checkpoint() {
                tracing::error!("failed to flush the workspace at unmount: {err}");
            }
        }
    }

    /// Forgets come over `/dev/fuse` whichever transport carries the rest (fuser's
    /// `batch_forget` calls this for each).
    fn forget(&self, _req: &Request, inode: INodeNo, _nlookup: u64) {
        self.serve_forget(inode)
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.serve_lookup(&Sender::of(req), parent, name, reply)
    }

    fn getattr(&self, _req: &Request, inode: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.serve_getattr(inode, reply)
    }

    fn setattr(
        &self,
        req: &Request,
        inode: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let changes = SetAttr {
            perm: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size,
            atime: atime.map(set_time),
            mtime: mtime.map(set_time),
            ctime: ctime.map(request_timestamp),
            through_handle: fh.is_some(),
        };
        self.serve_setattr(&Sender::of(req), inode, changes, reply)
    }

    fn readlink(&self, _req: &Request, inode: INodeNo, reply: ReplyData) {
        self.serve_readlink(inode, reply)
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.serve_mknod(&Sender::of(req), parent, name, mode, rdev, reply)
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        self.serve_mkdir(&Sender::of(req), parent, name, mode, reply)
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.serve_unlink(&Sender::of(req), parent, name, reply)
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.serve_rmdir(&Sender::of(req), parent, name, reply)
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        let target = target.as_os_str();
        self.serve_symlink(&Sender::of(req), parent, link_name, target, reply)
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (from, to) = ((parent, name), (newparent, newname));
        self.serve_rename(&Sender::of(req), from, to, flags.bits(), reply)
    }

    fn link(
        &self,
        req: &Request,
        inode: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.serve_link(&Sender::of(req), inode, newparent, newname, reply)
    }

    fn open(&self, req: &Request, inode: INodeNo, flags: fuser::OpenFlags, reply: ReplyOpen) {
        self.serve_open(&Sender::of(req), inode, flags.0, reply)
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.serve_create(&Sender::of(req), parent, name, mode, flags, reply)
    }

    fn read(
        &self,
        req: &Request,
        inode: INodeNo,
        handle: FileHandle,
        offset: u64,
        size: u32,
        _flags: fuser::OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.serve_read(&Sender::of(req), inode, handle, offset, size, reply)
    }

    fn write(
        &self,
        req: &Request,
        inode: INodeNo,
        handle: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: fuser::OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let flags = write_flags.bits();
        let at = (handle, offset);
        self.serve_write(&Sender::of(req), inode, at, data, flags, reply)
    }

    fn flush(
        &self,
        _req: &Request,
        _inode: INodeNo,
        handle: FileHandle,
        _owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.serve_flush(handle, reply)
    }

    fn release(
        &self,
        _req: &Request,
        inode: INodeNo,
        handle: FileHandle,
        _flags: fuser::OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.serve_release(inode, handle, reply)
    }

    fn fsync(
        &self,
        _req: &Request,
        inode: INodeNo,
        handle: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.serve_fsync(inode, handle, datasync, reply)
    }

    fn opendir(&self, req: &Request, inode: INodeNo, _flags: fuser::OpenFlags, reply: ReplyOpen) {
        self.serve_opendir(&Sender::of(req), inode, reply)
    }

    fn readdir(
        &self,
        req: &Request,
        inode: INodeNo,
        _fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        self.serve_readdir(&Sender::of(req), inode, offset, reply)
    }

    fn readdirplus(
        &self,
        req: &Request,
        inode: INodeNo,
        _fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        self.serve_readdirplus(&Sender::of(req), inode, offset, reply)
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _inode: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.serve_fsyncdir(reply)
    }

    fn statfs(&self, _req: &Request, _inode: INodeNo, reply: ReplyStatfs) {
        self.serve_statfs(reply)
    }

    fn setxattr(
        &self,
        req: &Request,
        inode: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        self.serve_setxattr(&Sender::of(req), inode, name, value, flags, reply)
    }

    fn getxattr(&self, req: &Request, inode: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.serve_getxattr(&Sender::of(req), inode, name, size, reply)
    }

    fn listxattr(&self, _req: &Request, inode: INodeNo, size: u32, reply: ReplyXattr) {
        self.serve_listxattr(inode, size, reply)
    }

    fn removexattr(&self, req: &Request, inode: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.serve_removexattr(&Sender::of(req), inode, name, reply)
    }

    fn access(&self, req: &Request, inode: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        self.serve_access(&Sender::of(req), inode, mask.bits(), reply)
    }

    fn fallocate(
        &self,
        _req: &Request,
        inode: INodeNo,
        handle: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.serve_fallocate(inode, handle, offset, length, mode, reply)
    }

    fn lseek(
        &self,
        _req: &Request,
        inode: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        self.serve_lseek(inode, offset, whence, reply)
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        _ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let (from, to) = ((fh_in, offset_in), (fh_out, offset_out));
        self.serve_copy_file_range(from, to, len, reply)
    }
}

fn reply_xattr(reply: impl answer::Xattr, size: u32, value: &[u8]) {
    if size == 0 {
        reply.size(value.len() as u32);
    } else if value.len() > size as usize {
        reply.fail(Errno::ERANGE);
    } else {
        reply.data(value);
    }
}
