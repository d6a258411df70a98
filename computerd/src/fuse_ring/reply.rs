//! The ring's replies: each handler's answer (the traits of [`crate::fuse_reply`])
//! encoded as the kernel reads it, in a buffer the queue then copies into the entry.

use std::time::Duration;

use fuser::{Errno, FileAttr, FileType, FopenFlags, Generation, INodeNo};

use super::{wire, PAYLOAD_BYTES};
use crate::fuse_reply as answer;

/// A reply being built: its errno, or its body. Reused by a queue for every request.
#[derive(Default)]
pub struct Answer {
    pub errno: i32,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn clear(&mut self) {
        self.errno = 0;
        self.body.clear();
    }
}

/// The ring's reply to one request, for the handlers ([`answer`]'s traits).
pub struct RingReply<'a> {
    answer: &'a mut Answer,
}

/// A page of a listing: entries up to the size the kernel asked for.
pub struct ListingReply<'a> {
    answer: &'a mut Answer,
    limit: usize,
}

impl<'a> RingReply<'a> {
    pub fn new(answer: &'a mut Answer) -> RingReply<'a> {
        RingReply { answer }
    }

    pub fn limited(self, size: u32) -> ListingReply<'a> {
        ListingReply {
            answer: self.answer,
            limit: (size as usize).min(PAYLOAD_BYTES),
        }
    }
}

impl answer::Fallible for RingReply<'_> {
    fn fail(self, err: Errno) {
        self.answer.errno = err.code();
    }
}

impl answer::Fallible for ListingReply<'_> {
    fn fail(self, err: Errno) {
        self.answer.errno = err.code();
    }
}

impl answer::Entry for RingReply<'_> {
    fn entry(self, ttl: &Duration, attr: &FileAttr, generation: Generation) {
        wire::put_entry(&mut self.answer.body, ttl, attr, generation.0);
    }
}

impl answer::Attr for RingReply<'_> {
    fn attr(self, ttl: &Duration, attr: &FileAttr) {
        wire::put_attr_out(&mut self.answer.body, ttl, attr);
    }
}

impl answer::Data for RingReply<'_> {
    fn data(self, data: &[u8]) {
        self.answer.body.extend_from_slice(data);
    }
}

impl answer::Empty for RingReply<'_> {
    fn ok(self) {}
}

impl answer::Open for RingReply<'_> {
    fn opened(self, file: &answer::OpenFile) {
        put_open_file(&mut self.answer.body, file);
    }
}

/// `struct fuse_create_out`: the entry, then the open file.
impl answer::Create for RingReply<'_> {
    fn created(self, entry: &answer::NewEntry<'_>, file: &answer::OpenFile) {
        let body = &mut self.answer.body;
        wire::put_entry(body, entry.ttl, entry.attr, entry.generation.0);
        put_open_file(body, file);
    }
}

/// `struct fuse_open_out`, with `FOPEN_PASSTHROUGH` where the file has a backing id.
fn put_open_file(body: &mut Vec<u8>, file: &answer::OpenFile) {
    let (flags, backing_id) = match file.backing_id {
        Some(id) => (file.flags | FopenFlags::FOPEN_PASSTHROUGH, id),
        None => (file.flags, 0),
    };
    wire::put_open(body, file.fh.0, flags.bits(), backing_id);
}

impl answer::Write for RingReply<'_> {
    fn written(self, size: u32) {
        wire::put_written(&mut self.answer.body, size);
    }
}

impl answer::Directory for ListingReply<'_> {
    fn add(&mut self, ino: INodeNo, offset: u64, kind: FileType, name: &std::ffi::OsStr) -> bool {
        use std::os::unix::ffi::OsStrExt;
        let body = &mut self.answer.body;
        !wire::put_dirent(body, self.limit, None, ino.0, offset, kind, name.as_bytes())
    }

    fn ok(self) {}
}

impl answer::DirectoryPlus for ListingReply<'_> {
    fn add(
        &mut self,
        ino: INodeNo,
        offset: u64,
        name: &std::ffi::OsStr,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
    ) -> bool {
        use std::os::unix::ffi::OsStrExt;
        let body = &mut self.answer.body;
        let plus = Some((ttl, attr, generation.0));
        !wire::put_dirent(
            body,
            self.limit,
            plus,
            ino.0,
            offset,
            attr.kind,
            name.as_bytes(),
        )
    }

    fn ok(self) {}
}

impl answer::Statfs for RingReply<'_> {
    fn statfs(self, c: &answer::FsCounts) {
        let counts = [c.blocks, c.bfree, c.bavail, c.files, c.ffree];
        wire::put_statfs(
            &mut self.answer.body,
            counts,
            [c.bsize, c.namelen, c.frsize],
        );
    }
}

impl answer::Xattr for RingReply<'_> {
    /// `struct fuse_getxattr_out`: the size alone, for a caller that asked for it.
    fn size(self, size: u32) {
        self.answer.body.extend_from_slice(&size.to_ne_bytes());
        self.answer.body.extend_from_slice(&0u32.to_ne_bytes());
    }

    fn data(self, data: &[u8]) {
        self.answer.body.extend_from_slice(data);
    }
}

impl answer::Lseek for RingReply<'_> {
    fn offset(self, offset: i64) {
        self.answer.body.extend_from_slice(&offset.to_ne_bytes());
    }
}
