//! Running shell commands: timed, killable on Ctrl-C, failures reported with their stderr.
//!
//! Every child runs in its own process group. A terminal's Ctrl-C therefore reaches only the
//! harness, whose signal handler records the interrupt and kills the current child's group;
//! the harness then unwinds normally, so its guards unmount what it mounted.

use std::fmt::Write as _;
use std::io::Read as _;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);
/// Process group of the running child (its pid), or 0.
static CHILD_PGID: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(_signal: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
    let pgid = CHILD_PGID.load(Ordering::SeqCst);
    if pgid > 0 {
        // SAFETY: kill(2) is async-signal-safe.
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
    }
}

/// Routes SIGINT, SIGTERM and SIGHUP to [`interrupted`] (and kills the running child).
pub fn install_signal_handlers() -> Result<()> {
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for signal in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler only touches atomics and calls kill(2).
        unsafe { sigaction(signal, &action) }
            .with_context(|| format!("installing a handler for {signal}"))?;
    }
    Ok(())
}

/// Whether a SIGINT/SIGTERM/SIGHUP arrived.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Fails with "interrupted" once a signal arrived.
pub fn check_interrupted() -> Result<()> {
    if interrupted() {
        bail!("interrupted");
    }
    Ok(())
}

/// Environment every child gets: a stable locale, no npm update checks, no git prompts.
const CHILD_ENV: &[(&str, &str)] = &[
    ("LC_ALL", "C"),
    ("npm_config_update_notifier", "false"),
    ("NO_UPDATE_NOTIFIER", "1"),
    ("GIT_TERMINAL_PROMPT", "0"),
];

/// Runs `script` with `bash -c` in `cwd`; stdout is discarded, stderr kept for errors.
/// Returns the wall time from spawn to exit. A non-zero exit is an error that carries the
/// exit status and the tail of stderr.
pub fn run_bash(script: &str, cwd: &Path) -> Result<Duration> {
    let mut cmd = Command::new("bash");
    cmd.arg("-c").arg(script).current_dir(cwd);
    run(cmd, &format!("bash -c in {}", cwd.display()))
}

/// Runs a prepared command (stdin and stdout null, stderr captured) in its own process
/// group, timed. See [`run_bash`].
pub fn run(mut cmd: Command, what: &str) -> Result<Duration> {
    check_interrupted()?;
    cmd.envs(CHILD_ENV.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0);
    let start = Instant::now();
    let mut child = cmd.spawn().with_context(|| format!("spawning {what}"))?;
    let pid = i32::try_from(child.id()).context("child pid out of range")?;
    CHILD_PGID.store(pid, Ordering::SeqCst);
    if interrupted() {
        // The signal came between spawn and the store above.
        // SAFETY: plain kill(2) of the group we just created.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
    let mut stderr = Vec::new();
    if let Some(mut pipe) = child.stderr.take() {
        // Read errors only lose diagnostics; the exit status still decides.
        let _ = pipe.read_to_end(&mut stderr);
    }
    let status = child.wait();
    let elapsed = start.elapsed();
    CHILD_PGID.store(0, Ordering::SeqCst);
    let status = status.with_context(|| format!("waiting for {what}"))?;
    check_interrupted()?;
    if !status.success() {
        bail!("{} failed: {}", what, describe_failure(status, &stderr));
    }
    Ok(elapsed)
}

/// "exit status 1; stderr: ..." with the last lines of stderr.
pub fn describe_failure(status: ExitStatus, stderr: &[u8]) -> String {
    let mut out = status.to_string();
    let tail = tail(&String::from_utf8_lossy(stderr), 15, 2000);
    if tail.is_empty() {
        out.push_str("; stderr empty");
    } else {
        let _ = write!(out, "; stderr tail:\n{tail}");
    }
    out
}

/// The last `lines` lines of `text`, at most `max_chars` characters, each indented.
pub fn tail(text: &str, lines: usize, max_chars: usize) -> String {
    let all: Vec<&str> = text.trim_end().lines().collect();
    let kept = &all[all.len().saturating_sub(lines)..];
    let mut joined = kept
        .iter()
        .map(|l| format!("    | {l}"))
        .collect::<Vec<_>>()
        .join("\n");
    if joined.chars().count() > max_chars {
        let skip = joined.chars().count() - max_chars;
        joined = format!("    | ...{}", joined.chars().skip(skip).collect::<String>());
    }
    joined
}

/// Quotes `s` for a POSIX shell.
pub fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// [`shell_quote`] of a path.
pub fn quote_path(p: &Path) -> String {
    shell_quote(&p.to_string_lossy())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("/tmp/a-b_c.d"), "/tmp/a-b_c.d");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    #[test]
    fn failure_keeps_stderr_tail() {
        let dir = tempfile::tempdir().unwrap();
        let err = run_bash("echo one >&2; echo two >&2; exit 3", dir.path()).unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains("exit status: 3"), "{msg}");
        assert!(msg.contains("| two"), "{msg}");
    }

    #[test]
    fn success_is_timed() {
        let dir = tempfile::tempdir().unwrap();
        let d = run_bash("sleep 0.05", dir.path()).unwrap();
        assert!(d >= Duration::from_millis(50));
    }
}
