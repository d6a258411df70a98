//! Copying trees between the host filesystem and a workspace (`import`, `export`).
//!
//! Files are streamed (bounded memory), modes and modification times are kept, symlinks
//! are copied as symlinks, and hard links stay hard links. Each file is its own mutation.
//! Workspace paths are UTF-8: an import finds a name that is not before it writes
//! anything, and fails, or with [`ImportOptions::skip_bad_names`] leaves it out and
//! lists it. A new tree is built under a hidden name beside its destination
//! ([`partial_name`]) and renamed into place when whole, so an import that fails or is
//! killed leaves nothing at the destination (the next import of it removes what a
//! killed one left); an import into a directory that exists merges into it in place.
//! A progress callback sees totals counted up front, so callers can draw a bar.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use crate::error::{Error, Result};
use crate::fs::{join, Fs, MkdirOptions, RmOptions};
use crate::types::{FileKind, InodeNo};

const COPY_BUFFER: usize = 1 << 20;

/// Where a transfer stands.
#[derive(Clone, Debug, Default)]
pub struct Progress {
    pub files_done: u64,
    pub files_total: u64,
    pub bytes_done: u64,
    pub bytes_total: u64,
}

/// What a transfer did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub files: u64,
    pub directories: u64,
    pub symlinks: u64,
    pub hard_links: u64,
    pub bytes: u64,
    /// Special files (fifos, sockets, devices) that were not copied.
    pub skipped: u64,
    /// Host paths left out because a name (or a symlink's target) on the way is not
    /// UTF-8, which workspace paths must be ([`ImportOptions::skip_bad_names`]).
    pub bad_names: Vec<PathBuf>,
}

/// How to import.
#[derive(Clone, Copy, Debug, Default)]
pub struct ImportOptions {
    /// Leave out (and list in [`Summary::bad_names`]) what has a name that is not UTF-8,
    /// and import the rest. Without it such a name fails the import before anything is
    /// written.
    pub skip_bad_names: bool,
}

/// The reason of the error an import without `skip_bad_names` fails with when the tree
/// holds a name that is not UTF-8 (its path names the first one).
pub const BAD_NAME: &str = "a name in the tree is not UTF-8, so nothing was imported";

fn host_err(path: &Path, err: std::io::Error) -> Error {
    Error::io(path.display().to_string(), err)
}

/// What a look over the host tree finds before anything is written.
struct HostTotals {
    files: u64,
    bytes: u64,
    /// The first host path whose name, or whose symlink's target, is not UTF-8.
    first_bad_name: Option<PathBuf>,
}

/// Counts files and bytes below `dir` on the host, for progress totals, and finds the
/// first name the workspace cannot take.
fn host_totals(dir: &Path) -> Result<HostTotals> {
    let mut totals = HostTotals {
        files: 0,
        bytes: 0,
        first_bad_name: None,
    };
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        for entry in fs::read_dir(&path).map_err(|e| host_err(&path, e))? {
            let entry = entry.map_err(|e| host_err(&path, e))?;
            let meta = entry.metadata().map_err(|e| host_err(&entry.path(), e))?;
            let bad = entry.file_name().to_str().is_none()
                || (meta.is_symlink()
                    && fs::read_link(entry.path()).is_ok_and(|t| t.to_str().is_none()));
            if bad && totals.first_bad_name.is_none() {
                totals.first_bad_name = Some(entry.path());
            }
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.is_file() {
                totals.files += 1;
                totals.bytes += meta.len();
            }
        }
    }
    Ok(totals)
}

fn nanos(meta: &fs::Metadata) -> i64 {
    meta.mtime()
        .saturating_mul(1_000_000_000)
        .saturating_add(meta.mtime_nsec())
}

/// Copies the host directory `source` to `dest` in the workspace (created if missing).
pub fn import(
    fs: &Fs,
    source: &Path,
    dest: &str,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Summary> {
    import_with(fs, source, dest, ImportOptions::default(), progress)
}

/// [`import`] as `options` say.
pub fn import_with(
    fs: &Fs,
    source: &Path,
    dest: &str,
    options: ImportOptions,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Summary> {
    let meta = fs::metadata(source).map_err(|e| host_err(source, e))?;
    if !meta.is_dir() {
        return Err(Error::NotDir(Default::default()).at(&source.display().to_string()));
    }
    let totals = host_totals(source)?;
    if let (Some(bad), false) = (&totals.first_bad_name, options.skip_bad_names) {
        return Err(Error::invalid(BAD_NAME).at(&bad.display().to_string()));
    }
    let state = Progress {
        files_total: totals.files,
        bytes_total: totals.bytes,
        ..Default::default()
    };
    if fs.exists(dest)? {
        // Into a directory that is there: merged in place (running it again after a
        // failure copies everything again over what got there).
        return copy_tree(fs, source, &meta, dest, state, progress);
    }
    // A new tree is built under a hidden name beside it and renamed into place at the
    // end: an import that fails or is killed leaves no partial tree at `dest`.
    let building = partial_name(dest);
    let mode = meta.permissions().mode() & 0o7777;
    fs.mkdir(
        parent_of(dest),
        MkdirOptions {
            recursive: true,
            mode: 0o755,
        },
    )?;
    if fs.exists(&building)? {
        // What a killed import left (one import at a time: the caller holds the database).
        fs.rm(
            &building,
            RmOptions {
                recursive: true,
                force: true,
            },
        )?;
    }
    fs.mkdir(
        &building,
        MkdirOptions {
            recursive: false,
            mode,
        },
    )?;
    let copied = copy_tree(fs, source, &meta, &building, state, progress)
        .and_then(|summary| fs.rename(&building, dest).map(|()| summary));
    if copied.is_err() {
        let _ = fs.rm(
            &building,
            RmOptions {
                recursive: true,
                force: true,
            },
        );
    }
    copied
}

/// Where an import builds a new tree for `dest` before renaming it into place.
pub fn partial_name(dest: &str) -> String {
    let name = dest.rsplit('/').next().unwrap_or("");
    join(parent_of(dest), &format!(".{name}.partial-import"))
}

/// The directory holding `path` (`/` for `/a`).
fn parent_of(path: &str) -> &str {
    match path.trim_end_matches('/').rfind('/') {
        Some(0) | None => "/",
        Some(at) => &path[..at],
    }
}

/// Copies the host directory `source` (whose metadata is `meta`) into the workspace
/// directory `dest`, made if missing.
fn copy_tree(
    fs: &Fs,
    source: &Path,
    meta: &fs::Metadata,
    dest: &str,
    mut state: Progress,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Summary> {
    let mut summary = Summary::default();
    fs.mkdir(
        dest,
        MkdirOptions {
            recursive: true,
            mode: meta.permissions().mode() & 0o7777,
        },
    )?;
    // (host device, host inode) -> workspace path, to keep hard links.
    let mut seen: HashMap<(u64, u64), String> = HashMap::new();
    let mut dirs: Vec<(String, i64)> = vec![(dest.to_owned(), nanos(meta))];
    let mut stack: Vec<(PathBuf, String)> = vec![(source.to_path_buf(), dest.to_owned())];
    progress(&state);
    while let Some((host_dir, ws_dir)) = stack.pop() {
        let mut entries: Vec<_> = fs::read_dir(&host_dir)
            .map_err(|e| host_err(&host_dir, e))?
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| host_err(&host_dir, e))?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let host_path = entry.path();
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                // Left out with whatever is below it (checked up front: only when asked).
                summary.bad_names.push(host_path);
                continue;
            };
            let ws_path = join(&ws_dir, name);
            let meta = fs::symlink_metadata(&host_path).map_err(|e| host_err(&host_path, e))?;
            let file_type = meta.file_type();
            if file_type.is_dir() {
                fs.mkdir(
                    &ws_path,
                    MkdirOptions {
                        recursive: false,
                        mode: meta.permissions().mode() & 0o7777,
                    },
                )?;
                dirs.push((ws_path.clone(), nanos(&meta)));
                stack.push((host_path, ws_path));
                summary.directories += 1;
            } else if file_type.is_symlink() {
                let target = fs::read_link(&host_path).map_err(|e| host_err(&host_path, e))?;
                let Some(target) = target.to_str() else {
                    summary.bad_names.push(host_path);
                    continue;
                };
                fs.symlink(target, &ws_path)?;
                summary.symlinks += 1;
            } else if file_type.is_file() {
                let key = (meta.dev(), meta.ino());
                if meta.nlink() > 1 {
                    if let Some(first) = seen.get(&key) {
                        fs.link(first, &ws_path)?;
                        summary.hard_links += 1;
                        state.files_done += 1;
                        state.bytes_done += meta.len();
                        progress(&state);
                        continue;
                    }
                    seen.insert(key, ws_path.clone());
                }
                let copied = import_file(fs, &host_path, &ws_path, &mut state, progress)?;
                fs.chmod(&ws_path, meta.permissions().mode() & 0o7777)?;
                fs.utimes(
                    &ws_path,
                    meta.atime() * 1_000_000_000 + meta.atime_nsec(),
                    nanos(&meta),
                )?;
                summary.files += 1;
                summary.bytes += copied;
                state.files_done += 1;
                progress(&state);
            } else {
                summary.skipped += 1;
            }
        }
    }
    // Directory times last: adding entries changed them.
    for (path, mtime) in dirs.iter().rev() {
        fs.utimes(path, *mtime, *mtime)?;
    }
    Ok(summary)
}

fn import_file(
    fs: &Fs,
    host_path: &Path,
    ws_path: &str,
    state: &mut Progress,
    progress: &mut dyn FnMut(&Progress),
) -> Result<u64> {
    let mut file = File::open(host_path).map_err(|e| host_err(host_path, e))?;
    let mut writer = fs.create_write(ws_path)?;
    let mut buf = vec![0u8; COPY_BUFFER];
    let mut copied = 0u64;
    loop {
        let n = file.read(&mut buf).map_err(|e| host_err(host_path, e))?;
        if n == 0 {
            break;
        }
        writer
            .write_all(&buf[..n])
            .map_err(|e| Error::io(ws_path, e))?;
        copied += n as u64;
        state.bytes_done += n as u64;
        if copied % (16 << 20) < n as u64 {
            progress(state);
        }
    }
    writer.finish()?;
    Ok(copied)
}

/// Copies the workspace directory `source` into the host directory `dest` (created if
/// missing; existing files there are overwritten).
pub fn export(
    fs: &Fs,
    source: &str,
    dest: &Path,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Summary> {
    let top = fs.stat(source)?;
    if !top.is_dir() {
        return Err(Error::NotDir(Default::default()).at(source));
    }
    let mut state = Progress::default();
    fs.walk(source, usize::MAX, &mut |path, kind| {
        if kind == FileKind::File {
            state.files_total += 1;
            state.bytes_total += fs.lstat(path)?.size;
        }
        Ok(())
    })?;
    fs::create_dir_all(dest).map_err(|e| host_err(dest, e))?;
    let mut summary = Summary::default();
    let mut seen: HashMap<InodeNo, PathBuf> = HashMap::new();
    let mut dirs: Vec<(PathBuf, i64, u32)> = vec![(dest.to_path_buf(), top.mtime, top.perm)];
    let mut entries: Vec<(String, FileKind)> = Vec::new();
    fs.walk(source, usize::MAX, &mut |path, kind| {
        entries.push((path.to_owned(), kind));
        Ok(())
    })?;
    progress(&state);
    for (path, kind) in entries {
        let relative = path[source.len()..].trim_start_matches('/');
        let host_path = dest.join(relative);
        let attr = fs.lstat(&path)?;
        match kind {
            FileKind::Directory => {
                match fs::create_dir(&host_path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(host_err(&host_path, e)),
                }
                dirs.push((host_path, attr.mtime, attr.perm));
                summary.directories += 1;
            }
            FileKind::Symlink => {
                let target = fs.readlink(&path)?;
                let _ = fs::remove_file(&host_path);
                std::os::unix::fs::symlink(&target, &host_path)
                    .map_err(|e| host_err(&host_path, e))?;
                summary.symlinks += 1;
            }
            FileKind::File => {
                if attr.nlink > 1 {
                    if let Some(first) = seen.get(&attr.ino) {
                        let _ = fs::remove_file(&host_path);
                        fs::hard_link(first, &host_path).map_err(|e| host_err(&host_path, e))?;
                        summary.hard_links += 1;
                        state.files_done += 1;
                        state.bytes_done += attr.size;
                        progress(&state);
                        continue;
                    }
                    seen.insert(attr.ino, host_path.clone());
                }
                let mut reader = fs.open_read(&path)?;
                let mut file = File::create(&host_path).map_err(|e| host_err(&host_path, e))?;
                let mut buf = vec![0u8; COPY_BUFFER];
                loop {
                    let n = reader
                        .read(&mut buf)
                        .map_err(|e| Error::io(path.clone(), e))?;
                    if n == 0 {
                        break;
                    }
                    file.write_all(&buf[..n])
                        .map_err(|e| host_err(&host_path, e))?;
                    state.bytes_done += n as u64;
                }
                file.set_permissions(fs::Permissions::from_mode(attr.perm))
                    .map_err(|e| host_err(&host_path, e))?;
                file.set_modified(to_system_time(attr.mtime))
                    .map_err(|e| host_err(&host_path, e))?;
                summary.files += 1;
                summary.bytes += attr.size;
                state.files_done += 1;
                progress(&state);
            }
            _ => summary.skipped += 1,
        }
    }
    for (path, mtime, perm) in dirs.iter().rev() {
        fs::set_permissions(path, fs::Permissions::from_mode(*perm))
            .map_err(|e| host_err(path, e))?;
        let dir = File::open(path).map_err(|e| host_err(path, e))?;
        dir.set_modified(to_system_time(*mtime))
            .map_err(|e| host_err(path, e))?;
    }
    Ok(summary)
}

fn to_system_time(ns: i64) -> std::time::SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Quota;
    use crate::workspace::{Options, Workspace};

    /// A host tree of `files` small files in one directory.
    fn host_tree(files: usize) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("sub")).unwrap();
        for i in 0..files {
            fs::write(dir.path().join(format!("sub/{i}")), format!("{i}\n")).unwrap();
        }
        dir
    }

    #[test]
    fn a_failed_import_of_a_new_tree_leaves_nothing() {
        let host = host_tree(20);
        let ws = Workspace::open_in_memory(Options::default()).unwrap();
        let fs = ws.fs();
        // Room for a few nodes only: the import fails part of the way.
        ws.set_quota(Quota {
            bytes_max: None,
            inodes_max: Some(8),
        })
        .unwrap();
        let err = import(&fs, host.path(), "/a/in", &mut |_| {}).unwrap_err();
        assert_eq!(err.errno(), libc::ENOSPC, "{err}");
        assert!(!fs.exists("/a/in").unwrap());
        assert!(!fs.exists(&partial_name("/a/in")).unwrap());
        ws.set_quota(Quota {
            bytes_max: None,
            inodes_max: None,
        })
        .unwrap();
        let summary = import(&fs, host.path(), "/a/in", &mut |_| {}).unwrap();
        assert_eq!(summary.files, 20);
        assert_eq!(fs.read_file("/a/in/sub/7").unwrap(), b"7\n");
        assert_eq!(fs.readdir("/a").unwrap().len(), 1, "only /a/in is left");
    }

    #[test]
    fn a_leftover_of_a_killed_import_is_replaced() {
        let host = host_tree(3);
        let ws = Workspace::open_in_memory(Options::default()).unwrap();
        let fs = ws.fs();
        let partial = partial_name("/in");
        assert_eq!(partial, "/.in.partial-import");
        fs.mkdir(&partial, MkdirOptions::default()).unwrap();
        fs.write_file(&format!("{partial}/stale"), "old").unwrap();
        import(&fs, host.path(), "/in", &mut |_| {}).unwrap();
        assert!(!fs.exists(&partial).unwrap());
        assert!(!fs.exists("/in/stale").unwrap());
        assert_eq!(fs.readdir("/in/sub").unwrap().len(), 3);
    }

    #[test]
    fn an_import_into_a_directory_that_is_there_merges() {
        let host = host_tree(2);
        let ws = Workspace::open_in_memory(Options::default()).unwrap();
        let fs = ws.fs();
        fs.mkdir("/in", MkdirOptions::default()).unwrap();
        fs.write_file("/in/mine", "mine").unwrap();
        import(&fs, host.path(), "/in", &mut |_| {}).unwrap();
        assert_eq!(fs.read_file("/in/mine").unwrap(), b"mine");
        assert_eq!(fs.readdir("/in/sub").unwrap().len(), 2);
    }
}
