//! `computerd mcp`: a real agent host's client (the official Python MCP SDK, driving
//! `tests/mcp/client.py`) starts the server and calls every tool; the workspace, the
//! mount's cached pages and the audit trail are checked here afterwards.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::{computerd, describe_failure, run_cmd, text, Mount, BIN};

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
