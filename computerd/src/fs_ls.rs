//! `computerd fs DB ls`: listings as ls(1) prints them. Names sorted bytewise; names
//! starting with `.` hidden unless `-a` (with `.` and `..`) or `-A`; `-l` long rows
//! with a `total` of 1 KiB blocks first, `-h` human sizes, `-R` subdirectories under
//! `path:` headings. Several paths: files first, then each directory under a heading.

use std::io::{BufWriter, Write};
use std::process::ExitCode;

use computer_vfs::{join, Attr, FileKind};

use crate::fs_error::out_err;
use crate::fs_files::Files;
use crate::fs_format::{mode_string, parent_dir, short_time};

/// Which entries starting with `.` a listing shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hidden {
    None,
    /// All of them but `.` and `..` (`-A`).
    AlmostAll,
    /// All of them, and `.` and `..` (`-a`).
    All,
}

#[derive(Clone, Copy, Debug)]
pub struct LsOptions {
    pub long: bool,
    pub hidden: Hidden,
    pub human: bool,
    pub recursive: bool,
}

/// One row: the name as shown, the attributes of what it names, and a symlink's target.
type Row = (Vec<u8>, Attr, Option<Vec<u8>>);

pub fn ls(
    files: &dyn Files,
    paths: &[String],
    options: &LsOptions,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    let mut failed = false;
    let mut file_rows: Vec<Row> = Vec::new();
    let mut dirs: Vec<String> = Vec::new();
    for path in paths {
        match shown_node(files, path, options.long) {
            Ok((attr, _)) if attr.is_dir() => dirs.push(path.clone()),
            Ok((attr, target)) => file_rows.push((path.as_bytes().to_vec(), attr, target)),
            Err(err) => {
                let _ = writeln!(stderr, "computerd: {err}");
                failed = true;
            }
        }
    }
    let mut out = BufWriter::new(stdout);
    let headings = options.recursive || file_rows.len() + dirs.len() > 1;
    write_rows(&mut out, &file_rows, options)?;
    let mut first = file_rows.is_empty();
    // Depth first, in name order, as ls -R goes.
    let mut pending: Vec<String> = dirs.into_iter().rev().collect();
    while let Some(dir) = pending.pop() {
        if !first {
            out.write_all(b"\n").map_err(out_err)?;
        }
        first = false;
        if headings {
            writeln!(out, "{dir}:").map_err(out_err)?;
        }
        match listing(files, &dir, options) {
            Ok(rows) => {
                if options.long {
                    let blocks: u64 = rows.iter().map(|(_, a, _)| a.blocks_512()).sum();
                    writeln!(out, "total {}", blocks.div_ceil(2)).map_err(out_err)?;
                }
                write_rows(&mut out, &rows, options)?;
                if options.recursive {
                    let below = rows
                        .iter()
                        .filter(|(name, attr, _)| attr.is_dir() && name != b"." && name != b"..")
                        .map(|(name, _, _)| join(&dir, &String::from_utf8_lossy(name)));
                    pending.extend(below.collect::<Vec<_>>().into_iter().rev());
                }
            }
            Err(err) => {
                out.flush().map_err(out_err)?;
                let _ = writeln!(stderr, "computerd: {err}");
                failed = true;
            }
        }
    }
    out.flush().map_err(out_err)?;
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// The attributes `ls` shows for `path`, and its target if that is a symlink: like
/// ls(1), `ls -l link` shows the link itself and `ls link` (or `link/`) what it points to.
fn shown_node(
    files: &dyn Files,
    path: &str,
    long: bool,
) -> anyhow::Result<(Attr, Option<Vec<u8>>)> {
    let node = files.node(path, false)?;
    let follow = !long || path.ends_with('/');
    if node.attr.kind == FileKind::Symlink && follow {
        let followed = files.node(path, true)?;
        return Ok((followed.attr, followed.target));
    }
    Ok((node.attr, node.target))
}

/// The entries of directory `dir` that `options` show, sorted by name.
fn listing(files: &dyn Files, dir: &str, options: &LsOptions) -> anyhow::Result<Vec<Row>> {
    let mut items = files.list(dir)?;
    items.retain(|e| options.hidden != Hidden::None || !e.name.starts_with(b"."));
    items.sort_by(|a, b| a.name.cmp(&b.name));
    let mut rows = Vec::with_capacity(items.len() + 2);
    if options.hidden == Hidden::All {
        rows.push((b".".to_vec(), files.node(dir, true)?.attr, None));
        rows.push((
            b"..".to_vec(),
            files.node(parent_dir(dir), true)?.attr,
            None,
        ));
    }
    rows.extend(
        items
            .into_iter()
            .map(|item| (item.name, item.node.attr, item.node.target)),
    );
    Ok(rows)
}

fn write_rows(out: &mut dyn Write, rows: &[Row], options: &LsOptions) -> anyhow::Result<()> {
    let size = |a: &Attr| {
        if options.human {
            human_size(a.size)
        } else {
            a.size.to_string()
        }
    };
    let width = |f: &dyn Fn(&Attr) -> String| rows.iter().map(|(_, a, _)| f(a).len()).max();
    let nlink_w = width(&|a| a.nlink.to_string()).unwrap_or(1);
    let uid_w = width(&|a| a.uid.to_string()).unwrap_or(1);
    let gid_w = width(&|a| a.gid.to_string()).unwrap_or(1);
    let size_w = width(&size).unwrap_or(1);
    for (name, attr, target) in rows {
        if options.long {
            write!(
                out,
                "{} {:>nlink_w$} {:>uid_w$} {:>gid_w$} {:>size_w$} {} ",
                mode_string(attr.kind, attr.perm),
                attr.nlink,
                attr.uid,
                attr.gid,
                size(attr),
                short_time(attr.mtime),
            )
            .map_err(out_err)?;
        }
        out.write_all(name).map_err(out_err)?;
        if let (true, Some(target)) = (options.long && attr.kind == FileKind::Symlink, target) {
            out.write_all(b" -> ").map_err(out_err)?;
            out.write_all(target).map_err(out_err)?;
        }
        out.write_all(b"\n").map_err(out_err)?;
    }
    Ok(())
}

/// A size as `ls -h` prints it: bytes below 1 KiB, else the unit that keeps it under
/// 1024, rounded up, with one decimal below 10 (`1.5K`, `12K`, `3.0G`).
fn human_size(bytes: u64) -> String {
    const UNITS: [char; 6] = ['K', 'M', 'G', 'T', 'P', 'E'];
    if bytes < 1024 {
        return bytes.to_string();
    }
    let mut unit = 0;
    let mut scale = 1024u128;
    while u128::from(bytes) > scale * 1024 - 1 && unit + 1 < UNITS.len() {
        scale *= 1024;
        unit += 1;
    }
    let bytes = u128::from(bytes);
    // Tenths, rounded up as ls does.
    let tenths = (bytes * 10).div_ceil(scale);
    if tenths < 100 {
        format!("{}.{}{}", tenths / 10, tenths % 10, UNITS[unit])
    } else {
        let whole = bytes.div_ceil(scale);
        if whole >= 1024 && unit + 1 < UNITS.len() {
            // Rounding up reached the next unit.
            return format!("1.0{}", UNITS[unit + 1]);
        }
        format!("{whole}{}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_sizes_round_up_as_ls_does() {
        assert_eq!(human_size(0), "0");
        assert_eq!(human_size(1023), "1023");
        assert_eq!(human_size(1024), "1.0K");
        assert_eq!(human_size(1025), "1.1K");
        assert_eq!(human_size(1536), "1.5K");
        assert_eq!(human_size(10 * 1024 - 1), "10K");
        assert_eq!(human_size(10 * 1024), "10K");
        assert_eq!(human_size(10 * 1024 + 1), "11K");
        assert_eq!(human_size(1024 * 1024 - 1), "1.0M");
        assert_eq!(human_size(1 << 20), "1.0M");
        assert_eq!(human_size(5 << 30), "5.0G");
        assert_eq!(human_size(u64::MAX), "16E");
    }
}
