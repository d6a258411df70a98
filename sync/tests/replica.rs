//! A replica syncing with an authoritative workspace in process (the session is the
//! upstream): both directions, large files in bounded calls, conflicts, fencing.

use computer_sync::*;
use computer_vfs::{MkdirOptions, Options, RmOptions, Workspace};
use futures::executor::block_on;

struct Setup {
    _dir: tempfile::TempDir,
    server: Workspace,
    authority: Authority,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let server = Workspace::open(dir.path().join("server.db"), Options::default()).unwrap();
    let authority = Authority::new(server.clone(), b"secret".to_vec());
    Setup {
        _dir: dir,
        server,
        authority,
    }
}

fn client(replica_id: &str) -> ClientInfo {
    ClientInfo {
        replica_id: replica_id.into(),
        peer: "laptop".into(),
    }
}

fn replica(setup: &Setup, name: &str, limits: BatchLimits) -> (Replica, PeerSession) {
    let ws = Workspace::open(setup._dir.path().join(name), Options::default()).unwrap();
    let (session, info) = setup
        .authority
        .hello(PROTOCOL_VERSION, b"secret", &client(ws.id()))
        .unwrap();
    (Replica::attach(ws, &info, limits).unwrap(), session)
}

fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn the_gate_checks_version_and_token_first() {
    let s = setup();
    let wrong_token = s.authority.hello(PROTOCOL_VERSION, b"guess", &client("r"));
    assert!(matches!(wrong_token, Err(Error::Refused(_))));
    let wrong_version = s
        .authority
        .hello(PROTOCOL_VERSION + 1, b"secret", &client("r"));
    let Err(Error::Refused(why)) = wrong_version else {
        panic!("accepted another version")
    };
    assert!(why.contains("version"), "{why}");
    assert!(
        s.server.peer("laptop").unwrap().is_none(),
        "a refused client registered"
    );
}

#[test]
fn changes_flow_both_ways_in_bounded_calls() {
    let s = setup();
    // Small calls, so the big file needs many block batches each way.
    let limits = BatchLimits {
        entries: 3,
        bytes: 1 << 20,
        block_bytes: 256 << 10,
    };
    let (replica, session) = replica(&s, "replica.db", limits);
    s.server
        .fs()
        .mkdir("/src", MkdirOptions::default())
        .unwrap();
    for i in 0..10 {
        s.server
            .fs()
            .write_file(&format!("/src/{i}.txt"), format!("file {i}\n"))
            .unwrap();
    }
    let big = bytes(5 << 20, 3);
    s.server.fs().write_file("/big.bin", &big).unwrap();
    let report = block_on(replica.sync(&session)).unwrap();
    assert_eq!(report.pulled, 13, "{report:?}");
    assert!(report.blocks_in > 10);
    assert_eq!(replica.workspace().fs().read_file("/big.bin").unwrap(), big);

    let edited = bytes(3 << 20, 4);
    replica
        .workspace()
        .fs()
        .write_file("/up.bin", &edited)
        .unwrap();
    replica
        .workspace()
        .fs()
        .rm("/src/3.txt", RmOptions::default())
        .unwrap();
    let report = block_on(replica.sync(&session)).unwrap();
    // The file, the removal, and the times of / and /src.
    assert_eq!(report.pushed, 4, "{report:?}");
    assert!(report.blocks_out > 5, "{report:?}");
    assert_eq!(s.server.fs().read_file("/up.bin").unwrap(), edited);
    assert!(!s.server.fs().exists("/src/3.txt").unwrap());

    // Settled: another sync moves nothing.
    let report = block_on(replica.sync(&session)).unwrap();
    assert!(!report.moved(), "{report:?}");
    assert!(s.server.check().unwrap().is_ok());
    assert!(replica.workspace().check().unwrap().is_ok());
}

#[test]
fn one_byte_changed_in_a_big_file_sends_one_block() {
    let s = setup();
    let (replica, session) = replica(&s, "replica.db", BatchLimits::default());
    let mut data = bytes(16 << 20, 9);
    s.server.fs().write_file("/big", &data).unwrap();
    block_on(replica.sync(&session)).unwrap();
    data[8 << 20] ^= 0xff;
    replica.workspace().fs().write_file("/big", &data).unwrap();
    let report = block_on(replica.sync(&session)).unwrap();
    assert!(report.blocks_out <= 2, "{report:?}");
    assert!(report.bytes_out < 256 << 10, "{report:?}");
    assert_eq!(s.server.fs().read_file("/big").unwrap(), data);
}

#[test]
fn a_replaced_replica_is_told_and_the_old_one_is_fenced() {
    let s = setup();
    let (old, old_session) = replica(&s, "old.db", BatchLimits::default());
    old.workspace().fs().write_file("/a", "a").unwrap();
    block_on(old.sync(&old_session)).unwrap();
    // The replica's disk is lost: a new database, a new replica id, the same peer.
    let fresh = Workspace::open(s._dir.path().join("new.db"), Options::default()).unwrap();
    let (_, info) = s
        .authority
        .hello(PROTOCOL_VERSION, b"secret", &client(fresh.id()))
        .unwrap();
    assert!(info.replaced);
    old.workspace().fs().write_file("/b", "b").unwrap();
    let err = block_on(old.sync(&old_session)).unwrap_err();
    assert!(matches!(err, Error::Replaced { .. }), "{err}");
    assert!(
        !s.server.fs().exists("/b").unwrap(),
        "the old replica's change landed"
    );
}

#[test]
fn a_replica_of_another_workspace_is_refused() {
    let s = setup();
    let (replica, _) = replica(&s, "replica.db", BatchLimits::default());
    let other = setup();
    let (_, info) = other
        .authority
        .hello(PROTOCOL_VERSION, b"secret", &client(replica.replica_id()))
        .unwrap();
    let err = Replica::attach(replica.workspace().clone(), &info, BatchLimits::default());
    assert!(matches!(err, Err(Error::Refused(_))));
}
