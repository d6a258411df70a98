//! The audit record of each exec: who asked, what, on which backend and why, and how it
//! ended; and of each exec refused before it ran. The spine hands records to an
//! [`AuditSink`]; [`WorkspaceAudit`] keeps them in the workspace's own trail (vfs
//! `append_audit`) as one line of JSON each, which `computerd audit` lists.

use serde::{Deserialize, Serialize};

use crate::exec::{ExecResult, ExecStatus, SyncOutcome};

/// The most of a script kept in its record, bytes (the rest is cut, and said so).
pub const AUDIT_SCRIPT_BYTES_MAX: usize = 4 << 10;
/// The most of a free-text field (an error, a reason) kept, bytes.
const AUDIT_TEXT_BYTES_MAX: usize = 4 << 10;

/// What kind of record: an exec that ran, or one refused before it did.
pub const KIND_EXEC: &str = "exec";
pub const KIND_REFUSED: &str = "refused";
/// `auto` sent an exec past a backend that could not run it; the exec's own record
/// follows when it ends.
pub const KIND_ESCALATED: &str = "escalated";
/// A call of one of the file tools (`crate::tools`).
pub const KIND_TOOL: &str = "tool";

/// One exec, as the trail keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    pub id: String,
    /// Who asked, as the surface that took the request knows them.
    pub caller: String,
    pub backend: String,
    /// Why that backend.
    pub reason: String,
    pub script: String,
    pub cwd: String,
    /// `completed`, `failed`, `cancelled`, `timed out`, or `refused`.
    pub status: String,
    pub exit_code: Option<i32>,
    pub duration_ms: u64,
    /// `complete`, `pending: INTENT`, `lost: REASON`; empty when nothing ran.
    pub sync: String,
    pub error: Option<String>,
}

/// Where the spine hands its records. Keeping one must not fail an exec: a sink that
/// cannot keep a record says so in the log.
pub trait AuditSink: Send + Sync {
    fn keep(&self, kind: &str, entry: &AuditEntry);
}

/// What the spine knows of a request when it records it.
pub(crate) struct Asked<'a> {
    pub id: &'a str,
    pub caller: &'a str,
    pub script: &'a str,
    pub cwd: &'a str,
}

impl AuditEntry {
    pub(crate) fn ran(asked: &Asked<'_>, result: &ExecResult) -> AuditEntry {
        AuditEntry {
            status: status_name(result.status).to_owned(),
            exit_code: Some(result.exit_code),
            duration_ms: result.duration.as_millis() as u64,
            sync: sync_text(&result.sync),
            error: result.error.as_deref().map(bounded),
            ..AuditEntry::asked(asked, &result.backend, &result.reason)
        }
    }

    pub(crate) fn refused(
        asked: &Asked<'_>,
        backend: &str,
        reason: &str,
        error: &crate::Error,
    ) -> AuditEntry {
        AuditEntry {
            status: KIND_REFUSED.to_owned(),
            error: Some(bounded(&error.to_string())),
            ..AuditEntry::asked(asked, backend, reason)
        }
    }

    /// A tool call: what was asked (`read /src/a.rs`), how long it took, its error.
    pub(crate) fn tool(
        caller: &str,
        asked: &str,
        duration: std::time::Duration,
        error: Option<String>,
    ) -> AuditEntry {
        let status = if error.is_some() {
            "failed"
        } else {
            "completed"
        };
        AuditEntry {
            id: "-".into(),
            caller: caller.into(),
            backend: "tools".into(),
            reason: String::new(),
            script: cut(asked, AUDIT_SCRIPT_BYTES_MAX),
            cwd: "/".into(),
            status: status.into(),
            exit_code: None,
            duration_ms: duration.as_millis() as u64,
            sync: "complete".into(),
            error: error.as_deref().map(bounded),
        }
    }

    pub(crate) fn escalated(asked: &Asked<'_>, backend: &str, reason: &str) -> AuditEntry {
        AuditEntry {
            status: KIND_ESCALATED.to_owned(),
            ..AuditEntry::asked(asked, backend, reason)
        }
    }

    fn asked(asked: &Asked<'_>, backend: &str, reason: &str) -> AuditEntry {
        AuditEntry {
            id: asked.id.to_owned(),
            caller: bounded(asked.caller),
            backend: backend.to_owned(),
            reason: bounded(reason),
            script: cut(asked.script, AUDIT_SCRIPT_BYTES_MAX),
            cwd: bounded(asked.cwd),
            status: String::new(),
            exit_code: None,
            duration_ms: 0,
            sync: String::new(),
            error: None,
        }
    }
}

pub fn status_name(status: ExecStatus) -> &'static str {
    match status {
        ExecStatus::Completed => "completed",
        ExecStatus::Failed => "failed",
        ExecStatus::Cancelled => "cancelled",
        ExecStatus::TimedOut => "timed out",
    }
}

/// A sync outcome in one line, as records and answers say it.
pub(crate) fn sync_text(sync: &SyncOutcome) -> String {
    match sync {
        SyncOutcome::Complete => "complete".into(),
        SyncOutcome::Pending { intent, reason } => {
            bounded(&format!("pending: {intent} ({reason})"))
        }
        SyncOutcome::Lost { reason } => bounded(&format!("lost: {reason}")),
    }
}

fn bounded(text: &str) -> String {
    cut(text, AUDIT_TEXT_BYTES_MAX)
}

/// `text` cut to at most `max` bytes on a character boundary, marked when cut.
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes in all)", &text[..end], text.len())
}

/// Keeps records in a workspace's audit trail.
pub struct WorkspaceAudit(pub computer_vfs::Workspace);

impl AuditSink for WorkspaceAudit {
    fn keep(&self, kind: &str, entry: &AuditEntry) {
        let body = match serde_json::to_string(entry) {
            Ok(body) => body,
            Err(err) => {
                tracing::error!(exec = %entry.id, "encoding an audit record: {err}");
                return;
            }
        };
        if let Err(err) = self.0.append_audit(kind, &entry.id, &body) {
            tracing::error!(exec = %entry.id, "keeping an audit record: {err}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_fields_are_cut_on_a_character_boundary_and_say_so() {
        let script = "é".repeat(AUDIT_SCRIPT_BYTES_MAX);
        let kept = cut(&script, AUDIT_SCRIPT_BYTES_MAX);
        assert!(kept.len() < AUDIT_SCRIPT_BYTES_MAX + 40);
        assert!(kept.ends_with(&format!("({} bytes in all)", script.len())));
        assert_eq!(cut("short", 10), "short");
    }
}
