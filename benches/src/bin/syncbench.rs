//! syncbench: bytes on the wire and time to sync a replica, over the real RPC transport
//! through a byte-counting proxy, for the scenarios of issue 4. See `benches/README.md`.

use std::path::PathBuf;
use std::process::{Command, ExitCode};

use anyhow::{Context as _, Result};
use clap::Parser;

use computer_benches::syncbench::{self, report, Config};

/// Measure sync on the wire: (a) a fresh replica of a many-file tree, (b) one byte changed
/// in a big file, (c) many small files changed, (d) bytes inserted at the head of a big
/// file; (b) to (d) each way.
#[derive(Parser, Debug)]
#[command(name = "syncbench", version)]
struct Args {
    /// Small sizes for a smoke test (400 files, 2 MiB, 40 small files, 2 reps); any
    /// other flag given still applies.
    #[arg(long)]
    quick: bool,
    /// Files of the generated tree [default: 36000].
    #[arg(long)]
    files: Option<usize>,
    /// Import this host directory as the tree of (a) and (c) instead of generating one.
    #[arg(long, value_name = "DIR")]
    tree: Option<PathBuf>,
    /// Size of the big random file of (b) and (d), MiB [default: 64].
    #[arg(long, value_name = "MIB")]
    big_mib: Option<usize>,
    /// Small files changed in (c), each way [default: 1000].
    #[arg(long)]
    small_files: Option<usize>,
    /// Bytes inserted at the head in (d) [default: 100].
    #[arg(long)]
    head_bytes: Option<usize>,
    /// Repetitions of (b), (c), (d) and the no-op sync, each way [default: 5].
    #[arg(long)]
    reps: Option<usize>,
    /// Fresh replicas pulling the tree in (a) [default: 1].
    #[arg(long)]
    tree_reps: Option<usize>,
    /// Seed of the generated tree and the random data.
    #[arg(long)]
    seed: Option<u64>,
    /// Serve on TCP loopback instead of a Unix socket.
    #[arg(long)]
    tcp: bool,
    /// Parent of the run's temp dir [default: the system temp dir].
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Which scenarios to run: letters of "abcd", and "m": the tree's top directory
    /// renamed on the server, pulled, then no-op syncs (the no-op sync always runs).
    #[arg(long, default_value = "abcdm")]
    scenarios: String,
    /// Compare every file of the tree on both sides after (a) (default: every 53rd).
    #[arg(long)]
    verify_all: bool,
    /// Also write the tables as markdown, headed by the command and the machine, to FILE.
    #[arg(long, value_name = "FILE")]
    markdown: Option<PathBuf>,
    /// No progress on stderr.
    #[arg(long)]
    quiet: bool,
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("syncbench: error: {error:#}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<()> {
    let args = Args::parse();
    let base = if args.quick {
        Config::quick()
    } else {
        Config::full()
    };
    let config = Config {
        files: args.files.unwrap_or(base.files),
        tree_dir: args.tree.clone(),
        big_bytes: args.big_mib.map_or(base.big_bytes, |m| m << 20),
        small_files: args.small_files.unwrap_or(base.small_files),
        head_bytes: args.head_bytes.unwrap_or(base.head_bytes),
        reps: args.reps.unwrap_or(base.reps),
        tree_reps: args.tree_reps.unwrap_or(base.tree_reps),
        seed: args.seed.unwrap_or(base.seed),
        tcp: args.tcp,
        work_dir: args.dir.clone(),
        scenarios: args.scenarios.to_lowercase(),
        verify_all: args.verify_all || base.verify_all,
        progress: !args.quiet,
    };
    if let Some(bad) = config.scenarios.chars().find(|c| !"abcdm".contains(*c)) {
        anyhow::bail!("--scenarios takes letters of \"abcdm\", not {bad:?}");
    }
    let load_before = load_average();
    let results = syncbench::run(&config)?;
    let tables = report::markdown(&results);
    println!("{tables}");
    if let Some(path) = &args.markdown {
        let command: Vec<String> = std::env::args().collect();
        let header = format!(
            "syncbench run of {} at commit `{}`: `{}`\n\n{}; load average {} before, {} after.\n\n",
            capture("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
            capture("git", &["rev-parse", "--short", "HEAD"]),
            command.join(" "),
            machine(),
            load_before,
            load_average(),
        );
        std::fs::write(path, header + &tables)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("syncbench: wrote {}", path.display());
    }
    Ok(())
}

/// A command's first line of output, or `?`.
fn capture(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "?".into())
}

fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cores} cores, kernel {}", capture("uname", &["-r"]))
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}
