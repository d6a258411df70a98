//! `computerd status [--json]`: the mounts and servers running on this machine (as the
//! runtime directory of `registry.rs` lists them), each with its database, where it
//! answers, its pid and phase, a mount's transport (io_uring or /dev/fuse), the
//! database's revision and files waiting for ingestion, and for a replica mount the
//! state of its sync loop.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use computer_vfs::{Options, Workspace};

use crate::fs_format::json_string;
use crate::owner::{self, Holder, Role};
use crate::registry;
use crate::replica::SyncState;

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// One JSON array, an object per mount or server.
    #[arg(long)]
    json: bool,
}

/// One running mount or server.
struct Running {
    holder: Holder,
    db: PathBuf,
    /// Revision and staged files; `None` if the database could not be read.
    store: Option<(u64, u64)>,
    /// A replica mount's sync loop, as `computerd sync`'s control socket tells it.
    sync: Option<SyncState>,
}

pub fn run(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let running: Vec<Running> = registry::entries()
        .into_iter()
        .filter_map(|entry| {
            let found = live(&entry.db, entry.pid);
            if found.is_none() {
                // Its process is gone (or owns the database no more).
                let _ = std::fs::remove_file(&entry.file);
            }
            found
        })
        .collect();
    let text = if args.json {
        json(&running)
    } else {
        table(&running)
    };
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}

/// What `pid` does with `db`, if it still owns it.
fn live(db: &Path, pid: u32) -> Option<Running> {
    if !owner::is_held(db) {
        return None;
    }
    let holder = owner::read_holder(&owner::owner_path(db)).filter(|h| h.pid == pid)?;
    let replica = matches!(holder.role, Role::Mount { replica: true, .. });
    Some(Running {
        store: store_state(db),
        sync: replica.then(|| crate::replica::sync_status(db)).flatten(),
        holder,
        db: db.to_owned(),
    })
}

/// The revision and staged files of `db`, read beside its owner.
fn store_state(db: &Path) -> Option<(u64, u64)> {
    let options = Options {
        create: false,
        read_only: true,
        ..Options::default()
    };
    let ws = Workspace::open(db, options).ok()?;
    Some((ws.revision().ok()?.0, ws.staged_files().ok()?))
}

fn sync_summary(sync: &SyncState) -> String {
    let mut text = if sync.field("replaced") == "1" {
        "replaced by another replica".to_owned()
    } else if sync.field("connected") == "1" {
        format!("connected, {} syncs", sync.field("syncs"))
    } else {
        format!("disconnected, {} failures", sync.field("failures"))
    };
    text += &format!(", {} changes waiting", sync.field("backlog_nodes"));
    if sync.field("held_back") == "1" {
        text += ", writers held back";
    }
    if let Some(error) = &sync.last_error {
        text += &format!(" ({error})");
    }
    text
}

fn table(running: &[Running]) -> String {
    if running.is_empty() {
        return "no computerd mounts or servers running\n".to_owned();
    }
    let header = [
        "PID",
        "ROLE",
        "DATABASE",
        "AT",
        "PHASE",
        "TRANSPORT",
        "REVISION",
        "STAGED",
        "SYNC",
    ];
    let rows: Vec<[String; 9]> = running
        .iter()
        .map(|r| {
            let (revision, staged) = match r.store {
                Some((revision, staged)) => (revision.to_string(), staged.to_string()),
                None => ("?".into(), "?".into()),
            };
            [
                r.holder.pid.to_string(),
                r.holder.role.name().into(),
                r.db.display().to_string(),
                r.holder.role.at(),
                r.holder.phase.name().into(),
                r.holder.transport.clone().unwrap_or_else(|| "-".into()),
                revision,
                staged,
                r.sync.as_ref().map_or("-".into(), sync_summary),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: &[&str]| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                out += cell;
            } else {
                out += &format!("{cell:<width$}  ", width = widths[i]);
            }
        }
        out.trim_end().to_owned() + "\n"
    };
    let mut out = line(&header);
    for row in &rows {
        out += &line(&row.each_ref().map(String::as_str));
    }
    out
}

fn json(running: &[Running]) -> String {
    let objects: Vec<String> = running
        .iter()
        .map(|r| {
            let (revision, staged) = match r.store {
                Some((revision, staged)) => (revision.to_string(), staged.to_string()),
                None => ("null".into(), "null".into()),
            };
            let sync = r.sync.as_ref().map_or("null".into(), |s| {
                let flag = |key: &str| if s.field(key) == "1" { "true" } else { "false" };
                let number = |key: &str| {
                    let value = s.field(key);
                    if value.parse::<u64>().is_ok() {
                        value.to_owned()
                    } else {
                        "null".to_owned()
                    }
                };
                format!(
                    "{{\"connected\":{},\"failures\":{},\"syncs\":{},\"backlog_nodes\":{},\
                     \"backlog_bytes\":{},\"held_back\":{},\"replaced\":{},\"last_error\":{}}}",
                    flag("connected"),
                    number("failures"),
                    number("syncs"),
                    number("backlog_nodes"),
                    number("backlog_bytes"),
                    flag("held_back"),
                    flag("replaced"),
                    s.last_error.as_deref().map_or("null".into(), json_string),
                )
            });
            format!(
                "{{\"pid\":{},\"role\":\"{}\",\"database\":{},\"at\":{},\"phase\":\"{}\",\
                 \"transport\":{},\"revision\":{revision},\"staged_files\":{staged},\
                 \"sync\":{sync}}}",
                r.holder.pid,
                r.holder.role.name(),
                json_string(&r.db.display().to_string()),
                json_string(&r.holder.role.at()),
                r.holder.phase.name(),
                r.holder
                    .transport
                    .as_deref()
                    .map_or("null".into(), json_string),
            )
        })
        .collect();
    format!("[{}]\n", objects.join(","))
}
