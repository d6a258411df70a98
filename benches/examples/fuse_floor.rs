//! The floor of a FUSE filesystem on this machine: an in-memory filesystem that stores
//! nothing durably and decides almost nothing, so that what a workload costs on it is
//! what the kernel's FUSE protocol costs, not what a store costs.
//!
//! It exists to answer one question with a measurement: how close to ext4 can *any*
//! FUSE daemon get on a metadata-heavy workload (fsbench's `git init + commit`)? Run a
//! workload on it, on a computerd mount and on ext4 in the same run:
//!
//! ```sh
//! cargo run --release -p computer-benches --example fuse_floor -- /tmp/floor &
//! # wait until /tmp/floor is in /proc/mounts, then for example
//! target/release/fsbench --computerd target/release/computerd --target floor=/tmp/floor \
//!     --only "git init" --reps 15 --warmup 1
//! umount /tmp/floor
//! ```
//!
//! It negotiates what computerd negotiates (readdirplus, parallel directory operations,
//! long entry and attribute timeouts, cached negative entries), but keeps every file in
//! a `Vec<u8>` behind one mutex, with no permission checks and no change log. Not a
//! filesystem to keep anything in.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::Parser;
use fuser::{
    AccessFlags, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, KernelConfig, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

const TTL: Duration = Duration::from_secs(3600);
const ROOT: u64 = 1;

#[derive(Parser)]
#[command(about = "An in-memory FUSE filesystem: the protocol's floor, for benchmarks")]
struct Args {
    /// Where to mount it (an existing directory).
    mountpoint: PathBuf,
    /// FUSE worker threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Make the device non-blocking, so that every worker spins on it instead of
    /// sleeping: the lowest round trip a daemon can have, at the price of whole CPUs.
    /// Use with `--threads 1`.
    #[arg(long)]
    spin: bool,
}

enum Body {
    File(Vec<u8>),
    Dir(Dir),
    Symlink(PathBuf),
}

/// A directory's names, each with a cookie that stays valid while others are removed
/// (`rm -r` deletes while it lists). Cookies 1 and 2 are `.` and `..`.
#[derive(Default)]
struct Dir {
    by_name: HashMap<OsString, (u64, u64)>,
    by_cookie: BTreeMap<u64, OsString>,
    next_cookie: u64,
}

impl Dir {
    fn get(&self, name: &OsStr) -> Option<u64> {
        self.by_name.get(name).map(|&(ino, _)| ino)
    }

    fn insert(&mut self, name: &OsStr, ino: u64) {
        if let Some((_, cookie)) = self.by_name.get(name) {
            self.by_cookie.remove(cookie);
        }
        let cookie = self.next_cookie.max(3);
        self.next_cookie = cookie + 1;
        self.by_name.insert(name.to_owned(), (ino, cookie));
        self.by_cookie.insert(cookie, name.to_owned());
    }

    fn remove(&mut self, name: &OsStr) {
        if let Some((_, cookie)) = self.by_name.remove(name) {
            self.by_cookie.remove(&cookie);
        }
    }

    fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// `(cookie, name, ino)` of the entries after cookie `offset`.
    fn after(&self, offset: u64) -> impl Iterator<Item = (u64, &OsStr, u64)> {
        self.by_cookie
            .range(offset.max(2) + 1..)
            .map(|(cookie, name)| (*cookie, name.as_os_str(), self.by_name[name].0))
    }
}

struct Node {
    attr: FileAttr,
    body: Body,
}

struct Tree {
    nodes: HashMap<u64, Node>,
    next_ino: u64,
}

struct FloorFs {
    tree: Mutex<Tree>,
}

fn now() -> SystemTime {
    SystemTime::now()
}

/// Attributes of a new node (`ino` 0 with zeroed times: a negative entry).
fn attr(ino: u64, kind: FileType, perm: u32, uid: u32, gid: u32, at: SystemTime) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: 0,
        blocks: 0,
        atime: at,
        mtime: at,
        ctime: at,
        crtime: at,
        kind,
        perm: (perm & 0o7777) as u16,
        nlink: match (ino, kind) {
            (0, _) => 0,
            (_, FileType::Directory) => 2,
            _ => 1,
        },
        uid,
        gid,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

fn new_attr(ino: u64, kind: FileType, perm: u32, req: &Request) -> FileAttr {
    attr(ino, kind, perm, req.uid(), req.gid(), now())
}

/// The kernel caches "no such name" for the entry timeout.
fn negative() -> FileAttr {
    attr(0, FileType::RegularFile, 0, 0, 0, UNIX_EPOCH)
}

fn time(t: TimeOrNow) -> SystemTime {
    match t {
        TimeOrNow::Now => now(),
        TimeOrNow::SpecificTime(at) => at,
    }
}

impl Tree {
    fn child(&self, parent: u64, name: &OsStr) -> Result<Option<u64>, Errno> {
        match self.nodes.get(&parent).map(|n| &n.body) {
            Some(Body::Dir(entries)) => Ok(entries.get(name)),
            Some(_) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn entries(&mut self, dir: u64) -> Result<&mut Dir, Errno> {
        match self.nodes.get_mut(&dir).map(|n| &mut n.body) {
            Some(Body::Dir(entries)) => Ok(entries),
            Some(_) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn touch(&mut self, ino: u64) {
        if let Some(node) = self.nodes.get_mut(&ino) {
            let at = now();
            node.attr.mtime = at;
            node.attr.ctime = at;
        }
    }

    fn make(
        &mut self,
        parent: u64,
        name: &OsStr,
        kind: FileType,
        perm: u32,
        body: Body,
        req: &Request,
    ) -> Result<FileAttr, Errno> {
        if self.child(parent, name)?.is_some() {
            return Err(Errno::EEXIST);
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        let attr = new_attr(ino, kind, perm, req);
        self.nodes.insert(ino, Node { attr, body });
        self.entries(parent)?.insert(name, ino);
        if kind == FileType::Directory {
            if let Some(dir) = self.nodes.get_mut(&parent) {
                dir.attr.nlink += 1;
            }
        }
        self.touch(parent);
        Ok(attr)
    }

    /// Drops one name of `ino`; the node goes once no name is left. Open handles are
    /// not tracked: this floor does not serve unlinked-but-open files.
    fn drop_link(&mut self, ino: u64) {
        let gone = match self.nodes.get_mut(&ino) {
            Some(node) => {
                node.attr.nlink = node.attr.nlink.saturating_sub(1);
                node.attr.ctime = now();
                node.attr.nlink == 0 || node.attr.kind == FileType::Directory
            }
            None => false,
        };
        if gone {
            self.nodes.remove(&ino);
        }
    }

    fn remove(&mut self, parent: u64, name: &OsStr, dir: bool) -> Result<(), Errno> {
        let ino = self.child(parent, name)?.ok_or(Errno::ENOENT)?;
        let node = self.nodes.get(&ino).ok_or(Errno::ENOENT)?;
        match (&node.body, dir) {
            (Body::Dir(entries), true) if !entries.is_empty() => return Err(Errno::ENOTEMPTY),
            (Body::Dir(_), true) => {}
            (Body::Dir(_), false) => return Err(Errno::EISDIR),
            (_, true) => return Err(Errno::ENOTDIR),
            (_, false) => {}
        }
        self.entries(parent)?.remove(name);
        if dir {
            if let Some(p) = self.nodes.get_mut(&parent) {
                p.attr.nlink -= 1;
            }
        }
        self.touch(parent);
        self.drop_link(ino);
        Ok(())
    }
}

impl FloorFs {
    fn tree(&self) -> std::sync::MutexGuard<'_, Tree> {
        self.tree.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Filesystem for FloorFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        for flag in [
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_READDIRPLUS_AUTO,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_HANDLE_KILLPRIV_V2,
            InitFlags::FUSE_CACHE_SYMLINKS,
        ] {
            let _ = config.add_capabilities(flag);
        }
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_time_granularity(Duration::from_nanos(1));
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let tree = self.tree();
        match tree.child(parent.0, name) {
            Ok(Some(ino)) => reply.entry(&TTL, &tree.nodes[&ino].attr, Generation(0)),
            Ok(None) => reply.entry(&TTL, &negative(), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.tree().nodes.get(&ino.0) {
            Some(node) => reply.attr(&TTL, &node.attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut tree = self.tree();
        let Some(node) = tree.nodes.get_mut(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        if let Some(mode) = mode {
            node.attr.perm = (mode & 0o7777) as u16;
        }
        if let Some(uid) = uid {
            node.attr.uid = uid;
        }
        if let Some(gid) = gid {
            node.attr.gid = gid;
        }
        if let Some(size) = size {
            match &mut node.body {
                Body::File(data) => data.resize(size as usize, 0),
                _ => return reply.error(Errno::EISDIR),
            }
            node.attr.size = size;
            node.attr.mtime = now();
        }
        if let Some(at) = atime {
            node.attr.atime = time(at);
        }
        if let Some(at) = mtime {
            node.attr.mtime = time(at);
        }
        node.attr.ctime = now();
        reply.attr(&TTL, &node.attr)
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.tree().nodes.get(&ino.0).map(|n| &n.body) {
            Some(Body::Symlink(target)) => {
                reply.data(std::os::unix::ffi::OsStrExt::as_bytes(target.as_os_str()))
            }
            Some(_) => reply.error(Errno::EINVAL),
            None => reply.error(Errno::ENOENT),
        }
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
        let body = Body::Dir(Dir::default());
        match self
            .tree()
            .make(parent.0, name, FileType::Directory, mode, body, req)
        {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.tree().remove(parent.0, name, false) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.tree().remove(parent.0, name, true) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let body = Body::Symlink(target.to_owned());
        let mut tree = self.tree();
        match tree.make(parent.0, link_name, FileType::Symlink, 0o777, body, req) {
            Ok(mut attr) => {
                attr.size = target.as_os_str().len() as u64;
                if let Some(node) = tree.nodes.get_mut(&attr.ino.0) {
                    node.attr.size = attr.size;
                }
                reply.entry(&TTL, &attr, Generation(0))
            }
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut tree = self.tree();
        let result = (|| {
            let ino = tree.child(parent.0, name)?.ok_or(Errno::ENOENT)?;
            if let Some(old) = tree.child(newparent.0, newname)? {
                if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                    return Err(Errno::EEXIST);
                }
                if old == ino {
                    return Ok(());
                }
                let old_is_dir = tree.nodes[&old].attr.kind == FileType::Directory;
                tree.remove(newparent.0, newname, old_is_dir)?;
            }
            tree.entries(parent.0)?.remove(name);
            tree.entries(newparent.0)?.insert(newname, ino);
            if tree.nodes[&ino].attr.kind == FileType::Directory && parent != newparent {
                if let Some(p) = tree.nodes.get_mut(&parent.0) {
                    p.attr.nlink -= 1;
                }
                if let Some(p) = tree.nodes.get_mut(&newparent.0) {
                    p.attr.nlink += 1;
                }
            }
            tree.touch(parent.0);
            tree.touch(newparent.0);
            Ok(())
        })();
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let mut tree = self.tree();
        let result = (|| {
            if tree.child(newparent.0, newname)?.is_some() {
                return Err(Errno::EEXIST);
            }
            let node = tree.nodes.get_mut(&ino.0).ok_or(Errno::ENOENT)?;
            node.attr.nlink += 1;
            node.attr.ctime = now();
            let attr = node.attr;
            tree.entries(newparent.0)?.insert(newname, ino.0);
            tree.touch(newparent.0);
            Ok(attr)
        })();
        match result {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let mut tree = self.tree();
        let Some(node) = tree.nodes.get_mut(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        if flags.0 & libc::O_TRUNC != 0 {
            if let Body::File(data) = &mut node.body {
                data.clear();
                node.attr.size = 0;
            }
        }
        reply.opened(
            FileHandle(ino.0),
            FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_NOFLUSH,
        )
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let body = Body::File(Vec::new());
        match self
            .tree()
            .make(parent.0, name, FileType::RegularFile, mode, body, req)
        {
            Ok(attr) => reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(attr.ino.0),
                FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_NOFLUSH,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.tree().nodes.get(&ino.0).map(|n| &n.body) {
            Some(Body::File(data)) => {
                let start = (offset as usize).min(data.len());
                let end = start.saturating_add(size as usize).min(data.len());
                reply.data(&data[start..end])
            }
            Some(_) => reply.error(Errno::EISDIR),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        bytes: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut tree = self.tree();
        let Some(node) = tree.nodes.get_mut(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        let Body::File(data) = &mut node.body else {
            return reply.error(Errno::EISDIR);
        };
        let end = offset as usize + bytes.len();
        if data.len() < end {
            data.resize(end, 0);
        }
        data[offset as usize..end].copy_from_slice(bytes);
        node.attr.size = data.len() as u64;
        node.attr.blocks = node.attr.size.div_ceil(512);
        let at = now();
        node.attr.mtime = at;
        node.attr.ctime = at;
        reply.written(bytes.len() as u32)
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok()
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok()
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let tree = self.tree();
        let Some(Node {
            body: Body::Dir(entries),
            ..
        }) = tree.nodes.get(&ino.0)
        else {
            return reply.error(Errno::ENOTDIR);
        };
        let dots = [(1, OsStr::new("."), ino.0), (2, OsStr::new(".."), ino.0)];
        let listed = dots.into_iter().filter(|d| d.0 > offset);
        for (cookie, name, child) in listed.chain(entries.after(offset)) {
            if reply.add(INodeNo(child), cookie, tree.nodes[&child].attr.kind, name) {
                break;
            }
        }
        reply.ok()
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let tree = self.tree();
        let Some(Node {
            body: Body::Dir(entries),
            attr,
        }) = tree.nodes.get(&ino.0)
        else {
            return reply.error(Errno::ENOTDIR);
        };
        let dots = [(1, OsStr::new("."), ino.0), (2, OsStr::new(".."), ino.0)];
        let listed = dots.into_iter().filter(|d| d.0 > offset);
        for (cookie, name, child) in listed.chain(entries.after(offset)) {
            let attr = if child == ino.0 {
                attr
            } else {
                &tree.nodes[&child].attr
            };
            if reply.add(attr.ino, cookie, name, &TTL, attr, Generation(0)) {
                break;
            }
        }
        reply.ok()
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        reply.error(Errno::ENODATA)
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: ReplyXattr) {
        if size == 0 {
            reply.size(0)
        } else {
            reply.data(&[])
        }
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        reply.ok()
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut nodes = HashMap::new();
    let uid = nix::unistd::getuid().as_raw();
    let gid = nix::unistd::getgid().as_raw();
    let root = attr(ROOT, FileType::Directory, 0o755, uid, gid, now());
    nodes.insert(
        ROOT,
        Node {
            attr: root,
            body: Body::Dir(Dir::default()),
        },
    );
    let fs = FloorFs {
        tree: Mutex::new(Tree {
            nodes,
            next_ino: ROOT + 1,
        }),
    };
    let mut config = Config::default();
    config.n_threads = Some(args.threads);
    config.mount_options = vec![MountOption::FSName("fuse-floor".into()), MountOption::RW];
    let session = fuser::Session::new(fs, &args.mountpoint, &config)
        .with_context(|| format!("mounting {}", args.mountpoint.display()))?;
    if args.spin {
        // fuser retries a read that finds no request (EAGAIN).
        use std::os::fd::AsFd;
        let fd = session.as_fd();
        let flags = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFL)?;
        let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
        nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFL(flags))?;
    }
    session.run().context("serving")?;
    Ok(())
}
