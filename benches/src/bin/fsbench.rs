//! fsbench: whole-workload benchmark of a FUSE mount against ext4 and tmpfs, in one run.
//!
//! Every scenario runs in a fresh directory on every target; within each repetition the
//! targets run in a seeded random order, so a noisy machine affects all of them alike. Only
//! the scenario's command is timed. See `benches/README.md` and
//! `/work/shared/reference/benchmarks.md`.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _, Result};
use clap::Parser;
use rand::seq::SliceRandom as _;

use computer_benches::fsbench::exec::{self, run_bash, shell_quote};
use computer_benches::fsbench::fixtures;
use computer_benches::fsbench::report::{self, Cell, Ratios, Row};
use computer_benches::fsbench::scenario::{
    self, DataKinds, FixturePaths, Need, Scenario, BIG_BYTES,
};
use computer_benches::fsbench::stats::{ms, Summary};
use computer_benches::fsbench::target::{ComputerdMount, Target, TmpfsMount};

/// Benchmark shell workloads on tmpfs, ext4, other directories and a computerd mount.
#[derive(Parser, Debug)]
#[command(name = "fsbench", version)]
struct Args {
    /// Timed repetitions per scenario and target.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Untimed warm-up repetitions before the timed ones.
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Run only scenarios whose name contains SUBSTR (case-insensitive); repeatable.
    #[arg(long, value_name = "SUBSTR")]
    only: Vec<String>,
    /// 64 MiB scenarios with random data (alone: only random; default: zeros and random).
    #[arg(long)]
    random: bool,
    /// 64 MiB scenarios with zeros, as published (alone: only zeros; default: both).
    #[arg(long)]
    zeros: bool,
    /// Parent of the ext4 scratch directory [default: the system temp dir].
    #[arg(long, value_name = "DIR")]
    ext4_dir: Option<PathBuf>,
    /// Do not mount and measure a tmpfs.
    #[arg(long)]
    no_tmpfs: bool,
    /// Also measure the pre-mounted directory DIR, under the column NAME; repeatable. The
    /// first one is the subject of the ratios unless --computerd is given.
    #[arg(long = "target", value_name = "NAME=DIR", value_parser = parse_target)]
    targets: Vec<(String, PathBuf)>,
    /// Mount a fresh workspace with `BIN mount DB MNT --daemon` and measure it (the subject).
    #[arg(long, value_name = "BIN")]
    computerd: Option<PathBuf>,
    /// Add the full npm install of the npm-large lockfile (warms its cache online first).
    #[arg(long)]
    npm_large: bool,
    /// Where the npm-large manifests are.
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/work/shared/bench-data/npm-large"
    )]
    npm_large_dir: PathBuf,
    /// npm cache to warm and use [default: a fresh one inside the run's temp dir]. A kept
    /// cache saves downloading npm-large again on the next run.
    #[arg(long, value_name = "DIR")]
    npm_cache: Option<PathBuf>,
    /// Also write the table as markdown, with a header line, to FILE.
    #[arg(long, value_name = "FILE")]
    markdown: Option<PathBuf>,
    /// Seed for the target order, the random data and the generated git repository.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn parse_target(s: &str) -> Result<(String, PathBuf), String> {
    let (name, dir) = s.split_once('=').ok_or("expected NAME=DIR")?;
    if name.is_empty() || dir.is_empty() {
        return Err("expected NAME=DIR with both parts non-empty".into());
    }
    Ok((name.to_string(), PathBuf::from(dir)))
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("fsbench: some cells failed (FAIL in the table); see the messages above");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("fsbench: error: {e:#}");
            ExitCode::from(if exec::interrupted() { 130 } else { 2 })
        }
    }
}

/// Runs the benchmark; `Ok(false)` when some cell failed.
fn run(args: &Args) -> Result<bool> {
    if args.reps == 0 {
        bail!("--reps must be at least 1");
    }
    let mut names = BTreeSet::from(["tmpfs", "ext4", "computerd"]);
    for (name, _) in &args.targets {
        if !names.insert(name) {
            bail!("--target name {name:?} is used twice or clashes with a built-in target");
        }
    }
    exec::install_signal_handlers()?;

    // Locals drop in reverse order: the targets' directories go first, then the mounts, then
    // the temp directories, also on error or interrupt.
    let work = tempfile::Builder::new()
        .prefix("fsbench.")
        .tempdir()
        .context("creating the run's temp dir")?;
    let fixtures_dir = work.path().join("fixtures");
    fs::create_dir(&fixtures_dir)?;
    let paths = FixturePaths {
        random: fixtures_dir.join("random-64m.bin"),
        random_prep: fixtures_dir.join("random-64m-prep.bin"),
        git_repo: fixtures_dir.join("clone-src"),
        npm_cache: match &args.npm_cache {
            Some(p) => std::path::absolute(p)?,
            None => work.path().join("npm-cache"),
        },
        npm_large: std::path::absolute(&args.npm_large_dir)?,
    };
    let data = DataKinds {
        zeros: args.zeros || !args.random,
        random: args.random || !args.zeros,
    };
    let scenarios = scenario::filter(scenario::all(&paths, data, args.npm_large), &args.only);
    if scenarios.is_empty() {
        bail!("no scenario matches --only {:?}", args.only);
    }

    let ext4_parent = args.ext4_dir.clone().unwrap_or_else(std::env::temp_dir);
    let ext4_dir = tempfile::Builder::new()
        .prefix("fsbench-ext4.")
        .tempdir_in(&ext4_parent)
        .with_context(|| format!("creating the ext4 scratch dir in {}", ext4_parent.display()))?;
    let tmpfs = if args.no_tmpfs {
        None
    } else {
        Some(TmpfsMount::mount(&work.path().join("tmpfs"))?)
    };
    let computerd = match &args.computerd {
        Some(bin) => Some(ComputerdMount::start(bin, &work.path().join("computerd"))?),
        None => None,
    };

    let mut targets = Vec::new();
    if let Some(t) = &tmpfs {
        targets.push(Target::new("tmpfs", t.path())?);
    }
    targets.push(Target::new("ext4", ext4_dir.path())?);
    let ext4 = targets.len() - 1;
    for (name, dir) in &args.targets {
        targets.push(Target::new(name, dir)?);
    }
    if let Some(c) = &computerd {
        targets.push(Target::new("computerd", c.mount_point())?);
    }
    let tmpfs_idx = tmpfs.as_ref().map(|_| 0);
    let subject = if computerd.is_some() {
        Some(targets.len() - 1)
    } else if !args.targets.is_empty() {
        Some(ext4 + 1)
    } else {
        None
    };
    let ratios = match subject {
        Some(s) => Some(Ratios {
            subject: s,
            baselines: std::iter::once(ext4).chain(tmpfs_idx).collect(),
        }),
        None => tmpfs_idx.map(|t| Ratios {
            subject: ext4,
            baselines: vec![t],
        }),
    };

    eprintln!(
        "fsbench: {} scenarios, {} warm-up + {} timed reps, seed {}, temp dir {}",
        scenarios.len(),
        args.warmup,
        args.reps,
        args.seed,
        work.path().display()
    );
    for t in &targets {
        eprintln!(
            "  target {:<10} {} ({})",
            t.name,
            t.root.display(),
            t.fs_type
        );
    }
    for (name, want) in [("tmpfs", "tmpfs"), ("ext4", "ext4"), ("computerd", "fuse")] {
        if let Some(t) = targets.iter().find(|t| t.name == name) {
            if t.fs_type != want {
                eprintln!(
                    "fsbench: warning: target {name} is on {}, not {want}",
                    t.fs_type
                );
            }
        }
    }

    let skipped = prepare_fixtures(&scenarios, &paths, args, work.path())?;

    let mut order_rng = fixtures::rng_for(args.seed, "target order");
    let mut rows = Vec::new();
    let mut all_ok = true;
    let mut runs = 0u64;
    for (i, sc) in scenarios.iter().enumerate() {
        let head = format!("[{}/{}] {}", i + 1, scenarios.len(), sc.name);
        if let Some(reason) = skipped.get(&sc.need) {
            eprintln!("{head}: skipped: {reason}");
            rows.push(Row {
                scenario: sc.name.clone(),
                outcome: Err(reason.clone()),
            });
            continue;
        }
        eprintln!("{head}");
        let mut samples = vec![Vec::new(); targets.len()];
        let mut failed = vec![false; targets.len()];
        for rep in 0..args.warmup + args.reps {
            let timed = rep >= args.warmup;
            let mut order: Vec<usize> = (0..targets.len()).collect();
            order.shuffle(&mut order_rng);
            let mut line = if timed {
                format!("  rep {}/{}:", rep - args.warmup + 1, args.reps)
            } else {
                format!("  warm-up {}/{}:", rep + 1, args.warmup)
            };
            for t in order {
                if failed[t] {
                    continue;
                }
                runs += 1;
                match run_once(&targets[t], sc, runs) {
                    Ok(d) => {
                        line.push_str(&format!("  {} {:.1} ms", targets[t].name, ms(d)));
                        if timed {
                            samples[t].push(d);
                        }
                    }
                    Err(e) => {
                        exec::check_interrupted()?;
                        failed[t] = true;
                        all_ok = false;
                        line.push_str(&format!("  {} FAIL", targets[t].name));
                        eprintln!("  FAIL {} on {}: {e:#}", sc.name, targets[t].name);
                    }
                }
            }
            eprintln!("{line}");
        }
        let cells = samples
            .iter()
            .zip(&failed)
            .map(|(s, &f)| match Summary::of(s) {
                Some(sum) if !f => Cell::Done(sum),
                _ => Cell::Failed,
            })
            .collect();
        rows.push(Row {
            scenario: sc.name.clone(),
            outcome: Ok(cells),
        });
    }

    let names: Vec<String> = targets.iter().map(|t| t.name.clone()).collect();
    let table = report::table(&names, &rows, ratios.as_ref());
    let summary = format!(
        "median of {} timed reps after {} warm-up, ms; ratios are of medians; seed {}",
        args.reps, args.warmup, args.seed
    );
    println!("{summary}");
    print!("{}", table.to_text());

    if let Some(file) = &args.markdown {
        let targets_line = targets
            .iter()
            .map(|t| format!("{} = `{}` ({})", t.name, t.root.display(), t.fs_type))
            .collect::<Vec<_>>()
            .join(", ");
        let md = format!(
            "fsbench {} UTC, kernel {}, {} timed reps after {} warm-up, seed {}, command: `{}`\n\n\
             Targets: {targets_line}. Cells are medians in ms; ratios are of medians.\n\n{}",
            utc_now(),
            kernel_release(),
            args.reps,
            args.warmup,
            args.seed,
            command_line(),
            table.to_markdown()
        );
        fs::write(file, md).with_context(|| format!("writing {}", file.display()))?;
        eprintln!("fsbench: wrote {}", file.display());
    }
    Ok(all_ok)
}

/// One run of `sc` on `t` in a fresh directory: prep (untimed), sync, the timed command,
/// then the directory is deleted (untimed).
fn run_once(t: &Target, sc: &Scenario, n: u64) -> Result<Duration> {
    let dir = t.work.join(format!("run{n}"));
    fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let result = (|| {
        if !sc.prep.is_empty() {
            run_bash(&sc.prep, &dir).context("prep")?;
        }
        nix::unistd::sync();
        run_bash(&sc.cmd, &dir)
    })();
    let cleanup = fs::remove_dir_all(&dir);
    let elapsed = result?;
    cleanup.with_context(|| format!("deleting {}", dir.display()))?;
    Ok(elapsed)
}

/// Prepares what the selected scenarios need; returns the needs that cannot be met, with
/// the reason (those scenarios are skipped). Interrupts and local I/O errors are errors.
fn prepare_fixtures(
    scenarios: &[Scenario],
    paths: &FixturePaths,
    args: &Args,
    work: &Path,
) -> Result<HashMap<Need, String>> {
    let needs: Vec<Need> = scenarios.iter().map(|s| s.need).collect();
    let mut skipped = HashMap::new();
    let mut note = |need: Need, why: String| {
        eprintln!("fsbench: skipping the scenarios that need {need:?}: {why}");
        skipped.insert(need, why);
    };

    if needs.contains(&Need::Random) {
        eprintln!("fsbench: generating 2 x 64 MiB of seeded random data");
        fixtures::random_file(
            &paths.random,
            BIG_BYTES,
            &mut fixtures::rng_for(args.seed, "random data"),
        )?;
        fixtures::random_file(
            &paths.random_prep,
            BIG_BYTES,
            &mut fixtures::rng_for(args.seed, "random prep data"),
        )?;
    }

    let wants_git = [Need::Git, Need::GitRepo, Need::DropCaches]
        .iter()
        .any(|need| needs.contains(need));
    let git_ok = !wants_git || run_bash("git --version", work).is_ok();
    exec::check_interrupted()?;
    if !git_ok {
        note(Need::Git, "git is not installed".into());
        note(Need::GitRepo, "git is not installed".into());
    } else if needs.contains(&Need::GitRepo) || needs.contains(&Need::DropCaches) {
        match fixtures::git_repo(
            &paths.git_repo,
            &mut fixtures::rng_for(args.seed, "git repo"),
        ) {
            Ok(()) => eprintln!(
                "fsbench: generated the clone source {} ({} KB of files in its tip)",
                paths.git_repo.display(),
                fixtures::tree_bytes(&paths.git_repo.join("src")) / 1000
            ),
            Err(e) => {
                exec::check_interrupted()?;
                note(
                    Need::GitRepo,
                    format!("generating the source repository failed: {e:#}"),
                );
            }
        }
    }

    let python_ok = run_bash("python3 -c 'import sqlite3'", work).is_ok();
    if needs.contains(&Need::Python) && !python_ok {
        note(Need::Python, "python3 with sqlite3 is not installed".into());
    }
    if needs.contains(&Need::DropCaches) {
        let writable = fs::OpenOptions::new()
            .write(true)
            .open("/proc/sys/vm/drop_caches")
            .is_ok();
        if !python_ok || !git_ok || !writable {
            let why = "the cold scenarios need python3, git and root (to drop caches)";
            note(Need::DropCaches, why.into());
        }
    }
    exec::check_interrupted()?;

    if needs.contains(&Need::NpmTiny) {
        eprintln!(
            "fsbench: warming the npm cache {} (online)",
            paths.npm_cache.display()
        );
        if let Err(e) = fixtures::warm_npm_tiny(&paths.npm_cache, &work.join("npm-warm-tiny")) {
            exec::check_interrupted()?;
            note(Need::NpmTiny, format!("{e:#}"));
        }
    }
    if needs.contains(&Need::NpmLarge) {
        eprintln!(
            "fsbench: warming the npm cache {} for {} (online npm ci, may take minutes)",
            paths.npm_cache.display(),
            paths.npm_large.display()
        );
        if let Err(e) = fixtures::warm_npm_large(
            &paths.npm_large,
            &paths.npm_cache,
            &work.join("npm-warm-large"),
        ) {
            exec::check_interrupted()?;
            note(Need::NpmLarge, format!("{e:#}"));
        }
    }
    Ok(skipped)
}

/// The exact command line, shell-quoted.
fn command_line() -> String {
    std::env::args()
        .map(|a| shell_quote(&a))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `uname -r`.
fn kernel_release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// Current UTC time as "YYYY-MM-DD HH:MM:SS".
fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
