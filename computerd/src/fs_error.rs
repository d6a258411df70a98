//! Errors of the `fs` commands as the user reads them: one line, a store error in its
//! own words, a host I/O error in the same words (`x: no such file or directory`, not
//! `x: No such ... (os error 2)`), and a closed stdout told apart so that `| head` ends
//! a command quietly.

use std::fmt;
use std::io::{self, Write};

use computer_vfs::Error;

/// A store error as one line: its own message, with host I/O errors in the same words
/// as the store's (`x: no such file or directory`, not `x: No such ... (os error 2)`).
pub fn describe(err: &Error) -> String {
    match err {
        Error::Io { path, source } => match inner_vfs(source) {
            // The store error inside already names its path.
            Some(inner) => describe(inner),
            None => format!("{path}{}", describe_io(source)),
        },
        other => other.to_string(),
    }
}

fn inner_vfs(err: &io::Error) -> Option<&Error> {
    err.get_ref().and_then(|e| e.downcast_ref::<Error>())
}

/// An I/O error in lower case, without the `(os error N)` tail.
pub fn describe_io(err: &io::Error) -> String {
    if let Some(inner) = inner_vfs(err) {
        return describe(inner);
    }
    let text = err.to_string();
    let text = match text.rfind(" (os error ") {
        Some(at) if err.raw_os_error().is_some() => text[..at].to_owned(),
        _ => text,
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(first) if chars.clone().next().is_some_and(|c| c.is_lowercase()) => {
            first.to_lowercase().chain(chars).collect()
        }
        _ => text,
    }
}

/// A store error as an error for `main` to print.
pub fn vfs_err(err: Error) -> anyhow::Error {
    anyhow::Error::msg(describe(&err))
}

/// Writing to stdout failed (a closed pipe ends the command quietly).
#[derive(Debug)]
pub struct StdoutError(io::Error);

impl fmt::Display for StdoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "standard output: {}", describe_io(&self.0))
    }
}

impl std::error::Error for StdoutError {}

pub fn out_err(err: io::Error) -> anyhow::Error {
    anyhow::Error::new(StdoutError(err))
}

pub fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.downcast_ref::<StdoutError>()
        .is_some_and(|e| e.0.kind() == io::ErrorKind::BrokenPipe)
}

/// Prints one error line for a command that goes on with its other paths.
pub fn report(stderr: &mut dyn Write, err: &anyhow::Error) {
    let _ = writeln!(stderr, "computerd: {err}");
}
