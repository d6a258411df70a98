//! Permission rules: what a caller may do to a node, decided as Linux decides it for a
//! local filesystem (`generic_permission`, `may_create`, `may_delete`, `may_linkat`,
//! `setattr_prepare`, `xattr_permission`, `inode_init_owner`), so that a mount which
//! leaves the checks to the daemon behaves like ext4.
//!
//! The store sees no processes. Who asks arrives as [`Credentials`]: a user and a group
//! id, and a [`CallerInfo`] for what only the caller's process can tell (its
//! supplementary groups, its capabilities). The rules ask it only when the answer
//! depends on it, since finding out may cost the adapter a system call.
//!
//! The functions here decide; the inode API applies them to a [`Who::Caller`].

use crate::error::{kind, Result};
use crate::types::{Attr, FileKind, NewNode, SetAttr, SetTime};

/// Set-user-id.
pub const S_ISUID: u32 = 0o4000;
/// Set-group-id; on a directory, new entries take its group.
pub const S_ISGID: u32 = 0o2000;
/// Sticky: in a directory, only the owner of an entry or of the directory removes it.
pub const S_ISVTX: u32 = 0o1000;
const S_IXGRP: u32 = 0o010;
const S_IXUGO: u32 = 0o111;

/// The capabilities that change a permission decision (`capabilities(7)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Capability {
    /// `CAP_CHOWN`: give files any owner and group.
    Chown,
    /// `CAP_DAC_OVERRIDE`: read, write and search anything; execute anything that has
    /// an execute bit.
    DacOverride,
    /// `CAP_DAC_READ_SEARCH`: read files, read and search directories.
    DacReadSearch,
    /// `CAP_FOWNER`: act as the owner of any file (chmod, utimes, sticky directories).
    Fowner,
    /// `CAP_FSETID`: keep set-id bits that a change would drop.
    Fsetid,
}

impl Capability {
    pub const ALL: [Capability; 5] = [
        Capability::Chown,
        Capability::DacOverride,
        Capability::DacReadSearch,
        Capability::Fowner,
        Capability::Fsetid,
    ];

    /// The capability's number in the Linux ABI (the bit in `CapEff`).
    pub fn number(self) -> u32 {
        match self {
            Capability::Chown => 0,
            Capability::DacOverride => 1,
            Capability::DacReadSearch => 2,
            Capability::Fowner => 3,
            Capability::Fsetid => 4,
        }
    }
}

/// What only the caller's process can tell. Each answer may cost the implementation a
/// look at the process, so the rules ask only when it changes the decision.
pub trait CallerInfo {
    /// Whether `gid` is one of the caller's supplementary groups.
    fn in_supplementary_group(&self, gid: u32) -> bool;
    /// Whether the caller holds `cap` in its effective set.
    fn capable(&self, cap: Capability) -> bool;
}

/// A caller whose supplementary groups and capabilities are known up front.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KnownCaller {
    pub groups: Vec<u32>,
    pub capabilities: Vec<Capability>,
}

impl KnownCaller {
    /// A process with these supplementary groups and no capability.
    pub fn with_groups(groups: &[u32]) -> KnownCaller {
        KnownCaller {
            groups: groups.to_vec(),
            capabilities: Vec::new(),
        }
    }

    /// A process with every capability (root, as it normally runs).
    pub fn privileged() -> KnownCaller {
        KnownCaller {
            groups: Vec::new(),
            capabilities: Capability::ALL.to_vec(),
        }
    }
}

impl CallerInfo for KnownCaller {
    fn in_supplementary_group(&self, gid: u32) -> bool {
        self.groups.contains(&gid)
    }

    fn capable(&self, cap: Capability) -> bool {
        self.capabilities.contains(&cap)
    }
}

/// Root with every capability.
struct Superuser;

impl CallerInfo for Superuser {
    fn in_supplementary_group(&self, _gid: u32) -> bool {
        false
    }

    fn capable(&self, _cap: Capability) -> bool {
        true
    }
}

/// Who asks for an operation of the inode API: the one parameter that decides whether
/// it is checked.
#[derive(Clone, Copy, Debug)]
pub enum Who<'a> {
    /// The store's own callers (the path API, replication, tools): nothing is checked,
    /// and a new node is owned as the call says.
    Trusted,
    /// A caller every rule of this module applies to; it owns what it creates (only the
    /// permission bits of the call's `NewNode` are used).
    Caller(Credentials<'a>),
}

impl<'a> Who<'a> {
    /// The credentials to check, if any.
    pub(crate) fn cred(&self) -> Option<&Credentials<'a>> {
        match self {
            Who::Trusted => None,
            Who::Caller(cred) => Some(cred),
        }
    }
}

/// A caller: the user and group ids file access is checked with (the filesystem ids of
/// the calling thread), how to learn the rest, and the host's rule for hard links.
#[derive(Clone, Copy)]
pub struct Credentials<'a> {
    pub uid: u32,
    pub gid: u32,
    info: &'a dyn CallerInfo,
    /// Hard links restricted as with the `fs.protected_hardlinks` sysctl (see
    /// [`may_link`]).
    protected_hardlinks: bool,
}

impl std::fmt::Debug for Credentials<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("uid", &self.uid)
            .field("gid", &self.gid)
            .field("protected_hardlinks", &self.protected_hardlinks)
            .finish_non_exhaustive()
    }
}

impl<'a> Credentials<'a> {
    pub fn new(uid: u32, gid: u32, info: &'a dyn CallerInfo) -> Credentials<'a> {
        Credentials {
            uid,
            gid,
            info,
            protected_hardlinks: true,
        }
    }

    /// Whether hard links are restricted as with `fs.protected_hardlinks = 1` (the
    /// default, as in most distributions).
    pub fn protected_hardlinks(self, on: bool) -> Credentials<'a> {
        Credentials {
            protected_hardlinks: on,
            ..self
        }
    }

    /// Root with every capability.
    pub fn root() -> Credentials<'static> {
        Credentials {
            uid: 0,
            gid: 0,
            info: &Superuser,
            protected_hardlinks: true,
        }
    }

    /// Whether the caller's primary or a supplementary group is `gid`.
    pub fn in_group(&self, gid: u32) -> bool {
        gid == self.gid || self.info.in_supplementary_group(gid)
    }

    pub fn capable(&self, cap: Capability) -> bool {
        self.info.capable(cap)
    }

    fn owns(&self, attr: &Attr) -> bool {
        self.uid == attr.uid
    }

    /// `inode_owner_or_capable`.
    fn owner_or_capable(&self, attr: &Attr) -> bool {
        self.owns(attr) || self.capable(Capability::Fowner)
    }

    /// `in_group_or_capable`.
    fn in_group_or_capable(&self, gid: u32) -> bool {
        self.in_group(gid) || self.capable(Capability::Fsetid)
    }
}

/// What a caller asks of a node: the `MAY_READ`/`MAY_WRITE`/`MAY_EXEC` mask (search,
/// on a directory).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Access {
    pub read: bool,
    pub write: bool,
    pub exec: bool,
}

impl Access {
    pub const NONE: Access = Access {
        read: false,
        write: false,
        exec: false,
    };
    pub const READ: Access = Access {
        read: true,
        ..Access::NONE
    };
    pub const WRITE: Access = Access {
        write: true,
        ..Access::NONE
    };
    pub const EXEC: Access = Access {
        exec: true,
        ..Access::NONE
    };
    pub const READ_WRITE: Access = Access {
        read: true,
        write: true,
        exec: false,
    };
    const WRITE_EXEC: Access = Access {
        read: false,
        write: true,
        exec: true,
    };

    /// From an `access(2)` mask (`R_OK | W_OK | X_OK`; `F_OK` is empty).
    pub fn from_mask(mask: i32) -> Access {
        Access {
            read: mask & libc::R_OK != 0,
            write: mask & libc::W_OK != 0,
            exec: mask & libc::X_OK != 0,
        }
    }

    /// The mask as permission bits of one class (`rwx` = 0o7).
    fn bits(self) -> u32 {
        u32::from(self.read) << 2 | u32::from(self.write) << 1 | u32::from(self.exec)
    }
}

/// Whether `cred` may access `attr` as `want` asks (`generic_permission`): the owner,
/// group or other bits, whichever class the caller is in, then the capabilities that
/// override them.
pub fn permits(attr: &Attr, cred: &Credentials<'_>, want: Access) -> bool {
    let mask = want.bits();
    if mask == 0 {
        return true;
    }
    let mode = attr.perm;
    let granted = if cred.owns(attr) {
        (mode >> 6) & 7
    } else {
        let (group, other) = ((mode >> 3) & 7, mode & 7);
        // Membership only matters where the group and other bits differ for this
        // request (and may cost the caller a look at the process).
        if (group ^ other) & mask != 0 && cred.in_group(attr.gid) {
            group
        } else {
            other
        }
    };
    if granted & mask == mask {
        return true;
    }
    if attr.is_dir() {
        // Reading and searching a directory are overridable by either capability,
        // writing by DAC_OVERRIDE alone.
        if !want.write && cred.capable(Capability::DacReadSearch) {
            return true;
        }
        return cred.capable(Capability::DacOverride);
    }
    if want == Access::READ && cred.capable(Capability::DacReadSearch) {
        return true;
    }
    // Executing needs an execute bit for someone, whatever the capabilities.
    (!want.exec || mode & S_IXUGO != 0) && cred.capable(Capability::DacOverride)
}

/// [`permits`], or EACCES.
pub(crate) fn check(attr: &Attr, cred: &Credentials<'_>, want: Access) -> Result<()> {
    if permits(attr, cred, want) {
        Ok(())
    } else {
        Err(kind::PermissionDenied())
    }
}

/// Looking a name up in `dir` needs search permission on it.
pub(crate) fn search(dir: &Attr, cred: &Credentials<'_>) -> Result<()> {
    check(dir, cred, Access::EXEC)
}

/// Adding an entry to `dir` (`may_create`): write and search permission on it.
pub(crate) fn may_create(dir: &Attr, cred: &Credentials<'_>) -> Result<()> {
    check(dir, cred, Access::WRITE_EXEC)
}

/// Removing `victim`'s entry from `dir` (`may_delete`): write and search permission on
/// the directory (EACCES), and in a sticky directory ownership of the entry or of the
/// directory (EPERM).
pub(crate) fn may_delete(dir: &Attr, victim: &Attr, cred: &Credentials<'_>) -> Result<()> {
    check(dir, cred, Access::WRITE_EXEC)?;
    let sticky_refuses = dir.perm & S_ISVTX != 0
        && !cred.owns(victim)
        && !cred.owns(dir)
        && !cred.capable(Capability::Fowner);
    if sticky_refuses {
        return Err(kind::NotPermitted());
    }
    Ok(())
}

/// Moving directory `dir` to another parent rewrites its `..`: write permission on it.
pub(crate) fn may_reparent(dir: &Attr, cred: &Credentials<'_>) -> Result<()> {
    check(dir, cred, Access::WRITE)
}

/// A new hard link to `source` (`may_linkat`). Where links are protected (the
/// `fs.protected_hardlinks` sysctl, on in most distributions), someone who neither owns
/// the file nor has `CAP_FOWNER` may only link a regular file without set-id bits that
/// they may read and write (EPERM otherwise).
pub(crate) fn may_link(source: &Attr, cred: &Credentials<'_>) -> Result<()> {
    if !cred.protected_hardlinks {
        return Ok(());
    }
    // Ownership first: it is free, while the read-write test of a source its owner
    // cannot write (git links its read-only objects) asks the process for capabilities.
    if cred.owns(source) {
        return Ok(());
    }
    let safe_source = source.kind == FileKind::File
        && source.perm & S_ISUID == 0
        && source.perm & (S_ISGID | S_IXGRP) != (S_ISGID | S_IXGRP)
        && permits(source, cred, Access::READ_WRITE);
    if safe_source || cred.capable(Capability::Fowner) {
        Ok(())
    } else {
        Err(kind::NotPermitted())
    }
}

/// Whether a change that drops privileges (chown, truncate) drops set-group-id
/// (`setattr_should_drop_sgid`): always when group-executable (a real set-group-id
/// program); otherwise (a mandatory-locking marker) only for a caller outside the group.
fn drops_sgid(attr: &Attr, cred: &Credentials<'_>) -> bool {
    if attr.perm & S_ISGID == 0 {
        return false;
    }
    attr.perm & S_IXGRP != 0 || !cred.in_group_or_capable(attr.gid)
}

/// chown to another user needs CAP_CHOWN; chgrp needs ownership and one of the
/// caller's groups, or CAP_CHOWN.
fn check_chown(attr: &Attr, changes: &SetAttr, cred: &Credentials<'_>) -> Result<()> {
    if let Some(uid) = changes.uid {
        let allowed = (cred.owns(attr) && uid == attr.uid) || cred.capable(Capability::Chown);
        if !allowed {
            return Err(kind::NotPermitted());
        }
    }
    if let Some(gid) = changes.gid {
        let allowed = (cred.owns(attr) && (gid == attr.gid || cred.in_group(gid)))
            || cred.capable(Capability::Chown);
        if !allowed {
            return Err(kind::NotPermitted());
        }
    }
    Ok(())
}

/// The mode of a regular file after a write, truncation or chown by `cred` that takes
/// its privileges away (Linux's `setattr_should_drop_suidgid`): without set-user-id,
/// and without set-group-id where it is a real one (group-executable) or the caller is
/// outside the file's group and lacks `CAP_FSETID`.
pub(crate) fn perm_without_privileges(attr: &Attr, cred: &Credentials<'_>) -> u32 {
    let mut perm = attr.perm & !S_ISUID;
    if drops_sgid(attr, cred) {
        perm &= !S_ISGID;
    }
    perm
}

/// Whether a write to a file of mode `perm` may take set-id bits away: then each write
/// must reach the store, which drops them ([`perm_without_privileges`]), rather than
/// go straight to a staging file. Which bits go depends on the writer, so any set-id
/// bit counts.
pub(crate) fn write_may_drop_bits(perm: u32) -> bool {
    perm & (S_ISUID | S_ISGID) != 0
}

/// Checks a change of attributes by `cred` and returns the change to apply: with
/// set-group-id dropped from a chmod by someone outside the file's group, and set-id
/// bits dropped by a chown or truncate as Linux drops them. A change through a handle
/// (`SetAttr::through_handle`) was checked when the file was opened.
///
/// The order of the checks is the kernel's: truncate and "touch" need write permission
/// (EACCES) before anything else is looked at; then chown, chgrp, chmod and explicit
/// times each need ownership or a capability (EPERM).
pub(crate) fn setattr(attr: &Attr, changes: &SetAttr, cred: &Credentials<'_>) -> Result<SetAttr> {
    let through_handle = changes.through_handle;
    let mut out = changes.clone();
    if changes.size.is_some() && !through_handle {
        check(attr, cred, Access::WRITE)?;
    }
    let times = changes.atime.is_some() || changes.mtime.is_some();
    // truncate(2) stamps mtime with "now" itself; that is part of the truncation.
    let truncation_stamp =
        changes.size.is_some() && changes.atime.is_none() && changes.mtime == Some(SetTime::Now);
    // Both times to "now" (utimes(NULL), UTIME_NOW twice): the owner, or anyone who
    // may write the file. A ctime in the request means the kernel keeps the times
    // itself (writeback cache) and is passing on what a writer did: the same rule.
    let touch = changes.atime == Some(SetTime::Now) && changes.mtime == Some(SetTime::Now);
    let kernel_kept = changes.ctime.is_some();
    let write_allows_times = (touch || kernel_kept) && !(kernel_kept && through_handle);
    if times && !truncation_stamp && write_allows_times && !cred.owner_or_capable(attr) {
        check(attr, cred, Access::WRITE)?;
    }
    check_chown(attr, changes, cred)?;
    if let Some(perm) = changes.perm {
        if !cred.owner_or_capable(attr) {
            return Err(kind::NotPermitted());
        }
        let gid = changes.gid.unwrap_or(attr.gid);
        if perm & S_ISGID != 0 && !cred.in_group_or_capable(gid) {
            out.perm = Some(perm & !S_ISGID);
        }
    }
    if times && !truncation_stamp && !touch && !kernel_kept && !cred.owner_or_capable(attr) {
        return Err(kind::NotPermitted());
    }
    // Dropping privileges: a chown of anything but a directory, and a truncation by a
    // caller without CAP_FSETID. A mode given in the same request is taken as is.
    let setid = attr.perm & (S_ISUID | S_ISGID) != 0;
    if setid && changes.perm.is_none() && attr.kind != FileKind::Directory {
        let chown = changes.uid.is_some() || changes.gid.is_some();
        let truncate = changes.size.is_some()
            && attr.kind == FileKind::File
            && !cred.capable(Capability::Fsetid);
        if chown || truncate {
            let perm = perm_without_privileges(attr, cred);
            if perm != attr.perm {
                out.perm = Some(perm);
            }
        }
    }
    Ok(out)
}

/// Whether file permissions govern the extended attribute `name`. They do not for
/// `security.` and `system.` (the security modules and the kernel police those) nor
/// `trusted.` (it needs `CAP_SYS_ADMIN`, which the kernel checks before asking).
pub(crate) fn xattr_needs_permission(name: &[u8]) -> bool {
    ![&b"security."[..], b"system.", b"trusted."]
        .iter()
        .any(|prefix| name.starts_with(prefix))
}

/// Extended attributes of meanings this filesystem does not implement: POSIX ACLs (its
/// permissions are the mode bits alone) and SELinux labels. Setting one is refused
/// with EOPNOTSUPP rather than stored and ignored, and asking for one that is not
/// there says EOPNOTSUPP too, as a filesystem without them does: tools then stop
/// asking (`ls -l` asks for both of every entry, and remembers a device that lacks
/// them). One stored before this rule is still read and removed.
pub(crate) fn xattr_not_kept(name: &[u8]) -> bool {
    [
        &b"system.posix_acl_access"[..],
        b"system.posix_acl_default",
        b"security.selinux",
    ]
    .contains(&name)
}

/// Reading (`write` false) or changing an extended attribute (`xattr_permission`).
/// `user.` attributes exist only on regular files and directories (EPERM to change,
/// ENODATA to read), and only the owner changes them on a sticky directory.
pub(crate) fn may_xattr(
    attr: &Attr,
    name: &[u8],
    write: bool,
    cred: &Credentials<'_>,
) -> Result<()> {
    if !xattr_needs_permission(name) {
        return Ok(());
    }
    if name.starts_with(b"user.") {
        if !matches!(attr.kind, FileKind::File | FileKind::Directory) {
            return Err(if write {
                kind::NotPermitted()
            } else {
                kind::NoAttribute()
            });
        }
        if attr.is_dir() && attr.perm & S_ISVTX != 0 && write && !cred.owner_or_capable(attr) {
            return Err(kind::NotPermitted());
        }
    }
    check(attr, cred, if write { Access::WRITE } else { Access::READ })
}

/// The owner of a node `cred` creates in `dir` with permission bits `perm`
/// (`inode_init_owner`): the caller's user, and the caller's group, or the directory's
/// if the directory is set-group-id (a new directory then inherits the bit).
pub(crate) fn new_owner(dir: &Attr, cred: &Credentials<'_>, perm: u32, kind: FileKind) -> NewNode {
    let mut perm = perm & 0o7777;
    let gid = if dir.perm & S_ISGID != 0 {
        if kind == FileKind::Directory {
            perm |= S_ISGID;
        }
        dir.gid
    } else {
        cred.gid
    };
    NewNode {
        perm,
        uid: cred.uid,
        gid,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{InodeNo, Revision};
    use std::cell::Cell;

    fn node(kind: FileKind, perm: u32, uid: u32, gid: u32) -> Attr {
        Attr {
            ino: InodeNo(7),
            kind,
            perm,
            uid,
            gid,
            nlink: 1,
            size: 0,
            atime: 0,
            mtime: 0,
            ctime: 0,
            rdev: 0,
            revision: Revision(1),
        }
    }

    fn file(perm: u32, uid: u32, gid: u32) -> Attr {
        node(FileKind::File, perm, uid, gid)
    }

    fn dir(perm: u32, uid: u32, gid: u32) -> Attr {
        node(FileKind::Directory, perm, uid, gid)
    }

    /// Counts how often the rules ask about the process.
    #[derive(Default)]
    struct Counting {
        groups: Vec<u32>,
        caps: Vec<Capability>,
        asked: Cell<u32>,
    }

    impl CallerInfo for Counting {
        fn in_supplementary_group(&self, gid: u32) -> bool {
            self.asked.set(self.asked.get() + 1);
            self.groups.contains(&gid)
        }
        fn capable(&self, cap: Capability) -> bool {
            self.asked.set(self.asked.get() + 1);
            self.caps.contains(&cap)
        }
    }

    fn errno(result: Result<impl Sized>) -> i32 {
        result.err().map_or(0, |e| e.errno())
    }

    #[test]
    fn the_class_of_the_caller_picks_the_bits() {
        let f = file(0o640, 1000, 100);
        let owner = KnownCaller::default();
        let member = KnownCaller::with_groups(&[100]);
        let stranger = KnownCaller::default();
        let as_owner = Credentials::new(1000, 5, &owner);
        let as_member = Credentials::new(1001, 5, &member);
        let as_primary = Credentials::new(1001, 100, &stranger);
        let as_stranger = Credentials::new(1002, 5, &stranger);
        assert!(permits(&f, &as_owner, Access::READ_WRITE));
        assert!(permits(&f, &as_member, Access::READ));
        assert!(!permits(&f, &as_member, Access::WRITE));
        assert!(permits(&f, &as_primary, Access::READ));
        assert!(!permits(&f, &as_stranger, Access::READ));
        // The owner class decides alone, even when the others would allow more.
        let g = file(0o077, 1000, 100);
        assert!(!permits(&g, &as_owner, Access::READ));
        assert!(permits(&g, &as_stranger, Access::READ));
        // Asking for nothing (F_OK) always succeeds.
        assert!(permits(&g, &as_owner, Access::NONE));
    }

    #[test]
    fn groups_are_asked_only_when_they_change_the_answer() {
        let caller = Counting {
            groups: vec![100],
            ..Default::default()
        };
        let cred = Credentials::new(1001, 5, &caller);
        // Group and other bits agree on read: no need to know the groups.
        assert!(permits(&file(0o644, 1000, 100), &cred, Access::READ));
        assert_eq!(caller.asked.get(), 0);
        // They differ: the groups decide.
        assert!(permits(&file(0o640, 1000, 100), &cred, Access::READ));
        assert_eq!(caller.asked.get(), 1);
        // The owner never asks.
        let owner = Credentials::new(1000, 5, &caller);
        assert!(permits(&file(0o600, 1000, 100), &owner, Access::READ));
        assert_eq!(caller.asked.get(), 1);
    }

    #[test]
    fn capabilities_override_as_in_linux() {
        let root = Credentials::root();
        let f = file(0o000, 1000, 100);
        assert!(permits(&f, &root, Access::READ_WRITE));
        // Executing needs an execute bit for someone, even for root.
        assert!(!permits(&f, &root, Access::EXEC));
        assert!(permits(&file(0o001, 1000, 100), &root, Access::EXEC));
        // Directories are searchable by root whatever their bits.
        assert!(permits(&dir(0o000, 1000, 100), &root, Access::EXEC));

        // Root without capabilities is an ordinary user.
        let none = KnownCaller::default();
        let weak_root = Credentials::new(0, 0, &none);
        assert!(!permits(&f, &weak_root, Access::READ));

        // DAC_READ_SEARCH: read files, read and search directories, nothing more.
        let reader = KnownCaller {
            groups: vec![],
            capabilities: vec![Capability::DacReadSearch],
        };
        let cred = Credentials::new(1002, 5, &reader);
        assert!(permits(&f, &cred, Access::READ));
        assert!(!permits(&f, &cred, Access::WRITE));
        assert!(!permits(&f, &cred, Access::READ_WRITE));
        assert!(permits(&dir(0o000, 1000, 100), &cred, Access::EXEC));
        assert!(permits(&dir(0o000, 1000, 100), &cred, Access::READ));
        assert!(!permits(&dir(0o000, 1000, 100), &cred, Access::WRITE));
    }

    #[test]
    fn creating_and_deleting_need_write_and_search_on_the_directory() {
        let nobody = KnownCaller::default();
        let cred = Credentials::new(1002, 5, &nobody);
        assert_eq!(
            errno(may_create(&dir(0o755, 1000, 100), &cred)),
            libc::EACCES
        );
        assert_eq!(errno(may_create(&dir(0o777, 1000, 100), &cred)), 0);
        // Write without search is not enough.
        assert_eq!(
            errno(may_create(&dir(0o776, 1000, 100), &cred)),
            libc::EACCES
        );
        let victim = file(0o644, 1001, 100);
        assert_eq!(errno(may_delete(&dir(0o777, 1000, 100), &victim, &cred)), 0);
        assert_eq!(
            errno(may_delete(&dir(0o755, 1000, 100), &victim, &cred)),
            libc::EACCES
        );
    }

    #[test]
    fn a_sticky_directory_protects_other_peoples_entries() {
        let nobody = KnownCaller::default();
        let tmp = dir(0o1777, 0, 0);
        let theirs = file(0o666, 1001, 100);
        let mine = file(0o600, 1002, 100);
        let cred = Credentials::new(1002, 5, &nobody);
        assert_eq!(errno(may_delete(&tmp, &theirs, &cred)), libc::EPERM);
        assert_eq!(errno(may_delete(&tmp, &mine, &cred)), 0);
        // The directory's owner may remove anything in it.
        let owned_tmp = dir(0o1777, 1002, 5);
        assert_eq!(errno(may_delete(&owned_tmp, &theirs, &cred)), 0);
        // So may root (CAP_FOWNER).
        assert_eq!(errno(may_delete(&tmp, &theirs, &Credentials::root())), 0);
    }

    #[test]
    fn protected_hardlinks() {
        let nobody = KnownCaller::default();
        let cred = Credentials::new(1002, 5, &nobody);
        // Not readable and writable by the caller: refused when protected.
        let private = file(0o644, 1000, 100);
        assert_eq!(errno(may_link(&private, &cred)), libc::EPERM);
        assert_eq!(
            errno(may_link(&private, &cred.protected_hardlinks(false))),
            0
        );
        assert_eq!(errno(may_link(&file(0o666, 1000, 100), &cred)), 0);
        // Set-user-id, or set-group-id and group-executable: refused even if writable.
        assert_eq!(
            errno(may_link(&file(0o4666, 1000, 100), &cred)),
            libc::EPERM
        );
        assert_eq!(
            errno(may_link(&file(0o2676, 1000, 100), &cred)),
            libc::EPERM
        );
        assert_eq!(errno(may_link(&file(0o2666, 1000, 100), &cred)), 0);
        // Not a regular file.
        let fifo = node(FileKind::Fifo, 0o666, 1000, 100);
        assert_eq!(errno(may_link(&fifo, &cred)), libc::EPERM);
        // The owner links anything.
        let owner = Credentials::new(1000, 5, &nobody);
        assert_eq!(errno(may_link(&file(0o4000, 1000, 100), &owner)), 0);
    }

    fn change() -> SetAttr {
        SetAttr::default()
    }

    /// `changes`, as asked through an open file.
    fn through_handle(changes: &SetAttr) -> SetAttr {
        SetAttr {
            through_handle: true,
            ..changes.clone()
        }
    }

    #[test]
    fn chmod_belongs_to_the_owner_and_drops_sgid_outside_the_group() {
        let nobody = KnownCaller::default();
        let f = file(0o644, 1000, 100);
        let stranger = Credentials::new(1002, 5, &nobody);
        let owner = Credentials::new(1000, 5, &nobody);
        let chmod = |perm| SetAttr {
            perm: Some(perm),
            ..change()
        };
        assert_eq!(errno(setattr(&f, &chmod(0o600), &stranger)), libc::EPERM);
        // The owner is not in group 100: set-group-id is dropped, the rest applies.
        let applied = setattr(&f, &chmod(0o2755), &owner).unwrap();
        assert_eq!(applied.perm, Some(0o755));
        // In the group, it stays.
        let member = KnownCaller::with_groups(&[100]);
        let owner_in_group = Credentials::new(1000, 5, &member);
        let applied = setattr(&f, &chmod(0o2755), &owner_in_group).unwrap();
        assert_eq!(applied.perm, Some(0o2755));
        // Root keeps it (CAP_FSETID) and may chmod anything (CAP_FOWNER).
        let applied = setattr(&f, &chmod(0o2755), &Credentials::root()).unwrap();
        assert_eq!(applied.perm, Some(0o2755));
        // Set-user-id is the owner's to set.
        let applied = setattr(&f, &chmod(0o4755), &owner).unwrap();
        assert_eq!(applied.perm, Some(0o4755));
    }

    #[test]
    fn chown_is_roots_and_chgrp_the_owners_within_their_groups() {
        let member = KnownCaller::with_groups(&[200]);
        let f = file(0o644, 1000, 100);
        let owner = Credentials::new(1000, 5, &member);
        let stranger = Credentials::new(1002, 5, &member);
        let chown = |uid: Option<u32>, gid: Option<u32>| SetAttr {
            uid,
            gid,
            ..change()
        };
        assert_eq!(
            errno(setattr(&f, &chown(Some(1002), None), &owner)),
            libc::EPERM
        );
        // Giving a file to its own owner is a no-op the owner may do; nobody else may.
        assert_eq!(errno(setattr(&f, &chown(Some(1000), None), &owner)), 0);
        assert_eq!(
            errno(setattr(&f, &chown(Some(1000), None), &stranger)),
            libc::EPERM
        );
        assert_eq!(errno(setattr(&f, &chown(None, Some(200)), &owner)), 0);
        assert_eq!(errno(setattr(&f, &chown(None, Some(5)), &owner)), 0);
        assert_eq!(
            errno(setattr(&f, &chown(None, Some(300)), &owner)),
            libc::EPERM
        );
        assert_eq!(
            errno(setattr(&f, &chown(None, Some(200)), &stranger)),
            libc::EPERM
        );
        assert_eq!(
            errno(setattr(&f, &chown(Some(1), Some(1)), &Credentials::root(),)),
            0
        );
    }

    #[test]
    fn chown_and_truncate_drop_set_id_bits() {
        let nobody = KnownCaller::default();
        let owner = Credentials::new(1000, 100, &nobody);
        let chgrp = SetAttr {
            gid: Some(100),
            ..change()
        };
        // Set-user-id always goes; set-group-id with group execute goes.
        let applied = setattr(&file(0o6755, 1000, 100), &chgrp, &owner).unwrap();
        assert_eq!(applied.perm, Some(0o755));
        // Set-group-id without group execute (a locking marker) stays for a member...
        let applied = setattr(&file(0o2745, 1000, 100), &chgrp, &owner).unwrap();
        assert_eq!(applied.perm, None);
        // ...and for root, whose chown drops only what a member's would.
        let root_chown = SetAttr {
            uid: Some(1),
            ..change()
        };
        let applied = setattr(&file(0o6745, 1000, 100), &root_chown, &Credentials::root()).unwrap();
        assert_eq!(applied.perm, Some(0o2745));
        // Directories keep their bits.
        let applied = setattr(&dir(0o2755, 1000, 100), &root_chown, &Credentials::root()).unwrap();
        assert_eq!(applied.perm, None);
        // A truncation by someone without CAP_FSETID drops them; by root it does not.
        let truncate = SetAttr {
            size: Some(0),
            ..change()
        };
        let writable = file(0o6777, 1000, 100);
        let applied = setattr(&writable, &truncate, &owner).unwrap();
        assert_eq!(applied.perm, Some(0o777));
        let applied = setattr(&writable, &truncate, &Credentials::root()).unwrap();
        assert_eq!(applied.perm, None);
    }

    #[test]
    fn truncation_needs_write_permission_unless_through_a_handle() {
        let nobody = KnownCaller::default();
        let cred = Credentials::new(1002, 5, &nobody);
        let f = file(0o644, 1000, 100);
        let truncate = SetAttr {
            size: Some(3),
            mtime: Some(SetTime::Now),
            ..change()
        };
        assert_eq!(errno(setattr(&f, &truncate, &cred)), libc::EACCES);
        assert_eq!(errno(setattr(&f, &through_handle(&truncate), &cred)), 0);
        assert_eq!(errno(setattr(&file(0o666, 1000, 100), &truncate, &cred)), 0);
    }

    #[test]
    fn times() {
        let nobody = KnownCaller::default();
        let stranger = Credentials::new(1002, 5, &nobody);
        let owner = Credentials::new(1000, 5, &nobody);
        let now = SetAttr {
            atime: Some(SetTime::Now),
            mtime: Some(SetTime::Now),
            ..change()
        };
        let explicit = SetAttr {
            mtime: Some(SetTime::At(5)),
            ..change()
        };
        let now_and_omit = SetAttr {
            atime: Some(SetTime::Now),
            ..change()
        };
        let read_only = file(0o444, 1000, 100);
        let writable = file(0o666, 1000, 100);
        // "Now": the owner even of a read-only file, or anyone who may write.
        assert_eq!(errno(setattr(&read_only, &now, &owner)), 0);
        assert_eq!(errno(setattr(&read_only, &now, &stranger)), libc::EACCES);
        assert_eq!(errno(setattr(&writable, &now, &stranger)), 0);
        // Anything else is the owner's (or CAP_FOWNER's), writable or not.
        assert_eq!(errno(setattr(&writable, &explicit, &stranger)), libc::EPERM);
        assert_eq!(
            errno(setattr(&writable, &now_and_omit, &stranger)),
            libc::EPERM
        );
        assert_eq!(errno(setattr(&read_only, &explicit, &owner)), 0);
        assert_eq!(
            errno(setattr(&read_only, &explicit, &Credentials::root())),
            0
        );
        // The kernel passing on a writer's times (it keeps them itself): write
        // permission or an open handle.
        let kept = SetAttr {
            mtime: Some(SetTime::At(5)),
            ctime: Some(5),
            ..change()
        };
        assert_eq!(errno(setattr(&writable, &kept, &stranger)), 0);
        assert_eq!(
            errno(setattr(&read_only, &through_handle(&kept), &stranger)),
            0
        );
        assert_eq!(errno(setattr(&read_only, &kept, &stranger)), libc::EACCES);
    }

    #[test]
    fn extended_attributes() {
        let nobody = KnownCaller::default();
        let cred = Credentials::new(1002, 5, &nobody);
        let f = file(0o644, 1000, 100);
        assert_eq!(errno(may_xattr(&f, b"user.a", false, &cred)), 0);
        assert_eq!(errno(may_xattr(&f, b"user.a", true, &cred)), libc::EACCES);
        // security.* is for the security modules to police.
        assert_eq!(errno(may_xattr(&f, b"security.capability", true, &cred)), 0);
        let link = node(FileKind::Symlink, 0o777, 1000, 100);
        assert_eq!(errno(may_xattr(&link, b"user.a", true, &cred)), libc::EPERM);
        assert_eq!(
            errno(may_xattr(&link, b"user.a", false, &cred)),
            libc::ENODATA
        );
        let tmp = dir(0o1777, 0, 0);
        assert_eq!(errno(may_xattr(&tmp, b"user.a", true, &cred)), libc::EPERM);
        assert_eq!(errno(may_xattr(&tmp, b"user.a", false, &cred)), 0);
    }

    #[test]
    fn new_nodes_take_the_group_of_a_set_group_id_directory() {
        let nobody = KnownCaller::default();
        let cred = Credentials::new(1002, 5, &nobody);
        let plain = dir(0o777, 1000, 100);
        let sgid = dir(0o2777, 1000, 100);
        let made = new_owner(&plain, &cred, 0o644, FileKind::File);
        assert_eq!((made.uid, made.gid, made.perm), (1002, 5, 0o644));
        let made = new_owner(&sgid, &cred, 0o644, FileKind::File);
        assert_eq!((made.uid, made.gid, made.perm), (1002, 100, 0o644));
        let made = new_owner(&sgid, &cred, 0o755, FileKind::Directory);
        assert_eq!((made.uid, made.gid, made.perm), (1002, 100, 0o2755));
    }
}
