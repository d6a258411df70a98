//! Basic file operations through a real mount, persistence across a remount, and the
//! daemon's lifecycle.

mod common;

use common::{assert_same_text, is_mounted, sh, wait_exit, Exited, Mount};

/// Prints a JSON map of every entry under the current directory to its attributes
/// (except the access time), content hash, symlink target and extended attributes.
const DUMP_STATE: &str = r#"
import hashlib, json, os, stat
state = {}
for dirpath, dirnames, filenames in os.walk("."):
    for name in dirnames + filenames:
        p = os.path.join(dirpath, name)
        st = os.lstat(p)
        entry = {
            "mode": oct(st.st_mode), "uid": st.st_uid, "gid": st.st_gid,
            "nlink": st.st_nlink, "size": st.st_size, "ino": st.st_ino,
            "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns,
        }
        if stat.S_ISLNK(st.st_mode):
            entry["target"] = os.readlink(p)
        else:
            entry["xattrs"] = {n: os.getxattr(p, n).hex() for n in sorted(os.listxattr(p))}
        if stat.S_ISREG(st.st_mode):
            with open(p, "rb") as f:
                entry["sha256"] = hashlib.sha256(f.read()).hexdigest()
        state[p] = entry
print(json.dumps(state, sort_keys=True, indent=1))
"#;

/// create/read/append/truncate/rename/unlink/mkdir/rmdir/symlink/readlink/link/chmod/
/// chown/utime/xattr/mmap, then the same tree after a remount, then `check`.
#[test]
fn posix_operations_persist() {
    let mut m = Mount::new();
    m.py(r#"
import errno, os, stat, time

def expect_errno(code, f, *args, **kw):
    try:
        f(*args, **kw)
    except OSError as err:
        assert err.errno == code, f"{f.__name__}{args}: expected {errno.errorcode[code]}, got {err!r}"
    else:
        raise AssertionError(f"{f.__name__}{args}: expected {errno.errorcode[code]}, but it succeeded")

def read(p):
    with open(p, "rb") as f:
        return f.read()

def write(p, data):
    with open(p, "wb") as f:
        f.write(data)

# create, read, O_EXCL
write("a.txt", b"hello\n")
assert read("a.txt") == b"hello\n"
expect_errno(errno.EEXIST, os.open, "a.txt", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
assert os.stat("a.txt").st_size == 6

# append (also O_APPEND after a seek to 0), pwrite in the middle
with open("a.txt", "ab") as f:
    f.write(b"world\n")
fd = os.open("a.txt", os.O_WRONLY | os.O_APPEND)
os.lseek(fd, 0, os.SEEK_SET)
os.write(fd, b"!\n")
os.close(fd)
assert read("a.txt") == b"hello\nworld\n!\n", read("a.txt")
fd = os.open("a.txt", os.O_RDWR)
os.pwrite(fd, b"J", 0)
assert os.pread(fd, 5, 0) == b"Jello"
os.close(fd)
assert read("a.txt") == b"Jello\nworld\n!\n"

# truncate: shrink, extend with zeros, through a handle, O_TRUNC
os.truncate("a.txt", 5)
assert read("a.txt") == b"Jello"
os.truncate("a.txt", 10)
assert read("a.txt") == b"Jello" + b"\0" * 5
with open("a.txt", "r+b") as f:
    f.truncate(3)
assert read("a.txt") == b"Jel" and os.stat("a.txt").st_size == 3
write("t.txt", b"x" * 100000)
write("t.txt", b"short")
assert read("t.txt") == b"short"

# a hole, then data past it
with open("sparse", "wb") as f:
    f.seek(1 << 20)
    f.write(b"end")
data = read("sparse")
assert len(data) == (1 << 20) + 3 and data[: 1 << 20] == bytes(1 << 20) and data.endswith(b"end")

# mkdir, rmdir and their errors
os.makedirs("d1/d2/d3")
write("d1/d2/d3/f", b"deep")
expect_errno(errno.EEXIST, os.mkdir, "d1")
expect_errno(errno.ENOTEMPTY, os.rmdir, "d1/d2")
expect_errno(errno.ENOTDIR, os.listdir, "a.txt")
expect_errno(errno.ENOTDIR, os.rmdir, "a.txt")
expect_errno(errno.EISDIR, os.unlink, "d1")
expect_errno(errno.ENOENT, os.stat, "missing")
expect_errno(errno.ENOENT, os.open, "missing/x", os.O_CREAT | os.O_WRONLY)
os.mkdir("empty")
assert os.stat("d1").st_nlink == 3, os.stat("d1").st_nlink
os.rmdir("empty")
assert not os.path.exists("empty")

# rename: plain, over a file, across directories, a directory, over an empty directory
os.rename("a.txt", "b.txt")
assert not os.path.exists("a.txt") and read("b.txt") == b"Jel"
write("c.txt", b"ccc")
os.rename("c.txt", "b.txt")
assert read("b.txt") == b"ccc" and not os.path.exists("c.txt")
os.rename("b.txt", "d1/d2/b.txt")
assert read("d1/d2/b.txt") == b"ccc"
os.rename("d1/d2", "moved")
assert read("moved/d3/f") == b"deep" and os.listdir("d1") == []
os.mkdir("d1/sub")
expect_errno(errno.ENOTEMPTY, os.rename, "moved", "d1")
expect_errno(errno.EINVAL, os.rename, "moved", "moved/d3/inside")
expect_errno(errno.ENOTDIR, os.rename, "moved", "sparse")
expect_errno(errno.EISDIR, os.rename, "sparse", "moved")
os.mkdir("e1")
os.mkdir("e2")
os.rename("e1", "e2")
assert not os.path.exists("e1") and os.path.isdir("e2")

# unlink, and an open file that was unlinked stays readable and writable
os.rmdir("d1/sub")
fd = os.open("gone", os.O_CREAT | os.O_RDWR, 0o644)
os.write(fd, b"still here")
os.unlink("gone")
assert not os.path.lexists("gone")
assert os.fstat(fd).st_nlink == 0
assert os.pread(fd, 100, 0) == b"still here"
os.pwrite(fd, b"S", 0)
assert os.pread(fd, 100, 0) == b"Still here"
os.close(fd)
assert "gone" not in os.listdir(".")

# symlinks: relative, absolute, dangling, to a directory, a long target
os.symlink("moved/d3/f", "rel")
assert os.readlink("rel") == "moved/d3/f" and read("rel") == b"deep"
assert stat.S_ISLNK(os.lstat("rel").st_mode) and os.lstat("rel").st_size == len("moved/d3/f")
os.symlink(os.path.abspath("moved/d3/f"), "abs")
assert read("abs") == b"deep"
os.symlink("nowhere/at/all", "dangling")
assert os.path.lexists("dangling") and not os.path.exists("dangling")
expect_errno(errno.ENOENT, open, "dangling")
os.symlink("moved", "dirlink")
assert sorted(os.listdir("dirlink")) == ["b.txt", "d3"], os.listdir("dirlink")
long_target = "x" * 1000 + "/" + "y" * 2000
os.symlink(long_target, "longlink")
assert os.readlink("longlink") == long_target
expect_errno(errno.EEXIST, os.symlink, "a", "rel")

# hard links
os.link("moved/d3/f", "hl")
a, b = os.stat("moved/d3/f"), os.stat("hl")
assert a.st_ino == b.st_ino and a.st_nlink == 2 == b.st_nlink, (a, b)
with open("hl", "ab") as f:
    f.write(b"+more")
assert read("moved/d3/f") == b"deep+more"
os.link("hl", "hl2")
assert os.stat("hl").st_nlink == 3
os.unlink("moved/d3/f")
assert os.stat("hl").st_nlink == 2 and read("hl") == b"deep+more" == read("hl2")
expect_errno(errno.EPERM, os.link, "moved", "dirhardlink")
expect_errno(errno.EEXIST, os.link, "hl", "hl2")

# chmod, chown
os.chmod("hl", 0o640)
assert stat.S_IMODE(os.stat("hl2").st_mode) == 0o640
os.chmod("moved", 0o1750)
assert stat.S_IMODE(os.stat("moved").st_mode) == 0o1750
os.chmod("t.txt", 0o4755)
assert stat.S_IMODE(os.stat("t.txt").st_mode) == 0o4755
os.chown("hl", 1234, 5678)
st = os.stat("hl2")
assert (st.st_uid, st.st_gid) == (1234, 5678), st
os.lchown("rel", 4321, 8765)
assert (os.lstat("rel").st_uid, os.lstat("rel").st_gid) == (4321, 8765)
assert os.stat("moved/d3").st_uid == 0

# utime: exact nanoseconds, before the epoch, "now"
os.utime("hl", ns=(1_000_000_123, 2_000_000_456))
st = os.stat("hl")
assert (st.st_atime_ns, st.st_mtime_ns) == (1_000_000_123, 2_000_000_456), st
os.utime("sparse", ns=(-1_500_000_000, -86_400_000_000_007))
st = os.stat("sparse")
assert st.st_mtime_ns == -86_400_000_000_007, st.st_mtime_ns
before = time.time_ns()
os.utime("t.txt")
assert os.stat("t.txt").st_mtime_ns >= before - 2_000_000_000
os.utime("moved", ns=(3_000_000_000, 4_000_000_000))
assert os.stat("moved").st_mtime_ns == 4_000_000_000
os.utime("rel", ns=(5_000_000_000, 6_000_000_000), follow_symlinks=False)
assert os.lstat("rel").st_mtime_ns == 6_000_000_000

# mtime and ctime move on a write
os.utime("t.txt", ns=(0, 0))
with open("t.txt", "ab") as f:
    f.write(b"!")
st = os.stat("t.txt")
assert st.st_mtime_ns > 0 and st.st_ctime_ns > 0, st

# extended attributes
os.setxattr("hl", "user.color", b"blue")
assert os.getxattr("hl2", "user.color") == b"blue"
os.setxattr("hl", "user.empty", b"")
os.setxattr("hl", "user.binary", bytes(range(256)) * 16)
assert os.getxattr("hl", "user.empty") == b""
assert os.getxattr("hl", "user.binary") == bytes(range(256)) * 16
assert sorted(os.listxattr("hl")) == ["user.binary", "user.color", "user.empty"], os.listxattr("hl")
expect_errno(errno.EEXIST, os.setxattr, "hl", "user.color", b"red", os.XATTR_CREATE)
expect_errno(errno.ENODATA, os.setxattr, "hl", "user.size", b"xl", os.XATTR_REPLACE)
os.setxattr("hl", "user.color", b"red", os.XATTR_REPLACE)
assert os.getxattr("hl", "user.color") == b"red"
os.removexattr("hl", "user.empty")
expect_errno(errno.ENODATA, os.getxattr, "hl", "user.empty")
expect_errno(errno.ENODATA, os.removexattr, "hl", "user.empty")
os.setxattr("moved", "user.dir", b"yes")
assert os.getxattr("moved", "user.dir") == b"yes"
# No POSIX ACLs nor SELinux labels here: refused, and missing ones are "not supported"
# (what lets `ls -l` stop asking for them).
acl = bytes.fromhex("0200000001000600ffffffff04000400ffffffff10000400ffffffff20000400ffffffff")
for name in ["system.posix_acl_access", "system.posix_acl_default", "security.selinux"]:
    expect_errno(errno.EOPNOTSUPP, os.setxattr, "moved", name, acl)
    expect_errno(errno.EOPNOTSUPP, os.getxattr, "moved", name)

# fsync, fdatasync, a directory fsync, statvfs
fd = os.open("t.txt", os.O_RDWR)
os.fsync(fd)
os.fdatasync(fd)
os.close(fd)
fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
os.fsync(fd)
os.close(fd)
sv = os.statvfs(".")
assert sv.f_bsize > 0 and sv.f_namemax >= 255, sv
expect_errno(errno.ENAMETOOLONG, os.open, "n" * 256, os.O_CREAT | os.O_WRONLY)

names = sorted(os.listdir("."))
expected = sorted(["abs", "d1", "dangling", "dirlink", "e2", "hl", "hl2", "longlink",
                   "moved", "rel", "sparse", "t.txt"])
assert names == expected, names
print("ok")
"#);

    let before = m.py(DUMP_STATE);
    m.unmount();
    m.check_db();
    m.mount(&[]);
    let after = m.py(DUMP_STATE);
    assert_same_text("the tree across a remount", &before, &after);
    m.unmount();
    m.check_db();
}

/// The modification time the mount shows is the one stored: files written, then changed
/// again right away (an append in a second open, or a store through a shared writable
/// mapping plus msync) show the same mtime and content after a remount. (With the
/// writeback cache the kernel keeps its own mtime; the daemon must not stamp write-backs
/// with their arrival time.)
#[test]
fn mtime_seen_in_mount_survives_remount() {
    mtime_survives_remount(&[]);
}

#[test]
fn mtime_seen_in_mount_survives_remount_with_writeback_cache() {
    mtime_survives_remount(&["--no-passthrough"]);
}

fn mtime_survives_remount(args: &[&str]) {
    let mut m = Mount::with_args(args);
    m.py(r#"
import mmap, os
for i in range(20):
    with open(f"appended{i}", "wb") as f:
        f.write(b"." * 100)
    with open(f"appended{i}", "ab") as f:
        f.write(b"more")
    name = f"mapped{i}"
    with open(name, "wb") as f:
        f.write(b"." * 8192)
    with open(name, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 8192)
        mm[100:105] = b"MMAP!"
        mm[8000:8003] = b"end"
        mm.flush()
        mm.close()
    with open(name, "rb") as f:
        data = f.read()
    assert data[100:105] == b"MMAP!" and data[8000:8003] == b"end" and len(data) == 8192
"#);
    let before = m.py(CONTENT_AND_MTIMES);
    m.unmount();
    m.mount(args);
    let after = m.py(CONTENT_AND_MTIMES);
    m.unmount();
    m.check_db();
    assert_same_text(
        "content and mtime of quickly rewritten files across a remount",
        &before,
        &after,
    );
}

/// One line per file of the current directory: name, content hash, mtime and ctime.
const CONTENT_AND_MTIMES: &str = r#"
import hashlib, os
for name in sorted(os.listdir(".")):
    st = os.stat(name)
    with open(name, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    print(name, digest, "mtime", st.st_mtime_ns, "ctime", st.st_ctime_ns)
"#;

/// A 64 MiB random file written with dd, copied with cp, patched in the middle, checked
/// by sha256sum, again after a remount.
#[test]
fn big_file_sha256() {
    let mut m = Mount::new();
    let src = m.scratch.join("src.bin");
    let hash = |dir: &std::path::Path, file: &str| -> String {
        sh(dir, &format!("sha256sum < {file} | cut -d' ' -f1"))
            .trim()
            .to_owned()
    };
    m.sh(&format!(
        "dd if=/dev/urandom of={src} bs=1M count=64 status=none
         dd if={src} of=big.bin bs=1M conv=fsync status=none
         dd if=/dev/urandom bs=1M count=64 status=none | tee stream.bin | sha256sum | cut -d' ' -f1 > {scratch}/stream.sha",
        src = src.display(),
        scratch = m.scratch.display(),
    ));
    let expected = hash(&m.scratch, "src.bin");
    assert_eq!(hash(&m.mnt, "big.bin"), expected, "big.bin after dd");
    let stream_expected = std::fs::read_to_string(m.scratch.join("stream.sha")).unwrap();
    assert_eq!(
        hash(&m.mnt, "stream.bin"),
        stream_expected.trim(),
        "stream.bin"
    );
    assert_eq!(
        m.sh("stat -c %s big.bin").trim(),
        (64u64 << 20).to_string(),
        "size"
    );

    // Read back with an odd block size, copy (copy_file_range), patch the middle.
    let odd = m.sh("dd if=big.bin bs=12345 status=none | sha256sum | cut -d' ' -f1");
    assert_eq!(odd.trim(), expected, "big.bin read with bs=12345");
    m.sh("cp big.bin copy.bin");
    assert_eq!(hash(&m.mnt, "copy.bin"), expected, "cp copy");
    let patch = "dd if=/dev/zero of=PATH bs=4096 seek=3000 count=3 conv=notrunc status=none
         printf 'tail' | dd of=PATH bs=1 seek=$((64*1024*1024 - 2)) conv=notrunc status=none";
    m.sh(&patch.replace("PATH", "copy.bin"));
    sh(&m.scratch, &patch.replace("PATH", "src.bin"));
    let patched = hash(&m.scratch, "src.bin");
    assert_ne!(patched, expected);
    assert_eq!(hash(&m.mnt, "copy.bin"), patched, "patched copy");
    assert_eq!(
        hash(&m.mnt, "big.bin"),
        expected,
        "big.bin after patching its copy"
    );

    m.unmount();
    m.mount(&[]);
    // Read from the store, not the page cache, in requests as large as FUSE allows: the
    // daemon widened the mount's read-ahead (root may; CI runs as root).
    if unsafe { libc::geteuid() } == 0 {
        let dev = m.sh("mountpoint -d .");
        let knob = format!("/sys/class/bdi/{}/read_ahead_kb", dev.trim());
        let read_ahead = std::fs::read_to_string(&knob).unwrap();
        assert_eq!(read_ahead.trim(), "1024", "{knob}");
    }
    assert_eq!(hash(&m.mnt, "big.bin"), expected, "big.bin after remount");
    assert_eq!(hash(&m.mnt, "copy.bin"), patched, "copy.bin after remount");
    assert_eq!(
        hash(&m.mnt, "stream.bin"),
        stream_expected.trim(),
        "stream.bin after remount"
    );
    m.unmount();
    let log = m.daemon_log();
    if let Some((_, large_reads)) = common::ring_counts(&log) {
        // Over io_uring, the read-ahead windows of a file read from the store go to
        // the read workers (`fuse_ring/offload.rs`).
        assert!(
            large_reads > 0,
            "no large read was served by a worker:\n{log}"
        );
    }
    m.check_db();
}

/// A directory of 5000 entries is counted right, and listing it while deleting some of
/// its entries neither loses nor repeats an entry that stayed.
#[test]
fn readdir_5000_entries_while_deleting() {
    let mut m = Mount::new();
    m.py(r#"
import os
os.mkdir("many")
for i in range(5000):
    with open(f"many/f{i:05d}", "wb") as f:
        f.write(str(i).encode())
print("created")
"#);
    assert_eq!(m.sh("ls many | wc -l").trim(), "5000");
    assert_eq!(m.sh("ls -l many | grep -c '^-'").trim(), "5000");
    assert_eq!(m.sh("find many -type f | wc -l").trim(), "5000");

    m.py(r#"
import collections, os, random
names = [f"f{i:05d}" for i in range(5000)]
assert sorted(os.listdir("many")) == names

# Delete every third name, in random order, one after each entry read, so deletions hit
# entries already listed, the one just read and ones not reached yet.
doomed = [n for i, n in enumerate(names) if i % 3 == 0]
random.Random(7).shuffle(doomed)
pending = list(doomed)
seen = []
with os.scandir("many") as it:
    for entry in it:
        seen.append(entry.name)
        if pending:
            os.unlink(os.path.join("many", pending.pop()))
for n in pending:
    os.unlink(os.path.join("many", n))

counts = collections.Counter(seen)
dups = sorted(n for n, c in counts.items() if c > 1)
assert not dups, f"listed more than once: {dups[:20]} ({len(dups)} in all)"
unknown = sorted(set(seen) - set(names))
assert not unknown, f"names that never existed: {unknown[:20]}"
doomed_set = set(doomed)
missing = sorted(n for n in names if n not in doomed_set and n not in counts)
assert not missing, f"entries present throughout but not listed: {missing[:20]} ({len(missing)} in all)"
left = sorted(os.listdir("many"))
assert left == [n for n in names if n not in doomed_set], len(left)
print(len(seen), "listed,", len(left), "left")
"#);
    assert_eq!(m.sh("ls many | wc -l").trim(), (5000 - 1667).to_string());
    m.unmount();
    m.mount(&[]);
    assert_eq!(m.sh("ls many | wc -l").trim(), (5000 - 1667).to_string());
    assert_eq!(m.sh("cat many/f04999").trim(), "4999");
    m.unmount();
    m.check_db();
}

/// SIGTERM and SIGINT unmount and stop the daemon with status 0; the data stays.
#[test]
fn signals_unmount_cleanly() {
    let mut m = Mount::new();
    m.sh("echo one > one.txt");
    m.stop_with_signal(libc::SIGTERM);
    m.mount(&[]);
    m.sh("test \"$(cat one.txt)\" = one && echo two > two.txt");
    m.stop_with_signal(libc::SIGINT);
    m.mount(&[]);
    assert_eq!(m.sh("cat one.txt two.txt"), "one\ntwo\n");
    m.unmount();
    m.check_db();
}

/// A daemon unmounted from outside leaves alone whatever is mounted at its mount point
/// by the time it exits: `umount` and a new `computerd mount` of the same point at once
/// (as a script restarting the mount does) must leave the new mount standing.
#[test]
fn an_exiting_daemon_leaves_the_next_mount_alone() {
    let mut m = Mount::new();
    m.sh("echo one > one.txt");
    for _ in 0..3 {
        let old = m.unmount_without_waiting();
        m.mount(&[]);
        match wait_exit(old, std::time::Duration::from_secs(60)) {
            Exited::Status(status) => assert!(status.success(), "old daemon: {status:?}"),
            other => panic!("the old daemon (pid {old}) did not exit: {other:?}"),
        }
        assert!(
            is_mounted(&m.mnt),
            "the old daemon unmounted the new mount\n--- daemon log ---\n{}",
            m.daemon_log()
        );
        assert_eq!(m.sh("cat one.txt"), "one\n");
    }
    m.unmount();
}

/// Runs `script` as uid/gid 65534 (nobody) in `dir`.
fn as_nobody(dir: &std::path::Path, script: &str) -> std::process::Output {
    common::try_sh(
        dir,
        &format!(
            "setpriv --reuid=65534 --regid=65534 --clear-groups bash -c {}",
            shell_quote(script)
        ),
    )
}

fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// Without --allow-other only the mounting user gets in; with it, other users do, and
/// the kernel checks their permissions against the stored modes and owners.
#[test]
fn allow_other_and_permissions() {
    use std::os::unix::fs::PermissionsExt;
    let m = Mount::new();
    std::fs::set_permissions(&m.root, std::fs::Permissions::from_mode(0o755)).unwrap();
    m.sh("chmod 755 . && echo hi > pub.txt && chmod 644 pub.txt");
    let out = as_nobody(&m.mnt, "cat pub.txt");
    assert!(
        !out.status.success(),
        "another user read a mount without --allow-other"
    );
    drop(m);

    let m = Mount::with_args(&["--allow-other"]);
    std::fs::set_permissions(&m.root, std::fs::Permissions::from_mode(0o755)).unwrap();
    m.sh(
        "chmod 755 . && echo hi > pub.txt && chmod 644 pub.txt && echo secret > priv.txt && \
         chmod 600 priv.txt && mkdir mine && chown 65534:65534 mine",
    );
    let ok = |script: &str| {
        let out = as_nobody(&m.mnt, script);
        if !out.status.success() {
            panic!("{}", common::describe_failure(script, Some(&m.mnt), &out));
        }
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let refused = |script: &str, message: &str| {
        let out = as_nobody(&m.mnt, script);
        assert!(
            !out.status.success() && String::from_utf8_lossy(&out.stderr).contains(message),
            "{}",
            common::describe_failure(&format!("{script} (should be denied)"), Some(&m.mnt), &out)
        );
    };
    assert_eq!(ok("cat pub.txt"), "hi\n");
    refused("cat priv.txt", "Permission denied");
    refused("echo x >> pub.txt", "Permission denied");
    refused("touch new.txt", "Permission denied");
    refused("rm pub.txt", "Permission denied");
    ok("echo mine > mine/file && mkdir mine/sub && mv mine/file mine/sub/file");
    assert_eq!(ok("cat mine/sub/file"), "mine\n");
    assert_eq!(m.sh("stat -c %u:%g mine/sub/file"), "65534:65534\n");
    refused("chmod 777 pub.txt", "Operation not permitted");
    refused("chown 65534 pub.txt", "Operation not permitted");
    ok("chmod 700 mine/sub && test \"$(stat -c %a mine/sub)\" = 700");
}

/// A process that maps a file and closes its descriptor keeps, through passthrough, a
/// mapping of the staging file itself, and the daemon gets the RELEASE at the close: the
/// file must not be emptied for reuse under the mapping, whether it stays (ingested,
/// evicted) or is removed. git maps its pack indexes this way; it died of SIGBUS in
/// `git clone` when the staging pool recycled such files. (Python's `mmap` keeps a
/// duplicate of the descriptor, which would hide the problem: the mapping is made with
/// libc's.)
#[test]
fn mapped_files_outlive_their_descriptors() {
    let m = Mount::new();
    let out = m.py(r#"
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
PROT_READ, MAP_PRIVATE = 1, 2
maps = {}
for name in ["kept", "removed"]:
    content = (name * 1000).encode()
    fd = os.open(name, os.O_RDWR | os.O_CREAT, 0o644)
    os.write(fd, content)
    os.close(fd)
    # Opened again for reading, as git opens a pack index it wrote, once the daemon
    # has had the chance to ingest it.
    time.sleep(0.5)
    fd = os.open(name, os.O_RDONLY)
    addr = libc.mmap(None, len(content), PROT_READ, MAP_PRIVATE, fd, 0)
    assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
    os.close(fd)
    maps[name] = (addr, content)
os.unlink("removed")
# The daemon evicts a small ingested file from the staging cache, and recycles the file
# of a removed one, within a round of its worker (a second at most): give it a few.
time.sleep(2.5)
for name, (addr, content) in maps.items():
    assert ctypes.string_at(addr, len(content)) == content, name
print("ok")
"#);
    assert_eq!(out.trim(), "ok");
}

/// Whether any FUSE device descriptor of process `pid` reads without blocking.
fn polls_fuse_device(pid: i32) -> bool {
    const O_NONBLOCK: u32 = 0o4000;
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        let is_fuse = std::fs::read_link(fd.path()).is_ok_and(|t| t.as_os_str() == "/dev/fuse");
        let info = format!("/proc/{pid}/fdinfo/{}", fd.file_name().to_string_lossy());
        let flags = std::fs::read_to_string(info).ok().and_then(|text| {
            let line = text.lines().find(|l| l.starts_with("flags:"))?;
            u32::from_str_radix(line["flags:".len()..].trim(), 8).ok()
        });
        is_fuse && flags.is_some_and(|f| f & O_NONBLOCK != 0)
    })
}

/// Over `/dev/fuse`, the daemon polls its device during a burst of requests and goes
/// back to blocking reads once they stop; `--no-poll` never polls. Answers are the same either way.
#[test]
fn polls_the_device_only_while_requests_come() {
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        return; // one CPU: the daemon never polls
    }
    if common::mounts_with("--io-uring") {
        return; // the device carries almost nothing: it is never polled
    }
    // Over /dev/fuse: over io_uring (the default where offered) the device is idle.
    for (args, polls) in [
        (&["--no-io-uring"][..], true),
        (&["--no-io-uring", "--no-poll"][..], false),
    ] {
        let mut m = Mount::with_args(args);
        std::fs::write(m.path("f"), b"x").unwrap();
        let pid = m.pid();
        // getxattr of a missing attribute: a request every time, the kernel caches none.
        let burst = std::process::Command::new("python3")
            .arg("-c")
            .arg(
                "import os, sys, time\n\
                 end = time.time() + 3\n\
                 while time.time() < end:\n\
                 \x20   try: os.getxattr(sys.argv[1], 'user.missing')\n\
                 \x20   except OSError: pass\n",
            )
            .arg(m.path("f"))
            .spawn()
            .unwrap();
        let mut seen = false;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
        while std::time::Instant::now() < deadline && !seen {
            seen = polls_fuse_device(pid);
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let mut burst = burst;
        burst.kill().ok();
        burst.wait().unwrap();
        // Sampling can miss a short polling phase on a busy machine; the daemon's log
        // below says whether it polled. What sampling can prove is polling that must not be.
        assert!(polls || !seen, "polled with {args:?}\n{}", m.daemon_log());
        // Idle: back to blocking reads within a few milliseconds.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while polls_fuse_device(pid) {
            assert!(
                std::time::Instant::now() < deadline,
                "still polling with no requests\n{}",
                m.daemon_log()
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        m.unmount();
        let log = m.daemon_log();
        assert_eq!(log.contains("FUSE device polled"), polls, "{log}");
    }
}

/// `computerd mount <args>` (not as a daemon helper): its output, whatever its status.
fn mount_command(args: &[&std::ffi::OsStr]) -> std::process::Output {
    let mut cmd = std::process::Command::new(common::BIN);
    cmd.arg("mount").args(args);
    common::run_cmd(
        &mut cmd,
        "computerd mount",
        std::time::Duration::from_secs(60),
    )
}

#[test]
fn a_failed_mount_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let not_a_workspace = dir.path().join("notes.txt");
    std::fs::write(&not_a_workspace, b"my notes\n").unwrap();
    let mountpoint = dir.path().join("a/b/mnt");
    let out = mount_command(&[
        not_a_workspace.as_os_str(),
        mountpoint.as_os_str(),
        "--daemon".as_ref(),
    ]);
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "computerd: {}: not a workspace database\n",
            not_a_workspace.display()
        )
    );
    assert_eq!(std::fs::read(&not_a_workspace).unwrap(), b"my notes\n");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["notes.txt"], "a failed mount left files behind");
}

#[test]
fn mounting_over_a_non_empty_directory_needs_nonempty() {
    let mut m = Mount::new();
    m.unmount();
    std::fs::write(m.mnt.join("hidden.txt"), b"under the mount\n").unwrap();
    let out = mount_command(&[m.db.as_os_str(), m.mnt.as_os_str(), "--daemon".as_ref()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("not empty") && stderr.contains("--nonempty"),
        "{stderr}"
    );
    assert!(!is_mounted(&m.mnt));
    m.mount(&["--nonempty"]);
    assert!(!m.path("hidden.txt").exists());
    m.unmount();
    assert!(m.mnt.join("hidden.txt").exists());
    std::fs::remove_file(m.mnt.join("hidden.txt")).unwrap();
}

/// The LOOKUP requests `du -s` sends over a fresh mount of a directory of 3,000 files,
/// counted by `--op-stats`.
fn lookups_of_du(extra: &[&str]) -> u64 {
    let mut m = Mount::new();
    m.py("import os\nos.mkdir('big')\nfor i in range(3000): open(f'big/f{i}', 'w').close()");
    m.unmount();
    m.mount(&[&["--op-stats"], extra].concat());
    m.sh("du -s big > /dev/null");
    m.unmount();
    common::served(&m.daemon_log(), "lookup")
}

/// A walk that looks at every entry it lists learns their attributes from the listing
/// itself; with `--readdirplus-auto`, only the entries of the listing's first page come
/// with attributes, and each later one costs a LOOKUP.
#[test]
fn a_walk_over_a_large_directory_sends_no_lookup_per_entry() {
    let every_page = lookups_of_du(&[]);
    let first_page = lookups_of_du(&["--readdirplus-auto"]);
    assert!(every_page < 10, "the default sent {every_page} LOOKUPs");
    assert!(
        first_page > 1000,
        "--readdirplus-auto sent {first_page} LOOKUPs"
    );
}

/// A process may close a file and go on writing to it through a shared mapping, with no
/// request the daemon sees (`StagedState::mapped`): those writes are stored, whether the
/// mapping goes before the unmount or is still there when the daemon settles.
#[test]
fn writes_through_a_mapping_after_close_are_stored() {
    let mut m = Mount::new();
    let size = 1 << 20;
    let path = m.path("mapped");
    let (mapping, file) = map_shared(&path, size);
    // The daemon ingests a released file a second after its release: wait past that,
    // so that the writes below come after the content it stored.
    drop(file);
    std::thread::sleep(std::time::Duration::from_secs(3));
    mapping.write(0, b"AFTER-CLOSE");
    mapping.write(size / 2, b"MIDDLE");
    drop(mapping);
    let mut expected = vec![b'a'; size];
    expected[..11].copy_from_slice(b"AFTER-CLOSE");
    expected[size / 2..size / 2 + 6].copy_from_slice(b"MIDDLE");
    assert!(
        std::fs::read(&path).unwrap() == expected,
        "seen on the mount"
    );
    m.unmount();
    let stored = common::fs_db_ok(&m.db, &["cat", "/mapped"], b"");
    assert!(stored == expected, "the store lacks the mapping's writes");
    m.check_db();
}

/// A shared, writable mapping of a file made through `open(2)` of `path` (created and
/// filled with `a`), and the file, which the caller may close first.
fn map_shared(path: &std::path::Path, size: usize) -> (Mapping, std::fs::File) {
    use std::os::fd::AsRawFd;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .unwrap();
    std::io::Write::write_all(&mut &file, &vec![b'a'; size]).unwrap();
    // SAFETY: a shared mapping of `size` bytes of a file of that size, unmapped on drop.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    assert_ne!(
        addr,
        libc::MAP_FAILED,
        "{}",
        std::io::Error::last_os_error()
    );
    (Mapping { addr, size }, file)
}

/// A shared mapping, unmapped when dropped.
struct Mapping {
    addr: *mut libc::c_void,
    size: usize,
}

impl Mapping {
    fn write(&self, offset: usize, data: &[u8]) {
        assert!(offset + data.len() <= self.size);
        // SAFETY: within the mapping, which lives as long as `self`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.addr.cast::<u8>().add(offset),
                data.len(),
            )
        };
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map_shared`, unmapped once.
        unsafe { libc::munmap(self.addr, self.size) };
    }
}
