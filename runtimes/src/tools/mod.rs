//! The file tools agents call (issue 18 serves them over MCP): `read`, `write`, `edit`,
//! `ls`, `find` and `grep` on the workspace store, with the semantics agents rely on
//! and every answer bounded. Paths are workspace paths (`src/main.rs` or
//! `/src/main.rs`, from its root; `/workspace/...`, as commands name them, too). The
//! shell backend's path globs apply (reading needs `read`, changing needs `write`), and
//! each call is an audit record of its own (kind `tool`).

use std::sync::Arc;

use computer_vfs::{Fs, GrepOptions, MkdirOptions, Workspace};

use crate::audit::{AuditEntry, AuditSink, KIND_TOOL};
use crate::error::{Error, Result};
use crate::linux::SANDBOX_WORKSPACE;
use crate::shell::{ChangeObserver, PathRules, ShellPolicy};

mod call;
mod exec;

pub use call::*;
pub use exec::{ExecArgs, Transcript, TRANSCRIPT_STREAM_BYTES_MAX};

/// Lines `read` returns when the caller names no count, and the most it returns.
pub const READ_LINES_DEFAULT: usize = 2000;
/// Characters of one line `read` shows; the rest is cut, and said so.
pub const READ_LINE_CHARS_MAX: usize = 2000;
/// Bytes of text any one tool answer carries at most.
pub const ANSWER_BYTES_MAX: usize = 256 << 10;
/// Entries `ls`, paths `find` and matches `grep` return at most.
pub const LISTED_MAX: usize = 1000;
/// Bytes looked at to call a file binary (a NUL byte among them).
const BINARY_PROBE_BYTES: usize = 8 << 10;

/// The tools over one workspace. Cheap to clone.
#[derive(Clone)]
pub struct Tools {
    fs: Fs,
    rules: Arc<PathRules>,
    changed: Option<ChangeObserver>,
    audit: Option<Arc<dyn AuditSink>>,
    /// Who calls, for the audit records.
    caller: String,
}

/// One entry of `ls`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    pub name: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: &'static str,
    pub size: u64,
}

impl Tools {
    /// `policy`'s path globs bound what the tools read and change; `changed` is told
    /// what they change (a mount's kernel cache).
    pub fn new(
        ws: &Workspace,
        policy: &ShellPolicy,
        changed: Option<ChangeObserver>,
    ) -> Result<Tools> {
        Ok(Tools {
            fs: ws.fs(),
            rules: Arc::new(policy.path_rules().map_err(Error::Invalid)?),
            changed,
            audit: None,
            caller: "in-process".into(),
        })
    }

    /// Sends a record of each call to `sink` from now on.
    pub fn set_audit(&mut self, sink: Arc<dyn AuditSink>) {
        self.audit = Some(sink);
    }

    /// These tools, their calls recorded as `caller`'s.
    fn for_caller(&self, caller: &str) -> Tools {
        Tools {
            caller: caller.to_owned(),
            ..self.clone()
        }
    }

    /// Lines `from_line` (1-based) on of a text file, `count` of them at most, each
    /// numbered (`     7\tline`), with a note at the end when more follow.
    pub fn read(&self, path: &str, from_line: usize, count: Option<usize>) -> Result<String> {
        self.recorded(&format!("read {path}"), || {
            let path = self.readable(path)?;
            let content = self.fs.read_file(&path).map_err(store_error)?;
            if content[..content.len().min(BINARY_PROBE_BYTES)].contains(&0) {
                return Err(Error::Invalid(format!(
                    "{path}: a binary file of {} bytes; read shows text only",
                    content.len()
                )));
            }
            let count = count.unwrap_or(READ_LINES_DEFAULT).min(READ_LINES_DEFAULT);
            Ok(numbered_lines(
                &String::from_utf8_lossy(&content),
                from_line.max(1),
                count,
            ))
        })
    }

    /// Replaces the file at `path` with `content` whole (readers see the old file or the
    /// new, never a part), making its missing parent directories. Returns a one-line
    /// summary.
    pub fn write(&self, path: &str, content: &[u8]) -> Result<String> {
        self.recorded(&format!("write {path}"), || {
            let path = self.writable(path)?;
            let existed = self.fs.exists(&path).map_err(store_error)?;
            if let Some((parent, _)) = path.rsplit_once('/').filter(|(p, _)| !p.is_empty()) {
                let recursive = MkdirOptions {
                    recursive: true,
                    ..MkdirOptions::default()
                };
                self.fs.mkdir(parent, recursive).map_err(store_error)?;
            }
            self.replace(&path, content)?;
            let verb = if existed { "replaced" } else { "created" };
            Ok(format!("{verb} {path} ({} bytes)", content.len()))
        })
    }

    /// Replaces the one place `old` appears in the file at `path` by `new`; the change
    /// as a unified diff. `old` that appears nowhere, or more than once, is an error
    /// saying how many times.
    pub fn edit(&self, path: &str, old: &str, new: &str) -> Result<String> {
        self.recorded(&format!("edit {path}"), || {
            let path = self.writable(path)?;
            self.readable(&path)?;
            if old.is_empty() {
                return Err(Error::Invalid("edit: the text to replace is empty".into()));
            }
            let before = self.fs.read_to_string(&path).map_err(store_error)?;
            let found = before.matches(old).count();
            if found != 1 {
                return Err(Error::Invalid(format!(
                    "{path}: the text to replace appears {found} times; it must appear once \
                     (give more of the surrounding text)"
                )));
            }
            let after = before.replacen(old, new, 1);
            self.replace(&path, after.as_bytes())?;
            Ok(unified_diff(&path, &before, &after))
        })
    }

    /// The entries of a directory, sorted by name, at most [`LISTED_MAX`].
    pub fn ls(&self, path: &str) -> Result<(Vec<Listed>, bool)> {
        self.recorded(&format!("ls {path}"), || {
            let path = self.readable(path)?;
            let mut entries: Vec<Listed> = (self.fs.readdir_plus(&path).map_err(store_error)?)
                .into_iter()
                .map(|(entry, attr)| Listed {
                    name: entry.name_lossy(),
                    kind: kind_name(attr.kind),
                    size: attr.size,
                })
                .collect();
            entries.sort_by(|a, b| a.name.cmp(&b.name));
            let cut = entries.len() > LISTED_MAX;
            entries.truncate(LISTED_MAX);
            Ok((entries, cut))
        })
    }

    /// Workspace paths matching a glob (`**/*.rs`, from the root or from `under`), sorted,
    /// at most [`LISTED_MAX`]; whether more matched.
    pub fn find(&self, pattern: &str, under: Option<&str>) -> Result<(Vec<String>, bool)> {
        self.recorded(&format!("find {pattern}"), || {
            let base = self.readable(under.unwrap_or("/"))?;
            let absolute = computer_vfs::join(&base, pattern.trim_start_matches('/'));
            let mut paths = self.fs.glob(&absolute).map_err(store_error)?;
            paths.retain(|p| self.rules.check_read(p).is_ok());
            let cut = paths.len() > LISTED_MAX;
            paths.truncate(LISTED_MAX);
            Ok((paths, cut))
        })
    }

    /// Lines matching a regular expression in a file or the files under a directory
    /// (`include`: only file names matching a glob), as `path:line:text`, at most
    /// [`LISTED_MAX`]; whether more matched.
    pub fn grep(&self, pattern: &str, path: &str, include: Option<&str>) -> Result<(String, bool)> {
        self.recorded(&format!("grep {pattern} {path}"), || {
            let path = self.readable(path)?;
            let options = GrepOptions {
                regex: true,
                max_matches: Some(LISTED_MAX + 1),
                include: include.map(str::to_owned),
                ..GrepOptions::default()
            };
            let mut found = self
                .fs
                .grep(pattern, &path, &options)
                .map_err(store_error)?;
            found.retain(|m| self.rules.check_read(&m.path).is_ok());
            let cut = found.len() > LISTED_MAX;
            found.truncate(LISTED_MAX);
            let mut text = String::new();
            for m in found {
                let line: String = m.line.chars().take(READ_LINE_CHARS_MAX).collect();
                text.push_str(&format!("{}:{}:{line}\n", m.path, m.line_number));
            }
            Ok(bounded(text, cut))
        })
    }

    /// Runs one call, keeping its record: what was asked, and how it ended.
    fn recorded<T>(&self, asked: &str, call: impl FnOnce() -> Result<T>) -> Result<T> {
        let started = std::time::Instant::now();
        let outcome = call();
        if let Some(audit) = &self.audit {
            let error = outcome.as_ref().err().map(ToString::to_string);
            audit.keep(
                KIND_TOOL,
                &AuditEntry::tool(&self.caller, asked, started.elapsed(), error),
            );
        }
        outcome
    }

    fn replace(&self, path: &str, content: &[u8]) -> Result<()> {
        let mut replacement = self.fs.create_replace(path).map_err(store_error)?;
        replacement.write_at(0, content).map_err(store_error)?;
        replacement.commit().map_err(store_error)?;
        if let Some(changed) = &self.changed {
            changed(&[path.as_bytes().to_vec()]);
        }
        Ok(())
    }

    fn readable(&self, path: &str) -> Result<String> {
        let path = workspace_path(path)?;
        self.rules.check_read(&path).map_err(refused)?;
        Ok(path)
    }

    fn writable(&self, path: &str) -> Result<String> {
        let path = workspace_path(path)?;
        self.rules.check_write(&path).map_err(refused)?;
        Ok(path)
    }
}

/// `path` from the workspace root: relative, absolute, or under `/workspace`. It may not
/// climb out with `..`.
fn workspace_path(path: &str) -> Result<String> {
    let inside = path
        .strip_prefix(SANDBOX_WORKSPACE)
        .filter(|rest| rest.is_empty() || rest.starts_with('/'));
    crate::spine::normalize_cwd(inside.unwrap_or(path))
        .map_err(|_| Error::Invalid(format!("{path}: not a path inside the workspace")))
}

fn refused(what: String) -> Error {
    Error::Refused {
        backend: "tools".into(),
        what,
    }
}

fn store_error(err: computer_vfs::Error) -> Error {
    let errno = err.errno();
    Error::Io {
        what: err.to_string(),
        source: std::io::Error::from_raw_os_error(errno),
    }
}

fn kind_name(kind: computer_vfs::FileKind) -> &'static str {
    match kind {
        computer_vfs::FileKind::File => "file",
        computer_vfs::FileKind::Directory => "dir",
        computer_vfs::FileKind::Symlink => "symlink",
        _ => "other",
    }
}

/// Lines `from..from + count` of `text`, numbered, long lines cut, the whole bounded.
fn numbered_lines(text: &str, from: usize, count: usize) -> String {
    let total = text.lines().count();
    let mut out = String::new();
    let mut shown = 0;
    for (number, whole) in text.lines().enumerate().skip(from - 1).take(count) {
        let mut line: String = whole.chars().take(READ_LINE_CHARS_MAX).collect();
        if line.len() < whole.len() {
            line.push_str(" [line cut]");
        }
        let numbered = format!("{:>6}\t{line}\n", number + 1);
        if out.len() + numbered.len() > ANSWER_BYTES_MAX {
            break;
        }
        out.push_str(&numbered);
        shown += 1;
    }
    let last = from - 1 + shown;
    if last < total {
        out.push_str(&format!(
            "[lines {from} to {last} of {total} shown; read from line {} for more]\n",
            last + 1
        ));
    }
    out
}

fn bounded(mut text: String, cut: bool) -> (String, bool) {
    if text.len() <= ANSWER_BYTES_MAX {
        return (text, cut);
    }
    let mut end = ANSWER_BYTES_MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    (text, true)
}

/// The change from `before` to `after` as a unified diff with three lines of context.
fn unified_diff(path: &str, before: &str, after: &str) -> String {
    similar::TextDiff::from_lines(before, after)
        .unified_diff()
        .context_radius(3)
        .header(&format!("a{path}"), &format!("b{path}"))
        .to_string()
}
