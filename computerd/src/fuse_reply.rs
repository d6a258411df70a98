//! The answers a request handler gives, whichever transport carries them: fuser's loop
//! on `/dev/fuse`, or the io_uring queues of [`crate::fuse_ring`]. One trait per kind of
//! answer, with the methods of fuser's reply type of that kind, so that a handler in
//! [`crate::fuse`] is written once and fuser's types are one implementation.

use std::ffi::OsStr;
use std::time::Duration;

use computer_vfs::Error;
use fuser::{
    BackingId, Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
};

/// What every answer shares: it can carry an errno instead.
pub trait Fallible: Sized {
    fn fail(self, err: Errno);

    /// Answers with `ok` for a value, or with the errno of an error: the one way a
    /// handler turns the store's result into a reply.
    fn answer<T>(self, result: Result<T, Error>, ok: impl FnOnce(Self, T)) {
        match result {
            Ok(value) => ok(self, value),
            Err(err) => self.fail(errno(&err)),
        }
    }

    /// [`Fallible::answer`] for a request addressed to a node (not to a name in a
    /// directory): a node that is gone fails with ESTALE, not ENOENT. The kernel may
    /// still hold a name for a node that another route replaced (a file written by
    /// `computerd fs`, a peer's change: a new node renamed over the old); ESTALE makes
    /// it walk the path again, asking the daemon, and open the file that is there now.
    fn answer_node<T>(self, result: Result<T, Error>, ok: impl FnOnce(Self, T)) {
        match result {
            Ok(value) => ok(self, value),
            Err(Error::NotFound(_)) => self.fail(Errno::ESTALE),
            Err(err) => self.fail(errno(&err)),
        }
    }
}

/// A name's entry (LOOKUP, and what creates one).
pub trait Entry: Fallible {
    fn entry(self, ttl: &Duration, attr: &FileAttr, generation: Generation);
}

/// An inode's attributes (GETATTR, SETATTR).
pub trait Attr: Fallible {
    fn attr(self, ttl: &Duration, attr: &FileAttr);
}

/// Bytes (READ, READLINK).
pub trait Data: Fallible {
    fn data(self, data: &[u8]);
}

/// Success and nothing more.
pub trait Empty: Fallible {
    fn ok(self);
}

/// An open file or directory (OPEN, OPENDIR).
pub trait Open: Fallible {
    fn opened(self, file: &OpenFile);
}

/// A new entry and its open file (CREATE), as [`Entry`] and [`Open`] in one.
pub trait Create: Fallible {
    fn created(self, entry: &NewEntry<'_>, file: &OpenFile);
}

/// What an open answers: the handle and its flags, and for a file passed through to
/// a backing file the id the kernel knows it by (registered by [`crate::fuse`]'s
/// backing table; the reply adds `FOPEN_PASSTHROUGH`).
pub struct OpenFile {
    pub fh: FileHandle,
    pub flags: FopenFlags,
    pub backing_id: Option<u32>,
}

impl OpenFile {
    /// A handle served by the daemon.
    pub fn served(fh: FileHandle, flags: FopenFlags) -> OpenFile {
        OpenFile {
            fh,
            flags,
            backing_id: None,
        }
    }
}

/// The entry half of a CREATE's answer.
pub struct NewEntry<'a> {
    pub ttl: &'a Duration,
    pub attr: &'a FileAttr,
    pub generation: Generation,
}

/// How many bytes were written (WRITE, COPY_FILE_RANGE).
pub trait Write: Fallible {
    fn written(self, size: u32);
}

/// A page of a listing: `add` returns true once the page is full.
pub trait Directory: Fallible {
    fn add(&mut self, ino: INodeNo, offset: u64, kind: FileType, name: &OsStr) -> bool;
    fn ok(self);
}

/// A page of a listing with each entry's attributes: `add` returns true once full.
pub trait DirectoryPlus: Fallible {
    fn add(
        &mut self,
        ino: INodeNo,
        offset: u64,
        name: &OsStr,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
    ) -> bool;
    fn ok(self);
}

/// The filesystem's counts (STATFS).
pub trait Statfs: Fallible {
    fn statfs(self, counts: &FsCounts);
}

/// What STATFS answers: the fields of the kernel's `struct fuse_kstatfs`.
pub struct FsCounts {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

/// An extended attribute's value or the list of names, or only its size.
pub trait Xattr: Fallible {
    fn size(self, size: u32);
    fn data(self, data: &[u8]);
}

/// A position in a file (LSEEK).
pub trait Lseek: Fallible {
    fn offset(self, offset: i64);
}

/// The errno a request fails with, logged where the store itself failed.
pub fn errno(err: &Error) -> Errno {
    match err {
        Error::Corrupt { .. } | Error::Storage { .. } | Error::Io { .. } => {
            tracing::error!("failed to serve a request: {err}");
        }
        _ => tracing::debug!("request failed: {err}"),
    }
    Errno::from_i32(err.errno())
}

macro_rules! fallible {
    ($($reply:ty),*) => {$(
        impl Fallible for $reply {
            fn fail(self, err: Errno) {
                self.error(err)
            }
        }
    )*};
}

fallible!(
    ReplyAttr,
    ReplyCreate,
    ReplyData,
    ReplyDirectory,
    ReplyDirectoryPlus,
    ReplyEmpty,
    ReplyEntry,
    ReplyLseek,
    ReplyOpen,
    ReplyStatfs,
    ReplyWrite,
    ReplyXattr
);

impl Entry for ReplyEntry {
    fn entry(self, ttl: &Duration, attr: &FileAttr, generation: Generation) {
        ReplyEntry::entry(self, ttl, attr, generation)
    }
}

impl Attr for ReplyAttr {
    fn attr(self, ttl: &Duration, attr: &FileAttr) {
        ReplyAttr::attr(self, ttl, attr)
    }
}

impl Data for ReplyData {
    fn data(self, data: &[u8]) {
        ReplyData::data(self, data)
    }
}

impl Empty for ReplyEmpty {
    fn ok(self) {
        ReplyEmpty::ok(self)
    }
}

// fuser sends a backing id only as its own `BackingId`, which closes the id when
// dropped: the replies below wrap the table's raw id to send it and take the wrapper
// apart again. SAFETY (both `wrap_backing` calls): the id is registered for as long as
// the backing table holds it, and `into_raw` keeps the wrapper from closing it.

impl Open for ReplyOpen {
    fn opened(self, file: &OpenFile) {
        let Some(backing_id) = file.backing_id else {
            return ReplyOpen::opened(self, file.fh, file.flags);
        };
        let id = unsafe { self.wrap_backing(backing_id) };
        ReplyOpen::opened_passthrough(self, file.fh, file.flags, &id);
        let _ = BackingId::into_raw(id);
    }
}

impl Create for ReplyCreate {
    fn created(self, entry: &NewEntry<'_>, file: &OpenFile) {
        let (ttl, attr, generation) = (entry.ttl, entry.attr, entry.generation);
        let Some(backing_id) = file.backing_id else {
            return ReplyCreate::created(self, ttl, attr, generation, file.fh, file.flags);
        };
        let id = unsafe { self.wrap_backing(backing_id) };
        ReplyCreate::created_passthrough(self, ttl, attr, generation, file.fh, file.flags, &id);
        let _ = BackingId::into_raw(id);
    }
}

impl Write for ReplyWrite {
    fn written(self, size: u32) {
        ReplyWrite::written(self, size)
    }
}

impl Directory for ReplyDirectory {
    fn add(&mut self, ino: INodeNo, offset: u64, kind: FileType, name: &OsStr) -> bool {
        ReplyDirectory::add(self, ino, offset, kind, name)
    }

    fn ok(self) {
        ReplyDirectory::ok(self)
    }
}

impl DirectoryPlus for ReplyDirectoryPlus {
    fn add(
        &mut self,
        ino: INodeNo,
        offset: u64,
        name: &OsStr,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
    ) -> bool {
        ReplyDirectoryPlus::add(self, ino, offset, name, ttl, attr, generation)
    }

    fn ok(self) {
        ReplyDirectoryPlus::ok(self)
    }
}

impl Statfs for ReplyStatfs {
    fn statfs(self, c: &FsCounts) {
        ReplyStatfs::statfs(
            self, c.blocks, c.bfree, c.bavail, c.files, c.ffree, c.bsize, c.namelen, c.frsize,
        )
    }
}

impl Xattr for ReplyXattr {
    fn size(self, size: u32) {
        ReplyXattr::size(self, size)
    }

    fn data(self, data: &[u8]) {
        ReplyXattr::data(self, data)
    }
}

impl Lseek for ReplyLseek {
    fn offset(self, offset: i64) {
        ReplyLseek::offset(self, offset)
    }
}
