//! The handlers of the requests that change the tree, for both transports: fuser's
//! `Filesystem` methods call them with fuser's replies, the io_uring queues
//! (`fuse_ring`) with theirs. As the rest of the adapter, each decodes its arguments,
//! calls one [`Workspace`](computer_vfs::Workspace) method and answers.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering;

use computer_vfs::{FileKind, NewNode, RenameFlags, SetAttr, XattrSet};
use fuser::{Errno, FileHandle, INodeNo};

use super::{fh, file_attr, ino, unopened, Sender, WorkspaceFs, TTL};
use crate::fuse_reply as answer;

/// `FUSE_WRITE_CACHE`: a write-back from the kernel's page cache.
const WRITE_CACHE: u32 = 1 << 0;
/// `FUSE_WRITE_KILL_SUIDGID`: the writer lacks `CAP_FSETID`.
const WRITE_KILL_SUIDGID: u32 = 1 << 2;

impl WorkspaceFs {
    pub(crate) fn serve_setattr(
        &self,
        sender: &Sender,
        inode: INodeNo,
        changes: SetAttr,
        reply: impl answer::Attr,
    ) {
        let _timer = self.timer("setattr");
        // A new size reaches the kernel's pages only after the reply: none may be
        // filled with the old content meanwhile (`kernel_pages`).
        let _pages = changes.size.map(|_| self.pages.lock(inode.0));
        // Set-id bits: with FUSE_HANDLE_KILLPRIV_V2 the store drops them after a chown
        // or truncate (`Workspace::setattr`) and after a write (`serve_write`).
        let result = self.as_caller(sender, |who| self.ws.setattr(who, ino(inode), &changes));
        if changes.size.is_some() {
            self.pages.changed(inode.0);
        }
        let permissions_changed =
            changes.perm.is_some() || changes.uid.is_some() || changes.gid.is_some();
        let listing_stale = permissions_changed && matches!(&result, Ok(attr) if attr.is_dir());
        reply.answer_node(result, |reply, attr| reply.attr(&TTL, &file_attr(&attr)));
        if listing_stale {
            self.forget_listing(inode);
        }
    }

    pub(crate) fn serve_mknod(
        &self,
        sender: &Sender,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        rdev: u32,
        reply: impl answer::Entry,
    ) {
        let _timer = self.timer("mknod");
        let Some(kind) = FileKind::from_mode(mode) else {
            return reply.fail(Errno::EINVAL);
        };
        if matches!(kind, FileKind::Directory | FileKind::Symlink) {
            return reply.fail(Errno::EINVAL);
        }
        let result = self.as_caller(sender, |who| {
            self.ws.mknod(
                who,
                ino(parent),
                name.as_bytes(),
                kind,
                NewNode::new(mode & 0o7777),
                rdev,
            )
        });
        self.reply_entry(reply, result);
    }

    pub(crate) fn serve_mkdir(
        &self,
        sender: &Sender,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        reply: impl answer::Entry,
    ) {
        let _timer = self.timer("mkdir");
        let result = self.as_caller(sender, |who| {
            self.ws.mkdir(
                who,
                ino(parent),
                name.as_bytes(),
                NewNode::new(mode & 0o7777),
            )
        });
        self.reply_entry(reply, result);
    }

    pub(crate) fn serve_unlink(
        &self,
        sender: &Sender,
        parent: INodeNo,
        name: &OsStr,
        reply: impl answer::Empty,
    ) {
        let _timer = self.timer("unlink");
        let held = self.hold_before_deletion(parent, name);
        let result = self.as_caller(sender, |who| {
            self.ws.unlink(who, ino(parent), name.as_bytes())
        });
        self.deleted_holds.settle(&self.ws, held);
        reply.answer(result, |reply, ()| reply.ok())
    }

    pub(crate) fn serve_rmdir(
        &self,
        sender: &Sender,
        parent: INodeNo,
        name: &OsStr,
        reply: impl answer::Empty,
    ) {
        let _timer = self.timer("rmdir");
        let result = self.as_caller(sender, |who| {
            self.ws.rmdir(who, ino(parent), name.as_bytes())
        });
        reply.answer(result, |reply, ()| reply.ok())
    }

    pub(crate) fn serve_symlink(
        &self,
        sender: &Sender,
        parent: INodeNo,
        link_name: &OsStr,
        target: &OsStr,
        reply: impl answer::Entry,
    ) {
        let _timer = self.timer("symlink");
        let result = self.as_caller(sender, |who| {
            self.ws.symlink(
                who,
                ino(parent),
                link_name.as_bytes(),
                target.as_bytes(),
                NewNode::new(0o777),
            )
        });
        self.reply_entry(reply, result);
    }

    /// `flags` as rename2(2) takes them: `RENAME_NOREPLACE` and `RENAME_EXCHANGE`
    /// (`RENAME_WHITEOUT` is refused).
    pub(crate) fn serve_rename(
        &self,
        sender: &Sender,
        from: (INodeNo, &OsStr),
        to: (INodeNo, &OsStr),
        flags: u32,
        reply: impl answer::Empty,
    ) {
        let _timer = self.timer("rename");
        let known = libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE;
        if flags & !known != 0 {
            return reply.fail(Errno::EINVAL);
        }
        let flags = RenameFlags {
            no_replace: flags & libc::RENAME_NOREPLACE != 0,
            exchange: flags & libc::RENAME_EXCHANGE != 0,
        };
        let held = (!flags.exchange)
            .then(|| self.hold_before_deletion(to.0, to.1))
            .flatten();
        let result = self.as_caller(sender, |who| {
            self.ws.rename(
                who,
                ino(from.0),
                from.1.as_bytes(),
                ino(to.0),
                to.1.as_bytes(),
                flags,
            )
        });
        self.deleted_holds.settle(&self.ws, held);
        reply.answer(result, |reply, ()| reply.ok())
    }

    pub(crate) fn serve_link(
        &self,
        sender: &Sender,
        inode: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: impl answer::Entry,
    ) {
        let _timer = self.timer("link");
        let result = self.as_caller(sender, |who| {
            self.ws
                .link(who, ino(inode), ino(newparent), newname.as_bytes())
        });
        self.reply_entry(reply, result);
    }

    pub(crate) fn serve_create(
        &self,
        sender: &Sender,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        flags: i32,
        reply: impl answer::Create,
    ) {
        let _timer = self.timer("create");
        let flags = self.open_flags(flags);
        let passthrough = self.passthrough.load(Ordering::Relaxed);
        let created = self.as_caller(sender, |who| {
            self.ws.create_for_kernel(
                who,
                ino(parent),
                name.as_bytes(),
                NewNode::new(mode & 0o7777),
                flags,
                passthrough,
            )
        });
        reply.answer(created, |reply, (attr, opened)| {
            self.reply_created(reply, &file_attr(&attr), &opened)
        });
    }

    /// Writes `data` at `(handle, offset)`; `write_flags` as the kernel sends them
    /// (`FUSE_WRITE_*`).
    pub(crate) fn serve_write(
        &self,
        sender: &Sender,
        inode: INodeNo,
        (handle, offset): (FileHandle, u64),
        data: &[u8],
        write_flags: u32,
        reply: impl answer::Write,
    ) {
        let _timer = self.timer("write");
        // A write-back from the kernel's page cache: the kernel keeps mtime itself and
        // sends it with setattr; stamping the arrival time would store a later one.
        let stamp = write_flags & WRITE_CACHE == 0;
        let result = self.with_writer(inode, handle, |handle| {
            if write_flags & WRITE_KILL_SUIDGID != 0 {
                self.drop_setid(sender, inode, handle)?;
            }
            self.ws.write_with(handle, offset, data, stamp)
        });
        reply.answer(result, |reply, written| reply.written(written as u32))
    }

    /// Where files are opened without asking, a handle on the file `name` names, kept
    /// across its deletion while the kernel may hold it open (`unopened::DeletedHolds`).
    fn hold_before_deletion(
        &self,
        parent: INodeNo,
        name: &OsStr,
    ) -> Option<(computer_vfs::InodeNo, computer_vfs::FileHandle)> {
        if !self.writes_unopened() {
            return None;
        }
        (self.deleted_holds).before_deletion(&self.ws, ino(parent), name.as_bytes())
    }

    /// The kernel forgot `inode`: no open file or mapping of it remains.
    pub(crate) fn serve_forget(&self, inode: INodeNo) {
        self.pages.changed(inode.0);
        if self.writes_unopened() {
            self.deleted_holds.forget(&self.ws, ino(inode));
        }
    }

    /// Calls `op` with the handle a write goes through: the kernel's, or for a file it
    /// opened without asking, the writer the daemon holds for the inode (`unopened`).
    fn with_writer<T>(
        &self,
        inode: INodeNo,
        handle: FileHandle,
        op: impl FnOnce(computer_vfs::FileHandle) -> computer_vfs::Result<T>,
    ) -> computer_vfs::Result<T> {
        if fh(handle) != computer_vfs::FileHandle::UNOPENED {
            return op(fh(handle));
        }
        let writer = self.unopened.writer(&self.ws, ino(inode), || {
            unopened::open_writer(&self.ws, ino(inode))
        })?;
        op(writer.handle)
    }

    /// A write by someone without `CAP_FSETID` (the kernel's FUSE_WRITE_KILL_SUIDGID):
    /// the store drops the file's set-id bits, and the kernel forgets the attributes it
    /// cached (only those: a page-cache invalidation could wait on this very write).
    fn drop_setid(
        &self,
        sender: &Sender,
        inode: INodeNo,
        handle: computer_vfs::FileHandle,
    ) -> computer_vfs::Result<()> {
        let dropped = self.as_caller(sender, |writer| {
            self.ws.drop_setid_after_write(writer, handle)
        });
        if dropped? {
            if let Some(notifier) = self.notifier.get() {
                let _ = notifier.inval_inode(inode, -1, 0);
            }
        }
        Ok(())
    }

    /// After a directory's mode or owner changed, the kernel drops the listing it keeps,
    /// so that the next one is read from the daemon and checked against the new
    /// permissions.
    fn forget_listing(&self, dir: INodeNo) {
        if let Some(notifier) = self.notifier.get() {
            let _ = notifier.inval_inode(dir, 0, 0);
        }
    }

    /// `flags` as setxattr(2) takes them.
    pub(crate) fn serve_setxattr(
        &self,
        sender: &Sender,
        inode: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        reply: impl answer::Empty,
    ) {
        let _timer = self.timer("setxattr");
        let mode = if flags & libc::XATTR_CREATE != 0 {
            XattrSet::Create
        } else if flags & libc::XATTR_REPLACE != 0 {
            XattrSet::Replace
        } else {
            XattrSet::Any
        };
        let result = self.as_caller(sender, |who| {
            self.ws
                .setxattr(who, ino(inode), name.as_bytes(), value, mode)
        });
        reply.answer(result, |reply, ()| reply.ok())
    }

    pub(crate) fn serve_removexattr(
        &self,
        sender: &Sender,
        inode: INodeNo,
        name: &OsStr,
        reply: impl answer::Empty,
    ) {
        let _timer = self.timer("removexattr");
        let result = self.as_caller(sender, |who| {
            self.ws.removexattr(who, ino(inode), name.as_bytes())
        });
        reply.answer(result, |reply, ()| reply.ok())
    }

    /// `mode` as fallocate(2) takes it: only `FALLOC_FL_KEEP_SIZE` is supported.
    pub(crate) fn serve_fallocate(
        &self,
        inode: INodeNo,
        handle: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: impl answer::Empty,
    ) {
        let _timer = self.timer("fallocate");
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        if mode & !libc::FALLOC_FL_KEEP_SIZE != 0 {
            return reply.fail(Errno::EOPNOTSUPP);
        }
        let result = self.with_writer(inode, handle, |handle| {
            self.ws.allocate(handle, offset, length, keep_size)
        });
        reply.answer(result, |reply, ()| reply.ok())
    }

    /// Copies up to `len` bytes between two open files; the answer's count is 32 bits,
    /// so a larger copy is cut to a whole number of pages below 4 GiB. A file opened
    /// without asking has no handle to copy with: EOPNOTSUPP, after which the kernel
    /// copies this once through reads and writes (ENOSYS would stop it asking at all).
    pub(crate) fn serve_copy_file_range(
        &self,
        from: (FileHandle, u64),
        to: (FileHandle, u64),
        len: u64,
        reply: impl answer::Write,
    ) {
        let _timer = self.timer("copy_file_range");
        let len = len.min(u32::MAX as u64 & !0xfff);
        let unopened = computer_vfs::FileHandle::UNOPENED;
        if fh(from.0) == unopened || fh(to.0) == unopened {
            return reply.fail(Errno::EOPNOTSUPP);
        }
        let result = self.ws.copy_range(fh(from.0), from.1, fh(to.0), to.1, len);
        reply.answer(result, |reply, copied| reply.written(copied as u32))
    }
}
