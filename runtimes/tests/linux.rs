//! The exec spine and the Linux backend with real sandboxes (bubblewrap) over a plain
//! directory standing for the workspace.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

use common::{collect, run, wait_for};
use computer_runtimes::linux::{LinuxBackend, LinuxPolicy, LocalView};
use computer_runtimes::{
    Error, Event, ExecOptions, ExecStatus, Runtimes, SyncOutcome, EXEC_LOG_BYTES_MAX, KILL_GRACE,
};

fn runtimes_with(dir: &Path, policy: LinuxPolicy) -> Runtimes {
    assert!(
        policy.bwrap.exists(),
        "{} is needed (scripts/install-test-deps.sh installs bubblewrap)",
        policy.bwrap.display()
    );
    let mut runtimes = Runtimes::new();
    let view = Arc::new(LocalView::new(dir));
    runtimes
        .register(Arc::new(LinuxBackend::new(view, policy)))
        .unwrap();
    runtimes
}

fn runtimes(dir: &Path) -> Runtimes {
    runtimes_with(dir, LinuxPolicy::default())
}

/// Whether a process whose command line contains `marker` is alive on the host.
fn alive(marker: &str) -> bool {
    pids().into_iter().any(|pid| cmdline(pid).contains(marker))
}

#[test]
fn output_exit_codes_and_files_written() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("in.txt"), "from the host\n").unwrap();
    let rt = runtimes(dir.path());
    let mut handle = rt
        .exec(
            "cat in.txt; echo oops >&2; seq 1000 > out.txt; exit 3",
            ExecOptions::default(),
        )
        .unwrap();
    assert_eq!(handle.backend(), "linux");
    let (out, err) = collect(&mut handle);
    assert_eq!((out.as_str(), err.as_str()), ("from the host\n", "oops\n"));
    let result = handle.result();
    assert_eq!((result.status, result.exit_code), (ExecStatus::Failed, 3));
    assert_eq!(result.sync, SyncOutcome::Complete);
    assert_eq!(result.reason, "the default backend");
    let written = std::fs::read_to_string(dir.path().join("out.txt")).unwrap();
    assert_eq!(written.lines().count(), 1000);

    let (out, _, code) = run(&rt, "mkdir -p a/b && cd a/b && pwd");
    assert_eq!((out.as_str(), code), ("/workspace/a/b\n", 0));
    let options = ExecOptions {
        cwd: Some("a/./b".into()),
        stdin: Some(b"piped in\n".to_vec()),
        ..ExecOptions::default()
    };
    let mut handle = rt.exec("pwd; cat", options).unwrap();
    assert_eq!(collect(&mut handle).0, "/workspace/a/b\npiped in\n");
    assert_eq!(handle.result().status, ExecStatus::Completed);

    let outside = ExecOptions {
        cwd: Some("/a/../..".into()),
        ..ExecOptions::default()
    };
    assert!(matches!(rt.exec("true", outside), Err(Error::Invalid(_))));
    let missing = ExecOptions {
        cwd: Some("/nope".into()),
        ..ExecOptions::default()
    };
    assert!(matches!(rt.exec("true", missing), Err(Error::Invalid(_))));
    let unknown = ExecOptions {
        backend: Some("js".into()),
        ..ExecOptions::default()
    };
    let err = rt.exec("true", unknown).err().unwrap();
    assert_eq!(
        err.to_string(),
        "backend \"js\": not registered (registered: linux)"
    );
}

#[test]
fn output_streams_while_the_command_runs() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtimes(dir.path());
    // The command cannot end before the test creates `go`, after the first line came.
    let options = ExecOptions {
        timeout: Some(Duration::from_secs(120)),
        ..ExecOptions::default()
    };
    let script = "echo first; while [ ! -e go ]; do sleep 0.02; done; echo second";
    let mut handle = rt.exec(script, options).unwrap();
    let first = handle.next_event(None).unwrap();
    assert!(matches!(&first, Event::Output { seq: 0, data, .. } if data == b"first\n"));
    assert!(
        handle.finished().is_none(),
        "the first line came before the end"
    );
    std::fs::write(dir.path().join("go"), "").unwrap();
    assert_eq!(collect(&mut handle).0, "second\n");
    assert_eq!(handle.result().status, ExecStatus::Completed);
}

/// The policy of a sandbox per command, not one warm sandbox for all.
fn one_sandbox_each() -> LinuxPolicy {
    LinuxPolicy {
        warm: false,
        ..LinuxPolicy::default()
    }
}

#[test]
fn kill_and_timeout_end_the_whole_process_tree() {
    kill_and_timeout_end_the_tree(LinuxPolicy::default());
}

#[test]
fn kill_and_timeout_end_the_whole_process_tree_of_a_sandbox_of_its_own() {
    kill_and_timeout_end_the_tree(one_sandbox_each());
}

fn kill_and_timeout_end_the_tree(policy: LinuxPolicy) {
    let dir = tempfile::tempdir().unwrap();
    // Each variant its own: the two run at once.
    let tag = policy.warm as u8;
    let rt = runtimes_with(dir.path(), policy);
    // A child in the background, one in a session of its own, and the shell.
    let marker = format!("sleep 1000.42{}", tag);
    let script = format!("{marker} & setsid {marker} & echo started; {marker}");
    let mut handle = rt.exec(&script, ExecOptions::default()).unwrap();
    assert!(matches!(
        handle.next_event(None),
        Some(Event::Output { .. })
    ));
    assert!(alive(&marker));
    handle.kill(libc::SIGTERM).unwrap();
    let result = handle.result();
    assert_eq!(result.status, ExecStatus::Cancelled);
    assert_eq!(result.exit_code, 128 + libc::SIGTERM);
    assert!(!alive(&marker), "a process of the tree outlived the kill");

    // A command that ignores SIGTERM is killed KILL_GRACE after its timeout.
    let marker = format!("sleep 1000.43{}", tag);
    let options = ExecOptions {
        timeout: Some(Duration::from_millis(300)),
        ..ExecOptions::default()
    };
    let started = Instant::now();
    let script = format!("trap '' TERM; {marker} & trap '' TERM; {marker}");
    let handle = rt.exec(&script, options).unwrap();
    let result = handle.result();
    assert_eq!(result.status, ExecStatus::TimedOut);
    assert!(started.elapsed() >= KILL_GRACE, "{:?}", started.elapsed());
    assert!(started.elapsed() < KILL_GRACE + Duration::from_secs(20));
    assert!(
        !alive(&marker),
        "a process of the tree outlived the timeout"
    );
}

#[test]
fn attach_again_by_id_and_from_a_position() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtimes(dir.path());
    let options = ExecOptions {
        id: Some("job-1".into()),
        ..ExecOptions::default()
    };
    let mut handle = rt
        .exec(
            "for i in 1 2 3; do echo $i; sleep 0.2; done",
            options.clone(),
        )
        .unwrap();
    assert_eq!(handle.id(), "job-1");
    let busy = rt.exec("true", options.clone()).err().unwrap();
    assert!(matches!(busy, Error::Busy(id) if id == "job-1"));
    let first = handle.next_event(None).unwrap();
    assert!(matches!(first, Event::Output { seq: 0, .. }));
    drop(handle);

    let mut again = rt.attach("job-1", 1).unwrap();
    let rest = collect(&mut again).0;
    assert_eq!(rest, "2\n3\n");
    let mut from_start = rt.attach("job-1", 0).unwrap();
    assert_eq!(collect(&mut from_start).0, "1\n2\n3\n");
    // Finished, the id may be used again.
    let mut reused = rt.exec("echo new", options).unwrap();
    assert_eq!(collect(&mut reused).0, "new\n");
    assert!(matches!(rt.attach("nope", 0), Err(Error::NoSuchExec(..))));
}

/// A command printing 1 GiB: the exec keeps at most EXEC_LOG_BYTES_MAX of it, and a
/// reader that starts after the end learns what it missed.
#[test]
fn output_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtimes(dir.path());
    let handle = rt
        .exec("head -c 1G /dev/zero", ExecOptions::default())
        .unwrap();
    let id = handle.id().to_owned();
    assert_eq!(handle.result().status, ExecStatus::Completed);
    let mut late = rt.attach(&id, 0).unwrap();
    let mut kept = 0;
    let mut missed = None;
    for event in late.by_ref() {
        match event {
            Event::Missed { first, next } => missed = Some((first, next)),
            Event::Output { data, .. } => kept += data.len(),
            Event::Exit { .. } => {}
        }
    }
    let (first, next) = missed.expect("the start of 1 GiB was dropped");
    assert_eq!(first, 0);
    assert!(next > 0);
    assert!(kept <= EXEC_LOG_BYTES_MAX + computer_runtimes::CHUNK_BYTES_MAX);
    assert!(kept >= EXEC_LOG_BYTES_MAX / 2, "kept {kept}");
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let peak_kib: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    assert!(peak_kib < 512 << 10, "peak RSS {peak_kib} KiB");
}

#[test]
fn the_environment_is_the_callers_not_the_daemons() {
    // SAFETY: set before any exec of this test starts; other tests do not read it.
    unsafe { std::env::set_var("COMPUTER_TEST_SECRET", "hunter2") };
    let dir = tempfile::tempdir().unwrap();
    let rt = runtimes(dir.path());
    let options = ExecOptions {
        env: vec![("GREETING".into(), "hello".into())],
        ..ExecOptions::default()
    };
    let mut handle = rt.exec("env", options).unwrap();
    let env = collect(&mut handle).0;
    assert!(!env.contains("hunter2"), "{env}");
    assert!(env.contains("GREETING=hello"));
    assert!(env.contains("HOME=/tmp"));

    let strict = LinuxPolicy {
        env_allow: vec!["LC_*".into()],
        ..LinuxPolicy::default()
    };
    let rt = runtimes_with(dir.path(), strict);
    let options = ExecOptions {
        env: vec![("GREETING".into(), "hello".into())],
        ..ExecOptions::default()
    };
    let refused = rt.exec("env", options).err().unwrap();
    assert_eq!(refused.errno(), libc::EPERM);
    assert!(refused.to_string().contains("GREETING"), "{refused}");
}

#[test]
fn the_sandbox_holds() {
    sandbox_holds(LinuxPolicy::default());
}

#[test]
fn a_sandbox_of_its_own_holds() {
    sandbox_holds(one_sandbox_each());
}

fn sandbox_holds(policy: LinuxPolicy) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let secret = tempfile::tempdir().unwrap();
    std::fs::write(secret.path().join("token"), "s3cret").unwrap();
    let secret_path = secret.path().display();
    let rt = runtimes_with(dir.path(), policy);
    let cases: Vec<(&str, String)> = vec![
        ("write the host root", "touch /usr/escape".into()),
        (
            "read another directory of the host",
            format!("cat {secret_path}/token"),
        ),
        ("read /root", "ls /root".into()),
        ("read /home", "ls /home".into()),
        ("read the host's shadow", "cat /etc/shadow".into()),
        (
            "follow a symlink out",
            "ln -s /etc/shadow l && cat l".into(),
        ),
        (
            "climb out with ..",
            format!("cat ../../../..{secret_path}/token"),
        ),
        ("mount", "mount -t tmpfs none /tmp".into()),
        // PTRACE_TRACEME needs no capability: only the seccomp filter refuses it.
        (
            "ptrace",
            "python3 -c 'import ctypes, sys; sys.exit(ctypes.CDLL(None).ptrace(0, 0, 0, 0))'".into(),
        ),
        (
            // keyctl(KEYCTL_GET_KEYRING_ID, the session keyring): an id unless refused.
            "a keyring",
            "python3 -c 'import ctypes, sys; sys.exit(ctypes.CDLL(None).syscall(250, 0, -3, 0) < 0)'".into(),
        ),
        ("a new user namespace", "unshare -U true".into()),
        (
            "see the host's processes",
            format!("[ -e /proc/{}/status ]", std::process::id()),
        ),
        (
            "reach the host through /proc/1/root",
            format!("cat /proc/1/root{secret_path}/token"),
        ),
        (
            "a network interface but loopback",
            "grep -v -e lo: -e Inter -e face /proc/net/dev | grep -q . || exit 1".into(),
        ),
    ];
    for (what, script) in cases {
        let (out, err, code) = run(&rt, &format!("cd sub; {script}"));
        assert_ne!(code, 0, "{what}: allowed ({script}): {out} {err}");
        assert!(!out.contains("s3cret"), "{what}: {out}");
    }
    assert!(!Path::new("/usr/escape").exists());
    // No capability to regain (loading a module, raw devices, ptrace need one) and no
    // way to gain privileges by exec.
    let (out, _, _) = run(
        &rt,
        "grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status",
    );
    let expected = "CapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nNoNewPrivs:\t1\n";
    assert_eq!(out, expected);
}

#[test]
fn two_execs_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtimes(dir.path());
    // Each waits for the other to start: both complete only if they run at once.
    let options = ExecOptions {
        timeout: Some(Duration::from_secs(120)),
        ..ExecOptions::default()
    };
    let wait_for = |me: &str, other: &str| {
        format!("touch {me}.started; while [ ! -e {other}.started ]; do sleep 0.02; done; echo {me} > {me}")
    };
    let a = rt.exec(&wait_for("a", "b"), options.clone()).unwrap();
    let b = rt.exec(&wait_for("b", "a"), options).unwrap();
    assert_ne!(a.id(), b.id());
    assert_eq!(a.result().status, ExecStatus::Completed);
    assert_eq!(b.result().status, ExecStatus::Completed);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("a")).unwrap(),
        "a\n"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("b")).unwrap(),
        "b\n"
    );
}

#[test]
fn a_missing_bwrap_is_a_connect_error_tried_again_next_time() {
    let dir = tempfile::tempdir().unwrap();
    let mut rt = Runtimes::new();
    let view = Arc::new(LocalView::new(dir.path()));
    let policy = LinuxPolicy {
        bwrap: "/nonexistent/bwrap".into(),
        ..LinuxPolicy::default()
    };
    rt.register(Arc::new(LinuxBackend::new(view, policy)))
        .unwrap();
    for _ in 0..2 {
        let err = rt.exec("true", ExecOptions::default()).err().unwrap();
        assert!(matches!(err, Error::Connect { .. }), "{err}");
        assert!(
            err.to_string().contains("apt-get install bubblewrap"),
            "{err}"
        );
    }
}

/// The policy's limits: processes and memory through a cgroup of the command's own
/// (removed afterwards), and a timeout the caller cannot lengthen.
#[test]
fn the_policy_limits_processes_memory_and_time() {
    let dir = tempfile::tempdir().unwrap();
    let policy = LinuxPolicy {
        processes_max: Some(16),
        memory_bytes_max: Some(64 << 20),
        timeout: Some(Duration::from_millis(500)),
        ..LinuxPolicy::default()
    };
    let rt = runtimes_with(dir.path(), policy);
    let (_, err, _) = run(&rt, "for i in $(seq 40); do sleep 0.2 & done; wait");
    assert!(
        err.to_lowercase().contains("fork"),
        "40 processes under a limit of 16: {err}"
    );

    let (_, err, code) = run(&rt, "python3 -c 'b = b\"x\" * (256 << 20); print(len(b))'");
    assert_ne!(code, 0, "256 MiB under a limit of 64: {err}");

    let asked = ExecOptions {
        timeout: Some(Duration::from_secs(60)),
        ..ExecOptions::default()
    };
    let result = rt.exec("sleep 100", asked).unwrap().result();
    assert_eq!(result.status, ExecStatus::TimedOut);
    assert!(
        result.duration < Duration::from_secs(60),
        "{:?}",
        result.duration
    );

    let prefix = format!("computer-exec-{}-", std::process::id());
    // Only the memory groups: every command of the other tests running meanwhile has a
    // pids group (or a v2 one) while it runs.
    for hierarchy in ["/sys/fs/cgroup/memory"] {
        let Ok(entries) = std::fs::read_dir(hierarchy) else {
            continue;
        };
        for entry in entries.filter_map(|e| e.ok()) {
            let name = entry.file_name().to_string_lossy().into_owned();
            assert!(!name.starts_with(&prefix), "{hierarchy}/{name} left behind");
        }
    }
}

/// A sandbox killed from outside mid-command ends the exec as failed, never completed.
#[test]
fn a_sandbox_killed_from_outside_fails_the_exec() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtimes(dir.path());
    let marker = "sleep 1000.5151";
    let mut handle = rt
        .exec(&format!("echo up; {marker}"), ExecOptions::default())
        .unwrap();
    assert!(matches!(
        handle.next_event(None),
        Some(Event::Output { .. })
    ));
    // The sandbox is killed by its pid 1: the kernel then ends every process of its
    // pid namespace, as an OOM kill or an operator would. The shell may print before
    // it has started `sleep`: look until it has.
    let in_the_sandbox =
        |pid: &i32| cmdline(*pid).contains(marker) && namespace_pid(*pid) != Some(*pid);
    let command = wait_for(Duration::from_secs(10), || {
        pids().into_iter().find(in_the_sandbox)
    })
    .expect("the command runs in a pid namespace of its sandbox");
    let namespace = pid_namespace(command);
    let init = pids()
        .into_iter()
        .find(|pid| pid_namespace(*pid) == namespace && namespace_pid(*pid) == Some(1))
        .expect("the sandbox has a pid 1");
    assert_ne!(init, 1, "not the host's init");
    // SAFETY: plain kill(2) of a process this test started.
    unsafe { libc::kill(init, libc::SIGKILL) };
    let result = handle.result();
    assert_eq!(result.status, ExecStatus::Failed);
    assert_eq!(result.exit_code, 128 + libc::SIGKILL);
    assert!(!alive(marker));
    // The next command notices and gets a sandbox again.
    assert_eq!(run(&rt, "echo again"), ("again\n".into(), String::new(), 0));
}

/// Commands share the warm sandbox (its /tmp, its pid namespace) while it is in use;
/// nothing one leaves running outlives it; idle for the policy's time, it is reaped.
#[test]
fn the_warm_sandbox_is_shared_and_reaped_when_idle() {
    let dir = tempfile::tempdir().unwrap();
    let policy = LinuxPolicy {
        sandbox_idle: Duration::from_millis(500),
        ..LinuxPolicy::default()
    };
    let rt = runtimes_with(dir.path(), policy);
    let marker = "sleep 1000.6161";
    let (out, _, code) = run(&rt, &format!("echo kept > /tmp/kept; {marker} & echo $!"));
    assert_eq!(code, 0);
    assert!(!alive(marker), "a background process outlived its command");
    let (out2, _, _) = run(&rt, "cat /tmp/kept; ps -e -o pid= | wc -l");
    let mut lines = out2.lines();
    assert_eq!(lines.next(), Some("kept"), "{out} {out2}");
    // pid 1, the holder, the shell, ps and wc: nothing of the first command.
    assert_eq!(lines.next().map(str::trim), Some("5"), "{out2}");

    // Idle past its time, the sandbox goes; the next command gets a fresh one.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        std::thread::sleep(Duration::from_millis(1500));
        let (_, _, code) = run(&rt, "test -e /tmp/kept");
        if code != 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the idle sandbox was never reaped"
        );
    }
}

/// A read-only path of the policy is read-only; one a command turned into a symlink
/// out of the workspace is refused, not bound.
#[test]
fn read_only_paths_stay_inside_the_workspace() {
    let dir = tempfile::tempdir().unwrap();
    let secret = tempfile::tempdir().unwrap();
    std::fs::write(secret.path().join("token"), "s3cret").unwrap();
    std::fs::create_dir(dir.path().join("vendor")).unwrap();
    std::fs::write(dir.path().join("vendor/lib.txt"), "lib\n").unwrap();
    let policy = LinuxPolicy {
        read_only: vec!["vendor".into(), "missing".into()],
        ..LinuxPolicy::default()
    };
    let rt = runtimes_with(dir.path(), policy);
    let (out, _, code) = run(
        &rt,
        "cat vendor/lib.txt; echo x > vendor/lib.txt || echo refused",
    );
    assert_eq!((out.as_str(), code), ("lib\nrefused\n", 0));

    std::fs::remove_dir_all(dir.path().join("vendor")).unwrap();
    std::os::unix::fs::symlink(secret.path(), dir.path().join("vendor")).unwrap();
    let refused = rt
        .exec("cat vendor/token", ExecOptions::default())
        .err()
        .unwrap();
    assert!(matches!(refused, Error::Refused { .. }), "{refused}");
    assert!(
        refused.to_string().contains("leads out of the workspace"),
        "{refused}"
    );
}

fn pids() -> Vec<i32> {
    let entries = std::fs::read_dir("/proc").unwrap();
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// A process's arguments, joined by spaces as a shell wrote them (the kernel keeps
/// them NUL-separated).
fn cmdline(pid: i32) -> String {
    let mut bytes = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    bytes
        .iter_mut()
        .filter(|b| **b == 0)
        .for_each(|b| *b = b' ');
    String::from_utf8_lossy(&bytes).into_owned()
}

fn pid_namespace(pid: i32) -> Option<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok()
}

/// The process's pid in its innermost pid namespace.
fn namespace_pid(pid: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with("NSpid:"))?;
    line.split_whitespace().last()?.parse().ok()
}

/// A signal the daemon ignores (SIGINT, when a shell started it in the background) or
/// blocks (computerd takes its signals synchronously) is neither ignored nor blocked in
/// its commands, or `kill` could not end them.
#[test]
fn commands_start_with_no_signal_ignored_or_blocked() {
    // SIGUSR2 stands for them: no test sends it. Blocked in this thread only, which
    // starts the commands.
    // SAFETY: sets this process's disposition of SIGUSR2 and this thread's mask.
    unsafe {
        libc::signal(libc::SIGUSR2, libc::SIG_IGN);
        let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        libc::sigemptyset(set.as_mut_ptr());
        libc::sigaddset(set.as_mut_ptr(), libc::SIGUSR2);
        libc::pthread_sigmask(libc::SIG_BLOCK, set.as_ptr(), std::ptr::null_mut());
    }
    let dir = tempfile::tempdir().unwrap();
    for policy in [LinuxPolicy::default(), one_sandbox_each()] {
        let rt = runtimes_with(dir.path(), policy);
        // The shell replaced by grep: what the shell started with (while it waits for
        // a child, dash blocks everything itself).
        let (out, _, code) = run(&rt, "exec grep -E '^Sig(Blk|Ign)' /proc/self/status");
        let expected = "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n";
        assert_eq!((out.as_str(), code), (expected, 0));
    }
}
