#!/usr/bin/env python3
"""End-to-end latency of the shell backend against the Linux backend and the host, in
one run on one machine.

A workspace is mounted and filled (a small file, 1,000 files in 10 directories,
36,000 files of 1 KiB in 36 directories, a two-file `src/`, a 20-file git
repository); the same tree is copied to a plain directory on the host's disk. Each
script then runs `--reps` times, round-robin so the noise of a shared machine falls
on all three alike:

- host: `bash -c SCRIPT` in the plain copy;
- linux: `computerd exec DB --backend linux -- SCRIPT` (a computerd process, the
  mount's warm sandbox, bash on the FUSE mount);
- shell: `computerd exec DB --backend shell -- SCRIPT` (a computerd process, the
  shell inside the mount's daemon, on the store).

Inside the daemon: the median duration the audit trail recorded for each backend and
script in the same run (whole milliseconds: the shell's is finer in
`cargo bench -p computer-benches --bench shell`).

Then a mix of 50 scripts, 45 of the agent kind and 5 that need Linux (`git status`,
`git log`), is run once on `--backend auto` and once all on `--backend linux`, and
timed whole.

    python3 benches/shell.py [--reps 20] [--computerd target/release/computerd]

Needs root, FUSE and bubblewrap. Prints markdown tables of medians, ms.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

AGENT_TURN = ("ls src >/dev/null; cat src/main.rs >/dev/null; grep -rn TODO src >/dev/null; "
              "sed -i 's/TODO/DONE/' src/main.rs; sed -i 's/DONE/TODO/' src/main.rs; "
              "wc -l src/*.rs >/dev/null")

SCRIPTS = [
    ("cat a small file", "cat small.txt"),
    ("ls -R of 1,000 files", "ls -R tree >/dev/null"),
    ("grep -rn over 36,000 files", "grep -rn needle big | wc -l"),
    ("an agent's turn (ls, cat, grep, sed -i, wc)", AGENT_TURN),
]

AGENT_MIX = [
    "cat small.txt",
    "ls -R tree | wc -l",
    "grep -rn TODO src",
    AGENT_TURN,
    "find src -name '*.rs' | sort",
    "head -3 src/main.rs && wc -c src/lib.rs",
    "sed -n '1,2p' src/lib.rs",
    "ls tree/d3 | sort | tail -2",
    "echo note >> notes.txt && tail -1 notes.txt",
]
LINUX_MIX = ["git -C repo status --porcelain", "git -C repo log --oneline | wc -l"]

SETUP = r"""
set -e
echo hello > small.txt
: > notes.txt
for d in $(seq 10); do mkdir -p tree/d$d; for f in $(seq 100); do echo $f > tree/d$d/f$f; done; done
mkdir src
printf 'fn main() {\n    // TODO: parse args\n}\n' > src/main.rs
printf 'pub fn add(a: i32, b: i32) -> i32 { a + b }\n' > src/lib.rs
python3 - <<'EOF'
import os
line = b"lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod\n"
for d in range(36):
    os.makedirs(f"big/d{d}", exist_ok=True)
    for f in range(1000):
        body = line * 14 + (b"needle here\n" if f % 100 == 0 else b"")
        with open(f"big/d{d}/f{f}.txt", "wb") as out:
            out.write(body)
EOF
mkdir repo && cd repo && git init -q && for i in $(seq 20); do echo $i > f$i; done
git add -A && git -c user.email=a@b -c user.name=a commit -qm init
"""


def seconds(argv, cwd=None):
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    return time.perf_counter() - start


def round_robin(runs, reps):
    """Each (name, argv, cwd) once to warm up, then `reps` times in turn: medians, ms."""
    for _, argv, cwd in runs:
        seconds(argv, cwd)
    samples = {name: [] for name, _, _ in runs}
    for _ in range(reps):
        for name, argv, cwd in runs:
            samples[name].append(seconds(argv, cwd) * 1000)
    return {name: statistics.median(values) for name, values in samples.items()}


def audited_ms(computerd, db):
    """Median duration the trail recorded, ms, by (backend, script)."""
    out = subprocess.run([computerd, "audit", db, "--json", "--limit", "1000"], check=True,
                         capture_output=True, text=True).stdout
    durations = {}
    for line in out.splitlines():
        record = json.loads(line)
        if record["kind"] == "exec":
            key = (record["backend"], record["script"])
            durations.setdefault(key, []).append(record["duration_ms"])
    return {key: statistics.median(values) for key, values in durations.items()}


def mix_seconds(computerd, db, backend):
    scripts = (AGENT_MIX * 5)[:45] + (LINUX_MIX * 3)[:5]
    start = time.perf_counter()
    for script in scripts:
        subprocess.run([computerd, "exec", db, "--backend", backend, "--", script],
                       check=True, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--computerd", default="target/release/computerd")
    args = parser.parse_args()
    computerd = os.path.abspath(args.computerd)
    work = tempfile.mkdtemp(prefix="shell-bench-")
    db, mnt, host = (os.path.join(work, name) for name in ("ws.db", "mnt", "host"))
    os.makedirs(mnt)
    subprocess.run([computerd, "mount", db, mnt, "--daemon"], check=True)
    try:
        subprocess.run(["bash", "-c", SETUP], cwd=mnt, check=True)
        shutil.copytree(mnt, host, symlinks=True)
        rows = []
        for label, script in SCRIPTS:
            medians = round_robin([
                ("host", ["bash", "-c", script], host),
                ("linux", [computerd, "exec", db, "--backend", "linux", "--", script], None),
                ("shell", [computerd, "exec", db, "--backend", "shell", "--", script], None),
            ], args.reps)
            rows.append((label, script, medians))
        inside = audited_ms(computerd, db)
        print("| script | host | linux | shell | linux / shell | in the daemon: linux | shell |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for label, script, medians in rows:
            ratio = medians["linux"] / medians["shell"]
            print(f"| {label} | {medians['host']:.1f} | {medians['linux']:.1f} | "
                  f"{medians['shell']:.1f} | {ratio:.1f}x | {inside[('linux', script)]:.0f} | "
                  f"{inside[('shell', script)]:.0f} |")
        auto = mix_seconds(computerd, db, "auto")
        linux = mix_seconds(computerd, db, "linux")
        print()
        print("| 50 scripts, 45 agent-kind + 5 git | auto | all on linux | linux / auto |")
        print("|---|---:|---:|---:|")
        print(f"| whole mix, s | {auto:.2f} | {linux:.2f} | {linux / auto:.1f}x |")
    finally:
        subprocess.run([computerd, "umount", mnt], check=False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
