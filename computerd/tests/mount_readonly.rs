//! `--read-only`: everything reads, nothing writes (EROFS), and the database is untouched.

mod common;

use std::path::{Path, PathBuf};

use common::{manifest, sh, Mount};

#[test]
fn read_only_mount_reads_and_refuses_writes() {
    let mut m = reads_and_refuses_writes(&["--read-only"], |_| ());
    missing_database_is_not_mounted(&mut m);
}

/// The same over FUSE's io_uring transport: the requests a read-only mount receives
/// travel over the ring's queues (the daemon says how many each served at unmount).
#[test]
fn read_only_mount_over_io_uring_reads_and_refuses_writes() {
    if !common::kernel_has_fuse_io_uring() {
        eprintln!("skipped: this kernel has no FUSE over io_uring");
        return;
    }
    if common::mounts_with("--no-io-uring") {
        return; // the pass over /dev/fuse: the run's own arguments win
    }
    // What a killed daemon leaves: its empty group, named after a pid now unused.
    let orphan = own_cpu_cgroup(std::process::id() as i32).map(|own| {
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        gone.wait().unwrap();
        let orphan = own.join(format!("computerd-fuse-ring-{}", gone.id()));
        std::fs::create_dir(&orphan).unwrap();
        orphan
    });
    let mut group = None;
    let m = reads_and_refuses_writes(&["--read-only", "--io-uring"], |m| {
        group = queues_keep_callers_cpu(m);
    });
    if let Some(group) = group {
        assert!(!group.exists(), "{} outlived the mount", group.display());
    }
    if let Some(orphan) = orphan {
        let left = orphan.exists();
        let _ = std::fs::remove_dir(&orphan);
        assert!(
            !left,
            "{} was not removed by the next mount",
            orphan.display()
        );
    }
    let log = m.daemon_log();
    let (served, _) = common::ring_counts(&log)
        .unwrap_or_else(|| panic!("no count of the ring's requests in the log:\n{log}"));
    let total: u64 = served.iter().sum();
    // The walk above sends some 65 requests past the kernel's caches (no OPEN: the
    // kernel opens the files of a read-only mount without asking).
    assert!(total > 40, "the ring served {served:?} requests:\n{log}");
}

/// Where the host has a v1 cpu hierarchy (this kind of machine), the ring's threads run
/// in a cpu cgroup of their own under `SCHED_IDLE` (`fuse_ring/placement.rs`); returns
/// that group.
fn queues_keep_callers_cpu(m: &Mount) -> Option<PathBuf> {
    const SCHED_IDLE: &str = "5";
    let Some(own) = own_cpu_cgroup(m.pid()) else {
        eprintln!("no cgroup v1 cpu hierarchy: where the ring runs is not checked");
        return None;
    };
    let group = own.join(format!("computerd-fuse-ring-{}", m.pid()));
    let tasks = std::fs::read_to_string(group.join("tasks"))
        .unwrap_or_else(|err| panic!("{}: {err}\n{}", group.display(), m.daemon_log()));
    let mut queues = 0;
    for tid in tasks.lines() {
        let task = format!("/proc/{}/task/{tid}", m.pid());
        let name = std::fs::read_to_string(format!("{task}/comm")).unwrap();
        assert!(
            name.starts_with("fuse-ring-"),
            "{name:?} in {}",
            group.display()
        );
        let stat = std::fs::read_to_string(format!("{task}/stat")).unwrap();
        // Fields after the parenthesised name; `policy` is field 41 of stat(5).
        let after_name = stat.rsplit_once(") ").unwrap().1;
        let policy = after_name.split(' ').nth(41 - 3).unwrap();
        assert_eq!(policy, SCHED_IDLE, "the policy of {name:?}");
        queues += 1;
    }
    assert!(queues > 0, "no queue thread in {}", group.display());
    Some(group)
}

/// The directory of `pid`'s group in the v1 cpu hierarchy, if the host has one.
fn own_cpu_cgroup(pid: i32) -> Option<PathBuf> {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let own = cgroups.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':').skip(1);
        let controllers = fields.next()?;
        let path = fields.next()?;
        controllers.split(',').any(|c| c == "cpu").then_some(path)
    })?;
    Some(Path::new("/sys/fs/cgroup/cpu").join(own.trim_start_matches('/')))
}

/// Mounts a tree read-only with `args`, reads all of it and fails every change, calling
/// `while_mounted` before the unmount; returns the unmounted workspace.
fn reads_and_refuses_writes(args: &[&str], while_mounted: impl FnOnce(&Mount)) -> Mount {
    let mut m = Mount::new();
    m.sh(r#"
mkdir -p dir/sub emptydir
printf 'hello\n' > dir/hello.txt
head -c 1000000 /dev/urandom > dir/sub/random.bin
ln -s hello.txt dir/link
ln dir/hello.txt hard
printf 'secret\n' > secret && chmod 000 secret
python3 -c 'import os; os.setxattr("dir/hello.txt", "user.k", b"v")'
"#);
    let expected = manifest(&m.mnt, true);
    let random_sha = m.sh("sha256sum < dir/sub/random.bin");
    m.unmount();
    let db_sha = sh(&m.root, "sha256sum < ws.db");

    m.mount(args);
    let options = std::fs::read_to_string("/proc/mounts")
        .unwrap()
        .lines()
        .find(|l| l.split(' ').nth(1) == Some(m.mnt.to_str().unwrap()))
        .map(|l| l.split(' ').nth(3).unwrap_or("").to_owned())
        .unwrap();
    assert!(
        options.split(',').any(|o| o == "ro"),
        "mount options: {options}"
    );

    // Checked when the file is read, before anything cached it: the kernel opens files of a
    // read-only mount without asking the daemon.
    let weak = common::try_sh(&m.mnt, &format!("setpriv {} cat secret", common::WEAK_ROOT));
    assert!(
        String::from_utf8_lossy(&weak.stderr).contains("Permission denied"),
        "{}",
        common::describe_failure("cat secret without capabilities", Some(&m.mnt), &weak)
    );
    // Reads work.
    assert_eq!(
        m.sh("cat dir/hello.txt dir/link hard"),
        "hello\nhello\nhello\n"
    );
    assert_eq!(m.sh("sha256sum < dir/sub/random.bin"), random_sha);
    assert_eq!(m.sh("readlink dir/link"), "hello.txt\n");
    assert_eq!(m.sh("ls dir | tr '\\n' ' '"), "hello.txt link sub ");
    assert_eq!(
        m.sh("grep -r hello . | sort"),
        "./dir/hello.txt:hello\n./hard:hello\n"
    );
    assert_eq!(m.sh("find . | wc -l"), "9\n");
    assert_eq!(m.sh("cat secret"), "secret\n");
    m.py(r#"
import os
fd = os.open("dir/sub/random.bin", os.O_RDONLY)
assert os.lseek(fd, 0, os.SEEK_DATA) == 0
assert os.lseek(fd, 0, os.SEEK_HOLE) == 1000000
os.fsync(fd)
import mmap
with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as mapped:
    assert mapped[-3:] == open("dir/sub/random.bin", "rb").read()[-3:]
os.close(fd)
assert os.listxattr("dir/hello.txt") == ["user.k"]
assert os.statvfs(".").f_namemax == 255
print("ok")
"#);
    common::assert_same_manifest("the read-only mount", &expected, &manifest(&m.mnt, true));

    // Every kind of change fails with EROFS.
    m.py(r#"
import errno, os

def erofs(what, f, *args, **kw):
    try:
        f(*args, **kw)
    except OSError as err:
        assert err.errno == errno.EROFS, f"{what}: expected EROFS, got {err!r}"
    else:
        raise AssertionError(f"{what}: succeeded on a read-only mount")

erofs("open O_WRONLY", os.open, "dir/hello.txt", os.O_WRONLY)
erofs("open O_RDWR", os.open, "dir/hello.txt", os.O_RDWR)
erofs("open O_TRUNC", os.open, "dir/hello.txt", os.O_RDONLY | os.O_TRUNC)
erofs("create", os.open, "new.txt", os.O_CREAT | os.O_WRONLY, 0o644)
erofs("mkdir", os.mkdir, "newdir")
erofs("rmdir", os.rmdir, "emptydir")
erofs("unlink", os.unlink, "hard")
erofs("rename", os.rename, "hard", "hard2")
erofs("rename dir", os.rename, "dir/sub", "sub2")
erofs("symlink", os.symlink, "x", "newlink")
erofs("link", os.link, "hard", "hard3")
erofs("chmod", os.chmod, "hard", 0o600)
erofs("chown", os.chown, "hard", 1, 1)
erofs("utime", os.utime, "hard", ns=(1, 1))
erofs("utime now", os.utime, "hard")
erofs("truncate", os.truncate, "hard", 0)
erofs("setxattr", os.setxattr, "dir/hello.txt", "user.k", b"w")
erofs("removexattr", os.removexattr, "dir/hello.txt", "user.k")
erofs("mkfifo", os.mkfifo, "fifo")
assert os.getxattr("dir/hello.txt", "user.k") == b"v"
assert os.access("hard", os.R_OK)
assert not os.access("hard", os.W_OK)
with open("dir/hello.txt", "rb") as f:
    assert f.read() == b"hello\n"
print("ok")
"#);
    let out = common::try_sh(&m.mnt, "echo x > dir/hello.txt");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Read-only file system"),
        "shell redirection: {}",
        common::describe_failure("echo x > dir/hello.txt", None, &out)
    );
    // The kernel keeps the pages of every file it opened without asking; nothing may
    // change one behind it while the mount holds the database.
    let db = m.db.to_str().unwrap();
    let other_route = common::computerd(["fs", db, "rm", "/dir/hello.txt"]);
    assert!(
        String::from_utf8_lossy(&other_route.stderr).contains("read-only workspace"),
        "{}",
        common::describe_failure(
            "computerd fs rm while mounted read-only",
            None,
            &other_route
        )
    );
    assert_eq!(m.sh("cat dir/hello.txt"), "hello\n");
    while_mounted(&m);
    m.unmount();
    assert_eq!(
        sh(&m.root, "sha256sum < ws.db"),
        db_sha,
        "a read-only mount changed the database file"
    );
    m.check_db();
    m
}

/// A read-only mount of a missing database fails and leaves no mount behind.
fn missing_database_is_not_mounted(m: &mut Mount) {
    let missing = m.root.join("missing.db");
    let out = common::computerd([
        std::ffi::OsStr::new("mount"),
        missing.as_os_str(),
        m.mnt.as_os_str(),
        std::ffi::OsStr::new("--daemon"),
        std::ffi::OsStr::new("--read-only"),
    ]);
    let mounted = common::is_mounted(&m.mnt);
    if mounted {
        let _ = sh(&m.root, "umount mnt");
    }
    assert!(
        !out.status.success() && !mounted,
        "read-only mount of a missing database: {}",
        common::describe_failure("computerd mount missing.db --read-only", None, &out)
    );
    assert!(!missing.exists(), "a read-only mount created the database");
}

/// A tmpfs mounted for a test, unmounted (lazily if something still holds it) when
/// dropped, so a failing test leaves no mount behind.
struct Media {
    path: PathBuf,
}

impl Media {
    fn new(path: PathBuf) -> Media {
        std::fs::create_dir(&path).unwrap();
        sh(
            Path::new("/"),
            &format!("mount -t tmpfs -o size=64m tmpfs '{}'", path.display()),
        );
        Media { path }
    }

    fn read_only(&self) {
        self.remount("ro");
    }

    fn writable(&self) {
        self.remount("rw");
    }

    fn remount(&self, how: &str) {
        let path = self.path.display();
        sh(Path::new("/"), &format!("mount -o remount,{how} '{path}'"));
    }
}

impl Drop for Media {
    fn drop(&mut self) {
        let path = self.path.display();
        let _ = common::try_sh(
            Path::new("/"),
            &format!(
                "for i in $(seq 50); do umount '{path}' 2>/dev/null && exit 0; sleep 0.1; done; \
                 umount -l '{path}'"
            ),
        );
    }
}

/// Names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[test]
fn a_database_on_read_only_media_serves_reads_and_a_read_only_mount() {
    let dir = tempfile::tempdir().unwrap();
    let media = Media::new(dir.path().join("media"));
    let db = media.path.join("ws.db");
    let run = |args: &[&str], stdin: &str| -> std::process::Output {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_computerd"));
        cmd.arg("fs").arg(&db).args(args);
        common::run_with_stdin(&mut cmd, stdin.as_bytes())
    };
    let text = |out: &std::process::Output| String::from_utf8_lossy(&out.stdout).into_owned();
    let init = common::computerd([std::ffi::OsStr::new("init"), db.as_os_str()]);
    assert!(
        init.status.success(),
        "{}",
        common::describe_failure("init", None, &init)
    );
    assert!(run(&["mkdir", "/d"], "").status.success());
    assert!(run(&["write", "/d/hello.txt"], "hello\n").status.success());
    // Reads of a database nobody else holds create nothing beside it, even where they
    // could (no -wal, -shm or owner file left).
    for args in [
        &["ls", "-l", "/d"][..],
        &["cat", "/d/hello.txt"],
        &["check"],
    ] {
        let out = run(args, "");
        assert!(
            out.status.success(),
            "{args:?}: {}",
            common::describe_failure("fs", None, &out)
        );
        assert_eq!(names(&media.path), ["ws.db"], "after {args:?}");
    }

    media.read_only();
    assert_eq!(text(&run(&["cat", "/d/hello.txt"], "")), "hello\n");
    let ls = run(&["ls", "/d"], "");
    assert_eq!(
        text(&ls),
        "hello.txt\n",
        "{}",
        String::from_utf8_lossy(&ls.stderr)
    );
    let check = run(&["check"], "");
    assert!(
        check.status.success(),
        "{}",
        common::describe_failure("check", None, &check)
    );
    assert!(String::from_utf8_lossy(&check.stdout).contains("no problems"));
    // A change is refused with one line that says why.
    let write = run(&["write", "/new"], "x");
    let stderr = String::from_utf8_lossy(&write.stderr).into_owned();
    assert_eq!(write.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("read-only"), "{stderr}");

    // A read-only mount of it reads everything.
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let mount = common::computerd([
        std::ffi::OsStr::new("mount"),
        db.as_os_str(),
        mnt.as_os_str(),
        std::ffi::OsStr::new("--daemon"),
        std::ffi::OsStr::new("--read-only"),
    ]);
    let mounted = common::is_mounted(&mnt);
    let cat = mounted.then(|| common::try_sh(&mnt, "cat d/hello.txt"));
    if mounted {
        sh(dir.path(), "umount mnt");
    }
    assert!(
        mounted,
        "{}",
        common::describe_failure("mount --read-only", None, &mount)
    );
    let cat = cat.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&cat.stdout),
        "hello\n",
        "{}",
        common::describe_failure("cat", None, &cat)
    );
    assert_eq!(names(&media.path), ["ws.db"]);

    // A log left by a writer that died is read where its index (-shm) is still there,
    // and refused with a reason where it is not (read-only media cannot make one).
    media.writable();
    common::py(
        &media.path,
        "import os, sqlite3\n\
         c = sqlite3.connect('ws.db', isolation_level=None)\n\
         c.execute('PRAGMA wal_autocheckpoint = 0')\n\
         c.execute('CREATE TABLE scratch(x)')\n\
         os._exit(0)\n",
    );
    assert_eq!(names(&media.path), ["ws.db", "ws.db-shm", "ws.db-wal"]);
    media.read_only();
    assert_eq!(text(&run(&["cat", "/d/hello.txt"], "")), "hello\n");
    media.writable();
    std::fs::remove_file(media.path.join("ws.db-shm")).unwrap();
    media.read_only();
    let cat = run(&["cat", "/d/hello.txt"], "");
    assert_eq!(
        String::from_utf8_lossy(&cat.stderr),
        format!(
            "computerd: {}: its write-ahead log holds changes this read-only storage cannot \
             read: open it once where it can be written\n",
            db.display()
        )
    );
}
