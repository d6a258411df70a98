//! Which transport a mount's requests travel over: by default io_uring wherever the
//! kernel offers it and the queue threads get a cpu cgroup of their own, else
//! `/dev/fuse`, and the daemon's log says which and why.

mod common;

use std::path::Path;

use common::{Mount, BIN};

/// What the daemon logs when a default mount leaves io_uring aside (`mount.rs`).
const FELL_BACK: &str = "serving over /dev/fuse: FUSE over io_uring";

/// A default mount goes over io_uring unless it says why not; `--no-io-uring` keeps
/// every request on `/dev/fuse`. The files are the same either way.
#[test]
fn default_mount_goes_over_io_uring_unless_it_says_why_not() {
    if !common::kernel_has_fuse_io_uring() {
        eprintln!("skipped: this kernel has no FUSE over io_uring");
        return;
    }
    let run_over_dev = common::mounts_with("--no-io-uring");
    for (args, may_use_ring) in [(&[][..], !run_over_dev), (&["--no-io-uring"][..], false)] {
        let mut m = Mount::with_args(args);
        m.sh("seq 1 100000 > f && head -c 2000000 /dev/urandom > big && cat f big > /dev/null");
        let sum = m.sh("cat f big | sha256sum");
        m.unmount();
        m.mount(args);
        assert_eq!(
            m.sh("cat f big | sha256sum"),
            sum,
            "after remount, {args:?}"
        );
        m.unmount();
        let log = m.daemon_log();
        let over_ring = common::ring_counts(&log).is_some();
        if may_use_ring {
            assert!(
                over_ring || log.contains(FELL_BACK),
                "a default mount neither used io_uring nor said why:\n{log}"
            );
        } else {
            assert!(!over_ring, "{args:?} still served over io_uring:\n{log}");
        }
        assert!(
            log.contains(&format!("io_uring={over_ring}")),
            "INIT's log line does not say io_uring={over_ring}:\n{log}"
        );
        m.check_db();
    }
}

/// Where the daemon cannot make a cpu cgroup for the queue threads (here: the hierarchy
/// mounted read-only in a mount namespace of the test's own), a default mount serves over
/// `/dev/fuse`, where such a daemon's callers fare better, and says why; `--io-uring`
/// uses the ring all the same, and warns.
#[test]
fn default_mount_without_a_cpu_cgroup_serves_over_dev_fuse() {
    if !common::kernel_has_fuse_io_uring() {
        eprintln!("skipped: this kernel has no FUSE over io_uring");
        return;
    }
    let log = mount_without_a_cpu_cgroup("");
    assert!(log.contains(FELL_BACK), "no word of /dev/fuse:\n{log}");
    assert!(
        log.contains("io_uring=false") && common::ring_counts(&log).is_none(),
        "served over io_uring after all:\n{log}"
    );

    let log = mount_without_a_cpu_cgroup("--io-uring");
    assert!(
        log.contains("without a cpu cgroup of its own"),
        "no warning of the missing group:\n{log}"
    );
    assert!(
        log.contains("io_uring=true") && common::ring_counts(&log).is_some(),
        "--io-uring did not serve over io_uring:\n{log}"
    );
}

/// Mounts a new workspace with `args` in a mount namespace whose cgroup hierarchy is
/// read-only, writes and reads a file through it, unmounts, and returns the daemon's log.
fn mount_without_a_cpu_cgroup(args: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let hierarchy = if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        "/sys/fs/cgroup"
    } else {
        "/sys/fs/cgroup/cpu"
    };
    // Everything inside the namespace, which ends with its last process: the unmount
    // runs even when a step fails, and the test waits for the daemon.
    let inner = format!(
        r#"
mount --make-rprivate /
mount --bind {hierarchy} {hierarchy}
mount -o remount,bind,ro {hierarchy}
trap 'umount mnt 2>/dev/null || true' EXIT
mkdir -p mnt
"{BIN}" mount --daemon -q --log info --log-file daemon.log {args} ws.db mnt > daemon.pid
printf 'hello\n' > mnt/f
cat mnt/f
"#
    );
    std::fs::write(dir.path().join("inner.sh"), inner).unwrap();
    let out = common::try_sh(dir.path(), "unshare -m bash -euo pipefail inner.sh");
    if let Ok(pid) = std::fs::read_to_string(dir.path().join("daemon.pid")) {
        let pid = pid.trim().parse().unwrap();
        let exited = common::wait_exit(pid, common::DAEMON_EXIT_TIMEOUT);
        // Its status is known when the harness made this process a subreaper.
        let failed = match exited {
            common::Exited::Status(status) => !status.success(),
            common::Exited::Unknown => false,
            common::Exited::TimedOut => true,
        };
        assert!(!failed, "the daemon in the namespace ({args}): {exited:?}");
    }
    assert!(
        out.status.success() && out.stdout == b"hello\n",
        "{args}: {}",
        common::describe_failure("inner.sh", Some(dir.path()), &out)
    );
    std::fs::read_to_string(dir.path().join("daemon.log")).unwrap()
}
