//! Criterion benchmarks of the shell backend inside the daemon: the latency of one exec
//! through `Runtimes` (thread, interpreter, the script on the store, the result), on a
//! workspace database in a temp dir on disk; and of the same scripts on the Linux
//! backend (its warm sandbox, bash) over the same tree in a plain directory on the
//! host's disk: no FUSE mount, so a lower bound of what a mount's sandbox costs.
//!
//! ```sh
//! cargo bench -p computer-benches --bench shell
//! ```
//!
//! Scripts: `cat` of a small file, `ls -R` of 1,000 files (10 directories of 100),
//! `grep -rn` over 36,000 files (36 directories of 1,000, 1 KiB of text each, one line
//! in 100 files matching), and an agent's turn (ls, cat, grep, a `sed -i` edit, wc).
//! The same scripts on the Linux backend and on the host are timed by
//! `benches/shell.py`; docs/benchmarks.md has both. The js backend's group: a trivial
//! module, and one that reads and writes 1,000 small files through `fs`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{open, scratch, text_bytes};
use computer_runtimes::js::{JsBackend, JsPolicy};
use computer_runtimes::linux::{LinuxBackend, LinuxPolicy, LocalView};
use computer_runtimes::shell::{ShellBackend, ShellPolicy};
use computer_runtimes::{ExecOptions, Runtimes};
use computer_vfs::{ChunkSizes, MkdirOptions, Workspace};
use criterion::{criterion_group, criterion_main, Criterion, SamplingMode};

/// An agent's turn: look around, read, search, edit, count.
pub const AGENT_TURN: &str = "ls src >/dev/null; cat src/main.rs >/dev/null; \
     grep -rn TODO src >/dev/null; sed -i 's/TODO/DONE/' src/main.rs; wc -l src/*.rs >/dev/null";

/// The tree the scripts run on, laid by `write(path, content)` and `dir(path)`.
fn lay_tree(write: &dyn Fn(&str, &[u8]), dir: &dyn Fn(&str)) {
    write("/small.txt", b"hello\n");
    dir("/tree");
    for d in 0..10 {
        dir(&format!("/tree/d{d}"));
        for f in 0..100 {
            write(&format!("/tree/d{d}/f{f}"), format!("{f}\n").as_bytes());
        }
    }
    dir("/big");
    for d in 0..36 {
        dir(&format!("/big/d{d}"));
        for f in 0..1000 {
            let mut text = text_bytes(1024, (d * 1000 + f) as u64);
            if f % 100 == 0 {
                text.extend_from_slice(b"\nneedle here\n");
            }
            write(&format!("/big/d{d}/f{f}.txt"), &text);
        }
    }
    dir("/src");
    write("/src/main.rs", b"fn main() {\n    // TODO: parse args\n}\n");
    write(
        "/src/lib.rs",
        b"pub fn add(a: i32, b: i32) -> i32 { a + b }\n",
    );
}

fn lay_in_store(ws: &Workspace) {
    let fs = ws.fs();
    lay_tree(
        &|path, content| fs.write_file(path, content).unwrap(),
        &|path| fs.mkdir(path, MkdirOptions::default()).unwrap(),
    );
}

fn lay_on_disk(root: &std::path::Path) {
    let at = |path: &str| root.join(path.trim_start_matches('/'));
    lay_tree(
        &|path, content| std::fs::write(at(path), content).unwrap(),
        &|path| std::fs::create_dir(at(path)).unwrap(),
    );
}

const SCRIPTS: &[(&str, &str)] = &[
    ("true", "true"),
    ("cat_small_file", "cat small.txt"),
    ("ls_R_1000_files", "ls -R tree"),
    ("agent_turn", AGENT_TURN),
];
const GREP: &str = "grep -rn needle big | wc -l";

fn bench_scripts(c: &mut Criterion, name: &str, rt: &Runtimes) {
    let mut group = c.benchmark_group(name);
    group
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(500));
    for (name, script) in SCRIPTS {
        group.bench_function(*name, |b| b.iter(|| run(rt, script)));
    }
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(20));
    group.bench_function("grep_rn_36000_files", |b| b.iter(|| run(rt, GREP)));
    group.finish();
}

/// One exec, every event read as a caller reads them, until its result.
fn run(rt: &Runtimes, script: &str) {
    let mut handle = rt.exec(script, ExecOptions::default()).unwrap();
    for _ in handle.by_ref() {}
    let result = handle.result();
    assert_eq!(result.exit_code, 0, "{script}: {result:?}");
}

fn shell(c: &mut Criterion) {
    let dir = scratch();
    let ws = open(&dir.path().join("ws.db"), ChunkSizes::DEFAULT);
    lay_in_store(&ws);
    let mut rt = Runtimes::new();
    let backend = ShellBackend::new(ws.clone(), ShellPolicy::default(), None).unwrap();
    rt.register(Arc::new(backend)).unwrap();
    bench_scripts(c, "shell", &rt);
}

fn linux(c: &mut Criterion) {
    let dir = scratch();
    lay_on_disk(dir.path());
    let mut rt = Runtimes::new();
    let view = Arc::new(LocalView::new(dir.path()));
    let backend = LinuxBackend::new(view, LinuxPolicy::default());
    rt.register(Arc::new(backend)).unwrap();
    bench_scripts(c, "linux_on_host_dir", &rt);
    rt.close(Duration::from_secs(5));
}

/// Reads and rewrites the 1,000 files of `tree/`.
const JS_FILES: &str = r#"
import { readdir, readFile, writeFile } from 'fs';
export default async () => {
  let n = 0;
  for (const d of await readdir('tree')) {
    for (const f of await readdir(`tree/${d}`)) {
      const text = await readFile(`tree/${d}/${f}`, 'utf8');
      await writeFile(`tree/${d}/${f}`, text);
      n += 1;
    }
  }
  return n;
};
"#;

fn js(c: &mut Criterion) {
    let dir = scratch();
    let ws = open(&dir.path().join("ws.db"), ChunkSizes::DEFAULT);
    lay_in_store(&ws);
    let mut rt = Runtimes::new();
    rt.register(Arc::new(JsBackend::new(
        ws.clone(),
        JsPolicy::default(),
        None,
    )))
    .unwrap();
    let mut group = c.benchmark_group("js");
    group
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(500));
    group.bench_function("trivial_module", |b| {
        b.iter(|| run(&rt, "export default (x) => x"))
    });
    group.sample_size(10);
    group.bench_function("read_and_write_1000_files", |b| {
        b.iter(|| run(&rt, JS_FILES))
    });
    group.finish();
}

criterion_group!(benches, shell, linux, js);
criterion_main!(benches);
