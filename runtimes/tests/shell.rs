//! The shell backend on a workspace store: what scripts see and change, its limits,
//! stopping it, what it cannot reach, and `auto` routing.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{collect, run, Kept};
use computer_runtimes::shell::{ShellBackend, ShellLimits, ShellPolicy, EXIT_LIMIT};
use computer_runtimes::{
    Backend, Connection, Error, ExecOptions, ExecStatus, Runtimes, SpawnRequest, SyncOutcome, AUTO,
};
use computer_vfs::{MkdirOptions, Workspace};

fn workspace() -> Workspace {
    let ws = Workspace::open_in_memory(Default::default()).unwrap();
    let fs = ws.fs();
    fs.mkdir("/src", MkdirOptions::default()).unwrap();
    fs.write_file("/src/main.rs", "fn main() {\n    // TODO: args\n}\n")
        .unwrap();
    fs.write_file("/notes.txt", "b\na\nc\na\n").unwrap();
    ws
}

fn shell(ws: &Workspace, policy: ShellPolicy) -> Runtimes {
    let mut runtimes = Runtimes::new();
    let backend = ShellBackend::new(ws.clone(), policy, None).unwrap();
    runtimes.register(Arc::new(backend)).unwrap();
    runtimes
}

#[test]
fn scripts_read_and_change_the_workspace_store() {
    let ws = workspace();
    let rt = shell(&ws, ShellPolicy::default());
    let (out, _, code) = run(&rt, "sort notes.txt | uniq -c | sort -rn | head -1; pwd");
    assert_eq!(code, 0);
    assert_eq!(out, "      2 a\n/workspace\n");
    let script = "sed -i 's/TODO/DONE/' src/main.rs && mkdir -p out/x && \
                  grep -rn DONE src > out/x/hits && mv notes.txt out/ && ln -s ../src out/src";
    let (_, err, code) = run(&rt, script);
    assert_eq!(code, 0, "{err}");
    let fs = ws.fs();
    assert!(fs.read_to_string("/src/main.rs").unwrap().contains("DONE"));
    assert_eq!(
        fs.read_to_string("/out/x/hits").unwrap(),
        "src/main.rs:2:    // DONE: args\n"
    );
    assert!(!fs.exists("/notes.txt").unwrap());
    assert_eq!(fs.readlink("/out/src").unwrap(), "../src");
    let (out, _, _) = run(&rt, "cat out/src/main.rs | wc -l; cd out && ls");
    assert_eq!(out, "3\nnotes.txt\nsrc\nx\n");
}

#[test]
fn zcat_reads_what_gzip_wrote() {
    let ws = workspace();
    let rt = shell(&ws, ShellPolicy::default());
    let script = "gzip -k notes.txt && zcat notes.txt.gz | sort -u | tr -d '\\n'; \
                  echo; gzip -c src/main.rs | zcat | wc -l; zcat notes.txt; echo rc=$?";
    let (out, err, code) = run(&rt, script);
    assert_eq!(out, "abc\n3\nrc=1\n", "{err}");
    assert!(err.contains("zcat: notes.txt: not in gzip format"), "{err}");
    assert_eq!(code, 0);
}

#[test]
fn the_result_is_complete_and_errors_carry_exit_codes() {
    let ws = workspace();
    let rt = shell(&ws, ShellPolicy::default());
    let mut handle = rt
        .exec("cat missing.txt; echo after", ExecOptions::default())
        .unwrap();
    let (out, err) = collect(&mut handle);
    let result = handle.result();
    assert_eq!((out.as_str(), result.exit_code), ("after\n", 0));
    assert!(err.contains("missing.txt"), "{err}");
    assert_eq!(result.sync, SyncOutcome::Complete);
    assert_eq!(result.backend, "shell");
    let (_, _, code) = run(&rt, "set -e; false; echo never");
    assert_eq!(code, 1);
    let (_, err, code) = run(&rt, "if then fi");
    assert_eq!(code, 2);
    assert!(err.contains("syntax error"), "{err}");
}

#[test]
fn stdin_env_and_cwd_reach_the_script() {
    let ws = workspace();
    let rt = shell(&ws, ShellPolicy::default());
    let options = ExecOptions {
        stdin: Some(b"x y z\n".to_vec()),
        env: vec![("GREETING".into(), "hi".into())],
        cwd: Some("/src".into()),
        ..ExecOptions::default()
    };
    let mut handle = rt
        .exec("wc -w; echo $GREETING $PWD $HOME; ls", options)
        .unwrap();
    let (out, _) = collect(&mut handle);
    assert_eq!(out, "3\nhi /workspace/src /tmp\nmain.rs\n");
}

#[test]
fn output_streams_while_the_script_runs() {
    let ws = workspace();
    let rt = shell(&ws, ShellPolicy::default());
    let started = Instant::now();
    let mut handle = rt
        .exec("echo first; sleep 2; echo second", ExecOptions::default())
        .unwrap();
    let first = handle.next_event(None).unwrap();
    assert!(started.elapsed() < Duration::from_secs(2), "{first:?}");
    assert!(
        matches!(first, computer_runtimes::Event::Output { ref data, .. } if data == b"first\n")
    );
    handle.kill(libc::SIGKILL).unwrap();
}

#[test]
fn kill_and_timeout_stop_at_once() {
    let ws = workspace();
    let rt = shell(&ws, ShellPolicy::default());
    for script in ["sleep 100", "while true; do :; done", "sleep 100 | sort"] {
        let handle = rt.exec(script, ExecOptions::default()).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let killed = Instant::now();
        handle.kill(libc::SIGTERM).unwrap();
        let result = handle.result();
        assert!(killed.elapsed() < Duration::from_secs(1), "{script}");
        assert_eq!(result.status, ExecStatus::Cancelled, "{script}");
        assert_eq!(result.exit_code, 128 + libc::SIGTERM, "{script}");
    }
    let options = ExecOptions {
        timeout: Some(Duration::from_millis(200)),
        ..ExecOptions::default()
    };
    let started = Instant::now();
    let handle = rt.exec("sleep 2m", options).unwrap();
    let result = handle.result();
    assert_eq!(result.status, ExecStatus::TimedOut);
    assert!(started.elapsed() < Duration::from_secs(2));
    let started = Instant::now();
    let (_, err, code) = run(&rt, "sleep 0.2 0.1; sleep forever");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(code, 1);
    assert!(err.contains("invalid time interval 'forever'"), "{err}");
}

#[test]
fn each_limit_ends_the_exec_with_a_message() {
    let ws = workspace();
    let limits = ShellLimits {
        commands_max: 1_000,
        loop_iterations_max: 500,
        output_bytes_max: 10_000,
        write_bytes_max: 1_000,
        read_bytes_max: 2_000,
        ..ShellLimits::default()
    };
    let policy = ShellPolicy {
        limits,
        ..ShellPolicy::default()
    };
    let rt = shell(&ws, policy);
    let cases = [
        ("for i in $(seq 2000); do :; done", "loop iterations"),
        (
            "f() { true; }; i=0; until false; do f; done",
            "limit reached",
        ),
        ("f() { f; }; f", "function depth"),
    ];
    for (script, said) in cases {
        let (_, err, code) = run(&rt, script);
        assert_eq!(code, EXIT_LIMIT, "{script}: {err}");
        assert!(err.contains(said), "{script}: {err}");
    }
    let (out, err, code) = run(&rt, "seq 100000");
    assert_eq!(code, EXIT_LIMIT, "{err}");
    assert!(out.len() <= 10_000 && err.contains("output"), "{err}");
    let (_, err, code) = run(&rt, "seq 1000 > big.txt");
    assert_ne!(code, 0);
    assert!(err.contains("limit on bytes written"), "{err}");
    assert!(!ws.fs().exists("/big.txt").unwrap());
    ws.fs().write_file("/large.txt", vec![b'x'; 3_000]).unwrap();
    let (out, err, code) = run(&rt, "wc -c < large.txt; cat large.txt");
    assert_ne!(code, 0);
    assert!(
        err.contains("the shell reads whole files, at most 2000"),
        "{err}"
    );
    assert!(!out.contains("3000"), "{out}");
}

#[test]
fn the_host_is_out_of_reach() {
    let ws = workspace();
    let rt = shell(&ws, ShellPolicy::default());
    ws.fs().symlink("/etc/passwd", "/passwd-link").unwrap();
    ws.fs().symlink("../../../../etc/shadow", "/climb").unwrap();
    let attempts = [
        "cat /workspace/passwd-link",
        "cat climb",
        "cd /workspace/../../..; cat etc/passwd",
        "cd ../../..; ls; cat etc/passwd",
        "cat /etc/passwd /etc/shadow /root/.bashrc",
        "ls /home /root /var /proc/1",
    ];
    for script in attempts {
        let mut handle = rt.exec(script, ExecOptions::default()).unwrap();
        let (out, err) = collect(&mut handle);
        assert!(!out.contains("root:x:0:0"), "{script}: {out}");
        assert!(!err.contains("root:x:0:0"), "{script}: {err}");
    }
    // A program the shell does not have is refused, naming it.
    for (script, named) in [
        ("git status", "`git`"),
        ("python3 -c 'print(1)'", "`python3`"),
        ("npm test", "`npm`"),
        ("curl http://example.com", "`curl`"),
    ] {
        let refused = rt.exec(script, ExecOptions::default()).err().unwrap();
        assert!(matches!(refused, Error::Refused { .. }), "{script}");
        assert!(refused.to_string().contains(named), "{script}: {refused}");
    }
}

#[test]
fn policy_paths_and_commands_are_enforced() {
    let ws = workspace();
    let policy = ShellPolicy {
        write: vec!["out/**".into(), "out".into()],
        read: vec!["**".into()],
        commands: Some(
            ["cat", "echo", "mkdir", "sort", "cd"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
        ),
        ..ShellPolicy::default()
    };
    let rt = shell(&ws, policy);
    let (_, err, code) = run(&rt, "mkdir out && echo x > out/a && echo y > notes.txt");
    assert_ne!(code, 0);
    assert!(err.contains("not allowed by the shell's policy"), "{err}");
    assert_eq!(ws.fs().read_to_string("/out/a").unwrap(), "x\n");
    assert_eq!(
        ws.fs().read_to_string("/notes.txt").unwrap(),
        "b\na\nc\na\n"
    );
    let refused = rt
        .exec("grep a notes.txt", ExecOptions::default())
        .err()
        .unwrap();
    assert!(
        refused.to_string().contains("`grep` is not allowed"),
        "{refused}"
    );
}

/// A backend standing for Linux: it runs anything, with `sh`, in a directory.
struct Anything;

impl Backend for Anything {
    fn id(&self) -> &str {
        "linux"
    }
    fn describe(&self) -> computer_runtimes::Description {
        computer_runtimes::Description {
            id: "linux".into(),
            summary: String::new(),
            runs: String::new(),
            touches: String::new(),
        }
    }
    fn connect(&self) -> computer_runtimes::Result<Arc<dyn Connection>> {
        Err(Error::Connect {
            backend: "linux".into(),
            reason: "not in this test".into(),
        })
    }
}

#[test]
fn auto_routes_by_the_script_and_records_escalations() {
    let ws = workspace();
    let mut rt = Runtimes::new();
    rt.register(Arc::new(Anything)).unwrap();
    let backend = ShellBackend::new(ws.clone(), ShellPolicy::default(), None).unwrap();
    rt.register(Arc::new(backend)).unwrap();
    rt.set_auto(&["shell", "linux"]).unwrap();
    let ids: Vec<String> = rt.backends().into_iter().map(|d| d.id).collect();
    assert_eq!(ids, ["linux", "shell", "auto"]);
    let kept = Arc::new(Kept::default());
    rt.set_audit(kept.clone());
    let auto = || ExecOptions {
        backend: Some(AUTO.into()),
        ..ExecOptions::default()
    };
    for _ in 0..2 {
        let handle = rt.exec("grep -c a notes.txt", auto()).unwrap();
        let result = handle.result();
        assert_eq!((result.backend.as_str(), result.exit_code), ("shell", 0));
        assert!(
            result.reason.starts_with("auto: shell"),
            "{}",
            result.reason
        );
        // The Linux stand-in cannot connect: the exec is refused, after the escalation.
        let refused = rt.exec("git status", auto()).err().unwrap();
        assert!(matches!(refused, Error::Connect { .. }));
    }
    let kept = kept.0.lock().unwrap();
    let kinds: Vec<&str> = kept.iter().map(|(kind, _)| kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "exec",
            "escalated",
            "refused",
            "exec",
            "escalated",
            "refused"
        ]
    );
    let escalated = &kept[1].1;
    assert_eq!(escalated.backend, "linux");
    assert!(
        escalated
            .reason
            .contains("`git` is not a command the shell implements"),
        "{}",
        escalated.reason
    );
}

#[test]
fn a_connection_runs_concurrent_execs_sharing_its_tmp() {
    let ws = workspace();
    let backend = ShellBackend::new(ws.clone(), ShellPolicy::default(), None).unwrap();
    let connection = backend.connect().unwrap();
    let request = |id: &str, script: &str| SpawnRequest {
        exec_id: id.into(),
        script: script.into(),
        cwd: "/".into(),
        env: Vec::new(),
    };
    let first = connection
        .spawn(&request("a", "echo kept > /tmp/t"))
        .unwrap();
    drop(first.stdin);
    assert_eq!(first.process.wait().unwrap(), 0);
    let mut second = connection.spawn(&request("b", "cat /tmp/t")).unwrap();
    drop(second.stdin);
    let mut out = String::new();
    std::io::Read::read_to_string(&mut second.stdout, &mut out).unwrap();
    assert_eq!(
        (out.as_str(), second.process.wait().unwrap()),
        ("kept\n", 0)
    );
}
