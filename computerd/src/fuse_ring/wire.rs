//! FUSE requests and replies as the io_uring transport lays them out, from
//! `include/uapi/linux/fuse.h` (protocol 7.45, kernel 6.14 and later).
//!
//! A ring entry is two buffers the daemon registered: a header buffer
//! (`struct fuse_uring_req_header`: the request's `fuse_in_header`, the opcode's own
//! header, then the entry's commit id and payload size) and a payload buffer (what
//! follows the opcode's header: names, data). The reply goes back the same way: a
//! `fuse_out_header` where the request's header was, its body in the payload buffer.
//! Decoding never trusts the kernel's sizes: a short or malformed request is an error,
//! never a panic (a property test below decodes arbitrary bytes).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{Errno, FileAttr, FileType};

/// `struct fuse_uring_req_header`: `in_out` (128 bytes), `op_in` (128), then
/// `struct fuse_uring_ent_in_out` (flags, commit id, payload size, padding, reserved).
pub const HEADER_BYTES: usize = 288;
const OP_IN_OFFSET: usize = 128;
const OP_IN_BYTES: usize = 128;
const COMMIT_ID_OFFSET: usize = 264;
const PAYLOAD_SIZE_OFFSET: usize = 272;

const OUT_HEADER_BYTES: usize = 16;

/// `struct fuse_attr`.
const ATTR_BYTES: usize = 88;
/// `struct fuse_entry_out`: node id, generation, two validities and their nanoseconds,
/// then the attributes.
pub const ENTRY_OUT_BYTES: usize = 40 + ATTR_BYTES;
/// `struct fuse_dirent` before its name.
const DIRENT_BYTES: usize = 24;

mod opcode {
    pub const LOOKUP: u32 = 1;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const FALLOCATE: u32 = 43;
    pub const READDIRPLUS: u32 = 44;
    pub const RENAME2: u32 = 45;
    pub const LSEEK: u32 = 46;
    pub const COPY_FILE_RANGE: u32 = 47;
}

/// `struct fuse_in_header`, the fields a handler uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InHeader {
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// A request, decoded. What this transport does not carry yet is `Unsupported`:
/// answered ENOSYS, as fuser answers what a filesystem does not implement.
#[derive(Debug, PartialEq, Eq)]
pub enum Request<'a> {
    Lookup {
        name: &'a OsStr,
    },
    Getattr,
    Readlink,
    Open {
        flags: i32,
    },
    Read {
        fh: u64,
        offset: u64,
        size: u32,
    },
    Flush {
        fh: u64,
    },
    Release {
        fh: u64,
    },
    Fsync {
        fh: u64,
        datasync: bool,
    },
    Opendir,
    Readdir {
        offset: u64,
        size: u32,
    },
    Readdirplus {
        offset: u64,
        size: u32,
    },
    Releasedir,
    Fsyncdir,
    Statfs,
    Getxattr {
        name: &'a OsStr,
        size: u32,
    },
    Listxattr {
        size: u32,
    },
    Access {
        mask: i32,
    },
    Lseek {
        offset: i64,
        whence: i32,
    },
    Setattr(SetattrIn),
    Mknod {
        name: &'a OsStr,
        mode: u32,
        rdev: u32,
    },
    Mkdir {
        name: &'a OsStr,
        mode: u32,
    },
    Unlink {
        name: &'a OsStr,
    },
    Rmdir {
        name: &'a OsStr,
    },
    Symlink {
        name: &'a OsStr,
        target: &'a OsStr,
    },
    /// RENAME (flags 0) and RENAME2.
    Rename {
        name: &'a OsStr,
        newdir: u64,
        newname: &'a OsStr,
        flags: u32,
    },
    Link {
        oldnodeid: u64,
        newname: &'a OsStr,
    },
    Create {
        name: &'a OsStr,
        flags: i32,
        mode: u32,
    },
    Write {
        fh: u64,
        offset: u64,
        write_flags: u32,
        data: &'a [u8],
    },
    Setxattr {
        name: &'a OsStr,
        value: &'a [u8],
        flags: i32,
    },
    Removexattr {
        name: &'a OsStr,
    },
    Fallocate {
        fh: u64,
        offset: u64,
        length: u64,
        mode: i32,
    },
    CopyFileRange {
        fh_in: u64,
        off_in: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
    },
    Unsupported {
        opcode: u32,
    },
}

/// `struct fuse_setattr_in`: which fields are set (`valid`, `FATTR_*`) and their values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SetattrIn {
    pub valid: u32,
    pub fh: u64,
    pub size: u64,
    /// Seconds and nanoseconds, as the kernel sends them.
    pub atime: (i64, u32),
    pub mtime: (i64, u32),
    pub ctime: (i64, u32),
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

/// The `FATTR_*` bits of [`SetattrIn::valid`].
pub mod fattr {
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const FH: u32 = 1 << 6;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
    pub const CTIME: u32 = 1 << 10;
}

impl Request<'_> {
    /// Whether the kernel sends it on behalf of a process other than the mount's owner
    /// even on a mount only the owner may use (fuser lets these through its check).
    pub fn exempt_from_owner_check(&self) -> bool {
        matches!(
            self,
            Request::Read { .. }
                | Request::Write { .. }
                | Request::Readdir { .. }
                | Request::Readdirplus { .. }
                | Request::Fsync { .. }
                | Request::Fsyncdir
                | Request::Release { .. }
                | Request::Releasedir
        )
    }
}

/// What a ring entry holds: the request's header, its commit id (which the reply must
/// carry back) and the size of its payload.
#[derive(Debug, PartialEq, Eq)]
pub struct Entry {
    pub header: InHeader,
    pub commit_id: u64,
    pub payload_bytes: usize,
}

/// Reads the header buffer of an entry the kernel filled.
pub fn entry(header: &[u8]) -> Result<Entry, Errno> {
    if header.len() < HEADER_BYTES {
        return Err(Errno::EIO);
    }
    let entry = Entry {
        header: InHeader {
            opcode: u32_at(header, 4)?,
            unique: u64_at(header, 8)?,
            nodeid: u64_at(header, 16)?,
            uid: u32_at(header, 24)?,
            gid: u32_at(header, 28)?,
            pid: u32_at(header, 32)?,
        },
        commit_id: u64_at(header, COMMIT_ID_OFFSET)?,
        payload_bytes: u32_at(header, PAYLOAD_SIZE_OFFSET)? as usize,
    };
    Ok(entry)
}

/// The opcode's own header within an entry's header buffer.
pub fn op_in(header: &[u8]) -> &[u8] {
    header
        .get(OP_IN_OFFSET..OP_IN_OFFSET + OP_IN_BYTES)
        .unwrap_or_default()
}

/// Decodes a request from its opcode, the opcode's header and its payload.
pub fn decode<'a>(opcode: u32, op_in: &'a [u8], payload: &'a [u8]) -> Result<Request<'a>, Errno> {
    let request = match opcode {
        opcode::LOOKUP => Request::Lookup {
            name: name(payload)?,
        },
        opcode::GETATTR => Request::Getattr,
        opcode::READLINK => Request::Readlink,
        opcode::OPEN => Request::Open {
            flags: u32_at(op_in, 0)? as i32,
        },
        opcode::READ => Request::Read {
            fh: u64_at(op_in, 0)?,
            offset: u64_at(op_in, 8)?,
            size: u32_at(op_in, 16)?,
        },
        opcode::FLUSH => Request::Flush {
            fh: u64_at(op_in, 0)?,
        },
        opcode::RELEASE => Request::Release {
            fh: u64_at(op_in, 0)?,
        },
        opcode::FSYNC => Request::Fsync {
            fh: u64_at(op_in, 0)?,
            datasync: u32_at(op_in, 8)? & 1 != 0,
        },
        opcode::OPENDIR => Request::Opendir,
        opcode::READDIR => Request::Readdir {
            offset: u64_at(op_in, 8)?,
            size: u32_at(op_in, 16)?,
        },
        opcode::READDIRPLUS => Request::Readdirplus {
            offset: u64_at(op_in, 8)?,
            size: u32_at(op_in, 16)?,
        },
        opcode::RELEASEDIR => Request::Releasedir,
        opcode::FSYNCDIR => Request::Fsyncdir,
        opcode::STATFS => Request::Statfs,
        opcode::GETXATTR => Request::Getxattr {
            size: u32_at(op_in, 0)?,
            name: name(payload)?,
        },
        opcode::LISTXATTR => Request::Listxattr {
            size: u32_at(op_in, 0)?,
        },
        opcode::ACCESS => Request::Access {
            mask: u32_at(op_in, 0)? as i32,
        },
        opcode::LSEEK => Request::Lseek {
            offset: u64_at(op_in, 8)? as i64,
            whence: u32_at(op_in, 16)? as i32,
        },
        opcode => return decode_change(opcode, op_in, payload),
    };
    Ok(request)
}

/// Decodes the requests that change the tree (and `Unsupported`).
fn decode_change<'a>(
    opcode: u32,
    op_in: &'a [u8],
    payload: &'a [u8],
) -> Result<Request<'a>, Errno> {
    let request = match opcode {
        opcode::SETATTR => Request::Setattr(setattr_in(op_in)?),
        opcode::WRITE => {
            let size = u32_at(op_in, 16)? as usize;
            Request::Write {
                fh: u64_at(op_in, 0)?,
                offset: u64_at(op_in, 8)?,
                write_flags: u32_at(op_in, 20)?,
                data: payload.get(..size).ok_or(Errno::EINVAL)?,
            }
        }
        opcode::SETXATTR => {
            let size = u32_at(op_in, 0)? as usize;
            let name = name(payload)?;
            let value_at = name.len() + 1;
            let value = payload.get(value_at..value_at + size);
            Request::Setxattr {
                name,
                value: value.ok_or(Errno::EINVAL)?,
                flags: u32_at(op_in, 4)? as i32,
            }
        }
        opcode::REMOVEXATTR => Request::Removexattr {
            name: name(payload)?,
        },
        opcode::FALLOCATE => Request::Fallocate {
            fh: u64_at(op_in, 0)?,
            offset: u64_at(op_in, 8)?,
            length: u64_at(op_in, 16)?,
            mode: u32_at(op_in, 24)? as i32,
        },
        opcode::COPY_FILE_RANGE => Request::CopyFileRange {
            fh_in: u64_at(op_in, 0)?,
            off_in: u64_at(op_in, 8)?,
            fh_out: u64_at(op_in, 24)?,
            off_out: u64_at(op_in, 32)?,
            len: u64_at(op_in, 40)?,
        },
        opcode => return decode_names_change(opcode, op_in, payload),
    };
    Ok(request)
}

/// Decodes the requests that add, remove or move names (and `Unsupported`).
fn decode_names_change<'a>(
    opcode: u32,
    op_in: &'a [u8],
    payload: &'a [u8],
) -> Result<Request<'a>, Errno> {
    let request = match opcode {
        opcode::MKNOD => Request::Mknod {
            mode: u32_at(op_in, 0)?,
            rdev: u32_at(op_in, 4)?,
            name: name(payload)?,
        },
        opcode::MKDIR => Request::Mkdir {
            mode: u32_at(op_in, 0)?,
            name: name(payload)?,
        },
        opcode::UNLINK => Request::Unlink {
            name: name(payload)?,
        },
        opcode::RMDIR => Request::Rmdir {
            name: name(payload)?,
        },
        opcode::SYMLINK => {
            let (name, target) = two_names(payload)?;
            Request::Symlink { name, target }
        }
        opcode::RENAME | opcode::RENAME2 => {
            let (name, newname) = two_names(payload)?;
            let flags = match opcode {
                opcode::RENAME2 => u32_at(op_in, 8)?,
                _ => 0,
            };
            let newdir = u64_at(op_in, 0)?;
            Request::Rename {
                name,
                newdir,
                newname,
                flags,
            }
        }
        opcode::LINK => Request::Link {
            oldnodeid: u64_at(op_in, 0)?,
            newname: name(payload)?,
        },
        opcode::CREATE => Request::Create {
            flags: u32_at(op_in, 0)? as i32,
            mode: u32_at(op_in, 4)?,
            name: name(payload)?,
        },
        opcode => Request::Unsupported { opcode },
    };
    Ok(request)
}

/// `struct fuse_setattr_in`.
fn setattr_in(op_in: &[u8]) -> Result<SetattrIn, Errno> {
    Ok(SetattrIn {
        valid: u32_at(op_in, 0)?,
        fh: u64_at(op_in, 8)?,
        size: u64_at(op_in, 16)?,
        atime: (u64_at(op_in, 32)? as i64, u32_at(op_in, 56)?),
        mtime: (u64_at(op_in, 40)? as i64, u32_at(op_in, 60)?),
        ctime: (u64_at(op_in, 48)? as i64, u32_at(op_in, 64)?),
        mode: u32_at(op_in, 68)?,
        uid: u32_at(op_in, 76)?,
        gid: u32_at(op_in, 80)?,
    })
}

/// Two names one after the other, each NUL-terminated (SYMLINK, RENAME).
fn two_names(payload: &[u8]) -> Result<(&OsStr, &OsStr), Errno> {
    let first = name(payload)?;
    let second = name(&payload[first.len() + 1..])?;
    Ok((first, second))
}

/// What a READ asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadArgs {
    pub fh: u64,
    pub offset: u64,
    pub size: u32,
}

/// A READ's arguments (a READ carries no payload: its reply can take the payload
/// buffer's place); `None` for another opcode, or a READ too short to hold them, which
/// [`decode`] refuses.
pub fn read_args(opcode: u32, op_in: &[u8]) -> Option<ReadArgs> {
    if opcode != opcode::READ {
        return None;
    }
    match decode(opcode, op_in, &[]) {
        Ok(Request::Read { fh, offset, size }) => Some(ReadArgs { fh, offset, size }),
        _ => None,
    }
}

/// A name the kernel sends NUL-terminated.
fn name(payload: &[u8]) -> Result<&OsStr, Errno> {
    let end = payload.iter().position(|&b| b == 0).ok_or(Errno::EINVAL)?;
    Ok(OsStr::from_bytes(&payload[..end]))
}

fn u32_at(bytes: &[u8], offset: usize) -> Result<u32, Errno> {
    let field = bytes.get(offset..offset + 4).ok_or(Errno::EINVAL)?;
    Ok(u32::from_ne_bytes(field.try_into().expect("four bytes")))
}

fn u64_at(bytes: &[u8], offset: usize) -> Result<u64, Errno> {
    let field = bytes.get(offset..offset + 8).ok_or(Errno::EINVAL)?;
    Ok(u64::from_ne_bytes(field.try_into().expect("eight bytes")))
}

/// Writes the reply's `fuse_out_header` over the request's header, and the size of
/// its body where the kernel reads it.
pub fn put_reply_header(header: &mut [u8], unique: u64, errno: i32, body_bytes: usize) {
    assert!(header.len() >= HEADER_BYTES, "a ring header buffer");
    let len = (OUT_HEADER_BYTES + body_bytes) as u32;
    header[0..4].copy_from_slice(&len.to_ne_bytes());
    header[4..8].copy_from_slice(&(-errno).to_ne_bytes());
    header[8..16].copy_from_slice(&unique.to_ne_bytes());
    let size = PAYLOAD_SIZE_OFFSET..PAYLOAD_SIZE_OFFSET + 4;
    header[size].copy_from_slice(&(body_bytes as u32).to_ne_bytes());
}

/// Appends `struct fuse_entry_out`.
pub fn put_entry(out: &mut Vec<u8>, ttl: &Duration, attr: &FileAttr, generation: u64) {
    for word in [attr.ino.0, generation, ttl.as_secs(), ttl.as_secs()] {
        out.extend_from_slice(&word.to_ne_bytes());
    }
    for word in [ttl.subsec_nanos(), ttl.subsec_nanos()] {
        out.extend_from_slice(&word.to_ne_bytes());
    }
    put_attr(out, attr);
}

/// Appends `struct fuse_attr_out`.
pub fn put_attr_out(out: &mut Vec<u8>, ttl: &Duration, attr: &FileAttr) {
    out.extend_from_slice(&ttl.as_secs().to_ne_bytes());
    out.extend_from_slice(&ttl.subsec_nanos().to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    put_attr(out, attr);
}

/// Appends `struct fuse_attr`.
fn put_attr(out: &mut Vec<u8>, attr: &FileAttr) {
    let start = out.len();
    let (atime, mtime, ctime) = (
        timestamp(attr.atime),
        timestamp(attr.mtime),
        timestamp(attr.ctime),
    );
    for word in [attr.ino.0, attr.size, attr.blocks] {
        out.extend_from_slice(&word.to_ne_bytes());
    }
    for seconds in [atime.0, mtime.0, ctime.0] {
        out.extend_from_slice(&seconds.to_ne_bytes());
    }
    let mode = mode_bits(attr.kind) | u32::from(attr.perm);
    let words = [
        atime.1,
        mtime.1,
        ctime.1,
        mode,
        attr.nlink,
        attr.uid,
        attr.gid,
        attr.rdev,
        attr.blksize,
        attr.flags,
    ];
    for word in words {
        out.extend_from_slice(&word.to_ne_bytes());
    }
    debug_assert_eq!(out.len() - start, ATTR_BYTES);
}

/// Seconds and nanoseconds since the epoch, before it as negative seconds.
fn timestamp(time: SystemTime) -> (i64, u32) {
    match time.duration_since(UNIX_EPOCH) {
        Ok(since) => (since.as_secs() as i64, since.subsec_nanos()),
        Err(before) => {
            let before = before.duration();
            match before.subsec_nanos() {
                0 => (-(before.as_secs() as i64), 0),
                nanos => (-(before.as_secs() as i64) - 1, 1_000_000_000 - nanos),
            }
        }
    }
}

fn mode_bits(kind: FileType) -> u32 {
    match kind {
        FileType::NamedPipe => libc::S_IFIFO,
        FileType::CharDevice => libc::S_IFCHR,
        FileType::BlockDevice => libc::S_IFBLK,
        FileType::Directory => libc::S_IFDIR,
        FileType::RegularFile => libc::S_IFREG,
        FileType::Symlink => libc::S_IFLNK,
        FileType::Socket => libc::S_IFSOCK,
    }
}

/// Appends `struct fuse_open_out`; `backing_id` is 0 unless `open_flags` asks for
/// passthrough.
pub fn put_open(out: &mut Vec<u8>, fh: u64, open_flags: u32, backing_id: u32) {
    out.extend_from_slice(&fh.to_ne_bytes());
    out.extend_from_slice(&open_flags.to_ne_bytes());
    out.extend_from_slice(&backing_id.to_ne_bytes());
}

/// Appends `struct fuse_write_out`.
pub fn put_written(out: &mut Vec<u8>, size: u32) {
    out.extend_from_slice(&size.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
}

/// Appends `struct fuse_kstatfs`: `counts` are blocks, bfree, bavail, files and
/// ffree; `sizes` are bsize, namelen and frsize.
pub fn put_statfs(out: &mut Vec<u8>, counts: [u64; 5], sizes: [u32; 3]) {
    for word in counts {
        out.extend_from_slice(&word.to_ne_bytes());
    }
    for word in sizes.into_iter().chain([0]) {
        out.extend_from_slice(&word.to_ne_bytes());
    }
    out.extend_from_slice(&[0u8; 24]); // spare
}

/// Appends a `struct fuse_dirent` (with `plus`, a `struct fuse_direntplus`: the entry
/// first) if it fits in `limit` bytes; returns false if it does not.
pub fn put_dirent(
    out: &mut Vec<u8>,
    limit: usize,
    plus: Option<(&Duration, &FileAttr, u64)>,
    ino: u64,
    offset: u64,
    kind: FileType,
    name: &[u8],
) -> bool {
    let entry_bytes = if plus.is_some() { ENTRY_OUT_BYTES } else { 0 };
    let dirent_bytes = (DIRENT_BYTES + name.len()).next_multiple_of(8);
    if out.len() + entry_bytes + dirent_bytes > limit {
        return false;
    }
    if let Some((ttl, attr, generation)) = plus {
        put_entry(out, ttl, attr, generation);
    }
    out.extend_from_slice(&ino.to_ne_bytes());
    out.extend_from_slice(&offset.to_ne_bytes());
    out.extend_from_slice(&(name.len() as u32).to_ne_bytes());
    out.extend_from_slice(&(mode_bits(kind) >> 12).to_ne_bytes());
    out.extend_from_slice(name);
    out.resize(out.len() + dirent_bytes - DIRENT_BYTES - name.len(), 0);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use fuser::INodeNo;

    fn header_buffer(opcode: u32, op_in: &[u8], payload_bytes: u32) -> Vec<u8> {
        let mut header = vec![0u8; HEADER_BYTES];
        header[0..4].copy_from_slice(&60u32.to_ne_bytes());
        header[4..8].copy_from_slice(&opcode.to_ne_bytes());
        header[8..16].copy_from_slice(&42u64.to_ne_bytes());
        header[16..24].copy_from_slice(&7u64.to_ne_bytes());
        header[24..28].copy_from_slice(&1000u32.to_ne_bytes());
        header[28..32].copy_from_slice(&100u32.to_ne_bytes());
        header[32..36].copy_from_slice(&4321u32.to_ne_bytes());
        header[OP_IN_OFFSET..OP_IN_OFFSET + op_in.len()].copy_from_slice(op_in);
        header[COMMIT_ID_OFFSET..COMMIT_ID_OFFSET + 8].copy_from_slice(&9u64.to_ne_bytes());
        header[PAYLOAD_SIZE_OFFSET..PAYLOAD_SIZE_OFFSET + 4]
            .copy_from_slice(&payload_bytes.to_ne_bytes());
        header
    }

    #[test]
    fn an_entry_header_is_read_at_the_kernels_offsets() {
        let header = header_buffer(opcode::LOOKUP, &[], 4);
        let entry = entry(&header).unwrap();
        assert_eq!(
            entry,
            Entry {
                header: InHeader {
                    opcode: opcode::LOOKUP,
                    unique: 42,
                    nodeid: 7,
                    uid: 1000,
                    gid: 100,
                    pid: 4321,
                },
                commit_id: 9,
                payload_bytes: 4,
            }
        );
        assert_eq!(entry_short(), Err(Errno::EIO));
    }

    fn entry_short() -> Result<Entry, Errno> {
        entry(&[0u8; HEADER_BYTES - 1])
    }

    #[test]
    fn requests_decode_from_their_header_and_payload() {
        let mut read_in = Vec::new();
        for word in [5u64, 4096] {
            read_in.extend_from_slice(&word.to_ne_bytes());
        }
        read_in.extend_from_slice(&131072u32.to_ne_bytes());
        let header = header_buffer(opcode::READ, &read_in, 0);
        assert_eq!(
            decode(opcode::READ, op_in(&header), &[]),
            Ok(Request::Read {
                fh: 5,
                offset: 4096,
                size: 131072
            })
        );
        let args = ReadArgs {
            fh: 5,
            offset: 4096,
            size: 131072,
        };
        assert_eq!(read_args(opcode::READ, op_in(&header)), Some(args));
        assert_eq!(read_args(opcode::READ, &read_in[..19]), None);
        assert_eq!(read_args(opcode::WRITE, op_in(&header)), None);
        assert_eq!(
            decode(opcode::LOOKUP, &[], b"a.txt\0"),
            Ok(Request::Lookup {
                name: OsStr::new("a.txt")
            })
        );
        let getxattr_in = 0u32.to_ne_bytes();
        assert_eq!(
            decode(opcode::GETXATTR, &getxattr_in, b"user.x\0"),
            Ok(Request::Getxattr {
                name: OsStr::new("user.x"),
                size: 0
            })
        );
        assert_eq!(
            decode(99, &[], &[]),
            Ok(Request::Unsupported { opcode: 99 })
        );
    }

    fn words(words: &[u64]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_ne_bytes()).collect()
    }

    #[test]
    fn changes_decode_from_their_header_and_payload() {
        // fuse_write_in: fh, offset, size and write_flags, lock owner, flags.
        let mut write_in = words(&[5, 8192]);
        write_in.extend_from_slice(&3u32.to_ne_bytes());
        write_in.extend_from_slice(&4u32.to_ne_bytes());
        assert_eq!(
            decode(opcode::WRITE, &write_in, b"abcdef"),
            Ok(Request::Write {
                fh: 5,
                offset: 8192,
                write_flags: 4,
                data: b"abc"
            })
        );
        assert_eq!(
            decode(opcode::WRITE, &write_in, b"ab"),
            Err(Errno::EINVAL),
            "less data than the header says"
        );
        let mut rename2_in = words(&[9]);
        rename2_in.extend_from_slice(&libc::RENAME_EXCHANGE.to_ne_bytes());
        assert_eq!(
            decode(opcode::RENAME2, &rename2_in, b"a\0bc\0"),
            Ok(Request::Rename {
                name: OsStr::new("a"),
                newdir: 9,
                newname: OsStr::new("bc"),
                flags: libc::RENAME_EXCHANGE
            })
        );
        assert_eq!(
            decode(opcode::SYMLINK, &[], b"link\0../target\0"),
            Ok(Request::Symlink {
                name: OsStr::new("link"),
                target: OsStr::new("../target")
            })
        );
        assert_eq!(decode(opcode::SYMLINK, &[], b"link\0"), Err(Errno::EINVAL));
        let mut setxattr_in = 2u32.to_ne_bytes().to_vec();
        setxattr_in.extend_from_slice(&(libc::XATTR_CREATE as u32).to_ne_bytes());
        assert_eq!(
            decode(opcode::SETXATTR, &setxattr_in, b"user.k\0v\0"),
            Ok(Request::Setxattr {
                name: OsStr::new("user.k"),
                value: b"v\0",
                flags: libc::XATTR_CREATE
            })
        );
        assert_eq!(
            decode(opcode::SETXATTR, &setxattr_in, b"user.k\0v"),
            Err(Errno::EINVAL)
        );
    }

    #[test]
    fn setattr_reads_every_field_at_its_offset() {
        // valid, padding; fh, size, lock_owner, atime, mtime, ctime; atimensec,
        // mtimensec, ctimensec, mode, unused, uid, gid, unused.
        let mut op_in = Vec::new();
        op_in.extend_from_slice(&(fattr::MODE | fattr::MTIME).to_ne_bytes());
        op_in.extend_from_slice(&0u32.to_ne_bytes());
        op_in.extend(words(&[3, 4096, 0, 10, (-20i64) as u64, 30]));
        for word in [1u32, 2, 3, 0o4755, 0, 1000, 100, 0] {
            op_in.extend_from_slice(&word.to_ne_bytes());
        }
        assert_eq!(op_in.len(), 88, "struct fuse_setattr_in");
        assert_eq!(
            decode(opcode::SETATTR, &op_in, &[]),
            Ok(Request::Setattr(SetattrIn {
                valid: fattr::MODE | fattr::MTIME,
                fh: 3,
                size: 4096,
                atime: (10, 1),
                mtime: (-20, 2),
                ctime: (30, 3),
                mode: 0o4755,
                uid: 1000,
                gid: 100,
            }))
        );
        assert_eq!(
            decode(opcode::SETATTR, &op_in[..80], &[]),
            Err(Errno::EINVAL)
        );
    }

    #[test]
    fn opens_and_writes_encode_as_the_kernel_reads_them() {
        let mut out = Vec::new();
        put_open(&mut out, 7, 1 << 7, 3);
        assert_eq!(out.len(), 16, "struct fuse_open_out");
        assert_eq!(
            (u64_at(&out, 0), u32_at(&out, 8), u32_at(&out, 12)),
            (Ok(7), Ok(128), Ok(3))
        );
        out.clear();
        put_written(&mut out, 4096);
        assert_eq!(out.len(), 8, "struct fuse_write_out");
        assert_eq!(u32_at(&out, 0), Ok(4096));
    }

    #[test]
    fn malformed_requests_are_errors() {
        assert_eq!(decode(opcode::LOOKUP, &[], b"no-nul"), Err(Errno::EINVAL));
        assert_eq!(decode(opcode::READ, &[0u8; 12], &[]), Err(Errno::EINVAL));
        assert_eq!(decode(opcode::GETXATTR, &[], b"x\0"), Err(Errno::EINVAL));
    }

    fn attr() -> FileAttr {
        FileAttr {
            ino: INodeNo(12),
            size: 5000,
            blocks: 16,
            atime: UNIX_EPOCH + Duration::new(1_700_000_000, 5),
            mtime: UNIX_EPOCH - Duration::new(1, 250_000_000),
            ctime: UNIX_EPOCH,
            crtime: UNIX_EPOCH,
            kind: FileType::RegularFile,
            perm: 0o640,
            nlink: 2,
            uid: 1000,
            gid: 100,
            rdev: 0,
            blksize: 131072,
            flags: 0,
        }
    }

    #[test]
    fn attributes_encode_as_struct_fuse_attr() {
        let mut out = Vec::new();
        put_attr_out(&mut out, &Duration::new(3600, 7), &attr());
        assert_eq!(out.len(), 104);
        let attr_at = 16;
        assert_eq!(u64_at(&out, 0), Ok(3600));
        assert_eq!(u32_at(&out, 8), Ok(7));
        assert_eq!(u64_at(&out, attr_at), Ok(12));
        assert_eq!(u64_at(&out, attr_at + 8), Ok(5000));
        assert_eq!(u64_at(&out, attr_at + 24), Ok(1_700_000_000));
        // One and a quarter seconds before the epoch: -2 s + 0.75 s.
        assert_eq!(u64_at(&out, attr_at + 32), Ok(-2i64 as u64));
        assert_eq!(u32_at(&out, attr_at + 48), Ok(5));
        assert_eq!(u32_at(&out, attr_at + 52), Ok(750_000_000));
        assert_eq!(u32_at(&out, attr_at + 60), Ok(libc::S_IFREG | 0o640));
        assert_eq!(u32_at(&out, attr_at + 64), Ok(2));
        assert_eq!(u32_at(&out, attr_at + 80), Ok(131072));
    }

    #[test]
    fn directory_entries_are_padded_and_bounded() {
        let mut out = Vec::new();
        assert!(put_dirent(
            &mut out,
            64,
            None,
            3,
            1,
            FileType::Directory,
            b"."
        ));
        assert_eq!(out.len(), 32);
        assert_eq!(u32_at(&out, 20), Ok(libc::DT_DIR as u32));
        assert!(!put_dirent(
            &mut out,
            64,
            None,
            4,
            2,
            FileType::RegularFile,
            b"a-longer-name"
        ));
        assert_eq!(out.len(), 32, "an entry that does not fit is not written");
        let ttl = Duration::from_secs(1);
        let plus = Some((&ttl, &attr(), 0));
        assert!(put_dirent(
            &mut out,
            4096,
            plus,
            12,
            3,
            FileType::RegularFile,
            b"f"
        ));
        assert_eq!(out.len(), 32 + ENTRY_OUT_BYTES + 32);
    }

    proptest::proptest! {
        /// Whatever the kernel (or a bug) leaves in an entry, decoding answers or
        /// refuses; it never panics or reads past the buffers.
        #[test]
        fn decoding_arbitrary_bytes_never_panics(
            opcode in 0u32..64,
            op_header in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            payload in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            header in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400),
        ) {
            let _ = decode(opcode, &op_header, &payload);
            let _ = entry(&header);
            let _ = op_in(&header);
        }
    }

    #[test]
    fn the_reply_header_carries_the_error_and_body_size() {
        let mut header = vec![0u8; HEADER_BYTES];
        put_reply_header(&mut header, 42, libc::ENOENT, 0);
        assert_eq!(u32_at(&header, 0), Ok(16));
        assert_eq!(u32_at(&header, 4), Ok(-libc::ENOENT as u32));
        assert_eq!(u64_at(&header, 8), Ok(42));
        put_reply_header(&mut header, 43, 0, 104);
        assert_eq!(u32_at(&header, 0), Ok(120));
        assert_eq!(u32_at(&header, PAYLOAD_SIZE_OFFSET), Ok(104));
    }
}
