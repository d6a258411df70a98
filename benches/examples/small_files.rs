//! What the store alone spends on the requests of a small-file burst, as the mount
//! makes them: for each of N files a negative lookup, a create with a staging file, a
//! few bytes written to it (as `echo $i > f$i` does), a release; a getattr of each once
//! the batch is committed; then an unlink of each. Batched commits and staging as
//! `computerd mount` sets them. Prints the median time per operation over the rounds.
//!
//!   cargo run --release -p computer-benches --example small_files -- [FILES] [ROUNDS]
//!
//! A tool for finding where the store's time goes (compare before and after a change,
//! in one sitting: the machine is noisy), not a figure of the mount: the FUSE round
//! trips and the kernel are not in it.

use computer_vfs::Who;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use computer_vfs::{InodeNo, NewNode, OpenFlags, Options, Workspace};

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let files: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(1000);
    let rounds: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(7);
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("ws.db");
    let ws = Workspace::open(
        &db,
        Options {
            create: true,
            staging_dir: Some(dir.path().join("ws.db.staging")),
            commit_delay: Some(Duration::from_millis(25)),
            ..Options::default()
        },
    )?;
    let flags = OpenFlags {
        write: true,
        truncate: true,
        ..OpenFlags::default()
    };
    let (mut lookups, mut creates, mut releases, mut getattrs, mut unlinks) =
        (vec![], vec![], vec![], vec![], vec![]);
    for round in 0..rounds {
        let parent = ws
            .mkdir(
                Who::Trusted,
                InodeNo::ROOT,
                format!("r{round}").as_bytes(),
                NewNode::new(0o755),
            )?
            .ino;
        let names: Vec<Vec<u8>> = (0..files).map(|i| format!("f{i}").into_bytes()).collect();
        let (mut lookup, mut create, mut release) =
            (Duration::ZERO, Duration::ZERO, Duration::ZERO);
        for (i, name) in names.iter().enumerate() {
            let t = Instant::now();
            assert!(ws.lookup(Who::Trusted, parent, name).is_err());
            let t1 = Instant::now();
            let (_, opened) =
                ws.create_for_kernel(Who::Trusted, parent, name, NewNode::new(0o644), flags, true)?;
            let t2 = Instant::now();
            // What `echo $i > f$i` writes, straight into the staging file as the
            // kernel would through passthrough (not timed: no request of the store).
            if let Some(staged) = &opened.staged {
                staged.file().write_all_at(format!("{i}\n").as_bytes(), 0)?;
            }
            let t3 = Instant::now();
            ws.release(opened.handle)?;
            let t4 = Instant::now();
            lookup += t1 - t;
            create += t2 - t1;
            release += t4 - t3;
        }
        // Let the worker ingest and recycle, as the pause between two commands would.
        std::thread::sleep(Duration::from_millis(300));
        // Then what `stat` of each file asks once its attributes were invalidated: a
        // getattr with no batch of changes open.
        let inos = names
            .iter()
            .map(|name| ws.lookup(Who::Trusted, parent, name).map(|attr| attr.ino))
            .collect::<Result<Vec<_>, _>>()?;
        let t = Instant::now();
        for &ino in &inos {
            ws.getattr(ino)?;
        }
        let getattr = t.elapsed();
        let t = Instant::now();
        for name in &names {
            ws.unlink(Who::Trusted, parent, name)?;
        }
        let unlink = t.elapsed();
        std::thread::sleep(Duration::from_millis(300));
        let per = |d: Duration| d.as_secs_f64() * 1e6 / files as f64;
        lookups.push(per(lookup));
        creates.push(per(create));
        releases.push(per(release));
        getattrs.push(per(getattr));
        unlinks.push(per(unlink));
    }
    println!(
        "{files} files, median of {rounds} rounds, us per operation: lookup {:.1}  create {:.1}  release {:.1}  idle getattr {:.1}  unlink {:.1}",
        median(lookups),
        median(creates),
        median(releases),
        median(getattrs),
        median(unlinks)
    );
    Ok(())
}
