//! `computerd fs <DB> <command>`: file commands against a workspace database.
//!
//! Paths inside the workspace are absolute; a relative one is taken from the root
//! (`a/b` is `/a/b`). Commands that only read open the database read-only; no command
//! makes a workspace (`computerd init` does), so a mistyped path is an error.
//!
//! Errors are one line on stderr, `computerd: <what>: <why>`, and a non-zero exit
//! status (grep: 1 for no match, 2 for an error, like grep(1)). Commands that take
//! several paths report each failing one and go on with the rest.

use std::io::{self, Read, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use computer_vfs::transfer::{self, ImportOptions, Summary};
use computer_vfs::{Error, ErrorPath, Fs, OpenFlags, Options, Workspace};

pub use crate::fs_args::{FsArgs, FsCommand};
use crate::fs_error::{describe, describe_io, report};
use crate::fs_error::{out_err, vfs_err};
use crate::fs_format::{human_bytes, json_f64, json_string};
use crate::fs_ops::{error_code, file_operation, settle, ws_path, Stdio};
use crate::fs_progress::TransferProgress;
use crate::owner::{Holder, OwnerLock, Role};

/// Bytes moved per step by `cat` and `write`.
const COPY_BUFFER: usize = 1 << 20;

// ------------------------------------------------------------------------------- paths

// --------------------------------------------------------------------------------- run

/// Refuses a database path that cannot be one, before SQLite has a go, so the message
/// is plain. A command that would change a missing workspace says how to make one.
fn check_db_path(db: &Path, writes: bool) -> anyhow::Result<()> {
    if db.is_dir() {
        return Err(anyhow!("{}: is a directory", db.display()));
    }
    match (db.exists(), writes) {
        (true, _) => Ok(()),
        (false, false) => Err(anyhow!("{}: no such file or directory", db.display())),
        (false, true) => Err(anyhow!(
            "{}: no such file or directory (computerd init makes a workspace)",
            db.display()
        )),
    }
}

/// Opens an existing workspace (never makes one: a mistyped path must not become an
/// empty workspace that takes the writes meant for another).
fn open(db: &Path, command: &FsCommand, holding: bool) -> anyhow::Result<Fs> {
    let writes = command.writes();
    let options = Options {
        create: false,
        read_only: !writes,
        no_other_writer: holding,
        // An import commits in batches (bounded in mutations and bytes, `db.rs`), as a
        // mount does: a transaction per file rewrote the same index pages into the
        // log at every commit, 11 bytes written per byte stored. A crash loses at most
        // the last batch of an import, which is run again anyway.
        commit_delay: matches!(command, FsCommand::Import { .. }).then_some(IMPORT_COMMIT_DELAY),
        // And, holding the database alone, through a rollback journal: each page it
        // adds written once, not into the log and again into the database.
        bulk_load: holding && matches!(command, FsCommand::Import { .. }),
        ..Options::default()
    };
    let ws = Workspace::open(db, options.clone()).map_err(vfs_err)?;
    if takes_in_staged(&ws, command, holding)? {
        // A mount stopped (killed, or with a file still mapped) before it took in
        // files written through it: their content waits in staging files, and the
        // stored one is older. Reading that would show what the next mount replaces,
        // so the files are taken in first, as that mount would.
        drop(ws);
        let options = Options {
            read_only: false,
            ..options
        };
        return Ok(Workspace::open(db, options).map_err(vfs_err)?.fs());
    }
    Ok(ws.fs())
}

/// Whether a command that only reads `ws` should take in staged content first: it
/// holds the database alone, content waits in staging files, and it is not `check`
/// (which reports the database as it is, what a crash left included).
fn takes_in_staged(ws: &Workspace, command: &FsCommand, holding: bool) -> anyhow::Result<bool> {
    if command.writes() || !holding || matches!(command, FsCommand::Check { .. }) {
        return Ok(false);
    }
    Ok(ws.staged_files().map_err(vfs_err)? > 0)
}

/// How long an import's batch stays open at most (it also commits once it holds 4 MiB
/// of blocks or 4,096 mutations).
const IMPORT_COMMIT_DELAY: Duration = Duration::from_millis(250);

/// Who runs a command on a local database: this process, holding its owner lock (none
/// on read-only media, or to read beside a server), or the process that owns it.
enum Runner {
    Here(Option<OwnerLock>),
    Owner(Holder),
}

/// Takes the database's owner lock for `command`, waiting for an owner that is
/// finishing or is another command; returns a mount or server that owns it instead.
///
/// A command that only reads a served database reads it here, beside the server,
/// without a round trip per call: a server commits each change at once and stages
/// nothing, so the database holds what its clients see. A mount's
/// newest content may still be in its staging files, so reads go to it.
fn runner(db: &Path, command: &FsCommand) -> anyhow::Result<Runner> {
    let writes = command.writes();
    check_db_path(db, writes)?;
    let holder = Holder::me(Role::Command {
        name: command.name(),
    });
    Ok(
        match OwnerLock::acquire(db, holder, !writes, Holder::will_leave_or_answer)? {
            Ok(lock) => Runner::Here(lock),
            Err(owner) if !writes && matches!(owner.role, Role::Serve { .. }) => Runner::Here(None),
            Err(owner) => Runner::Owner(owner),
        },
    )
}

pub fn run(args: FsArgs) -> anyhow::Result<ExitCode> {
    if let Some(remote) = &args.remote {
        return crate::remote::fs(remote, args.token_file.as_deref(), &args.command);
    }
    let Some(db) = &args.db else {
        return Err(anyhow!("name a database, or a server with --remote"));
    };
    let runner = runner(db, &args.command);
    if let Ok(Runner::Owner(owner)) = &runner {
        return through_owner(db, owner, &args.command);
    }
    let (mut stdin, mut stdout, mut stderr) = (io::stdin().lock(), io::stdout(), io::stderr());
    let mut stdio = Stdio {
        stdin: &mut stdin,
        stdout: &mut stdout,
        stderr: &mut stderr,
    };
    let lock = match runner {
        Ok(Runner::Here(lock)) => lock,
        Ok(Runner::Owner(_)) => unreachable!("sent to the owner above"),
        Err(err) => return run_on(Err(err), args.command, &mut stdio, !crate::notice::quiet()),
    };
    let result = run_on(
        open(db, &args.command, lock.is_some()),
        args.command,
        &mut stdio,
        !crate::notice::quiet(),
    );
    // Held until the command is done with the database (its handle closed above).
    drop(lock);
    result
}

/// Runs `command` in the process that owns `db`, through its channel.
fn through_owner(db: &Path, owner: &Holder, command: &FsCommand) -> anyhow::Result<ExitCode> {
    match &owner.channel {
        Some(channel) => crate::remote::fs_through_owner(db, channel, command),
        None => Err(anyhow!(
            "{}: in use by {owner}, which takes no file commands; work through its mount",
            db.display()
        )),
    }
}

/// Runs `command` on the workspace `fs` opened to (or the error opening it), with
/// progress bars on the terminal if `progress`. Errors that end the command are
/// returned for the caller to print, except grep's (which exits 2).
pub fn run_on(
    fs: anyhow::Result<Fs>,
    command: FsCommand,
    stdio: &mut Stdio<'_>,
    progress: bool,
) -> anyhow::Result<ExitCode> {
    let error_code = error_code(&command);
    let result = fs.and_then(|fs| dispatch(&fs, command, stdio, progress));
    settle(result, error_code, stdio)
}

fn dispatch(
    fs: &Fs,
    command: FsCommand,
    stdio: &mut Stdio<'_>,
    progress: bool,
) -> anyhow::Result<ExitCode> {
    match command {
        FsCommand::Cat { paths } => cat(fs, &paths, stdio),
        FsCommand::Write { path, append } => write(fs, &ws_path(&path)?, append, stdio.stdin),
        FsCommand::Import {
            host_dir,
            path,
            no_progress,
            skip_bad_names,
            json,
        } => import(
            fs,
            &host_dir,
            &ws_path(&path)?,
            ImportOptions { skip_bad_names },
            progress && !no_progress,
            json,
            stdio,
        ),
        FsCommand::Export {
            path,
            host_dir,
            no_progress,
            json,
        } => export(
            fs,
            &ws_path(&path)?,
            &host_dir,
            progress && !no_progress,
            json,
            stdio.stdout,
        ),
        file_op => file_operation(fs, file_op, stdio, progress),
    }
}

// -------------------------------------------------------------------------- commands

fn cat(fs: &Fs, paths: &[String], stdio: &mut Stdio<'_>) -> anyhow::Result<ExitCode> {
    let out = &mut *stdio.stdout;
    let mut buf = vec![0u8; COPY_BUFFER];
    let mut failed = false;
    for arg in paths {
        let path = match ws_path(arg) {
            Ok(path) => path,
            Err(err) => {
                report(stdio.stderr, &err);
                failed = true;
                continue;
            }
        };
        let mut reader = match fs.open_read(&path) {
            Ok(reader) => reader,
            Err(err) => {
                report(stdio.stderr, &vfs_err(err));
                failed = true;
                continue;
            }
        };
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    report(
                        stdio.stderr,
                        &vfs_err(Error::Io {
                            path: ErrorPath::of(path.clone()),
                            source: e,
                        }),
                    );
                    failed = true;
                    break;
                }
            };
            out.write_all(&buf[..n]).map_err(out_err)?;
        }
    }
    out.flush().map_err(out_err)?;
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Reads stdin to its end, handing each piece to `sink`.
fn pump_stdin(
    stdin: &mut dyn Read,
    mut sink: impl FnMut(&[u8]) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut buf = vec![0u8; COPY_BUFFER];
    loop {
        let n = match stdin.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(anyhow!("standard input: {}", describe_io(&e))),
        };
        sink(&buf[..n])?;
    }
}

fn write(fs: &Fs, path: &str, append: bool, stdin: &mut dyn Read) -> anyhow::Result<ExitCode> {
    let existing = match fs.stat(path) {
        Ok(attr) => Some(attr),
        Err(Error::NotFound(_)) => None,
        Err(e) => return Err(vfs_err(e)),
    };
    match existing {
        Some(attr) if append => {
            if attr.is_dir() {
                return Err(vfs_err(Error::IsDir(ErrorPath::of(path))));
            }
            // The path API appends from memory only; stream through the inode API.
            let ws = fs.workspace();
            let flags = OpenFlags {
                append: true,
                ..OpenFlags::WRITE
            };
            let fh = ws
                .open_file(attr.ino, flags)
                .map_err(|e| vfs_err(e.at(path)))?;
            let pumped = pump_stdin(stdin, |data| {
                ws.write(fh, 0, data)
                    .map(drop)
                    .map_err(|e| vfs_err(e.at(path)))
            });
            let flushed = ws.flush(fh);
            let released = ws.release(fh);
            pumped?;
            flushed.map_err(|e| vfs_err(e.at(path)))?;
            released.map_err(|e| vfs_err(e.at(path)))?;
        }
        _ => {
            // Replaced whole once stdin ends: a write cut short leaves the old content.
            let mut replacement = fs.create_replace(path).map_err(vfs_err)?;
            pump_stdin(stdin, |data| {
                let end = replacement.size();
                replacement.write_at(end, data).map_err(vfs_err)
            })?;
            replacement.commit().map_err(vfs_err)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `imported 3 files, 1 directory, ... 1.2 MiB (1234567 bytes) in 0.52 s (2.37 MB/s)`.
/// A transfer's summary as one JSON object.
fn summary_json(s: &Summary, elapsed: Duration) -> String {
    let bad: Vec<String> = s
        .bad_names
        .iter()
        .map(|p| json_string(&p.display().to_string()))
        .collect();
    format!(
        "{{\"files\":{},\"directories\":{},\"symlinks\":{},\"hard_links\":{},\"bytes\":{},\
         \"special_files_skipped\":{},\"bad_names\":[{}],\"seconds\":{}}}",
        s.files,
        s.directories,
        s.symlinks,
        s.hard_links,
        s.bytes,
        s.skipped,
        bad.join(","),
        json_f64(elapsed.as_secs_f64()),
    )
}

fn summary_line(verb: &str, s: &Summary, elapsed: Duration) -> String {
    fn count(n: u64, one: &str, many: &str) -> String {
        format!("{n} {}", if n == 1 { one } else { many })
    }
    let secs = elapsed.as_secs_f64();
    let rate = s.bytes as f64 / secs.max(1e-6) / 1e6;
    let mut line = format!(
        "{verb} {}, {}, {}, {}, {} ({} bytes) in {secs:.2} s ({rate:.2} MB/s)",
        count(s.files, "file", "files"),
        count(s.directories, "directory", "directories"),
        count(s.symlinks, "symlink", "symlinks"),
        count(s.hard_links, "hard link", "hard links"),
        human_bytes(s.bytes),
        s.bytes,
    );
    if s.skipped > 0 {
        line.push_str(&format!(
            "; skipped {}",
            count(s.skipped, "special file", "special files")
        ));
    }
    line
}

fn import(
    fs: &Fs,
    host_dir: &Path,
    path: &str,
    options: ImportOptions,
    progress: bool,
    json: bool,
    stdio: &mut Stdio<'_>,
) -> anyhow::Result<ExitCode> {
    let start = Instant::now();
    let mut bar = TransferProgress::new("import", progress);
    let result = transfer::import_with(fs, host_dir, path, options, &mut |p| bar.update(p));
    bar.finish();
    let summary = result.map_err(|err| match &err {
        Error::Invalid { reason, .. } if *reason == transfer::BAD_NAME => {
            anyhow!("{} (--skip-bad-names imports the rest)", describe(&err))
        }
        _ => vfs_err(err),
    })?;
    for bad in &summary.bad_names {
        let _ = writeln!(
            stdio.stderr,
            "computerd: {}: left out: its name, or the target it links to, is not UTF-8",
            bad.display()
        );
    }
    let line = if json {
        summary_json(&summary, start.elapsed())
    } else {
        let mut line = summary_line("imported", &summary, start.elapsed());
        if !summary.bad_names.is_empty() {
            line += &format!("; left out {} bad names", summary.bad_names.len());
        }
        line
    };
    writeln!(stdio.stdout, "{line}").map_err(out_err)?;
    Ok(ExitCode::SUCCESS)
}

fn export(
    fs: &Fs,
    path: &str,
    host_dir: &Path,
    progress: bool,
    json: bool,
    stdout: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    let start = Instant::now();
    let mut bar = TransferProgress::new("export", progress);
    let result = transfer::export(fs, path, host_dir, &mut |p| bar.update(p));
    bar.finish();
    let summary = result.map_err(vfs_err)?;
    let line = if json {
        summary_json(&summary, start.elapsed())
    } else {
        summary_line("exported", &summary, start.elapsed())
    };
    writeln!(stdout, "{line}").map_err(out_err)?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_read_like_store_errors() {
        let err = Error::Io {
            path: ErrorPath::of("/host/x"),
            source: io::Error::from_raw_os_error(libc::ENOENT),
        };
        assert_eq!(describe(&err), "/host/x: no such file or directory");
        // A store error wrapped in an I/O error (from a stream) is shown once.
        let inner = Error::NotFound(ErrorPath::of("/a"));
        let err = Error::Io {
            path: ErrorPath::of("/a"),
            source: io::Error::other(inner),
        };
        assert_eq!(describe(&err), "/a: no such file or directory");
    }
}
