//! `computerd exec --backend js`: a module run by the workspace's owner, its value on
//! stdout, its writes seen through the mount at once, and over the wire from a server.

mod common;

use common::{computerd, exec, text, Mount};

#[test]
fn a_module_of_the_workspace_runs_with_its_input_and_prints_its_value() {
    let m = Mount::new();
    m.sh(
        "mkdir lib && echo 'export const twice = (x) => 2 * x;' > lib/twice.js && \
         echo old > lib/out.txt && cat lib/out.txt",
    );
    std::fs::write(
        m.path("lib/main.js"),
        "import { twice } from './twice.js';\nimport fs from 'fs';\n\
         export default async ({ n }) => {\n  console.log('working');\n  \
         await fs.writeFile('lib/out.txt', String(twice(n)));\n  return { n: twice(n) };\n};\n",
    )
    .unwrap();
    let db = m.db.to_str().unwrap();
    let out = computerd([
        "exec",
        db,
        "--backend",
        "js",
        "--input",
        r#"{"n": 21}"#,
        "--file",
        "lib/main.js",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "working\n{\"n\":42}\n");
    assert_eq!(
        m.sh("cat lib/out.txt"),
        "42",
        "the kernel's cached page was kept"
    );

    let out = exec(
        &m.db,
        &["--backend", "js"],
        "export default () => { throw new Error('no') }",
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("js: Error: no"),
        "{}",
        text(&out.stderr)
    );
    let out = exec(&m.db, &["--input", "{}"], "true");
    assert!(text(&out.stderr).contains("--input and --file are for --backend js"));
}

#[test]
fn a_servers_js_backend_answers_across_the_wire() {
    let mut server = common::Server::start();
    server.fs_ok(&["write", "/n.txt"], b"7");
    let token = server.token_file.to_str().unwrap().to_owned();
    let out = computerd([
        "exec",
        "--remote",
        &server.address,
        "--token-file",
        &token,
        "--backend",
        "js",
        "--",
        "import { readFile } from 'fs';\nexport default async () => Number(await readFile('n.txt', 'utf8')) * 6;",
    ]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stderr),
        server.server_log()
    );
    assert_eq!(text(&out.stdout), "42\n");
    server.stop();
}
