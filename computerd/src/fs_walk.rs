//! `tree` and `du`: walks of a workspace subtree, written against [`Files`] so they run
//! the same on a database here and through a server or an owner.
//!
//! A directory is listed whole (in pages, by `Files::list`), sorted by name, then
//! descended: memory is one listing per level. Symlinks are shown, never followed. A
//! directory that cannot be listed (removed meanwhile, or a name the path API cannot
//! spell) is reported on stderr and the walk goes on; the command then exits 1.

use std::collections::HashSet;
use std::io::Write;
use std::process::ExitCode;

use computer_sync::DirItem;
use computer_vfs::{join, FileKind, InodeNo};

use crate::fs_error::{out_err, report};
use crate::fs_files::Files;
use crate::fs_format::human_bytes;

/// Every entry of directory `path`, sorted by name; `None` (reported) if it cannot be
/// listed.
fn list_sorted(
    files: &dyn Files,
    path: &str,
    stderr: &mut dyn Write,
    failed: &mut bool,
) -> Option<Vec<DirItem>> {
    match files.list(path) {
        Ok(mut items) => {
            items.sort_by(|a, b| a.name.cmp(&b.name));
            Some(items)
        }
        Err(err) => {
            report(stderr, &anyhow::Error::new(err));
            *failed = true;
            None
        }
    }
}

/// `1 file`, `2 files`.
fn plural(n: u64, one: &str, many: &str) -> String {
    if n == 1 {
        format!("{n} {one}")
    } else {
        format!("{n} {many}")
    }
}

fn status(failed: bool) -> ExitCode {
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

struct TreeFrame {
    entries: Vec<DirItem>,
    next: usize,
    path: String,
    prefix: String,
}

/// Prints the tree below `path` with box-drawing branches, then a count line.
pub fn tree(
    files: &dyn Files,
    path: &str,
    out: &mut dyn Write,
    stderr: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    let root = files.node(path, true)?;
    writeln!(out, "{path}").map_err(out_err)?;
    let (mut dirs, mut file_count) = (0u64, 0u64);
    let mut failed = false;
    let mut stack = Vec::new();
    if !root.attr.is_dir() {
        file_count = 1;
    } else if let Some(entries) = list_sorted(files, path, stderr, &mut failed) {
        stack.push(TreeFrame {
            entries,
            next: 0,
            path: path.to_owned(),
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
        match (entry.node.attr.kind, &entry.node.target) {
            (FileKind::Symlink, Some(target)) => {
                file_count += 1;
                out.write_all(b" -> ").map_err(out_err)?;
                out.write_all(target).map_err(out_err)?;
                writeln!(out).map_err(out_err)?;
            }
            (FileKind::Directory, _) => {
                dirs += 1;
                writeln!(out).map_err(out_err)?;
                let child = join(&top.path, &String::from_utf8_lossy(&entry.name));
                if let Some(entries) = list_sorted(files, &child, stderr, &mut failed) {
                    let indent = if last { "    " } else { "│   " };
                    stack.push(TreeFrame {
                        entries,
                        next: 0,
                        path: child,
                        prefix: format!("{prefix}{indent}"),
                    });
                }
            }
            _ => {
                file_count += 1;
                writeln!(out).map_err(out_err)?;
            }
        }
    }
    writeln!(
        out,
        "\n{}, {}",
        plural(dirs, "directory", "directories"),
        plural(file_count, "file", "files")
    )
    .map_err(out_err)?;
    Ok(status(failed))
}

struct DuFrame {
    path: String,
    entries: Vec<DirItem>,
    next: usize,
    total: u64,
}

/// How `du` prints.
pub struct DuOptions {
    /// Only the total.
    pub summarize: bool,
    /// Sizes as `1.5M`.
    pub human: bool,
}

/// Prints the logical bytes (sum of file sizes) of every directory below `path`, deepest
/// first, like `du --apparent-size`; with `summarize`, only the total. Hard links count
/// once.
pub fn du(
    files: &dyn Files,
    path: &str,
    options: &DuOptions,
    out: &mut dyn Write,
    stderr: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    let show = |out: &mut dyn Write, bytes: u64, p: &str| -> anyhow::Result<()> {
        let size = if options.human {
            human_bytes(bytes)
        } else {
            bytes.to_string()
        };
        writeln!(out, "{size}\t{p}").map_err(out_err)
    };
    let root = files.node(path, true)?;
    if !root.attr.is_dir() {
        let size = if root.attr.kind == FileKind::File {
            root.attr.size
        } else {
            0
        };
        show(out, size, path)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut failed = false;
    let mut seen: HashSet<InodeNo> = HashSet::new();
    let mut stack = vec![DuFrame {
        path: path.to_owned(),
        entries: list_sorted(files, path, stderr, &mut failed).unwrap_or_default(),
        next: 0,
        total: 0,
    }];
    while let Some(top) = stack.last_mut() {
        let Some(entry) = top.entries.get(top.next).cloned() else {
            let Some(done) = stack.pop() else { break };
            if !options.summarize || stack.is_empty() {
                show(out, done.total, &done.path)?;
            }
            if let Some(parent) = stack.last_mut() {
                parent.total += done.total;
            }
            continue;
        };
        top.next += 1;
        let attr = &entry.node.attr;
        match attr.kind {
            FileKind::Directory => {
                let child = join(&top.path, &String::from_utf8_lossy(&entry.name));
                let entries = list_sorted(files, &child, stderr, &mut failed);
                stack.push(DuFrame {
                    path: child,
                    entries: entries.unwrap_or_default(),
                    next: 0,
                    total: 0,
                });
            }
            FileKind::File => {
                if attr.nlink > 1 && !seen.insert(attr.ino) {
                    continue;
                }
                top.total += attr.size;
            }
            _ => {}
        }
    }
    Ok(status(failed))
}
