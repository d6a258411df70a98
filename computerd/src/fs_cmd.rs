//! `computerd fs <DB> <command>`: file commands against a workspace database.

use std::process::ExitCode;

use clap::{Args, Subcommand};

#[derive(Args, Debug)]
pub struct FsArgs {
    /// The workspace database.
    pub db: std::path::PathBuf,
    #[command(subcommand)]
    pub command: FsCommand,
}

#[derive(Subcommand, Debug)]
pub enum FsCommand {
    /// Show the workspace's totals.
    Stats,
}

pub fn run(args: FsArgs) -> anyhow::Result<ExitCode> {
    let _ = args;
    anyhow::bail!("not implemented yet")
}
