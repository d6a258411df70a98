//! `computerd mcp`: a real agent host's client (the official Python MCP SDK, driving
//! `tests/mcp/client.py`) starts the server and calls every tool; the workspace, the
//! mount's cached pages and the audit trail are checked here afterwards.

mod common;

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::{computerd, describe_failure, run_cmd, text, KillOnDrop, Mount, BIN};

/// The longest one client scenario may take.
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(180);

/// The Python that has the MCP SDK: $COMPUTER_MCP_PYTHON, or the virtual environment
/// scripts/install-test-deps.sh makes.
fn mcp_python() -> PathBuf {
    if let Some(python) = std::env::var_os("COMPUTER_MCP_PYTHON") {
        return python.into();
    }
    let venv = std::env::var_os("COMPUTER_MCP_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").expect("HOME is set");
            Path::new(&home).join(".cache/computer/mcp-venv")
        });
    let python = venv.join("bin/python");
    assert!(
        python.exists(),
        "{}: no Python with the MCP SDK; run scripts/install-test-deps.sh",
        python.display()
    );
    python
}

/// Runs the client's `scenario` against `computerd mcp SERVER_ARGS...`.
fn client(scenario: &str, server_args: &[&str]) -> Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/client.py");
    let mut cmd = Command::new(mcp_python());
    cmd.arg(script)
        .arg(scenario)
        .arg(BIN)
        .arg("mcp")
        .args(server_args);
    let out = run_cmd(&mut cmd, "the MCP client", SCENARIO_TIMEOUT);
    assert!(
        out.status.success(),
        "{}",
        describe_failure(scenario, None, &out)
    );
    out
}

#[test]
fn an_agent_host_drives_every_tool_of_a_mounted_workspace() {
    let m = Mount::new();
    m.sh("printf 'hello\\n' > hello.txt && cat hello.txt");
    let out = client("tools", &[m.db.to_str().unwrap()]);
    assert_eq!(text(&out.stdout), "tools: ok\n");

    // What the tools and each backend wrote is in the workspace, and the mount shows it
    // (the edit of a file whose page the kernel had cached too).
    assert_eq!(m.sh("cat hello.txt"), "hello, mcp\n");
    assert_eq!(m.sh("cat src/app.py"), "a = 10\nb = 2\nb = 2\n");
    assert_eq!(
        m.sh("cat from-linux.txt from-shell.txt from-js.txt"),
        "made\nshell\n42"
    );
    assert!(
        !m.path("late.txt").exists(),
        "the cancelled command was killed"
    );

    let audit = computerd(["audit", m.db.to_str().unwrap(), "--limit", "100"]);
    let trail = text(&audit.stdout);
    assert!(trail.contains("completed  tools  uid "), "{trail}");
    assert!(trail.contains("\"edit src/app.py\""), "{trail}");
    assert!(
        trail.contains("failed  tools  uid ") && trail.contains("appears 2 times"),
        "a refused edit is in the trail too: {trail}"
    );
    assert!(
        trail.contains("cancelled 143  linux") && trail.contains("\"sleep 30; echo late"),
        "{trail}"
    );
}

#[test]
fn a_free_database_and_a_server_are_served_too() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ws.db");
    let db = db.to_str().unwrap();
    assert!(computerd(["init", "-q", db]).status.success());
    let wrote = common::run_with_stdin(
        Command::new(BIN).args(["fs", db, "write", "/hello.txt"]),
        b"hello\n",
    );
    assert!(wrote.status.success(), "{}", text(&wrote.stderr));

    // A mount made for the session (the newer protocol, without a handshake), gone
    // with it: the database is free again.
    let out = client("discover", &[db]);
    assert_eq!(text(&out.stdout), "discover: ok\n");
    let status = text(&computerd(["status"]).stdout);
    assert!(!status.contains(db), "{status}");

    // A server runs every tool too: the file tools on its workspace, the Linux
    // backend's commands over its replica.
    let server = common::Server::start();
    server.fs_ok(&["write", "/hello.txt"], b"hello\n");
    let token = server.token_file.to_str().unwrap();
    let out = client(
        "tools",
        &["--remote", &server.address, "--token-file", token],
    );
    assert_eq!(text(&out.stdout), "tools: ok\n");
    let written = server.fs_ok(
        &["cat", "/hello.txt", "/from-linux.txt", "/from-js.txt"],
        b"",
    );
    assert_eq!(text(&written), "hello, mcp\nmade\n42");
}

#[test]
fn mistakes_in_the_arguments_are_said_before_any_session() {
    let out = computerd(["mcp", "/nonexistent/ws.db"]);
    assert!(!out.status.success());
    assert_eq!(
        text(&out.stderr),
        "computerd: /nonexistent/ws.db: no such workspace database (computerd init makes one)\n"
    );
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, common::TOKEN).unwrap();
    let token = token.to_str().unwrap();
    let out = computerd([
        "mcp",
        "--remote",
        "/nonexistent.sock",
        "--token-file",
        token,
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("/nonexistent.sock"),
        "{}",
        text(&out.stderr)
    );
}

/// A host that goes away (closes stdin, or stops the server with a signal) while a
/// command runs does not leave the command running in the mount: the session kills it
/// as it exits.
#[test]
fn a_host_that_leaves_takes_its_running_commands_with_it() {
    leave_during_a_command("1", |stdin, _| drop(stdin));
    leave_during_a_command("2", |_, pid| {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    });
}

/// Starts a long command through the MCP server, lets `leave` end the host, and checks
/// that the command was cancelled and its process went. `variant` makes the command's
/// arguments unique to this call of this test process, so that nothing else running
/// on the machine (another run of this test) can stand for it.
fn leave_during_a_command(variant: &str, leave: impl FnOnce(std::process::ChildStdin, i32)) {
    let m = Mount::new();
    let (mut server, mut stdin, _stdout) = start_session(&m.db);
    let seconds = format!("300.{}{variant}", std::process::id());
    let script = format!("sleep {seconds}; echo late > late.txt");
    let exec = format!(
        r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"exec","arguments":{{"command":"{script}","backend":"linux"}}}}}}"#
    );
    writeln!(stdin, "{exec}").unwrap();
    let started = common::wait_for(Duration::from_secs(60), || {
        sleeping(&seconds).first().copied()
    });
    assert!(started.is_some(), "the command never started");
    leave(stdin, server.0.id() as i32);
    let exited = common::wait_for(Duration::from_secs(60), || server.0.try_wait().unwrap());
    assert!(
        exited.is_some_and(|(status, _)| status.success()),
        "the MCP server did not end cleanly once its host left"
    );
    let trail = text(&computerd(["audit", m.db.to_str().unwrap()]).stdout);
    assert!(
        trail.contains("cancelled 143  linux") && trail.contains(&format!("\"{script}")),
        "{trail}"
    );
    // The exec ends when its top process is reaped; the rest of its tree, signalled with
    // it, may take a moment more to go. Gone it must be, not left for its 300 seconds.
    let gone = common::wait_for(Duration::from_secs(10), || {
        sleeping(&seconds).is_empty().then_some(())
    });
    let left = sleeping(&seconds);
    assert!(
        gone.is_some(),
        "the command's process is gone; left: {}\ntrail: {trail}",
        describe_processes(&left)
    );
}

/// `computerd mcp DB`, spoken to in JSON-RPC lines, past the handshake: the server
/// (killed if the test ends before it did), its stdin and its stdout.
fn start_session(db: &Path) -> (KillOnDrop, std::process::ChildStdin, impl BufRead) {
    let mut server = KillOnDrop(
        Command::new(BIN)
            .arg("mcp")
            .arg(db)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut stdin = server.0.stdin.take().unwrap();
    let mut stdout = std::io::BufReader::new(server.0.stdout.take().unwrap());
    let initialize = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"test","version":"0"}}}"#;
    writeln!(stdin, "{initialize}").unwrap();
    let mut answer = String::new();
    stdout.read_line(&mut answer).unwrap();
    assert!(answer.contains("\"computerd\""), "{answer}");
    let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    writeln!(stdin, "{initialized}").unwrap();
    (server, stdin, stdout)
}

/// A session whose owner went away (the mount was unmounted) says so on every call,
/// and what to do.
#[test]
fn a_session_whose_owner_is_gone_says_what_to_do() {
    let mut m = Mount::new();
    let (_server, mut stdin, mut stdout) = start_session(&m.db);
    m.unmount();
    let ls =
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"ls","arguments":{}}}"#;
    writeln!(stdin, "{ls}").unwrap();
    let mut answer = String::new();
    stdout.read_line(&mut answer).unwrap();
    assert!(
        answer.contains("\"isError\":true")
            && answer.contains(
                "the workspace's owner is gone (unmounted or stopped): start the MCP server again"
            ),
        "{answer}"
    );
}

/// The processes running `sleep SECONDS` on this machine (the sandbox's processes are
/// visible from here).
fn sleeping(seconds: &str) -> Vec<u32> {
    let Ok(processes) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let wanted = format!("sleep\0{seconds}\0");
    (processes.flatten())
        .filter(|process| {
            std::fs::read(process.path().join("cmdline"))
                .is_ok_and(|line| line == wanted.as_bytes())
        })
        .filter_map(|process| process.file_name().to_str()?.parse().ok())
        .collect()
}

/// What a failure needs to know of each of `pids`: its state, parent, pids in each
/// namespace, and cgroups.
fn describe_processes(pids: &[u32]) -> String {
    let describe = |pid: &u32| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let wanted = ["State:", "PPid:", "NSpid:", "SigBlk:", "SigIgn:"];
        let lines = (status.lines())
            .filter(|line| wanted.iter().any(|w| line.starts_with(w)))
            .collect::<Vec<_>>()
            .join("; ");
        let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        format!("pid {pid}: {lines}; cgroups {}", cgroups.replace('\n', " "))
    };
    pids.iter().map(describe).collect::<Vec<_>>().join("\n")
}
