//! Permissions through a real mount. A mount only root can reach leaves every check to
//! the daemon (no `default_permissions`), so root's own limits must come from the store:
//! executing needs an execute bit, and a root process without its capabilities is an
//! ordinary user. A mount other users can reach keeps the kernel's checks as well, and
//! the daemon's must agree with them (supplementary groups, the sticky bit, set-group-id
//! directories). `vfs/tests/permissions.rs` compares the rules themselves with the
//! kernel's, case by case.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::Output;

use common::{describe_failure, try_sh, Mount, WEAK_ROOT};

fn mount_options(m: &Mount) -> String {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    let mnt = m.mnt.to_str().unwrap();
    mounts
        .lines()
        .find(|line| line.split(' ').nth(1) == Some(mnt))
        .and_then(|line| line.split(' ').nth(3))
        .unwrap_or_else(|| panic!("{mnt} is not in /proc/mounts"))
        .to_owned()
}

fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// Runs `script` in the mount with `setpriv` arguments in front of bash.
fn run_as(m: &Mount, setpriv: &str, script: &str) -> Output {
    try_sh(
        &m.mnt,
        &format!("setpriv {setpriv} bash -c {}", shell_quote(script)),
    )
}

fn ok(m: &Mount, setpriv: &str, script: &str) -> String {
    let out = run_as(m, setpriv, script);
    if !out.status.success() {
        panic!("{}", describe_failure(script, Some(&m.mnt), &out));
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn refused(m: &Mount, setpriv: &str, script: &str, message: &str) {
    let out = run_as(m, setpriv, script);
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains(message),
        "{}",
        describe_failure(
            &format!("{script} (should fail: {message})"),
            Some(&m.mnt),
            &out
        )
    );
}

#[test]
fn a_mount_only_root_reaches_is_checked_by_the_daemon() {
    let m = Mount::new();
    let options = mount_options(&m);
    // Unless no open reaches the daemon: then the kernel checks too.
    let kernel_checks = common::mounts_with("--cached-opens");
    assert_eq!(
        options.split(',').any(|o| o == "default_permissions"),
        kernel_checks,
        "a mount without --allow-other should leave permissions to the daemon: {options}"
    );
    m.sh(
        "echo data > plain && chmod 644 plain && printf '#!/bin/sh\\necho ran\\n' > tool && \
         chmod 644 tool && mkdir closed && echo inner > closed/f && chmod 000 closed && \
         echo theirs > theirs && chown 1000:1000 theirs && chmod 600 theirs",
    );
    // Root reads, writes and searches anything, but executes only what has an x bit.
    assert_eq!(m.sh("cat plain theirs closed/f"), "data\ntheirs\ninner\n");
    m.sh("test -r theirs && test -w theirs && test -x closed && ! test -x plain");
    let out = try_sh(&m.mnt, "./tool");
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
        "{}",
        describe_failure("./tool (no execute bit)", Some(&m.mnt), &out)
    );
    m.sh("chmod 744 tool");
    assert_eq!(m.sh("./tool"), "ran\n");
    m.sh("cd closed && cat f > /dev/null");

    // Without its capabilities, root is the owner of its own files and nothing more:
    // the daemon reads them from /proc for the request.
    assert_eq!(ok(&m, WEAK_ROOT, "cat plain"), "data\n");
    refused(&m, WEAK_ROOT, "cat theirs", "Permission denied");
    refused(&m, WEAK_ROOT, "echo x >> theirs", "Permission denied");
    refused(&m, WEAK_ROOT, "chmod 644 theirs", "Operation not permitted");
    refused(
        &m,
        WEAK_ROOT,
        "python3 -c 'import os; os.utime(\"theirs\", (5, 5))'",
        "Operation not permitted",
    );
    refused(&m, WEAK_ROOT, "chown 0 theirs", "Operation not permitted");
    refused(&m, WEAK_ROOT, "test -r theirs", "");
    refused(&m, WEAK_ROOT, "cd closed", "Permission denied");
    // Listing needs read permission, asked when the listing comes from the daemon: the
    // kernel opens directories without asking it, and forgets the listing it kept when
    // a directory's mode or owner changes.
    refused(&m, WEAK_ROOT, "ls closed", "Permission denied");
    ok(
        &m,
        WEAK_ROOT,
        "mkdir listed && touch listed/f && chmod 700 listed",
    );
    assert_eq!(ok(&m, WEAK_ROOT, "ls listed"), "f\n");
    m.sh("chown 1000 listed");
    refused(&m, WEAK_ROOT, "ls listed", "Permission denied");
    m.sh("chown 0 listed && ls listed > /dev/null");
    assert_eq!(ok(&m, WEAK_ROOT, "ls listed"), "f\n");
    m.sh("chmod 000 listed");
    refused(&m, WEAK_ROOT, "ls listed", "Permission denied");
    m.sh("chmod 755 listed");
    // execve asks for execute permission, not read (the kernel's FMODE_EXEC in the
    // open flags says which): a program others may only execute runs, one they may
    // only read does not.
    m.sh(
        "cp /bin/true runs && chown 1000:1000 runs && chmod 711 runs && \
         cp /bin/true readable && chown 1000:1000 readable && chmod 744 readable",
    );
    ok(&m, WEAK_ROOT, "./runs");
    refused(&m, WEAK_ROOT, "./readable", "Permission denied");
    assert_eq!(
        ok(
            &m,
            WEAK_ROOT,
            "head -c 4 readable | od -An -c | tr -d ' \n'"
        ),
        "177ELF"
    );
    // Its own directory, made unsearchable: a lookup the kernel has not cached is
    // refused.
    ok(
        &m,
        WEAK_ROOT,
        "mkdir own && echo x > own/f && chmod 600 own",
    );
    m.sh("echo 3 > /proc/sys/vm/drop_caches");
    refused(&m, WEAK_ROOT, "cat own/f", "Permission denied");
    refused(&m, WEAK_ROOT, "touch own/g", "Permission denied");
    m.sh("chmod 755 own && rm -r own && chmod 755 closed");
}

#[test]
fn a_shared_mount_keeps_the_kernel_checks_and_agrees_with_them() {
    let m = Mount::with_args(&["--allow-other"]);
    std::fs::set_permissions(&m.root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let options = mount_options(&m);
    assert!(
        options.split(',').any(|o| o == "default_permissions"),
        "a mount other users reach should keep the kernel's checks: {options}"
    );
    m.sh(
        "chmod 755 . && echo group > grp && chown 0:100 grp && chmod 640 grp && \
         mkdir tmp && chmod 1777 tmp && mkdir shared && chown 0:100 shared && \
         chmod 2775 shared",
    );
    let member = "--reuid=65534 --regid=65534 --groups=100";
    let stranger = "--reuid=65533 --regid=65533 --clear-groups";
    // A supplementary group the daemon learns from /proc grants what the kernel grants.
    assert_eq!(ok(&m, member, "cat grp"), "group\n");
    refused(&m, stranger, "cat grp", "Permission denied");
    refused(&m, member, "echo x >> grp", "Permission denied");
    // The sticky bit: each user removes their own entries only.
    ok(&m, member, "echo a > tmp/a");
    ok(&m, stranger, "echo b > tmp/b");
    refused(&m, stranger, "rm -f tmp/a", "Operation not permitted");
    ok(&m, stranger, "rm tmp/b");
    // A set-group-id directory gives new entries its group, and new directories the bit.
    ok(&m, member, "echo s > shared/f && mkdir shared/sub");
    assert_eq!(m.sh("stat -c %u:%g shared/f"), "65534:100\n");
    assert_eq!(m.sh("stat -c %u:%g:%a shared/sub"), "65534:100:2755\n");
    // chgrp to a group of one's own, not to another.
    ok(&m, member, "chgrp 100 tmp/a && chgrp 65534 tmp/a");
    refused(&m, member, "chgrp 0 tmp/a", "Operation not permitted");
    // A chmod by an owner outside the file's group drops set-group-id.
    m.sh("chown 65533:100 tmp/a && chmod 644 tmp/a");
    ok(&m, stranger, "chmod 2755 tmp/a");
    assert_eq!(m.sh("stat -c %a tmp/a"), "755\n");
    // access(2) and chdir as the kernel answers them.
    ok(&m, member, "test -r grp && ! test -w grp && cd shared");
}

/// Writes to set-id files by users without `CAP_FSETID`, in `dir`; returns the modes
/// afterwards, as `stat` shows them and after the caches are dropped.
fn write_set_id_files_as_others(dir: &std::path::Path) -> String {
    common::sh(
        dir,
        "mkdir tmp && chmod 1777 tmp && echo p > tmp/prog && chmod 6777 tmp/prog && \
         echo l > tmp/lock && chmod 2766 tmp/lock && \
         echo m > tmp/mine && chgrp 65533 tmp/mine && chmod 2766 tmp/mine",
    );
    // A stranger to the files' group (root's) writes, and so does a member of it.
    let stranger = "setpriv --reuid=65533 --regid=65533 --clear-groups";
    common::sh(
        dir,
        &format!("{stranger} bash -c 'echo more >> tmp/prog && echo more >> tmp/lock && echo more >> tmp/mine'"),
    );
    let modes = "stat -c '%n %a' tmp/prog tmp/lock tmp/mine";
    let cached = common::sh(dir, modes);
    let stored = common::sh(dir, &format!("echo 3 > /proc/sys/vm/drop_caches; {modes}"));
    format!("{cached}{stored}")
}

#[test]
fn a_write_by_another_user_drops_set_id_bits_as_a_local_disk_does() {
    // Which bits a write takes away depends on the kernel (set-group-id without group
    // execution went only from 6.2 on, and only for writers outside the group): the
    // reference is a directory of the host's own, in the same run.
    let host = tempfile::tempdir().unwrap();
    std::fs::set_permissions(host.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let expected = write_set_id_files_as_others(host.path());
    assert!(expected.starts_with("tmp/prog 777\n"), "{expected}");
    // Through staging files the kernel writes itself (passthrough), through the
    // kernel's page cache (writeback), and through the daemon.
    for args in [
        &["--allow-other"][..],
        &["--allow-other", "--no-passthrough"],
        &["--allow-other", "--no-passthrough", "--no-writeback-cache"],
    ] {
        let m = Mount::with_args(args);
        std::fs::set_permissions(&m.root, std::fs::Permissions::from_mode(0o755)).unwrap();
        m.sh("chmod 755 .");
        assert_eq!(write_set_id_files_as_others(&m.mnt), expected, "{args:?}");
        // The owner's own writes keep them, as root's do.
        m.sh("chmod 6777 tmp/prog && echo again >> tmp/prog");
        assert_eq!(m.sh("stat -c %a tmp/prog"), "6777\n", "{args:?}");
    }
}
