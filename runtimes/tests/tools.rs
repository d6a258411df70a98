//! The file tools agents call, on a workspace store.

mod common;

use std::sync::Arc;

use common::Kept;
use computer_runtimes::shell::ShellPolicy;
use computer_runtimes::tools::{Tools, LISTED_MAX};
use computer_runtimes::Error;
use computer_vfs::{MkdirOptions, Workspace};

fn workspace() -> Workspace {
    let ws = Workspace::open_in_memory(Default::default()).unwrap();
    let fs = ws.fs();
    fs.mkdir("/src", MkdirOptions::default()).unwrap();
    let lines: String = (1..=3000).map(|n| format!("line {n}\n")).collect();
    fs.write_file("/src/long.txt", lines).unwrap();
    fs.write_file(
        "/src/main.rs",
        "fn main() {\n    let x = 1;\n    let y = 1;\n}\n",
    )
    .unwrap();
    fs.write_file("/blob.bin", b"\x7fELF\0\0\x01binary")
        .unwrap();
    ws
}

fn tools(ws: &Workspace) -> Tools {
    Tools::new(ws, &ShellPolicy::default(), None).unwrap()
}

#[test]
fn read_numbers_lines_pages_and_says_what_is_left() {
    let ws = workspace();
    let tools = tools(&ws);
    let first = tools.read("src/long.txt", 1, None).unwrap();
    assert!(first.starts_with("     1\tline 1\n"), "{first}");
    assert!(first.contains("  2000\tline 2000\n"));
    assert!(!first.contains("line 2001\n"));
    assert!(first.ends_with("[lines 1 to 2000 of 3000 shown; read from line 2001 for more]\n"));
    let page = tools
        .read("/workspace/src/long.txt", 2999, Some(5))
        .unwrap();
    assert_eq!(page, "  2999\tline 2999\n  3000\tline 3000\n");
    let binary = tools.read("blob.bin", 1, None).unwrap_err().to_string();
    assert_eq!(
        binary,
        "/blob.bin: a binary file of 13 bytes; read shows text only"
    );
    let missing = tools.read("nope.txt", 1, None).unwrap_err();
    assert_eq!(missing.errno(), libc::ENOENT, "{missing}");
    let out = tools.read("../etc/passwd", 1, None).unwrap_err();
    assert!(matches!(out, Error::Invalid(_)), "{out}");
}

#[test]
fn write_replaces_whole_and_makes_parents() {
    let ws = workspace();
    let tools = tools(&ws);
    assert_eq!(
        tools.write("out/deep/new.txt", b"one\n").unwrap(),
        "created /out/deep/new.txt (4 bytes)"
    );
    assert_eq!(
        tools.write("/out/deep/new.txt", b"two\n").unwrap(),
        "replaced /out/deep/new.txt (4 bytes)"
    );
    assert_eq!(
        ws.fs().read_to_string("/out/deep/new.txt").unwrap(),
        "two\n"
    );
    let names: Vec<String> = (ws.fs().readdir("/out/deep").unwrap())
        .iter()
        .map(|e| e.name_lossy())
        .collect();
    assert_eq!(names, ["new.txt"], "no temporary file is left");
}

#[test]
fn edit_replaces_one_span_or_says_how_many_matched() {
    let ws = workspace();
    let tools = tools(&ws);
    let diff = tools
        .edit("src/main.rs", "let x = 1;", "let x = 2;")
        .unwrap();
    assert!(
        diff.contains("--- a/src/main.rs\n+++ b/src/main.rs\n"),
        "{diff}"
    );
    assert!(
        diff.contains("-    let x = 1;\n+    let x = 2;\n"),
        "{diff}"
    );
    let twice = tools
        .edit("src/main.rs", "    let", "    const")
        .unwrap_err();
    assert!(twice.to_string().contains("appears 2 times"), "{twice}");
    let missing = tools.edit("src/main.rs", "let z", "let w").unwrap_err();
    assert!(missing.to_string().contains("appears 0 times"), "{missing}");
    assert_eq!(
        ws.fs().read_to_string("/src/main.rs").unwrap(),
        "fn main() {\n    let x = 2;\n    let y = 1;\n}\n"
    );
}

#[test]
fn ls_find_and_grep_are_sorted_and_bounded() {
    let ws = workspace();
    for n in 0..(LISTED_MAX + 5) {
        ws.fs()
            .write_file(&format!("/src/gen{n:04}.rs"), format!("// TODO {n}\n"))
            .unwrap();
    }
    let tools = tools(&ws);
    let (listed, cut) = tools.ls("/").unwrap();
    let names: Vec<&str> = listed.iter().map(|e| e.name.as_str()).collect();
    assert_eq!((names, cut), (vec!["blob.bin", "src"], false));
    assert_eq!(listed[1].kind, "dir");
    let (listed, cut) = tools.ls("src").unwrap();
    assert_eq!((listed.len(), cut), (LISTED_MAX, true));
    let (found, cut) = tools.find("**/main.rs", None).unwrap();
    assert_eq!((found, cut), (vec!["/src/main.rs".to_string()], false));
    let (found, cut) = tools.find("*.rs", Some("src")).unwrap();
    assert_eq!((found.len(), cut), (LISTED_MAX, true));
    let (text, cut) = tools.grep("TODO 100[0-9]", "src", Some("*.rs")).unwrap();
    assert_eq!(text.lines().count(), 5, "{text}");
    assert!(text.contains("/src/gen1003.rs:1:// TODO 1003\n"), "{text}");
    assert!(!cut);
    let (_, cut) = tools.grep("TODO", "/", None).unwrap();
    assert!(cut);
}

#[test]
fn the_policy_bounds_the_tools_and_each_call_is_recorded() {
    let ws = workspace();
    let policy = ShellPolicy {
        write: vec!["out/**".into()],
        ..ShellPolicy::default()
    };
    let mut tools = Tools::new(&ws, &policy, None).unwrap();
    let kept = Arc::new(Kept::default());
    tools.set_audit(kept.clone());
    let refused = tools.write("src/main.rs", b"gone").unwrap_err();
    assert_eq!(refused.errno(), libc::EPERM);
    assert!(refused.to_string().contains("not allowed"), "{refused}");
    tools.write("out/a.txt", b"a").unwrap();
    let kept = kept.0.lock().unwrap();
    let seen: Vec<(&str, &str, &str)> = kept
        .iter()
        .map(|(kind, e)| (kind.as_str(), e.script.as_str(), e.status.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            ("tool", "write src/main.rs", "failed"),
            ("tool", "write out/a.txt", "completed")
        ]
    );
}

#[test]
fn calls_by_name_take_json_arguments_and_say_what_does_not_fit() {
    let ws = workspace();
    let tools = tools(&ws);
    let listed = tools.call("ls", "{}", "agent").unwrap();
    assert_eq!(listed, "blob.bin  13\nsrc/\n");
    let read = tools
        .call(
            "read",
            r#"{"path": "src/main.rs", "offset": 2, "limit": 1}"#,
            "agent",
        )
        .unwrap();
    assert!(
        read.starts_with("     2\t    let x = 1;\n[lines 2 to 2 of 4"),
        "{read}"
    );
    let unknown = tools.call("delete", "{}", "agent").unwrap_err().to_string();
    assert_eq!(
        unknown,
        "delete: no such tool (the tools are read, write, edit, ls, find, grep)"
    );
    let content = "x".repeat(computer_runtimes::tools::ARGUMENTS_BYTES_MAX);
    let huge = serde_json::json!({"path": "big.txt", "content": content}).to_string();
    let err = tools.call("write", &huge, "agent").unwrap_err().to_string();
    assert!(
        err.contains("more than the 16 MiB a call may carry"),
        "{err}"
    );
    assert!(!ws.fs().exists("/big.txt").unwrap(), "nothing was written");
}
