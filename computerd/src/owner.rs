//! One owner per workspace database.
//!
//! Exactly one process writes a database: the one that mounts or serves it, for as long
//! as it runs, or a `computerd fs` command for as long as it runs. It holds an exclusive
//! `flock` on `DB.owner`, a small file beside the database that also says who holds it
//! (pid, what it does, where), whether it is still serving or finishing (committing
//! after its unmount), and for a mount or server the local channel that takes file
//! commands for it. The kernel drops the lock when the process dies, however it dies,
//! so a crash never leaves a database owned by nobody-forever.
//!
//! What the others do when the lock is held:
//! - a `computerd fs` command goes through the owner's channel (so it reads what the
//!   mount wrote, and its writes are the mount's: never undone by it, and the kernel is
//!   told to forget what it cached), or, if the owner is another command or is
//!   finishing, waits for it (bounded, saying so);
//! - a second mount or server is refused with one line naming the holder, unless the
//!   holder is finishing or is a command, which it waits for (bounded, saying so).
//!
//! The file is removed by its owner at a clean exit. A process that opened it just
//! before could then lock a file nobody else can find; so a lock counts only once the
//! path still names the locked file.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};

/// How long a process waits for an owner that is finishing or is a file command.
pub const OWNER_WAIT: Duration = Duration::from_secs(120);
/// How long a holder may take to say who it is before a newcomer gives up on it.
const UNSAID_WAIT: Duration = Duration::from_secs(2);
/// How long a waiter sleeps between tries of the lock.
const RETRY_INTERVAL: Duration = Duration::from_millis(20);
/// The longest owner file read: a few short lines.
const OWNER_FILE_BYTES_MAX: u64 = 16 << 10;

/// Where the owner lock of the database at `db` lives: beside the file SQLite opens,
/// so that every name of one database (a symbolic link, a relative path) finds one
/// lock.
pub fn owner_path(db: &Path) -> PathBuf {
    let mut name = computer_vfs::real_path(db).into_os_string();
    name.push(".owner");
    PathBuf::from(name)
}

/// What a holder does with the database.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// `computerd mount` (local, or the cache of a replica) at this mount point.
    Mount { mountpoint: PathBuf, replica: bool },
    /// `computerd serve` at this address.
    Serve { address: String },
    /// A `computerd fs` command.
    Command { name: String },
}

impl Role {
    /// The role's word in the owner file and in `computerd status`.
    pub fn name(&self) -> &'static str {
        match self {
            Role::Mount { replica: false, .. } => "mount",
            Role::Mount { replica: true, .. } => "replica-mount",
            Role::Serve { .. } => "serve",
            Role::Command { .. } => "fs",
        }
    }

    /// Where it answers: a mount point, an address, or a command's name.
    pub fn at(&self) -> String {
        match self {
            Role::Mount { mountpoint, .. } => mountpoint.display().to_string(),
            Role::Serve { address } => address.clone(),
            Role::Command { name } => name.clone(),
        }
    }
}

/// Whether a holder still serves or is on its way out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Opening the database, catching up with a server, mounting.
    Starting,
    Serving,
    /// Unmounted or signalled: committing what is left before it exits.
    Finishing,
}

impl Phase {
    /// The phase's word in the owner file and in `computerd status`.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Starting => "starting",
            Phase::Serving => "serving",
            Phase::Finishing => "finishing",
        }
    }
}

/// The local channel that runs file commands for the owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Channel {
    /// A Unix socket serving the sync protocol's `fs` calls.
    pub socket: PathBuf,
    /// The token its gate asks for (the owner file is readable by its owner only).
    pub token: String,
}

/// Who holds a database, as its owner file says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    pub role: Role,
    pub phase: Phase,
    pub channel: Option<Channel>,
    /// A mount's transport once it serves: `io_uring` or `/dev/fuse`.
    pub transport: Option<String>,
}

impl Holder {
    /// This process in `role`, starting, with no channel yet.
    pub fn me(role: Role) -> Holder {
        Holder {
            pid: std::process::id(),
            role,
            phase: Phase::Starting,
            channel: None,
            transport: None,
        }
    }

    /// The owner file's text: one `key=value` per line.
    fn render(&self) -> String {
        let mut out = format!(
            "pid={}\nrole={}\nat={}\nphase={}\n",
            self.pid,
            self.role.name(),
            self.role.at(),
            self.phase.name()
        );
        if let Some(channel) = &self.channel {
            out += &format!(
                "socket={}\ntoken={}\n",
                channel.socket.display(),
                channel.token
            );
        }
        if let Some(transport) = &self.transport {
            out += &format!("transport={transport}\n");
        }
        out
    }

    /// Parses an owner file; `None` for one being written or not ours to read.
    fn parse(text: &str) -> Option<Holder> {
        let field = |key: &str| {
            text.lines()
                .find_map(|line| line.strip_prefix(key)?.strip_prefix('='))
        };
        let at = field("at").unwrap_or("").to_owned();
        let role = match field("role")? {
            "mount" | "replica-mount" => Role::Mount {
                mountpoint: PathBuf::from(at),
                replica: field("role")? == "replica-mount",
            },
            "serve" => Role::Serve { address: at },
            "fs" => Role::Command { name: at },
            _ => return None,
        };
        let phase = [Phase::Starting, Phase::Serving, Phase::Finishing]
            .into_iter()
            .find(|phase| Some(phase.name()) == field("phase"))?;
        let channel = match (field("socket"), field("token")) {
            (Some(socket), Some(token)) => Some(Channel {
                socket: PathBuf::from(socket),
                token: token.to_owned(),
            }),
            _ => None,
        };
        Some(Holder {
            pid: field("pid")?.parse().ok()?,
            role,
            phase,
            channel,
            transport: field("transport").map(str::to_owned),
        })
    }

    /// Whether a newcomer should wait for this holder rather than be refused: it is on
    /// its way out, or it is a command, which ends by itself. (A second mount or server
    /// waits for these only.)
    pub fn will_leave(&self) -> bool {
        match (&self.role, self.phase) {
            (_, Phase::Finishing) | (Role::Command { .. }, _) => true,
            // Unmounted from outside (umount(8)): it notices within a moment, then
            // finishes.
            (Role::Mount { mountpoint, .. }, Phase::Serving) => {
                !crate::mounts::is_mount_point(mountpoint)
            }
            _ => false,
        }
    }

    /// Whether a file command should wait for this holder: it will leave, or it is a
    /// local mount or server about to offer its channel (it opens the database first).
    pub fn will_leave_or_answer(&self) -> bool {
        let replica = matches!(self.role, Role::Mount { replica: true, .. });
        self.will_leave() || (self.channel.is_none() && !replica)
    }
}

impl std::fmt::Display for Holder {
    /// `computerd pid 123 (mounted at /mnt/ws)`, for messages.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "computerd pid {} (", self.pid)?;
        match &self.role {
            Role::Mount {
                mountpoint,
                replica: false,
            } => write!(f, "mounted at {}", mountpoint.display())?,
            Role::Mount {
                mountpoint,
                replica: true,
            } => write!(f, "a replica mounted at {}", mountpoint.display())?,
            Role::Serve { address } => write!(f, "serving at {address}")?,
            Role::Command { name } => write!(f, "running fs {name}")?,
        }
        if self.phase == Phase::Finishing {
            write!(f, ", finishing")?;
        }
        write!(f, ")")
    }
}

/// The lock on a database, held until dropped (or the process exits).
pub struct OwnerLock {
    file: File,
    path: PathBuf,
    holder: Holder,
    /// A mount's or server's entry for `computerd status`.
    _listed: Option<crate::registry::Registration>,
}

/// Why the lock could not be taken.
pub enum Busy {
    /// Another process holds it; `None` while it has not said who it is yet.
    Held(Option<Holder>),
    /// The lock file cannot be made here (read-only media, a directory not ours).
    Unlockable(std::io::Error),
}

impl OwnerLock {
    /// Takes the lock on `db` for `holder` if nobody holds it.
    pub fn try_acquire(db: &Path, holder: Holder) -> anyhow::Result<Result<OwnerLock, Busy>> {
        let path = owner_path(db);
        loop {
            let file = match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .custom_flags(libc::O_CLOEXEC)
                .open(&path)
            {
                Ok(file) => file,
                Err(err) if unlockable(&err) => return Ok(Err(Busy::Unlockable(err))),
                Err(err) => {
                    return Err(err).with_context(|| format!("{}: cannot open", path.display()))
                }
            };
            // SAFETY: a valid descriptor we own.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                let err = std::io::Error::last_os_error();
                if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
                    return Err(err).with_context(|| format!("{}: cannot lock", path.display()));
                }
                return Ok(Err(Busy::Held(read_holder(&path))));
            }
            // The previous owner may have removed the file between our open and our
            // lock: then this lock guards nothing, and the path must be opened again.
            let locked = file.metadata().context("reading the owner file")?;
            match std::fs::metadata(&path) {
                Ok(now) if now.ino() == locked.ino() && now.dev() == locked.dev() => {}
                _ => continue,
            }
            let listed = match holder.role {
                Role::Mount { .. } | Role::Serve { .. } => {
                    crate::registry::register(&std::path::absolute(db).unwrap_or(db.into()))
                }
                Role::Command { .. } => None,
            };
            let mut lock = OwnerLock {
                file,
                path,
                holder: holder.clone(),
                _listed: listed,
            };
            lock.publish(holder)?;
            return Ok(Ok(lock));
        }
    }

    /// Takes the lock on `db`, waiting (at most [`OWNER_WAIT`], and saying so once on
    /// stderr) for a holder `wait_for` accepts; returns any other holder. `Ok(None)` when
    /// the lock cannot exist here and `read_only` allows going on without it (nobody can
    /// write on read-only media).
    pub fn acquire(
        db: &Path,
        holder: Holder,
        read_only: bool,
        wait_for: fn(&Holder) -> bool,
    ) -> anyhow::Result<Result<Option<OwnerLock>, Holder>> {
        let started = Instant::now();
        let mut said = false;
        loop {
            let other = match OwnerLock::try_acquire(db, holder.clone())? {
                Ok(lock) => return Ok(Ok(Some(lock))),
                Err(Busy::Unlockable(_)) if read_only => return Ok(Ok(None)),
                Err(Busy::Unlockable(err)) if err.raw_os_error() == Some(libc::EROFS) => {
                    bail!(
                        "{}: on read-only storage: it can be read, not changed",
                        db.display()
                    )
                }
                Err(Busy::Unlockable(err)) => {
                    return Err(err).with_context(|| {
                        format!(
                            "{}: cannot make the owner lock beside the database",
                            owner_path(db).display()
                        )
                    })
                }
                Err(Busy::Held(other)) => other,
            };
            match other {
                Some(other) if !wait_for(&other) => return Ok(Err(other)),
                Some(other) if started.elapsed() > OWNER_WAIT => bail!(
                    "{}: still in use after {}s by {other}",
                    db.display(),
                    OWNER_WAIT.as_secs()
                ),
                Some(other) if !said => {
                    crate::notice::notice!(
                        "computerd: {}: waiting for {other} to finish with it",
                        db.display()
                    );
                    said = true;
                }
                // An owner writes who it is right after it locks.
                None if started.elapsed() > UNSAID_WAIT => bail!(
                    "{}: in use by a process that does not say who it is (is {} another \
                     user's?)",
                    db.display(),
                    owner_path(db).display()
                ),
                _ => {}
            }
            std::thread::sleep(RETRY_INTERVAL);
        }
    }

    /// Says who holds the lock now (the whole file is rewritten in place).
    pub fn publish(&mut self, holder: Holder) -> anyhow::Result<()> {
        let text = holder.render();
        self.file
            .set_len(0)
            .and_then(|()| std::os::unix::fs::FileExt::write_all_at(&self.file, text.as_bytes(), 0))
            .and_then(|()| self.file.flush())
            .with_context(|| format!("{}: cannot write", self.path.display()))?;
        self.holder = holder;
        Ok(())
    }

    /// Says this owner serves now (a mount: the kernel answers at its mount point,
    /// its requests carried over `transport`).
    pub fn serving(&mut self, transport: Option<&str>) -> anyhow::Result<()> {
        let mut holder = self.holder.clone();
        holder.phase = Phase::Serving;
        holder.transport = transport.map(str::to_owned);
        self.publish(holder)
    }

    /// Says this owner is finishing: a newcomer waits for it instead of being refused.
    pub fn finishing(&mut self) {
        let mut holder = self.holder.clone();
        holder.phase = Phase::Finishing;
        holder.channel = None;
        if let Err(err) = self.publish(holder) {
            tracing::debug!("{err:#}");
        }
    }

    /// Publishes the channel that runs file commands for this owner.
    pub fn offer(&mut self, channel: Channel) -> anyhow::Result<()> {
        let mut holder = self.holder.clone();
        holder.channel = Some(channel);
        self.publish(holder)
    }
}

impl Drop for OwnerLock {
    fn drop(&mut self) {
        // Removed while still locked; the lock itself goes with the descriptor.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Whether a process holds the owner lock on `db` now (a shared probe of the lock,
/// released at once).
pub fn is_held(db: &Path) -> bool {
    let Ok(file) = File::open(owner_path(db)) else {
        return false;
    };
    // SAFETY: a valid descriptor we own; the probe's lock goes with it.
    let probe = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
    probe != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EWOULDBLOCK)
}

/// Whether opening the owner file failed because none can be made there.
fn unlockable(err: &std::io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(libc::EROFS) | Some(libc::EACCES) | Some(libc::EPERM)
    )
}

/// The holder the owner file at `path` names, if it says yet and we may read it.
pub fn read_holder(path: &Path) -> Option<Holder> {
    let mut text = String::new();
    File::open(path)
        .ok()?
        .take(OWNER_FILE_BYTES_MAX)
        .read_to_string(&mut text)
        .ok()?;
    Holder::parse(&text)
}

/// Refuses a second mount or server: one line naming the holder.
pub fn held_error(db: &Path, holder: &Holder) -> anyhow::Error {
    let what = match &holder.role {
        Role::Mount { .. } => "unmount it first",
        Role::Serve { .. } => "stop that server first, or mount a replica of it",
        Role::Command { .. } => "wait for it to end",
    };
    anyhow!("{}: in use by {holder}; {what}", db.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount_holder() -> Holder {
        Holder::me(Role::Mount {
            mountpoint: PathBuf::from("/mnt/ws"),
            replica: false,
        })
    }

    /// A database path in a new directory, and the lock on it, taken by a mount.
    fn locked() -> (tempfile::TempDir, PathBuf, OwnerLock) {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("ws.db");
        let lock = OwnerLock::try_acquire(&db, mount_holder())
            .unwrap()
            .ok()
            .expect("a free database's lock");
        (dir, db, lock)
    }

    #[test]
    fn holders_read_back_as_written() {
        let mut holder = mount_holder();
        assert_eq!(Holder::parse(&holder.render()), Some(holder.clone()));
        holder.phase = Phase::Finishing;
        holder.channel = Some(Channel {
            socket: PathBuf::from("/tmp/ws.db.owner.sock"),
            token: "ab12".into(),
        });
        assert_eq!(Holder::parse(&holder.render()), Some(holder.clone()));
        holder.transport = Some("/dev/fuse".into());
        assert_eq!(Holder::parse(&holder.render()), Some(holder.clone()));
        let serve = Holder::me(Role::Serve {
            address: "tcp:127.0.0.1:7000".into(),
        });
        assert_eq!(Holder::parse(&serve.render()), Some(serve));
        assert_eq!(Holder::parse(""), None);
        holder.phase = Phase::Starting;
        assert_eq!(Holder::parse(&holder.render()), Some(holder.clone()));
        assert_eq!(Holder::parse("pid=1\nrole=mount\n"), None);
    }

    #[test]
    fn one_lock_at_a_time_and_the_file_goes_with_it() {
        let (_dir, db, lock) = locked();
        // flock locks belong to open files: a second open in this process conflicts
        // just as another process's would.
        match OwnerLock::try_acquire(&db, mount_holder()).unwrap() {
            Err(Busy::Held(Some(holder))) => {
                assert_eq!(holder, mount_holder());
                assert!(!holder.will_leave());
            }
            _ => panic!("a second lock was granted"),
        }
        drop(lock);
        assert!(!owner_path(&db).exists());
        let again = OwnerLock::try_acquire(&db, mount_holder()).unwrap();
        assert!(again.is_ok());
    }

    #[test]
    fn a_serving_mount_whose_mount_point_is_gone_will_leave() {
        let dir = tempfile::tempdir().unwrap();
        // A serving mount whose mount point is gone is on its way out.
        let gone = Holder {
            phase: Phase::Serving,
            ..Holder::me(Role::Mount {
                mountpoint: dir.path().to_owned(),
                replica: false,
            })
        };
        assert!(gone.will_leave());
        assert!(!Holder {
            phase: Phase::Starting,
            ..gone
        }
        .will_leave());
    }

    #[test]
    fn a_finishing_owner_is_waited_for() {
        let (_dir, db, mut lock) = locked();
        lock.finishing();
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            drop(lock);
        });
        let got = OwnerLock::acquire(&db, mount_holder(), false, Holder::will_leave).unwrap();
        assert!(matches!(got, Ok(Some(_))));
        release.join().unwrap();
    }

    #[test]
    fn a_serving_owner_refuses_at_once() {
        let (_dir, db, _lock) = locked();
        match OwnerLock::acquire(&db, mount_holder(), false, Holder::will_leave).unwrap() {
            Err(holder) => {
                let message = held_error(&db, &holder).to_string();
                assert!(message.contains("mounted at /mnt/ws"), "{message}");
                assert!(message.contains(&format!("pid {}", std::process::id())));
            }
            Ok(_) => panic!("a second owner was let in"),
        }
    }

    #[test]
    fn a_missing_directory_is_an_error_not_read_only_media() {
        let dir = tempfile::tempdir().unwrap();
        let ro = dir.path().join("ro");
        std::fs::create_dir(&ro).unwrap();
        let db = ro.join("ws.db");
        // Only EROFS, EACCES and EPERM mean read-only media; a directory that does not
        // exist is the caller's mistake.
        std::fs::remove_dir(&ro).unwrap();
        assert!(OwnerLock::acquire(&db, mount_holder(), true, Holder::will_leave).is_err());
    }
}
