//! The transport over real sockets: a server on a Unix socket (or TCP on loopback) and
//! clients in the same process, each side on its own thread and event loop.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use computer_vfs::{GrepOptions, Options, Workspace};
use tokio::sync::oneshot;

use super::*;
use crate::rpc::server::{ServeOptions, ServerSocket};
use crate::{wire, Authority, BatchLimits, Replica, Upstream, PROTOCOL_VERSION};

const TOKEN: &[u8] = b"rpc-test-token";

/// A server on its own thread, stopped (and joined) when dropped.
struct TestServer {
    address: Address,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    workspace: Workspace,
    _dir: tempfile::TempDir,
}

impl TestServer {
    fn start(options: ServeOptions) -> TestServer {
        let dir = tempfile::tempdir().unwrap();
        let workspace = Workspace::open(dir.path().join("server.db"), Options::default()).unwrap();
        let address = Address::Unix(dir.path().join("sock"));
        let (stop, stopped) = oneshot::channel::<()>();
        let (bound, is_bound) = std::sync::mpsc::channel();
        let authority = Authority::new(workspace.clone(), TOKEN.to_vec());
        let listen = address.clone();
        let thread = std::thread::spawn(move || {
            run_local(async move {
                let socket = ServerSocket::bind(&listen).await.unwrap();
                bound.send(()).unwrap();
                serve(socket, authority, options, async {
                    let _ = stopped.await;
                })
                .await;
            })
            .unwrap();
        });
        is_bound.recv().unwrap();
        TestServer {
            address,
            stop: Some(stop),
            thread: Some(thread),
            workspace,
            _dir: dir,
        }
    }

    fn socket_path(&self) -> PathBuf {
        match &self.address {
            Address::Unix(path) => path.clone(),
            Address::Tcp(_) => unreachable!(),
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn plain() -> ClientInfo {
    ClientInfo::default()
}

#[test]
fn addresses_parse_and_print_back() {
    for text in [
        "/run/computer.sock",
        "tcp:127.0.0.1:7000",
        "tcp:[::1]:0",
        "tcp:host:65535",
    ] {
        assert_eq!(text.parse::<Address>().unwrap().to_string(), text);
    }
    for bad in ["", "tcp:", "tcp:host", "tcp::80", "tcp:host:99999", "a\0b"] {
        assert!(bad.parse::<Address>().is_err(), "{bad:?} parsed");
    }
    assert!("/x".repeat(60).parse::<Address>().is_err());
}

#[test]
fn a_replica_syncs_both_ways_over_a_socket() {
    let server = TestServer::start(ServeOptions::default());
    let fs = server.workspace.fs();
    fs.write_file("/from-server.txt", b"hello").unwrap();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    fs.write_file("/big.bin", &big).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let local = Workspace::open(dir.path().join("replica.db"), Options::default()).unwrap();
    let client = ClientInfo {
        replica_id: local.id().to_owned(),
        peer: "test-replica".into(),
    };
    run_local(async {
        let (upstream, info) = connect(&server.address, TOKEN, client).await.unwrap();
        assert_eq!(info.workspace_id, server.workspace.id());
        let replica = Replica::attach(local.clone(), &info, BatchLimits::default()).unwrap();
        let report = replica.sync(&upstream).await.unwrap();
        assert_eq!(report.pulled, 3, "{report:?}"); // the root, two files
        assert!(report.bytes_in > 0);
        assert_eq!(local.fs().read_file("/big.bin").unwrap(), big);

        local.fs().write_file("/from-replica.txt", b"back").unwrap();
        let report = replica.sync(&upstream).await.unwrap();
        assert!(report.pushed >= 1, "{report:?}");
    })
    .unwrap();
    assert_eq!(
        server
            .workspace
            .fs()
            .read_file("/from-replica.txt")
            .unwrap(),
        b"back"
    );
}

#[test]
fn a_wrong_token_is_refused_and_the_connection_gets_no_second_guess() {
    let server = TestServer::start(ServeOptions::default());
    run_local(async {
        let refused = connect(&server.address, b"guess", plain()).await;
        let Err(Error::Refused(why)) = refused else {
            panic!("a wrong token was let in");
        };
        assert!(why.contains("token"), "{why}");
        let empty = connect(&server.address, b"", plain()).await;
        assert!(matches!(empty, Err(Error::Refused(_))));
        // The right token on a new connection works.
        connect(&server.address, TOKEN, plain()).await.unwrap();
    })
    .unwrap();
    assert!(server.workspace.peer("anyone").unwrap().is_none());
}

/// The server's gate over `reader` and `writer`, spoken to with capnp-rpc alone (no
/// `connect`: a test says what a client of its own says), its connection run on the
/// current `LocalSet`.
fn raw_gate(
    reader: impl futures::io::AsyncRead + Unpin + 'static,
    writer: impl futures::io::AsyncWrite + Unpin + 'static,
) -> crate::sync_capnp::gate::Client {
    let network = capnp_rpc::twoparty::VatNetwork::new(
        reader,
        writer,
        capnp_rpc::rpc_twoparty_capnp::Side::Client,
        wire::reader_options(),
    );
    let mut rpc = capnp_rpc::RpcSystem::new(Box::new(network), None);
    let gate = rpc.bootstrap(capnp_rpc::rpc_twoparty_capnp::Side::Server);
    tokio::task::spawn_local(rpc);
    gate
}

#[test]
fn another_protocol_version_is_refused_with_a_clear_message() {
    let server = TestServer::start(ServeOptions::default());
    let address = server.address.clone();
    run_local(async move {
        let stream = tokio::net::UnixStream::connect(server.socket_path())
            .await
            .unwrap();
        let (reader, writer) = unix_stream(stream);
        let gate = raw_gate(reader, writer);
        let mut hello = gate.hello_request();
        hello.get().set_version(PROTOCOL_VERSION + 1);
        hello.get().set_token(TOKEN);
        let error = match hello.send().promise.await {
            Ok(_) => panic!("a client of another version was let in"),
            Err(error) => call_error(error, &address.to_string(), &plain()),
        };
        let Error::Refused(why) = error else {
            panic!("not a refusal: {error}");
        };
        assert!(why.contains("version"), "{why}");
        drop(server);
    })
    .unwrap();
}

/// Silent connections holding every slot do not keep a client with the token out: the
/// newest connection takes the slot of the oldest one that has not said hello.
#[test]
fn silent_connections_do_not_lock_clients_out() {
    let server = TestServer::start(ServeOptions {
        connections_max: 4,
        hello_timeout: Duration::from_secs(60),
        ..ServeOptions::default()
    });
    let silent: Vec<_> = (0..4)
        .map(|_| std::os::unix::net::UnixStream::connect(server.socket_path()).unwrap())
        .collect();
    for _ in 0..3 {
        run_local(async {
            connect(&server.address, TOKEN, plain()).await.unwrap();
        })
        .unwrap();
    }
    drop(silent);
}

#[test]
fn garbage_on_a_connection_ends_it_and_nothing_else() {
    let server = TestServer::start(ServeOptions::default());
    // Not Cap'n Proto at all, then a frame claiming a huge segment.
    for garbage in [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        [0u32.to_le_bytes(), u32::MAX.to_le_bytes()].concat(),
    ] {
        let mut stream = std::os::unix::net::UnixStream::connect(server.socket_path()).unwrap();
        stream.write_all(&garbage).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut answer = Vec::new();
        // The server closes the connection (EOF or a reset), it does not hang (the read
        // would time out) or crash (the connection below would fail).
        let read = std::io::Read::read_to_end(&mut stream, &mut answer);
        assert!(
            read.is_ok()
                || matches!(&read, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
            "the server kept the connection open: {read:?}"
        );
    }
    run_local(async {
        connect(&server.address, TOKEN, plain()).await.unwrap();
    })
    .unwrap();
}

#[test]
fn plain_clients_run_workspace_operations_but_cannot_sync() {
    let server = TestServer::start(with_files());
    let workspace = server.workspace.clone();
    run_local(async move {
        let (up, _) = connect(&server.address, TOKEN, plain()).await.unwrap();
        let fs = workspace.fs();
        fs.write_file("/x", vec![7u8; 300 << 10]).unwrap();
        fs.write_file("/y", vec![7u8; 300 << 10]).unwrap();
        let answer = up.stats().await.unwrap();
        assert_eq!(answer.workspace_id, workspace.id());
        assert_eq!(answer.stats, workspace.stats().unwrap());
        assert_eq!(answer.stats.files, 2);

        let report = up.check().await.unwrap();
        assert!(report.is_ok(), "{report:?}");
        assert_eq!(report.nodes, workspace.check().unwrap().nodes);

        fs.rm("/x", computer_vfs::RmOptions::default()).unwrap();
        fs.rm("/y", computer_vfs::RmOptions::default()).unwrap();
        let compacted = up.compact().await.unwrap();
        assert!(
            compacted.bytes_after <= compacted.bytes_before,
            "{compacted:?}"
        );

        let sync = up.changes(&computer_vfs::Cursor::START, 10, 1 << 20).await;
        assert!(matches!(sync, Err(Error::Refused(_))), "{sync:?}");
    })
    .unwrap();
}

#[test]
fn listeners_hear_of_changes_and_connections_end_cleanly() {
    let server = TestServer::start(ServeOptions {
        watch_interval: Duration::from_millis(10),
        ..ServeOptions::default()
    });
    let workspace = server.workspace.clone();
    run_local(async move {
        let (upstream, info) = connect(&server.address, TOKEN, plain()).await.unwrap();
        let mut revisions = upstream.watch().await.unwrap();
        assert_eq!(*revisions.borrow(), info.revision);
        tokio::task::spawn_blocking(move || workspace.fs().write_file("/x", b"x").unwrap())
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(5), revisions.changed())
            .await
            .expect("no change heard within 5 s")
            .unwrap();
        assert!(*revisions.borrow() > info.revision);
        drop(server);
        // The server is gone: calls fail as a lost connection, which a retry loop retries.
        let after = upstream.have_blocks(&[]).await;
        assert!(matches!(&after, Err(e) if e.is_transient()), "{after:?}");
    })
    .unwrap();
}

#[test]
fn a_tcp_server_on_port_zero_reports_its_port() {
    let dir = tempfile::tempdir().unwrap();
    let workspace = Workspace::open(dir.path().join("s.db"), Options::default()).unwrap();
    run_local(async move {
        let socket = ServerSocket::bind(&Address::Tcp("127.0.0.1:0".into()))
            .await
            .unwrap();
        let address = socket.local_address().unwrap();
        let Address::Tcp(host_port) = &address else {
            panic!("not TCP: {address}");
        };
        assert!(!host_port.ends_with(":0"), "{host_port}");
        let authority = Authority::new(workspace, TOKEN.to_vec());
        let (stop, stopped) = oneshot::channel::<()>();
        let server =
            tokio::task::spawn_local(serve(socket, authority, ServeOptions::default(), async {
                let _ = stopped.await;
            }));
        connect(&address, TOKEN, plain()).await.unwrap();
        stop.send(()).unwrap();
        server.await.unwrap();
    })
    .unwrap();
}

#[test]
fn a_block_whose_bytes_do_not_match_its_hash_is_refused() {
    let server = TestServer::start(ServeOptions::default());
    let dir = tempfile::tempdir().unwrap();
    let local = Workspace::open(dir.path().join("replica.db"), Options::default()).unwrap();
    local.fs().write_file("/f", [7u8; 100_000]).unwrap();
    let client = ClientInfo {
        replica_id: local.id().to_owned(),
        peer: "tamper".into(),
    };
    run_local(async {
        let (upstream, _) = connect(&server.address, TOKEN, client).await.unwrap();
        let page = local
            .changes_after(&computer_vfs::Cursor::START, 100, 1 << 30)
            .unwrap();
        let computer_vfs::EntryState::File { blocks, .. } =
            &page.entries.iter().find(|e| e.path == b"/f").unwrap().state
        else {
            panic!("not a file");
        };
        let mut block = local.stored_block(&blocks[0].hash).unwrap().unwrap();
        let last = block.data.len() - 1;
        block.data[last] ^= 1;
        let put = upstream.put_blocks(std::slice::from_ref(&block)).await;
        let Err(Error::Refused(why)) = put else {
            panic!("a tampered block was not refused: {put:?}");
        };
        assert!(why.contains("hash"), "{why}");
        let push = upstream.push(&page.entries, &[block], &page.next).await;
        assert!(matches!(push, Err(Error::Refused(_))), "{push:?}");
        // The connection is still good, and the server stored nothing.
        assert_eq!(
            upstream.have_blocks(&[blocks[0].hash]).await.unwrap(),
            [false]
        );
    })
    .unwrap();
    assert!(server.workspace.fs().stat("/f").is_err());
}

#[test]
fn a_server_of_another_kind_is_named_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("http.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    // An HTTP server: it reads a request, answers it with text, and waits for the
    // client to hang up.
    let http = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut request = [0u8; 64];
        let _ = std::io::Read::read(&mut stream, &mut request);
        let _ = stream.write_all(b"HTTP/1.0 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
        let _ = std::io::Read::read_to_end(&mut stream, &mut Vec::new());
    });
    let error = run_local(async { connect(&Address::Unix(path), TOKEN, plain()).await })
        .unwrap()
        .err()
        .expect("an HTTP server let the client in");
    http.join().unwrap();
    let Error::Refused(why) = &error else {
        panic!("not a refusal: {error}");
    };
    assert!(why.contains("not in the computerd protocol"), "{why}");
    assert!(!error.is_transient());
}

#[test]
fn an_address_nobody_listens_on_cannot_be_connected_to() {
    let dir = tempfile::tempdir().unwrap();
    let address = Address::Unix(dir.path().join("nobody.sock"));
    let error = run_local(async { connect(&address, TOKEN, plain()).await })
        .unwrap()
        .err()
        .expect("connected to nobody");
    assert_eq!(
        error.to_string(),
        format!("{address}: cannot connect: no such file or directory")
    );
    assert!(error.is_transient());
}

fn with_files() -> ServeOptions {
    ServeOptions {
        files: Some(crate::files::FileStreams::default()),
        ..ServeOptions::default()
    }
}

/// Reads the whole file at `path` through a stream.
async fn read_all(upstream: &RemoteUpstream, path: &str) -> crate::Result<Vec<u8>> {
    let mut reader = upstream.open_read(path).await?;
    let mut out = Vec::new();
    while let Some(piece) = reader.next_piece().await? {
        out.extend_from_slice(&piece);
    }
    Ok(out)
}

#[test]
fn files_larger_than_a_message_stream_both_ways() {
    let server = TestServer::start(with_files());
    // Larger than one message may be (64 MiB), in pieces that are not piece-aligned.
    let big: Vec<u8> = (0..(70u64 << 20)).map(|i| (i * 7 % 251) as u8).collect();
    run_local(async {
        let (upstream, _) = connect(&server.address, TOKEN, plain()).await.unwrap();
        let mut writer = upstream.open_write("/big", false).await.unwrap();
        for part in big.chunks(3 << 20 | 12345) {
            writer.write(part).await.unwrap();
        }
        assert_eq!(writer.commit().await.unwrap(), big.len() as u64);
        let back = read_all(&upstream, "/big").await.unwrap();
        assert!(back == big, "the file read back differs");
        // Appending adds past the end, piece by piece.
        let mut writer = upstream.open_write("/big", true).await.unwrap();
        writer.write(b"tail").await.unwrap();
        assert_eq!(writer.commit().await.unwrap(), 4);
        let reader = upstream.open_read("/big").await.unwrap();
        assert_eq!(reader.size(), big.len() as u64 + 4);
    })
    .unwrap();
    let fs = server.workspace.fs();
    assert_eq!(
        fs.read_range("/big", big.len() as u64 - 2, 10).unwrap(),
        [
            big[big.len() - 2],
            big[big.len() - 1],
            b't',
            b'a',
            b'i',
            b'l'
        ]
    );
}

#[test]
fn a_write_stream_dropped_before_commit_leaves_the_file() {
    let server = TestServer::start(with_files());
    server.workspace.fs().write_file("/f", b"old").unwrap();
    run_local(async {
        let (upstream, _) = connect(&server.address, TOKEN, plain()).await.unwrap();
        let mut writer = upstream.open_write("/f", false).await.unwrap();
        writer.write(&[1u8; 3 << 20]).await.unwrap();
        drop(writer);
        // The connection closing drops whatever the server still holds.
        drop(upstream);
    })
    .unwrap();
    let fs = server.workspace.fs();
    // The server drops the stream on its own time: wait for the hidden file to go.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while fs.readdir("/").unwrap().len() > 1 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(fs.read_file("/f").unwrap(), b"old");
    let names: Vec<String> = fs
        .readdir("/")
        .unwrap()
        .iter()
        .map(|e| e.name_lossy())
        .collect();
    assert_eq!(names, ["f"]);
}

#[test]
fn file_stream_errors_carry_the_path_and_errno() {
    let server = TestServer::start(with_files());
    server
        .workspace
        .fs()
        .mkdir("/d", Default::default())
        .unwrap();
    run_local(async {
        let (upstream, _) = connect(&server.address, TOKEN, plain()).await.unwrap();
        let missing = upstream.open_read("/missing").await.err().unwrap();
        assert_eq!(missing.errno(), libc::ENOENT, "{missing}");
        assert_eq!(missing.to_string(), "/missing: no such file or directory");
        let dir = upstream.open_write("/d", false).await.err().unwrap();
        assert_eq!(dir.errno(), libc::EISDIR, "{dir}");
        let relative = upstream.open_read("relative").await.err().unwrap();
        assert!(matches!(relative, Error::Malformed { .. }), "{relative}");
    })
    .unwrap();
}

#[test]
fn file_streams_are_bounded_per_connection_and_off_by_default() {
    let server = TestServer::start(ServeOptions {
        streams_per_connection_max: 2,
        ..with_files()
    });
    server.workspace.fs().write_file("/f", b"x").unwrap();
    run_local(async {
        let (upstream, _) = connect(&server.address, TOKEN, plain()).await.unwrap();
        let first = upstream.open_read("/f").await.unwrap();
        let _second = upstream.open_read("/f").await.unwrap();
        let third = upstream.open_read("/f").await.err().unwrap();
        assert!(matches!(third, Error::Refused(_)), "{third}");
        drop(first);
        // The server hears of the release with the next message; a few tries at most.
        let mut reopened = upstream.open_read("/f").await;
        for _ in 0..50 {
            if reopened.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            reopened = upstream.open_read("/f").await;
        }
        assert!(reopened.is_ok(), "a closed stream's slot is free again");
    })
    .unwrap();
    let plain_server = TestServer::start(ServeOptions::default());
    run_local(async {
        let (upstream, _) = connect(&plain_server.address, TOKEN, plain())
            .await
            .unwrap();
        let refused = upstream.open_read("/f").await.err().unwrap();
        assert!(matches!(refused, Error::Refused(_)), "{refused}");
    })
    .unwrap();
}

#[test]
fn typed_file_operations_do_what_the_path_api_does() {
    let server = TestServer::start(with_files());
    run_local(async {
        let (up, _) = connect(&server.address, TOKEN, plain()).await.unwrap();
        up.mkdir("/a/b", true, 0o750).await.unwrap();
        let mut writer = up.open_write("/a/b/f.txt", false).await.unwrap();
        writer.write(b"one\ntwo needle\nthree\n").await.unwrap();
        writer.commit().await.unwrap();
        up.symlink("b/f.txt", "/a/link").await.unwrap();
        up.link("/a/b/f.txt", "/a/hard").await.unwrap();
        up.copy("/a/b", "/c", true).await.unwrap();
        up.rename("/c/f.txt", "/c/g.txt").await.unwrap();
        up.chmod("/c/g.txt", 0o600).await.unwrap();
        up.truncate("/c/g.txt", 3).await.unwrap();

        let dir = up.stat("/a/b", true).await.unwrap();
        assert!(dir.attr.is_dir());
        assert_eq!(dir.attr.perm, 0o750);
        let link = up.stat("/a/link", false).await.unwrap();
        assert_eq!(link.target.as_deref(), Some(&b"b/f.txt"[..]));
        let followed = up.stat("/a/link", true).await.unwrap();
        assert_eq!((followed.attr.size, followed.target), (21, None));
        assert_eq!(followed.attr.nlink, 2);

        // Pages of one entry each still list everything, once.
        let (mut names, mut after) = (Vec::new(), 0);
        loop {
            let page = up.list("/a", after, 1).await.unwrap();
            names.extend(page.items.iter().map(|i| i.name.clone()));
            if page.complete {
                break;
            }
            after = page.next;
        }
        names.sort();
        assert_eq!(names, [b"b".to_vec(), b"hard".to_vec(), b"link".to_vec()]);

        let g = up.stat("/c/g.txt", true).await.unwrap();
        assert_eq!((g.attr.perm, g.attr.size), (0o600, 3));
        let found = up.glob("/**/*.txt", 10).await.unwrap();
        assert_eq!(found.items, ["/a/b/f.txt", "/c/g.txt"]);
        assert!(found.complete);
        let first = up.glob("/**/*.txt", 1).await.unwrap();
        assert_eq!((first.items.len(), first.complete), (1, false));
        let options = GrepOptions {
            max_matches: Some(5),
            ..GrepOptions::default()
        };
        let matches = up.grep("needle", "/", &options).await.unwrap();
        let mut found: Vec<(&str, u64)> = matches
            .items
            .iter()
            .map(|m| (m.path.as_str(), m.line_number))
            .collect();
        found.sort();
        // The hard link is a file of its own to grep.
        assert_eq!(found, [("/a/b/f.txt", 2), ("/a/hard", 2)]);
        assert!(matches.complete);

        up.remove("/a", true, false).await.unwrap();
        let gone = up.stat("/a", false).await.err().unwrap();
        assert_eq!(gone.errno(), libc::ENOENT, "{gone}");
        up.remove("/a", false, true).await.unwrap();
        let busy = up.remove("/c", false, false).await.err().unwrap();
        assert!(
            [libc::EISDIR, libc::ENOTEMPTY].contains(&busy.errno()),
            "{busy}"
        );
        let exists = up.mkdir("/c", false, 0o755).await.err().unwrap();
        assert_eq!(exists.errno(), libc::EEXIST, "{exists}");
    })
    .unwrap();
}

/// A peer that sends calls and never reads the answers stops being read once the
/// answers stop going out: what it manages to write is bounded by the sockets' buffers
/// and what the server read before, not by what it sends.
#[test]
fn a_peer_that_never_reads_its_answers_stops_being_read() {
    use futures::io::AsyncWrite;
    use std::cell::Cell;
    use std::pin::Pin;
    use std::rc::Rc;
    use std::task::{Context, Poll};

    /// The peer's reading half: never reads.
    struct NeverReads;
    impl futures::io::AsyncRead for NeverReads {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut [u8],
        ) -> Poll<std::io::Result<usize>> {
            Poll::Pending
        }
    }
    /// The peer's writing half, counting the bytes the socket took.
    struct Counted(Writer, Rc<Cell<usize>>);
    impl AsyncWrite for Counted {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            let polled = Pin::new(&mut self.0).poll_write(cx, buf);
            if let Poll::Ready(Ok(n)) = polled {
                self.1.set(self.1.get() + n);
            }
            polled
        }
        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.0).poll_flush(cx)
        }
        fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.0).poll_close(cx)
        }
    }

    /// Calls sent: about 6 MiB of them, far beyond the sockets' buffers.
    const CALLS: usize = 100_000;
    let server = TestServer::start(ServeOptions::default());
    let written = Rc::new(Cell::new(0usize));
    let taken = written.clone();
    run_local(async move {
        let stream = tokio::net::UnixStream::connect(server.socket_path())
            .await
            .unwrap();
        let (_unread, writer) = unix_stream(stream);
        let gate = raw_gate(NeverReads, Counted(writer, taken));
        let mut hello = gate.hello_request();
        hello.get().set_version(PROTOCOL_VERSION);
        hello.get().set_token(TOKEN);
        let hello = hello.send();
        let session = hello.pipeline.get_session();
        let mut answers = Vec::with_capacity(CALLS);
        for sent in 0..CALLS {
            answers.push(session.stats_request().send().promise);
            if sent % 1_000 == 0 {
                tokio::task::yield_now().await;
            }
        }
        // Until the bytes written stop growing: at once if the server reads everything
        // (the whole stream goes out), after a stall if it stopped reading.
        let mut last = usize::MAX;
        while written.get() != last {
            last = written.get();
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let sent_bytes = written.get();
        drop(answers);
        drop(server);
        sent_bytes
    })
    .map(|sent_bytes| {
        assert!(
            sent_bytes < 4 << 20,
            "{sent_bytes} bytes of calls went to a server whose answers were never read"
        )
    })
    .unwrap();
}
