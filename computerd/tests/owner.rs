//! One owner per workspace database (computerd/src/owner.rs), through real processes
//! and real mounts: a second mount is refused naming the first, a mount right after an
//! unmount waits for the old daemon instead of racing it, and `computerd fs DB` on a
//! mounted database runs in the mount's process, so it reads what the mount wrote and
//! the mount never undoes what it wrote.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{describe_failure, run_cmd, wait_exit, Exited, Mount, BIN};

#[test]
fn a_second_mount_of_a_database_is_refused_naming_the_first() {
    let m = Mount::new();
    let second = m.root.join("second");
    let mut cmd = Command::new(BIN);
    cmd.arg("mount").arg(&m.db).arg(&second).arg("--daemon");
    let out = run_cmd(&mut cmd, "a second mount", Duration::from_secs(60));
    assert!(!out.status.success(), "a second mount of one database ran");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("pid {}", m.pid())) && stderr.contains(&*m.mnt.to_string_lossy()),
        "the refusal does not name the owner: {stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        !second.exists(),
        "a refused mount left its mount point behind"
    );
    // A server of it is refused the same way.
    let mut cmd = Command::new(BIN);
    cmd.arg("serve")
        .arg(&m.db)
        .arg("--listen")
        .arg(m.root.join("serve.sock"))
        .env("COMPUTERD_TOKEN", "t");
    let out = run_cmd(
        &mut cmd,
        "a server of a mounted database",
        Duration::from_secs(60),
    );
    assert!(!out.status.success(), "a server of a mounted database ran");
    assert!(String::from_utf8_lossy(&out.stderr).contains("in use by"));
}

#[test]
fn file_commands_on_a_mounted_database_run_in_the_mount() {
    let m = Mount::new();
    // Closed through the mount a moment ago, still in its staging file: read back whole.
    for round in 0..5 {
        let content = format!("round {round}\n").repeat(1000);
        std::fs::write(m.path("v.txt"), &content).unwrap();
        assert_eq!(m.fs_ok(&["cat", "/v.txt"], b""), content.as_bytes());
    }
    // A write through the command is the mount's own: visible there at once (the
    // kernel forgot its cached attributes and pages), and never undone by the staged
    // copy the mount still holds.
    m.fs_ok(&["write", "/v.txt"], b"from the command\n");
    assert_eq!(
        std::fs::read(m.path("v.txt")).unwrap(),
        b"from the command\n"
    );
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        std::fs::read(m.path("v.txt")).unwrap(),
        b"from the command\n"
    );
    // A listing the kernel keeps (FOPEN_CACHE_DIR) follows the command's changes.
    std::fs::create_dir(m.path("l")).unwrap();
    for name in ["a", "b"] {
        std::fs::write(m.path(format!("l/{name}")), name).unwrap();
    }
    assert_eq!(common::list_dir(&m.path("l")), ["a", "b"]);
    m.fs_ok(&["write", "/l/c"], b"c");
    m.fs_ok(&["rm", "/l/a"], b"");
    m.fs_ok(&["mv", "/l/b", "/l/b2"], b"");
    assert_eq!(common::list_dir(&m.path("l")), ["b2", "c"]);
    // Removals and new directories reach the kernel's view of the tree too.
    m.fs_ok(&["mkdir", "-p", "/d/e"], b"");
    assert!(m.path("d/e").is_dir());
    m.fs_ok(&["rm", "-r", "/d"], b"");
    assert!(!m.path("d").exists());
    // Errors come back as the command's own, with its exit status.
    let out = m.fs(&["cat", "/missing"], b"");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/missing: no such file"));
}

/// An append by the command to a file the mount wrote a moment ago goes into its
/// staging file and takes no revision until the file is ingested; the kernel must
/// still forget the size and pages it holds, or the next write through the mount,
/// placed at the old end, would overwrite what the command added.
#[test]
fn an_append_by_the_command_to_a_staged_file_reaches_the_kernel() {
    // With the kernel opening files itself, nothing asks the daemon at the next open.
    for args in [&[][..], &["--cached-opens"][..]] {
        appends_by_the_command_reach_the_kernel(&Mount::with_args(args));
    }
}

fn appends_by_the_command_reach_the_kernel(m: &Mount) {
    for round in 0..3 {
        let name = format!("log{round}");
        std::fs::write(m.path(&name), b"one\n").unwrap();
        assert_eq!(std::fs::read(m.path(&name)).unwrap(), b"one\n");
        m.fs_ok(&["write", "--append", &format!("/{name}")], b"two\n");
        assert_eq!(
            std::fs::read(m.path(&name)).unwrap(),
            b"one\ntwo\n",
            "round {round}"
        );
        m.sh(&format!("echo three >> {name}"));
        assert_eq!(
            m.fs_ok(&["cat", &format!("/{name}")], b""),
            b"one\ntwo\nthree\n"
        );
    }
}

/// A symbolic link to a mounted database, or a path through a linked directory, names
/// the same database to SQLite, so it names the same owner: the command runs in the
/// mount and reads what the mount has not checkpointed yet, and a second mount
/// through the link is refused.
#[test]
fn every_name_of_a_mounted_database_finds_its_owner() {
    let m = Mount::new();
    std::fs::write(m.path("a"), b"through the mount\n").unwrap();
    let link = m.root.join("link.db");
    std::os::unix::fs::symlink(&m.db, &link).unwrap();
    let linked_dir = m.root.join("linked-dir");
    std::os::unix::fs::symlink(m.db.parent().unwrap(), &linked_dir).unwrap();
    let via_dir = linked_dir.join(m.db.file_name().unwrap());
    for name in [&link, &via_dir] {
        assert_eq!(
            common::fs_db_ok(name, &["cat", "/a"], b""),
            b"through the mount\n"
        );
        common::fs_db_ok(name, &["write", "/b"], b"through the link\n");
        assert_eq!(std::fs::read(m.path("b")).unwrap(), b"through the link\n");
    }
    let second = m.root.join("second");
    let mut cmd = Command::new(BIN);
    cmd.arg("mount").arg(&link).arg(&second).arg("--daemon");
    let out = run_cmd(&mut cmd, "a mount through a link", Duration::from_secs(60));
    assert!(!out.status.success(), "a second mount through a link ran");
    assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("pid {}", m.pid())));
}

#[test]
fn writes_through_the_mount_and_the_command_race_without_loss() {
    let m = Mount::new();
    let mount_writes = m.mnt.clone();
    let writer = std::thread::spawn(move || {
        for i in 0..100 {
            std::fs::write(mount_writes.join(format!("m{i}")), format!("mount {i}\n")).unwrap();
        }
    });
    for i in 0..40 {
        m.fs_ok(
            &["write", &format!("/c{i}")],
            format!("command {i}\n").as_bytes(),
        );
    }
    writer.join().unwrap();
    for i in 0..100 {
        assert_eq!(
            m.fs_ok(&["cat", &format!("/m{i}")], b""),
            format!("mount {i}\n").as_bytes()
        );
    }
    for i in 0..40 {
        assert_eq!(
            std::fs::read(m.path(format!("c{i}"))).unwrap(),
            format!("command {i}\n").as_bytes()
        );
    }
}

/// The workload of issue 13: an SQLite database in the workspace (rollback journal),
/// updated, then the workspace unmounted and mounted again at once, as scripts do.
const SQLITE_WORK: &str = r#"
import sqlite3, sys
ROWS = 200000
db = sqlite3.connect("app.sqlite", isolation_level=None)
if sys.argv[1] == "create":
    db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
    db.execute("BEGIN")
    db.executemany("INSERT INTO t (v) VALUES (?)", (("x" * 100,) for _ in range(ROWS)))
    db.execute("COMMIT")
for i in range(5):
    db.execute("UPDATE t SET v = ? WHERE id = ?", ("y" * 90, 1 + i * 37000))
assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
db.close()
"#;

#[test]
fn a_mount_right_after_an_unmount_waits_for_the_old_daemon() {
    let mut m = Mount::new();
    let script = m.scratch.join("work.py");
    std::fs::write(&script, SQLITE_WORK).unwrap();
    let run = |m: &Mount, step: &str| {
        let out = run_cmd(
            Command::new("python3")
                .arg(&script)
                .arg(step)
                .current_dir(&m.mnt),
            "sqlite work",
            Duration::from_secs(120),
        );
        assert!(
            out.status.success(),
            "{}",
            describe_failure("sqlite work", Some(&m.mnt), &out)
        );
    };
    run(&m, "create");
    for _ in 0..3 {
        let old = m.unmount_without_waiting();
        // No wait for the old daemon: the new one must.
        m.mount(&[]);
        run(&m, "update");
        assert!(
            !matches!(wait_exit(old, Duration::from_secs(60)), Exited::TimedOut),
            "the old daemon did not exit"
        );
    }
    m.unmount();
    m.check_db();
}

#[test]
fn a_replica_cache_takes_no_file_commands() {
    let server = common::Server::start();
    server.fs_ok(&["write", "/s.txt"], b"served\n");
    let replica = Mount::replica(&server, &[]);
    let out = replica.fs(&["ls", "/"], b"");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("a replica mounted at") && stderr.contains("work through its mount"),
        "{stderr}"
    );
    // The server's database, though, takes them through the server.
    assert_eq!(
        common::fs_db_ok(&server.db, &["cat", "/s.txt"], b""),
        b"served\n"
    );
    common::fs_db_ok(&server.db, &["write", "/t.txt"], b"through the owner\n");
    assert_eq!(
        server.fs_ok(&["cat", "/t.txt"], b""),
        b"through the owner\n"
    );
}

#[test]
fn compact_of_a_mounted_database_runs_in_the_mount() {
    let m = Mount::new();
    m.sh("mkdir d && for i in $(seq 20); do head -c 1048576 /dev/urandom > d/$i; done; sync");
    m.sh("rm -r d; echo kept > kept; sync");
    let out = String::from_utf8(m.fs_ok(&["compact"], b"")).unwrap();
    assert!(out.starts_with("compacted: "), "{out}");
    // Whatever the background had given back already, none is left free, and the
    // database with its log holds little more than the one file left.
    let stats = String::from_utf8(m.fs_ok(&["stats", "--json"], b"")).unwrap();
    assert!(stats.contains("\"free_bytes\":0"), "{stats}");
    let on_disk = ["", "-wal"]
        .iter()
        .map(|suffix| {
            let mut name = m.db.as_os_str().to_owned();
            name.push(suffix);
            std::fs::metadata(name).map_or(0, |meta| meta.len())
        })
        .sum::<u64>();
    assert!(
        on_disk < 1 << 20,
        "{on_disk} bytes on disk after compact: {out}"
    );
    assert_eq!(m.sh("cat kept"), "kept\n");
}

#[test]
fn computerd_umount_returns_once_the_daemon_let_go_of_the_database() {
    let mut m = Mount::new();
    m.sh("head -c 30000000 /dev/urandom > big; echo hi > small");
    // A process with its working directory inside keeps the mount busy: refused, and
    // still mounted.
    let mut inside = Command::new("sleep");
    inside.arg("30").current_dir(&m.mnt);
    let mut inside = inside.spawn().unwrap();
    let mut cmd = Command::new(BIN);
    cmd.arg("umount").arg(&m.mnt);
    let busy = run_cmd(&mut cmd, "computerd umount (busy)", Duration::from_secs(60));
    let _ = inside.kill();
    let _ = inside.wait();
    assert_eq!(busy.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&busy.stderr);
    assert!(
        stderr.contains(": busy: ") && stderr.lines().count() == 1,
        "{stderr}"
    );
    assert!(common::is_mounted(&m.mnt));

    let out = m.unmount_with_computerd();
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    // Done with the database when it returned: nobody holds it, it opens at once.
    assert!(!common::is_mounted(&m.mnt));
    let mut owner = m.db.as_os_str().to_owned();
    owner.push(".owner");
    assert!(
        !std::path::Path::new(&owner).exists(),
        "the owner file is still there"
    );
    assert_eq!(m.fs_ok(&["cat", "/small"], b""), b"hi\n");

    // What it refuses, in one line each.
    for (path, says) in [
        (m.mnt.clone(), "not mounted".to_owned()),
        (
            "/proc".into(),
            "not a computerd mount (a proc mount".to_owned(),
        ),
    ] {
        let mut cmd = Command::new(BIN);
        cmd.arg("umount").arg(&path);
        let out = run_cmd(&mut cmd, "computerd umount", Duration::from_secs(60));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(&says), "{stderr}");
    }
}

/// `computerd status --json`'s objects for `db` (several processes may list others).
fn status_of(db: &std::path::Path) -> Vec<String> {
    let mut cmd = Command::new(BIN);
    cmd.args(["status", "--json"]);
    let out = run_cmd(&mut cmd, "computerd status --json", Duration::from_secs(60));
    assert!(
        out.status.success(),
        "{}",
        describe_failure("status", None, &out)
    );
    let json = String::from_utf8(out.stdout).unwrap();
    // Parsed by a real JSON parser; each object of this database printed back whole,
    // keys sorted.
    let script = "import json, sys\n\
                  for o in json.loads(sys.argv[1]):\n\
                  \x20   if o['database'] == sys.argv[2]:\n\
                  \x20       print(json.dumps(o, sort_keys=True))\n";
    let out = Command::new("python3")
        .args(["-c", script, &json])
        .arg(db)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "not JSON: {json}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn status_lists_mounts_and_servers_and_forgets_them_when_they_end() {
    let mut m = Mount::new();
    m.sh("echo hi > a; sync");
    let listed = status_of(&m.db);
    assert_eq!(listed.len(), 1, "{listed:?}");
    let mount = &listed[0];
    for field in [
        "\"role\": \"mount\"".to_owned(),
        format!("\"at\": \"{}\"", m.mnt.display()),
        "\"phase\": \"serving\"".to_owned(),
        "\"sync\": null".to_owned(),
    ] {
        assert!(mount.contains(&field), "{field} in {mount}");
    }
    assert!(!mount.contains("\"revision\": null"), "{mount}");
    let over_dev = common::mounts_with("--no-io-uring");
    assert!(
        mount.contains("\"transport\": \"/dev/fuse\"")
            || (!over_dev && mount.contains("\"transport\": \"io_uring\"")),
        "{mount}"
    );

    let server = common::Server::start();
    let replica = Mount::replica(&server, &[]);
    replica.sh("echo x > x");
    let listed = status_of(&server.db);
    assert!(
        listed.len() == 1
            && listed[0].contains("\"role\": \"serve\"")
            && listed[0].contains("\"transport\": null"),
        "{listed:?}"
    );
    let listed = status_of(&replica.db);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(
        listed[0].contains("\"role\": \"replica-mount\""),
        "{listed:?}"
    );
    assert!(listed[0].contains("\"connected\": true"), "{listed:?}");

    // The table names the same, one line each.
    let mut cmd = Command::new(BIN);
    cmd.arg("status");
    let table = run_cmd(&mut cmd, "computerd status", Duration::from_secs(60));
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    assert!(table.starts_with("PID "), "{table}");
    let line = table
        .lines()
        .find(|l| l.contains(m.db.to_str().unwrap()))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        line.contains(" mount ") && line.contains(" serving "),
        "{line}"
    );

    m.unmount();
    assert_eq!(status_of(&m.db), Vec::<String>::new());
}

/// Unmounts `0` (lazily, if busy) when dropped: a failing test leaves no mount behind.
struct UnmountOnDrop(std::path::PathBuf);

impl Drop for UnmountOnDrop {
    fn drop(&mut self) {
        if common::is_mounted(&self.0) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

#[test]
fn quiet_says_no_more_than_results_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    let _cleanup = UnmountOnDrop(mnt.clone());
    let run = |args: &[&std::ffi::OsStr]| {
        let mut cmd = Command::new(BIN);
        cmd.args(args).env("NO_COLOR", "1");
        run_cmd(&mut cmd, "computerd", Duration::from_secs(60))
    };
    let (q, db, mnt_arg) = (
        std::ffi::OsStr::new("-q"),
        dir.path().join("new.db"),
        mnt.as_os_str(),
    );
    // Without -q a mount that makes a workspace says so; with it, nothing.
    let loud = run(&[
        "mount".as_ref(),
        db.as_os_str(),
        mnt_arg,
        "--daemon".as_ref(),
    ]);
    assert!(
        loud.status.success(),
        "{}",
        describe_failure("mount", None, &loud)
    );
    assert!(String::from_utf8_lossy(&loud.stderr).contains("making a new workspace"));
    let out = run(&[q, "umount".as_ref(), mnt_arg]);
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "{}",
        describe_failure("umount", None, &out)
    );
    let db = dir.path().join("other.db");
    let quiet = run(&[
        q,
        "mount".as_ref(),
        db.as_os_str(),
        mnt_arg,
        "--daemon".as_ref(),
    ]);
    assert!(
        quiet.status.success(),
        "{}",
        describe_failure("mount -q", None, &quiet)
    );
    assert_eq!(String::from_utf8_lossy(&quiet.stderr), "");
    let out = run(&[q, "umount".as_ref(), mnt_arg]);
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "{}",
        describe_failure("umount", None, &out)
    );
    // Errors are never silenced.
    let out = run(&[q, "umount".as_ref(), mnt_arg]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not mounted"));
}

#[test]
fn files_of_any_size_stream_through_the_owner() {
    let m = Mount::new();
    // Larger than one message may hold (and than the 24 MiB a command line's output
    // could be before protocol version 3): cat and write stream.
    let big: Vec<u8> = (0..(40u64 << 20) + 3)
        .map(|i| (i * 13 % 241) as u8)
        .collect();
    std::fs::write(m.path("through-mount"), &big).unwrap();
    // Closed a moment ago, perhaps not ingested yet: the owner reads what the mount has.
    assert!(m.fs_ok(&["cat", "/through-mount"], b"") == big);
    let mut reversed = big.clone();
    reversed.reverse();
    m.fs_ok(&["write", "/through-owner"], &reversed);
    assert!(std::fs::read(m.path("through-owner")).unwrap() == reversed);
    // Replacing a file the mount has cached: the mount shows the new content at once.
    m.fs_ok(&["write", "/through-mount"], b"small now\n");
    assert_eq!(
        std::fs::read(m.path("through-mount")).unwrap(),
        b"small now\n"
    );
}
