//! `computerd fs`: the built binary against a temporary workspace database.

mod common;

use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::{pseudo_random, KillOnDrop};

struct Run {
    code: i32,
    stdout: Vec<u8>,
    stderr: String,
}

impl Run {
    fn out(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    #[track_caller]
    fn ok(self) -> Run {
        assert_eq!(self.code, 0, "stderr: {}", self.stderr);
        self
    }
}

fn computerd(db: &Path, args: &[&str], stdin: &[u8]) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_computerd"))
        .arg("fs")
        .arg(db)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("computerd starts");
    let mut pipe = child.stdin.take().expect("stdin is piped");
    let input = stdin.to_vec();
    let feeder = std::thread::spawn(move || {
        // The command may not read stdin at all: a closed pipe is fine.
        let _ = pipe.write_all(&input);
    });
    let Output {
        status,
        stdout,
        stderr,
    } = child.wait_with_output().expect("computerd runs");
    feeder.join().expect("stdin feeder");
    Run {
        code: status
            .code()
            .expect("computerd exits, not killed by a signal"),
        stdout,
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    }
}

/// `computerd <args>` (not `fs`), returning its output whatever its status.
fn computerd_top(args: &[&std::ffi::OsStr]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_computerd"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("computerd runs");
    Run {
        code: out.status.code().expect("computerd exits"),
        stdout: out.stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A new workspace, made with `computerd init`.
fn setup() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("ws.db");
    computerd_top(&["init".as_ref(), db.as_os_str()]).ok();
    (dir, db)
}

#[test]
fn write_and_cat_round_trip_through_stdin() {
    let (_dir, db) = setup();
    let data = pseudo_random(3 << 20);
    computerd(&db, &["write", "/blob"], &data).ok();
    let run = computerd(&db, &["cat", "/blob"], b"").ok();
    assert!(run.stdout == data, "cat returns what write stored");

    // Replace, then append.
    computerd(&db, &["write", "/t.txt"], b"first\n").ok();
    computerd(&db, &["write", "/t.txt"], b"hello\n").ok();
    computerd(&db, &["write", "--append", "/t.txt"], b"world\n").ok();
    // Relative paths are taken from the root.
    computerd(&db, &["write", "-a", "new.txt"], b"created\n").ok();
    let run = computerd(&db, &["cat", "/t.txt", "/new.txt"], b"").ok();
    assert_eq!(run.out(), "hello\nworld\ncreated\n");

    let run = computerd(&db, &["stat", "/t.txt"], b"").ok();
    let out = run.out();
    assert!(out.contains("size: 12\n"), "{out}");
    assert!(out.contains("mode: 0644 (-rw-r--r--)"), "{out}");
    assert!(out.contains("kind: regular file"), "{out}");
    for key in ["inode:", "links: 1", "uid:", "gid:", "revision:"] {
        assert!(out.contains(key), "{key} in {out}");
    }
    // Times are RFC 3339 with nanoseconds, in UTC.
    let mtime = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("mtime: "))
        .expect("an mtime line");
    assert_eq!(
        mtime.len(),
        "2024-01-01T00:00:00.000000000Z".len(),
        "{mtime}"
    );
    assert!(
        mtime.ends_with('Z') && mtime.as_bytes()[19] == b'.',
        "{mtime}"
    );
}

#[test]
fn mkdir_ls_and_tree_manipulation() {
    let (_dir, db) = setup();
    computerd(&db, &["mkdir", "-p", "/a/b/c", "/a/d"], b"").ok();
    computerd(&db, &["write", "/a/file"], b"12345").ok();
    computerd(&db, &["ln", "-s", "file", "/a/link"], b"").ok();

    let run = computerd(&db, &["ls", "/a"], b"").ok();
    assert_eq!(run.out(), "b\nd\nfile\nlink\n");
    let run = computerd(&db, &["ls"], b"").ok();
    assert_eq!(run.out(), "a\n");

    let run = computerd(&db, &["ls", "-l", "/a"], b"").ok();
    let lines: Vec<String> = run.out().lines().skip(1).map(str::to_owned).collect();
    assert!(run.out().starts_with("total "), "{}", run.out());
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert!(lines[0].starts_with("drwxr-xr-x ") && lines[0].ends_with(" b"));
    assert!(lines[2].starts_with("-rw-r--r-- "), "{}", lines[2]);
    assert!(
        lines[2].contains(" 5 ") && lines[2].ends_with(" file"),
        "{}",
        lines[2]
    );
    assert!(lines[3].starts_with("lrwxrwxrwx ") && lines[3].ends_with(" link -> file"));

    // mkdir without -p on an existing directory fails; with -p it does not.
    let run = computerd(&db, &["mkdir", "/a/b"], b"");
    assert_ne!(run.code, 0);
    assert_eq!(run.stderr, "computerd: /a/b: file exists\n");
    computerd(&db, &["mkdir", "-p", "/a/b"], b"").ok();

    // mv into a directory, cp, hard link, chmod, rm -r.
    computerd(&db, &["mv", "/a/file", "/a/d"], b"").ok();
    computerd(&db, &["cp", "/a/d/file", "/a/copy"], b"").ok();
    computerd(&db, &["write", "/a/other"], b"other").ok();
    computerd(&db, &["cp", "/a/other", "/a/copy"], b"").ok();
    computerd(&db, &["ln", "/a/copy", "/a/hard"], b"").ok();
    computerd(&db, &["chmod", "600", "/a/hard"], b"").ok();
    let run = computerd(&db, &["cat", "/a/d/file", "/a/copy", "/a/hard"], b"").ok();
    assert_eq!(run.out(), "12345otherother");
    let run = computerd(&db, &["stat", "/a/copy"], b"").ok();
    assert!(run.out().contains("links: 2"), "{}", run.out());
    assert!(run.out().contains("mode: 0600"), "{}", run.out());

    computerd(&db, &["truncate", "-s", "2", "/a/copy"], b"").ok();
    let run = computerd(&db, &["cat", "/a/hard"], b"").ok();
    assert_eq!(run.out(), "ot");

    let run = computerd(&db, &["find", "/a/**/file"], b"").ok();
    assert_eq!(run.out(), "/a/d/file\n");

    let run = computerd(&db, &["rm", "/a"], b"");
    assert_eq!(run.stderr, "computerd: /a: is a directory\n");
    computerd(&db, &["rm", "-r", "/a"], b"").ok();
    let run = computerd(&db, &["ls", "/"], b"").ok();
    assert_eq!(run.out(), "");
    computerd(&db, &["rm", "-f", "/a"], b"").ok();
}

#[test]
fn import_then_export_keeps_the_tree() {
    let (dir, db) = setup();
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("sub/empty")).unwrap();
    fs::write(src.join("top.txt"), b"top level\n").unwrap();
    fs::write(src.join("sub/data.bin"), pseudo_random(300_000)).unwrap();
    fs::write(src.join("sub/script.sh"), b"#!/bin/sh\necho hi\n").unwrap();
    fs::set_permissions(src.join("sub/script.sh"), fs::Permissions::from_mode(0o751)).unwrap();
    fs::set_permissions(src.join("sub/empty"), fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink("../top.txt", src.join("sub/link")).unwrap();
    fs::hard_link(src.join("top.txt"), src.join("sub/hard.txt")).unwrap();

    let run = computerd(&db, &["import", src.to_str().unwrap(), "/proj"], b"").ok();
    let summary = run.out();
    assert_eq!(summary.lines().count(), 1, "{summary}");
    assert!(
        summary.starts_with(
            "imported 3 files, 2 directories, 1 symlink, 1 hard link, 293.0 KiB (300028 bytes) in "
        ),
        "{summary}"
    );
    assert!(summary.trim_end().ends_with(" MB/s)"), "{summary}");
    // No terminal and a small tree: no progress output.
    assert_eq!(run.stderr, "");

    let out = dir.path().join("out");
    let run = computerd(&db, &["export", "/proj", out.to_str().unwrap()], b"").ok();
    assert!(run
        .out()
        .starts_with("exported 3 files, 2 directories, 1 symlink, 1 hard link,"));

    for file in ["top.txt", "sub/data.bin", "sub/script.sh", "sub/hard.txt"] {
        let (a, b) = (src.join(file), out.join(file));
        assert!(
            fs::read(&a).unwrap() == fs::read(&b).unwrap(),
            "{file} content"
        );
        let (ma, mb) = (fs::metadata(&a).unwrap(), fs::metadata(&b).unwrap());
        assert_eq!(ma.mode() & 0o7777, mb.mode() & 0o7777, "{file} mode");
        assert_eq!(ma.mtime(), mb.mtime(), "{file} mtime");
    }
    let empty = fs::metadata(out.join("sub/empty")).unwrap();
    assert!(empty.is_dir());
    assert_eq!(empty.mode() & 0o7777, 0o700);
    let link = out.join("sub/link");
    assert!(fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(fs::read_link(&link).unwrap(), Path::new("../top.txt"));
    let (top, hard) = (
        fs::metadata(out.join("top.txt")).unwrap(),
        fs::metadata(out.join("sub/hard.txt")).unwrap(),
    );
    assert_eq!(top.ino(), hard.ino(), "the hard link stays a hard link");
    assert_eq!(top.nlink(), 2);

    // The workspace view agrees.
    let run = computerd(&db, &["ls", "-l", "/proj/sub"], b"").ok();
    assert!(run.out().contains(" link -> ../top.txt\n"), "{}", run.out());
    let run = computerd(&db, &["du", "-s", "/proj"], b"").ok();
    assert_eq!(run.out(), "300028\t/proj\n");
    let run = computerd(&db, &["tree", "/proj"], b"").ok();
    assert!(
        run.out().ends_with("\n2 directories, 5 files\n"),
        "{}",
        run.out()
    );

    // Export of a file, import of a missing host directory: one line each.
    let run = computerd(
        &db,
        &["export", "/proj/top.txt", out.to_str().unwrap()],
        b"",
    );
    assert_eq!(run.code, 1);
    assert_eq!(run.stderr, "computerd: /proj/top.txt: not a directory\n");
    let missing = dir.path().join("missing");
    let run = computerd(&db, &["import", missing.to_str().unwrap(), "/x"], b"");
    assert_eq!(run.code, 1);
    assert_eq!(
        run.stderr,
        format!(
            "computerd: {}: no such file or directory\n",
            missing.display()
        )
    );
}

#[test]
fn grep_reports_matches_and_exit_codes() {
    let (_dir, db) = setup();
    let main_rs = b"fn main() {\n    println!(\"Hello\");\n}\n";
    // write makes no parent directories.
    let run = computerd(&db, &["write", "/src/main.rs"], main_rs);
    assert_eq!(run.code, 1);
    assert_eq!(
        run.stderr,
        "computerd: /src/main.rs: no such file or directory\n"
    );
    computerd(&db, &["mkdir", "-p", "/src/lib"], b"").ok();
    computerd(&db, &["write", "/src/main.rs"], main_rs).ok();
    computerd(
        &db,
        &["write", "/src/lib/notes.txt"],
        b"hello notes\nnothing\n",
    )
    .ok();

    let run = computerd(&db, &["grep", "Hello"], b"");
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.out(), "/src/main.rs:2:    println!(\"Hello\");\n");

    let run = computerd(&db, &["grep", "-i", "hello", "/src"], b"");
    assert_eq!(run.code, 0);
    let out = run.out();
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "/src/lib/notes.txt:1:hello notes",
            "/src/main.rs:2:    println!(\"Hello\");"
        ]
    );

    let run = computerd(&db, &["grep", "-i", "--include", "*.txt", "hello"], b"");
    assert_eq!(run.out(), "/src/lib/notes.txt:1:hello notes\n");
    let run = computerd(&db, &["grep", "-E", "^no+", "/src/lib/notes.txt"], b"");
    assert_eq!(run.out(), "/src/lib/notes.txt:2:nothing\n");
    let run = computerd(&db, &["grep", "-m", "1", "-E", "."], b"");
    assert_eq!(run.out().lines().count(), 1);

    // No match: exit 1, nothing printed. An error: exit 2, one line.
    let run = computerd(&db, &["grep", "absent"], b"");
    assert_eq!(
        (run.code, run.out(), run.stderr.as_str()),
        (1, String::new(), "")
    );
    let run = computerd(&db, &["grep", "x", "/nope"], b"");
    assert_eq!(run.code, 2);
    assert_eq!(run.stderr, "computerd: /nope: no such file or directory\n");
    let run = computerd(&db, &["grep", "-E", "(", "/"], b"");
    assert_eq!(run.code, 2);
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
}

#[test]
fn check_and_stats_on_a_good_database() {
    let (_dir, db) = setup();
    let data = pseudo_random(200_000);
    computerd(&db, &["write", "/one"], &data).ok();
    computerd(&db, &["cp", "/one", "/two"], b"").ok();
    computerd(&db, &["mkdir", "/d"], b"").ok();
    computerd(&db, &["ln", "-s", "/one", "/l"], b"").ok();

    let run = computerd(&db, &["check"], b"").ok();
    let out = run.out();
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(out.starts_with("checked 5 nodes, "), "{out}");
    assert!(out.trim_end().ends_with(": no problems"), "{out}");

    let run = computerd(&db, &["stats"], b"").ok();
    let out = run.out();
    let field = |key: &str| -> String {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}:")))
            .unwrap_or_else(|| panic!("{key} in {out}"))
            .trim()
            .to_owned()
    };
    assert_eq!(field("files"), "2");
    assert_eq!(field("directories"), "2");
    assert_eq!(field("symlinks"), "1");
    assert_eq!(field("logical bytes"), "390.6 KiB (400000 bytes)");
    assert_eq!(field("unique bytes"), "195.3 KiB (200000 bytes)");
    // Two copies of the same 200,000 bytes; random bytes do not compress.
    assert_eq!(field("dedup ratio"), "2.00");
    assert!(field("compression").parse::<f64>().unwrap() < 1.1);
    assert!(field("database bytes").ends_with(" bytes)"));
    let revision: u64 = field("revision").parse().unwrap();
    assert!(revision >= 4);

    let run = computerd(&db, &["stats", "--json"], b"").ok();
    let json = run.out();
    assert!(
        json.starts_with('{') && json.trim_end().ends_with('}'),
        "{json}"
    );
    for part in [
        "\"files\":2,",
        "\"directories\":2,",
        "\"symlinks\":1,",
        "\"logical_bytes\":400000,",
        "\"unique_bytes\":200000,",
        "\"stored_bytes\":",
        "\"blocks\":",
        "\"dedup_ratio\":",
        "\"compression_ratio\":",
        "\"database_bytes\":",
        &format!("\"revision\":{revision}}}"),
    ] {
        assert!(json.contains(part), "{part} in {json}");
    }
}

#[test]
fn errors_are_one_line_naming_the_path() {
    let (dir, db) = setup();
    computerd(&db, &["mkdir", "/a"], b"").ok();

    let run = computerd(&db, &["cat", "/a/b"], b"");
    assert_ne!(run.code, 0);
    assert_eq!(run.stderr, "computerd: /a/b: no such file or directory\n");
    assert!(run.stdout.is_empty());

    // Several paths: each bad one is reported, the good ones still done.
    computerd(&db, &["write", "/f"], b"ok\n").ok();
    let run = computerd(&db, &["cat", "/x", "/f", "/a"], b"");
    assert_eq!(run.code, 1);
    assert_eq!(run.out(), "ok\n");
    assert_eq!(
        run.stderr,
        "computerd: /x: no such file or directory\ncomputerd: /a: is a directory\n"
    );

    let run = computerd(&db, &["ls", "/f/x"], b"");
    assert_eq!(run.stderr, "computerd: /f/x: not a directory\n");
    let run = computerd(&db, &["chmod", "u+x", "/f"], b"");
    assert_eq!(run.code, 1);
    assert_eq!(
        run.stderr,
        "computerd: u+x: invalid mode (expected octal, like 755)\n"
    );
    let run = computerd(&db, &["mv", "/nope", "/x"], b"");
    assert_eq!(run.stderr, "computerd: /nope: no such file or directory\n");
    let run = computerd(&db, &["rm", "/"], b"");
    assert_eq!(run.code, 1);
    assert_eq!(run.stderr.lines().count(), 1);

    // A missing database: read commands do not create it.
    let missing = dir.path().join("missing.db");
    for args in [
        &["ls"][..],
        &["cat", "/f"],
        &["stat", "/"],
        &["stats"],
        &["check"],
        &["find", "/*"],
    ] {
        let run = computerd(&missing, args, b"");
        assert_eq!(run.code, 1, "{args:?}");
        assert_eq!(
            run.stderr,
            format!(
                "computerd: {}: no such file or directory\n",
                missing.display()
            ),
            "{args:?}"
        );
    }
    let run = computerd(&missing, &["grep", "x"], b"");
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains(&missing.display().to_string()));
    let leftovers: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("missing"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // A database in a directory that does not exist, even for a write command.
    let nowhere = dir.path().join("no/such/dir/ws.db");
    let run = computerd(&nowhere, &["mkdir", "/a"], b"");
    assert_eq!(run.code, 1);
    assert_eq!(
        run.stderr,
        format!(
            "computerd: {}: no such file or directory (computerd init makes a workspace)\n",
            nowhere.display()
        )
    );
}

#[test]
fn only_init_makes_a_workspace() {
    let dir = tempfile::tempdir().unwrap();
    // A mistyped path: no command that writes makes a workspace there.
    let typo = dir.path().join("wss.db");
    for args in [
        &["write", "/a"][..],
        &["mkdir", "/d"],
        &["rm", "-f", "/x"],
        &["import", "/nonexistent", "/"],
    ] {
        let run = computerd(&typo, args, b"x");
        assert_eq!(run.code, 1, "{args:?}");
        assert!(
            run.stderr
                .contains("no such file or directory (computerd init makes a workspace)"),
            "{args:?}: {}",
            run.stderr
        );
    }
    let names = |dir: &Path| -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    };
    assert!(names(dir.path()).is_empty(), "{:?}", names(dir.path()));
    // An empty file (or any file that is not a workspace) stays what it is.
    let empty = dir.path().join("empty.db");
    fs::write(&empty, b"").unwrap();
    for args in [&["write", "/a"][..], &["ls"]] {
        let run = computerd(&empty, args, b"x");
        assert_eq!(run.code, 1, "{args:?}");
        assert_eq!(
            run.stderr,
            format!("computerd: {}: not a workspace database\n", empty.display())
        );
    }
    assert_eq!(fs::read(&empty).unwrap(), b"");
    // init makes one, once.
    let db = dir.path().join("ws.db");
    let run = computerd_top(&["init".as_ref(), db.as_os_str()]).ok();
    assert!(run.out().starts_with("made workspace "), "{}", run.out());
    computerd(&db, &["write", "/a"], b"here\n").ok();
    let again = computerd_top(&["init".as_ref(), db.as_os_str()]);
    assert_eq!(again.code, 1);
    assert!(again.stderr.contains("file exists"), "{}", again.stderr);
    assert_eq!(computerd(&db, &["cat", "/a"], b"").ok().out(), "here\n");
    let again = computerd_top(&["init".as_ref(), empty.as_os_str()]);
    assert_eq!(again.code, 1);
    assert_eq!(fs::read(&empty).unwrap(), b"");
}

#[test]
fn compact_gives_the_space_of_removed_files_back() {
    let (_dir, db) = setup();
    for i in 0..24 {
        let path = format!("/d/{i}");
        computerd(&db, &["mkdir", "-p", "/d"], b"").ok();
        let data = common::pseudo_random_seeded(1 << 20, i);
        computerd(&db, &["write", &path], &data).ok();
    }
    computerd(&db, &["write", "/kept"], b"kept").ok();
    computerd(&db, &["rm", "-r", "/d"], b"").ok();
    let before = fs::metadata(&db).unwrap().len();
    assert!(before > 20 << 20, "{before} bytes before compact");
    let run = computerd(&db, &["compact"], b"").ok();
    let out = run.out();
    assert!(
        out.starts_with("compacted: ") && out.contains(" given back) in "),
        "{out}"
    );
    assert_eq!(run.stderr, "");
    let after = fs::metadata(&db).unwrap().len();
    assert!(after < 1 << 20, "{after} bytes after compact: {out}");
    assert_eq!(computerd(&db, &["cat", "/kept"], b"").ok().out(), "kept");
    computerd(&db, &["check"], b"").ok();
    let stats = computerd(&db, &["stats", "--json"], b"").ok().out();
    assert!(stats.contains("\"free_bytes\":0"), "{stats}");
}

#[test]
fn ls_lists_as_coreutils_does() {
    let (dir, db) = setup();
    computerd(
        &db,
        &["mkdir", "-p", "/t/.hidden/deep", "/t/sub/inner"],
        b"",
    )
    .ok();
    for (path, len) in [
        ("/t/.dot", 3),
        ("/t/sub/a", 1536),
        ("/t/b", 10 * 1024 + 1),
        ("/t/c", 5),
        ("/t/.hidden/deep/d", 1024),
        ("/t/big", 3 << 20),
    ] {
        computerd(&db, &["write", path], &pseudo_random(len)).ok();
    }
    computerd(&db, &["ln", "-s", "c", "/t/link"], b"").ok();
    let host = dir.path().join("t");
    computerd(&db, &["export", "/t", host.to_str().unwrap()], b"").ok();
    let coreutils = |flags: &str| {
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!("LC_ALL=C ls {flags} ."))
            .current_dir(&host)
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    for flags in ["", "-a", "-A", "-R", "-RA", "-Ra"] {
        let mut args = vec!["ls"];
        if !flags.is_empty() {
            args.push(flags);
        }
        args.push("/t");
        let ours = computerd(&db, &args, b"").ok().out();
        // Headings name the directory as given: /t here, . there.
        let ours: String = ours
            .lines()
            .map(
                |line| match line.strip_prefix("/t").filter(|_| line.ends_with(':')) {
                    Some(rest) => format!(".{rest}\n"),
                    None => format!("{line}\n"),
                },
            )
            .collect();
        assert_same(&format!("ls {flags}"), &coreutils(flags), &ours);
    }
    // -h sizes, name by name.
    let sizes = |listing: &str| -> Vec<(String, String)> {
        listing
            .lines()
            .filter(|l| l.starts_with('-'))
            .map(|l| {
                let fields: Vec<&str> = l.split_whitespace().collect();
                (fields[fields.len() - 1].to_owned(), fields[4].to_owned())
            })
            .collect()
    };
    let ours = computerd(&db, &["ls", "-lh", "/t"], b"").ok().out();
    assert!(ours.starts_with("total "), "{ours}");
    assert_eq!(sizes(&ours), sizes(&coreutils("-lh")), "{ours}");
    let ours = computerd(&db, &["ls", "-l", "/t/link"], b"").ok().out();
    assert!(
        ours.starts_with("lrwxrwxrwx ") && ours.ends_with(" /t/link -> c\n"),
        "{ours}"
    );
}

/// Asserts two texts are equal, showing both whole when they are not.
fn assert_same(what: &str, expected: &str, actual: &str) {
    assert!(
        expected == actual,
        "{what}: differs\n--- coreutils ---\n{expected}--- ours ---\n{actual}"
    );
}

#[test]
fn completions_and_man_pages_come_from_the_command_line_definitions() {
    let dir = tempfile::tempdir().unwrap();
    let bash = computerd_top(&["completions".as_ref(), "bash".as_ref()]);
    assert_eq!(bash.code, 0, "{}", bash.stderr);
    let script = dir.path().join("computerd.bash");
    fs::write(&script, &bash.stdout).unwrap();
    // Valid bash, and it knows the subcommands and their flags.
    let check = Command::new("bash")
        .arg("-n")
        .arg(&script)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let text = String::from_utf8_lossy(&bash.stdout);
    for word in ["umount", "status", "compact", "--almost-all"] {
        assert!(text.contains(word), "the bash completions lack {word}");
    }
    let zsh = computerd_top(&["completions".as_ref(), "zsh".as_ref()]);
    assert!(
        zsh.code == 0 && zsh.out().starts_with("#compdef computerd"),
        "{}",
        zsh.out()
    );

    let page = computerd_top(&["man".as_ref()]);
    assert_eq!(page.code, 0, "{}", page.stderr);
    assert!(page.out().contains(".TH computerd 1"), "{}", page.out());
    let pages = dir.path().join("man");
    let run = computerd_top(&["man".as_ref(), "--dir".as_ref(), pages.as_os_str()]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let ls_page = fs::read_to_string(pages.join("computerd-fs-ls.1")).unwrap();
    assert!(ls_page.contains(".TH computerd-fs-ls 1"), "{ls_page}");
    assert!(ls_page.contains("almost\\-all"), "{ls_page}");
    assert!(pages.join("computerd-umount.1").exists());
}

#[test]
fn import_refuses_names_that_are_not_utf8_before_writing_or_skips_them_when_asked() {
    use std::os::unix::ffi::OsStrExt;
    let (dir, db) = setup();
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    fs::write(src.join("good"), b"ok\n").unwrap();
    fs::write(src.join("sub/fine"), b"x\n").unwrap();
    let bad = src.join(std::ffi::OsStr::from_bytes(b"sub/caf\xe9.txt"));
    fs::write(&bad, b"bad").unwrap();
    std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(b"\xff"), src.join("badlink")).unwrap();
    let src_arg = src.to_str().unwrap();

    let run = computerd(&db, &["import", src_arg, "/in"], b"");
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("is not UTF-8, so nothing was imported (--skip-bad-names"),
        "{}",
        run.stderr
    );
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
    // Nothing at all: not even the destination directory.
    assert_eq!(computerd(&db, &["ls", "/"], b"").ok().out(), "");

    let run = computerd(&db, &["import", "--skip-bad-names", src_arg, "/in"], b"").ok();
    assert!(
        run.out().ends_with("; left out 2 bad names\n"),
        "{}",
        run.out()
    );
    assert_eq!(run.stderr.lines().count(), 2, "{}", run.stderr);
    assert!(run.stderr.contains("badlink: left out"), "{}", run.stderr);
    let listing = computerd(&db, &["ls", "-R", "/in"], b"").ok().out();
    assert_eq!(listing, "/in:\ngood\nsub\n\n/in/sub:\nfine\n");
}

#[test]
fn json_outputs_are_json_with_the_fields_scripts_read() {
    let (dir, db) = setup();
    computerd(&db, &["mkdir", "/d"], b"").ok();
    computerd(&db, &["write", "/d/f"], b"hello").ok();
    let host = dir.path().join("out");
    let host_arg = host.to_str().unwrap();
    let src = dir.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("x"), b"x").unwrap();
    let src_arg = src.to_str().unwrap();
    let cases: [(&[&str], &str); 6] = [
        (
            &["stat", "--json", "/d", "/d/f"],
            "[o['size'] for o in objects] == [0, 5]",
        ),
        (
            &["check", "--json"],
            "objects[0]['ok'] and objects[0]['problems'] == []",
        ),
        (
            &["compact", "--json"],
            "objects[0]['bytes_after'] <= objects[0]['bytes_before']",
        ),
        (
            &["export", "--json", "/d", host_arg],
            "objects[0]['files'] == 1",
        ),
        (
            &["import", "--json", src_arg, "/in"],
            "objects[0]['bad_names'] == []",
        ),
        (
            &["stats", "--json"],
            "objects[0]['files'] == 2 and objects[0]['free_bytes'] >= 0",
        ),
    ];
    for (args, holds) in cases {
        let out = computerd(&db, args, b"").ok().out();
        let script = format!(
            "import json, sys\n\
             objects = [json.loads(line) for line in sys.stdin.read().splitlines()]\n\
             assert {holds}, objects\n"
        );
        let mut check = Command::new("python3")
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        check
            .stdin
            .take()
            .unwrap()
            .write_all(out.as_bytes())
            .unwrap();
        let result = check.wait_with_output().unwrap();
        assert!(
            result.status.success(),
            "{args:?} printed {out}\n{}",
            String::from_utf8_lossy(&result.stderr)
        );
    }
}

#[test]
fn an_import_killed_midway_leaves_nothing_at_its_destination_and_runs_again() {
    let (dir, db) = setup();
    // 48 MiB in 384 files, no two alike (windows of one random stream), so the import
    // runs long enough to be killed in the middle of it.
    const FILE_BYTES: usize = 128 << 10;
    let stream = pseudo_random(384 * FILE_BYTES + 4096);
    let src = dir.path().join("src");
    for i in 0..384 {
        let sub = src.join(format!("d{}", i % 12));
        fs::create_dir_all(&sub).unwrap();
        let start = i * FILE_BYTES + i % 4096;
        fs::write(
            sub.join(format!("f{i}")),
            &stream[start..start + FILE_BYTES],
        )
        .unwrap();
    }
    let src_arg = src.to_str().unwrap();
    let importer = Command::new(env!("CARGO_BIN_EXE_computerd"))
        .args(["-q", "fs"])
        .arg(&db)
        .args(["import", src_arg, "/dst"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("computerd starts");
    let mut importer = KillOnDrop(importer);
    // Killed once a fifth of it is in the database (or when it ends on its own first).
    let started = common::wait_for(std::time::Duration::from_secs(120), || {
        let size = fs::metadata(&db).map(|m| m.len()).unwrap_or(0);
        let ended = importer.0.try_wait().unwrap().is_some();
        (ended || size > 10 << 20).then_some(ended)
    });
    let (ended_first, _) = started.expect("the import neither grew the database nor ended");
    importer.0.kill().unwrap();
    importer.0.wait().unwrap();

    // A read (which rolls back a cut commit first) sees no destination, and the
    // database checks clean.
    let listing = computerd(&db, &["ls", "-A", "/"], b"").ok().out();
    if ended_first {
        eprintln!("the import ended before the kill: nothing was cut");
    } else {
        // At most the hidden tree it was building, which the next import removes.
        assert!(
            listing.is_empty() || listing == ".dst.partial-import\n",
            "a killed import left something at its destination: {listing:?}"
        );
    }
    computerd(&db, &["check"], b"").ok();

    // Run again, it removes what the killed one left and imports the whole tree.
    computerd(&db, &["import", src_arg, "/dst"], b"").ok();
    assert_eq!(computerd(&db, &["ls", "-A", "/"], b"").ok().out(), "dst\n");
    let out = dir.path().join("out");
    computerd(&db, &["export", "/dst", out.to_str().unwrap()], b"").ok();
    common::assert_same_manifest(
        "the tree imported again",
        &common::manifest(&src, true),
        &common::manifest(&out, true),
    );
    computerd(&db, &["check"], b"").ok();
}
