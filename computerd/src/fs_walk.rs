//! `tree` and `du`: walks of a workspace subtree through the inode API.
//!
//! The path API's own walk is private to the store, and names need not be UTF-8, so the
//! walks here go by inode number: list a directory in pages, sort it by name, descend.
//! Symlinks are shown, never followed. Memory is one directory listing per level.

use std::collections::HashSet;
use std::io::Write;

use computer_vfs::{join, DirEntry, Error, FileKind, Fs, InodeNo, Workspace};

use crate::fs_error::{out_err, vfs_err};
use crate::fs_format::human_bytes;

const PAGE: usize = 1024;

/// Every entry of directory `dir`, sorted by name. A directory removed meanwhile is empty.
fn list_dir(ws: &Workspace, dir: InodeNo, path: &str) -> Result<Vec<DirEntry>, Error> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let page = match ws.readdir(dir, after, PAGE) {
            Ok(page) => page,
            Err(Error::NotFound(_)) => break,
            Err(e) => return Err(e.at(path)),
        };
        let Some(last) = page.last() else { break };
        after = last.cookie;
        out.extend(page);
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

struct TreeFrame {
    entries: Vec<DirEntry>,
    next: usize,
    prefix: String,
}

/// Prints the tree below `path` with box-drawing branches, then a count line.
pub fn tree(fs: &Fs, path: &str, out: &mut dyn Write) -> anyhow::Result<()> {
    let ws = fs.workspace();
    let attr = fs.stat(path).map_err(vfs_err)?;
    writeln!(out, "{path}").map_err(out_err)?;
    let (mut dirs, mut files) = (0u64, 0u64);
    let mut stack = Vec::new();
    if !attr.is_dir() {
        files = 1;
    } else {
        stack.push(TreeFrame {
            entries: list_dir(ws, attr.ino, path).map_err(vfs_err)?,
            next: 0,
            prefix: String::new(),
        });
    }
    while let Some(top) = stack.last_mut() {
        let Some(entry) = top.entries.get(top.next).cloned() else {
            stack.pop();
            continue;
        };
        top.next += 1;
        let last = top.next == top.entries.len();
        let prefix = top.prefix.clone();
        let branch = if last { "└── " } else { "├── " };
        write!(out, "{prefix}{branch}").map_err(out_err)?;
        out.write_all(&entry.name).map_err(out_err)?;
        match entry.kind {
            FileKind::Symlink => {
                files += 1;
                if let Ok(target) = ws.readlink(entry.ino) {
                    out.write_all(b" -> ").map_err(out_err)?;
                    out.write_all(&target).map_err(out_err)?;
                }
                writeln!(out).map_err(out_err)?;
            }
            FileKind::Directory => {
                dirs += 1;
                writeln!(out).map_err(out_err)?;
                let child_path = join(path, &entry.name_lossy());
                let entries = list_dir(ws, entry.ino, &child_path).map_err(vfs_err)?;
                let indent = if last { "    " } else { "│   " };
                stack.push(TreeFrame {
                    entries,
                    next: 0,
                    prefix: format!("{prefix}{indent}"),
                });
            }
            _ => {
                files += 1;
                writeln!(out).map_err(out_err)?;
            }
        }
    }
    let plural = |n: u64, one: &str, many: &str| {
        if n == 1 {
            format!("{n} {one}")
        } else {
            format!("{n} {many}")
        }
    };
    writeln!(
        out,
        "\n{}, {}",
        plural(dirs, "directory", "directories"),
        plural(files, "file", "files")
    )
    .map_err(out_err)?;
    Ok(())
}

struct DuFrame {
    path: String,
    entries: Vec<DirEntry>,
    next: usize,
    total: u64,
}

/// Prints the logical bytes (sum of file sizes) of every directory below `path`, deepest
/// first, like `du --apparent-size`; with `summarize`, only the total. Hard links count
/// once.
pub fn du(
    fs: &Fs,
    path: &str,
    summarize: bool,
    human: bool,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let ws = fs.workspace();
    let attr = fs.stat(path).map_err(vfs_err)?;
    let show = |out: &mut dyn Write, bytes: u64, p: &str| -> anyhow::Result<()> {
        let size = if human {
            human_bytes(bytes)
        } else {
            bytes.to_string()
        };
        writeln!(out, "{size}\t{p}").map_err(out_err)
    };
    if !attr.is_dir() {
        let size = if attr.kind == FileKind::File {
            attr.size
        } else {
            0
        };
        return show(out, size, path);
    }
    let mut seen: HashSet<InodeNo> = HashSet::new();
    let mut stack = vec![DuFrame {
        path: path.to_owned(),
        entries: list_dir(ws, attr.ino, path).map_err(vfs_err)?,
        next: 0,
        total: 0,
    }];
    while let Some(top) = stack.last_mut() {
        let Some(entry) = top.entries.get(top.next).cloned() else {
            let Some(done) = stack.pop() else { break };
            if !summarize || stack.is_empty() {
                show(out, done.total, &done.path)?;
            }
            if let Some(parent) = stack.last_mut() {
                parent.total += done.total;
            }
            continue;
        };
        top.next += 1;
        match entry.kind {
            FileKind::Directory => {
                let child_path = join(&top.path, &entry.name_lossy());
                let entries = list_dir(ws, entry.ino, &child_path).map_err(vfs_err)?;
                stack.push(DuFrame {
                    path: child_path,
                    entries,
                    next: 0,
                    total: 0,
                });
            }
            FileKind::File => {
                let attr = match ws.getattr(entry.ino) {
                    Ok(attr) => attr,
                    // Removed while we walked.
                    Err(Error::NotFound(_)) => continue,
                    Err(e) => {
                        let child_path = join(&top.path, &entry.name_lossy());
                        return Err(vfs_err(e.at(&child_path)));
                    }
                };
                if attr.nlink > 1 && !seen.insert(entry.ino) {
                    continue;
                }
                top.total += attr.size;
            }
            _ => {}
        }
    }
    Ok(())
}
