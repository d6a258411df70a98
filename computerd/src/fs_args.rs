//! The `computerd fs` command line: the database or server it works on, and each file
//! command with its arguments (clap definitions), apart from running them
//! (`fs_cmd.rs`), so that the client side of `fs --remote` (`remote.rs`) can name them
//! without depending on the commands' code.

use std::path::PathBuf;

use clap::{ArgAction, Args, Subcommand};

#[derive(Args, Debug)]
pub struct FsArgs {
    /// The workspace database (an SQLite file).
    #[arg(required_unless_present = "remote")]
    pub db: Option<PathBuf>,
    /// Run the command on a workspace served by `computerd serve` at ADDR (a Unix
    /// socket path, or tcp:HOST:PORT) instead of a database.
    #[arg(long, value_name = "ADDR", conflicts_with = "db")]
    pub remote: Option<String>,
    /// With --remote: the file holding the server's token (else $COMPUTERD_TOKEN).
    #[arg(long, value_name = "FILE", requires = "remote")]
    pub token_file: Option<PathBuf>,
    #[command(subcommand)]
    pub command: FsCommand,
}

#[derive(Subcommand, Debug, Clone)]
pub enum FsCommand {
    /// List directories (or show entries), as ls(1) does.
    #[command(disable_help_flag = true)]
    Ls {
        /// Long format: type and mode, links, owner, size, modification time (UTC), name.
        #[arg(short = 'l')]
        long: bool,
        /// Show entries whose names start with `.`, and `.` and `..`.
        #[arg(short = 'a', long)]
        all: bool,
        /// Show entries whose names start with `.`, but not `.` and `..`.
        #[arg(short = 'A', long)]
        almost_all: bool,
        /// With -l, sizes in powers of 1024 (1.5K, 12M).
        #[arg(short = 'h', long)]
        human_readable: bool,
        /// List subdirectories too, each under a `path:` heading.
        #[arg(short = 'R', long)]
        recursive: bool,
        #[arg(long, action = clap::ArgAction::Help)]
        help: Option<bool>,
        #[arg(default_value = "/")]
        paths: Vec<String>,
    },
    /// Print files to stdout.
    Cat {
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Write stdin to a file (created if missing, replaced unless --append).
    Write {
        path: String,
        /// Add to the end of the file instead of replacing its content.
        #[arg(short, long)]
        append: bool,
    },
    /// Create directories.
    Mkdir {
        /// Create missing parents; an existing directory is not an error.
        #[arg(short, long)]
        parents: bool,
        /// Permission bits, in octal (default 755).
        #[arg(short, long)]
        mode: Option<String>,
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Remove files, symlinks and (with -r) directory trees.
    Rm {
        /// Remove directories and everything in them.
        #[arg(short, short_alias = 'R', long)]
        recursive: bool,
        /// Ignore missing paths.
        #[arg(short, long)]
        force: bool,
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Rename or move (into DST if it is a directory); an existing file is replaced.
    Mv { src: String, dst: String },
    /// Copy a file or (with -r) a tree; the copy shares the source's blocks.
    Cp {
        /// Copy directories recursively.
        #[arg(short, short_alias = 'R', long)]
        recursive: bool,
        src: String,
        dst: String,
    },
    /// Make a hard link, or with -s a symbolic link holding TARGET as given.
    Ln {
        /// Make a symbolic link.
        #[arg(short, long)]
        symbolic: bool,
        target: String,
        link: String,
    },
    /// Show every attribute of a path (of the symlink itself unless -L).
    Stat {
        /// Follow a final symlink.
        #[arg(short = 'L', long)]
        dereference: bool,
        /// One JSON object per path, a line each.
        #[arg(long)]
        json: bool,
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Print the paths matching a glob (`*`, `?`, `[..]`, `{a,b}`, `**`), sorted.
    Find { pattern: String },
    /// Print lines matching PATTERN as path:line:text; exit 1 if none match.
    Grep {
        /// Ignore case.
        #[arg(short, long)]
        ignore_case: bool,
        /// PATTERN is a regular expression (default: a literal string).
        #[arg(short = 'E', long)]
        extended_regexp: bool,
        /// Only search files whose name matches this glob (for example '*.rs').
        #[arg(long, value_name = "GLOB")]
        include: Option<String>,
        /// Stop after N matching lines in all.
        #[arg(short = 'm', long, value_name = "N")]
        max_count: Option<usize>,
        pattern: String,
        #[arg(default_value = "/")]
        path: String,
    },
    /// Copy a host directory tree into the workspace.
    Import {
        host_dir: PathBuf,
        path: String,
        /// Never show progress.
        #[arg(long)]
        no_progress: bool,
        /// Leave out files and directories whose names (or symlinks whose targets) are
        /// not UTF-8, listing each on stderr, and import the rest. Without it such a name
        /// fails the import before anything is written.
        #[arg(long)]
        skip_bad_names: bool,
        /// One JSON object on stdout instead of the summary line.
        #[arg(long)]
        json: bool,
    },
    /// Copy a workspace directory tree to the host.
    Export {
        path: String,
        host_dir: PathBuf,
        /// Never show progress.
        #[arg(long)]
        no_progress: bool,
        /// One JSON object on stdout instead of the summary line.
        #[arg(long)]
        json: bool,
    },
    /// Verify every invariant of the database; exit 1 if anything is wrong.
    Check {
        /// Never show progress.
        #[arg(long)]
        no_progress: bool,
        /// One JSON object on stdout instead of the summary line.
        #[arg(long)]
        json: bool,
    },
    /// Give the space of deleted content back to the file system now (it happens in the
    /// background too once much of the database is free).
    Compact {
        /// Never show progress.
        #[arg(long)]
        no_progress: bool,
        /// One JSON object on stdout instead of the summary line.
        #[arg(long)]
        json: bool,
    },
    /// Show the workspace's totals.
    Stats {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Change permission bits (octal MODE, like 644).
    Chmod {
        mode: String,
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Shrink or extend files to SIZE bytes (suffixes K, M, G, T: powers of 1024).
    Truncate {
        #[arg(short, long)]
        size: String,
        /// Do not create missing files.
        #[arg(short = 'c', long)]
        no_create: bool,
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Show a directory tree (symlinks are not followed).
    Tree {
        #[arg(default_value = "/")]
        path: String,
    },
    /// Logical bytes (sum of file sizes) of each directory; hard links count once.
    #[command(disable_help_flag = true)]
    Du {
        /// Only the total.
        #[arg(short, long)]
        summarize: bool,
        /// Sizes in KiB, MiB, ...
        #[arg(short = 'h', long)]
        human_readable: bool,
        #[arg(long, action = ArgAction::Help, help = "Print help")]
        help: Option<bool>,
        #[arg(default_value = "/")]
        path: String,
    },
}

impl FsCommand {
    /// The command's name, as typed (`write`, `ls`, ...).
    pub fn name(&self) -> String {
        // Each variant is its subcommand's one-word name.
        let debug = format!("{self:?}");
        let end = debug
            .find(|c: char| !c.is_ascii_alphanumeric())
            .unwrap_or(debug.len());
        debug[..end].to_ascii_lowercase()
    }

    /// Whether the command runs on [`crate::fs_files::Files`] alone: the same against a
    /// database here and through a server's typed calls. The others move bytes in
    /// streams (`cat`, `write`) or reach this host's files (`import`, `export`).
    pub fn is_file_operation(&self) -> bool {
        !matches!(
            self,
            FsCommand::Cat { .. }
                | FsCommand::Write { .. }
                | FsCommand::Import { .. }
                | FsCommand::Export { .. }
        )
    }

    /// Whether the command changes the workspace (and so may create the database).
    pub fn writes(&self) -> bool {
        match self {
            FsCommand::Write { .. }
            | FsCommand::Mkdir { .. }
            | FsCommand::Rm { .. }
            | FsCommand::Mv { .. }
            | FsCommand::Cp { .. }
            | FsCommand::Ln { .. }
            | FsCommand::Import { .. }
            | FsCommand::Chmod { .. }
            | FsCommand::Truncate { .. }
            | FsCommand::Compact { .. } => true,
            FsCommand::Ls { .. }
            | FsCommand::Cat { .. }
            | FsCommand::Stat { .. }
            | FsCommand::Find { .. }
            | FsCommand::Grep { .. }
            | FsCommand::Export { .. }
            | FsCommand::Check { .. }
            | FsCommand::Stats { .. }
            | FsCommand::Tree { .. }
            | FsCommand::Du { .. } => false,
        }
    }
}
