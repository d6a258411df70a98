#!/usr/bin/env python3
"""Latency of `computerd exec` (the Linux backend) against the same command run
directly on the host, in the same mounted workspace, in the same run.

Warm: the workspace is mounted, each command runs `--reps` times after a warm-up, by
`computerd exec DB -- CMD` (a computerd process, the mount's warm sandbox, sh) and by
`sh -c CMD` in the mount, alternately. The mount's first exec, which starts its
sandbox, is timed once. Cold: `computerd exec` on a free database, which mounts it for the command
and takes the mount down again.

Served: the same database served by `computerd serve` on the loopback, each command run
by `computerd exec --remote ADDR -- CMD` (the server runs it over its warm replica,
syncing the replica before and after) and by `sh -c CMD` in a plain copy of the tree on
the host's disk, alternately; the server's first exec (mounting its replica, starting
its sandbox) is timed once, and `--remote --replica` (a replica mounted here for each
command) a few times.

    python3 benches/exec.py [--reps 20] [--work DIR] [--computerd target/release/computerd]
                            [--mount-args "--no-io-uring"]

Needs root and bubblewrap. Prints a markdown table of medians (and minimums), ms.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import time

COMMANDS = [
    ("true", "true"),
    ("cat a small file", "cat small.txt"),
    ("ls -R of 1,000 files", "ls -R tree > /dev/null"),
    ("git status in a 100-file repository", "git -C repo status --porcelain"),
]

SETUP = r"""
set -e
echo hello > small.txt
for d in $(seq 10); do mkdir -p tree/d$d; for f in $(seq 100); do echo $f > tree/d$d/f$f; done; done
mkdir repo && cd repo && git init -q && for i in $(seq 100); do echo $i > f$i; done
git add -A && git -c user.email=a@b -c user.name=a commit -qm init
"""


def timed(argv, cwd=None):
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    return (time.perf_counter() - start) * 1000


def paired(host_argv, ours_argv, reps, cwd):
    """Both commands `reps` times after a warm-up each, alternating, so that the noise
    of a shared machine falls on both alike."""
    timed(host_argv, cwd)
    timed(ours_argv, cwd)
    host, ours = [], []
    for _ in range(reps):
        host.append(timed(host_argv, cwd))
        ours.append(timed(ours_argv, cwd))
    return host, ours


def cell(samples):
    return f"{statistics.median(samples):.1f} ({min(samples):.1f})"


def rows(label, ours, cwd, reps):
    """One table row per command: `sh -c CMD` in `cwd` against `ours + [CMD]`."""
    for name, cmd in COMMANDS:
        host, timed_ours = paired(["sh", "-c", cmd], ours + [cmd], reps, cwd)
        overhead = statistics.median(timed_ours) - statistics.median(host)
        print(f"| {label}{name} | {cell(host)} | {cell(timed_ours)} | {overhead:.1f} |", flush=True)


def serve(computerd, db, work):
    """Starts `computerd serve` on a free loopback port; returns (process, address, token file)."""
    token = os.path.join(work, "token")
    with open(token, "w") as f:
        f.write("bench-token-0123456789\n")
    os.chmod(token, 0o600)
    server = subprocess.Popen(
        [computerd, "serve", db, "--listen", "tcp:127.0.0.1:0", "--token-file", token],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = server.stdout.readline().strip()
    if not line.startswith("listening on "):
        server.kill()
        raise SystemExit(f"computerd serve did not start: {line!r}")
    return server, line.removeprefix("listening on "), token


def served(computerd, db, work, reps):
    host_copy = os.path.join(work, "host")
    server, address, token = serve(computerd, db, work)
    remote = [computerd, "exec", "--remote", address, "--token-file", token]
    try:
        first = timed(remote + ["--", "true"])
        print(f"| served: `true`, the server's first exec (mounts its replica, starts the sandbox) | | {first:.1f} | |")
        rows("served: ", remote + ["--"], host_copy, reps)
        here = [timed(remote + ["--replica", "--", "true"]) for _ in range(max(3, reps // 4))]
        print(f"| `--remote --replica`: `true` (a replica mounted here for the command) | | {cell(here)} | |")
    finally:
        server.terminate()
        server.wait(timeout=60)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--work", default="/tmp/computer-execbench")
    parser.add_argument("--computerd", default="target/release/computerd")
    parser.add_argument("--mount-args", default="",
                        help="options for the warm mount, e.g. --no-io-uring")
    args = parser.parse_args()
    computerd = os.path.abspath(args.computerd)
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    db, mnt = os.path.join(args.work, "ws.db"), os.path.join(args.work, "mnt")
    subprocess.run([computerd, "init", db], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([computerd, "mount", db, mnt, "--daemon", *args.mount_args.split()],
                   check=True, stdout=subprocess.DEVNULL)
    try:
        subprocess.run(["sh", "-c", SETUP], cwd=mnt, check=True)
        shutil.copytree(mnt, os.path.join(args.work, "host"), symlinks=True)
        # The mount's first exec starts its warm sandbox.
        first = timed([computerd, "exec", db, "--", "true"])
        print("| command | host ms | computerd exec ms | overhead ms |")
        print("|---|---:|---:|---:|")
        print(f"| `true`, the mount's first exec (starts the sandbox) | | {first:.1f} | |")
        rows("", [computerd, "exec", db, "--"], mnt, args.reps)
    finally:
        subprocess.run([computerd, "umount", mnt], check=True)
    cold = [timed([computerd, "exec", db, "--", "true"]) for _ in range(max(3, args.reps // 4))]
    print(f"| `true` on a free database (mount, sandbox, unmount) | | {cell(cold)} | |")
    served(computerd, db, args.work, args.reps)
    shutil.rmtree(args.work, ignore_errors=True)


if __name__ == "__main__":
    main()
