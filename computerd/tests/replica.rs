//! Replica mounts with real processes: `computerd serve` on one side, `computerd mount
//! --remote` on the other, ordinary tools and `computerd fs --remote` acting on each.
//! Faults are real too: kill -9 of either daemon mid-transfer, and connections cut by a
//! proxy in the middle of a large transfer.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;

/// How long a change may take to show on the other side before the test fails (the
/// target is well under a second; CI machines are shared and slow).
const CONVERGE: Duration = Duration::from_secs(20);

/// The server's copy of `path`, if it has one.
fn server_file(server: &Server, path: &str) -> Option<Vec<u8>> {
    let out = server.fs(&["cat", path], b"");
    out.status.success().then_some(out.stdout)
}

fn status(out: &std::process::Output) -> String {
    format!(
        "{:?}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn changes_on_either_side_appear_on_the_other() {
    let server = Server::start();
    server.fs_ok(&["mkdir", "-p", "/project/src"], b"");
    server.fs_ok(&["write", "/project/src/main.rs"], b"fn main() {}\n");
    let replica = Mount::replica(&server, &[]);

    // What the server had is there when the mount is ready.
    assert_eq!(
        std::fs::read(replica.path("project/src/main.rs")).unwrap(),
        b"fn main() {}\n"
    );

    // Replica to server: a tree made with ordinary tools, then a real git repository.
    replica.sh(
        "mkdir -p notes && for i in $(seq 1 50); do echo \"note $i\" > notes/$i.txt; done
         ln -s notes/1.txt first-note && chmod 600 notes/2.txt",
    );
    replica
        .sh("cd project && git init -q && git add -A && git commit -qm init && git log --oneline");
    let synced = replica.sync(&[]);
    assert!(
        synced.status.success(),
        "computerd sync: {}",
        status(&synced)
    );
    assert_eq!(server_file(&server, "/notes/50.txt").unwrap(), b"note 50\n");
    let stat = String::from_utf8(server.fs_ok(&["stat", "/notes/2.txt"], b"")).unwrap();
    assert!(
        stat.contains("0600") || stat.contains("rw-------"),
        "{stat}"
    );
    let link = String::from_utf8(server.fs_ok(&["ls", "-l", "/first-note"], b"")).unwrap();
    assert!(link.contains("notes/1.txt"), "{link}");
    let head = server_file(&server, "/project/.git/HEAD").unwrap();
    assert!(head.starts_with(b"ref: refs/heads/"), "{head:?}");

    // A write through the mount, seen by the server without anyone asking: latency.
    let before = std::time::Instant::now();
    std::fs::write(replica.path("live.txt"), b"up").unwrap();
    let (_, up) = wait_for(CONVERGE, || {
        server_file(&server, "/live.txt").filter(|b| b == b"up")
    })
    .unwrap_or_else(|| panic!("replica -> server: not there after {CONVERGE:?}"));
    // Server to replica: a write by a client of the server shows in the mount.
    server.fs_ok(&["write", "/down.txt"], b"down");
    let (_, down) = wait_for(CONVERGE, || {
        std::fs::read(replica.path("down.txt"))
            .ok()
            .filter(|b| b == b"down")
    })
    .unwrap_or_else(|| panic!("server -> replica: not there after {CONVERGE:?}"));
    // And an edit of a file the kernel has cached (page cache and attributes).
    assert_eq!(std::fs::read(replica.path("down.txt")).unwrap(), b"down");
    server.fs_ok(&["write", "/down.txt"], b"changed on the server");
    wait_for(CONVERGE, || {
        std::fs::read(replica.path("down.txt"))
            .ok()
            .filter(|b| b == b"changed on the server")
    })
    .expect("an edit on the server never replaced the cached content");
    server.fs_ok(&["rm", "-r", "/notes"], b"");
    wait_for(CONVERGE, || (!replica.path("notes").exists()).then_some(()))
        .expect("a removal on the server never reached the replica");
    // A listing the kernel keeps (FOPEN_CACHE_DIR) follows the server's changes.
    assert_eq!(common::list_dir(&replica.path("project/src")), ["main.rs"]);
    server.fs_ok(&["write", "/project/src/lib.rs"], b"");
    server.fs_ok(&["rm", "/project/src/main.rs"], b"");
    wait_for(CONVERGE, || {
        (common::list_dir(&replica.path("project/src")) == ["lib.rs"]).then_some(())
    })
    .expect("a cached listing never showed the server's changes");
    eprintln!(
        "latency: replica -> server {up:?} (through the poll of a client), server -> replica \
         {down:?}, total {:?}",
        before.elapsed()
    );
}

/// A file the server's shell backend rewrites in place, version by version, while a
/// thread keeps opening and reading it through a replica's mount, each open filling
/// the replica's kernel pages: each version shows in the mount once pulled, and the
/// reader never goes back to an older one (a pull must make the kernel drop what an
/// open stored before it).
#[test]
fn a_file_rewritten_on_the_server_is_never_read_stale_on_a_replica() {
    let server = Server::start();
    server.fs_ok(&["write", "/v.txt"], &versions::version(0));
    let replica = Mount::replica(&server, &[]);
    let path = replica.path("v.txt");
    let reader = versions::ReadLoop::start(&path, versions::never_older);
    for v in 1..=15 {
        versions::rewrite_in_place(&server.db, "v.txt", v);
        wait_for(CONVERGE, || {
            let seen = versions::version_of(&std::fs::read(&path).ok()?)?;
            (seen == v).then_some(())
        })
        .unwrap_or_else(|| panic!("version {v} not on the replica after {CONVERGE:?}"));
    }
    reader.stop();
}

#[test]
fn a_replica_serves_while_the_server_is_down_and_catches_up() {
    let mut server = Server::start();
    server.fs_ok(&["write", "/before.txt"], b"before");
    let replica = Mount::replica(
        &server,
        &["--retry-initial-ms", "100", "--retry-max-ms", "500"],
    );
    server.kill9();

    // The mount goes on: reads and writes.
    assert_eq!(
        std::fs::read(replica.path("before.txt")).unwrap(),
        b"before"
    );
    std::fs::write(replica.path("offline.txt"), b"written offline").unwrap();

    // A sync someone waits for is pending, never a silent success.
    let pending = replica.sync(&["--timeout", "5"]);
    assert_eq!(pending.status.code(), Some(75), "{}", status(&pending));
    let stderr = String::from_utf8_lossy(&pending.stderr);
    assert!(stderr.contains("sync pending"), "{stderr}");
    let intent = stderr
        .split("--intent ")
        .nth(1)
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|| panic!("no intent in {stderr:?}"));

    // The server returns: the pending sync completes by itself.
    server.restart();
    let done = replica.sync(&["--intent", &intent, "--timeout", "60"]);
    assert!(done.status.success(), "{}", status(&done));
    assert_eq!(
        server_file(&server, "/offline.txt").unwrap(),
        b"written offline"
    );
}

#[test]
fn kill_9_of_the_replica_mid_transfer_loses_nothing_fsynced() {
    let server = Server::start();
    let mut replica = Mount::replica(&server, &[]);
    let big = common::pseudo_random_seeded(48 << 20, 7);
    std::fs::write(replica.scratch.join("big"), &big).unwrap();
    // fsync'd on the replica: it must reach the server whatever happens to the daemon.
    replica.sh(&format!(
        "cp {} big && sync big && echo small > small && sync small",
        replica.scratch.join("big").display()
    ));
    // The sync loop is pushing the big file now; kill it in the middle.
    std::thread::sleep(Duration::from_millis(150));
    replica.kill_daemon();
    replica.mount(&[]);
    let done = replica.sync(&["--timeout", "120"]);
    assert!(done.status.success(), "{}", status(&done));
    assert_eq!(server_file(&server, "/small").unwrap(), b"small\n");
    assert!(
        server_file(&server, "/big").as_deref() == Some(&big[..]),
        "the big file differs"
    );
    replica.unmount();
    replica.check_db();
}

#[test]
fn kill_9_of_the_server_mid_transfer_and_a_restart() {
    let mut server = Server::start();
    let big = common::pseudo_random_seeded(48 << 20, 11);
    let input = std::env::temp_dir().join(format!("computerd-big-{}", std::process::id()));
    std::fs::write(&input, &big).unwrap();
    // Put the file on the server through a replica, so the server has a large tree.
    {
        let writer = Mount::replica(&server, &[]);
        writer.sh(&format!("cp {} big", input.display()));
        let done = writer.sync(&[]);
        assert!(done.status.success(), "{}", status(&done));
    }
    let _ = std::fs::remove_file(&input);
    // A fresh replica pulls it; the server dies in the middle and comes back.
    let killer = {
        let pid = server.pid();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            // SAFETY: a signal to the server process this test started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        })
    };
    let reader = Mount::replica(
        &server,
        &["--retry-initial-ms", "100", "--retry-max-ms", "1000"],
    );
    killer.join().unwrap();
    server.forget_killed();
    server.restart();
    let done = reader.sync(&["--timeout", "120"]);
    assert!(done.status.success(), "{}", status(&done));
    let got = std::fs::read(reader.path("big")).unwrap();
    assert!(got == big, "the replica's copy differs after the restart");
}

/// A TCP proxy that can cut every connection through it, and counts the bytes.
struct CuttingProxy {
    address: String,
    cut: Arc<AtomicBool>,
    live: Arc<Mutex<Vec<TcpStream>>>,
    bytes: Arc<AtomicU64>,
}

impl CuttingProxy {
    fn start(upstream: &str) -> CuttingProxy {
        let upstream = upstream
            .strip_prefix("tcp:")
            .expect("a TCP server")
            .to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = format!("tcp:{}", listener.local_addr().unwrap());
        let cut = Arc::new(AtomicBool::new(false));
        let live: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let bytes = Arc::new(AtomicU64::new(0));
        {
            let (live, bytes) = (live.clone(), bytes.clone());
            std::thread::spawn(move || {
                for client in listener.incoming() {
                    let Ok(client) = client else { continue };
                    let Ok(server) = TcpStream::connect(&upstream) else {
                        continue;
                    };
                    let mut live_now = live.lock().unwrap();
                    live_now.push(client.try_clone().unwrap());
                    live_now.push(server.try_clone().unwrap());
                    drop(live_now);
                    for (mut from, mut to) in [
                        (client.try_clone().unwrap(), server.try_clone().unwrap()),
                        (server, client),
                    ] {
                        let bytes = bytes.clone();
                        std::thread::spawn(move || {
                            let mut buf = vec![0u8; 64 << 10];
                            loop {
                                match from.read(&mut buf) {
                                    Ok(0) | Err(_) => break,
                                    Ok(n) => {
                                        bytes.fetch_add(n as u64, Ordering::Relaxed);
                                        if to.write_all(&buf[..n]).is_err() {
                                            break;
                                        }
                                    }
                                }
                            }
                            let _ = to.shutdown(std::net::Shutdown::Both);
                        });
                    }
                }
            });
        }
        CuttingProxy {
            address,
            cut,
            live,
            bytes,
        }
    }

    /// Cuts every connection open now (new ones go through).
    fn cut_all(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for stream in self.live.lock().unwrap().drain(..) {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }
}

#[test]
fn cutting_the_connection_in_the_middle_of_a_large_transfer() {
    let server = Server::start_on(Some("tcp:127.0.0.1:0"));
    let proxy = CuttingProxy::start(&server.address);
    let through_proxy = Server::client_of(&server, &proxy.address);
    let replica = Mount::replica(
        &through_proxy,
        &["--retry-initial-ms", "50", "--retry-max-ms", "500"],
    );
    let big = common::pseudo_random_seeded(64 << 20, 3);
    std::fs::write(replica.scratch.join("big"), &big).unwrap();
    replica.sh(&format!("cp {} big", replica.scratch.join("big").display()));
    // Cut while the blocks travel: once some megabytes went through, and again later.
    for threshold in [8u64 << 20, 24 << 20] {
        wait_for(Duration::from_secs(60), || {
            (proxy.bytes.load(Ordering::Relaxed) > threshold).then_some(())
        });
        proxy.cut_all();
    }
    let done = replica.sync(&["--timeout", "120"]);
    assert!(done.status.success(), "{}", status(&done));
    assert!(
        server_file(&server, "/big").as_deref() == Some(&big[..]),
        "the big file differs"
    );
    eprintln!(
        "bytes through the proxy for a 64 MiB file cut twice: {}",
        proxy.bytes.load(Ordering::Relaxed)
    );
}

#[test]
fn both_sides_changing_a_file_keeps_both_versions() {
    let mut server = Server::start();
    server.fs_ok(&["write", "/shared.txt"], b"original\n");
    let replica = Mount::replica(
        &server,
        &["--retry-initial-ms", "100", "--retry-max-ms", "500"],
    );
    server.stop();
    std::fs::write(replica.path("shared.txt"), b"the replica's version\n").unwrap();
    // The server changes the same file while they are apart (its database directly).
    let out = computerd([
        std::ffi::OsStr::new("fs"),
        server.db.as_os_str(),
        std::ffi::OsStr::new("write"),
        std::ffi::OsStr::new("/shared.txt"),
    ]);
    // `computerd()` gives no stdin: the file is emptied on the server, a change all the same.
    assert!(out.status.success(), "{}", status(&out));
    server.restart();
    let done = replica.sync(&["--timeout", "60"]);
    assert!(done.status.success(), "{}", status(&done));
    // The background sync may have met the conflict before `computerd sync` asked.
    assert!(
        replica
            .daemon_log()
            .contains("conflict: both sides changed the path"),
        "the conflict was not reported:\n{}",
        replica.daemon_log()
    );
    // Both versions on both sides: the server's at the path, the replica's beside it.
    let listing = String::from_utf8(server.fs_ok(&["ls", "/"], b"")).unwrap();
    let kept: Vec<&str> = listing
        .lines()
        .filter(|l| l.starts_with("shared.txt.conflict-"))
        .collect();
    assert_eq!(kept.len(), 1, "server listing:\n{listing}");
    assert_eq!(
        server_file(&server, &format!("/{}", kept[0])).unwrap(),
        b"the replica's version\n"
    );
    assert_eq!(server_file(&server, "/shared.txt").unwrap(), b"");
    wait_for(CONVERGE, || {
        std::fs::read(replica.path(kept[0]))
            .ok()
            .filter(|b| b == b"the replica's version\n")
    })
    .expect("the conflict copy never reached the replica");
    assert_eq!(std::fs::read(replica.path("shared.txt")).unwrap(), b"");
}

#[test]
fn a_replica_that_lost_its_disk_reports_the_old_sync_lost() {
    let mut server = Server::start();
    let mut replica = Mount::replica(
        &server,
        &[
            "--peer",
            "sandbox",
            "--retry-initial-ms",
            "100",
            "--retry-max-ms",
            "500",
        ],
    );
    server.kill9();
    std::fs::write(replica.path("unsynced.txt"), b"never reached the server").unwrap();
    let pending = replica.sync(&["--timeout", "3"]);
    assert_eq!(pending.status.code(), Some(75), "{}", status(&pending));
    let stderr = String::from_utf8_lossy(&pending.stderr).into_owned();
    let intent = stderr.split("--intent ").nth(1).unwrap().trim().to_owned();

    // The replica's machine dies with its disk; a new one comes up under the same name.
    replica.kill_daemon();
    replica.lose_cache();
    server.restart();
    replica.mount(&["--peer", "sandbox"]);
    let lost = replica.sync(&["--intent", &intent, "--timeout", "10"]);
    assert_eq!(lost.status.code(), Some(1), "{}", status(&lost));
    assert!(
        String::from_utf8_lossy(&lost.stderr).contains("lost"),
        "{}",
        status(&lost)
    );
    assert!(server_file(&server, "/unsynced.txt").is_none());
    // The newcomer works normally.
    std::fs::write(replica.path("new.txt"), b"new").unwrap();
    let done = replica.sync(&[]);
    assert!(done.status.success(), "{}", status(&done));
    assert_eq!(server_file(&server, "/new.txt").unwrap(), b"new");
}

#[test]
fn a_wrong_token_is_refused() {
    let server = Server::start();
    let out = {
        let mut cmd = std::process::Command::new(BIN);
        cmd.args(["fs", "--remote", &server.address, "ls", "/"])
            .env("COMPUTERD_TOKEN", "not-the-token");
        run_cmd(&mut cmd, "fs --remote with a wrong token", COMMAND_TIMEOUT)
    };
    assert_eq!(out.status.code(), Some(1), "{}", status(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("wrong or missing token"),
        "{}",
        status(&out)
    );
    let no_token = {
        let mut cmd = std::process::Command::new(BIN);
        cmd.args(["fs", "--remote", &server.address, "ls", "/"])
            .env_remove("COMPUTERD_TOKEN");
        run_cmd(&mut cmd, "fs --remote without a token", COMMAND_TIMEOUT)
    };
    assert_eq!(no_token.status.code(), Some(1), "{}", status(&no_token));
}

#[test]
fn writers_are_held_back_when_the_backlog_passes_its_bound() {
    let mut server = Server::start();
    let replica = Mount::replica(
        &server,
        &[
            "--backlog-max-paths",
            "40",
            "--backlog-wait-secs",
            "2",
            "--retry-initial-ms",
            "100",
            "--retry-max-ms",
            "300",
        ],
    );
    server.kill9();
    // Nothing drains: creates go through until the bound, then wait and fail ENOSPC.
    let out = try_sh(
        &replica.mnt,
        "for i in $(seq 1 200); do echo $i > f$i || { echo \"stopped at $i\"; exit 0; }; done",
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stopped: u64 = stdout
        .trim()
        .strip_prefix("stopped at ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("every create went through: {stdout} {stderr}"));
    assert!(stderr.contains("No space left on device"), "{stderr}");
    // The bound, plus what the gate let through before it measured (it measures every
    // 200 ms), and far from all 200.
    assert!(
        (40..=150).contains(&stopped),
        "stopped at {stopped}: the bound is 40 paths"
    );
    // Removing makes room without waiting.
    replica.sh("rm -f f1 f2");
    // The server returns: the backlog drains and writers go on.
    server.restart();
    let done = replica.sync(&["--timeout", "60"]);
    assert!(done.status.success(), "{}", status(&done));
    wait_for(CONVERGE, || {
        std::fs::write(replica.path("after.txt"), b"again").ok()
    })
    .expect("writers still held back after the sync caught up");
    let done = replica.sync(&[]);
    assert!(done.status.success(), "{}", status(&done));
    assert_eq!(server_file(&server, "/after.txt").unwrap(), b"again");
    assert!(replica.daemon_log().contains("holding writers back"));
}

#[test]
fn remote_cat_and_write_stream_files_of_any_size() {
    let server = Server::start();
    // Larger than one protocol message (64 MiB): it travels as a stream of pieces.
    let big: Vec<u8> = (0..(65u64 << 20) + 7)
        .map(|i| (i * 31 % 253) as u8)
        .collect();
    server.fs_ok(&["write", "/big"], &big);
    let out = server.fs(&["cat", "/missing", "/big"], b"");
    assert_eq!(out.status.code(), Some(1), "{}", status(&out));
    assert!(out.stdout == big, "the file read back differs");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "computerd: /missing: no such file or directory\n"
    );
    server.fs_ok(&["write", "--append", "/big"], b"tail");
    let stat = String::from_utf8(server.fs_ok(&["stat", "--json", "/big"], b"")).unwrap();
    assert!(
        stat.contains(&format!("\"size\":{}", big.len() + 4)),
        "{stat}"
    );
    // The head closes the pipe early: cat ends quietly.
    let mut cmd = std::process::Command::new(BIN);
    cmd.arg("fs")
        .arg("--remote")
        .arg(&server.address)
        .arg("--token-file")
        .arg(&server.token_file)
        .args(["cat", "/big"]);
    let script = format!(
        "{} | head -c 10 | wc -c",
        shell_words(cmd.get_program(), cmd.get_args())
    );
    let counted = sh(std::path::Path::new("/"), &script);
    assert_eq!(counted.trim(), "10");
    let dir = server.fs(&["write", "/"], b"x");
    assert!(!dir.status.success());
    assert_eq!(
        String::from_utf8_lossy(&dir.stderr),
        "computerd: /: is a directory\n"
    );
}

/// A command line for `sh`, each word single-quoted.
fn shell_words<'a>(
    program: &'a std::ffi::OsStr,
    args: impl Iterator<Item = &'a std::ffi::OsStr>,
) -> String {
    std::iter::once(program)
        .chain(args)
        .map(|w| format!("'{}'", w.to_string_lossy().replace('\'', r"'\''")))
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn a_remote_write_cut_short_leaves_the_old_content() {
    let server = Server::start();
    server.fs_ok(&["write", "/f"], b"old\n");
    let mut child = std::process::Command::new(BIN)
        .arg("fs")
        .arg("--remote")
        .arg(&server.address)
        .arg("--token-file")
        .arg(&server.token_file)
        .args(["write", "/f"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&vec![b'n'; 5 << 20]).unwrap();
    stdin.flush().unwrap();
    // The hidden replacement appears once the stream has begun.
    let began = wait_for(Duration::from_secs(30), || {
        let listing = server.fs_ok(&["ls", "-a", "/"], b"");
        String::from_utf8_lossy(&listing)
            .contains(".f.replace-")
            .then_some(())
    });
    assert!(began.is_some(), "the write never began");
    child.kill().unwrap();
    child.wait().unwrap();
    drop(stdin);
    assert_eq!(server.fs_ok(&["cat", "/f"], b""), b"old\n");
    // The server notices the closed connection and removes what the stream left.
    let cleaned = wait_for(Duration::from_secs(30), || {
        let listing = server.fs_ok(&["ls", "-a", "/"], b"");
        (!String::from_utf8_lossy(&listing).contains(".f.replace-")).then_some(())
    });
    assert!(cleaned.is_some(), "the abandoned replacement stayed");
}

#[test]
fn file_commands_print_the_same_through_a_server_as_on_its_database() {
    let server = Server::start();
    for args in [
        &["mkdir", "-p", "-m", "750", "/p/q"][..],
        &["truncate", "-s", "3K", "/p/q/three"],
        &["ln", "-s", "q/three", "/p/link"],
        &["ln", "/p/q/three", "/p/hard"],
        &["cp", "/p/q/three", "/p/copy"],
        &["mv", "/p/copy", "/p/q"],
        &["chmod", "600", "/p/q/copy"],
        &["mkdir", "/p/.hidden"],
    ] {
        server.fs_ok(args, b"");
    }
    server.fs_ok(
        &["write", "/p/notes.txt"],
        b"alpha\nneedle one\nbeta\nNEEDLE two\n",
    );
    // Read commands on a served database run here, beside the server.
    let local = |args: &[&str]| {
        let mut all = vec![std::ffi::OsStr::new("fs"), server.db.as_os_str()];
        all.extend(args.iter().map(std::ffi::OsStr::new));
        computerd(all)
    };
    for args in [
        &["ls", "-laR", "/"][..],
        &["ls", "-lh", "/p/link", "/p/q", "/p/notes.txt", "/missing"],
        &["ls", "-A", "/p"],
        &["stat", "/p/link", "/p/q/copy", "/missing"],
        &["stat", "-L", "--json", "/p/link"],
        &["find", "/p/**"],
        &["grep", "-i", "needle", "/"],
        &["grep", "-m", "1", "needle", "/p"],
        &["grep", "absent", "/"],
        &["tree", "/"],
        &["tree", "/p/notes.txt"],
        &["du", "/"],
        &["du", "-sh", "/p"],
        &["du", "/missing"],
    ] {
        let remote = server.fs(args, b"");
        let here = local(args);
        assert_eq!(
            (remote.status.code(), &remote.stdout, &remote.stderr),
            (here.status.code(), &here.stdout, &here.stderr),
            "{args:?}: remote {}\nlocal {}",
            status(&remote),
            status(&here)
        );
    }
    // The commands on the whole store: the same figures, whatever the clock says.
    let figures = |out: std::process::Output| -> Vec<String> {
        assert!(out.status.success(), "{}", status(&out));
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .filter(|line| !line.starts_with("database bytes") && !line.starts_with("free in"))
            .map(|line| line.split(" in ").next().unwrap_or(line).to_owned())
            .collect()
    };
    assert_eq!(
        figures(server.fs(&["stats"], b"")),
        figures(local(&["stats"]))
    );
    let checked = figures(server.fs(&["check"], b""));
    assert_eq!(checked, figures(local(&["check"])));
    assert!(checked[0].starts_with("checked 8 nodes"), "{checked:?}");
    let compacted = figures(server.fs(&["compact", "--json"], b""));
    assert!(
        compacted[0].starts_with("{\"bytes_before\":"),
        "{compacted:?}"
    );
    // What the mutations did, seen from the database.
    let listing = String::from_utf8(local(&["ls", "-l", "/p/q"]).stdout).unwrap();
    assert!(listing.contains("-rw------- 1 "), "{listing}");
    assert!(listing.contains(" 3072 "), "{listing}");
    // Mutations fail as they do here, naming the path.
    let out = server.fs(&["mkdir", "/p/q"], b"");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "computerd: /p/q: file exists\n"
    );
}

/// A reader holds a staged file open while a pull replaces its content; a writer that
/// opens the file after must write into the file the replica now has (its staging
/// file is a new one), not into the one the reader keeps.
#[test]
fn a_write_after_a_pull_replaced_a_file_a_reader_holds_reaches_the_server() {
    let server = Server::start();
    server.fs_ok(&["write", "/f"], b"one\n");
    let replica = Mount::replica(&server, &[]);
    let path = replica.path("f");
    // Staged by an open for writing, then held open by a reader.
    drop(std::fs::OpenOptions::new().write(true).open(&path).unwrap());
    let mut reader = std::process::Command::new("python3")
        .arg("-c")
        .arg("import sys; f = open(sys.argv[1], 'rb'); print(f.read(3).decode(), flush=True); sys.stdin.read()")
        .arg(&path)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 4];
    let reader_out = reader.stdout.as_mut().unwrap();
    reader_out.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"one\n", "what the reader read first");
    server.fs_ok(&["write", "/f"], b"two\n");
    wait_for(CONVERGE, || {
        (std::fs::read(&path).ok()? == b"two\n").then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "the server's change never reached the replica: {:?}\n{}",
            std::fs::read(&path),
            replica.daemon_log()
        )
    });
    let mut writer = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    writer.write_all(b"three\n").unwrap();
    drop(writer);
    assert_eq!(std::fs::read(&path).unwrap(), b"two\nthree\n");
    let reached = wait_for(CONVERGE, || {
        (server_file(&server, "/f")? == b"two\nthree\n").then_some(())
    });
    drop(reader.stdin.take());
    reader.wait().unwrap();
    reached.unwrap_or_else(|| {
        panic!(
            "the write never reached the server: {:?}\n{}",
            server_file(&server, "/f"),
            replica.daemon_log()
        )
    });
}
