//! `computerd init <DB>`: makes a new, empty workspace. The only command that makes one
//! where nothing was (besides `mount` and `serve` of a path that does not exist, which
//! say so), so that a mistyped path never becomes a workspace silently.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::bail;
use clap::Args;
use computer_vfs::{Options, Workspace};

use crate::owner::{Holder, OwnerLock, Role};

#[derive(Args, Debug)]
pub struct InitArgs {
    /// Where the new workspace database goes (it must not exist).
    pub db: PathBuf,
}

pub fn run(args: InitArgs) -> anyhow::Result<ExitCode> {
    let db = &args.db;
    if db.symlink_metadata().is_ok() {
        bail!(
            "{}: file exists; init makes a workspace only where there is nothing",
            db.display()
        );
    }
    let holder = Holder::me(Role::Command {
        name: "init".into(),
    });
    let _owner = match OwnerLock::acquire(db, holder, false, Holder::will_leave)? {
        Ok(lock) => lock,
        Err(other) => return Err(crate::owner::held_error(db, &other)),
    };
    let options = Options {
        create: true,
        ..Options::default()
    };
    let ws = Workspace::open(db, options).map_err(crate::fs_error::vfs_err)?;
    println!("made workspace {} at {}", ws.id(), db.display());
    Ok(ExitCode::SUCCESS)
}

/// Says on stderr that `mount` or `serve` is about to make a workspace at `db`, which
/// does not exist yet.
pub fn announce_new(db: &std::path::Path) {
    if db.symlink_metadata().is_err() {
        crate::notice::notice!(
            "computerd: {}: no such file; making a new workspace there",
            db.display()
        );
    }
}
