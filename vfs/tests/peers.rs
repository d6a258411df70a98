//! Two-way replication through the peer records: cursors per peer, pulls and pushes
//! applied with their cursor in one transaction, conflicts kept, replaced replicas fenced.

mod common;

use common::{missing_blocks, pull};
use computer_vfs::*;

fn workspace(dir: &tempfile::TempDir, name: &str) -> Workspace {
    Workspace::open(dir.path().join(name), Options::default()).unwrap()
}

/// One sync round between an authoritative workspace and a replica: pull, then push.
fn round(server: &Workspace, replica: &Workspace, peer: &str, replica_id: &str) -> Vec<Conflict> {
    let mut conflicts = pull(server, replica, peer, replica_id);
    conflicts.extend(push(server, replica, peer, replica_id));
    conflicts
}

/// The server applies the replica's changes.
fn push(server: &Workspace, replica: &Workspace, peer: &str, replica_id: &str) -> Vec<Conflict> {
    let mut conflicts = Vec::new();
    loop {
        let from = server.peer(peer).unwrap().unwrap().applied;
        let page = replica.changes_for("upstream", &from, 5, 1 << 20).unwrap();
        let blocks = missing_blocks(replica, server, &page.entries);
        let applied = match server.apply_push(peer, replica_id, &page.entries, &blocks, &page.next)
        {
            Ok(applied) => applied,
            // The replica changed under the page (only the racing test writes during a
            // round): read it again.
            Err(Error::Corrupt { .. }) => continue,
            Err(e) => panic!("{e}"),
        };
        conflicts.extend(applied.conflicts);
        replica
            .mark_delivered("upstream", server.id(), &applied.through)
            .unwrap();
        if page.complete {
            break;
        }
    }
    conflicts
}

fn listing(ws: &Workspace) -> Vec<(String, Vec<u8>)> {
    let fs = ws.fs();
    let mut out = Vec::new();
    let mut stack = vec!["/".to_string()];
    while let Some(dir) = stack.pop() {
        for entry in fs.readdir(&dir).unwrap() {
            let path = join(&dir, &entry.name_lossy());
            match entry.kind {
                FileKind::Directory => {
                    stack.push(path.clone());
                    out.push((path, b"<dir>".to_vec()));
                }
                FileKind::File => out.push((path.clone(), fs.read_file(&path).unwrap())),
                _ => out.push((path.clone(), fs.readlink(&path).unwrap().into_bytes())),
            }
        }
    }
    out.sort();
    out
}

fn setup() -> (tempfile::TempDir, Workspace, Workspace) {
    let dir = tempfile::tempdir().unwrap();
    let (server, replica) = (workspace(&dir, "server.db"), workspace(&dir, "replica.db"));
    server.register_peer("r1", "replica-1").unwrap();
    replica.register_peer("upstream", server.id()).unwrap();
    (dir, server, replica)
}

#[test]
fn changes_flow_both_ways_and_settle() {
    let (_dir, server, replica) = setup();
    server
        .fs()
        .mkdir(
            "/proj/src",
            MkdirOptions {
                recursive: true,
                mode: 0o755,
            },
        )
        .unwrap();
    server
        .fs()
        .write_file("/proj/src/main.rs", "fn main() {}\n")
        .unwrap();
    assert!(round(&server, &replica, "r1", "replica-1").is_empty());
    assert_eq!(listing(&server), listing(&replica));

    replica
        .fs()
        .write_file("/proj/src/lib.rs", "pub fn f() {}\n")
        .unwrap();
    replica
        .fs()
        .rename("/proj/src/main.rs", "/proj/main.rs")
        .unwrap();
    server.fs().write_file("/proj/README", "hello\n").unwrap();
    assert!(round(&server, &replica, "r1", "replica-1").is_empty());
    assert_eq!(listing(&server), listing(&replica));

    // A second round moves nothing and changes nothing.
    let before = server.revision().unwrap();
    assert!(round(&server, &replica, "r1", "replica-1").is_empty());
    assert_eq!(
        server.revision().unwrap(),
        before,
        "an idle round changed the server"
    );
    let record = server.peer("r1").unwrap().unwrap();
    assert!(cursor_at_or_after(
        &record.delivered,
        &Cursor {
            revision: Revision(1),
            path: Vec::new()
        }
    ));
    assert!(server.check().unwrap().is_ok() && replica.check().unwrap().is_ok());
}

#[test]
fn a_conflict_keeps_both_versions() {
    let (_dir, server, replica) = setup();
    server.fs().write_file("/notes.txt", "base\n").unwrap();
    round(&server, &replica, "r1", "replica-1");
    server
        .fs()
        .write_file("/notes.txt", "server edit\n")
        .unwrap();
    replica
        .fs()
        .write_file("/notes.txt", "replica edit\n")
        .unwrap();
    let conflicts = round(&server, &replica, "r1", "replica-1");
    assert_eq!(conflicts.len(), 1, "{conflicts:?}");
    round(&server, &replica, "r1", "replica-1");
    assert_eq!(listing(&server), listing(&replica));
    let all = listing(&server);
    let texts: Vec<&[u8]> = all.iter().map(|(_, t)| t.as_slice()).collect();
    assert!(
        texts.contains(&&b"server edit\n"[..]) && texts.contains(&&b"replica edit\n"[..]),
        "{all:?}"
    );
    assert_eq!(
        server.fs().read_file("/notes.txt").unwrap(),
        b"server edit\n"
    );
}

/// A peer's cursor past the largest revision a database stores is refused: stored, it
/// would turn negative, and every later push would count as applied already.
#[test]
fn a_cursor_past_the_largest_revision_is_refused() {
    let (_dir, server, _replica) = setup();
    server.register_peer("r1", "replica-1").unwrap();
    let past = Cursor {
        revision: Revision(1 << 63),
        path: Vec::new(),
    };
    let err = server
        .apply_push("r1", "replica-1", &[], &[], &past)
        .unwrap_err();
    assert_eq!(err.errno(), libc::EINVAL);
    assert!(server.check().unwrap().is_ok());
}

#[test]
fn a_replaced_replica_is_fenced_and_starts_over() {
    let (_dir, server, replica) = setup();
    server.fs().write_file("/a", "a").unwrap();
    round(&server, &replica, "r1", "replica-1");
    // The replica's disk is lost; a fresh one registers under the same peer name.
    let (record, reset) = server.register_peer("r1", "replica-2").unwrap();
    assert!(reset);
    assert_eq!(record.delivered, Cursor::START);
    // The old replica's pushes are refused, never applied.
    let err = server.apply_push(
        "r1",
        "replica-1",
        &[],
        &[],
        &Cursor {
            revision: Revision(9),
            path: Vec::new(),
        },
    );
    assert!(err.is_err());
    let err = server.mark_delivered(
        "r1",
        "replica-1",
        &Cursor {
            revision: Revision(9),
            path: Vec::new(),
        },
    );
    assert!(err.is_err());
}

#[test]
fn a_peer_cannot_acknowledge_changes_that_do_not_exist() {
    let (_dir, server, replica) = setup();
    server.fs().write_file("/a", "a").unwrap();
    round(&server, &replica, "r1", "replica-1");
    let before = server.peer("r1").unwrap().unwrap().delivered;
    let past = Cursor {
        revision: Revision(server.revision().unwrap().0 + 1),
        path: Vec::new(),
    };
    let err = server.mark_delivered("r1", "replica-1", &past).unwrap_err();
    assert_eq!(err.errno(), libc::EINVAL, "{err}");
    assert_eq!(server.peer("r1").unwrap().unwrap().delivered, before);
    // What exists may still be acknowledged.
    let now = Cursor {
        revision: server.revision().unwrap(),
        path: Vec::new(),
    };
    server.mark_delivered("r1", "replica-1", &now).unwrap();
}

#[test]
fn cursors_never_move_backwards() {
    let (_dir, server, replica) = setup();
    server.fs().write_file("/a", "a").unwrap();
    round(&server, &replica, "r1", "replica-1");
    let ahead = server.peer("r1").unwrap().unwrap().delivered;
    let back = server
        .mark_delivered("r1", "replica-1", &Cursor::START)
        .unwrap();
    assert_eq!(back, ahead);
}

#[test]
fn a_moved_directory_takes_its_conflict_copies_along() {
    let (_dir, server, replica) = setup();
    replica.fs().mkdir("/d", MkdirOptions::default()).unwrap();
    round(&server, &replica, "r1", "replica-1");
    server.fs().write_file("/d/a", "server\n").unwrap();
    replica.fs().write_file("/d/a", "replica\n").unwrap();
    assert_eq!(round(&server, &replica, "r1", "replica-1").len(), 1);
    replica.fs().rename("/d", "/e").unwrap();
    round(&server, &replica, "r1", "replica-1");
    round(&server, &replica, "r1", "replica-1");
    assert_eq!(listing(&server), listing(&replica));
    assert!(server.fs().stat("/d").is_err(), "{:?}", listing(&server));
}

#[test]
fn removing_a_directory_takes_only_what_the_remover_saw() {
    let (_dir, server, replica) = setup();
    server
        .fs()
        .mkdir(
            "/d/sub",
            MkdirOptions {
                recursive: true,
                mode: 0o755,
            },
        )
        .unwrap();
    server.fs().write_file("/d/sub/old", "old\n").unwrap();
    server.fs().write_file("/d/keep", "v1\n").unwrap();
    round(&server, &replica, "r1", "replica-1");
    // The replica removes the tree while the server writes inside it.
    replica
        .fs()
        .rm(
            "/d",
            RmOptions {
                recursive: true,
                force: false,
            },
        )
        .unwrap();
    server.fs().write_file("/d/sub/new", "new\n").unwrap();
    server.fs().write_file("/d/keep", "v2\n").unwrap();
    let conflicts = round(&server, &replica, "r1", "replica-1");
    assert_eq!(conflicts.len(), 1, "{conflicts:?}");
    round(&server, &replica, "r1", "replica-1");
    assert_eq!(listing(&server), listing(&replica));
    assert_eq!(server.fs().read_file("/d/sub/new").unwrap(), b"new\n");
    assert_eq!(server.fs().read_file("/d/keep").unwrap(), b"v2\n");
    assert!(server.fs().stat("/d/sub/old").is_err());

    // And the other way: upstream removes a tree the replica wrote into, unpushed.
    replica.fs().write_file("/d/sub/mine", "mine\n").unwrap();
    server
        .fs()
        .rm(
            "/d",
            RmOptions {
                recursive: true,
                force: false,
            },
        )
        .unwrap();
    round(&server, &replica, "r1", "replica-1");
    round(&server, &replica, "r1", "replica-1");
    assert_eq!(listing(&server), listing(&replica));
    assert_eq!(server.fs().read_file("/d/sub/mine").unwrap(), b"mine\n");
    assert!(server.fs().stat("/d/keep").is_err());
}

#[test]
fn a_removal_keeps_a_directory_the_remover_got_only_after_it() {
    // Sync simulation seed 1: a directory whose entry moved to a later revision (a child
    // removed in it) was taken as seen by a removal made before the remover pulled it.
    let (_dir, server, replica) = setup();
    server
        .fs()
        .mkdir(
            "/d/sub",
            MkdirOptions {
                recursive: true,
                mode: 0o755,
            },
        )
        .unwrap();
    server.fs().write_file("/d/sub/x", "x\n").unwrap();
    round(&server, &replica, "r1", "replica-1");
    // The replica removes the tree; before it pushes that, the server removes a file in
    // it, which moves /d/sub's entry past the removal's base, and the replica pulls:
    // /d/sub comes back to it (the server changed it after the replica's base).
    let rm_rf = RmOptions {
        recursive: true,
        force: false,
    };
    replica.fs().rm("/d", rm_rf).unwrap();
    server.fs().unlink("/d/sub/x").unwrap();
    pull(&server, &replica, "r1", "replica-1");
    assert!(replica.fs().stat("/d/sub").unwrap().is_dir());
    // The removal, applied upstream, must not take /d/sub: the replica has it.
    push(&server, &replica, "r1", "replica-1");
    round(&server, &replica, "r1", "replica-1");
    assert_eq!(listing(&server), listing(&replica));
    assert!(server.fs().stat("/d/sub").unwrap().is_dir());
}

/// Every live path and its replicated state (times and modes included, unlike
/// [`listing`]).
fn states(ws: &Workspace) -> Vec<(Vec<u8>, EntryState)> {
    let page = ws
        .changes_after(&Cursor::START, usize::MAX, u64::MAX)
        .unwrap();
    let mut out: Vec<_> = page
        .entries
        .into_iter()
        .filter(|e| e.state != EntryState::Removed)
        .map(|e| (e.path, e.state))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn a_pulled_entry_does_not_hide_an_unpushed_change_of_its_directory() {
    // Sync simulation seed 2: a pull that added a file to a directory stamped the
    // directory as received, so the replica's own change of it (its mtime, moved by
    // putting its version of the file aside) was never pushed.
    let (_dir, server, replica) = setup();
    server.fs().mkdir("/d", MkdirOptions::default()).unwrap();
    server.fs().write_file("/d/f", "v1\n").unwrap();
    round(&server, &replica, "r1", "replica-1");
    server.fs().write_file("/d/f", "server\n").unwrap();
    replica.fs().write_file("/d/f", "replica\n").unwrap();
    // The pull moves the replica's /d/f aside (a local rename in /d), then adds the
    // server's /d/f to /d.
    assert_eq!(round(&server, &replica, "r1", "replica-1").len(), 1);
    round(&server, &replica, "r1", "replica-1");
    assert_eq!(listing(&server), listing(&replica));
    assert_eq!(states(&server), states(&replica));
}

#[test]
fn a_directory_kept_against_a_removal_goes_back_to_the_remover() {
    // Sync simulation seed 23: the replica kept a directory the server removed (the
    // replica made it, and wrote in it), but its state had been merged from the
    // server's, so it counted as received and never went back; the server re-made it
    // with other times for the file pushed into it.
    let (_dir, server, replica) = setup();
    replica.fs().mkdir("/d", MkdirOptions::default()).unwrap();
    replica.fs().write_file("/d/f", "mine\n").unwrap();
    server.fs().mkdir("/d", MkdirOptions::default()).unwrap();
    // The replica takes the server's /d (directories merge), its own /d/f unpushed...
    pull(&server, &replica, "r1", "replica-1");
    // ...when the server removes its /d.
    let rm_rf = RmOptions {
        recursive: true,
        force: false,
    };
    server.fs().rm("/d", rm_rf).unwrap();
    round(&server, &replica, "r1", "replica-1");
    round(&server, &replica, "r1", "replica-1");
    assert_eq!(server.fs().read_file("/d/f").unwrap(), b"mine\n");
    assert_eq!(states(&server), states(&replica));
}

#[test]
fn a_removal_takes_a_merged_directory_and_what_came_into_it() {
    // Sync simulation seed 11: the replica made /d, then took the server's /d
    // (directories merge) and a file in it. The server's removal of /d was refused as
    // if /d were another directory than the one it removed, and the file it removed
    // stayed on the replica for good.
    let (_dir, server, replica) = setup();
    replica.fs().mkdir("/d", MkdirOptions::default()).unwrap();
    server.fs().mkdir("/d", MkdirOptions::default()).unwrap();
    server.fs().write_file("/d/f", "theirs\n").unwrap();
    pull(&server, &replica, "r1", "replica-1");
    assert_eq!(replica.fs().read_file("/d/f").unwrap(), b"theirs\n");
    let rm_rf = RmOptions {
        recursive: true,
        force: false,
    };
    server.fs().rm("/d", rm_rf).unwrap();
    round(&server, &replica, "r1", "replica-1");
    round(&server, &replica, "r1", "replica-1");
    assert_eq!(states(&server), states(&replica));
    assert!(
        !replica.fs().exists("/d/f").unwrap(),
        "{:?}",
        listing(&replica)
    );
}

#[test]
fn a_removal_keeps_what_was_moved_into_a_directory_unseen() {
    // What came into a removed tree with an unseen move of its directory is unseen too,
    // however old its own entries: the remover never had it at that path.
    let (_dir, server, replica) = setup();
    server.fs().mkdir("/a", MkdirOptions::default()).unwrap();
    server.fs().mkdir("/x", MkdirOptions::default()).unwrap();
    server.fs().write_file("/x/c", "precious\n").unwrap();
    round(&server, &replica, "r1", "replica-1");
    replica.fs().rename("/x", "/a/y").unwrap();
    let rm_rf = RmOptions {
        recursive: true,
        force: false,
    };
    server.fs().rm("/a", rm_rf).unwrap();
    round(&server, &replica, "r1", "replica-1");
    round(&server, &replica, "r1", "replica-1");
    assert_eq!(listing(&server), listing(&replica));
    let found = listing(&server);
    assert!(
        found.iter().any(|(_, content)| content == b"precious\n"),
        "the moved file was lost: {found:?}"
    );
    assert_eq!(server.fs().read_file("/a/y/c").unwrap(), b"precious\n");
}

#[test]
fn a_removal_takes_what_came_into_an_unseen_directory_from_the_remover() {
    // Sync simulation seed 33: the replica made /a/b anew (unpushed), then pulled the
    // server's /a/b/f into it. The server's removal of /a was refused whole, as if all
    // of /a were the replica's; the file the server removed stayed on the replica.
    let (_dir, server, replica) = setup();
    let mkdir_p = MkdirOptions {
        recursive: true,
        mode: 0o755,
    };
    let rm_rf = RmOptions {
        recursive: true,
        force: false,
    };
    server.fs().mkdir("/a/b", mkdir_p).unwrap();
    server.fs().write_file("/a/b/f", "v1\n").unwrap();
    round(&server, &replica, "r1", "replica-1");
    replica.fs().rm("/a", rm_rf).unwrap();
    replica.fs().mkdir("/a/b", mkdir_p).unwrap();
    server.fs().write_file("/a/b/f", "v2\n").unwrap();
    pull(&server, &replica, "r1", "replica-1");
    assert_eq!(replica.fs().read_file("/a/b/f").unwrap(), b"v2\n");
    server.fs().rm("/a", rm_rf).unwrap();
    round(&server, &replica, "r1", "replica-1");
    round(&server, &replica, "r1", "replica-1");
    assert_eq!(states(&server), states(&replica));
    // The replica's own directories stay; the file the server removed goes.
    assert!(replica.fs().stat("/a/b").unwrap().is_dir());
    assert!(!replica.fs().exists("/a/b/f").unwrap());
}

#[test]
fn a_tree_removed_and_made_again_in_one_push_is_removed_on_other_replicas() {
    // Sync simulation seed 39: one replica removed /a and made it again (empty), and
    // pushed both in one batch. Applied in one revision, the server's log had the
    // removal and the new /a at once, and sent the other replica only the new /a,
    // which merged into its old one: the removed files stayed there for good.
    let (dir, server, one) = setup();
    let two = workspace(&dir, "two.db");
    server.register_peer("r2", "replica-2").unwrap();
    two.register_peer("upstream", server.id()).unwrap();
    server.fs().mkdir("/a", MkdirOptions::default()).unwrap();
    server.fs().write_file("/a/f", "old\n").unwrap();
    round(&server, &one, "r1", "replica-1");
    round(&server, &two, "r2", "replica-2");
    one.fs()
        .rm(
            "/a",
            RmOptions {
                recursive: true,
                force: false,
            },
        )
        .unwrap();
    one.fs().mkdir("/a", MkdirOptions::default()).unwrap();
    round(&server, &one, "r1", "replica-1");
    round(&server, &two, "r2", "replica-2");
    assert!(!server.fs().exists("/a/f").unwrap());
    assert!(!two.fs().exists("/a/f").unwrap(), "{:?}", listing(&two));
    assert_eq!(states(&server), states(&two));
    assert_eq!(states(&server), states(&one));
}

#[test]
fn a_file_moved_out_of_a_tree_remade_and_back_keeps_its_blocks() {
    // The batch is applied in parts (the removal of /a, then what fills it again): the
    // file's blocks, freed by the first part here, must last until the second uses them,
    // for the replica sends none of them (the server has them all).
    let (_dir, server, replica) = setup();
    let content: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    replica.fs().mkdir("/a", MkdirOptions::default()).unwrap();
    replica.fs().write_file("/a/f", &content).unwrap();
    round(&server, &replica, "r1", "replica-1");
    replica.fs().rename("/a/f", "/x").unwrap();
    replica
        .fs()
        .rm(
            "/a",
            RmOptions {
                recursive: true,
                force: false,
            },
        )
        .unwrap();
    replica.fs().mkdir("/a", MkdirOptions::default()).unwrap();
    replica.fs().rename("/x", "/a/f").unwrap();
    // One push of everything, applied once (the helper would retry a failed one).
    let from = server.peer("r1").unwrap().unwrap().applied;
    let page = replica
        .changes_for("upstream", &from, 100, u64::MAX)
        .unwrap();
    assert!(page.complete);
    let blocks = missing_blocks(&replica, &server, &page.entries);
    assert!(blocks.is_empty(), "the server has every block");
    server
        .apply_push("r1", "replica-1", &page.entries, &blocks, &page.next)
        .unwrap();
    round(&server, &replica, "r1", "replica-1");
    assert_eq!(server.fs().read_file("/a/f").unwrap(), content);
    assert!(server.check().unwrap().is_ok());
    assert_eq!(states(&server), states(&replica));
}

#[test]
fn a_late_push_of_a_directory_does_not_swap_its_state_between_the_sides() {
    // Sync simulation seed 386: a push carrying the replica's /d was held up in the
    // network; the replica pulled the server's own /d meanwhile (and took its state, as
    // directories merge); then the old push landed and the server took the replica's
    // old state. Each side had the other's, for good.
    let (_dir, server, replica) = setup();
    replica.fs().mkdir("/d", MkdirOptions::default()).unwrap();
    server.fs().mkdir("/d", MkdirOptions::default()).unwrap();
    server.fs().chmod("/d", 0o700).unwrap();
    let from = server.peer("r1").unwrap().unwrap().applied;
    let late = replica
        .changes_for("upstream", &from, 100, u64::MAX)
        .unwrap();
    pull(&server, &replica, "r1", "replica-1");
    server
        .apply_push("r1", "replica-1", &late.entries, &[], &late.next)
        .unwrap();
    round(&server, &replica, "r1", "replica-1");
    round(&server, &replica, "r1", "replica-1");
    assert_eq!(states(&server), states(&replica));
    assert_eq!(server.fs().stat("/d").unwrap().perm, 0o700);
}

#[test]
fn a_push_sent_again_does_not_bring_back_what_the_server_changed_since() {
    // Sync simulation seed 904724: the server applied a push whose answer was lost,
    // then moved the pushed file's directory. The replica, which never learned its push
    // landed, sent it again with a newer change after it; the server applied the old
    // entries a second time and the file came back at its old path on the server only.
    let (_dir, server, replica) = setup();
    replica.fs().mkdir("/a", MkdirOptions::default()).unwrap();
    replica.fs().mkdir("/a/b", MkdirOptions::default()).unwrap();
    replica.fs().write_file("/a/b/f", "pushed once\n").unwrap();
    let first = replica
        .changes_for("upstream", &Cursor::START, 100, u64::MAX)
        .unwrap();
    let blocks = missing_blocks(&replica, &server, &first.entries);
    server
        .apply_push("r1", "replica-1", &first.entries, &blocks, &first.next)
        .unwrap();
    // (The answer is lost: the replica's record of what it delivered stays behind.)
    server.fs().rename("/a/b", "/a/c").unwrap();
    replica.fs().write_file("/g", "later\n").unwrap();
    let again = replica
        .changes_for("upstream", &Cursor::START, 100, u64::MAX)
        .unwrap();
    assert!(again.entries.iter().any(|e| e.path == b"/a/b/f"));
    let blocks = missing_blocks(&replica, &server, &again.entries);
    server
        .apply_push("r1", "replica-1", &again.entries, &blocks, &again.next)
        .unwrap();
    assert!(
        server.fs().stat("/a/b/f").is_err(),
        "{:?}",
        listing(&server)
    );
    round(&server, &replica, "r1", "replica-1");
    round(&server, &replica, "r1", "replica-1");
    assert_eq!(replica.fs().read_file("/a/c/f").unwrap(), b"pushed once\n");
    assert_eq!(replica.fs().read_file("/g").unwrap(), b"later\n");
    assert_eq!(states(&server), states(&replica));
}

#[test]
fn a_tree_removed_then_replaced_by_a_rename_is_removed_everywhere() {
    // Sync simulation seed 2022778: the replica removed /a; a pull made /a again (the
    // server had changed it, and directories come with their state); then the replica
    // renamed /b over the empty /a. The log listed neither removal (the first was
    // "removed again later", the second "filled again in the same mutation"), so the
    // server merged the new /a into its old one and kept what the replica had removed.
    let (_dir, server, replica) = setup();
    server.fs().mkdir("/a", MkdirOptions::default()).unwrap();
    server
        .fs()
        .write_file("/a/f", "seen, then removed\n")
        .unwrap();
    server
        .fs()
        .write_file("/a/g", "removed by the server\n")
        .unwrap();
    round(&server, &replica, "r1", "replica-1");
    replica
        .fs()
        .rm(
            "/a",
            RmOptions {
                recursive: true,
                force: false,
            },
        )
        .unwrap();
    server.fs().rm("/a/g", RmOptions::default()).unwrap();
    pull(&server, &replica, "r1", "replica-1");
    assert!(replica.fs().stat("/a").unwrap().is_dir());
    replica.fs().mkdir("/b", MkdirOptions::default()).unwrap();
    replica.fs().write_file("/b/x", "moved in\n").unwrap();
    replica.fs().rename("/b", "/a").unwrap();
    round(&server, &replica, "r1", "replica-1");
    round(&server, &replica, "r1", "replica-1");
    assert!(server.fs().stat("/a/f").is_err(), "{:?}", listing(&server));
    assert_eq!(server.fs().read_file("/a/x").unwrap(), b"moved in\n");
    assert_eq!(states(&server), states(&replica));
}

/// Pushes the replica's changes one entry a batch, as a replica with the smallest batch
/// limit does, until they are all applied; returns the first page `hold` holds back (a
/// batch held up in the network), unapplied, and stops there.
fn push_one_entry_a_batch(
    server: &Workspace,
    replica: &Workspace,
    mut hold: impl FnMut(&ChangePage) -> bool,
) -> Option<ChangePage> {
    loop {
        let from = server.peer("r1").unwrap().unwrap().applied;
        let page = replica.changes_for("upstream", &from, 1, u64::MAX).unwrap();
        if hold(&page) {
            return Some(page);
        }
        let blocks = missing_blocks(replica, server, &page.entries);
        server
            .apply_push("r1", "replica-1", &page.entries, &blocks, &page.next)
            .unwrap();
        if page.complete {
            return None;
        }
    }
}

#[test]
fn a_late_push_of_a_directory_the_server_removed_does_not_bring_it_back() {
    // Sync simulation seed 2018714: the replica pushed /d/f and /d in two batches, the
    // second held up in the network; the replica took the server's state of /d, the
    // server removed /d, and the replica took the removal; then the late batch landed
    // and the server made /d again from it, as received from the replica, so never sent
    // back to it.
    let (_dir, server, replica) = setup();
    replica.fs().mkdir("/d", MkdirOptions::default()).unwrap();
    replica.fs().write_file("/d/f", "pushed\n").unwrap();
    let late = push_one_entry_a_batch(&server, &replica, |page| {
        page.entries.iter().any(|e| e.path == b"/d")
    })
    .expect("a page holding /d alone");
    assert_eq!(server.fs().read_file("/d/f").unwrap(), b"pushed\n");
    // The replica takes the server's newer state of /d (directories merge), so it has
    // nothing of /d left to push.
    server.fs().chmod("/d", 0o700).unwrap();
    pull(&server, &replica, "r1", "replica-1");
    assert_eq!(replica.fs().stat("/d").unwrap().perm, 0o700);
    server
        .fs()
        .rm(
            "/d",
            RmOptions {
                recursive: true,
                force: false,
            },
        )
        .unwrap();
    pull(&server, &replica, "r1", "replica-1");
    server
        .apply_push("r1", "replica-1", &late.entries, &[], &late.next)
        .unwrap();
    round(&server, &replica, "r1", "replica-1");
    round(&server, &replica, "r1", "replica-1");
    assert_eq!(states(&server), states(&replica));
}

#[test]
fn a_pushed_directory_below_a_path_the_server_filled_again_lands() {
    // Sync simulation seed 3006126: both sides renamed /b over the empty directory /f.
    // The replica's new directory below its /f reached the server alone in a batch; the
    // server, seeing its own removal of the old /f unseen by the replica, held the
    // directory back as one it had removed, though /f stood there again (filled by the
    // same rename). The replica, which merges the server's /f into its own, kept it.
    let (_dir, server, replica) = setup();
    server.fs().mkdir("/b", MkdirOptions::default()).unwrap();
    server.fs().write_file("/b/x", "x\n").unwrap();
    server.fs().mkdir("/f", MkdirOptions::default()).unwrap();
    round(&server, &replica, "r1", "replica-1");
    server.fs().rename("/b", "/f").unwrap();
    replica.fs().rename("/b", "/f").unwrap();
    replica
        .fs()
        .mkdir("/f/new", MkdirOptions::default())
        .unwrap();
    assert!(push_one_entry_a_batch(&server, &replica, |_| false).is_none());
    assert!(
        server.fs().stat("/f/new").is_ok(),
        "the server held /f/new back"
    );
    round(&server, &replica, "r1", "replica-1");
    round(&server, &replica, "r1", "replica-1");
    assert_eq!(states(&server), states(&replica));
}

/// Whether some file of `ws` holds `content`.
fn holds_somewhere(ws: &Workspace, content: &[u8]) -> bool {
    listing(ws).iter().any(|(_, c)| c == content)
}

#[test]
fn a_pushed_file_under_an_unseen_file_of_the_server_loses_neither() {
    // Sync simulation seed 17: the replica's /a/f reached the server after the server
    // wrote a file /a; applying it replaced the server's file with a directory.
    let (_dir, server, replica) = setup();
    replica.fs().mkdir("/a", MkdirOptions::default()).unwrap();
    replica.fs().write_file("/a/f", "theirs\n").unwrap();
    pull(&server, &replica, "r1", "replica-1");
    server.fs().write_file("/a", "ours\n").unwrap();
    push(&server, &replica, "r1", "replica-1");
    round(&server, &replica, "r1", "replica-1");
    round(&server, &replica, "r1", "replica-1");
    assert_eq!(server.fs().read_file("/a").unwrap(), b"ours\n");
    for ws in [&server, &replica] {
        assert!(holds_somewhere(ws, b"theirs\n"), "{:?}", listing(ws));
        assert!(holds_somewhere(ws, b"ours\n"), "{:?}", listing(ws));
    }
    assert_eq!(states(&server), states(&replica));
}

#[test]
fn a_pulled_file_under_an_unpushed_file_of_the_replica_loses_neither() {
    let (_dir, server, replica) = setup();
    replica.fs().write_file("/a", "mine\n").unwrap();
    server.fs().mkdir("/a", MkdirOptions::default()).unwrap();
    server.fs().write_file("/a/f", "server\n").unwrap();
    round(&server, &replica, "r1", "replica-1");
    round(&server, &replica, "r1", "replica-1");
    assert_eq!(server.fs().read_file("/a/f").unwrap(), b"server\n");
    for ws in [&server, &replica] {
        assert!(holds_somewhere(ws, b"mine\n"), "{:?}", listing(ws));
        assert!(holds_somewhere(ws, b"server\n"), "{:?}", listing(ws));
    }
    assert_eq!(states(&server), states(&replica));
}

#[test]
fn a_directory_renamed_over_an_empty_one_arrives_whole() {
    // The rename removes /p and fills it in one revision; once /p changes again, the
    // removal must not come after what the rename brought.
    let (_dir, server, replica) = setup();
    server.fs().mkdir("/x", MkdirOptions::default()).unwrap();
    server.fs().write_file("/x/c", "c\n").unwrap();
    server.fs().mkdir("/p", MkdirOptions::default()).unwrap();
    round(&server, &replica, "r1", "replica-1");
    server.fs().rename("/x", "/p").unwrap();
    server.fs().write_file("/p/new", "new\n").unwrap();
    round(&server, &replica, "r1", "replica-1");
    assert_eq!(listing(&server), listing(&replica));
    assert_eq!(replica.fs().read_file("/p/c").unwrap(), b"c\n");
}

#[test]
fn an_edit_after_a_push_is_not_a_conflict_with_its_echo() {
    let (_dir, server, replica) = setup();
    replica.fs().write_file("/f", "one\n").unwrap();
    round(&server, &replica, "r1", "replica-1");
    replica.fs().write_file("/f", "two\n").unwrap();
    assert!(round(&server, &replica, "r1", "replica-1").is_empty());
    assert_eq!(server.fs().read_file("/f").unwrap(), b"two\n");
    assert_eq!(listing(&server), listing(&replica));
}

/// A writer thread replaces a file while pulls of the same path land; its write made
/// after the server's last one must survive, at the path or as a conflict copy. (Only
/// that one: an earlier local write the server had seen before writing over it is
/// rightly gone, the server's write being the later change.)
#[test]
fn a_local_write_racing_a_pull_is_never_overwritten() {
    let (_dir, server, replica) = setup();
    server.fs().write_file("/hot", "v0").unwrap();
    round(&server, &replica, "r1", "replica-1");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (fs, stop) = (replica.fs(), stop.clone());
        std::thread::spawn(move || {
            for n in 0.. {
                if stop.load(std::sync::atomic::Ordering::Relaxed) && n > 50 {
                    break;
                }
                fs.write_file("/hot", format!("local {n}")).unwrap();
            }
            // After the server's last write: nothing may overwrite this one unseen.
            let last = "the last local write".to_string();
            fs.write_file("/hot", &last).unwrap();
            last
        })
    };
    for n in 0..40 {
        server
            .fs()
            .write_file("/hot", format!("server {n}"))
            .unwrap();
        round(&server, &replica, "r1", "replica-1");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let last = writer.join().unwrap();
    round(&server, &replica, "r1", "replica-1");
    round(&server, &replica, "r1", "replica-1");
    assert_eq!(listing(&server), listing(&replica));
    let all = listing(&replica);
    assert!(
        all.iter().any(|(_, content)| content == last.as_bytes()),
        "the last local write {last:?} was lost: {all:?}"
    );
}

/// Random changes on both sides between rounds: after two quiet rounds both hold the
/// same tree, and every file content last written on either side still exists
/// somewhere (conflicts keep both).
mod random {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        Write { server: bool, path: u8, content: u8 },
        Remove { server: bool, path: u8 },
        Rename { server: bool, from: u8, to: u8 },
        Mkdir { server: bool, path: u8 },
        Round,
    }

    const PATHS: [&str; 6] = ["/a", "/b", "/d/a", "/d/b", "/d", "/e"];

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (any::<bool>(), any::<u8>(), any::<u8>()).prop_map(|(server, path, content)| Op::Write { server, path, content }),
            1 => (any::<bool>(), any::<u8>()).prop_map(|(server, path)| Op::Remove { server, path }),
            1 => (any::<bool>(), any::<u8>(), any::<u8>()).prop_map(|(server, from, to)| Op::Rename { server, from, to }),
            1 => (any::<bool>(), any::<u8>()).prop_map(|(server, path)| Op::Mkdir { server, path }),
            2 => Just(Op::Round),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: std::env::var("PEERS_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(48),
            failure_persistence: None,
            ..ProptestConfig::default()
        })]
        #[test]
        fn both_sides_converge(ops in proptest::collection::vec(op(), 1..30)) {
            let (_dir, server, replica) = setup();
            for op in ops {
                let side = |s: bool| if s { server.fs() } else { replica.fs() };
                let _ = match op {
                    Op::Write { server: s, path, content } => {
                        side(s).write_file(PATHS[path as usize % 6], format!("content {content}\n"))
                    }
                    Op::Remove { server: s, path } => side(s).rm(PATHS[path as usize % 6], RmOptions { recursive: true, force: true }),
                    Op::Rename { server: s, from, to } => side(s).rename(PATHS[from as usize % 6], PATHS[to as usize % 6]),
                    Op::Mkdir { server: s, path } => side(s).mkdir(PATHS[path as usize % 6], MkdirOptions::default()),
                    Op::Round => {
                        round(&server, &replica, "r1", "replica-1");
                        Ok(())
                    }
                };
            }
            round(&server, &replica, "r1", "replica-1");
            round(&server, &replica, "r1", "replica-1");
            prop_assert_eq!(listing(&server), listing(&replica));
            prop_assert!(server.check().unwrap().is_ok());
            prop_assert!(replica.check().unwrap().is_ok());
        }
    }
}

#[test]
fn a_file_moved_away_and_back_arrives() {
    let (_dir, server, replica) = setup();
    replica.fs().write_file("/a", "content 0\n").unwrap();
    round(&server, &replica, "r1", "replica-1");
    // Removed and filled again with an equal state: the removal must not win.
    server.fs().rename("/a", "/e").unwrap();
    server.fs().rename("/e", "/a").unwrap();
    assert!(round(&server, &replica, "r1", "replica-1").is_empty());
    assert_eq!(replica.fs().read_file("/a").unwrap(), b"content 0\n");
    assert_eq!(listing(&server), listing(&replica));
}

/// Found by `random::both_sides_converge`: both sides create the same directory, a round
/// finds them equal (a batch that changes nothing), then one side removes it. The
/// removal's base must count that round, or the other side's own directory looks unseen
/// and stays there forever.
#[test]
fn a_path_both_sides_filled_alike_can_be_removed() {
    let (_dir, server, replica) = setup();
    server.fs().mkdir("/b", MkdirOptions::default()).unwrap();
    replica.fs().mkdir("/b", MkdirOptions::default()).unwrap();
    round(&server, &replica, "r1", "replica-1");
    server
        .fs()
        .rm(
            "/b",
            RmOptions {
                recursive: true,
                force: true,
            },
        )
        .unwrap();
    round(&server, &replica, "r1", "replica-1");
    round(&server, &replica, "r1", "replica-1");
    assert_eq!(listing(&server), listing(&replica));
    assert!(replica.fs().stat("/b").is_err());
}

#[test]
fn a_late_push_over_a_file_the_server_changed_and_moved_goes_back_to_the_replica() {
    // Sync simulation seed 4072027: the replica wrote /g and pushed it; the push was held
    // up in the network. Meanwhile the server changed /g, the replica pulled that (its
    // own version moved aside as a conflict copy), and the server renamed /g away. Then
    // the old push landed: /g came back on the server with the replica's old content,
    // as received from the replica and so never sent back to it, while the replica
    // kept the server's old version at /g.
    let (_dir, server, replica) = setup();
    server.fs().write_file("/g", "base\n").unwrap();
    round(&server, &replica, "r1", "replica-1");
    replica.fs().write_file("/g", "replica's\n").unwrap();
    let from = server.peer("r1").unwrap().unwrap().applied;
    let late = replica
        .changes_for("upstream", &from, 100, u64::MAX)
        .unwrap();
    let late_blocks = missing_blocks(&replica, &server, &late.entries);
    server.fs().write_file("/g", "server's\n").unwrap();
    pull(&server, &replica, "r1", "replica-1");
    assert_eq!(replica.fs().read_file("/g").unwrap(), b"server's\n");
    server.fs().rename("/g", "/moved").unwrap();
    server
        .apply_push("r1", "replica-1", &late.entries, &late_blocks, &late.next)
        .unwrap();
    // The replica's change beats the server's unseen removal: it stands at /g again.
    assert_eq!(server.fs().read_file("/g").unwrap(), b"replica's\n");
    round(&server, &replica, "r1", "replica-1");
    round(&server, &replica, "r1", "replica-1");
    assert_eq!(listing(&server), listing(&replica));
    assert_eq!(states(&server), states(&replica));
}

#[test]
fn a_late_push_below_a_directory_the_server_made_again_goes_back_to_the_replica() {
    // Sync simulation seed 231197931995424: the replica made /a/b and pushed it; the push
    // was held up in the network. Meanwhile the server wrote a file at /a, the replica
    // pulled it (its own /a moved aside as a conflict copy), and the server removed /a
    // and made it again as a directory. Then the old push landed: /a/b stood on the
    // server, as received from the replica and so never sent back to it, while the
    // replica's /a/b lived on only inside the conflict copy.
    let (_dir, server, replica) = setup();
    round(&server, &replica, "r1", "replica-1");
    replica.fs().mkdir("/a", MkdirOptions::default()).unwrap();
    replica.fs().mkdir("/a/b", MkdirOptions::default()).unwrap();
    let from = server.peer("r1").unwrap().unwrap().applied;
    let late = replica
        .changes_for("upstream", &from, 100, u64::MAX)
        .unwrap();
    server.fs().write_file("/a", "server's\n").unwrap();
    let conflicts = pull(&server, &replica, "r1", "replica-1");
    assert_eq!(conflicts.len(), 1, "{conflicts:?}");
    assert!(replica.fs().stat("/a/b").is_err());
    server.fs().unlink("/a").unwrap();
    server.fs().mkdir("/a", MkdirOptions::default()).unwrap();
    pull(&server, &replica, "r1", "replica-1");
    server
        .apply_push("r1", "replica-1", &late.entries, &[], &late.next)
        .unwrap();
    // The replica's directory beats the server's unseen removal of /a: it stands again.
    assert!(server.fs().stat("/a/b").is_ok());
    round(&server, &replica, "r1", "replica-1");
    round(&server, &replica, "r1", "replica-1");
    assert_eq!(states(&server), states(&replica));
}
