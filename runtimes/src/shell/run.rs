//! One exec on the shell: a thread of its own with a single-threaded tokio runtime
//! running bashkit, its output written to pipes as it is produced (the spine reads
//! them as it reads a process's), and the [`Process`] that waits for it and stops it.
//!
//! Stopping: bashkit checks its cancel flag between commands, and a command that
//! waits (`sleep`, a pipe) is stopped by dropping the exec's future, which the runtime
//! does at its next await; the store operation under way (each is one transaction)
//! finishes first. The exit status of a stopped exec is 128 + the signal.

use std::io::{PipeWriter, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use bashkit::{Bash, ExecOptions, StreamData};
use tokio::sync::watch;

use crate::backend::{signal_of, Process, Spawned};
use crate::error::{Error, Result};

/// Exit status of an exec that hit one of the shell's limits.
pub const EXIT_LIMIT: i32 = 125;
/// Exit status of a script that does not parse (bash's).
const EXIT_SYNTAX: i32 = 2;
/// The most stdin one exec reads, bytes (what the wire carries).
const STDIN_BYTES_MAX: u64 = 64 << 20;

/// The exec's output pipes, with what the streaming callback already wrote.
struct Output {
    stdout: Option<PipeWriter>,
    stderr: Option<PipeWriter>,
    stdout_sent: usize,
    stderr_sent: usize,
}

impl Output {
    fn stream(&mut self, stdout: &StreamData, stderr: &StreamData) {
        self.stdout_sent += stdout.len();
        self.stderr_sent += stderr.len();
        write_all(&mut self.stdout, stdout.as_bytes());
        write_all(&mut self.stderr, stderr.as_bytes());
    }

    /// What the final result holds beyond what was streamed (the callback sees each
    /// top-level command's output; the result has it all).
    fn finish(&mut self, result: &bashkit::ExecResult) {
        let stdout = result.stdout.as_bytes();
        let stderr = result.stderr.as_bytes();
        write_all(
            &mut self.stdout,
            stdout.get(self.stdout_sent..).unwrap_or_default(),
        );
        write_all(
            &mut self.stderr,
            stderr.get(self.stderr_sent..).unwrap_or_default(),
        );
        self.stdout_sent = stdout.len();
        self.stderr_sent = stderr.len();
    }

    fn say(&mut self, line: &str) {
        write_all(&mut self.stderr, format!("{line}\n").as_bytes());
    }
}

/// A reader that went away (the exec was detached) is not the command's error.
fn write_all(pipe: &mut Option<PipeWriter>, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    if let Some(writer) = pipe {
        if writer.write_all(bytes).is_err() {
            *pipe = None;
        }
    }
}

/// The running exec, as the spine sees a process.
pub(crate) struct ShellProcess {
    exit: Mutex<Option<i32>>,
    ended: Condvar,
    /// bashkit's flag, checked between commands.
    cancel: Arc<AtomicBool>,
    /// The signal that stopped it; wakes the thread out of a waiting command.
    stop: watch::Sender<Option<i32>>,
}

impl ShellProcess {
    fn end(&self, code: i32) {
        *self.exit.lock().unwrap_or_else(|e| e.into_inner()) = Some(code);
        self.ended.notify_all();
    }
}

impl Process for ShellProcess {
    fn signal(&self, signal: i32) -> Result<()> {
        let signal = signal_of(signal)?;
        use nix::sys::signal::Signal::*;
        if matches!(signal, SIGCHLD | SIGCONT | SIGURG | SIGWINCH) {
            return Ok(()); // ignored by default, as by a process
        }
        if matches!(signal, SIGSTOP | SIGTSTP | SIGTTIN | SIGTTOU) {
            return Err(Error::Invalid(format!(
                "{signal}: the shell backend cannot pause a command"
            )));
        }
        self.cancel.store(true, Ordering::SeqCst);
        self.stop.send_if_modified(|stop| {
            let first = stop.is_none();
            stop.get_or_insert(signal as i32);
            first
        });
        Ok(())
    }

    fn kill_all(&self) -> Result<()> {
        self.signal(libc::SIGKILL)
    }

    fn wait(&self) -> Result<i32> {
        let mut exit = self.exit.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(code) = *exit {
                return Ok(code);
            }
            exit = self.ended.wait(exit).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Starts `script` on `bash` on a thread of its own.
pub(crate) fn start(bash: Bash, script: String, exec_id: &str) -> Result<Spawned> {
    let pipes = || std::io::pipe().map_err(Error::io("making the shell's pipes"));
    let (stdin_reader, stdin) = pipes()?;
    let (stdout, stdout_writer) = pipes()?;
    let (stderr, stderr_writer) = pipes()?;
    let (stop, stopped) = watch::channel(None);
    let process = Arc::new(ShellProcess {
        exit: Mutex::new(None),
        ended: Condvar::new(),
        cancel: bash.cancellation_token(),
        stop,
    });
    let output = Output {
        stdout: Some(stdout_writer),
        stderr: Some(stderr_writer),
        stdout_sent: 0,
        stderr_sent: 0,
    };
    let running = process.clone();
    std::thread::Builder::new()
        .name(format!("shell-{exec_id}"))
        .spawn(move || {
            let code = run(bash, &script, stdin_reader, output, stopped);
            running.end(code);
        })
        .map_err(Error::io("starting the shell's thread"))?;
    Ok(Spawned::in_process(stdin, stdout, stderr, process))
}

/// Runs the exec to its end; its exit status.
fn run(
    mut bash: Bash,
    script: &str,
    stdin: std::io::PipeReader,
    output: Output,
    mut stopped: watch::Receiver<Option<i32>>,
) -> i32 {
    let output = Arc::new(Mutex::new(output));
    let mut input = Vec::new();
    if let Err(err) = stdin.take(STDIN_BYTES_MAX).read_to_end(&mut input) {
        lock(&output).say(&format!("shell: reading standard input: {err}"));
        return 1;
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            lock(&output).say(&format!("shell: starting its runtime: {err}"));
            return 1;
        }
    };
    let streaming = output.clone();
    let options = ExecOptions::new()
        .stdin(input)
        .streaming(Box::new(move |out, err| lock(&streaming).stream(out, err)));
    let ran = runtime.block_on(async {
        tokio::select! {
            ran = bash.exec_with_options(script, options) => Ok(ran),
            signal = stopped.wait_for(Option::is_some) => {
                Err(signal.map_or(libc::SIGKILL, |s| s.unwrap_or(libc::SIGKILL)))
            }
        }
    });
    let stopped_by = *stopped.borrow();
    let mut output = lock(&output);
    match (ran, stopped_by) {
        (_, Some(signal)) | (Err(signal), None) => 128 + signal,
        (Ok(Ok(result)), None) => {
            output.finish(&result);
            if result.stdout_truncated || result.stderr_truncated {
                output.say(
                    "shell: limit reached: output beyond the policy's shell.output_mib was cut",
                );
                return EXIT_LIMIT;
            }
            result.exit_code
        }
        (Ok(Err(err)), None) => failure(&mut output, err),
    }
}

/// The exit status and message of an exec bashkit could not finish.
fn failure(output: &mut Output, err: bashkit::Error) -> i32 {
    match err {
        bashkit::Error::Parse { message, line, .. } => {
            output.say(&format!("shell: line {line}: syntax error: {message}"));
            EXIT_SYNTAX
        }
        bashkit::Error::ResourceLimit(limit) => {
            output.say(&format!(
                "shell: limit reached: {limit} (the policy's [shell] table sets the limits)"
            ));
            EXIT_LIMIT
        }
        other => {
            output.say(&format!("shell: {}", one_line(&other.to_string())));
            1
        }
    }
}

fn one_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default()
}

fn lock(output: &Mutex<Output>) -> std::sync::MutexGuard<'_, Output> {
    output.lock().unwrap_or_else(|e| e.into_inner())
}
