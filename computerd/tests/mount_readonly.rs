//! `--read-only`: everything reads, nothing writes (EROFS), and the database is untouched.

mod common;

use common::{manifest, sh, Mount};

#[test]
fn read_only_mount_reads_and_refuses_writes() {
    let mut m = Mount::new();
    m.sh(r#"
mkdir -p dir/sub emptydir
printf 'hello\n' > dir/hello.txt
head -c 1000000 /dev/urandom > dir/sub/random.bin
ln -s hello.txt dir/link
ln dir/hello.txt hard
python3 -c 'import os; os.setxattr("dir/hello.txt", "user.k", b"v")'
"#);
    let expected = manifest(&m.mnt, true);
    let random_sha = m.sh("sha256sum < dir/sub/random.bin");
    m.unmount();
    let db_sha = sh(&m.root, "sha256sum < ws.db");

    m.mount(&["--read-only"]);
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

    // Reads work.
    assert_eq!(
        m.sh("cat dir/hello.txt dir/link hard"),
        "hello\nhello\nhello\n"
    );
    assert_eq!(m.sh("sha256sum < dir/sub/random.bin"), random_sha);
    assert_eq!(m.sh("readlink dir/link"), "hello.txt\n");
    assert_eq!(m.sh("ls dir | tr '\\n' ' '"), "hello.txt link sub ");
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
    m.unmount();
    assert_eq!(
        sh(&m.root, "sha256sum < ws.db"),
        db_sha,
        "a read-only mount changed the database file"
    );
    m.check_db();

    // A read-only mount of a missing database fails and leaves no mount behind.
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
