//! The path API: a Node-`fs`-like interface for tools and execution backends.
//!
//! Paths are absolute POSIX paths in UTF-8. Symlinks are followed in the middle of a path
//! and, where the operation follows them (stat, read, write), at its end; relative
//! targets resolve against the link's directory and more than
//! [`SYMLINKS_MAX`](crate::SYMLINKS_MAX) hops is ELOOP (`resolve.rs`). Every error names
//! the path it concerns.
//!
//! Each call is one mutation and one transaction, with one exception: streams
//! ([`FileWriter`]) commit in bounded pieces so memory stays bounded whatever the size.

use crate::access::Who;
use std::io::{self, Read, Seek, SeekFrom, Write};

use crate::error::{kind, Error, Result};
use crate::open_files::{FileHandle, OpenFlags};
use crate::resolve::{resolve_in, Resolved, Symlinks};
use crate::store::{self, PATH_MAX};
use crate::types::*;
use crate::workspace::Workspace;

/// Files up to this size that nothing has open are read in one transaction.
const READ_QUIET_BYTES_MAX: u64 = 1 << 20;

/// Options of [`Fs::mkdir`].
#[derive(Clone, Copy, Debug)]
pub struct MkdirOptions {
    /// Create missing parents and accept an existing directory (`mkdir -p`).
    pub recursive: bool,
    pub mode: u32,
}

impl Default for MkdirOptions {
    fn default() -> MkdirOptions {
        MkdirOptions {
            recursive: false,
            mode: 0o755,
        }
    }
}

/// Options of [`Fs::rm`].
#[derive(Clone, Copy, Debug, Default)]
pub struct RmOptions {
    /// Remove directories and their contents.
    pub recursive: bool,
    /// A missing path is not an error.
    pub force: bool,
}

/// The path API over a [`Workspace`]. Cheap to clone.
#[derive(Clone)]
pub struct Fs {
    ws: Workspace,
    uid: u32,
    gid: u32,
    symlinks: Symlinks,
}

fn path_bytes(path: &str) -> Result<&[u8]> {
    if !path.starts_with('/') {
        return Err(Error::invalid("path must be absolute").at(path));
    }
    if path.len() > PATH_MAX {
        return Err(kind::NameTooLong().at(path));
    }
    if path.contains('\0') {
        return Err(Error::invalid("path contains NUL").at(path));
    }
    Ok(path.as_bytes())
}

/// Joins a directory path and an entry name.
pub fn join(dir: &str, name: &str) -> String {
    if dir.ends_with('/') {
        format!("{dir}{name}")
    } else {
        format!("{dir}/{name}")
    }
}

impl Fs {
    pub(crate) fn new(ws: Workspace) -> Fs {
        // SAFETY: geteuid/getegid cannot fail.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        Fs {
            ws,
            uid,
            gid,
            symlinks: Symlinks::Follow,
        }
    }

    /// The workspace under this API.
    pub fn workspace(&self) -> &Workspace {
        &self.ws
    }

    /// Sets the owner of nodes this API creates (default: the process's effective ids).
    pub fn with_owner(mut self, uid: u32, gid: u32) -> Fs {
        self.uid = uid;
        self.gid = gid;
        self
    }

    /// Sets what resolution does with a symlink a path goes on through (default: follows
    /// it). With [`Symlinks::Refuse`] every operation that would follow one fails with
    /// ELOOP (`lstat`, `readlink`, `unlink` and `rename` of a link itself still work):
    /// for a caller that follows links itself.
    pub fn with_symlinks(mut self, symlinks: Symlinks) -> Fs {
        self.symlinks = symlinks;
        self
    }

    fn owner(&self, perm: u32) -> NewNode {
        NewNode {
            perm,
            uid: self.uid,
            gid: self.gid,
        }
    }

    /// Resolves `path`, following a final symlink if `follow`.
    pub(crate) fn resolve(&self, path: &str, follow: bool) -> Result<Resolved> {
        let bytes = path_bytes(path)?;
        self.ws
            .db()
            .read(|conn| resolve_in(conn, bytes, follow, self.symlinks))
            .map_err(|e| e.at(path))
    }

    fn existing(&self, path: &str, follow: bool) -> Result<InodeNo> {
        self.resolve(path, follow)?
            .ino
            .ok_or_else(|| kind::NotFound().at(path))
    }

    /// The parent and name for creating `path`; the entry must not exist.
    fn for_create(&self, path: &str) -> Result<(InodeNo, Vec<u8>)> {
        let resolved = self.resolve(path, false)?;
        if resolved.name.is_empty() {
            return Err(kind::Exists().at(path));
        }
        if resolved.ino.is_some() {
            return Err(kind::Exists().at(path));
        }
        Ok((resolved.parent, resolved.name))
    }

    // ------------------------------------------------------------------------ metadata

    /// Attributes, following a final symlink.
    pub fn stat(&self, path: &str) -> Result<Attr> {
        self.attr_of(path, true)
    }

    /// Attributes of the path itself, not of a symlink's target.
    pub fn lstat(&self, path: &str) -> Result<Attr> {
        self.attr_of(path, false)
    }

    /// Resolves and reads attributes in one snapshot, so a concurrent rename over the
    /// path shows the old node or the new one, never neither.
    fn attr_of(&self, path: &str, follow: bool) -> Result<Attr> {
        let bytes = path_bytes(path)?;
        let ended = self.ws.files().overlays_ended();
        let attr = self
            .ws
            .db()
            .read(|conn| {
                let resolved = resolve_in(conn, bytes, follow, self.symlinks)?;
                let ino = resolved.ino.ok_or_else(kind::NotFound)?;
                store::attr(conn, ino)
            })
            .map_err(|e| e.at(path))?;
        self.ws.overlaid(ended, attr).map_err(|e| e.at(path))
    }

    /// Whether `path` leads somewhere (following symlinks).
    pub fn exists(&self, path: &str) -> Result<bool> {
        match self.stat(path) {
            Ok(_) => Ok(true),
            Err(Error::NotFound(_)) | Err(Error::NotDir(_)) | Err(Error::Loop(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub fn chmod(&self, path: &str, mode: u32) -> Result<()> {
        let ino = self.existing(path, true)?;
        let changes = SetAttr {
            perm: Some(mode & 0o7777),
            ..Default::default()
        };
        self.ws
            .setattr(Who::Trusted, ino, &changes)
            .map(drop)
            .map_err(|e| e.at(path))
    }

    pub fn chown(&self, path: &str, uid: u32, gid: u32) -> Result<()> {
        let ino = self.existing(path, true)?;
        let changes = SetAttr {
            uid: Some(uid),
            gid: Some(gid),
            ..Default::default()
        };
        self.ws
            .setattr(Who::Trusted, ino, &changes)
            .map(drop)
            .map_err(|e| e.at(path))
    }

    /// Sets access and modification times (nanoseconds since the epoch).
    pub fn utimes(&self, path: &str, atime: TimestampNs, mtime: TimestampNs) -> Result<()> {
        let ino = self.existing(path, true)?;
        let changes = SetAttr {
            atime: Some(SetTime::At(atime)),
            mtime: Some(SetTime::At(mtime)),
            ..Default::default()
        };
        self.ws
            .setattr(Who::Trusted, ino, &changes)
            .map(drop)
            .map_err(|e| e.at(path))
    }

    // ---------------------------------------------------------------------- file data

    fn open_file(&self, path: &str, flags: OpenFlags) -> Result<FileHandle> {
        retry_raced(|| {
            let ino = self.existing(path, true)?;
            self.ws.open_file(ino, flags).map_err(|e| e.at(path))
        })
    }

    /// The whole content of a file.
    pub fn read_file(&self, path: &str) -> Result<Vec<u8>> {
        self.read_file_at_most(path, u64::MAX)
    }

    /// The whole content of a file of at most `max_bytes`; a larger one is EFBIG,
    /// read not at all.
    pub fn read_file_at_most(&self, path: &str, max_bytes: u64) -> Result<Vec<u8>> {
        if let Some(content) = self.read_quiet(path, max_bytes)? {
            return Ok(content);
        }
        let mut reader = self.open_read(path)?;
        if reader.size > max_bytes {
            return Err(kind::FileTooBig().at(path));
        }
        let mut out = Vec::with_capacity(reader.size.min(1 << 30) as usize);
        reader
            .read_to_end(&mut out)
            .map_err(|e| Error::io(path, e))?;
        Ok(out)
    }

    /// A small file nothing has open, read in one transaction: path, attributes and
    /// content from one snapshot, with no handle (agents' tools read many small files).
    /// `None` for anything else, which a handle reads.
    fn read_quiet(&self, path: &str, max_bytes: u64) -> Result<Option<Vec<u8>>> {
        let bytes = path_bytes(path)?;
        let read = self.ws.db().read(|conn| {
            let Some(ino) = resolve_in(conn, bytes, true, self.symlinks)?.ino else {
                return Ok(None);
            };
            let attr = store::attr(conn, ino)?;
            if attr.kind != FileKind::File || attr.size > READ_QUIET_BYTES_MAX {
                return Ok(None);
            }
            if attr.size > max_bytes {
                return Err(kind::FileTooBig());
            }
            self.ws.read_quiet_file(conn, ino, attr.size)
        });
        read.map_err(|e| e.at(path))
    }

    /// The whole content of a file as UTF-8.
    pub fn read_to_string(&self, path: &str) -> Result<String> {
        String::from_utf8(self.read_file(path)?)
            .map_err(|_| Error::invalid("file is not valid UTF-8").at(path))
    }

    /// Up to `len` bytes at `offset`.
    pub fn read_range(&self, path: &str, offset: u64, len: usize) -> Result<Vec<u8>> {
        let fh = self.open_file(path, OpenFlags::READ)?;
        let out = self.ws.read(fh, offset, len);
        let released = self.ws.release(fh);
        let out = out.map_err(|e| e.at(path))?;
        released.map_err(|e| e.at(path))?;
        Ok(out)
    }

    /// A stream over a file's content (bounded memory whatever its size).
    pub fn open_read(&self, path: &str) -> Result<FileReader> {
        let fh = self.open_file(path, OpenFlags::READ)?;
        let size = match self
            .ws
            .handle_inode(fh)
            .and_then(|ino| self.ws.getattr(ino))
        {
            Ok(attr) => attr.size,
            Err(err) => {
                let _ = self.ws.release(fh);
                return Err(err.at(path));
            }
        };
        Ok(FileReader {
            ws: self.ws.clone(),
            fh: Some(fh),
            pos: 0,
            size,
            path: path.to_owned(),
        })
    }

    /// Creates or replaces a file's content in one mutation. Follows a final symlink.
    pub fn write_file(&self, path: &str, data: impl AsRef<[u8]>) -> Result<()> {
        let data = data.as_ref();
        retry_raced(|| {
            let resolved = self.resolve(path, true)?;
            if resolved.name.is_empty() {
                return Err(kind::IsDir().at(path));
            }
            self.ws
                .replace_content(
                    resolved.parent,
                    &resolved.name,
                    resolved.ino,
                    data,
                    self.owner(0o644),
                )
                .map_err(|e| e.at(path))
        })
    }

    /// Writes `data` at `offset` of an existing file (`pwrite`), extending it if needed.
    pub fn write_at(&self, path: &str, offset: u64, data: impl AsRef<[u8]>) -> Result<()> {
        let fh = self.open_file(path, OpenFlags::WRITE)?;
        let result = self
            .ws
            .write(fh, offset, data.as_ref())
            .and_then(|_| self.ws.flush(fh));
        let released = self.ws.release(fh);
        result.map_err(|e| e.at(path))?;
        released.map_err(|e| e.at(path))
    }

    /// Appends to a file, creating it if missing.
    pub fn append(&self, path: &str, data: impl AsRef<[u8]>) -> Result<()> {
        let resolved = self.resolve(path, true)?;
        if resolved.ino.is_none() {
            return self.write_file(path, data);
        }
        let fh = self.open_file(
            path,
            OpenFlags {
                append: true,
                ..OpenFlags::WRITE
            },
        )?;
        let result = self
            .ws
            .write(fh, 0, data.as_ref())
            .and_then(|_| self.ws.flush(fh));
        let released = self.ws.release(fh);
        result.map_err(|e| e.at(path))?;
        released.map_err(|e| e.at(path))
    }

    /// A stream that replaces a file's content (created if missing). Content is committed
    /// in bounded pieces as it arrives and in full by [`FileWriter::finish`].
    pub fn create_write(&self, path: &str) -> Result<FileWriter> {
        let resolved = self.resolve(path, true)?;
        if resolved.name.is_empty() {
            return Err(kind::IsDir().at(path));
        }
        let fh = match resolved.ino {
            Some(ino) => self.ws.open_file(
                ino,
                OpenFlags {
                    truncate: true,
                    ..OpenFlags::WRITE
                },
            ),
            None => self
                .ws
                .create(
                    Who::Trusted,
                    resolved.parent,
                    &resolved.name,
                    self.owner(0o644),
                    OpenFlags::WRITE,
                )
                .map(|(_, fh)| fh),
        }
        .map_err(|e| e.at(path))?;
        Ok(FileWriter {
            ws: self.ws.clone(),
            fh: Some(fh),
            pos: 0,
            path: path.to_owned(),
        })
    }

    /// A stream that replaces a file whole, or not at all. The content goes to a hidden
    /// file beside the target, renamed over it by [`Replacement::commit`]; a replacement
    /// dropped before that (the writer died, the connection broke) is removed and leaves
    /// the file as it was. A final symlink is followed (its target is replaced), an
    /// existing file's permission bits are kept, and the path gets a new inode, as an
    /// editor's save gives it: other hard links keep the old content.
    pub fn create_replace(&self, path: &str) -> Result<Replacement> {
        let resolved = self.resolve(path, true)?;
        if resolved.name.is_empty() {
            return Err(kind::IsDir().at(path));
        }
        let perm = match resolved.ino {
            Some(ino) => {
                let attr = self.ws.getattr(ino).map_err(|e| e.at(path))?;
                if attr.is_dir() {
                    return Err(kind::IsDir().at(path));
                }
                attr.perm
            }
            None => 0o644,
        };
        let temp_name = replacement_name(&resolved.name);
        let (_, fh) = self
            .ws
            .create(
                Who::Trusted,
                resolved.parent,
                &temp_name,
                self.owner(perm),
                OpenFlags::WRITE,
            )
            .map_err(|e| e.at(path))?;
        Ok(Replacement {
            ws: self.ws.clone(),
            fh: Some(fh),
            parent: resolved.parent,
            name: resolved.name,
            temp_name,
            size: 0,
            path: path.to_owned(),
        })
    }

    /// Truncates or extends a file to `len` bytes.
    pub fn truncate(&self, path: &str, len: u64) -> Result<()> {
        let ino = self.existing(path, true)?;
        let changes = SetAttr {
            size: Some(len),
            ..Default::default()
        };
        self.ws
            .setattr(Who::Trusted, ino, &changes)
            .map(drop)
            .map_err(|e| e.at(path))
    }

    // -------------------------------------------------------------------- directories

    /// Creates a directory; with `recursive`, also its missing parents, in one mutation.
    pub fn mkdir(&self, path: &str, options: MkdirOptions) -> Result<()> {
        if !options.recursive {
            let (parent, name) = self.for_create(path)?;
            return self
                .ws
                .mkdir(Who::Trusted, parent, &name, self.owner(options.mode))
                .map(drop)
                .map_err(|e| e.at(path));
        }
        let bytes = path_bytes(path)?;
        self.ws
            .mkdir_all(bytes, self.owner(options.mode))
            .map_err(|e| e.at(path))
    }

    /// Every entry of a directory, in creation order.
    pub fn readdir(&self, path: &str) -> Result<Vec<DirEntry>> {
        let ino = self.existing(path, true)?;
        let mut out = Vec::new();
        let mut after = 0;
        loop {
            let page = self
                .ws
                .readdir(Who::Trusted, ino, after, 1024)
                .map_err(|e| e.at(path))?;
            let Some(last) = page.last() else { break };
            after = last.cookie;
            out.extend(page);
        }
        Ok(out)
    }

    /// Every entry of a directory with its attributes, in creation order.
    pub fn readdir_plus(&self, path: &str) -> Result<Vec<(DirEntry, Attr)>> {
        let ino = self.existing(path, true)?;
        let mut out = Vec::new();
        let mut after = 0;
        loop {
            let (_, page) = self
                .ws
                .readdir_plus(Who::Trusted, ino, after, 1024)
                .map_err(|e| e.at(path))?;
            let Some((last, _)) = page.last() else { break };
            after = last.cookie;
            out.extend(page);
        }
        Ok(out)
    }

    /// One page of a directory: up to `limit` entries after cookie `after` (0 starts), and
    /// the cookie to pass for the next page, `None` at the end.
    pub fn readdir_page(
        &self,
        path: &str,
        after: u64,
        limit: usize,
    ) -> Result<(Vec<DirEntry>, Option<u64>)> {
        let ino = self.existing(path, true)?;
        let page = self
            .ws
            .readdir(Who::Trusted, ino, after, limit.saturating_add(1))
            .map_err(|e| e.at(path))?;
        if page.len() > limit {
            let mut page = page;
            page.truncate(limit);
            let next = page.last().map(|e| e.cookie);
            Ok((page, next))
        } else {
            Ok((page, None))
        }
    }

    /// Removes a file, symlink or (with `recursive`) a directory tree, in one mutation.
    pub fn rm(&self, path: &str, options: RmOptions) -> Result<()> {
        let resolved = match self.resolve(path, false) {
            Ok(r) => r,
            Err(Error::NotFound(_)) if options.force => return Ok(()),
            Err(e) => return Err(e),
        };
        let Some(ino) = resolved.ino else {
            return if options.force {
                Ok(())
            } else {
                Err(kind::NotFound().at(path))
            };
        };
        if resolved.name.is_empty() {
            return Err(Error::invalid("cannot remove the root or a '.'/'..' path").at(path));
        }
        let attr = self.ws.getattr(ino).map_err(|e| e.at(path))?;
        let result = if attr.is_dir() {
            if !options.recursive {
                return Err(kind::IsDir().at(path));
            }
            self.ws.remove_tree(resolved.parent, &resolved.name)
        } else {
            self.ws
                .unlink(Who::Trusted, resolved.parent, &resolved.name)
        };
        match result {
            Err(Error::NotFound(_)) if options.force => Ok(()),
            other => other.map_err(|e| e.at(path)),
        }
    }

    /// Removes an empty directory.
    pub fn rmdir(&self, path: &str) -> Result<()> {
        let resolved = self.resolve(path, false)?;
        if resolved.name.is_empty() {
            return Err(Error::invalid("cannot remove the root or a '.'/'..' path").at(path));
        }
        self.ws
            .rmdir(Who::Trusted, resolved.parent, &resolved.name)
            .map_err(|e| e.at(path))
    }

    /// Removes a file or symlink.
    pub fn unlink(&self, path: &str) -> Result<()> {
        let resolved = self.resolve(path, false)?;
        if resolved.name.is_empty() {
            return Err(kind::IsDir().at(path));
        }
        self.ws
            .unlink(Who::Trusted, resolved.parent, &resolved.name)
            .map_err(|e| e.at(path))
    }

    /// Renames with rename(2) semantics: an existing target is replaced atomically.
    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        self.rename_with(from, to, RenameFlags::default())
    }

    /// Renames with `renameat2(2)` flags.
    pub fn rename_with(&self, from: &str, to: &str, flags: RenameFlags) -> Result<()> {
        let src = self.resolve(from, false)?;
        if src.ino.is_none() {
            return Err(kind::NotFound().at(from));
        }
        if src.name.is_empty() {
            return Err(Error::invalid("cannot rename the root or a '.'/'..' path").at(from));
        }
        let dst = self.resolve(to, false)?;
        if dst.name.is_empty() {
            return Err(Error::invalid("cannot rename onto the root or a '.'/'..' path").at(to));
        }
        self.ws
            .rename(
                Who::Trusted,
                src.parent,
                &src.name,
                dst.parent,
                &dst.name,
                flags,
            )
            .map_err(|e| match e {
                Error::NotFound(_) | Error::Invalid { .. } => e.at(from),
                other => other.at(to),
            })
    }

    /// Copies a file (sharing its blocks: no data is rewritten) or, with `recursive`, a
    /// directory tree, in one mutation. The target must not exist.
    pub fn copy(&self, from: &str, to: &str, recursive: bool) -> Result<()> {
        let src = self.existing(from, true)?;
        let attr = self.ws.getattr(src).map_err(|e| e.at(from))?;
        if attr.is_dir() && !recursive {
            return Err(kind::IsDir().at(from));
        }
        let (parent, name) = self.for_create(to)?;
        if attr.is_dir() && self.ws.is_ancestor_of(src, parent).map_err(|e| e.at(to))? {
            return Err(Error::invalid("cannot copy a directory into itself").at(to));
        }
        self.ws
            .copy_tree(
                src,
                parent,
                &name,
                NewNode {
                    uid: self.uid,
                    gid: self.gid,
                    perm: attr.perm,
                },
            )
            .map_err(|e| e.at(to))
    }

    /// Copies the file at `from` to `to`, made or replaced whole (readers see the old
    /// file or the copy, never a part), sharing its blocks: the copy goes under a hidden
    /// name beside `to` and is renamed over it.
    pub fn copy_replacing(&self, from: &str, to: &str) -> Result<()> {
        let (dir, name) = to.rsplit_once('/').unwrap_or(("", to));
        let hidden = replacement_name(name.as_bytes());
        let temp = join(dir, &String::from_utf8_lossy(&hidden));
        self.copy(from, &temp, false)?;
        self.rename(&temp, to).inspect_err(|_| {
            let _ = self.unlink(&temp);
        })
    }

    // ---------------------------------------------------------------- links

    /// Creates a symlink at `path` pointing to `target`.
    pub fn symlink(&self, target: &str, path: &str) -> Result<()> {
        let (parent, name) = self.for_create(path)?;
        self.ws
            .symlink(
                Who::Trusted,
                parent,
                &name,
                target.as_bytes(),
                self.owner(0o777),
            )
            .map(drop)
            .map_err(|e| e.at(path))
    }

    /// The target of a symlink.
    pub fn readlink(&self, path: &str) -> Result<String> {
        let ino = self.existing(path, false)?;
        let target = self.ws.readlink(ino).map_err(|e| e.at(path))?;
        Ok(String::from_utf8_lossy(&target).into_owned())
    }

    /// Creates a hard link `new` to the file at `existing`.
    pub fn link(&self, existing: &str, new: &str) -> Result<()> {
        let ino = self.existing(existing, false)?;
        let (parent, name) = self.for_create(new)?;
        self.ws
            .link(Who::Trusted, ino, parent, &name)
            .map(drop)
            .map_err(|e| e.at(new))
    }
}

impl Workspace {
    /// The path API over this workspace.
    pub fn fs(&self) -> Fs {
        Fs::new(self.clone())
    }
}

/// Runs a resolve-then-act operation again when the node it resolved disappeared (or
/// the name it meant to create appeared) before it acted: another thread renamed over
/// or created the path in between. A path that stays missing still fails.
fn retry_raced<T>(mut op: impl FnMut() -> Result<T>) -> Result<T> {
    const ATTEMPTS: usize = 8;
    let mut attempt = 0;
    loop {
        match op() {
            Err(Error::NotFound(_) | Error::Exists(_)) if attempt + 1 < ATTEMPTS => attempt += 1,
            other => return other,
        }
    }
}

/// A stream over a file's content; see [`Fs::open_read`].
pub struct FileReader {
    ws: Workspace,
    fh: Option<FileHandle>,
    pos: u64,
    size: u64,
    path: String,
}

impl FileReader {
    /// The file's size when it was opened.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Up to `len` bytes at `offset` (fewer only at the end), whatever the stream's
    /// position: several may be asked for at once.
    pub fn read_at(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        let fh = self.fh.ok_or_else(kind::BadHandle)?;
        let mut out = Vec::with_capacity(len.min(1 << 20));
        while out.len() < len {
            let piece = self
                .ws
                .read(fh, offset + out.len() as u64, len - out.len())
                .map_err(|e| e.at(&self.path))?;
            if piece.is_empty() {
                break;
            }
            out.extend_from_slice(&piece);
        }
        Ok(out)
    }
}

impl Read for FileReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(fh) = self.fh else { return Ok(0) };
        let want = buf.len().min(1 << 20);
        let bytes = self
            .ws
            .read(fh, self.pos, want)
            .map_err(|e| to_io(e, &self.path))?;
        buf[..bytes.len()].copy_from_slice(&bytes);
        self.pos += bytes.len() as u64;
        Ok(bytes.len())
    }
}

impl Seek for FileReader {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let pos = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
            SeekFrom::End(d) => self.size.checked_add_signed(d),
        };
        self.pos = pos.ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        Ok(self.pos)
    }
}

impl Drop for FileReader {
    fn drop(&mut self) {
        if let Some(fh) = self.fh.take() {
            let _ = self.ws.release(fh);
        }
    }
}

/// A stream that writes a file; see [`Fs::create_write`]. Call [`FileWriter::finish`] to
/// see commit errors; dropping it commits too but can only log them.
pub struct FileWriter {
    ws: Workspace,
    fh: Option<FileHandle>,
    pos: u64,
    path: String,
}

impl FileWriter {
    /// Commits everything written and closes the file.
    pub fn finish(mut self) -> Result<()> {
        let fh = self.fh.take().expect("a writer is finished once");
        let flushed = self.ws.flush(fh);
        let released = self.ws.release(fh);
        flushed.map_err(|e| e.at(&self.path))?;
        released.map_err(|e| e.at(&self.path))
    }
}

impl Write for FileWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let fh = self
            .fh
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))?;
        let n = self
            .ws
            .write(fh, self.pos, buf)
            .map_err(|e| to_io(e, &self.path))?;
        self.pos += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        let fh = self
            .fh
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))?;
        self.ws.flush(fh).map_err(|e| to_io(e, &self.path))
    }
}

impl Drop for FileWriter {
    fn drop(&mut self) {
        if let Some(fh) = self.fh.take() {
            if let Err(err) = self.ws.release(fh) {
                tracing::warn!("failed to commit {}: {err}", self.path);
            }
        }
    }
}

/// The hidden name a [`Replacement`] of `name` is written under: unique among the
/// replacements this process makes, so two at once never share one.
fn replacement_name(name: &[u8]) -> Vec<u8> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let serial = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let suffix = format!(".replace-{}-{serial}", std::process::id());
    // The suffix must fit: a name at the limit loses bytes of its own, not the suffix.
    let keep = name.len().min(store::NAME_MAX - 1 - suffix.len());
    let mut temp = Vec::with_capacity(1 + keep + suffix.len());
    temp.push(b'.');
    temp.extend_from_slice(&name[..keep]);
    temp.extend_from_slice(suffix.as_bytes());
    debug_assert!(temp.len() <= store::NAME_MAX);
    temp
}

/// A whole-file replacement in progress; see [`Fs::create_replace`]. Writes go to
/// offsets of the new content (a stream's pieces may arrive in any order).
pub struct Replacement {
    ws: Workspace,
    /// `None` once committed or abandoned.
    fh: Option<FileHandle>,
    parent: InodeNo,
    name: Vec<u8>,
    temp_name: Vec<u8>,
    /// The end of the furthest write so far.
    size: u64,
    path: String,
}

impl Replacement {
    /// Writes `data` at `offset` of the new content.
    pub fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        let fh = self.fh.ok_or_else(kind::BadHandle)?;
        let mut done = 0;
        while done < data.len() {
            let n = self
                .ws
                .write(fh, offset + done as u64, &data[done..])
                .map_err(|e| e.at(&self.path))?;
            assert!(n > 0, "a write that makes no progress would loop forever");
            done += n;
        }
        self.size = self.size.max(offset + data.len() as u64);
        Ok(())
    }

    /// Bytes of new content so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Puts the new content in place of the file, in one rename; returns its size.
    pub fn commit(mut self) -> Result<u64> {
        let fh = self.fh.take().expect("a replacement is committed once");
        let flushed = self.ws.flush(fh);
        let released = self.ws.release(fh);
        let renamed = flushed.and(released).and_then(|()| {
            self.ws.rename(
                Who::Trusted,
                self.parent,
                &self.temp_name,
                self.parent,
                &self.name,
                RenameFlags::default(),
            )
        });
        if let Err(err) = renamed {
            self.remove_temp();
            return Err(err.at(&self.path));
        }
        Ok(self.size)
    }

    fn remove_temp(&self) {
        if let Err(err) = self.ws.unlink(Who::Trusted, self.parent, &self.temp_name) {
            tracing::warn!(
                "{}: cannot remove an abandoned replacement: {err}",
                self.path
            );
        }
    }
}

impl Drop for Replacement {
    fn drop(&mut self) {
        if let Some(fh) = self.fh.take() {
            let _ = self.ws.release(fh);
            self.remove_temp();
        }
    }
}

fn to_io(err: Error, path: &str) -> io::Error {
    io::Error::other(err.at(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_refused() {
        assert!(matches!(path_bytes("a/b"), Err(Error::Invalid { .. })));
        assert!(path_bytes("/a/b").is_ok());
    }

    #[test]
    fn a_file_open_for_writing_is_read_through_its_buffer() {
        let ws = Workspace::open_in_memory(Default::default()).unwrap();
        let fs = ws.fs();
        fs.write_file("/f", b"committed").unwrap();
        assert_eq!(fs.read_file("/f").unwrap(), b"committed");
        let ino = fs.stat("/f").unwrap().ino;
        let fh = ws.open_file(ino, OpenFlags::WRITE).unwrap();
        ws.write(fh, 0, b"BUFFERED!").unwrap();
        // Not flushed: the store holds the old bytes, the handle's buffer the new.
        assert_eq!(fs.read_file("/f").unwrap(), b"BUFFERED!");
        ws.release(fh).unwrap();
        assert_eq!(fs.read_file("/f").unwrap(), b"BUFFERED!");
        assert!(matches!(fs.read_file("/"), Err(Error::IsDir(_))));
        assert!(matches!(fs.read_file("/missing"), Err(Error::NotFound(_))));
        let big = fs.read_file_at_most("/f", 3);
        assert!(matches!(big, Err(Error::FileTooBig(_))), "{big:?}");
        assert_eq!(fs.read_file_at_most("/f", 9).unwrap(), b"BUFFERED!");
    }

    #[test]
    fn a_copy_replaces_its_target_whole_and_leaves_nothing_hidden() {
        let ws = Workspace::open_in_memory(Default::default()).unwrap();
        let fs = ws.fs();
        fs.write_file("/f", b"old").unwrap();
        fs.copy_replacing("/f", "/g").unwrap();
        fs.write_file("/f", b"new").unwrap();
        fs.copy_replacing("/f", "/g").unwrap();
        assert_eq!(fs.read_file("/g").unwrap(), b"new");
        assert_eq!(fs.readdir("/").unwrap().len(), 2, "no hidden copy is left");
    }

    #[test]
    fn refusing_symlinks_fails_where_a_link_would_be_followed() {
        let ws = Workspace::open_in_memory(Default::default()).unwrap();
        let fs = ws.fs();
        fs.mkdir("/d", MkdirOptions::default()).unwrap();
        fs.write_file("/d/f", b"x").unwrap();
        fs.symlink("d", "/via").unwrap();
        fs.symlink("/d/f", "/abs").unwrap();
        assert_eq!(fs.read_file("/via/f").unwrap(), b"x");
        let refusing = fs.clone().with_symlinks(Symlinks::Refuse);
        assert!(matches!(refusing.read_file("/via/f"), Err(Error::Loop(_))));
        assert!(matches!(refusing.read_file("/abs"), Err(Error::Loop(_))));
        assert!(matches!(refusing.stat("/abs"), Err(Error::Loop(_))));
        assert!(matches!(
            refusing.write_file("/abs", b"y"),
            Err(Error::Loop(_))
        ));
        assert!(refusing.lstat("/abs").unwrap().kind == FileKind::Symlink);
        assert_eq!(refusing.readlink("/abs").unwrap(), "/d/f");
        assert_eq!(refusing.read_file("/d/f").unwrap(), b"x");
        refusing.rename("/abs", "/abs2").unwrap();
        refusing.unlink("/abs2").unwrap();
        assert_eq!(fs.read_file("/d/f").unwrap(), b"x");
    }
}
