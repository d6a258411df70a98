//! The `exec` tool: its arguments as an agent host passes them, turned into an exec of
//! the spine, and the answer a model reads once the command ended: how it ended, what
//! it printed (bounded, the start and the end kept) and where its changes are.

use std::collections::BTreeMap;
use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;

use crate::audit::{status_name, sync_text};
use crate::error::{Error, Result};
use crate::exec::{Event, ExecOptions, ExecResult, Stream};
use crate::js::JS_BACKEND_ID;

/// Bytes of each output stream the answer keeps: the first half and the last half of
/// this, with a line saying how much between them was left out.
pub const TRANSCRIPT_STREAM_BYTES_MAX: usize = 128 << 10;

/// `exec`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecArgs {
    /// The command line, run by bash (`cargo test 2>&1 | tail -20`). For the `js`
    /// backend, the source of an ES module (`export default async (input) => ...`).
    pub command: String,
    /// The backend to run it (default: the server's default); the description lists
    /// them.
    #[serde(default)]
    pub backend: Option<String>,
    /// The working directory, a workspace path (default: its root).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Seconds after which the command is stopped (SIGTERM, then SIGKILL).
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
    /// For `js`: the JSON value the module's default export gets. For the others: text
    /// the command reads on its standard input.
    #[serde(default)]
    pub input: Option<serde_json::Value>,
    /// Environment variables for the command (the server's policy says which pass).
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
}

impl ExecArgs {
    /// The script and the options of the exec these arguments ask for.
    pub fn into_exec(self, caller: &str) -> Result<(String, ExecOptions)> {
        let timeout = self
            .timeout_seconds
            .map(|seconds| {
                Duration::try_from_secs_f64(seconds)
                    .ok()
                    .filter(|t| !t.is_zero())
                    .ok_or_else(|| {
                        Error::Invalid(format!(
                            "exec: timeout_seconds {seconds}: not a positive number of seconds"
                        ))
                    })
            })
            .transpose()?;
        let js = self.backend.as_deref() == Some(JS_BACKEND_ID);
        let stdin = self.input.map(|input| match input {
            serde_json::Value::String(text) if !js => text.into_bytes(),
            value => value.to_string().into_bytes(),
        });
        let options = ExecOptions {
            backend: self.backend,
            cwd: self.cwd,
            stdin,
            env: self.env.unwrap_or_default().into_iter().collect(),
            timeout,
            id: None,
            caller: Some(caller.to_owned()),
        };
        Ok((self.command, options))
    }
}

/// A command's output as it arrives, each stream bounded by
/// [`TRANSCRIPT_STREAM_BYTES_MAX`], and the answer made of it at the end.
#[derive(Debug, Default)]
pub struct Transcript {
    stdout: Kept,
    stderr: Kept,
    /// Output events the exec's log dropped before they were read.
    missed: u64,
}

/// One stream: its start, its latest end, and how many bytes fell between.
#[derive(Debug, Default)]
struct Kept {
    head: Vec<u8>,
    tail: std::collections::VecDeque<u8>,
    dropped: u64,
}

impl Kept {
    fn push(&mut self, mut data: &[u8]) {
        let half = TRANSCRIPT_STREAM_BYTES_MAX / 2;
        let room = half - self.head.len();
        let into_head = room.min(data.len());
        self.head.extend_from_slice(&data[..into_head]);
        data = &data[into_head..];
        self.tail.extend(data);
        let over = self.tail.len().saturating_sub(half);
        self.tail.drain(..over);
        self.dropped += over as u64;
    }

    fn text(&self) -> String {
        let mut text = String::from_utf8_lossy(&self.head).into_owned();
        if self.dropped > 0 {
            text.push_str(&format!("\n[{} bytes left out]\n", self.dropped));
        }
        let (front, back) = self.tail.as_slices();
        text.push_str(&String::from_utf8_lossy(&[front, back].concat()));
        text
    }

    fn is_empty(&self) -> bool {
        self.head.is_empty()
    }
}

impl Transcript {
    /// Takes one event of the exec; the exit event's result is the caller's to keep.
    pub fn push(&mut self, event: &Event) {
        match event {
            Event::Output { stream, data, .. } => match stream {
                Stream::Stdout => self.stdout.push(data),
                Stream::Stderr => self.stderr.push(data),
            },
            Event::Missed { first, next } => self.missed += next - first,
            Event::Exit { .. } => {}
        }
    }

    /// What a model reads: one line of how it ended (the backend that ran it and why),
    /// the value of a callable backend, then each stream that printed anything.
    pub fn answer(&self, result: &ExecResult) -> String {
        let why = match result.reason.as_str() {
            "" => String::new(),
            reason => format!(" ({reason})"),
        };
        let mut text = format!(
            "exit {} ({}) on {}{why} in {} ms; sync: {}\n",
            result.exit_code,
            status_name(result.status),
            result.backend,
            result.duration.as_millis(),
            sync_text(&result.sync)
        );
        if let Some(error) = &result.error {
            text.push_str(&format!("error: {error}\n"));
        }
        if let Some(value) = &result.value {
            text.push_str(&format!("value: {value}\n"));
        }
        if self.missed > 0 {
            text.push_str(&format!(
                "[{} chunks of output were dropped before they were read]\n",
                self.missed
            ));
        }
        for (name, kept) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
            if !kept.is_empty() {
                text.push_str(&format!("--- {name} ---\n{}", kept.text()));
                if !text.ends_with('\n') {
                    text.push('\n');
                }
            }
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::{ExecStatus, SyncOutcome};

    fn output(stream: Stream, data: &[u8]) -> Event {
        Event::Output {
            seq: 0,
            stream,
            data: data.to_vec(),
        }
    }

    fn result(value: Option<&str>) -> ExecResult {
        ExecResult {
            status: ExecStatus::Completed,
            exit_code: 0,
            duration: Duration::from_millis(7),
            backend: "shell".into(),
            reason: "asked for by the caller".into(),
            sync: SyncOutcome::Complete,
            error: None,
            value: value.map(str::to_owned),
        }
    }

    #[test]
    fn the_answer_keeps_the_start_and_the_end_of_long_output() {
        let mut transcript = Transcript::default();
        let chunk = vec![b'x'; 4096];
        transcript.push(&output(Stream::Stdout, b"first line\n"));
        for _ in 0..100 {
            transcript.push(&output(Stream::Stdout, &chunk));
        }
        transcript.push(&output(Stream::Stdout, b"\nlast line\n"));
        transcript.push(&output(Stream::Stderr, b"warning\n"));
        let answer = transcript.answer(&result(None));
        assert!(
            answer.starts_with(
                "exit 0 (completed) on shell (asked for by the caller) in 7 ms; sync: complete\n--- stdout ---\nfirst line\n"
            ),
            "{}",
            &answer[..200]
        );
        assert!(answer.ends_with("last line\n--- stderr ---\nwarning\n"));
        let total = 11 + 100 * 4096 + 11;
        let left_out = total - TRANSCRIPT_STREAM_BYTES_MAX;
        assert!(answer.contains(&format!("\n[{left_out} bytes left out]\n")));
        assert!(answer.len() < TRANSCRIPT_STREAM_BYTES_MAX + 200);
    }

    #[test]
    fn a_callable_backend_answers_with_its_value_and_input_is_json() {
        let answer = Transcript::default().answer(&result(Some("{\"n\":3}")));
        assert_eq!(
            answer,
            "exit 0 (completed) on shell (asked for by the caller) in 7 ms; sync: complete\nvalue: {\"n\":3}\n"
        );
        let args: ExecArgs = serde_json::from_str(
            r#"{"command": "export default (x) => x", "backend": "js", "input": "hi"}"#,
        )
        .unwrap();
        let (_, options) = args.into_exec("agent").unwrap();
        assert_eq!(options.stdin.as_deref(), Some(&b"\"hi\""[..]));
        let args: ExecArgs =
            serde_json::from_str(r#"{"command": "cat", "input": "hi", "timeout_seconds": -1}"#)
                .unwrap();
        let err = args.into_exec("agent").unwrap_err();
        assert!(err.to_string().contains("timeout_seconds -1"), "{err}");
    }
}
