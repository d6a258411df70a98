//! The permission rules of the inode API (for a `Who::Caller`) against the kernel's own.
//!
//! One tree (directories and files with random modes, owners and groups) is built twice:
//! in a scratch directory under the system temp dir (a local filesystem, whose checks
//! are the kernel's `generic_permission` and friends) and in a workspace. One operation
//! then runs on both as the same random user (uid, gid, supplementary groups), and the
//! errno, and afterwards every node's kind, mode, owner and group, must agree. The
//! kernel is the oracle: nothing here restates a rule.
//!
//! The kernel side runs each operation on a thread of its own whose filesystem ids and
//! supplementary groups are switched with `setgroups(2)`, `setfsgid(2)` and
//! `setfsuid(2)` as raw system calls: they change only the calling thread, and moving
//! the filesystem uid away from 0 drops the filesystem capabilities, as for a real
//! unprivileged process. The workspace side walks paths with `Workspace::lookup`, as the
//! kernel sends LOOKUPs, and makes the checks the kernel makes before it asks a
//! filesystem at all (EEXIST for a name that exists, EISDIR for writing a directory).
//!
//! Needs root (to build the tree and switch users); skipped otherwise.
//! `PROPTEST_CASES` raises the number of cases.

use computer_vfs::Who;
use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use computer_vfs::{
    Access, Attr, Credentials, FileKind, InodeNo, KnownCaller, NewNode, OpenFlags, Options,
    RenameFlags, SetAttr, SetTime, Workspace, XattrSet,
};
use proptest::prelude::*;

mod common;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum K {
    Dir,
    File,
}

/// The tree every case starts from; modes, owners and groups vary.
const SHAPE: [(&str, K); 8] = [
    ("a", K::Dir),
    ("a/f", K::File),
    ("a/g", K::File),
    ("a/s", K::Dir),
    ("a/s/h", K::File),
    ("b", K::Dir),
    ("b/t", K::File),
    ("b/u", K::Dir),
];

/// Paths an operation may name: the top directory, the tree, names that do not exist.
const PATHS: [&str; 13] = [
    "", "a", "a/f", "a/g", "a/s", "a/s/h", "b", "b/t", "b/u", "a/x", "a/s/x", "b/x", "a/f/x",
];
/// Directories to create in or move to.
const DIRS: [&str; 6] = ["", "a", "a/s", "b", "b/u", "a/f"];

#[derive(Clone, Debug)]
struct Node {
    perm: u32,
    uid: u32,
    gid: u32,
}

#[derive(Clone, Debug)]
struct User {
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
}

#[derive(Clone, Copy, Debug)]
enum Times {
    /// `utimensat(path, NULL)`.
    Null,
    NowNow,
    NowOmit,
    Explicit,
}

#[derive(Clone, Debug)]
enum Op {
    Stat(usize),
    Access(usize, i32),
    Open(usize, i32),
    Create(usize, u32),
    Mkdir(usize, u32),
    Mkfifo(usize, u32),
    Symlink(usize),
    Unlink(usize),
    Rmdir(usize),
    /// From a path to a path, or to a new name in a directory.
    Rename(usize, Target),
    /// `renameat2(RENAME_EXCHANGE)` of two paths.
    Exchange(usize, usize),
    Link(usize, Target),
    Chmod(usize, u32),
    Chown(usize, Option<u32>, Option<u32>),
    Truncate(usize),
    /// Open for writing, write one byte at the start, close: a writer without
    /// `CAP_FSETID` takes set-id bits away.
    Write(usize),
    Utimes(usize, Times),
    SetXattr(usize),
    GetXattr(usize),
}

#[derive(Clone, Copy, Debug)]
enum Target {
    Path(usize),
    NewIn(usize),
}

impl Target {
    fn path(self) -> String {
        match self {
            Target::Path(i) => PATHS[i].to_owned(),
            Target::NewIn(d) => join(DIRS[d], "n"),
        }
    }
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_owned()
    } else {
        format!("{dir}/{name}")
    }
}

fn dir_perm() -> impl Strategy<Value = u32> {
    prop_oneof![
        4 => prop::sample::select(vec![
            0o755, 0o777, 0o1777, 0o2775, 0o2777, 0o700, 0o750, 0o770, 0o711, 0o555, 0o733,
            0o1733, 0o000, 0o311, 0o666,
        ]),
        1 => 0u32..0o10000,
    ]
}

fn file_perm() -> impl Strategy<Value = u32> {
    prop_oneof![
        4 => prop::sample::select(vec![
            0o644, 0o666, 0o600, 0o640, 0o660, 0o444, 0o755, 0o4755, 0o2755, 0o2644, 0o6777,
            0o000, 0o222, 0o111, 0o604,
        ]),
        1 => 0u32..0o10000,
    ]
}

fn owner_id() -> impl Strategy<Value = u32> {
    prop::sample::select(vec![0u32, 1000, 1001])
}

fn group_id() -> impl Strategy<Value = u32> {
    prop::sample::select(vec![0u32, 100, 200])
}

fn tree() -> impl Strategy<Value = Vec<Node>> {
    let nodes: Vec<_> = SHAPE
        .iter()
        .map(|(_, kind)| {
            let perm = match kind {
                K::Dir => dir_perm().boxed(),
                K::File => file_perm().boxed(),
            };
            (perm, owner_id(), group_id()).prop_map(|(perm, uid, gid)| Node { perm, uid, gid })
        })
        .collect();
    nodes
}

fn user() -> impl Strategy<Value = User> {
    (
        prop::sample::select(vec![0u32, 1000, 1001, 1002]),
        prop::sample::select(vec![0u32, 100, 200, 300]),
        prop::sample::subsequence(vec![100u32, 200], 0..=2),
    )
        .prop_map(|(uid, gid, groups)| User { uid, gid, groups })
}

fn op() -> impl Strategy<Value = Op> {
    let p = || 0..PATHS.len();
    // Not the top directory: in the workspace it is the root, in the kernel's tree an
    // ordinary directory of the temp dir.
    let q = || 1..PATHS.len();
    let d = || 0..DIRS.len();
    let target = prop_oneof![q().prop_map(Target::Path), d().prop_map(Target::NewIn)];
    // Creation modes leave out set-id bits: the kernel strips set-group-id from them
    // before any filesystem sees the request, which this test does not restate.
    let create_mode = || 0u32..0o2000;
    prop_oneof![
        1 => p().prop_map(Op::Stat),
        1 => (p(), 0..8i32).prop_map(|(i, m)| Op::Access(i, m)),
        1 => (p(), prop::sample::select(vec![libc::O_RDONLY, libc::O_WRONLY, libc::O_RDWR]))
            .prop_map(|(i, f)| Op::Open(i, f)),
        1 => (d(), create_mode()).prop_map(|(i, m)| Op::Create(i, m)),
        1 => (d(), create_mode()).prop_map(|(i, m)| Op::Mkdir(i, m)),
        1 => (d(), create_mode()).prop_map(|(i, m)| Op::Mkfifo(i, m)),
        1 => d().prop_map(Op::Symlink),
        1 => q().prop_map(Op::Unlink),
        1 => q().prop_map(Op::Rmdir),
        2 => (q(), target.clone()).prop_map(|(i, t)| Op::Rename(i, t)),
        1 => (q(), q()).prop_map(|(i, j)| Op::Exchange(i, j)),
        1 => (q(), target).prop_map(|(i, t)| Op::Link(i, t)),
        2 => (p(), 0u32..0o10000).prop_map(|(i, m)| Op::Chmod(i, m)),
        2 => (p(), prop::option::of(owner_id()), prop::option::of(group_id()))
            .prop_filter("chown(-1, -1) is not passed on by FUSE", |(_, u, g)| {
                u.is_some() || g.is_some()
            })
            .prop_map(|(i, u, g)| Op::Chown(i, u, g)),
        1 => p().prop_map(Op::Truncate),
        1 => p().prop_map(Op::Write),
        1 => (
            p(),
            prop::sample::select(vec![Times::Null, Times::NowNow, Times::NowOmit, Times::Explicit])
        )
            .prop_map(|(i, t)| Op::Utimes(i, t)),
        1 => p().prop_map(Op::SetXattr),
        1 => p().prop_map(Op::GetXattr),
    ]
}

// =====================================================================================
// The kernel side
// =====================================================================================

fn errno_of(rc: libc::c_long) -> i32 {
    if rc < 0 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
    } else {
        0
    }
}

fn c(path: &Path) -> CString {
    CString::new(path.as_os_str().as_encoded_bytes()).unwrap()
}

/// Runs `f` on a thread with `user`'s filesystem ids and groups.
fn as_user<T: Send>(user: &User, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // SAFETY: raw system calls on this thread's credentials, with a valid
                // array; setgroups before the ids, while the thread is still root.
                unsafe {
                    let groups: Vec<libc::gid_t> = user.groups.clone();
                    assert_eq!(
                        libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()),
                        0
                    );
                    libc::syscall(libc::SYS_setfsgid, user.gid);
                    libc::syscall(libc::SYS_setfsuid, user.uid);
                    assert_eq!(
                        libc::syscall(libc::SYS_setfsuid, -1i32 as libc::c_long),
                        user.uid as i64
                    );
                }
                f()
            })
            .join()
            .unwrap()
    })
}

fn build_kernel(base: &Path, tree: &[Node]) {
    if base.exists() {
        std::fs::remove_dir_all(base).unwrap();
    }
    std::fs::create_dir(base).unwrap();
    for (path, kind) in SHAPE {
        let full = base.join(path);
        match kind {
            K::Dir => std::fs::create_dir(&full).unwrap(),
            K::File => std::fs::write(&full, b"data").unwrap(),
        }
    }
    // Owners first: a chown drops set-id bits.
    for ((path, _), node) in SHAPE.iter().zip(tree).rev() {
        let full = c(&base.join(path));
        // SAFETY: valid paths.
        unsafe {
            assert_eq!(libc::chown(full.as_ptr(), node.uid, node.gid), 0);
            assert_eq!(libc::chmod(full.as_ptr(), node.perm as libc::mode_t), 0);
        }
    }
    // SAFETY: a valid path.
    unsafe {
        let top = c(base);
        assert_eq!(libc::chown(top.as_ptr(), 0, 0), 0);
        assert_eq!(libc::chmod(top.as_ptr(), 0o755), 0);
    }
}

fn times_spec(times: Times) -> Option<[libc::timespec; 2]> {
    let now = libc::timespec {
        tv_sec: 0,
        tv_nsec: libc::UTIME_NOW,
    };
    let omit = libc::timespec {
        tv_sec: 0,
        tv_nsec: libc::UTIME_OMIT,
    };
    let at = |s| libc::timespec {
        tv_sec: s,
        tv_nsec: 0,
    };
    match times {
        Times::Null => None,
        Times::NowNow => Some([now, now]),
        Times::NowOmit => Some([now, omit]),
        Times::Explicit => Some([at(1_000_000), at(2_000_000)]),
    }
}

fn run_kernel(base: &Path, op: &Op) -> i32 {
    let p = |i: usize| c(&base.join(PATHS[i]));
    let new_in = |d: usize| c(&base.join(join(DIRS[d], "n")));
    // SAFETY: every call gets valid NUL-terminated paths and valid buffers.
    unsafe {
        match op {
            Op::Stat(i) => {
                let mut st: libc::stat = std::mem::zeroed();
                errno_of(libc::lstat(p(*i).as_ptr(), &mut st) as _)
            }
            Op::Access(i, mask) => errno_of(libc::syscall(
                libc::SYS_faccessat2,
                libc::AT_FDCWD,
                p(*i).as_ptr(),
                *mask,
                libc::AT_EACCESS,
            )),
            Op::Open(i, flags) => {
                let fd = libc::open(p(*i).as_ptr(), *flags | libc::O_NOFOLLOW);
                if fd >= 0 {
                    libc::close(fd);
                }
                errno_of(fd as _)
            }
            Op::Create(d, mode) => {
                let fd = libc::open(
                    new_in(*d).as_ptr(),
                    libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                    *mode as libc::c_uint,
                );
                if fd >= 0 {
                    libc::close(fd);
                }
                errno_of(fd as _)
            }
            Op::Mkdir(d, mode) => errno_of(libc::mkdir(new_in(*d).as_ptr(), *mode) as _),
            Op::Mkfifo(d, mode) => errno_of(libc::mkfifo(new_in(*d).as_ptr(), *mode) as _),
            Op::Symlink(d) => {
                let target = CString::new("somewhere").unwrap();
                errno_of(libc::symlink(target.as_ptr(), new_in(*d).as_ptr()) as _)
            }
            Op::Unlink(i) => errno_of(libc::unlink(p(*i).as_ptr()) as _),
            Op::Rmdir(i) => errno_of(libc::rmdir(p(*i).as_ptr()) as _),
            Op::Rename(i, t) => {
                let to = c(&base.join(t.path()));
                errno_of(libc::rename(p(*i).as_ptr(), to.as_ptr()) as _)
            }
            Op::Exchange(i, j) => errno_of(libc::syscall(
                libc::SYS_renameat2,
                libc::AT_FDCWD,
                p(*i).as_ptr(),
                libc::AT_FDCWD,
                p(*j).as_ptr(),
                libc::RENAME_EXCHANGE,
            )),
            Op::Link(i, t) => {
                let to = c(&base.join(t.path()));
                errno_of(libc::link(p(*i).as_ptr(), to.as_ptr()) as _)
            }
            Op::Chmod(i, mode) => errno_of(libc::chmod(p(*i).as_ptr(), *mode) as _),
            Op::Chown(i, uid, gid) => errno_of(libc::chown(
                p(*i).as_ptr(),
                uid.unwrap_or(u32::MAX),
                gid.unwrap_or(u32::MAX),
            ) as _),
            Op::Truncate(i) => errno_of(libc::truncate(p(*i).as_ptr(), 1) as _),
            Op::Write(i) => {
                let fd = libc::open(p(*i).as_ptr(), libc::O_WRONLY | libc::O_NOFOLLOW);
                if fd < 0 {
                    return errno_of(fd as _);
                }
                let written = libc::pwrite(fd, b"w".as_ptr().cast(), 1, 0);
                let errno = errno_of(written as _);
                libc::close(fd);
                errno
            }
            Op::Utimes(i, times) => {
                let spec = times_spec(*times);
                let ptr = spec.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
                errno_of(libc::utimensat(libc::AT_FDCWD, p(*i).as_ptr(), ptr, 0) as _)
            }
            Op::SetXattr(i) => {
                let name = CString::new("user.t").unwrap();
                errno_of(
                    libc::setxattr(p(*i).as_ptr(), name.as_ptr(), b"v".as_ptr().cast(), 1, 0) as _,
                )
            }
            Op::GetXattr(i) => {
                let name = CString::new("user.t").unwrap();
                let mut buf = [0u8; 16];
                errno_of(libc::getxattr(
                    p(*i).as_ptr(),
                    name.as_ptr(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                ) as _)
            }
        }
    }
}

type Snapshot = BTreeMap<String, (char, u32, u32, u32)>;

fn kind_char(kind: FileKind) -> char {
    match kind {
        FileKind::File => 'f',
        FileKind::Directory => 'd',
        FileKind::Symlink => 'l',
        FileKind::Fifo => 'p',
        _ => '?',
    }
}

fn snapshot_kernel(base: &Path) -> Snapshot {
    fn walk(dir: &Path, prefix: &str, out: &mut Snapshot) {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        for name in names {
            let path = join(prefix, &name);
            let meta = std::fs::symlink_metadata(dir.join(&name)).unwrap();
            let ft = meta.file_type();
            let kind = if ft.is_dir() {
                'd'
            } else if ft.is_symlink() {
                'l'
            } else if std::os::unix::fs::FileTypeExt::is_fifo(&ft) {
                'p'
            } else {
                'f'
            };
            // A symlink's mode is 0777 everywhere and not stored the same way.
            let perm = if kind == 'l' {
                0o777
            } else {
                meta.mode() & 0o7777
            };
            out.insert(path.clone(), (kind, perm, meta.uid(), meta.gid()));
            if kind == 'd' {
                walk(&dir.join(&name), &path, out);
            }
        }
    }
    let mut out = Snapshot::new();
    walk(base, "", &mut out);
    out
}

// =====================================================================================
// The workspace side
// =====================================================================================

fn build_workspace(tree: &[Node]) -> Workspace {
    let ws = Workspace::open_in_memory(Options::default()).unwrap();
    let top = SetAttr {
        perm: Some(0o755),
        uid: Some(0),
        gid: Some(0),
        ..Default::default()
    };
    ws.setattr(Who::Trusted, InodeNo::ROOT, &top).unwrap();
    let mut inos: BTreeMap<&str, InodeNo> = BTreeMap::from([("", InodeNo::ROOT)]);
    for ((path, kind), node) in SHAPE.iter().zip(tree) {
        let (parent, name) = match path.rsplit_once('/') {
            Some((parent, name)) => (parent, name),
            None => ("", *path),
        };
        let owner = NewNode {
            perm: node.perm,
            uid: node.uid,
            gid: node.gid,
        };
        let parent = inos[parent];
        let attr = match kind {
            K::Dir => ws
                .mkdir(Who::Trusted, parent, name.as_bytes(), owner)
                .unwrap(),
            K::File => ws
                .mknod(
                    Who::Trusted,
                    parent,
                    name.as_bytes(),
                    FileKind::File,
                    owner,
                    0,
                )
                .unwrap(),
        };
        inos.insert(path, attr.ino);
    }
    ws
}

fn snapshot_workspace(ws: &Workspace) -> Snapshot {
    fn walk(ws: &Workspace, dir: InodeNo, prefix: &str, out: &mut Snapshot) {
        let mut entries = ws.readdir(Who::Trusted, dir, 0, 1000).unwrap();
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        for entry in entries {
            let path = join(prefix, &entry.name_lossy());
            let attr = ws.getattr(entry.ino).unwrap();
            let kind = kind_char(attr.kind);
            let perm = if kind == 'l' { 0o777 } else { attr.perm };
            out.insert(path.clone(), (kind, perm, attr.uid, attr.gid));
            if attr.is_dir() {
                walk(ws, attr.ino, &path, out);
            }
        }
    }
    let mut out = Snapshot::new();
    walk(ws, InodeNo::ROOT, "", &mut out);
    out
}

/// Where a path leads, walked as the kernel walks it: search permission on every
/// directory a name is looked up in, ENOTDIR through a non-directory.
struct Walked {
    parent: InodeNo,
    name: Vec<u8>,
    /// The node, or `None` if the last name does not exist.
    node: Option<Attr>,
}

fn walk(who: Who<'_>, ws: &Workspace, path: &str) -> Result<Walked, i32> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let Some((last, dirs)) = parts.split_last() else {
        return Ok(Walked {
            parent: InodeNo::ROOT,
            name: Vec::new(),
            node: Some(ws.getattr(InodeNo::ROOT).unwrap()),
        });
    };
    let mut dir = InodeNo::ROOT;
    for part in dirs {
        let attr = ws
            .lookup(who, dir, part.as_bytes())
            .map_err(|e| e.errno())?;
        if !attr.is_dir() {
            return Err(libc::ENOTDIR);
        }
        dir = attr.ino;
    }
    match ws.lookup(who, dir, last.as_bytes()) {
        Ok(attr) => Ok(Walked {
            parent: dir,
            name: last.as_bytes().to_vec(),
            node: Some(attr),
        }),
        Err(err) if err.errno() == libc::ENOENT => Ok(Walked {
            parent: dir,
            name: last.as_bytes().to_vec(),
            node: None,
        }),
        Err(err) => Err(err.errno()),
    }
}

fn existing(who: Who<'_>, ws: &Workspace, path: &str) -> Result<Attr, i32> {
    walk(who, ws, path)?.node.ok_or(libc::ENOENT)
}

/// `setattr` of the node at `path`.
fn setattr(who: Who<'_>, ws: &Workspace, path: &str, changes: SetAttr) -> Result<(), i32> {
    let attr = existing(who, ws, path)?;
    ws.setattr(who, attr.ino, &changes)
        .map(drop)
        .map_err(|e| e.errno())
}

/// `path` names `ancestor` or something below it.
fn is_below(path: &str, ancestor: &str) -> bool {
    path == ancestor || path.starts_with(&format!("{ancestor}/"))
}

fn run_workspace(ws: &Workspace, cred: &Credentials<'_>, op: &Op) -> Result<(), i32> {
    let errno = |e: computer_vfs::Error| e.errno();
    let who = Who::Caller(*cred);
    // A name to create in a directory: the kernel refuses an existing one itself.
    let for_create = |d: usize| -> Result<(InodeNo, Vec<u8>), i32> {
        let walked = walk(who, ws, &join(DIRS[d], "n"))?;
        if walked.node.is_some() {
            return Err(libc::EEXIST);
        }
        Ok((walked.parent, walked.name))
    };
    match op {
        Op::Stat(i) => existing(who, ws, PATHS[*i]).map(drop),
        Op::Access(i, mask) => {
            let attr = existing(who, ws, PATHS[*i])?;
            ws.access(cred, attr.ino, Access::from_mask(*mask))
                .map_err(errno)
        }
        Op::Open(i, flags) => {
            let attr = existing(who, ws, PATHS[*i])?;
            let write = *flags != libc::O_RDONLY;
            if attr.is_dir() {
                if write {
                    return Err(libc::EISDIR);
                }
                let opened = ws.opendir(who, attr.ino).map(drop).map_err(errno);
                // A listing is checked as the opening is: the kernel skips OPENDIR.
                let listed = ws.readdir(who, attr.ino, 0, 1).map(drop).map_err(errno);
                let listed_plus = ws.readdir_plus(who, attr.ino, 0, 1).map(drop);
                assert_eq!(listed, opened, "readdir of {}", PATHS[*i]);
                assert_eq!(
                    listed_plus.map_err(errno),
                    opened,
                    "readdirplus of {}",
                    PATHS[*i]
                );
                return opened;
            }
            let flags = OpenFlags::from_libc(*flags);
            let opened = ws
                .open_for_kernel(who, attr.ino, flags, false)
                .map_err(errno)?;
            ws.release(opened.handle).map_err(errno)
        }
        Op::Create(d, mode) => {
            let (parent, name) = for_create(*d)?;
            let (_, opened) = ws
                .create_for_kernel(
                    who,
                    parent,
                    &name,
                    NewNode::new(*mode),
                    OpenFlags::WRITE,
                    false,
                )
                .map_err(errno)?;
            ws.release(opened.handle).map_err(errno)
        }
        Op::Mkdir(d, mode) => {
            let (parent, name) = for_create(*d)?;
            ws.mkdir(who, parent, &name, NewNode::new(*mode))
                .map(drop)
                .map_err(errno)
        }
        Op::Mkfifo(d, mode) => {
            let (parent, name) = for_create(*d)?;
            ws.mknod(who, parent, &name, FileKind::Fifo, NewNode::new(*mode), 0)
                .map(drop)
                .map_err(errno)
        }
        Op::Symlink(d) => {
            let (parent, name) = for_create(*d)?;
            ws.symlink(who, parent, &name, b"somewhere", NewNode::new(0o777))
                .map(drop)
                .map_err(errno)
        }
        Op::Unlink(i) | Op::Rmdir(i) => {
            let walked = walk(who, ws, PATHS[*i])?;
            if walked.node.is_none() {
                return Err(libc::ENOENT);
            }
            let result = if matches!(op, Op::Unlink(_)) {
                ws.unlink(who, walked.parent, &walked.name)
            } else {
                ws.rmdir(who, walked.parent, &walked.name)
            };
            result.map_err(errno)
        }
        Op::Rename(i, target) => {
            let (from, to) = (PATHS[*i], target.path());
            let src = walk(who, ws, from)?;
            let dst = walk(who, ws, &to)?;
            let Some(src_node) = &src.node else {
                return Err(libc::ENOENT);
            };
            // The kernel's own checks before the filesystem's: a directory into itself,
            // a target above the source.
            if src_node.is_dir() && is_below(&to, from) && to != from {
                return Err(libc::EINVAL);
            }
            if dst.node.is_some() && is_below(from, &to) && to != from {
                return Err(libc::ENOTEMPTY);
            }
            ws.rename(
                who,
                src.parent,
                &src.name,
                dst.parent,
                &dst.name,
                RenameFlags::default(),
            )
            .map_err(errno)
        }
        Op::Exchange(i, j) => {
            let (a, b) = (PATHS[*i], PATHS[*j]);
            let a_walk = walk(who, ws, a)?;
            let b_walk = walk(who, ws, b)?;
            if a_walk.node.is_none() || b_walk.node.is_none() {
                return Err(libc::ENOENT);
            }
            // The kernel's own check: neither may be above the other.
            if a != b && (is_below(a, b) || is_below(b, a)) {
                return Err(libc::EINVAL);
            }
            let flags = RenameFlags {
                exchange: true,
                no_replace: false,
            };
            ws.rename(
                who,
                a_walk.parent,
                &a_walk.name,
                b_walk.parent,
                &b_walk.name,
                flags,
            )
            .map_err(errno)
        }
        Op::Link(i, target) => {
            let src = existing(who, ws, PATHS[*i])?;
            let dst = walk(who, ws, &target.path())?;
            if dst.node.is_some() {
                return Err(libc::EEXIST);
            }
            ws.link(who, src.ino, dst.parent, &dst.name)
                .map(drop)
                .map_err(errno)
        }
        Op::Chmod(i, mode) => setattr(
            who,
            ws,
            PATHS[*i],
            SetAttr {
                perm: Some(*mode),
                ..Default::default()
            },
        ),
        Op::Chown(i, uid, gid) => setattr(
            who,
            ws,
            PATHS[*i],
            SetAttr {
                uid: *uid,
                gid: *gid,
                ..Default::default()
            },
        ),
        Op::Write(i) => {
            let attr = existing(who, ws, PATHS[*i])?;
            if attr.is_dir() {
                return Err(libc::EISDIR);
            }
            let opened = ws
                .open_for_kernel(who, attr.ino, OpenFlags::WRITE, false)
                .map_err(errno)?;
            // As FUSE does: the kernel marks the writes of a caller without
            // CAP_FSETID, which the test's only capable user, root, has.
            let written = (|| {
                if cred.uid != 0 {
                    ws.drop_setid_after_write(who, opened.handle)?;
                }
                ws.write(opened.handle, 0, b"w")
            })();
            ws.release(opened.handle).map_err(errno)?;
            written.map(drop).map_err(errno)
        }
        Op::Truncate(i) => {
            let attr = existing(who, ws, PATHS[*i])?;
            if attr.is_dir() {
                return Err(libc::EISDIR);
            }
            let changes = SetAttr {
                size: Some(1),
                mtime: Some(SetTime::Now),
                ..Default::default()
            };
            ws.setattr(who, attr.ino, &changes).map(drop).map_err(errno)
        }
        Op::Utimes(i, times) => {
            let (atime, mtime) = match times {
                Times::Null | Times::NowNow => (Some(SetTime::Now), Some(SetTime::Now)),
                Times::NowOmit => (Some(SetTime::Now), None),
                Times::Explicit => (
                    Some(SetTime::At(1_000_000_000_000_000)),
                    Some(SetTime::At(2_000_000_000_000_000)),
                ),
            };
            setattr(
                who,
                ws,
                PATHS[*i],
                SetAttr {
                    atime,
                    mtime,
                    ..Default::default()
                },
            )
        }
        Op::SetXattr(i) => {
            let attr = existing(who, ws, PATHS[*i])?;
            ws.setxattr(who, attr.ino, b"user.t", b"v", XattrSet::Any)
                .map_err(errno)
        }
        Op::GetXattr(i) => {
            let attr = existing(who, ws, PATHS[*i])?;
            ws.getxattr(who, attr.ino, b"user.t")
                .map(drop)
                .map_err(errno)
        }
    }
}

// =====================================================================================
// The comparison
// =====================================================================================

/// Whether the comparison runs: it needs root to act as other users on the host
/// (`common::has_root`: without root it fails, unless told to skip).
fn is_root() -> bool {
    common::has_root(
        "permissions",
        "it acts as other users on the host to compare",
    )
}

fn protected_hardlinks() -> bool {
    std::fs::read_to_string("/proc/sys/fs/protected_hardlinks").map_or(true, |v| v.trim() != "0")
}

/// A scratch directory every test user can reach. Clears the umask: modes are compared
/// as requested (FUSE sends them with the umask applied already).
fn scratch() -> tempfile::TempDir {
    // SAFETY: no memory effects; every test of this file wants it cleared.
    unsafe { libc::umask(0) };
    let dir = tempfile::tempdir().unwrap();
    let path = c(dir.path());
    // SAFETY: a valid path.
    unsafe { assert_eq!(libc::chmod(path.as_ptr(), 0o755), 0) };
    dir
}

fn compare(base: &Path, tree: &[Node], user: &User, op: &Op) -> Result<(), TestCaseError> {
    build_kernel(base, tree);
    let kernel_errno = as_user(user, || run_kernel(base, op));
    let kernel_tree = snapshot_kernel(base);

    let ws = build_workspace(tree);
    // The test thread is root with every capability; a thread whose filesystem uid
    // is another has none.
    let info = KnownCaller {
        groups: user.groups.clone(),
        capabilities: if user.uid == 0 {
            computer_vfs::Capability::ALL.to_vec()
        } else {
            Vec::new()
        },
    };
    let cred =
        Credentials::new(user.uid, user.gid, &info).protected_hardlinks(protected_hardlinks());
    let ws_errno = run_workspace(&ws, &cred, op).err().unwrap_or(0);
    let ws_tree = snapshot_workspace(&ws);
    prop_assert_eq!(
        ws_errno,
        kernel_errno,
        "errno differs (workspace {}, kernel {}) for {:?} by {:?}",
        ws_errno,
        kernel_errno,
        op,
        user
    );
    prop_assert_eq!(
        ws_tree,
        kernel_tree,
        "the trees differ after {:?} by {:?}",
        op,
        user
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(4000),
        // A failure prints the case; keep it as a `regression_cases` entry.
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn operations_are_checked_as_the_kernel_checks_them(
        tree in tree(),
        user in user(),
        op in op(),
    ) {
        if !is_root() {
            return Ok(());
        }
        let scratch = SCRATCH.with(|s| s.path().join("t"));
        compare(&scratch, &tree, &user, &op)?;
    }
}

thread_local! {
    static SCRATCH: tempfile::TempDir = scratch();
}

/// Cases found by the comparison, kept as plain tests.
#[test]
fn regression_cases() {
    if !is_root() {
        return;
    }
    let scratch = scratch();
    let base: PathBuf = scratch.path().join("t");
    let plain = |perm| Node {
        perm,
        uid: 0,
        gid: 0,
    };
    // Everything 0o755 and root's; a user may look but not touch.
    let tree: Vec<Node> = SHAPE
        .iter()
        .map(|(_, kind)| plain(if *kind == K::Dir { 0o755 } else { 0o644 }))
        .collect();
    let nobody = User {
        uid: 1002,
        gid: 300,
        groups: vec![],
    };
    for op in [
        Op::Stat(2),
        Op::Open(2, libc::O_WRONLY),
        Op::Unlink(2),
        Op::Create(1, 0o644),
        Op::Chmod(2, 0o600),
        Op::Utimes(2, Times::Null),
        Op::Utimes(2, Times::Explicit),
    ] {
        compare(&base, &tree, &nobody, &op).unwrap();
    }
    // A directory onto a file: ENOTDIR comes before the write permission its `..`
    // would need, which the owner of the directory lacks here.
    let mut tree = tree;
    tree[0] = plain(0o777);
    tree[5] = Node {
        perm: 0o3230,
        uid: 0,
        gid: 100,
    };
    tree[7] = Node {
        perm: 0o3000,
        uid: 1001,
        gid: 0,
    };
    let owner = User {
        uid: 1001,
        gid: 0,
        groups: vec![100],
    };
    compare(&base, &tree, &owner, &Op::Rename(8, Target::Path(2))).unwrap();
}
