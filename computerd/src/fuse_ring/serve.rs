//! Serving one request from a ring entry: decode it, call the handler fuser would
//! call ([`WorkspaceFs`]'s `serve_*`) with a [`RingReply`], and leave the reply in the
//! entry's buffers. A queue's thread does this for most requests; the workers of
//! [`super::offload`] for large reads.

use computer_vfs::{SetAttr, SetTime};
use fuser::{Errno, FileHandle, INodeNo};

use super::reply::{Answer, RingReply};
use super::wire::{self, Request};
use super::{RingEntry, PAYLOAD_BYTES};
use crate::fuse::{Sender, WorkspaceFs};
use crate::fuse_reply as answer;

/// What every queue and worker serves with.
pub struct Server {
    pub fs: WorkspaceFs,
    /// The uid allowed when the mount is not shared with other users (fuser's check,
    /// kept here).
    pub owner_only: Option<u32>,
}

impl Server {
    /// Serves the request in `entry` and leaves the reply in its place; returns the
    /// commit id that hands it back.
    pub fn answer(&self, entry: &mut RingEntry, answer: &mut Answer) -> u64 {
        let parsed = wire::entry(entry.header.bytes()).expect("a header buffer of a page");
        if let Some(read) = wire::read_args(parsed.header.opcode, wire::op_in(entry.header.bytes()))
        {
            return self.answer_read(entry, &parsed, read);
        }
        answer.clear();
        let payload_bytes = parsed.payload_bytes.min(PAYLOAD_BYTES);
        let payload = &entry.payload.bytes()[..payload_bytes];
        let header = entry.header.bytes();
        match wire::decode(parsed.header.opcode, wire::op_in(header), payload) {
            Ok(request) => {
                let reply = RingReply::new(answer);
                self.dispatch(&parsed.header, request, reply)
            }
            Err(errno) => answer.errno = errno.code(),
        }
        let body = if answer.errno == 0 {
            &answer.body[..]
        } else {
            &[]
        };
        let (errno, body) = match entry.payload.bytes().get_mut(..body.len()) {
            Some(room) => {
                room.copy_from_slice(body);
                (answer.errno, body.len())
            }
            None => (libc::EIO, 0), // larger than any request allows
        };
        wire::put_reply_header(entry.header.bytes(), parsed.header.unique, errno, body);
        parsed.commit_id
    }

    /// A READ, answered in place: the store reads straight into the entry's payload
    /// buffer, which the kernel copies the reply from. No buffer of the daemon's
    /// between them: a large file read through the ring is a copy out of the block
    /// cache and the kernel's copy, as few as over `/dev/fuse`.
    fn answer_read(
        &self,
        entry: &mut RingEntry,
        parsed: &wire::Entry,
        read: wire::ReadArgs,
    ) -> u64 {
        let header = &parsed.header;
        let filled = if self.refuses(header, false) {
            Err(Errno::EACCES)
        } else {
            let room = (read.size as usize).min(PAYLOAD_BYTES);
            let buf = &mut entry.payload.bytes()[..room];
            let (inode, handle) = (INodeNo(header.nodeid), FileHandle(read.fh));
            self.fs
                .serve_read_into(&sender_of(header), inode, handle, read.offset, buf)
        };
        let (errno, body_bytes) = match filled {
            Ok(filled) => (0, filled),
            Err(errno) => (errno.code(), 0),
        };
        wire::put_reply_header(entry.header.bytes(), header.unique, errno, body_bytes);
        parsed.commit_id
    }

    /// Whether this mount refuses a request's caller: a mount not shared with other
    /// users serves only its owner, bar the requests `exempt` from that (fuser's
    /// check, kept here).
    fn refuses(&self, header: &wire::InHeader, exempt: bool) -> bool {
        self.owner_only
            .is_some_and(|owner| header.uid != owner && !exempt)
    }

    fn dispatch(&self, header: &wire::InHeader, request: Request<'_>, reply: RingReply<'_>) {
        let sender = sender_of(header);
        if self.refuses(header, request.exempt_from_owner_check()) {
            return answer::Fallible::fail(reply, Errno::EACCES);
        }
        let (fs, inode) = (&self.fs, INodeNo(header.nodeid));
        match request {
            Request::Lookup { name } => fs.serve_lookup(&sender, inode, name, reply),
            Request::Getattr => fs.serve_getattr(inode, reply),
            Request::Readlink => fs.serve_readlink(inode, reply),
            Request::Open { flags } => fs.serve_open(&sender, inode, flags, reply),
            Request::Read { fh, offset, size } => {
                fs.serve_read(&sender, inode, FileHandle(fh), offset, size, reply)
            }
            Request::Flush { fh } => fs.serve_flush(FileHandle(fh), reply),
            Request::Release { fh } => fs.serve_release(inode, FileHandle(fh), reply),
            Request::Fsync { fh, datasync } => {
                fs.serve_fsync(inode, FileHandle(fh), datasync, reply)
            }
            Request::Opendir => fs.serve_opendir(&sender, inode, reply),
            Request::Readdir { offset, size } => {
                fs.serve_readdir(&sender, inode, offset, reply.limited(size))
            }
            Request::Readdirplus { offset, size } => {
                fs.serve_readdirplus(&sender, inode, offset, reply.limited(size))
            }
            // Nothing to release: directories are opened without a handle.
            Request::Releasedir => answer::Empty::ok(reply),
            Request::Fsyncdir => fs.serve_fsyncdir(reply),
            Request::Statfs => fs.serve_statfs(reply),
            Request::Getxattr { name, size } => {
                fs.serve_getxattr(&sender, inode, name, size, reply)
            }
            Request::Listxattr { size } => fs.serve_listxattr(inode, size, reply),
            Request::Access { mask } => fs.serve_access(&sender, inode, mask, reply),
            Request::Lseek { offset, whence } => fs.serve_lseek(inode, offset, whence, reply),
            Request::Unsupported { .. } => answer::Fallible::fail(reply, Errno::ENOSYS),
            change => self.dispatch_change(&sender, inode, change, reply),
        }
    }

    /// The requests that change the tree.
    fn dispatch_change(
        &self,
        sender: &Sender,
        inode: INodeNo,
        request: Request<'_>,
        reply: RingReply<'_>,
    ) {
        let fs = &self.fs;
        match request {
            Request::Setattr(changes) => fs.serve_setattr(sender, inode, set_attr(&changes), reply),
            Request::Mknod { name, mode, rdev } => {
                fs.serve_mknod(sender, inode, name, mode, rdev, reply)
            }
            Request::Mkdir { name, mode } => fs.serve_mkdir(sender, inode, name, mode, reply),
            Request::Unlink { name } => fs.serve_unlink(sender, inode, name, reply),
            Request::Rmdir { name } => fs.serve_rmdir(sender, inode, name, reply),
            Request::Symlink { name, target } => {
                fs.serve_symlink(sender, inode, name, target, reply)
            }
            Request::Rename {
                name,
                newdir,
                newname,
                flags,
            } => {
                let (from, to) = ((inode, name), (INodeNo(newdir), newname));
                fs.serve_rename(sender, from, to, flags, reply)
            }
            Request::Link { oldnodeid, newname } => {
                fs.serve_link(sender, INodeNo(oldnodeid), inode, newname, reply)
            }
            Request::Create { name, flags, mode } => {
                fs.serve_create(sender, inode, name, mode, flags, reply)
            }
            Request::Write {
                fh,
                offset,
                write_flags,
                data,
            } => {
                let at = (FileHandle(fh), offset);
                fs.serve_write(sender, inode, at, data, write_flags, reply)
            }
            Request::Setxattr { name, value, flags } => {
                fs.serve_setxattr(sender, inode, name, value, flags, reply)
            }
            Request::Removexattr { name } => fs.serve_removexattr(sender, inode, name, reply),
            Request::Fallocate {
                fh,
                offset,
                length,
                mode,
            } => fs.serve_fallocate(inode, FileHandle(fh), offset, length, mode, reply),
            Request::CopyFileRange {
                fh_in,
                off_in,
                fh_out,
                off_out,
                len,
            } => {
                let (from, to) = ((FileHandle(fh_in), off_in), (FileHandle(fh_out), off_out));
                fs.serve_copy_file_range(from, to, len, reply)
            }
            other => {
                debug_assert!(false, "{other:?} is dispatched by `dispatch`");
                answer::Fallible::fail(reply, Errno::ENOSYS)
            }
        }
    }
}

/// Who sent a request.
fn sender_of(header: &wire::InHeader) -> Sender {
    Sender {
        uid: header.uid,
        gid: header.gid,
        pid: header.pid,
    }
}

/// The store's attribute change from the kernel's SETATTR.
fn set_attr(changes: &wire::SetattrIn) -> SetAttr {
    use wire::fattr;
    let valid = |bit: u32| changes.valid & bit != 0;
    let time = |set: u32, now: u32, (secs, nanos): (i64, u32)| {
        valid(set).then(|| match valid(now) {
            true => SetTime::Now,
            false => SetTime::At(nanoseconds(secs, nanos)),
        })
    };
    SetAttr {
        perm: valid(fattr::MODE).then_some(changes.mode & 0o7777),
        uid: valid(fattr::UID).then_some(changes.uid),
        gid: valid(fattr::GID).then_some(changes.gid),
        size: valid(fattr::SIZE).then_some(changes.size),
        atime: time(fattr::ATIME, fattr::ATIME_NOW, changes.atime),
        mtime: time(fattr::MTIME, fattr::MTIME_NOW, changes.mtime),
        ctime: valid(fattr::CTIME).then(|| nanoseconds(changes.ctime.0, changes.ctime.1)),
        through_handle: valid(fattr::FH),
    }
}

/// A time the kernel sends as whole seconds (negative before the epoch) and the
/// nanoseconds after them, in nanoseconds since the epoch (saturating).
fn nanoseconds(secs: i64, nanos: u32) -> i64 {
    secs.saturating_mul(1_000_000_000)
        .saturating_add(i64::from(nanos))
}
