//! The store's vocabulary: inode numbers, revisions, node kinds and attributes.

use std::fmt;

/// An inode number. The root directory is [`InodeNo::ROOT`]; numbers are never reused
/// within a workspace (the kernel may still hold a forgotten number).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InodeNo(pub u64);

impl InodeNo {
    pub const ROOT: InodeNo = InodeNo(1);
}

impl fmt::Display for InodeNo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "inode {}", self.0)
    }
}

/// A position in the workspace's change log. Every committed mutation takes the next one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Revision(pub u64);

/// Nanoseconds since the Unix epoch (negative before it).
pub type TimestampNs = i64;

/// What a node is. The numeric values are stored in the database; never renumber.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileKind {
    File,
    Directory,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

impl FileKind {
    /// The `S_IFMT` bits of this kind.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileKind::File => libc::S_IFREG,
            FileKind::Directory => libc::S_IFDIR,
            FileKind::Symlink => libc::S_IFLNK,
            FileKind::Fifo => libc::S_IFIFO,
            FileKind::Socket => libc::S_IFSOCK,
            FileKind::CharDevice => libc::S_IFCHR,
            FileKind::BlockDevice => libc::S_IFBLK,
        }
    }

    /// The kind encoded in a full `st_mode`, if it is one the store keeps.
    pub fn from_mode(mode: u32) -> Option<FileKind> {
        match mode & libc::S_IFMT {
            libc::S_IFREG => Some(FileKind::File),
            libc::S_IFDIR => Some(FileKind::Directory),
            libc::S_IFLNK => Some(FileKind::Symlink),
            libc::S_IFIFO => Some(FileKind::Fifo),
            libc::S_IFSOCK => Some(FileKind::Socket),
            libc::S_IFCHR => Some(FileKind::CharDevice),
            libc::S_IFBLK => Some(FileKind::BlockDevice),
            _ => None,
        }
    }
}

/// The attributes of a node, as `stat(2)` reports them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: InodeNo,
    pub kind: FileKind,
    /// Permission bits only (`0o7777`); the kind is in `kind`.
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    /// Bytes: content length of a file, target length of a symlink, 0 otherwise.
    pub size: u64,
    pub atime: TimestampNs,
    pub mtime: TimestampNs,
    pub ctime: TimestampNs,
    pub rdev: u32,
    /// The revision of the node's last change.
    pub revision: Revision,
}

impl Attr {
    /// The full `st_mode`: kind bits and permission bits.
    pub fn mode(&self) -> u32 {
        self.kind.mode_bits() | self.perm
    }

    pub fn is_dir(&self) -> bool {
        self.kind == FileKind::Directory
    }

    /// 512-byte blocks, as `st_blocks` counts them (logical size, rounded up).
    pub fn blocks_512(&self) -> u64 {
        self.size.div_ceil(512)
    }
}

/// A time to set: a given instant or "now" by the store's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetTime {
    Now,
    At(TimestampNs),
}

/// Which attributes a `setattr` changes; `None` leaves one alone.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// Permission bits (`0o7777`); kind bits are ignored.
    pub perm: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// Truncate or extend a file to this size.
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
    /// Set ctime explicitly (FUSE passes it through); otherwise any change sets it to now.
    pub ctime: Option<TimestampNs>,
    /// The request names an open file (`ftruncate`, or the kernel writing back the times
    /// it keeps), whose opening was checked already: Linux's `ATTR_FILE`. Changes nothing
    /// itself; it only relaxes a caller's checks.
    pub through_handle: bool,
}

impl SetAttr {
    /// Whether the request changes nothing.
    pub fn is_empty(&self) -> bool {
        let nothing = SetAttr {
            through_handle: self.through_handle,
            ..SetAttr::default()
        };
        *self == nothing
    }
}

/// Who creates a node: its owner and permission bits after the umask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NewNode {
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
}

impl NewNode {
    pub fn new(perm: u32) -> NewNode {
        NewNode {
            perm,
            uid: 0,
            gid: 0,
        }
    }
}

/// One entry of a directory listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub ino: InodeNo,
    pub kind: FileKind,
    /// Resume a listing after this entry by passing this cookie as the offset. Cookies
    /// stay valid while the directory changes: an entry present for the whole listing is
    /// returned exactly once.
    pub cookie: u64,
}

impl DirEntry {
    pub fn name_lossy(&self) -> String {
        String::from_utf8_lossy(&self.name).into_owned()
    }
}

/// Flags of `rename`, as `renameat2(2)` takes them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenameFlags {
    /// Fail with EEXIST if the target exists.
    pub no_replace: bool,
    /// Atomically swap source and target; both must exist.
    pub exchange: bool,
}

/// Flags of `setxattr`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum XattrSet {
    /// Create or replace.
    #[default]
    Any,
    /// Fail with EEXIST if it exists (`XATTR_CREATE`).
    Create,
    /// Fail with ENODATA if it does not exist (`XATTR_REPLACE`).
    Replace,
}

/// Filesystem-wide numbers for `statfs`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatFs {
    pub block_size: u32,
    pub blocks_total: u64,
    pub blocks_free: u64,
    pub inodes_total: u64,
    pub inodes_free: u64,
    pub name_max: u32,
}

/// What a workspace holds, as `computerd fs stats` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub files: u64,
    pub directories: u64,
    pub symlinks: u64,
    pub other_nodes: u64,
    /// Sum of file sizes.
    pub logical_bytes: u64,
    /// Bytes of distinct blocks before compression.
    pub unique_bytes: u64,
    /// Bytes of distinct blocks as stored (after compression).
    pub stored_bytes: u64,
    pub blocks: u64,
    /// The database file(s) on disk, including free pages and the WAL.
    pub database_bytes: u64,
    /// Pages of the database file that deleted content freed, in bytes: reused by later
    /// writes, or given back to the file system by compaction.
    pub free_bytes: u64,
    /// Files written through a mount whose content still waits in their staging files
    /// to be ingested into blocks.
    pub staged_files: u64,
    pub revision: Revision,
}

impl Stats {
    /// logical bytes / unique bytes: how much storing each block once saves.
    pub fn dedup_ratio(&self) -> f64 {
        ratio(self.logical_bytes, self.unique_bytes)
    }

    /// unique bytes / stored bytes: how much compressing the blocks saves.
    pub fn compression_ratio(&self) -> f64 {
        ratio(self.unique_bytes, self.stored_bytes)
    }
}

/// `whole / part`, and 1 for an empty workspace.
fn ratio(whole: u64, part: u64) -> f64 {
    if part == 0 {
        return 1.0;
    }
    whole as f64 / part as f64
}

/// Limits of a workspace. Past one, mutations fail with ENOSPC and change nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quota {
    /// Stored bytes of distinct blocks (after dedup and compression).
    pub bytes_max: Option<u64>,
    /// Number of nodes (files, directories, symlinks, ...).
    pub inodes_max: Option<u64>,
}

impl Quota {
    pub const UNLIMITED: Quota = Quota {
        bytes_max: None,
        inodes_max: None,
    };
}
