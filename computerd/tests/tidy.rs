//! Tidy: the rules of the codebase a machine can check, as docs/ARCHITECTURE.md lists
//! them ("Tidy rules"). It reads the sources of every crate, so it lives in the crate
//! on top.
//!
//! - Every source file begins with its module's documentation (`//!`).
//! - SQL appears only in the vfs modules the map's invariant names, and each of them
//!   holds some: the sentence stays exact.
//! - The modules of vfs, sync and computerd import one another without a circle.
//! - vfs's modules sit in layers ([`VFS_LAYERS`]) and import only their own layer and
//!   those below; they name each other's items by module, never through the crate root
//!   (which would hide an import).
//! - Only `block_store.rs` reaches the table of block bytes.
//! - No function is longer than 70 lines but those in [`LONG_FUNCTIONS`], each at most
//!   as long as listed: a ratchet. An entry whose function got shorter must be lowered
//!   (or removed, at 70 lines or fewer), so the list only goes down.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The longest a function may be, in lines, unless listed in [`LONG_FUNCTIONS`].
const FUNCTION_LINES_MAX: usize = 70;

/// The functions longer than [`FUNCTION_LINES_MAX`] when this rule came (issue 14), at
/// their length then: (file, function, lines). Only ever lowered.
const LONG_FUNCTIONS: &[(&str, &str, usize)] = &[
    ("sync/src/follow.rs", "run", 159),
    ("computerd/src/mount.rs", "mount_and_wait", 102),
    ("computerd/src/fs_ops.rs", "file_operation", 139),
    ("vfs/src/peers.rs", "plan", 145),
    ("vfs/src/peers.rs", "apply_part", 80),
    ("vfs/src/db/mod.rs", "write", 86),
    ("vfs/src/workspace.rs", "rename", 100),
    ("vfs/src/content.rs", "apply", 98),
    ("vfs/src/transfer.rs", "export", 97),
    ("sync/src/sim/audit.rs", "check_cursors", 93),
    ("vfs/src/transfer.rs", "copy_tree", 92),
    ("vfs/src/check.rs", "check_namespace", 92),
    ("vfs/src/changes.rs", "apply_entry", 81),
    ("sync/src/sim/replicas.rs", "attempt_ended", 88),
    ("vfs/src/check.rs", "check_blocks", 74),
    ("vfs/src/resolve.rs", "resolve_in", 79),
    (
        "vfs/src/changes_full_scan.rs",
        "changes_after_full_scan",
        85,
    ),
    ("vfs/src/log.rs", "revision", 82),
    ("vfs/src/changes_full_scan.rs", "collect_candidates", 74),
    ("vfs/src/log.rs", "page", 73),
];

/// The crates' source directories, from the workspace root.
const SOURCE_DIRS: &[&str] = &[
    "vfs/src",
    "sync/src",
    "runtimes/src",
    "computerd/src",
    "benches/src",
];
/// Those whose functions the length rule covers: the product, not the benchmarks.
const PRODUCT_DIRS: &[&str] = &["vfs/src", "sync/src", "runtimes/src", "computerd/src"];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("computerd sits in the workspace")
        .to_path_buf()
}

/// Every `.rs` file below `dir` (relative to the root), but generated code: (path
/// from the root, text).
fn sources(dir: &str) -> Vec<(String, String)> {
    let root = workspace_root();
    let mut out = Vec::new();
    let mut pending = vec![root.join(dir)];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.file_name().is_some_and(|n| n == "generated") {
                continue;
            }
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(&root).unwrap().display().to_string();
                out.push((rel, std::fs::read_to_string(&path).unwrap()));
            }
        }
    }
    out.sort();
    out
}

fn architecture() -> String {
    std::fs::read_to_string(workspace_root().join("docs/ARCHITECTURE.md")).unwrap()
}

/// The backquoted names in `text` between `start` and the next `end` after it.
fn quoted_between(text: &str, start: &str, end: &str) -> BTreeSet<String> {
    let from = text
        .find(start)
        .unwrap_or_else(|| panic!("the map lost {start:?}"));
    let rest = &text[from + start.len()..];
    let to = rest
        .find(end)
        .unwrap_or_else(|| panic!("no {end:?} after {start:?}"));
    rest[..to]
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The top-level module of a file of vfs: its stem, or its folder (`db/disk_room.rs`
/// is `db`).
/// The top-level module of the crate in `src_dir` that the file at `path` belongs to
/// (a folder counts as one module).
fn top_module(src_dir: &str, path: &str) -> String {
    let rel = path.strip_prefix(src_dir).unwrap().trim_start_matches('/');
    match rel.split_once('/') {
        Some((folder, _)) => folder.to_owned(),
        None => rel.trim_end_matches(".rs").to_owned(),
    }
}

// ------------------------------------------------------------------------- docs

#[test]
fn every_source_file_begins_with_its_module_documentation() {
    let undocumented: Vec<String> = SOURCE_DIRS
        .iter()
        .flat_map(|dir| sources(dir))
        .filter(|(_, text)| !text.trim_start().starts_with("//!"))
        .map(|(path, _)| path)
        .collect();
    assert!(
        undocumented.is_empty(),
        "files without a `//!` module doc: {undocumented:?}"
    );
}

// -------------------------------------------------------------------------- SQL

const SQL_STARTS: &[&str] = &[
    "SELECT ",
    "INSERT ",
    "UPDATE ",
    "DELETE ",
    "PRAGMA ",
    "CREATE ",
    "BEGIN ",
    "SAVEPOINT ",
    "RELEASE ",
    "ROLLBACK",
    "WITH ",
    "VACUUM",
];

/// Whether a string literal in `text` begins (after white space) with SQL.
fn holds_sql(text: &str) -> bool {
    text.match_indices('"').any(|(at, _)| {
        let literal = text[at + 1..].trim_start();
        SQL_STARTS.iter().any(|start| literal.starts_with(start))
    })
}

/// The block store boundary: only `block_store.rs` reaches block bytes (the schema
/// in `db/` defines their table).
#[test]
fn only_the_block_store_names_the_table_of_block_bytes() {
    let outside: Vec<String> = sources("vfs/src")
        .into_iter()
        .filter(|(path, text)| {
            let allowed = path == "vfs/src/block_store.rs" || path.starts_with("vfs/src/db/");
            !allowed && without_comments(text).contains("block_data")
        })
        .map(|(path, _)| path)
        .collect();
    assert!(
        outside.is_empty(),
        "block bytes reached around vfs/src/block_store.rs in {outside:?}"
    );
}

#[test]
fn sql_lives_only_in_the_modules_the_map_names() {
    let map = architecture();
    let named: BTreeSet<String> =
        quoted_between(&map, "**Architecture Invariant:** only", "contain SQL")
            .into_iter()
            .map(|name| {
                name.trim_end_matches(".rs")
                    .trim_end_matches('/')
                    .to_owned()
            })
            .collect();
    let with_sql: BTreeSet<String> = sources("vfs/src")
        .into_iter()
        .filter(|(_, text)| holds_sql(text))
        .map(|(path, _)| top_module("vfs/src", &path))
        .collect();
    assert_eq!(
        with_sql, named,
        "the vfs modules holding SQL differ from those docs/ARCHITECTURE.md names"
    );
}

// ----------------------------------------------------------------------- layers

/// Removes `//` comments (doc comments too): a path named in prose is no import.
fn without_comments(text: &str) -> String {
    text.lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The crate's top-level modules that `text` names through `crate::` paths.
fn crate_paths(text: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut names = BTreeSet::new();
    for (at, _) in text.match_indices("crate::") {
        let rest = &text[at + "crate::".len()..];
        let Some(group) = rest.strip_prefix('{') else {
            names.insert(ident(rest));
            continue;
        };
        // `crate::{a, b::{c, d}, e}`: the first name of each item at depth 0.
        let (mut depth, mut item_start) = (0usize, true);
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => item_start = true,
                c if item_start && !c.is_whitespace() => {
                    names.insert(ident(&group[i..]));
                    item_start = false;
                }
                _ => {}
            }
        }
    }
    names
}

/// Strongly connected components of more than one module (Tarjan).
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        found: Vec<BTreeSet<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            for w in &self.edges[v] {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.stack.contains(&w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = BTreeSet::new();
                while let Some(w) = self.stack.pop() {
                    component.insert(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found
}

/// Which top-level modules of the crate in `src_dir` each one imports.
fn module_edges(src_dir: &str) -> BTreeMap<String, BTreeSet<String>> {
    let files = sources(src_dir);
    let is_root = |m: &str| m == "lib" || m == "main";
    let modules: BTreeSet<String> = files
        .iter()
        .map(|(path, _)| top_module(src_dir, path))
        .filter(|m| !is_root(m))
        .collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = modules
        .iter()
        .map(|m| (m.clone(), BTreeSet::new()))
        .collect();
    for (path, text) in &files {
        let from = top_module(src_dir, path);
        if is_root(&from) {
            continue;
        }
        for to in crate_paths(&without_comments(text)) {
            if to != from && modules.contains(&to) {
                edges.get_mut(&from).unwrap().insert(to);
            }
        }
    }
    edges
}

#[test]
fn the_modules_of_each_crate_import_one_another_without_a_circle() {
    for src_dir in PRODUCT_DIRS {
        let found = circles(&module_edges(src_dir));
        assert!(
            found.is_empty(),
            "{src_dir}: modules import one another in circles: {found:?}"
        );
    }
}

/// vfs's layers, bottom first: each module may import its own layer and those below.
/// docs/ARCHITECTURE.md draws them ("Layers of the store").
const VFS_LAYERS: &[(&str, &[&str])] = &[
    (
        "base",
        &[
            "base", "types", "error", "clock", "access", "chunker", "block",
        ],
    ),
    ("db", &["db", "compact"]),
    (
        "store",
        &[
            "store",
            "block_store",
            "content",
            "resolve",
            "change_page",
            "log",
            "staged_rows",
            "loose_blocks",
            "peer_rows",
        ],
    ),
    ("parts", &["staging", "open_files", "gate"]),
    (
        "workspace",
        &[
            "workspace",
            "staged",
            "ingest",
            "tree",
            "changes",
            "changes_full_scan",
            "peers",
            "check",
            "audit",
        ],
    ),
    ("api", &["fs", "search", "transfer"]),
];

/// The text of a source file before its tests.
fn before_tests(text: &str) -> &str {
    text.find("#[cfg(test)]").map_or(text, |at| &text[..at])
}

#[test]
fn vfs_modules_import_only_their_layer_and_those_below() {
    let layer_of: BTreeMap<&str, usize> = VFS_LAYERS
        .iter()
        .enumerate()
        .flat_map(|(at, (_, modules))| modules.iter().map(move |m| (*m, at)))
        .collect();
    let mut problems = Vec::new();
    for (path, text) in sources("vfs/src") {
        let from = top_module("vfs/src", &path);
        if from == "lib" {
            continue;
        }
        let Some(&from_layer) = layer_of.get(from.as_str()) else {
            problems.push(format!(
                "{path}: module {from} is in no layer of VFS_LAYERS"
            ));
            continue;
        };
        for to in crate_paths(&without_comments(before_tests(&text))) {
            match layer_of.get(to.as_str()) {
                None => problems.push(format!(
                    "{path}: names crate::{to} through the crate root; name its module"
                )),
                Some(&to_layer) if to_layer > from_layer => problems.push(format!(
                    "{path}: {from} ({}) imports {to} ({}), a layer above",
                    VFS_LAYERS[from_layer].0, VFS_LAYERS[to_layer].0
                )),
                Some(_) => {}
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// -------------------------------------------------------------------- functions

/// Whether `line` begins a function, and its name.
fn function_name(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    for prefix in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "const ",
        "async ",
        "unsafe ",
    ] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    let rest = rest.strip_prefix("fn ")?;
    let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
    Some(&rest[..end])
}

/// (function, lines) of every function of production code in `text` longer than the
/// limit: from its signature to the closing brace at its indentation. Test code (a
/// top-level `#[cfg(test)] mod tests` and what follows, `tests.rs` files) is left out.
fn long_functions(path: &str, text: &str) -> Vec<(String, usize)> {
    if path.ends_with("/tests.rs") {
        return Vec::new();
    }
    let all: Vec<&str> = text.lines().collect();
    let tests_start = all
        .windows(2)
        .position(|pair| pair[0] == "#[cfg(test)]" && pair[1].starts_with("mod tests"))
        .unwrap_or(all.len());
    let lines = &all[..tests_start];
    let mut out = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let Some(name) = function_name(line) else {
            continue;
        };
        // A declaration without a body (in a trait) ends its signature with `;`.
        let signature_end = lines[start..]
            .iter()
            .map(|l| l.trim_end())
            .find(|l| l.ends_with('{') || l.ends_with(';'));
        if signature_end.is_none_or(|l| l.ends_with(';')) {
            continue;
        }
        let indent = &line[..line.len() - line.trim_start().len()];
        let close = format!("{indent}}}");
        let Some(end) = lines[start + 1..].iter().position(|l| *l == close) else {
            continue;
        };
        let length = end + 2;
        if length > FUNCTION_LINES_MAX {
            out.push((name.to_owned(), length));
        }
    }
    out
}

#[test]
fn no_function_grows_past_70_lines() {
    let listed: BTreeMap<(&str, &str), usize> = LONG_FUNCTIONS
        .iter()
        .map(|&(path, name, lines)| ((path, name), lines))
        .collect();
    let mut found: BTreeMap<(String, String), usize> = BTreeMap::new();
    for dir in PRODUCT_DIRS {
        for (path, text) in sources(dir) {
            for (name, lines) in long_functions(&path, &text) {
                found.insert((path.clone(), name), lines);
            }
        }
    }
    let mut wrong = Vec::new();
    for ((path, name), &lines) in &found {
        match listed.get(&(path.as_str(), name.as_str())) {
            None => wrong.push(format!(
                "{path}: {name} is {lines} lines, past {FUNCTION_LINES_MAX}: split it"
            )),
            Some(&max) if lines > max => wrong.push(format!(
                "{path}: {name} grew to {lines} lines from {max}: split it"
            )),
            Some(&max) if lines < max => wrong.push(format!(
                "{path}: {name} is down to {lines} lines: lower its LONG_FUNCTIONS entry from {max}"
            )),
            Some(_) => {}
        }
    }
    for (&(path, name), max) in &listed {
        if !found.contains_key(&(path.to_owned(), name.to_owned())) {
            wrong.push(format!(
                "{path}: {name} ({max} lines listed) is now at most {FUNCTION_LINES_MAX} \
                 lines or gone: remove its LONG_FUNCTIONS entry"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The test files that mount through the shared harness's `Mount`: the ones that
/// `COMPUTERD_TEST_MOUNT_ARGS` reaches.
fn harness_mount_tests() -> BTreeSet<String> {
    // Spelled in two halves, so that this file does not name them whole.
    let uses_mount = [
        concat!("Mount::", "new("),
        concat!("Mount::", "with_args"),
        concat!("Mount::", "replica("),
    ];
    sources("computerd/tests")
        .into_iter()
        .filter(|(path, text)| {
            !path.contains("/common/") && uses_mount.iter().any(|call| text.contains(call))
        })
        .filter_map(|(path, _)| {
            let file = Path::new(&path).file_stem()?.to_str()?.to_owned();
            Some(file)
        })
        .collect()
}

#[test]
fn ci_runs_every_harness_mount_test_over_dev_fuse_as_well() {
    let script = std::fs::read_to_string(workspace_root().join("scripts/test.sh")).unwrap();
    let pass = script
        .split("step env COMPUTERD_TEST_MOUNT_ARGS=--no-io-uring")
        .nth(1)
        .and_then(|rest| rest.split("\nstep ").next())
        .expect("scripts/test.sh has a pass with COMPUTERD_TEST_MOUNT_ARGS=--no-io-uring");
    let in_pass: BTreeSet<String> = pass
        .split_whitespace()
        .collect::<Vec<_>>()
        .windows(2)
        .filter(|pair| pair[0] == "--test")
        .map(|pair| pair[1].to_owned())
        .collect();
    let missing: Vec<_> = harness_mount_tests()
        .difference(&in_pass)
        .cloned()
        .collect();
    assert!(
        missing.is_empty(),
        "scripts/test.sh's pass over /dev/fuse leaves out {missing:?}, which mount through \
         the harness: add them (docs/ARCHITECTURE.md says CI runs them all)"
    );
}
