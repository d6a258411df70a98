//! The inode API as one caller may use it: every operation is checked against the
//! caller's permissions (the rules are in `access.rs`) before, or inside the same
//! transaction as, what it does. The FUSE daemon serves every kernel request through it;
//! the path API ([`crate::Fs`]), replication and tools are trusted and call the
//! [`Workspace`] directly.

use crate::access::{self, Access, Credentials};
use crate::error::{kind, Result};
use crate::staged::Opened;
use crate::store;
use crate::types::{Attr, FileKind, InodeNo, NewNode, RenameFlags, SetAttr, XattrSet};
use crate::workspace::{OpenFlags, Workspace};

/// A workspace seen by one caller. Cheap: make one per request.
#[derive(Clone, Copy)]
pub struct Caller<'a> {
    ws: &'a Workspace,
    cred: Credentials<'a>,
    protected_hardlinks: bool,
}

impl std::fmt::Debug for Caller<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caller")
            .field("workspace", &self.ws.id())
            .field("cred", &self.cred)
            .field("protected_hardlinks", &self.protected_hardlinks)
            .finish()
    }
}

impl Workspace {
    /// This workspace as `cred` may use it. Hard links follow the rule of
    /// `fs.protected_hardlinks = 1` unless [`Caller::protected_hardlinks`] says otherwise.
    pub fn caller<'a>(&'a self, cred: Credentials<'a>) -> Caller<'a> {
        Caller {
            ws: self,
            cred,
            protected_hardlinks: true,
        }
    }
}

impl<'a> Caller<'a> {
    /// Whether hard links are restricted as with the `fs.protected_hardlinks` sysctl.
    pub fn protected_hardlinks(self, on: bool) -> Caller<'a> {
        Caller {
            protected_hardlinks: on,
            ..self
        }
    }

    pub fn credentials(&self) -> &Credentials<'a> {
        &self.cred
    }

    /// The stored attributes, which are all a permission check needs (the overlay of
    /// buffered or staged writes changes only sizes and times).
    fn stored_attr(&self, ino: InodeNo) -> Result<Attr> {
        self.ws.db().read(|conn| store::attr(conn, ino))
    }

    fn cred(&self) -> Option<&Credentials<'a>> {
        Some(&self.cred)
    }

    /// [`Workspace::lookup`]; needs search permission on `parent`.
    pub fn lookup(&self, parent: InodeNo, name: &[u8]) -> Result<Attr> {
        self.ws.lookup_as(self.cred(), parent, name)
    }

    /// `access(2)`: whether the caller may access `ino` as `want` says (nothing: whether
    /// it exists). EROFS for writing a read-only workspace.
    pub fn access(&self, ino: InodeNo, want: Access) -> Result<()> {
        let attr = self.stored_attr(ino)?;
        if want.write && self.ws.is_read_only() {
            return Err(kind::ReadOnly());
        }
        access::check(&attr, &self.cred, want)
    }

    /// [`Workspace::setattr`] after the checks of `access::setattr`, which may also
    /// drop set-id bits as Linux does. `through_handle`: the request names an open file
    /// (`ftruncate`, or the kernel writing back times it keeps).
    pub fn setattr(&self, ino: InodeNo, changes: &SetAttr, through_handle: bool) -> Result<Attr> {
        let attr = self.stored_attr(ino)?;
        let changes = access::setattr(&attr, changes, &self.cred, through_handle)?;
        self.ws.setattr(ino, &changes)
    }

    /// [`Workspace::mknod`], owned by the caller; needs write and search permission on
    /// `parent`.
    pub fn mknod(
        &self,
        parent: InodeNo,
        name: &[u8],
        kind: FileKind,
        perm: u32,
        rdev: u32,
    ) -> Result<Attr> {
        self.ws
            .mknod_as(self.cred(), parent, name, kind, NewNode::new(perm), rdev)
    }

    /// [`Workspace::mkdir`], as [`Caller::mknod`].
    pub fn mkdir(&self, parent: InodeNo, name: &[u8], perm: u32) -> Result<Attr> {
        self.ws
            .mkdir_as(self.cred(), parent, name, NewNode::new(perm))
    }

    /// [`Workspace::symlink`], as [`Caller::mknod`].
    pub fn symlink(&self, parent: InodeNo, name: &[u8], target: &[u8]) -> Result<Attr> {
        self.ws
            .symlink_as(self.cred(), parent, name, target, NewNode::new(0o777))
    }

    /// [`Workspace::link`]: see `access::may_link`; and write and search permission on
    /// `parent`.
    pub fn link(&self, ino: InodeNo, parent: InodeNo, name: &[u8]) -> Result<Attr> {
        self.ws
            .link_as(self.cred(), self.protected_hardlinks, ino, parent, name)
    }

    /// [`Workspace::unlink`]: write and search permission on `parent`, and the sticky
    /// bit's rule.
    pub fn unlink(&self, parent: InodeNo, name: &[u8]) -> Result<()> {
        self.ws.unlink_as(self.cred(), parent, name)
    }

    /// [`Workspace::rmdir`], as [`Caller::unlink`].
    pub fn rmdir(&self, parent: InodeNo, name: &[u8]) -> Result<()> {
        self.ws.rmdir_as(self.cred(), parent, name)
    }

    /// [`Workspace::rename`]: the rules of unlink for the source (and a replaced
    /// target), of create for a new target, and write permission on a directory that
    /// changes parent.
    pub fn rename(
        &self,
        parent: InodeNo,
        name: &[u8],
        new_parent: InodeNo,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        self.ws
            .rename_as(self.cred(), parent, name, new_parent, new_name, flags)
    }

    /// [`Workspace::open_for_kernel`] if the caller may access the file as `want` says
    /// (read, write, or execute for `execve`); `flags` as the caller opened it.
    pub fn open_for_kernel(
        &self,
        ino: InodeNo,
        flags: OpenFlags,
        want: Access,
        passthrough: bool,
    ) -> Result<Opened> {
        let attr = self.stored_attr(ino)?;
        access::check(&attr, &self.cred, want)?;
        self.ws.open_for_kernel(ino, flags, passthrough)
    }

    /// [`Workspace::create_for_kernel`], owned by the caller; needs write and search
    /// permission on `parent`. The creator may write the new file whatever its mode.
    pub fn create_for_kernel(
        &self,
        parent: InodeNo,
        name: &[u8],
        perm: u32,
        flags: OpenFlags,
        passthrough: bool,
    ) -> Result<(Attr, Opened)> {
        self.ws.create_for_kernel_as(
            self.cred(),
            parent,
            name,
            NewNode::new(perm),
            flags,
            passthrough,
        )
    }

    /// Opening directory `ino` to list it: it must be one (ENOTDIR), readable by the
    /// caller.
    pub fn opendir(&self, ino: InodeNo) -> Result<Attr> {
        let attr = self.stored_attr(ino)?;
        if !attr.is_dir() {
            return Err(kind::NotDir());
        }
        access::check(&attr, &self.cred, Access::READ)?;
        Ok(attr)
    }

    /// [`Workspace::getxattr`]: see `access::may_xattr`.
    pub fn getxattr(&self, ino: InodeNo, name: &[u8]) -> Result<Vec<u8>> {
        self.ws.getxattr_as(self.cred(), ino, name)
    }

    /// [`Workspace::setxattr`]: see `access::may_xattr`.
    pub fn setxattr(&self, ino: InodeNo, name: &[u8], value: &[u8], mode: XattrSet) -> Result<()> {
        self.ws.setxattr_as(self.cred(), ino, name, value, mode)
    }

    /// [`Workspace::removexattr`]: see `access::may_xattr`.
    pub fn removexattr(&self, ino: InodeNo, name: &[u8]) -> Result<()> {
        self.ws.removexattr_as(self.cred(), ino, name)
    }
}
