//! Inputs prepared once per run, outside every target and outside the timing: seeded random
//! data, a generated git repository, and a warm npm cache.

use std::fs;
use std::io::{BufWriter, Write as _};
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context as _, Result};
use rand::rngs::StdRng;
use rand::{Rng as _, RngCore as _, SeedableRng as _};

use super::exec::{self, quote_path, run_bash};

/// Derives an independent RNG for one purpose from the run's seed.
pub fn rng_for(seed: u64, purpose: &str) -> StdRng {
    // FNV-1a of the purpose, mixed into the seed.
    let tag = purpose.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    StdRng::seed_from_u64(seed ^ tag)
}

/// Writes `len` seeded random bytes to `path`.
pub fn random_file(path: &Path, len: u64, rng: &mut StdRng) -> Result<()> {
    let file = fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut out = BufWriter::new(file);
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        let n = usize::try_from(left.min(buf.len() as u64))?;
        rng.fill_bytes(&mut buf[..n]);
        out.write_all(&buf[..n])?;
        left -= n as u64;
    }
    out.into_inner()
        .map_err(|e| e.into_error())?
        .sync_all()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Text of `len` bytes: random lowercase words and digits in lines of 64, so that git's zlib
/// compresses it about as much as source code (not as little as random bytes).
fn random_text(rng: &mut StdRng, len: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789     ";
    let mut s = String::with_capacity(len + 1);
    for i in 0..len {
        if i % 64 == 63 {
            s.push('\n');
        } else {
            s.push(char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]));
        }
    }
    s.push('\n');
    s
}

/// Generates the source repository for the clone scenario at `dir`: six commits, ending with
/// 240 text files of about 5.5 KB (about 1.3 MB of text, a pack of about 1 MB). Content,
/// names, authors and dates all derive from the seed, so the commit ids are reproducible.
pub fn git_repo(dir: &Path, rng: &mut StdRng) -> Result<()> {
    const FIRST: usize = 160;
    const COMMITS: usize = 6;
    const ADDED: usize = 16;
    const CHANGED: usize = 12;
    const FILE_BYTES: usize = 5_500;
    fs::create_dir_all(dir)?;
    git(dir, &["init", "-q", "-b", "main", "."], 0)?;
    let mut files = 0usize;
    for commit in 0..COMMITS {
        let adds = if commit == 0 { FIRST } else { ADDED };
        let mut touched: Vec<usize> = (files..files + adds).collect();
        if commit > 0 {
            for _ in 0..CHANGED {
                touched.push(rng.random_range(0..files));
            }
        }
        files += adds;
        for f in touched {
            let path = dir.join(format!("src/m{}/file{f:03}.txt", f % 8));
            fs::create_dir_all(path.parent().expect("has a parent"))?;
            fs::write(&path, random_text(rng, FILE_BYTES))?;
        }
        git(dir, &["add", "-A"], commit)?;
        git(
            dir,
            &["commit", "-q", "-m", &format!("fixture commit {commit}")],
            commit,
        )?;
    }
    Ok(())
}

fn git(dir: &Path, args: &[&str], commit: usize) -> Result<()> {
    let date = format!("{} +0000", 1_700_000_000 + 3600 * commit);
    let mut cmd = Command::new("git");
    cmd.arg("-c")
        .arg("user.name=fsbench")
        .arg("-c")
        .arg("user.email=fsbench@example.invalid")
        .arg("-c")
        .arg("commit.gpgsign=false")
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_DATE", &date)
        .env("GIT_COMMITTER_DATE", &date);
    exec::run(cmd, &format!("git {}", args.join(" "))).map(drop)
}

/// Total size of the regular files under `dir`.
pub fn tree_bytes(dir: &Path) -> u64 {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => tree_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map(|m| m.len()).unwrap_or(0),
            _ => 0,
        })
        .sum()
}

/// Puts is-number 7.0.0 into `cache` (online), then proves an offline install from it works
/// in the scratch directory `scratch`.
pub fn warm_npm_tiny(cache: &Path, scratch: &Path) -> Result<()> {
    fs::create_dir_all(scratch)?;
    let cache = quote_path(cache);
    run_bash(
        &format!("npm cache add is-number@7.0.0 --cache {cache} --no-audit --no-fund"),
        scratch,
    )
    .context("warming the npm cache (online)")?;
    run_bash(
        &format!(
            "echo '{{\"name\":\"b\",\"version\":\"0.0.0\",\"dependencies\":{{\"is-number\":\"7.0.0\"}}}}' \
             > package.json && npm install --offline --no-audit --no-fund --silent --cache {cache}"
        ),
        scratch,
    )
    .context("trial offline install from the warmed cache")?;
    fs::remove_dir_all(scratch)?;
    Ok(())
}

/// Warms `cache` for the npm-large lockfile: copies `src` to `scratch` and runs `npm ci`
/// online there once (see the README in `src`), then deletes `scratch`.
pub fn warm_npm_large(src: &Path, cache: &Path, scratch: &Path) -> Result<()> {
    if !src.join("package-lock.json").is_file() {
        bail!("{} has no package-lock.json", src.display());
    }
    fs::create_dir_all(scratch)?;
    run_bash(&format!("cp -a {}/. .", quote_path(src)), scratch)?;
    run_bash(
        &format!(
            "npm ci --ignore-scripts --no-audit --no-fund --cache {}",
            quote_path(cache)
        ),
        scratch,
    )
    .context("warming the npm cache for npm-large (online npm ci)")?;
    fs::remove_dir_all(scratch)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_data_is_seeded() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, c) = (
            dir.path().join("a"),
            dir.path().join("b"),
            dir.path().join("c"),
        );
        random_file(&a, 100_000, &mut rng_for(7, "x")).unwrap();
        random_file(&b, 100_000, &mut rng_for(7, "x")).unwrap();
        random_file(&c, 100_000, &mut rng_for(7, "y")).unwrap();
        let (a, b, c) = (
            fs::read(a).unwrap(),
            fs::read(b).unwrap(),
            fs::read(c).unwrap(),
        );
        assert_eq!(a.len(), 100_000);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn git_repo_is_reproducible_and_about_1_mb_shallow() {
        if run_bash("git --version", Path::new("/")).is_err() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let head = |name: &str| {
            let repo = dir.path().join(name);
            git_repo(&repo, &mut rng_for(3, "git repo")).unwrap();
            let out = Command::new("git")
                .args(["rev-parse", "HEAD"])
                .current_dir(&repo)
                .output()
                .unwrap();
            String::from_utf8(out.stdout).unwrap()
        };
        assert_eq!(head("a"), head("b"));
        let url = format!("file://{}", dir.path().join("a").display());
        run_bash(&format!("git clone --depth 1 -q {url} c"), dir.path()).unwrap();
        let pack = tree_bytes(&dir.path().join("c/.git/objects/pack"));
        eprintln!("shallow clone pack: {pack} bytes");
        assert!(
            (500_000..1_500_000).contains(&pack),
            "shallow pack is {pack} bytes"
        );
    }
}
