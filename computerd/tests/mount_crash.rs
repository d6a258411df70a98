//! The daemon killed with SIGKILL while a program writes: the stale mount is cleared at
//! the next mount and everything whose fsync returned is there, files a program keeps
//! open and fsyncs (an SQLite database, in both journal modes) included.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{KillOnDrop, Mount};

/// Writes f000000, f000001, ... forever; every 10th file is fsync'd and its name printed
/// once the fsync returned. Content depends only on the file number. Around that, churn:
/// an unlinked file kept open, renames and unlinks of unconfirmed files, a growing log.
const WRITER: &str = r#"
import os, random, sys
def content(i):
    size = 1000 + (i * 7919) % 200000
    return random.Random(i).randbytes(size)
orphan = os.open("orphan", os.O_CREAT | os.O_RDWR, 0o644)
os.write(orphan, os.urandom(1 << 20))
os.fsync(orphan)
os.unlink("orphan")
grow = os.open("grow.log", os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
os.mkdir("moved")
i = 0
while True:
    os.write(grow, f"line {i}\n".encode() * 50)
    if i % 10 == 5:
        os.rename(f"f{i - 2:06d}", f"moved/f{i - 2:06d}")
    if i % 10 == 7:
        os.unlink(f"f{i - 3:06d}")
        os.pwrite(orphan, os.urandom(4096), i * 4096 % (1 << 20))
    name = f"f{i:06d}"
    fd = os.open(name, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    data = content(i)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    if i % 10 == 0:
        os.fsync(fd)
        print(name, flush=True)
    os.close(fd)
    i += 1
"#;

/// Checks the files named on stdin have the writer's content.
const VERIFY: &str = r#"
import os, random, sys
def content(i):
    size = 1000 + (i * 7919) % 200000
    return random.Random(i).randbytes(size)
names = sys.argv[1:]
problems = []
for name in names:
    try:
        with open(name, "rb") as f:
            got = f.read()
    except OSError as err:
        problems.append(f"{name}: {err}")
        continue
    want = content(int(name[1:]))
    if got != want:
        problems.append(f"{name}: {len(got)} bytes, want {len(want)}")
assert not problems, f"{len(problems)} of {len(names)} confirmed files are wrong:\n" + "\n".join(problems[:50])
present = [n for n in os.listdir(".") if n.startswith("f")]
print(f"{len(names)} confirmed files intact; {len(present)} files present")
"#;

/// How many fsync'd files to wait for before killing the daemon.
const CONFIRMED_BEFORE_KILL: usize = 40;

#[test]
fn kill_9_while_writing_keeps_fsynced_files() {
    let mut m = Mount::new();
    let confirmed = kill_daemon_while_running(&mut m, WRITER, &[], CONFIRMED_BEFORE_KILL);
    assert_stale(&m);
    // The database as the killed daemon left it, before any recovery: consistent, except
    // that the file unlinked while open is still there with no links (docs/STORAGE.md:
    // such orphans are deleted at the next writable open), which `check` reports.
    let out = common::computerd([
        std::ffi::OsStr::new("fs"),
        m.db.as_os_str(),
        std::ffi::OsStr::new("check"),
        std::ffi::OsStr::new("--no-progress"),
    ]);
    let report = String::from_utf8_lossy(&out.stdout);
    let unexpected: Vec<&str> = report
        .lines()
        .filter(|l| !l.starts_with("checked ") && !l.ends_with("no links and not open (orphan)"))
        .collect();
    assert!(
        unexpected.is_empty() && out.status.code().is_some_and(|c| c <= 1),
        "check of the crashed database: {}",
        common::describe_failure("computerd fs check", None, &out)
    );
    eprintln!(
        "check before recovery: {}",
        report.trim().replace('\n', " | ")
    );
    // Mounting again clears it, and only one mount remains.
    m.mount(&[]);
    assert_eq!(mount_count(&m), 1);

    eprintln!("{}", verify_in_mount(&m, VERIFY, &confirmed));
    // The workspace is usable: new files, deleting the survivors.
    m.sh("echo after > after.txt && rm -f f0* && test \"$(cat after.txt)\" = after");
    m.unmount();
    m.check_db();
}

/// A SQLite database in the workspace, committing one row at a time (every commit
/// fsyncs), printing each row's id once its commit returned. The
/// database is larger than a few blocks, so a commit changes a few pages of a large
/// file, which an fsync of a staged file must keep without storing it. After commit
/// 200 it pauses long enough for the ingest worker to store a snapshot of the open
/// file, then goes on.
const SQLITE_WRITER: &str = r#"
import sqlite3, sys, time
c = sqlite3.connect("app.db", isolation_level=None)
c.execute(f"pragma journal_mode={sys.argv[1]}")
c.execute(f"pragma synchronous={sys.argv[2]}")
c.execute("create table t(id integer primary key, v blob)")
c.execute("begin")
c.executemany("insert into t values(?, randomblob(1000))", ((-i,) for i in range(1, 8001)))
c.execute("commit")
i = 0
while True:
    i += 1
    c.execute("insert into t values(?, randomblob(?))", (i, 100 + i * 7919 % 3000))
    print(i, flush=True)
    if i == 200:
        time.sleep(2.5)
"#;

/// Checks the database is whole and holds rows 1 to `argv[1]`.
const SQLITE_VERIFY: &str = r#"
import sqlite3, sys
last = int(sys.argv[1])
c = sqlite3.connect("app.db")
check = c.execute("pragma integrity_check").fetchall()
assert check == [("ok",)], f"integrity check: {check}"
ids = {row[0] for row in c.execute("select id from t where id > 0")}
missing = [i for i in range(1, last + 1) if i not in ids]
assert not missing, f"{len(missing)} confirmed rows missing, the first {missing[:10]}"
assert c.execute("select count(*) from t where id < 0").fetchone()[0] == 8000
print(f"{last} confirmed commits intact; {len(ids)} rows present")
"#;

/// Commits the SQLite writer confirmed before the daemon was killed.
const SQLITE_COMMITS_BEFORE_KILL: usize = 400;

fn sqlite_commits_survive_kill_9(journal_mode: &str, synchronous: &str) {
    let mut m = Mount::new();
    let confirmed = kill_daemon_while_running(
        &mut m,
        SQLITE_WRITER,
        &[journal_mode, synchronous],
        SQLITE_COMMITS_BEFORE_KILL,
    );
    let last = confirmed.last().expect("confirmations").clone();
    assert_stale(&m);
    m.mount(&[]);
    let verified = verify_in_mount(&m, SQLITE_VERIFY, std::slice::from_ref(&last));
    eprintln!("{journal_mode}: {verified}");
    m.unmount();
    m.check_db();
}

#[test]
fn kill_9_keeps_every_sqlite_commit_in_wal_mode() {
    sqlite_commits_survive_kill_9("wal", "full");
}

#[test]
fn kill_9_keeps_every_sqlite_commit_with_a_rollback_journal() {
    // A commit in this mode is the unlink of the journal, which SQLite syncs (an fsync
    // of the directory) only with `synchronous = EXTRA`: with FULL the last commit may
    // come back as a hot journal and be rolled back after a power loss on a local disk,
    // or after a crash of computerd here (unsynced metadata, docs/SEMANTICS.md).
    sqlite_commits_survive_kill_9("delete", "extra");
}

/// Runs the python checker `script` with `args` in the mount; returns what it printed,
/// or fails the test with its output.
fn verify_in_mount(m: &Mount, script: &str, args: &[String]) -> String {
    let mut verify = Command::new("python3");
    verify.arg("-c").arg(script).args(args).current_dir(&m.mnt);
    let out = common::run_cmd(&mut verify, "verify", common::COMMAND_TIMEOUT);
    if !out.status.success() {
        panic!("{}", common::describe_failure("verify", Some(&m.mnt), &out));
    }
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Runs the python `script` (with `args`) in the mount until it has printed `wanted`
/// confirmations, kills the daemon with SIGKILL, waits for the script to fail (its next
/// request finds no daemon) and returns every confirmation it printed.
fn kill_daemon_while_running(
    m: &mut Mount,
    script: &str,
    args: &[&str],
    wanted: usize,
) -> Vec<String> {
    let mut writer = KillOnDrop(
        Command::new("python3")
            .arg("-c")
            .arg(script)
            .args(args)
            .current_dir(&m.mnt)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting the writer"),
    );
    // Reads the writer's confirmations as they come.
    let stdout = writer.0.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut confirmed = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while confirmed.len() < wanted {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(line) => confirmed.push(line),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if Instant::now() > deadline {
            break;
        }
    }
    if confirmed.len() < wanted {
        let _ = writer.0.kill();
        let status = writer.0.wait().unwrap();
        panic!(
            "the writer confirmed only {} of {wanted}: status {status}, stderr:\n{}",
            confirmed.len(),
            stderr_of(&mut writer.0)
        );
    }

    // Something looks at the mount point just before: the kernel caches the root's
    // attributes, so a later `stat` of the dead mount can still succeed.
    std::fs::metadata(&m.mnt).unwrap();
    m.kill_daemon();

    // The writer fails on its next request (ENOTCONN); whatever it printed was fsync'd.
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = writer.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the writer did not stop after the daemon died"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(
        !status.success(),
        "the writer exited successfully from an endless loop"
    );
    reader.join().unwrap();
    confirmed.extend(rx.try_iter());
    let stderr = stderr_of(&mut writer.0);
    eprintln!(
        "{} confirmations before the kill; the writer said: {}",
        confirmed.len(),
        stderr.trim().lines().last().unwrap_or("")
    );
    confirmed
}

/// What `child` wrote to its piped stderr (once: the pipe is taken).
fn stderr_of(child: &mut std::process::Child) -> String {
    let mut text = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = pipe.read_to_string(&mut text);
    }
    text
}

/// The mount point of a killed daemon answers ENOTCONN to requests that reach the
/// daemon (a new name, statfs); a `stat` and a listing may be answered from the
/// kernel's caches, and opening a directory never asks the daemon. Over io_uring a
/// request can still reach the dead daemon's queues while the kernel takes its ring
/// down, and is aborted (ECONNABORTED) or cancelled (ECANCELED).
fn assert_stale(m: &Mount) {
    const DEAD: [Option<i32>; 3] = [
        Some(libc::ENOTCONN),
        Some(libc::ECONNABORTED),
        Some(libc::ECANCELED),
    ];
    let err = std::fs::File::create(m.mnt.join("probe-of-a-dead-mount"))
        .expect_err("a dead mount creates a file");
    assert!(
        DEAD.contains(&err.raw_os_error()),
        "creating a file in the dead mount: {err}"
    );
    let path = std::ffi::CString::new(m.mnt.to_str().unwrap()).unwrap();
    // SAFETY: valid path and output buffer.
    let mut out: libc::statfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statfs(path.as_ptr(), &mut out) };
    let err = std::io::Error::last_os_error();
    assert!(
        rc != 0 && DEAD.contains(&err.raw_os_error()),
        "statfs of the dead mount: rc {rc}, {err}"
    );
    assert!(common::is_mounted(&m.mnt), "the stale mount vanished");
}

/// How many mounts /proc/mounts lists at the mount point.
fn mount_count(m: &Mount) -> usize {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    mounts
        .lines()
        .filter(|l| l.split(' ').nth(1) == Some(m.mnt.to_str().unwrap()))
        .count()
}

/// The stale mount of a killed daemon is cleared by the next mount even while `stat` of
/// the mount point still succeeds from the root's cached attributes.
#[test]
fn stale_mount_with_cached_root_attributes_is_cleared() {
    let mut m = Mount::new();
    m.sh("echo kept > kept.txt && sync kept.txt");
    // Cache the root's attributes (the create above invalidated them).
    std::fs::metadata(&m.mnt).unwrap();
    m.kill_daemon();
    assert_stale(&m);
    m.mount(&[]);
    assert_eq!(mount_count(&m), 1);
    assert_eq!(m.sh("cat kept.txt"), "kept\n");
    m.unmount();
    m.check_db();
}

/// Killed twice in a row, idle: each next mount clears the stale one.
#[test]
fn repeated_kill_and_remount() {
    let mut m = Mount::new();
    for round in 0..3 {
        m.sh(&format!("echo {round} > round{round}.txt"));
        m.py("import os; fd = os.open('.', os.O_RDONLY); os.fsync(fd)");
        m.kill_daemon();
        assert_stale(&m);
        m.mount(&[]);
        assert_eq!(mount_count(&m), 1);
    }
    assert_eq!(m.sh("cat round0.txt round1.txt round2.txt"), "0\n1\n2\n");
    m.unmount();
    m.check_db();
}

/// A file synced through a mount killed while it was still open for writing: its
/// content waits in a staging file. `computerd fs DB cat`, reading the database the
/// daemon left, shows that content (it takes the file in, as the next mount would),
/// while `fs check` reports the database as it was left.
#[test]
fn reading_what_a_killed_mount_left_takes_in_its_staged_files() {
    use std::io::Write;
    let mut m = Mount::new();
    // What the store holds of it is this, or an empty file if the kill comes first.
    m.sh("echo stored > f");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(m.path("f"))
        .unwrap();
    file.write_all(b"synced while open\n").unwrap();
    file.sync_all().unwrap();
    m.kill_daemon();
    drop(file);
    let checked = common::fs_db(&m.db, &["check", "--no-progress"], b"");
    assert!(
        checked.status.success(),
        "{}",
        common::text(&checked.stdout)
    );
    let read = common::fs_db_ok(&m.db, &["cat", "/f"], b"");
    assert_eq!(read, b"synced while open\n");
    m.mount(&[]);
    assert_eq!(m.sh("cat f"), "synced while open\n");
    m.unmount();
    m.check_db();
}
