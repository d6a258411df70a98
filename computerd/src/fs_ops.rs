//! The `computerd fs` commands that run on [`Files`] alone (ls, stat, mkdir, rm, mv,
//! cp, ln, find, grep, chmod, truncate, tree, du, and with `fs_store.rs` stats, check
//! and compact), written once against
//! [`Files`]: the same code runs them on a database this process opened (`fs_cmd.rs`)
//! and through a server's or an owner's typed calls (`remote.rs`), so they print the
//! same either way. Also what every command shares: where it reads and writes, paths
//! from arguments, exit codes.

use std::io::{BufWriter, Read, Write};
use std::process::ExitCode;

use anyhow::anyhow;
use computer_vfs::{join, Attr, FileKind, GrepOptions, MkdirOptions, RmOptions};

use crate::fs_args::FsCommand;
use crate::fs_error::{is_broken_pipe, out_err, report, StdoutError};
use crate::fs_files::Files;
use crate::fs_format::{
    json_string, kind_name, mode_string, parent_dir, parse_mode, parse_size, rfc3339_ns,
};
use crate::fs_ls::{Hidden, LsOptions};
use crate::fs_store;
use crate::fs_walk::{du, DuOptions};

/// Where a command reads and writes: the process's own streams, or buffers when the
/// command runs for a remote client (`computerd serve`).
pub struct Stdio<'a> {
    pub stdin: &'a mut dyn Read,
    pub stdout: &'a mut dyn Write,
    pub stderr: &'a mut dyn Write,
}

// ------------------------------------------------------------------------------- paths

/// A workspace path from an argument: relative ones are taken from the root.
pub(crate) fn ws_path(arg: &str) -> anyhow::Result<String> {
    if arg.is_empty() {
        return Err(anyhow!("'': invalid argument: empty path"));
    }
    Ok(if arg.starts_with('/') {
        arg.to_owned()
    } else {
        format!("/{arg}")
    })
}

/// The last component of a path (`/a/b/` -> `b`).
fn base_name(path: &str) -> &str {
    let trimmed = path.trim_end_matches('/');
    trimmed.rsplit('/').next().unwrap_or(trimmed)
}

/// `dst`, or `dst/<name of src>` when `dst` is an existing directory (like mv, cp, ln).
fn into_dir(files: &dyn Files, src: &str, dst: String) -> String {
    match files.node(&dst, true) {
        Ok(node) if node.attr.is_dir() && !base_name(src).is_empty() => join(&dst, base_name(src)),
        _ => dst,
    }
}

// -------------------------------------------------------------------------------- runs

/// Runs a file operation command (`FsCommand::is_file_operation`) on `files`, with the
/// exit codes and error lines of `fs_cmd::run_on`; progress bars on the terminal if
/// `progress`.
pub fn run_file_operation(
    files: &dyn Files,
    command: FsCommand,
    stdio: &mut Stdio<'_>,
    progress: bool,
) -> anyhow::Result<ExitCode> {
    let error_code = error_code(&command);
    let result = file_operation(files, command, stdio, progress);
    settle(result, error_code, stdio)
}

/// The exit status of a failed command: grep(1) exits 1 for "no match", so its errors
/// exit 2.
pub(crate) fn error_code(command: &FsCommand) -> u8 {
    match command {
        FsCommand::Grep { .. } => 2,
        _ => 1,
    }
}

/// A command's result as its caller takes it: a closed stdout is no failure, and an
/// error with its own exit code is reported here.
pub(crate) fn settle(
    result: anyhow::Result<ExitCode>,
    error_code: u8,
    stdio: &mut Stdio<'_>,
) -> anyhow::Result<ExitCode> {
    match result {
        Ok(code) => Ok(code),
        Err(err) if is_broken_pipe(&err) => Ok(ExitCode::SUCCESS),
        Err(err) if error_code != 1 => {
            report(stdio.stderr, &err);
            Ok(ExitCode::from(error_code))
        }
        Err(err) => Err(err),
    }
}

/// The commands that are file operations and nothing else, written once against
/// [`Files`]: the same here and through a server.
pub(crate) fn file_operation(
    files: &dyn Files,
    command: FsCommand,
    stdio: &mut Stdio<'_>,
    progress: bool,
) -> anyhow::Result<ExitCode> {
    debug_assert!(command.is_file_operation(), "{} is not", command.name());
    match command {
        FsCommand::Ls {
            long,
            all,
            almost_all,
            human_readable,
            recursive,
            help: _,
            paths,
        } => {
            let options = LsOptions {
                long,
                hidden: if all {
                    Hidden::All
                } else if almost_all {
                    Hidden::AlmostAll
                } else {
                    Hidden::None
                },
                human: human_readable,
                recursive,
            };
            let paths = paths
                .iter()
                .map(|p| ws_path(p))
                .collect::<anyhow::Result<Vec<_>>>()?;
            crate::fs_ls::ls(files, &paths, &options, stdio.stdout, stdio.stderr)
        }
        FsCommand::Mkdir {
            parents,
            mode,
            paths,
        } => {
            let mode = match mode {
                Some(text) => mode_arg(&text)?,
                None => 0o755,
            };
            let options = MkdirOptions {
                recursive: parents,
                mode,
            };
            each(&paths, stdio.stderr, |path| Ok(files.mkdir(path, options)?))
        }
        FsCommand::Rm {
            recursive,
            force,
            paths,
        } => {
            let options = RmOptions { recursive, force };
            each(&paths, stdio.stderr, |path| Ok(files.rm(path, options)?))
        }
        FsCommand::Mv { src, dst } => {
            let src = ws_path(&src)?;
            let dst = into_dir(files, &src, ws_path(&dst)?);
            files.rename(&src, &dst)?;
            Ok(ExitCode::SUCCESS)
        }
        FsCommand::Cp {
            recursive,
            src,
            dst,
        } => cp(files, &ws_path(&src)?, ws_path(&dst)?, recursive),
        FsCommand::Ln {
            symbolic,
            target,
            link,
        } => {
            if target.is_empty() {
                return Err(anyhow!("'': invalid argument: empty link target"));
            }
            let link = into_dir(files, &target, ws_path(&link)?);
            if symbolic {
                files.symlink(&target, &link)?;
            } else {
                files.link(&ws_path(&target)?, &link)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        FsCommand::Stat {
            dereference,
            json,
            paths,
        } => stat(files, &paths, dereference, json, stdio),
        FsCommand::Find { pattern } => {
            let found = files.glob(&ws_path(&pattern)?)?;
            let mut out = BufWriter::new(&mut *stdio.stdout);
            for path in found {
                writeln!(out, "{path}").map_err(out_err)?;
            }
            out.flush().map_err(out_err)?;
            Ok(ExitCode::SUCCESS)
        }
        FsCommand::Grep {
            ignore_case,
            extended_regexp,
            include,
            max_count,
            pattern,
            path,
        } => {
            let options = GrepOptions {
                regex: extended_regexp,
                ignore_case,
                max_matches: max_count,
                include,
            };
            grep(files, &pattern, &ws_path(&path)?, &options, stdio.stdout)
        }
        FsCommand::Chmod { mode, paths } => {
            let mode = mode_arg(&mode)?;
            each(&paths, stdio.stderr, |path| Ok(files.chmod(path, mode)?))
        }
        FsCommand::Truncate {
            size,
            no_create,
            paths,
        } => {
            let size = parse_size(&size).ok_or_else(|| {
                anyhow!("{size}: invalid size (expected bytes, optionally with K, M, G or T)")
            })?;
            each(&paths, stdio.stderr, |path| {
                truncate(files, path, size, !no_create)
            })
        }
        whole @ (FsCommand::Tree { .. }
        | FsCommand::Du { .. }
        | FsCommand::Check { .. }
        | FsCommand::Compact { .. }
        | FsCommand::Stats { .. }) => walk_or_store(files, whole, stdio, progress),
        other => Err(anyhow!("{}: not a file operation", other.name())),
    }
}

/// The commands on a whole tree (`tree`, `du`) or the whole store (`stats`, `check`,
/// `compact`).
fn walk_or_store(
    files: &dyn Files,
    command: FsCommand,
    stdio: &mut Stdio<'_>,
    progress: bool,
) -> anyhow::Result<ExitCode> {
    match command {
        FsCommand::Tree { path } => {
            let mut out = BufWriter::new(&mut *stdio.stdout);
            let code = crate::fs_walk::tree(files, &ws_path(&path)?, &mut out, stdio.stderr)?;
            out.flush().map_err(out_err)?;
            Ok(code)
        }
        FsCommand::Du {
            summarize,
            human_readable,
            path,
            help: _,
        } => {
            let options = DuOptions {
                summarize,
                human: human_readable,
            };
            let mut out = BufWriter::new(&mut *stdio.stdout);
            let code = du(files, &ws_path(&path)?, &options, &mut out, stdio.stderr)?;
            out.flush().map_err(out_err)?;
            Ok(code)
        }
        FsCommand::Check { no_progress, json } => {
            fs_store::check(files, progress && !no_progress, json, stdio.stdout)
        }
        FsCommand::Compact { no_progress, json } => fs_store::compact(
            files,
            progress && !no_progress,
            json,
            stdio.stdout,
            stdio.stderr,
        ),
        FsCommand::Stats { json } => fs_store::stats(files, json, stdio.stdout),
        other => Err(anyhow!("{}: not a walk or a store command", other.name())),
    }
}

fn mode_arg(text: &str) -> anyhow::Result<u32> {
    parse_mode(text).ok_or_else(|| anyhow!("{text}: invalid mode (expected octal, like 755)"))
}

/// Runs `f` on every path, reporting each failure; fails if any did.
fn each(
    paths: &[String],
    stderr: &mut dyn Write,
    mut f: impl FnMut(&str) -> anyhow::Result<()>,
) -> anyhow::Result<ExitCode> {
    let mut failed = false;
    for arg in paths {
        if let Err(err) = ws_path(arg).and_then(|path| f(&path)) {
            if is_broken_pipe(&err) || err.downcast_ref::<StdoutError>().is_some() {
                return Err(err);
            }
            report(stderr, &err);
            failed = true;
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

// -------------------------------------------------------------------------- commands

fn cp(files: &dyn Files, src: &str, dst: String, recursive: bool) -> anyhow::Result<ExitCode> {
    let src_attr = files.node(src, true)?.attr;
    let dst = into_dir(files, src, dst);
    match files.node(&dst, false).map(|node| node.attr) {
        Ok(dst_attr) if dst_attr.ino == src_attr.ino => {
            Err(anyhow!("{src} and {dst} are the same file"))
        }
        Ok(dst_attr) if !dst_attr.is_dir() && !src_attr.is_dir() => {
            // The store copies only to a new name: copy beside the target, then rename
            // over it, so the target is replaced at once or not at all.
            let temp = join(
                parent_dir(&dst),
                &format!(".{}.cp-{}", base_name(&dst), std::process::id()),
            );
            files.copy(src, &temp, false)?;
            if let Err(e) = files.rename(&temp, &dst) {
                let _ = files.rm(&temp, RmOptions::default());
                return Err(e.into());
            }
            Ok(ExitCode::SUCCESS)
        }
        _ => {
            files.copy(src, &dst, recursive)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn stat(
    files: &dyn Files,
    paths: &[String],
    follow: bool,
    json: bool,
    stdio: &mut Stdio<'_>,
) -> anyhow::Result<ExitCode> {
    let mut out = BufWriter::new(&mut *stdio.stdout);
    let mut first = true;
    let code = each(paths, stdio.stderr, |path| {
        let node = files.node(path, follow)?;
        let attr = node.attr;
        let target = node
            .target
            .map(|t| String::from_utf8_lossy(&t).into_owned());
        if json {
            let line = stat_json(path, &attr, target.as_deref());
            return writeln!(out, "{line}").map_err(out_err);
        }
        let mut text = String::new();
        if !first {
            text.push('\n');
        }
        first = false;
        let mut line = |key: &str, value: String| {
            text.push_str(&format!("{key:>9}: {value}\n"));
        };
        line("path", path.to_owned());
        line("kind", kind_name(attr.kind).to_owned());
        if let Some(target) = target {
            line("target", target);
        }
        line("inode", attr.ino.0.to_string());
        line("links", attr.nlink.to_string());
        line(
            "mode",
            format!(
                "{:04o} ({}) st_mode {:o}",
                attr.perm,
                mode_string(attr.kind, attr.perm),
                attr.mode()
            ),
        );
        line("uid", attr.uid.to_string());
        line("gid", attr.gid.to_string());
        line("size", attr.size.to_string());
        line("blocks", format!("{} (512-byte)", attr.blocks_512()));
        if matches!(attr.kind, FileKind::CharDevice | FileKind::BlockDevice) {
            line("rdev", attr.rdev.to_string());
        }
        line("atime", rfc3339_ns(attr.atime));
        line("mtime", rfc3339_ns(attr.mtime));
        line("ctime", rfc3339_ns(attr.ctime));
        line("revision", attr.revision.0.to_string());
        out.write_all(text.as_bytes()).map_err(out_err)
    })?;
    out.flush().map_err(out_err)?;
    Ok(code)
}

/// A path's attributes as one JSON object (times in nanoseconds since the epoch).
fn stat_json(path: &str, attr: &Attr, target: Option<&str>) -> String {
    format!(
        "{{\"path\":{},\"kind\":{},\"target\":{},\"inode\":{},\"links\":{},\"perm\":{},\
         \"st_mode\":{},\"uid\":{},\"gid\":{},\"size\":{},\"blocks\":{},\"rdev\":{},\
         \"atime_ns\":{},\"mtime_ns\":{},\"ctime_ns\":{},\"revision\":{}}}",
        json_string(path),
        json_string(kind_name(attr.kind)),
        target.map_or("null".to_owned(), json_string),
        attr.ino.0,
        attr.nlink,
        attr.perm,
        attr.mode(),
        attr.uid,
        attr.gid,
        attr.size,
        attr.blocks_512(),
        attr.rdev,
        attr.atime,
        attr.mtime,
        attr.ctime,
        attr.revision.0,
    )
}

fn grep(
    files: &dyn Files,
    pattern: &str,
    path: &str,
    options: &GrepOptions,
    stdout: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    let matches = files.grep(pattern, path, options)?;
    let mut out = BufWriter::new(stdout);
    for m in &matches {
        writeln!(out, "{}:{}:{}", m.path, m.line_number, m.line).map_err(out_err)?;
    }
    out.flush().map_err(out_err)?;
    Ok(if matches.is_empty() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

fn truncate(files: &dyn Files, path: &str, size: u64, create: bool) -> anyhow::Result<()> {
    match files.node(path, true) {
        Err(err) if create && err.is_not_found() => files.create_empty(path)?,
        Err(err) if !err.is_not_found() => return Err(err.into()),
        _ => {}
    }
    Ok(files.truncate(path, size)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_from_arguments() {
        assert_eq!(ws_path("/a").unwrap(), "/a");
        assert_eq!(ws_path("a/b").unwrap(), "/a/b");
        assert!(ws_path("").is_err());
        assert_eq!(base_name("/a/b/"), "b");
        assert_eq!(base_name("/"), "");
        assert_eq!(base_name("x"), "x");
        assert_eq!(parent_dir("/a/b"), "/a");
        assert_eq!(parent_dir("/a"), "/");
        assert_eq!(parent_dir("/"), "/");
    }
}
