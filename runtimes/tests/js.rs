//! The js backend on a workspace store: input and value, `fs` round trips the other
//! backends see, imports from the workspace, each limit, and what stays out of reach.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::collect;
use computer_runtimes::js::{JsBackend, JsLimits, JsPolicy, EXIT_JS_LIMIT, EXIT_JS_THREW};
use computer_runtimes::{ExecOptions, ExecResult, ExecStatus, Runtimes};
use computer_vfs::{MkdirOptions, Workspace};

fn workspace() -> Workspace {
    let ws = Workspace::open_in_memory(Default::default()).unwrap();
    let fs = ws.fs();
    fs.mkdir("/lib", MkdirOptions::default()).unwrap();
    fs.write_file(
        "/lib/math.js",
        "import { k } from './k.js';\nexport const add = (a, b) => a + b + k;\n",
    )
    .unwrap();
    fs.write_file("/lib/k.js", "export const k = 100;\n")
        .unwrap();
    fs.write_file("/data.txt", "from the store\n").unwrap();
    ws
}

fn js(ws: &Workspace, limits: JsLimits) -> Runtimes {
    let mut runtimes = Runtimes::new();
    let policy = JsPolicy {
        limits,
        ..JsPolicy::default()
    };
    runtimes
        .register(Arc::new(JsBackend::new(ws.clone(), policy, None)))
        .unwrap();
    runtimes
}

/// Runs `source` with `input`: stdout, stderr and the result.
fn run(
    rt: &Runtimes,
    source: &str,
    input: &str,
    options: ExecOptions,
) -> (String, String, ExecResult) {
    let options = ExecOptions {
        stdin: Some(input.as_bytes().to_vec()),
        ..options
    };
    let mut handle = rt.exec(source, options).unwrap();
    let (out, err) = collect(&mut handle);
    (out, err, handle.result())
}

#[test]
fn the_default_export_gets_the_input_and_its_value_is_the_result() {
    let ws = workspace();
    let rt = js(&ws, JsLimits::default());
    let source = "export default async ({ xs }) => {\n  console.log('summing', xs.length, { xs });\n  \
                  console.error('to stderr');\n  await null;\n  return { sum: xs.reduce((a, b) => a + b, 0) };\n};\n";
    let (out, err, result) = run(&rt, source, r#"{"xs": [1, 2, 3]}"#, ExecOptions::default());
    assert_eq!(out, "summing 3 {\"xs\":[1,2,3]}\n");
    assert_eq!(err, "to stderr\n");
    assert_eq!(result.exit_code, 0, "{err}");
    assert_eq!(result.value.as_deref(), Some(r#"{"sum":6}"#));
    assert_eq!(result.backend, "js");
    // No input is null; a module that throws fails with the error on stderr.
    let (_, _, result) = run(&rt, "export default (x) => x", "", ExecOptions::default());
    assert_eq!(result.value.as_deref(), Some("null"));
    let (_, err, result) = run(
        &rt,
        "export default () => { throw new TypeError('bad') }",
        "",
        ExecOptions::default(),
    );
    assert_eq!(
        (result.exit_code, result.status),
        (EXIT_JS_THREW, ExecStatus::Failed)
    );
    assert!(err.starts_with("js: TypeError: bad"), "{err}");
    assert_eq!(result.value, None);
    let (_, err, _) = run(&rt, "export const x = 1;", "", ExecOptions::default());
    assert!(err.contains("no default export"), "{err}");
}

#[test]
fn fs_works_on_the_store_and_imports_come_from_the_workspace() {
    let ws = workspace();
    let rt = js(&ws, JsLimits::default());
    let source = r#"
import fs from 'fs';
import { readFile, writeFile, stat } from 'node:fs/promises';
import { add } from './lib/math.js';
export default async () => {
  const text = await readFile('data.txt', 'utf8');
  await fs.mkdir('out/deep', { recursive: true });
  await writeFile('/workspace/out/deep/a.txt', text.toUpperCase());
  await fs.appendFile('out/deep/a.txt', new Uint8Array([33, 10]));
  await fs.copyFile('out/deep/a.txt', 'out/b.txt');
  await fs.rename('out/b.txt', 'out/c.txt');
  await fs.symlink('deep/a.txt', 'out/link');
  const s = await stat('out/deep/a.txt');
  let missing;
  try { await readFile('nope.txt') } catch (e) { missing = [e.code, e.syscall, e.message] }
  await fs.rm('out/deep', { recursive: true });
  return { add: add(1, 2), names: await fs.readdir('out'), size: s.size, file: s.isFile(),
           link: await fs.readlink('out/link'), bytes: (await readFile('out/c.txt')).length, missing };
};
"#;
    let (_, err, result) = run(&rt, source, "", ExecOptions::default());
    assert_eq!(result.exit_code, 0, "{err}");
    let value: serde_json::Value = serde_json::from_str(result.value.as_deref().unwrap()).unwrap();
    assert_eq!(value["add"], 103);
    assert_eq!(value["names"], serde_json::json!(["c.txt", "link"]));
    assert_eq!(
        (value["size"].as_u64(), value["file"].as_bool()),
        (Some(17), Some(true))
    );
    assert_eq!(value["link"], "deep/a.txt");
    assert_eq!(value["bytes"], 17);
    assert_eq!(
        value["missing"],
        serde_json::json!([
            "ENOENT",
            "open",
            "ENOENT: no such file or directory, open 'nope.txt'"
        ])
    );
    // The store holds what the module wrote: every other backend sees it.
    assert_eq!(
        ws.fs().read_to_string("/out/c.txt").unwrap(),
        "FROM THE STORE\n!\n"
    );
    assert!(!ws.fs().exists("/out/deep").unwrap());
}

#[test]
fn each_limit_ends_the_run_with_a_message() {
    let ws = workspace();
    let limits = JsLimits {
        memory_bytes_max: 32 << 20,
        output_bytes_max: 1000,
        value_bytes_max: 100,
        input_bytes_max: 100,
        timeout: Some(Duration::from_millis(300)),
        ..JsLimits::default()
    };
    let rt = js(&ws, limits);
    let cases = [
        (
            "export default () => { const a = []; while (true) a.push(new Array(1e6).fill(1)); }",
            "",
            "memory",
        ),
        (
            "export default () => { while (true) console.log('x'.repeat(100)); }",
            "",
            "output",
        ),
        ("export default () => 'x'.repeat(200)", "", "the value"),
        ("export default (x) => x", &"1".repeat(200), "the input"),
    ];
    for (source, input, said) in cases {
        let started = Instant::now();
        let (_, err, result) = run(&rt, source, input, ExecOptions::default());
        assert_eq!(result.exit_code, EXIT_JS_LIMIT, "{source}: {err}");
        assert!(
            err.contains("limit reached") && err.contains(said),
            "{source}: {err}"
        );
        assert!(started.elapsed() < Duration::from_secs(5), "{source}");
    }
}

#[test]
fn kill_and_timeouts_stop_a_busy_loop_even_one_that_catches() {
    let ws = workspace();
    let rt = js(&ws, JsLimits::default());
    let handle = rt
        .exec(
            "export default () => { for (;;) {} }",
            ExecOptions::default(),
        )
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    handle.kill(libc::SIGTERM).unwrap();
    let result = handle.result();
    assert_eq!(
        (result.status, result.exit_code),
        (ExecStatus::Cancelled, 128 + libc::SIGTERM)
    );
    let options = ExecOptions {
        timeout: Some(Duration::from_millis(200)),
        ..ExecOptions::default()
    };
    let (_, _, result) = run(&rt, "export default () => { for (;;) {} }", "", options);
    assert_eq!(result.status, ExecStatus::TimedOut);
    // The policy's timeout, against a loop that tries to outlive the interrupt.
    let limits = JsLimits {
        timeout: Some(Duration::from_millis(200)),
        ..JsLimits::default()
    };
    let rt = js(&ws, limits);
    let source =
        "export default () => { for (;;) { try { for (;;) {} } catch (e) {} finally { } } }";
    let started = Instant::now();
    let (_, _, result) = run(&rt, source, "", ExecOptions::default());
    assert_eq!(
        (result.status, result.exit_code),
        (ExecStatus::TimedOut, 128 + libc::SIGTERM)
    );
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[test]
fn the_host_the_network_and_processes_are_out_of_reach() {
    let ws = workspace();
    let rt = js(&ws, JsLimits::default());
    for name in [
        "child_process",
        "os",
        "std",
        "http",
        "../../etc/passwd.js",
        "/etc/passwd",
    ] {
        let source = format!("import * as m from '{name}';\nexport default () => 1;");
        let (_, err, result) = run(&rt, &source, "", ExecOptions::default());
        assert_eq!(result.exit_code, EXIT_JS_THREW, "{name}: {err}");
    }
    let source = r#"
import { readFile } from 'fs';
export default async () => {
  const globals = ['fetch', 'require', 'process', 'XMLHttpRequest', 'WebSocket', 'std', 'os']
    .filter((g) => typeof globalThis[g] !== 'undefined');
  const reads = [];
  for (const p of ['/etc/passwd', '../../../etc/passwd', '/workspace/../etc/passwd']) {
    try { reads.push((await readFile(p, 'utf8')).slice(0, 10)) } catch (e) { reads.push(e.code) }
  }
  return { globals, reads };
};
"#;
    let (_, err, result) = run(&rt, source, "", ExecOptions::default());
    assert_eq!(
        result.value.as_deref(),
        Some(r#"{"globals":[],"reads":["ENOENT","ENOENT","ENOENT"]}"#),
        "{err}"
    );
}
