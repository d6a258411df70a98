//! Finding files by name (`glob`) and by content (`grep -rn`).
//!
//! Both walk the tree without following symlinked directories (no loops) and read file
//! content as streams, so memory stays bounded whatever the file sizes.

use std::io::Read;

use globset::{GlobBuilder, GlobMatcher};
use regex::bytes::{Regex, RegexBuilder};

use crate::error::{kind, Error, Result};
use crate::fs::{join, Fs};
use crate::types::FileKind;

/// Longest line `grep` reports; longer ones are cut (and still searched up to here).
const GREP_LINE_MAX: usize = 64 << 10;
/// Bytes looked at to decide that a file is binary (a NUL byte) and skip it.
const BINARY_PROBE: usize = 8 << 10;

/// Options of [`Fs::grep`].
#[derive(Clone, Debug, Default)]
pub struct GrepOptions {
    /// Treat the pattern as a regular expression (default: a literal string).
    pub regex: bool,
    pub ignore_case: bool,
    /// Stop after this many matches.
    pub max_matches: Option<usize>,
    /// Only search files whose name matches this glob (for example `*.rs`).
    pub include: Option<String>,
}

/// One matching line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrepMatch {
    pub path: String,
    /// 1-based.
    pub line_number: u64,
    pub line: String,
}

fn glob_matcher(pattern: &str) -> Result<GlobMatcher> {
    GlobBuilder::new(pattern)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|_| Error::invalid("bad glob pattern").at(pattern))
}

fn is_glob_component(component: &str) -> bool {
    component.contains(['*', '?', '[', '{'])
}

impl Fs {
    /// Paths matching an absolute glob pattern (`*`, `?`, `[...]`, `{a,b}`, `**`), sorted.
    pub fn glob(&self, pattern: &str) -> Result<Vec<String>> {
        if !pattern.starts_with('/') {
            return Err(Error::invalid("glob pattern must be absolute").at(pattern));
        }
        let matcher = glob_matcher(pattern)?;
        let parts: Vec<&str> = pattern.split('/').filter(|p| !p.is_empty()).collect();
        let literal = parts.iter().take_while(|p| !is_glob_component(p)).count();
        let base = format!("/{}", parts[..literal].join("/"));
        let rest = &parts[literal..];
        let mut out = Vec::new();
        if rest.is_empty() {
            if self.lstat(&base).is_ok() {
                out.push(base);
            }
            return Ok(out);
        }
        let depth_max = if rest.iter().any(|p| p.contains("**")) {
            usize::MAX
        } else {
            rest.len()
        };
        match self.lstat(&base) {
            Ok(attr) if attr.is_dir() => {}
            Ok(_) | Err(Error::NotFound(_)) | Err(Error::NotDir(_)) => return Ok(out),
            Err(e) => return Err(e),
        }
        self.walk(&base, depth_max, &mut |path, _| {
            if matcher.is_match(path) {
                out.push(path.to_owned());
            }
            Ok(())
        })?;
        out.sort();
        Ok(out)
    }

    /// Calls `visit(path, kind)` for every node below directory `dir`, depth first, down
    /// to `depth_max` levels. Symlinks are visited, never followed.
    pub(crate) fn walk(
        &self,
        dir: &str,
        depth_max: usize,
        visit: &mut dyn FnMut(&str, FileKind) -> Result<()>,
    ) -> Result<()> {
        let mut stack: Vec<(String, usize)> = vec![(dir.to_owned(), 0)];
        while let Some((path, depth)) = stack.pop() {
            if depth >= depth_max {
                continue;
            }
            let entries = match self.readdir(&path) {
                Ok(entries) => entries,
                // Removed while we walked: nothing to visit there.
                Err(Error::NotFound(_)) => continue,
                Err(e) => return Err(e),
            };
            for entry in entries.iter().rev() {
                let child = join(&path, &entry.name_lossy());
                visit(&child, entry.kind)?;
                if entry.kind == FileKind::Directory {
                    stack.push((child, depth + 1));
                }
            }
        }
        Ok(())
    }

    /// Lines matching `pattern` in the file at `path` or in every file below it, like
    /// `grep -rn`. Binary files (a NUL in their first 8 KiB) are skipped.
    pub fn grep(&self, pattern: &str, path: &str, options: &GrepOptions) -> Result<Vec<GrepMatch>> {
        let source = if options.regex {
            pattern.to_owned()
        } else {
            regex::escape(pattern)
        };
        let regex = RegexBuilder::new(&source)
            .case_insensitive(options.ignore_case)
            .size_limit(1 << 22)
            .build()
            .map_err(|_| Error::invalid("bad regular expression").at(pattern))?;
        let include = options.include.as_deref().map(glob_matcher).transpose()?;
        let limit = options.max_matches.unwrap_or(usize::MAX);
        let mut out = Vec::new();
        let attr = self.stat(path)?;
        let wanted = |file: &str| match &include {
            Some(m) => m.is_match(file.rsplit('/').next().unwrap_or(file)),
            None => true,
        };
        if !attr.is_dir() {
            if attr.kind != FileKind::File {
                return Err(Error::invalid("not a regular file").at(path));
            }
            self.grep_file(&regex, path, limit, &mut out)?;
            return Ok(out);
        }
        let mut files = Vec::new();
        self.walk(path, usize::MAX, &mut |p, k| {
            if k == FileKind::File && wanted(p) {
                files.push(p.to_owned());
            }
            Ok(())
        })?;
        for file in files {
            if out.len() >= limit {
                break;
            }
            match self.grep_file(&regex, &file, limit, &mut out) {
                Ok(()) | Err(Error::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    fn grep_file(
        &self,
        regex: &Regex,
        path: &str,
        limit: usize,
        out: &mut Vec<GrepMatch>,
    ) -> Result<()> {
        let mut reader = self.open_read(path)?;
        let mut buf = vec![0u8; 256 << 10];
        let mut line: Vec<u8> = Vec::new();
        let mut line_number = 0u64;
        let mut probed = 0usize;
        let check = |line: &[u8], number: u64, out: &mut Vec<GrepMatch>| {
            if regex.is_match(line) {
                out.push(GrepMatch {
                    path: path.to_owned(),
                    line_number: number,
                    line: String::from_utf8_lossy(line).into_owned(),
                });
            }
        };
        loop {
            let n = reader.read(&mut buf).map_err(|e| Error::io(path, e))?;
            if n == 0 {
                break;
            }
            let chunk = &buf[..n];
            if probed < BINARY_PROBE {
                let probe = &chunk[..chunk.len().min(BINARY_PROBE - probed)];
                if probe.contains(&0) {
                    return Ok(());
                }
                probed += probe.len();
            }
            let mut rest = chunk;
            while let Some(at) = rest.iter().position(|&b| b == b'\n') {
                let piece = &rest[..at];
                let room = GREP_LINE_MAX.saturating_sub(line.len());
                line.extend_from_slice(&piece[..piece.len().min(room)]);
                line_number += 1;
                check(&line, line_number, out);
                if out.len() >= limit {
                    return Ok(());
                }
                line.clear();
                rest = &rest[at + 1..];
            }
            let room = GREP_LINE_MAX.saturating_sub(line.len());
            line.extend_from_slice(&rest[..rest.len().min(room)]);
        }
        if !line.is_empty() {
            line_number += 1;
            check(&line, line_number, out);
        }
        let _ = kind::NotFound;
        Ok(())
    }
}
