//! `computerd audit DB|--remote ADDR`: lists the workspace's audit trail, one record per
//! exec asked of it (run or refused), oldest first; `--json` prints each as one line of
//! JSON (the record's own fields, with `seq`, `at` and `kind`).
//!
//! A local database is read beside its owner, if it has one (records are committed as
//! they are kept); a served one through its server's runner.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use computer_runtimes::AuditEntry;
use computer_sync::rpc::Address;
use computer_vfs::{AuditRecord, Options, Workspace};

use crate::exec_wire::{self, AUDIT_RECORDS_PER_CALL_MAX};
use crate::fs_files::{connection_error, RemoteFiles};
use crate::fs_format::{json_string, rfc3339_ns};

#[derive(clap::Args, Debug)]
pub struct AuditArgs {
    /// The workspace database (or give --remote).
    #[arg(
        value_name = "DB",
        required_unless_present = "remote",
        conflicts_with = "remote"
    )]
    db: Option<PathBuf>,
    /// The workspace served at ADDR (a Unix socket path, or tcp:HOST:PORT).
    #[arg(long, value_name = "ADDR")]
    remote: Option<String>,
    /// With --remote: the file holding the server's token (else $COMPUTERD_TOKEN).
    #[arg(long, value_name = "FILE", requires = "remote")]
    token_file: Option<PathBuf>,
    /// The newest this many records.
    #[arg(long, default_value_t = 100, value_name = "N")]
    limit: u32,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
}

pub fn run(args: AuditArgs) -> anyhow::Result<ExitCode> {
    let limit = args.limit.min(AUDIT_RECORDS_PER_CALL_MAX);
    let records = match (&args.db, &args.remote) {
        (Some(db), _) => local(db, limit)?,
        (None, Some(remote)) => remote_records(remote, args.token_file.as_deref(), limit)?,
        (None, None) => unreachable!("clap requires DB or --remote"),
    };
    let mut out = std::io::stdout().lock();
    for record in &records {
        let line = match args.json {
            true => json_line(record),
            false => text_line(record),
        };
        if writeln!(out, "{line}").is_err() {
            break;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn local(db: &std::path::Path, limit: u32) -> anyhow::Result<Vec<AuditRecord>> {
    let options = Options {
        create: false,
        read_only: true,
        ..Options::default()
    };
    let ws = Workspace::open(db, options).map_err(crate::fs_error::vfs_err)?;
    ws.audit_records(0, limit as usize)
        .with_context(|| format!("{}: reading the audit trail", db.display()))
}

fn remote_records(
    remote: &str,
    token_file: Option<&std::path::Path>,
    limit: u32,
) -> anyhow::Result<Vec<AuditRecord>> {
    let address: Address = crate::remote::address(remote)?;
    let token = crate::remote::read_token(token_file)?;
    let files = RemoteFiles::connect(&address, &token)?;
    let upstream = files.upstream().clone();
    let asked = files.block_on(async move {
        let runner = upstream.runner().await?;
        let mut request = runner.audit_request();
        request.get().set_after_seq(0);
        request.get().set_limit(limit);
        let answer = upstream.answer(request.send().promise).await?;
        let mut records = Vec::new();
        for item in answer.get()?.get_records()? {
            records.push(exec_wire::read_audit(item)?);
        }
        Ok::<_, computer_sync::Error>(records)
    });
    asked.map_err(|err| connection_error(&address, err))
}

/// `2026-12-03T17:50:01.123Z  x12-3  completed 0  linux  uid 0 pid 42  0.021s  complete  SCRIPT`
fn text_line(record: &AuditRecord) -> String {
    let at = rfc3339_ns(record.at_ms * 1_000_000);
    let Ok(entry) = serde_json::from_str::<AuditEntry>(&record.body) else {
        return format!("{at}  {}  {}  {}", record.subject, record.kind, record.body);
    };
    let outcome = match entry.exit_code {
        Some(code) => format!("{} {code}", entry.status),
        None => entry.status.clone(),
    };
    let mut line = format!(
        "{at}  {}  {outcome}  {}  {}  {:.3}s",
        entry.id,
        if entry.backend.is_empty() {
            "-"
        } else {
            &entry.backend
        },
        entry.caller,
        entry.duration_ms as f64 / 1000.0,
    );
    if !entry.sync.is_empty() {
        line += &format!("  sync {}", entry.sync);
    }
    line += &format!("  {}", json_string(&entry.script));
    if let Some(error) = &entry.error {
        line += &format!("  ({error})");
    }
    line
}

/// The record's body with its place in the trail added.
fn json_line(record: &AuditRecord) -> String {
    let mut value: serde_json::Value = serde_json::from_str(&record.body)
        .unwrap_or_else(|_| serde_json::Value::String(record.body.clone()));
    let fields = [
        ("seq", serde_json::json!(record.seq)),
        (
            "at",
            serde_json::json!(rfc3339_ns(record.at_ms * 1_000_000)),
        ),
        ("kind", serde_json::json!(record.kind)),
    ];
    match value.as_object_mut() {
        Some(object) => {
            for (name, field) in fields {
                object.insert(name.to_owned(), field);
            }
        }
        None => {
            value = serde_json::json!({"seq": record.seq, "kind": record.kind, "body": value});
        }
    }
    value.to_string()
}
