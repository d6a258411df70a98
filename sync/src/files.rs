//! Typed file streams on a served workspace (`openRead`, `openWrite` in the schema): the
//! store's side of them, apart from the RPC glue in `rpc/server.rs`. Every call here is
//! blocking work on the store, run off the event loop; every failure is an
//! [`Error::File`] naming the path, with its errno.
//!
//! A read stream holds the file open, so it reads the content it opened even if the
//! path is replaced meanwhile. A replacing write stream writes a hidden file beside the
//! target and renames it over the target at commit ([`computer_vfs::Fs::create_replace`]):
//! readers see the old content or the new, and a stream dropped before its commit (the
//! client died, the connection broke) leaves the file as it was. An appending stream
//! writes past the end the file had when it was opened, piece by piece as they arrive.

use std::sync::Mutex;

use computer_vfs::{Cursor, FileHandle, FileReader, OpenFlags, Replacement, Revision, Workspace};

use crate::replica::AppliedObserver;
use crate::{Error, Result};

/// Entries read from the change log per page when telling what a stream changed.
const CHANGED_PATHS_PER_PAGE: usize = 4096;

/// How a server serves file streams.
#[derive(Clone, Default)]
pub struct FileStreams {
    /// Told the paths each committed stream changed (a mount tells its kernel to forget
    /// what it cached of them).
    pub changed: Option<AppliedObserver>,
}

/// A file open for reading.
pub(crate) struct ReadStream {
    reader: FileReader,
}

impl ReadStream {
    /// Opens `path`, following a final symlink; returns the stream and the file's size.
    pub(crate) fn open(ws: &Workspace, path: &str) -> Result<(ReadStream, u64)> {
        let reader = ws.fs().open_read(path).map_err(|e| Error::file(&e))?;
        let size = reader.size();
        Ok((ReadStream { reader }, size))
    }

    /// Up to `len` bytes at `offset`; fewer only at the file's end.
    pub(crate) fn read_at(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        self.reader
            .read_at(offset, len)
            .map_err(|e| Error::file(&e))
    }
}

/// A file being written.
pub(crate) struct WriteStream {
    ws: Workspace,
    path: String,
    /// The workspace's revision when the stream opened: what it changed comes after.
    before: Revision,
    changed: Option<AppliedObserver>,
    /// `None` once committed.
    target: Mutex<Option<Target>>,
}

enum Target {
    Replace(Replacement),
    Append {
        fh: FileHandle,
        /// The file's size at open: piece offsets count from here.
        base: u64,
        /// Whether anything was written (so a drop must tell the observer).
        wrote: bool,
    },
}

impl WriteStream {
    pub(crate) fn open(
        ws: &Workspace,
        path: &str,
        append: bool,
        streams: &FileStreams,
    ) -> Result<WriteStream> {
        let before = ws.revision().map_err(|e| Error::file(&e))?;
        let target = if append {
            open_append(ws, path)
        } else {
            ws.fs().create_replace(path).map(Target::Replace)
        }
        .map_err(|e| Error::file(&e))?;
        Ok(WriteStream {
            ws: ws.clone(),
            path: path.to_owned(),
            before,
            changed: streams.changed.clone(),
            target: Mutex::new(Some(target)),
        })
    }

    /// Writes `data` at `offset` of the stream.
    pub(crate) fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        let mut target = lock(&self.target);
        let written = match target.as_mut() {
            None => Err(Error::Refused(format!(
                "{}: the stream was committed already",
                self.path
            ))),
            Some(Target::Replace(replacement)) => replacement
                .write_at(offset, data)
                .map_err(|e| Error::file(&e)),
            Some(Target::Append { fh, base, wrote }) => {
                // A peer's offset: past the largest offset, refused rather than wrapped
                // onto the file's start.
                let at = base.checked_add(offset).ok_or_else(|| {
                    computer_vfs::Error::FileTooBig(computer_vfs::ErrorPath::of(&self.path))
                });
                *wrote = true;
                at.and_then(|at| write_all_at(&self.ws, *fh, at, data))
                    .map_err(|e| Error::file(&e.at(&self.path)))
            }
        };
        written
    }

    /// Puts what was written in place; returns the bytes written by the stream.
    pub(crate) fn commit(&self) -> Result<u64> {
        let target = lock(&self.target).take();
        let committed = match target {
            None => {
                return Err(Error::Refused(format!(
                    "{}: the stream was committed already",
                    self.path
                )))
            }
            Some(Target::Replace(replacement)) => replacement.commit().map(|size| (size, false)),
            Some(Target::Append { fh, base, wrote }) => {
                self.finish_append(fh, base).map(|size| (size, wrote))
            }
        };
        let (size, appended) = committed.map_err(|e| Error::file(&e))?;
        self.tell_changed(appended);
        Ok(size)
    }

    /// Closes an appending stream's file; returns the bytes it added.
    fn finish_append(&self, fh: FileHandle, base: u64) -> computer_vfs::Result<u64> {
        let flushed = self.ws.flush(fh);
        let size = self
            .ws
            .handle_inode(fh)
            .and_then(|ino| self.ws.getattr(ino))
            .map(|attr| attr.size.saturating_sub(base));
        let released = self.ws.release(fh);
        flushed
            .and(released)
            .and(size)
            .map_err(|e| e.at(&self.path))
    }

    /// Tells the observer what the stream changed: what the change log holds since it
    /// opened, and the path itself if it `appended` to it. An append to a file a mount
    /// has open for writing goes into that file's staging file and takes no revision
    /// until the file is ingested, which tells nobody: the log may hold nothing yet.
    fn tell_changed(&self, appended: bool) {
        let Some(changed) = &self.changed else {
            return;
        };
        if appended {
            changed(&[self.path.as_bytes().to_vec()]);
        }
        tell_changed(&self.ws, self.before, changed);
    }
}

impl Drop for WriteStream {
    fn drop(&mut self) {
        // A replacement drops its hidden file itself; what an appending stream wrote
        // stays, so a mount must hear of it.
        if let Some(Target::Append { fh, wrote, .. }) = lock(&self.target).take() {
            if let Err(err) = self.ws.release(fh) {
                tracing::warn!("{}: closing an abandoned append: {err}", self.path);
            }
            if wrote {
                self.tell_changed(true);
            }
        }
    }
}

/// Opens `path` (created empty if missing, a final symlink followed) to write past its
/// current end.
fn open_append(ws: &Workspace, path: &str) -> computer_vfs::Result<Target> {
    let fs = ws.fs();
    let attr = match fs.stat(path) {
        Ok(attr) => attr,
        Err(computer_vfs::Error::NotFound(_)) => {
            fs.append(path, [])?;
            fs.stat(path)?
        }
        Err(err) => return Err(err),
    };
    if attr.is_dir() {
        return Err(computer_vfs::Error::IsDir(computer_vfs::ErrorPath::of(
            path,
        )));
    }
    let fh = ws
        .open_file(attr.ino, OpenFlags::WRITE)
        .map_err(|e| e.at(path))?;
    Ok(Target::Append {
        fh,
        base: attr.size,
        wrote: false,
    })
}

fn write_all_at(
    ws: &Workspace,
    fh: FileHandle,
    offset: u64,
    data: &[u8],
) -> computer_vfs::Result<()> {
    let mut done = 0;
    while done < data.len() {
        let n = ws.write(fh, offset + done as u64, &data[done..])?;
        assert!(n > 0, "a write that makes no progress would loop forever");
        done += n;
    }
    Ok(())
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding it left the target as it was between two calls: usable.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Tells `changed` every path changed after revision `before`, a page of the change log
/// at a time.
pub fn tell_changed(ws: &Workspace, before: Revision, changed: &AppliedObserver) {
    // An empty path is the start of its revision: everything after `before`.
    let mut cursor = Cursor {
        revision: before,
        path: Vec::new(),
    };
    loop {
        let page = match ws.changes_after(&cursor, CHANGED_PATHS_PER_PAGE, u64::MAX) {
            Ok(page) => page,
            Err(err) => {
                tracing::warn!("reading what a file operation changed: {err}");
                return;
            }
        };
        let paths: Vec<Vec<u8>> = page.entries.into_iter().map(|e| e.path).collect();
        if !paths.is_empty() {
            changed(&paths);
        }
        if page.complete {
            return;
        }
        cursor = page.next;
    }
}

// ------------------------------------------------------------------ typed operations

/// Runs one typed file operation on the store (blocking work); if it may change the
/// tree (`changes`), tells the observer what it changed, failed or not (a recursive
/// remove may have removed part of a tree before it failed).
pub(crate) fn run_op<T>(
    ws: &Workspace,
    streams: &FileStreams,
    changes: bool,
    op: impl FnOnce(&computer_vfs::Fs) -> computer_vfs::Result<T>,
) -> Result<T> {
    let before = match (changes, &streams.changed) {
        (true, Some(_)) => Some(ws.revision().map_err(|e| Error::file(&e))?),
        _ => None,
    };
    let done = op(&ws.fs()).map_err(|e| Error::file(&e));
    if let (Some(before), Some(changed)) = (before, &streams.changed) {
        tell_changed(ws, before, changed);
    }
    done
}

/// A node's attributes, and its target if it is a symlink.
pub fn node_info(
    fs: &computer_vfs::Fs,
    path: &str,
    follow: bool,
) -> computer_vfs::Result<crate::NodeInfo> {
    let attr = if follow {
        fs.stat(path)
    } else {
        fs.lstat(path)
    }?;
    let target = target_of(fs.workspace(), &attr).map_err(|e| e.at(path))?;
    Ok(crate::NodeInfo { attr, target })
}

fn target_of(ws: &Workspace, attr: &computer_vfs::Attr) -> computer_vfs::Result<Option<Vec<u8>>> {
    if attr.kind != computer_vfs::FileKind::Symlink {
        return Ok(None);
    }
    ws.readlink(attr.ino).map(Some)
}

/// A page of directory `path`'s entries after position `after`, with their attributes.
/// An entry removed between the listing and its attributes is left out.
pub fn list_page(
    fs: &computer_vfs::Fs,
    path: &str,
    after: u64,
    max_entries: usize,
) -> computer_vfs::Result<crate::DirPage> {
    let (entries, next) = fs.readdir_page(path, after, max_entries)?;
    let ws = fs.workspace();
    let mut items = Vec::with_capacity(entries.len());
    for entry in entries {
        let node = ws.getattr(entry.ino).and_then(|attr| {
            let target = target_of(ws, &attr)?;
            Ok(crate::NodeInfo { attr, target })
        });
        match node {
            Ok(node) => items.push(crate::DirItem {
                name: entry.name,
                node,
            }),
            Err(computer_vfs::Error::NotFound(_)) => {}
            Err(err) => return Err(err.at(path)),
        }
    }
    Ok(crate::DirPage {
        items,
        next: next.unwrap_or(0),
        complete: next.is_none(),
    })
}

/// The matches of a grep as an answer holds them: lines longer than
/// [`crate::wire::GREP_LINE_BYTES_MAX`] cut (at a character boundary), and at most as
/// many matches and bytes as an answer carries.
pub(crate) fn grep_answer(
    mut matches: Vec<computer_vfs::GrepMatch>,
    asked: usize,
) -> crate::Bounded<computer_vfs::GrepMatch> {
    use crate::wire::{FOUND_BYTES_MAX, FOUND_ITEMS_MAX, GREP_LINE_BYTES_MAX};
    for m in &mut matches {
        if m.line.len() > GREP_LINE_BYTES_MAX {
            let mut end = GREP_LINE_BYTES_MAX;
            while !m.line.is_char_boundary(end) {
                end -= 1;
            }
            m.line.truncate(end);
        }
    }
    let max = asked.min(FOUND_ITEMS_MAX);
    let (kept, _) = crate::wire::bounded_prefix(&matches, max, FOUND_BYTES_MAX, |m| {
        m.path.len() + m.line.len()
    });
    let complete = kept.len() == matches.len();
    let kept = kept.len();
    matches.truncate(kept);
    crate::Bounded {
        items: matches,
        complete,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer's offset that would wrap past the largest file offset is refused, not
    /// written over the file's start.
    #[test]
    fn an_append_offset_past_the_largest_is_refused() {
        let ws = Workspace::open_in_memory(computer_vfs::Options::default()).unwrap();
        ws.fs().write_file("/f", b"kept").unwrap();
        let stream = WriteStream::open(&ws, "/f", true, &FileStreams::default()).unwrap();
        let wrapping = u64::MAX - 1;
        assert!(stream.write_at(wrapping, b"over").is_err());
        stream.commit().unwrap();
        assert_eq!(ws.fs().read_file("/f").unwrap(), b"kept");
    }
}
