//! The shell backend as an owner runs it: on a mounted workspace (what it changes, the
//! mount shows at once), `auto` routing, a served workspace, and the differential test
//! against real bash in the Linux backend.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{computerd, exec, text, Mount};

fn audit(db: &Path) -> Vec<serde_json::Value> {
    let out = computerd(["audit", db.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    (text(&out.stdout).lines())
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// The kernel cached the file, its attributes and the listing; the shell changed all
/// three behind the mount, and the mount shows the change at once.
#[test]
fn what_the_shell_changes_the_mount_shows_at_once() {
    let m = Mount::new();
    m.sh("echo old > f.txt && mkdir d && echo 1 > d/one && ln -s f.txt link");
    assert_eq!(
        m.sh("cat f.txt link; stat -c %s f.txt; ls d"),
        "old\nold\n4\none\n"
    );
    let script = "echo newer > f.txt && echo 2 > d/two && rm d/one && mv d e && \
                  rm link && ln -s e/two link";
    let out = exec(&m.db, &["--backend", "shell"], script);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        m.sh("cat f.txt link; stat -c %s f.txt; ls; ls e"),
        "newer\n2\n6\ne\nf.txt\nlink\ntwo\n"
    );
    // And the other way round: what a process wrote through the mount, the shell reads.
    m.sh("echo from-the-mount >> f.txt");
    let out = exec(&m.db, &["--backend", "shell"], "tail -1 f.txt");
    assert_eq!(text(&out.stdout), "from-the-mount\n");
}

/// `auto` runs on the shell what the shell can run, escalates the rest to Linux, and
/// says so in the result and the trail.
#[test]
fn auto_picks_the_shell_or_escalates_to_linux() {
    let m = Mount::new();
    m.sh("printf 'b\\na\\n' > list.txt");
    let out = exec(&m.db, &["--backend", "auto"], "sort list.txt | head -1");
    assert_eq!(text(&out.stdout), "a\n", "{}", text(&out.stderr));
    let script = "git init -q . && git add list.txt && git status --short";
    let out = exec(&m.db, &["--backend", "auto"], script);
    assert_eq!(text(&out.stdout), "A  list.txt\n", "{}", text(&out.stderr));
    let records = audit(&m.db);
    let seen: Vec<(&str, &str)> = records
        .iter()
        .map(|r| {
            (
                r["status"].as_str().unwrap(),
                r["backend"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("completed", "shell"),
            ("escalated", "linux"),
            ("completed", "linux")
        ]
    );
    let reason = records[1]["reason"].as_str().unwrap();
    assert!(
        reason.contains("`git` is not a command the shell implements"),
        "{reason}"
    );
}

/// On a served workspace the shell works on the server's database; the Linux backend's
/// replica pulls what it wrote before its next command.
#[test]
fn a_served_workspace_runs_the_shell_on_the_server() {
    let mut server = common::Server::start();
    server.fs_ok(&["write", "/in.txt"], b"3\n1\n2\n");
    let out = exec(&server.db, &["--backend", "shell"], "sort in.txt > out.txt");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(server.fs_ok(&["cat", "/out.txt"], b""), b"1\n2\n3\n");
    let out = exec(&server.db, &[], "cat out.txt | wc -l; echo more >> out.txt");
    assert_eq!(text(&out.stdout), "3\n", "{}", text(&out.stderr));
    let out = exec(&server.db, &["--backend", "shell"], "tail -1 out.txt");
    assert_eq!(text(&out.stdout), "more\n", "{}", text(&out.stderr));
    server.stop();
}

// ---------------------------------------------------------------- differential test

/// Where the corpus lives: fixtures and scripts, `### name` before each script.
const CORPUS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/differential");
/// The share of scripts whose stdout, exit code and resulting tree must be the same on
/// both backends.
const IDENTICAL_SHARE_MIN: f64 = 0.93;

struct Script {
    name: String,
    source: String,
}

/// `=== path` lines start each fixture file; lines split on `\n` only (some hold `\r`).
fn fixtures() -> Vec<(String, Vec<u8>)> {
    let raw = std::fs::read(Path::new(CORPUS).join("fixtures.txt")).unwrap();
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for line in raw.split_inclusive(|&b| b == b'\n') {
        match line.strip_prefix(b"=== ") {
            Some(path) => files.push((text(path).trim_end().to_owned(), Vec::new())),
            None => files.last_mut().expect("a file first").1.extend(line),
        }
    }
    files
}

fn scripts() -> Vec<Script> {
    let mut files: Vec<_> = std::fs::read_dir(CORPUS)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("scripts-")
        })
        .collect();
    files.sort();
    let mut scripts: Vec<Script> = Vec::new();
    for file in files {
        for line in std::fs::read_to_string(file).unwrap().split_inclusive('\n') {
            match line.strip_prefix("### ") {
                Some(name) => scripts.push(Script {
                    name: name.trim().to_owned(),
                    source: String::new(),
                }),
                None => scripts
                    .last_mut()
                    .expect("a name first")
                    .source
                    .push_str(line),
            }
        }
    }
    scripts
}

fn lay_fixtures(dir: &Path, fixtures: &[(String, Vec<u8>)]) {
    for (path, content) in fixtures {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, content).unwrap();
    }
    let build = dir.join("scripts/build.sh");
    if build.exists() {
        use std::os::unix::fs::PermissionsExt;
        let executable = std::fs::Permissions::from_mode(0o755);
        for script in ["scripts/build.sh", "scripts/cleanup.sh"] {
            let _ = std::fs::set_permissions(dir.join(script), executable.clone());
        }
    }
}

/// What a script left: stdout, exit code.
type Ran = (String, Option<i32>);

/// The manifest lines of each script's directory under `root`, by script name.
fn trees(root: &Path) -> BTreeMap<String, Vec<String>> {
    let mut trees: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in common::manifest(root, false).lines() {
        let (name, rest) = line.split_once('/').unwrap_or((line, ""));
        if !rest.is_empty() {
            trees
                .entry(name.to_owned())
                .or_default()
                .push(rest.to_owned());
        }
    }
    trees
}

/// Scripts run at once: each run mostly waits for its processes (a sandbox to set up, a
/// client to connect), so a few side by side finish the corpus sooner on two cores.
const SCRIPTS_AT_ONCE: usize = 3;

/// `run` over every script, the scripts shared out in order among `SCRIPTS_AT_ONCE`
/// threads (each script has a directory of its own); the results in the scripts' order.
fn run_on_workers<T: Send>(scripts: &[Script], run: impl Fn(&Script) -> T + Sync) -> Vec<T> {
    let share = scripts.len().div_ceil(SCRIPTS_AT_ONCE).max(1);
    std::thread::scope(|workers| {
        let shares: Vec<_> = scripts
            .chunks(share)
            .map(|mine| workers.spawn(|| mine.iter().map(&run).collect::<Vec<T>>()))
            .collect();
        shares
            .into_iter()
            .flat_map(|share| share.join().expect("a share of the scripts"))
            .collect()
    })
}

/// Every script of the corpus on the shell and on real bash in the Linux backend, each
/// in its own copy of the fixtures (at the same path in two workspaces): stdout, exit
/// code and the tree it leaves compared. The report lists every difference; set
/// `SHELL_DIFFERENTIAL_REPORT=FILE` to keep it.
#[test]
fn the_shell_matches_bash_on_agent_scripts() {
    let shell = Mount::new();
    let bash = Mount::new();
    let fixtures = fixtures();
    let scripts = scripts();
    assert!(scripts.len() >= 300, "{} scripts", scripts.len());
    let run = |script: &Script| {
        let cwd = format!("t/{}", script.name);
        lay_fixtures(&shell.mnt.join(&cwd), &fixtures);
        lay_fixtures(&bash.mnt.join(&cwd), &fixtures);
        let on = |m: &Mount, backend: &str| -> Ran {
            let args = ["--backend", backend, "--cwd", &cwd, "--timeout", "30"];
            let out = exec(&m.db, &args, &script.source);
            (text(&out.stdout), out.status.code())
        };
        (on(&shell, "shell"), on(&bash, "linux"))
    };
    let ran = run_on_workers(&scripts, run);
    let (shell_trees, bash_trees) = (trees(&shell.mnt.join("t")), trees(&bash.mnt.join("t")));
    let mut report = String::new();
    let mut identical = 0;
    for (script, (on_shell, on_bash)) in scripts.iter().zip(&ran) {
        let trees_match = shell_trees.get(&script.name) == bash_trees.get(&script.name);
        let mut differs = Vec::new();
        if on_shell.0 != on_bash.0 {
            differs.push(format!(
                "stdout\n  shell: {:?}\n  bash:  {:?}",
                on_shell.0, on_bash.0
            ));
        }
        if on_shell.1 != on_bash.1 {
            differs.push(format!(
                "exit code: shell {:?}, bash {:?}",
                on_shell.1, on_bash.1
            ));
        }
        if !trees_match {
            differs.push("the tree it left".into());
        }
        if differs.is_empty() {
            identical += 1;
        } else {
            report += &format!(
                "## {}\n{}\n{}\n\n",
                script.name,
                script.source.trim_end(),
                differs.join("\n")
            );
        }
    }
    let share = identical as f64 / scripts.len() as f64;
    let summary = format!(
        "identical: {identical} of {} ({:.1} %)\n\n",
        scripts.len(),
        share * 100.0
    );
    println!("{summary}{report}");
    if let Ok(path) = std::env::var("SHELL_DIFFERENTIAL_REPORT") {
        std::fs::write(path, format!("{summary}{report}")).unwrap();
    }
    assert!(share >= IDENTICAL_SHARE_MIN, "{summary}{report}");
}
