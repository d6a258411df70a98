//! `computerd exec`: commands in a Linux sandbox over a workspace, free or mounted.

mod common;

use std::path::Path;
use std::process::Command;

use common::{computerd, exec, run_with_stdin, text, Mount, BIN};

fn fs_cat(db: &Path, path: &str) -> Vec<u8> {
    let out = computerd(["fs", db.to_str().unwrap(), "cat", path]);
    assert!(out.status.success(), "cat {path}: {}", text(&out.stderr));
    out.stdout
}

/// On a free database, exec mounts it for the command and lets go afterwards: what the
/// command wrote (1,000 small files and one of 64 MiB) is in the database when it
/// returns.
#[test]
fn a_free_database_is_mounted_for_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ws.db");
    assert!(computerd(["init", db.to_str().unwrap()]).status.success());
    let mut write = Command::new(BIN);
    write.args(["fs", db.to_str().unwrap(), "write", "/in.txt"]);
    assert!(run_with_stdin(&mut write, b"hello\n").status.success());

    let script = "cat in.txt; mkdir many && for i in $(seq 1000); do echo $i > many/$i; done; \
                  head -c 64M /dev/urandom > big; sha256sum < big > big.sha; echo done >&2; exit 3";
    let out = exec(&db, &[], script);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "hello\n");
    assert_eq!(text(&out.stderr), "done\n");

    // The database is free again, and holds everything.
    let listed = computerd(["fs", db.to_str().unwrap(), "ls", "/many"]);
    assert_eq!(text(&listed.stdout).lines().count(), 1000);
    assert_eq!(fs_cat(&db, "/many/1000"), b"1000\n");
    let big = fs_cat(&db, "/big");
    assert_eq!(big.len(), 64 << 20);
    let mut sum = Command::new("sha256sum");
    let summed = run_with_stdin(&mut sum, &big);
    assert_eq!(text(&fs_cat(&db, "/big.sha")), text(&summed.stdout));
    common::check_db(&db);
}

/// On a mounted database, the sandbox works in that mount: it sees what was written
/// there a moment before, and its writes are there when exec returns.
#[test]
fn a_mounted_database_is_worked_on_through_its_mount() {
    let m = Mount::new();
    m.sh("mkdir src && echo 'fn main() {}' > src/main.rs");
    let out = exec(
        &m.db,
        &["--cwd", "src"],
        "pwd; cat main.rs; echo built > out.txt",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "/workspace/src\nfn main() {}\n");
    assert_eq!(m.sh("cat src/out.txt"), "built\n");
}

/// Nothing of computerd's own environment reaches the command; --env does. Stdin is
/// handed over; a timeout ends the command and says so.
#[test]
fn environment_stdin_and_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ws.db");
    assert!(computerd(["init", db.to_str().unwrap()]).status.success());
    let mut cmd = Command::new(BIN);
    cmd.args([
        "exec",
        db.to_str().unwrap(),
        "--env",
        "GREETING=hi",
        "--",
        "env;",
        "tr",
        "a-z",
        "A-Z",
    ])
    .env("COMPUTER_SECRET_TOKEN", "hunter2");
    let out = run_with_stdin(&mut cmd, b"quiet\n");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(!stdout.contains("hunter2"), "{stdout}");
    assert!(stdout.contains("GREETING=hi"), "{stdout}");
    assert!(stdout.ends_with("QUIET\n"), "{stdout}");

    let out = exec(&db, &["--timeout", "0.5"], "echo started; sleep 100");
    assert_eq!(out.status.code(), Some(128 + libc::SIGTERM));
    assert_eq!(text(&out.stdout), "started\n");
    assert!(
        text(&out.stderr).contains("timed out"),
        "{}",
        text(&out.stderr)
    );

    let missing = exec(&dir.path().join("nope.db"), &[], "true");
    assert!(!missing.status.success());
    assert!(text(&missing.stderr).contains("no such workspace database"));
}

/// With --remote, the server runs the command in its replica; with --replica as well,
/// it runs here over a replica mount of our own. Either way the sandbox sees what the
/// server held when exec was called, and what it writes (1,000 small files, 64 MiB) is
/// on the server when exec returns.
#[test]
fn a_served_workspace_through_a_replica() {
    let server = common::Server::start();
    server.fs_ok(&["write", "/f.txt"], b"from the server\n");
    let token = server.token_file.to_str().unwrap();
    for (dir, extra) in [("here", &["--replica"][..]), ("there", &[][..])] {
        let script = format!(
            "cat f.txt; mkdir {dir} && for i in $(seq 1000); do echo $i > {dir}/$i; done; \
             head -c 64M /dev/urandom > {dir}/big; sha256sum < {dir}/big > {dir}/big.sha"
        );
        let mut args = vec!["exec", "--remote", &server.address, "--token-file", token];
        args.extend(extra);
        args.extend(["--", &script]);
        let out = computerd(args);
        assert!(
            out.status.success(),
            "{extra:?}: {}\n{}",
            text(&out.stderr),
            server.server_log()
        );
        assert_eq!(text(&out.stdout), "from the server\n");

        let listed = server.fs_ok(&["ls", &format!("/{dir}")], b"");
        assert_eq!(text(&listed).lines().count(), 1002);
        let big = server.fs_ok(&["cat", &format!("/{dir}/big")], b"");
        assert_eq!(big.len(), 64 << 20);
        let mut sum = Command::new("sha256sum");
        let summed = run_with_stdin(&mut sum, &big);
        assert_eq!(
            text(&server.fs_ok(&["cat", &format!("/{dir}/big.sha")], b"")),
            text(&summed.stdout)
        );
    }
    // The server's own record says who ran what: the command it ran for a client, by
    // the client's address; not the one run here, which the trail of this machine's
    // replica kept.
    let records = audit_json(&server.db);
    assert_eq!(records.len(), 1, "{records:?}");
    assert!(records[0]["script"].as_str().unwrap().contains("there"));
}

/// --policy: a read-only path is read-only in the sandbox; a mistake in the file is one
/// line naming it, and nothing runs.
#[test]
fn a_policy_file_shapes_the_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ws.db");
    assert!(computerd(["init", db.to_str().unwrap()]).status.success());
    let policy = dir.path().join("policy.toml");
    std::fs::write(
        &policy,
        "[linux]\nread_only = [\"vendor\"]\nprocesses = 64\n",
    )
    .unwrap();
    let policy = policy.to_str().unwrap();
    let script =
        "mkdir -p vendor; touch vendor/x 2>/dev/null && echo wrote; touch mine && echo mine";
    let first = exec(&db, &[], "mkdir vendor");
    assert!(first.status.success(), "{}", text(&first.stderr));
    let out = exec(&db, &["--policy", policy], script);
    assert_eq!(text(&out.stdout), "mine\n", "{}", text(&out.stderr));

    let typo = dir.path().join("typo.toml");
    std::fs::write(&typo, "[linux]\nnetwrok = true\n").unwrap();
    let out = exec(&db, &["--policy", typo.to_str().unwrap()], "touch ran");
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("line 2") && stderr.contains("netwrok"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    let listed = computerd(["fs", db.to_str().unwrap(), "ls", "/"]);
    assert!(!text(&listed.stdout).contains("ran"));
}

/// Unmounts (lazily if need be) when dropped, so a failing test leaves no mount.
struct Unmounts(std::path::PathBuf);

impl Drop for Unmounts {
    fn drop(&mut self) {
        if common::is_mounted(&self.0) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

/// The server killed while the command runs here (--replica): exec says the changes
/// are pending (exit 75) and keeps the replica's cache; once the server is back, mounting that cache
/// pushes them and the sync completes.
#[test]
fn a_server_killed_mid_command_leaves_the_sync_pending_then_complete() {
    use std::io::{BufRead, BufReader};
    let mut server = common::Server::start();
    let token = server.token_file.to_str().unwrap().to_owned();
    let mut child = Command::new(BIN)
        .args([
            "exec",
            "--remote",
            &server.address,
            "--replica",
            "--token-file",
            &token,
            "--",
        ])
        .arg("echo x > a.txt; echo started; sleep 5")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert_eq!(first, "started\n");
    server.kill9();
    let out = child.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "{stderr}");
    assert!(stderr.contains("not all in the workspace yet"), "{stderr}");
    let cache = stderr
        .split("keeps the unsynced changes in ")
        .nth(1)
        .and_then(|rest| rest.split(';').next())
        .unwrap_or_else(|| panic!("no cache named: {stderr}"))
        .to_owned();

    server.restart();
    let mnt = tempfile::tempdir().unwrap();
    let _unmounts = Unmounts(mnt.path().to_owned());
    let mnt = mnt.path().to_str().unwrap();
    let mount = computerd([
        "mount",
        "--remote",
        &server.address,
        "--token-file",
        &token,
        "--cache",
        &cache,
        mnt,
        "--daemon",
    ]);
    assert!(mount.status.success(), "{}", text(&mount.stderr));
    let synced = computerd(["sync", mnt]);
    assert!(synced.status.success(), "{}", text(&synced.stderr));
    assert_eq!(server.fs_ok(&["cat", "/a.txt"], b""), b"x\n");
    assert!(computerd(["umount", mnt]).status.success());
    let _ = std::fs::remove_dir_all(std::path::Path::new(&cache).parent().unwrap());
}

/// The records of `computerd audit --json` on `db`, oldest first.
fn audit_json(db: &Path) -> Vec<serde_json::Value> {
    let out = computerd(["audit", db.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON object per line"))
        .collect()
}

/// Every exec asked of a mount leaves a record in the workspace, the refused ones too:
/// who asked (as the kernel names the caller), what, where, and how it ended.
#[test]
fn every_exec_and_every_refusal_is_in_the_audit_trail() {
    let m = Mount::new();
    let ran = exec(&m.db, &["--env", "A=1"], "echo hi; exit 4");
    assert_eq!(ran.status.code(), Some(4), "{}", text(&ran.stderr));
    let refused = exec(&m.db, &["--cwd", "../.."], "cat /etc/shadow");
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("climbs out"),
        "{}",
        text(&refused.stderr)
    );

    let records = audit_json(&m.db);
    assert_eq!(records.len(), 2, "{records:?}");
    let (first, second) = (&records[0], &records[1]);
    assert_eq!(first["kind"], "exec");
    assert_eq!(first["status"], "failed");
    assert_eq!(first["exit_code"], 4);
    assert_eq!(first["backend"], "linux");
    assert_eq!(first["script"], "echo hi; exit 4");
    assert_eq!(first["sync"], "complete");
    let caller = first["caller"].as_str().unwrap();
    let uid = nix::unistd::getuid().as_raw();
    assert!(caller.starts_with(&format!("uid {uid} pid ")), "{caller}");
    assert_eq!(second["kind"], "refused");
    assert_eq!(second["status"], "refused");
    assert_eq!(second["script"], "cat /etc/shadow");
    assert!(second["seq"].as_u64() > first["seq"].as_u64());

    // The text listing says the same, a line per record.
    let listed = computerd(["audit", m.db.to_str().unwrap()]);
    let listed = text(&listed.stdout);
    let lines: Vec<&str> = listed.lines().collect();
    assert_eq!(lines.len(), 2, "{listed}");
    assert!(lines[0].contains("failed 4  linux"), "{listed}");
    assert!(lines[1].contains("refused"), "{listed}");
}

/// A signal to `computerd exec` ends the command in the owner, its whole process tree,
/// and the trail says it was cancelled.
#[test]
fn a_signal_to_exec_kills_the_command_in_the_owner() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let m = Mount::new();
    let mut child = Command::new(BIN)
        .args(["exec", m.db.to_str().unwrap(), "--"])
        // Everything up before the line the test waits for: the signal finds the tree.
        .arg("sleep 977 & sleep 978 & echo started; wait; echo not reached")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert_eq!(first, "started\n");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(128 + libc::SIGINT), "{stderr}");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    assert_eq!(rest, "");
    let ps = Command::new("pgrep").args(["-f", "sleep 97[78]"]).output();
    assert_eq!(text(&ps.unwrap().stdout), "", "the tree outlived the kill");

    let records = audit_json(&m.db);
    assert_eq!(
        records.last().unwrap()["status"],
        "cancelled",
        "{records:?}"
    );
}

/// A served database runs commands in a replica of the server, made on the first exec
/// and kept warm: the command sees what the server held, its writes are on the server
/// when exec returns, the trail lists both runs locally and through the wire, and the
/// server's stop takes the replica down.
#[test]
fn a_served_database_runs_commands_in_a_replica_of_the_server() {
    let mut server = common::Server::start();
    server.fs_ok(&["write", "/f.txt"], b"from the server\n");
    let out = exec(&server.db, &[], "cat f.txt; echo made > made.txt; exit 5");
    assert_eq!(
        out.status.code(),
        Some(5),
        "{}{}",
        text(&out.stderr),
        server.server_log()
    );
    assert_eq!(text(&out.stdout), "from the server\n");
    assert_eq!(server.fs_ok(&["cat", "/made.txt"], b""), b"made\n");
    // The second command finds the sandbox and the replica in place, and the first's
    // work in them.
    server.fs_ok(&["write", "/g.txt"], b"later\n");
    let out = exec(&server.db, &[], "cat made.txt g.txt");
    assert_eq!(text(&out.stdout), "made\nlater\n", "{}", text(&out.stderr));

    let token = server.token_file.to_str().unwrap().to_owned();
    let remote = computerd([
        "audit",
        "--remote",
        &server.address,
        "--token-file",
        &token,
        "--json",
    ]);
    assert!(remote.status.success(), "{}", text(&remote.stderr));
    let records: Vec<serde_json::Value> = (text(&remote.stdout).lines())
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(records.len(), 2, "{records:?}");
    assert_eq!(records[0]["exit_code"], 5);
    assert_eq!(records[1]["sync"], "complete");

    let replica_dir = std::env::temp_dir().join(format!("computerd-serve-{}", server.pid()));
    assert!(replica_dir.join("workspace").is_dir());
    assert!(
        !replica_dir.join("token").exists(),
        "the token stayed on disk after the replica started"
    );
    server.stop();
    assert!(!replica_dir.exists(), "the server's replica outlived it");
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !table.contains(&replica_dir.display().to_string()),
        "{table}"
    );
    assert_eq!(audit_json(&server.db).len(), 2);
}

/// Without the token, `computerd audit --remote` is refused.
#[test]
fn the_trail_is_not_read_without_the_token() {
    let server = common::Server::start();
    let wrong = std::env::temp_dir().join(format!("wrong-token-{}", std::process::id()));
    std::fs::write(&wrong, "not the token\n").unwrap();
    let out = computerd([
        "audit",
        "--remote",
        &server.address,
        "--token-file",
        wrong.to_str().unwrap(),
    ]);
    let _ = std::fs::remove_file(&wrong);
    assert!(!out.status.success());
    assert!(!text(&out.stderr).is_empty());
}

/// The server's replica is taken down with its idle sandbox, and the next command mounts
/// it again and finds the workspace as it was.
#[test]
fn the_servers_replica_is_reaped_when_idle_and_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.toml");
    std::fs::write(&policy, "[linux]\nidle_seconds = 0.5\n").unwrap();
    let server = common::Server::start_with(&["--policy", policy.to_str().unwrap()]);
    let out = exec(&server.db, &[], "echo one > one.txt");
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stderr),
        server.server_log()
    );
    let mountpoint =
        std::env::temp_dir().join(format!("computerd-serve-{}/workspace", server.pid()));
    let mounted = || {
        let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        table.contains(&format!(" {} ", mountpoint.display()))
    };
    assert!(mounted());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while mounted() {
        assert!(
            std::time::Instant::now() < deadline,
            "the idle replica stayed mounted"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let out = exec(&server.db, &[], "cat one.txt");
    assert_eq!(
        text(&out.stdout),
        "one\n",
        "{}{}",
        text(&out.stderr),
        server.server_log()
    );
}

/// A server whose temporary directory, where its replica's cache goes, is a 160 MiB
/// tmpfs. Bind both (`(_disk, server)`): the server goes first, then the disk.
fn server_with_replica_on_small_disk() -> (common::SmallDisk, common::Server) {
    let disk = common::SmallDisk::mount("160m");
    let tmp = disk.path().to_str().unwrap().to_owned();
    let server = common::Server::start_with_env(&[("TMPDIR", &tmp)]);
    (disk, server)
}

/// The disk of the server's replica fills up: the command that filled it learns ENOSPC
/// and its sync is pending (its file cannot be stored to be pushed; waiting on its
/// intent says so), but the next command still runs on what the replica pulled, and
/// its `rm` frees the disk; the sync then completes, the intent too, and the server
/// never saw the file that did not fit.
#[test]
fn a_full_disk_under_the_servers_replica_does_not_stop_the_next_command() {
    let (_disk, server) = server_with_replica_on_small_disk();
    server.fs_ok(&["write", "/kept.txt"], b"kept\n");

    // Random bytes: stored, the partial file takes as much room as it does staged.
    // Bytes that compress would fit in the store on whatever the staging file left,
    // and whether the sync went through would depend on timing.
    let out = exec(
        &server.db,
        &[],
        "head -c 300000000 /dev/urandom > big 2>/dev/null; echo wrote $?",
    );
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "wrote 1\n");
    let stderr = text(&out.stderr);
    assert!(stderr.contains("no space"), "{stderr}");
    // The result names its intent and how to wait for it: not yet.
    let wait = stderr
        .lines()
        .find_map(|line| line.strip_prefix("computerd: wait for them with: computerd "))
        .unwrap_or_else(|| panic!("no way to wait named: {stderr}"))
        .to_owned();
    let wait: Vec<&str> = wait.split(' ').chain(["--timeout", "1"]).collect();
    assert_eq!(wait[..2], ["sync", "--workspace"]);
    let waited = computerd(&wait);
    assert_eq!(waited.status.code(), Some(75), "{}", text(&waited.stderr));

    // The server moves on meanwhile: a deletion, which needs no room to pull.
    server.fs_ok(&["rm", "/kept.txt"], b"");
    let out = exec(&server.db, &[], "rm big; ls");
    assert_eq!(
        (out.status.code(), text(&out.stdout)),
        (Some(0), String::new()),
        "{}{}",
        text(&out.stderr),
        server.server_log()
    );
    // What was pending is settled now (the file that did not fit is gone).
    let waited = computerd(&wait);
    assert_eq!(waited.status.code(), Some(0), "{}", text(&waited.stderr));
    let out = exec(&server.db, &[], "echo after > after.txt");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(server.fs_ok(&["cat", "/after.txt"], b""), b"after\n");
    let listed = server.fs_ok(&["ls", "/"], b"");
    assert_eq!(text(&listed).trim(), "after.txt");
}

/// Kills the replica daemon of the server (its temporary directory `tmp`) with
/// SIGKILL, which leaves its mount answering ENOTCONN.
fn kill_servers_replica(server: &common::Server, tmp: &Path) {
    let cache = tmp.join(format!("computerd-serve-{}/replica.db", server.pid()));
    let killed = Command::new("pkill")
        .args(["-KILL", "-f", "--", &format!("--cache {}", cache.display())])
        .status()
        .unwrap();
    assert!(killed.success(), "no replica daemon of {}", cache.display());
    std::thread::sleep(std::time::Duration::from_millis(200));
}

/// The server's replica killed between two commands: the next command finds it dead,
/// mounts it again over its cache (in a new sandbox) and runs.
#[test]
fn a_killed_replica_of_the_server_is_mounted_again() {
    let server = common::Server::start();
    let out = exec(&server.db, &[], "echo one > one.txt");
    assert!(out.status.success(), "{}", text(&out.stderr));
    kill_servers_replica(&server, &std::env::temp_dir());
    let out = exec(&server.db, &[], "cat one.txt; echo two > two.txt");
    assert_eq!(
        (out.status.code(), text(&out.stdout)),
        (Some(0), "one\n".to_owned()),
        "{}{}",
        text(&out.stderr),
        server.server_log()
    );
    assert_eq!(server.fs_ok(&["cat", "/two.txt"], b""), b"two\n");
}

/// Fencing by the replica's identity: a pending result whose replica died with its
/// cache is reported lost, never complete, and the server goes on with a new replica
/// (and a new sandbox: the old one bound the dead mount).
#[test]
fn a_pending_result_whose_replica_lost_its_cache_is_lost() {
    let (disk, server) = server_with_replica_on_small_disk();
    let out = exec(
        &server.db,
        &[],
        "head -c 300000000 /dev/urandom > big 2>/dev/null",
    );
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    let intent = stderr
        .split("--intent ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no intent named: {stderr}"))
        .to_owned();

    kill_servers_replica(&server, disk.path());
    let dir = disk
        .path()
        .join(format!("computerd-serve-{}", server.pid()));
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("replica.db")
        {
            let _ = std::fs::remove_dir_all(&path);
            let _ = std::fs::remove_file(&path);
        }
    }
    let db = server.db.to_str().unwrap();
    let waited = computerd(["sync", "--workspace", db, "--intent", &intent]);
    let said = text(&waited.stderr);
    assert_eq!(
        waited.status.code(),
        Some(1),
        "{said}{}",
        server.server_log()
    );
    assert!(said.contains("lost"), "{said}");
    // The new replica works on; of `big` the server has at most what a sync took
    // while it was being written (its creation), never what the lost cache held.
    let out = exec(
        &server.db,
        &[],
        "echo after > after.txt; cat big 2>/dev/null | wc -c",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let size: u64 = text(&out.stdout).trim().parse().unwrap();
    assert!(size < 300_000_000, "{size}");
    assert_eq!(server.fs_ok(&["cat", "/after.txt"], b""), b"after\n");
}
