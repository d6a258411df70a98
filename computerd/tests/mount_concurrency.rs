//! Several processes writing into one mount at the same time.

mod common;

use common::Mount;

/// One writer: waits for `go`, then writes 200 files into `shared/` and appends one short
/// line per file to `log` through its own O_APPEND descriptor (one write(2) per line).
const WRITER: &str = r#"
import os, sys, time
w = int(sys.argv[1])
deadline = time.time() + 60
while not os.path.exists("go"):
    if time.time() > deadline:
        sys.exit("no go")
    time.sleep(0.001)
log = os.open("log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
for i in range(200):
    size = 2 << 20 if i == 100 else 1 + (i * 37) % 500
    data = (f"writer {w} file {i}\n" * size).encode()
    with open(f"shared/w{w}-{i:03d}", "wb") as f:
        f.write(data)
    line = f"w{w} i{i:03d} {'x' * (i % 40)}\n".encode()
    assert os.write(log, line) == len(line)
os.close(log)
"#;

/// Checks every file and the log after the writers are done.
const VERIFY: &str = r#"
import os, re
problems = []
for w in range(4):
    for i in range(200):
        size = 2 << 20 if i == 100 else 1 + (i * 37) % 500
        want = (f"writer {w} file {i}\n" * size).encode()
        name = f"shared/w{w}-{i:03d}"
        try:
            with open(name, "rb") as f:
                got = f.read()
        except OSError as err:
            problems.append(f"{name}: {err}")
            continue
        if got != want:
            problems.append(f"{name}: {len(got)} bytes, want {len(want)}; starts {got[:40]!r}")
assert sorted(os.listdir("shared")) == sorted(f"w{w}-{i:03d}" for w in range(4) for i in range(200)), \
    f"{len(os.listdir('shared'))} entries in shared/"

with open("log", "rb") as f:
    data = f.read()
assert data.endswith(b"\n"), data[-80:]
nul = data.find(b"\0")
assert nul < 0, f"NUL bytes in the log from offset {nul}: {data[max(0, nul - 40):nul + 40]!r}"
lines = data.decode().split("\n")[:-1]
pattern = re.compile(r"w([0-3]) i(\d{3}) (x*)$")
seen = {w: [] for w in range(4)}
for n, line in enumerate(lines):
    match = pattern.match(line)
    if not match or len(match.group(3)) != int(match.group(2)) % 40:
        problems.append(f"log line {n} torn or garbled: {line!r}")
        continue
    seen[int(match.group(1))].append(int(match.group(2)))
for w, order in seen.items():
    if order != list(range(200)):
        problems.append(f"writer {w}: {len(order)} log lines, not 0..199 in order: {order[:10]}...")
if len(lines) != 800:
    problems.append(f"{len(lines)} log lines, want 800")
assert not problems, "\n".join(problems[:50])
print("ok", len(lines), "lines")
"#;

/// 4 processes × 200 files plus 800 O_APPEND lines in one shared log, all at once.
#[test]
fn four_writers_and_a_shared_append_log() {
    let mut m = Mount::new();
    let writer = m.scratch.join("writer.py");
    std::fs::write(&writer, WRITER).unwrap();
    m.sh(&format!(
        r#"
mkdir shared
pids=()
for w in 0 1 2 3; do python3 {writer} "$w" & pids+=($!); done
sleep 0.2
touch go
status=0
for p in "${{pids[@]}}"; do wait "$p" || status=$?; done
exit $status
"#,
        writer = writer.display()
    ));
    m.py(VERIFY);
    m.unmount();
    m.mount(&[]);
    m.py(VERIFY);
    m.unmount();
    m.check_db();
}

/// The same with `--no-writeback-cache`: every write(2) reaches the daemon, which then
/// computes O_APPEND offsets itself.
#[test]
fn four_writers_without_writeback_cache() {
    let mut m = Mount::with_args(&["--no-writeback-cache"]);
    let writer = m.scratch.join("writer.py");
    std::fs::write(&writer, WRITER).unwrap();
    m.sh(&format!(
        r#"
mkdir shared
pids=()
for w in 0 1 2 3; do python3 {writer} "$w" & pids+=($!); done
sleep 0.2
touch go
status=0
for p in "${{pids[@]}}"; do wait "$p" || status=$?; done
exit $status
"#,
        writer = writer.display()
    ));
    m.py(VERIFY);
    m.unmount();
    m.mount(&["--no-writeback-cache"]);
    m.py(VERIFY);
    m.unmount();
    m.check_db();
}
