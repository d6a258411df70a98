//! `computerd umount MOUNTPOINT...`: unmounts a computerd mount and returns once its
//! daemon has let go of the database (committed what its writers left, closed it), so
//! that what follows (a copy of the database, a mount elsewhere, `computerd fs`) finds
//! it whole. umount(8) returns before that.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};

use crate::mounts;
use crate::owner::{self, Busy, Holder, OwnerLock, Role};

#[derive(clap::Args, Debug)]
pub struct UmountArgs {
    /// Detach now even if files are open inside; the daemon finishes when the last one
    /// closes (not waited for).
    #[arg(short = 'l', long)]
    lazy: bool,
    /// Longest wait, in seconds, for a daemon to finish with its database.
    #[arg(long, value_name = "SECONDS", default_value_t = owner::OWNER_WAIT.as_secs())]
    timeout: u64,
    #[arg(required = true, value_name = "MOUNTPOINT")]
    mountpoints: Vec<PathBuf>,
}

/// How often the wait looks at the owner lock again: a daemon lets go a few
/// milliseconds after the unmount, and a look (an open and a non-blocking flock) costs
/// microseconds.
const POLL_INTERVAL: Duration = Duration::from_millis(2);

pub fn run(args: UmountArgs) -> anyhow::Result<ExitCode> {
    let mut failed = false;
    for mountpoint in &args.mountpoints {
        if let Err(err) = unmount(mountpoint, &args) {
            eprintln!("computerd: {err:#}");
            failed = true;
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Unmounts the computerd mount at `mountpoint` that this process made for its own
/// use and waits up to `timeout` for its daemon to finish with the database, without
/// announcing the wait: the daemon is an implementation detail of the caller.
pub fn unmount_and_wait(mountpoint: &Path, timeout: Duration) -> anyhow::Result<()> {
    let db = computer_mount(mountpoint)?;
    detach(mountpoint, false)?;
    wait_for_daemon(&db, timeout, false)
}

fn unmount(mountpoint: &Path, args: &UmountArgs) -> anyhow::Result<()> {
    let absolute = std::path::absolute(mountpoint)
        .with_context(|| format!("{}: cannot resolve", mountpoint.display()))?;
    let db = computer_mount(&absolute)?;
    detach(&absolute, args.lazy)?;
    if args.lazy {
        return Ok(());
    }
    wait_for_daemon(&db, Duration::from_secs(args.timeout), true)
}

/// The database of the computerd mount at `mountpoint`, or why it is not one.
fn computer_mount(mountpoint: &Path) -> anyhow::Result<PathBuf> {
    let table = mounts::table().ok_or_else(|| anyhow!("cannot read the mount table"))?;
    // The last mount at a path is the one that answers there.
    let entry = table
        .iter()
        .rev()
        .find(|m| m.mountpoint == mountpoint)
        .ok_or_else(|| anyhow!("{}: not mounted", mountpoint.display()))?;
    entry.computer_db().ok_or_else(|| {
        anyhow!(
            "{}: not a computerd mount (a {} mount; umount(8) unmounts it)",
            mountpoint.display(),
            entry.fs_type
        )
    })
}

fn detach(mountpoint: &Path, lazy: bool) -> anyhow::Result<()> {
    use nix::mount::{umount2, MntFlags};
    let flags = if lazy {
        MntFlags::MNT_DETACH
    } else {
        MntFlags::empty()
    };
    match umount2(mountpoint, flags) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EBUSY) => bail!(
            "{}: busy: a process has a file open or its working directory inside \
             (`fuser -vm {0}` names them; --lazy detaches it now)",
            mountpoint.display()
        ),
        Err(nix::errno::Errno::EPERM) => bail!(
            "{}: not permitted to unmount (run as the user who mounted it, or root)",
            mountpoint.display()
        ),
        Err(errno) => Err(anyhow!("{}: {}", mountpoint.display(), errno.desc())),
    }
}

/// Waits until no process holds `db`'s owner lock: the daemon is done with it; says so
/// on stderr after a second if `announce`.
fn wait_for_daemon(db: &Path, timeout: Duration, announce: bool) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut said = false;
    loop {
        let me = Holder::me(Role::Command {
            name: "umount".into(),
        });
        let holder = match OwnerLock::try_acquire(db, me)? {
            // Taken and dropped at once: nobody was using it.
            Ok(_free) => return Ok(()),
            // Read-only media keep no lock: the daemon had nothing to write back.
            Err(Busy::Unlockable(_)) => return Ok(()),
            Err(Busy::Held(holder)) => holder,
        };
        if started.elapsed() >= timeout {
            let who = holder.map_or("a process".to_owned(), |h| h.to_string());
            bail!(
                "{}: unmounted, but {who} still holds it after {}s",
                db.display(),
                timeout.as_secs()
            );
        }
        if announce && !said && started.elapsed() >= Duration::from_secs(1) {
            if let Some(holder) = &holder {
                crate::notice::notice!(
                    "computerd: waiting for {holder} to finish with {}",
                    db.display()
                );
                said = true;
            }
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}
