//! The workloads. Each runs with `bash -c` in a fresh empty directory on the target; only
//! `cmd` is timed, `prep` (run first, in the same directory) is not. The commands follow the
//! reference's `fs-bench.sh` (see `/work/shared/reference/benchmarks.md`).

use std::path::PathBuf;

use super::exec::quote_path;

/// What a scenario needs besides coreutils; decides which fixtures the run prepares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Need {
    Nothing,
    /// `git` on PATH.
    Git,
    /// `git` and the generated source repository.
    GitRepo,
    /// The generated random input files.
    Random,
    /// npm with a warm cache holding is-number 7.0.0.
    NpmTiny,
    /// npm with a warm cache for the large lockfile.
    NpmLarge,
    /// `python3` with its `sqlite3` module.
    Python,
    /// `python3`, `git` and the generated source repository, and
    /// `/proc/sys/vm/drop_caches` writable (root).
    DropCaches,
}

#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    /// Untimed setup, run in the fresh directory before `cmd`; may be empty.
    pub prep: String,
    /// The timed command.
    pub cmd: String,
    pub need: Need,
}

/// Paths the scenario commands refer to (all outside every target).
#[derive(Clone, Debug)]
pub struct FixturePaths {
    /// 64 MiB of seeded random bytes: dd's input for the random variants.
    pub random: PathBuf,
    /// Another 64 MiB of different random bytes: what "overwrite random" overwrites, so the
    /// overwrite really changes every block.
    pub random_prep: PathBuf,
    /// Generated git repository (about 1 MB, several commits) for the clone scenario.
    pub git_repo: PathBuf,
    /// npm cache, warmed before timing.
    pub npm_cache: PathBuf,
    /// The npm-large manifests (package.json, package-lock.json, workspaces).
    pub npm_large: PathBuf,
}

/// Which data the 64 MiB scenarios use.
#[derive(Clone, Copy, Debug)]
pub struct DataKinds {
    pub zeros: bool,
    pub random: bool,
}

const MK1000: &str = "for i in $(seq 1 1000); do echo $i > f$i; done";
const MKTREE: &str = "for a in $(seq 1 10); do for b in $(seq 1 10); do mkdir -p $a/$b; \
                      for c in $(seq 1 10); do touch $a/$b/$c; done; done; done";
/// Size of the large-file scenarios and of the random input.
pub const BIG_BYTES: u64 = 64 << 20;

fn scenario(
    name: impl Into<String>,
    prep: impl Into<String>,
    cmd: impl Into<String>,
    need: Need,
) -> Scenario {
    Scenario {
        name: name.into(),
        prep: prep.into(),
        cmd: cmd.into(),
        need,
    }
}

/// All scenarios, in report order. `npm_large` adds the full npm install.
pub fn all(paths: &FixturePaths, data: DataKinds, npm_large: bool) -> Vec<Scenario> {
    use Need::*;
    let mut v = vec![
        scenario("create 1000 files", "", MK1000, Nothing),
        scenario(
            "stat 1000 files",
            "",
            format!("{MK1000}; for i in $(seq 1 1000); do stat f$i; done"),
            Nothing,
        ),
        scenario("rm 1000 files", "", format!("{MK1000}; rm f*"), Nothing),
        scenario("mkdir tree 10x10x10", "", MKTREE, Nothing),
        scenario(
            "find tree",
            "",
            format!("{MKTREE}; find . -type f | wc -l"),
            Nothing,
        ),
    ];

    let zero_dd = "dd if=/dev/zero of=big bs=1M count=64 status=none".to_string();
    let rand_dd = format!(
        "dd if={} of=big bs=1M count=64 status=none",
        quote_path(&paths.random)
    );
    let rand_prep_dd = format!(
        "dd if={} of=big bs=1M count=64 status=none",
        quote_path(&paths.random_prep)
    );
    let mut variants = Vec::new();
    if data.zeros {
        variants.push(("", zero_dd.clone(), zero_dd, Nothing));
    }
    if data.random {
        variants.push((" random", rand_dd, rand_prep_dd, Random));
    }
    for (suffix, dd, other_dd, need) in variants {
        v.extend([
            scenario(format!("write 64 MiB{suffix}"), "", dd.clone(), need),
            scenario(
                format!("copy 64 MiB{suffix}"),
                "",
                format!("{dd}; cp big big2"),
                need,
            ),
            scenario(
                format!("read 64 MiB{suffix}"),
                "",
                format!("{dd}; cat big > /dev/null"),
                need,
            ),
            scenario(
                format!("pure read 64 MiB{suffix}"),
                dd.clone(),
                "cat big > /dev/null",
                need,
            ),
            scenario(
                format!("pure copy 64 MiB{suffix}"),
                dd.clone(),
                "cp big big2",
                need,
            ),
            // The prep writes different bytes from the timed overwrite (for zeros both are
            // zeros, as published).
            scenario(
                format!("overwrite 64 MiB{suffix}"),
                other_dd,
                format!("{dd} conv=notrunc"),
                need,
            ),
        ]);
    }

    v.extend(durability());
    v.extend(reads(paths));

    let cache = quote_path(&paths.npm_cache);
    v.extend([
        scenario(
            "git init + commit 100 files",
            "",
            "git init -q; for i in $(seq 1 100); do echo $i > f$i; done; git add -A; \
             git -c user.email=a@b -c user.name=a commit -qm init",
            Git,
        ),
        scenario(
            "git clone (shallow, ~1 MB)",
            "",
            format!(
                "git clone --depth 1 -q {} r",
                crate::fsbench::exec::shell_quote(&format!("file://{}", paths.git_repo.display()))
            ),
            GitRepo,
        ),
        scenario(
            "npm init + tiny install",
            "",
            format!(
                "echo '{{\"name\":\"b\",\"version\":\"0.0.0\",\"dependencies\":{{\"is-number\":\"7.0.0\"}}}}' \
                 > package.json; npm install --offline --no-audit --no-fund --silent --cache {cache}"
            ),
            NpmTiny,
        ),
    ]);
    if npm_large {
        v.push(scenario(
            "full npm install",
            format!("cp -a {}/. .", quote_path(&paths.npm_large)),
            format!("npm ci --ignore-scripts --no-audit --no-fund --offline --cache {cache}"),
            NpmLarge,
        ));
    }
    v
}

/// The untimed end of a durability scenario's setup: the file on the disk, then time for
/// the background work a write leaves (ingestion waits a second) to be done.
const SETTLE: &str = "sync; sleep 1.5";

/// Rows of about 1 KB in the SQLite scenarios' database (about 60 MiB).
const SQLITE_ROWS: u32 = 60_000;

/// Durability at the cost of the change: small synced writes into large files, as a
/// database commits. Python keeps process start out of the timing.
fn durability() -> Vec<Scenario> {
    let fsync_loop = r#"python3 -c '
import os
fd = os.open("big", os.O_RDWR)
for i in range(300):
    os.pwrite(fd, os.urandom(4096), (i * 7919 * 4096) % (64 << 20))
    os.fdatasync(fd)
'"#;
    let sqlite_prep = |mode: &str| {
        format!(
            r#"python3 -c '
import sqlite3
c = sqlite3.connect("app.db", isolation_level=None)
c.execute("pragma journal_mode={mode}")
c.execute("create table t(id integer primary key, v blob)")
c.execute("begin")
c.executemany("insert into t values(?, randomblob(1000))", ((i,) for i in range({SQLITE_ROWS})))
c.execute("commit")
'; {SETTLE}"#
        )
    };
    let sqlite_commits = format!(
        r#"python3 -c '
import sqlite3
c = sqlite3.connect("app.db", isolation_level=None)
c.execute("pragma synchronous=FULL")
for i in range(300):
    c.execute("update t set v = randomblob(1000) where id = ?", ((i * 7919) % {SQLITE_ROWS},))
'"#
    );
    vec![
        scenario(
            "fdatasync 300 x 4 KiB in 64 MiB",
            format!("head -c 64M /dev/urandom > big; {SETTLE}"),
            fsync_loop,
            Need::Python,
        ),
        scenario(
            "sqlite 300 commits, WAL",
            sqlite_prep("wal"),
            sqlite_commits.clone(),
            Need::Python,
        ),
        scenario(
            "sqlite 300 commits, rollback journal",
            sqlite_prep("delete"),
            sqlite_commits,
            Need::Python,
        ),
    ]
}

/// 10,000 files of about 1.5 KB in 100 directories, the same bytes every time; the 51st
/// file of each directory holds the word the grep scenarios look for.
const SMALL_TREE: &str = r#"python3 -c '
import os
for d in range(100):
    os.mkdir(f"d{d:03}")
    for f in range(100):
        with open(f"d{d:03}/f{f:03}.txt", "w") as out:
            for line in range(30):
                out.write(f"line {line} of file {f} in directory {d}: {d * f * line:x}\n")
            if f == 50:
                out.write("the needle\n")
'"#;

/// Ends a cold scenario's setup: the kernel forgets cached pages, entries and inodes
/// (for a mount, the daemon keeps its own caches).
const DROP_CACHES: &str = "sync; echo 3 > /proc/sys/vm/drop_caches";

/// What agents run again and again on trees: each timed command runs once in the
/// setup first (warm), or after the kernel's caches were dropped (cold); the grep and
/// the cat also twice first (third run: a mount that learns from the first reads what
/// it may cache, such as `--cached-opens`, is measured once it has).
fn reads(paths: &FixturePaths) -> Vec<Scenario> {
    let grep = "grep -r needle . > /dev/null";
    let find = "find . -type f | wc -l";
    let cat = "cat d*/* > /dev/null";
    let ls = "for i in $(seq 1 10); do ls -l big > /dev/null; done";
    let status = "git -C r status --porcelain > /dev/null";
    let big_dir = "mkdir big && for i in $(seq 1 1000); do echo $i > big/f$i; done";
    // "Index refreshed": files written in the same second as the index are racily
    // clean, and every status reads them again until the index is written later; so
    // wait a second and let one status rewrite it, as an agent's clone soon is.
    let clone = format!(
        "git clone -q {} r; sleep 1.1; {status}",
        crate::fsbench::exec::shell_quote(&format!("file://{}", paths.git_repo.display()))
    );
    let mut v = Vec::new();
    // (name, setup, timed command, what the warm variant needs, with a cold variant,
    // with a third-run variant)
    for (what, prep, cmd, need, cold, third) in [
        (
            "grep -r 10,000 files",
            SMALL_TREE,
            grep,
            Need::Python,
            true,
            true,
        ),
        (
            "find 10,000 files",
            SMALL_TREE,
            find,
            Need::Python,
            true,
            false,
        ),
        (
            "cat 10,000 files",
            SMALL_TREE,
            cat,
            Need::Python,
            true,
            true,
        ),
        (
            "ls -l 1,000 entries x 10",
            big_dir,
            ls,
            Need::Nothing,
            false,
            false,
        ),
        (
            "git status",
            clone.as_str(),
            status,
            Need::GitRepo,
            true,
            false,
        ),
    ] {
        v.push(scenario(
            format!("reads: {what}, warm"),
            format!("{prep}; {cmd}"),
            cmd,
            need,
        ));
        if third {
            v.push(scenario(
                format!("reads: {what}, third run"),
                format!("{prep}; {cmd}; {cmd}"),
                cmd,
                need,
            ));
        }
        if !cold {
            continue;
        }
        v.push(scenario(
            format!("reads: {what}, cold"),
            format!("{prep}; {cmd}; {DROP_CACHES}"),
            cmd,
            Need::DropCaches,
        ));
    }
    v
}

/// Keeps the scenarios whose name contains any of `only` (case-insensitive); all if empty.
pub fn filter(scenarios: Vec<Scenario>, only: &[String]) -> Vec<Scenario> {
    if only.is_empty() {
        return scenarios;
    }
    let only: Vec<String> = only.iter().map(|s| s.to_lowercase()).collect();
    scenarios
        .into_iter()
        .filter(|s| {
            let name = s.name.to_lowercase();
            only.iter().any(|o| name.contains(o))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths() -> FixturePaths {
        FixturePaths {
            random: "/fx/rand".into(),
            random_prep: "/fx/rand2".into(),
            git_repo: "/fx/repo".into(),
            npm_cache: "/fx/npm cache".into(),
            npm_large: "/data/npm-large".into(),
        }
    }

    #[test]
    fn both_data_kinds_by_default() {
        let all = all(
            &paths(),
            DataKinds {
                zeros: true,
                random: true,
            },
            false,
        );
        let names: Vec<&str> = all.iter().map(|s| s.name.as_str()).collect();
        assert!(names.contains(&"write 64 MiB"));
        assert!(names.contains(&"overwrite 64 MiB random"));
        assert!(!names.contains(&"full npm install"));
        assert_eq!(all.len(), 5 + 12 + 3 + 3 + 11);
        let ow = all
            .iter()
            .find(|s| s.name == "overwrite 64 MiB random")
            .unwrap();
        assert!(
            ow.prep.contains("/fx/rand2")
                && ow.cmd.contains("if=/fx/rand ")
                && ow.cmd.ends_with("conv=notrunc")
        );
        let npm = all.iter().find(|s| s.need == Need::NpmTiny).unwrap();
        assert!(npm.cmd.ends_with("--cache '/fx/npm cache'"), "{}", npm.cmd);
    }

    #[test]
    fn only_filters_by_substring() {
        let all = all(
            &paths(),
            DataKinds {
                zeros: true,
                random: false,
            },
            true,
        );
        let kept = filter(all, &["Pure".into(), "npm install".into()]);
        let names: Vec<&str> = kept.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            ["pure read 64 MiB", "pure copy 64 MiB", "full npm install"]
        );
    }
}
