//! `computerd`: mounts a workspace as a Linux filesystem and works on workspace databases.
//!
//! `main` only parses arguments and dispatches; each subcommand lives in its own module.

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

mod audit;
mod channel;
mod exec;
mod exec_wire;
mod fs_args;
mod fs_cmd;
mod fs_error;
mod fs_files;
mod fs_format;
mod fs_ls;
mod fs_ops;
mod fs_progress;
mod fs_store;
mod fs_walk;
mod fuse;
mod fuse_reply;
mod fuse_ring;
mod init;
mod kernel_pages;
mod manual;
mod mcp;
mod mount;
mod mounts;
mod notice;
mod owner;
#[cfg(test)]
mod owner_model;
mod poll;
mod registry;
mod remote;
mod replica;
mod serve;
mod serve_exec;
mod status;
mod umount;

/// `--version`: the release and the commit it was built from (`build.rs`).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("COMPUTERD_COMMIT"),
    ")"
);

/// Mount and manage `computer` workspaces.
#[derive(Parser, Debug)]
#[command(name = "computerd", version = VERSION, about)]
struct Cli {
    /// Log filter (error, warn, info, debug, trace, or a tracing filter expression);
    /// overrides -q and -v. Default: warnings.
    #[arg(long, global = true, env = "COMPUTERD_LOG")]
    log: Option<String>,
    /// Say less: no progress, no announcements or waits on stderr, errors only in the
    /// log. Results and errors are still printed.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    quiet: bool,
    /// Log more: -v what it does, -vv debugging detail, -vvv everything.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Make a new, empty workspace database.
    Init(init::InitArgs),
    /// Work on a workspace database directly: ls, cat, write, import, check, ...
    Fs(fs_args::FsArgs),
    /// Mount a workspace (or, with --remote, a replica of a served one) as a filesystem
    /// and serve it until unmounted or signalled.
    #[command(
        override_usage = "computerd mount [OPTIONS] <DB> <MOUNTPOINT>\n       \
        computerd mount [OPTIONS] --remote <ADDR> --cache <DB> <MOUNTPOINT>"
    )]
    Mount(mount::MountArgs),
    /// Unmount computerd mounts, returning once each daemon has finished with its
    /// database (umount(8) returns before).
    Umount(umount::UmountArgs),
    /// Sync a replica mount with its server now and wait: exits 0 once synced, 75 while
    /// the sync is pending (the daemon keeps retrying), 1 if its changes are lost.
    Sync(replica::SyncArgs),
    /// Run a command on a workspace in a Linux sandbox that sees it at /workspace,
    /// streaming its output; exits with the command's code (75 if its changes are not
    /// all in the workspace yet).
    #[command(override_usage = "computerd exec [OPTIONS] <DB> -- <CMD>...\n       \
        computerd exec [OPTIONS] --remote <ADDR> [--cache <DB>] -- <CMD>...")]
    Exec(exec::ExecArgs),
    /// List the workspace's audit trail: each exec asked of it, who asked, on which
    /// backend and why, and how it ended (or why it was refused).
    Audit(audit::AuditArgs),
    /// Serve a workspace's agent tools (read, write, edit, ls, find, grep, exec) over
    /// the Model Context Protocol on stdio, for an agent host.
    #[command(override_usage = "computerd mcp [OPTIONS] <DB>\n       \
        computerd mcp [OPTIONS] --remote <ADDR>")]
    Mcp(mcp::McpArgs),
    /// Serve a workspace to replicas and clients over the network until signalled.
    Serve(serve::ServeArgs),
    /// List the computerd mounts and servers running here.
    Status(status::StatusArgs),
    /// Print shell completions for computerd.
    Completions(manual::CompletionsArgs),
    /// Print the man page, or write one per command into a directory.
    Man(manual::ManArgs),
}

/// Raises the soft limit on open files to the hard one, as a server should: the store
/// keeps a descriptor per staged file (sized to the soft limit it finds), and 1024, a
/// common default, would make it fall back to slower paths under a burst of files.
fn raise_descriptor_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    // An unlimited hard limit cannot be the soft one: the kernel caps descriptors at
    // fs.nr_open, 2^20 by default.
    const CAP: u64 = 1 << 20;
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let wanted = hard.min(CAP);
        if soft < wanted {
            if let Err(err) = setrlimit(Resource::RLIMIT_NOFILE, wanted, hard) {
                tracing::debug!(
                    "could not raise the open-file limit from {soft} to {wanted}: {err}"
                );
            }
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    notice::set_quiet(cli.quiet);
    init_logging(&log_filter(&cli));
    raise_descriptor_limit();
    let result = match cli.command {
        Command::Init(args) => init::run(args),
        Command::Fs(args) => fs_cmd::run(args),
        Command::Mount(args) => mount::run(args),
        Command::Umount(args) => umount::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Status(args) => status::run(args),
        Command::Completions(args) => manual::completions(args, Cli::command()),
        Command::Man(args) => manual::man(args, Cli::command()),
        Command::Sync(args) => match exec::run_wait_sync(&args) {
            Some(waited) => waited,
            None => replica::run_sync(args),
        },
        Command::Exec(args) => exec::run(args),
        Command::Audit(args) => audit::run(args),
        Command::Mcp(args) => mcp::run(args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("computerd: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// The log filter: `--log` (or `COMPUTERD_LOG`) as given, else one for -q/-v.
fn log_filter(cli: &Cli) -> String {
    if let Some(filter) = &cli.log {
        return filter.clone();
    }
    let level = match (cli.quiet, cli.verbose) {
        (true, _) => "error",
        (false, 0) => "warn,fuser=error",
        (false, 1) => "info,fuser=warn",
        (false, 2) => "debug",
        (false, _) => "trace",
    };
    level.to_owned()
}

fn init_logging(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // Colours only for a person at a terminal who has not asked for none.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// clap's own checks of the definitions: no two flags of one command share a name
    /// (the global -q and -v included), every default parses.
    #[test]
    fn the_command_line_definitions_are_consistent() {
        Cli::command().debug_assert();
    }
}
