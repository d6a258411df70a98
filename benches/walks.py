#!/usr/bin/env python3
"""Tree walks and short commands, with several computerd builds and ext4 in one loop.

Each target gets the same tree, shaped as fsbench's reads tree (10,000 files of about
1.5 KB in 100 directories), and a clone of a local git repository whose index is
settled (no racily clean entries, so `git status` reads no file). Then, in rounds that
alternate the targets, every command runs once per target after one untimed run:
`find -type f`, `ls -R`, `du -s` over the tree; `git status --porcelain`, `git log -5
--stat` and `grep -r` in the clone; `cat` of three files and `echo > f && rm f`.
Reports the median and the minimum wall time of each command on each target, and the
ratio of medians to ext4. Alternating in one loop keeps the noise of a shared machine
out of the ratios. With `--cold`, the kernel's caches are dropped before every timed
run (the daemons keep theirs). With `--pause MS`, every timed run follows a pause, as
an agent's commands follow its thinking: the machine is idle when the command starts.
With `--large`, the targets get two large directories instead (1,000 and 10,000 small
files), listed more pages than one: `ls -l`, `du -s`, `ls -f`, `find -type f`, `grep -r`.

    python3 benches/walks.py --computerd after=target/release/computerd
                             [--computerd "before=/tmp/computerd-old --no-poll"]
                             [--rounds 30] [--cold] [--pause MS] [--large]
                             [--repo .] [--work DIR]

A `--computerd` value is NAME=BIN, then any `computerd mount` options. A target with
`--read-only` is filled through a writable mount first, then mounted again with its
options; the commands that write skip it.

Run it as root, like the other mount benchmarks: a daemon not run by root mounts with
`default_permissions`, which changes what the kernel asks.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from scale import drop_caches

COMMANDS = {
    "find -type f": ["find", "tree", "-type", "f"],
    "ls -R": ["ls", "-R", "tree"],
    "du -s": ["du", "-s", "tree"],
    "git status": ["git", "-C", "repo", "status", "--porcelain"],
    "git log -5 --stat": ["git", "-C", "repo", "log", "-5", "--stat"],
    "grep -r": ["grep", "-r", "--count", "e", "repo"],
    "cat 3 files": ["cat", "tree/d000/f000.txt", "tree/d050/f050.txt", "tree/d099/f099.txt"],
    "echo > f && rm f": ["sh", "-c", "echo x > scratch && rm scratch"],
}
WRITING_COMMANDS = {"echo > f && rm f"}
# Options that a mount being filled cannot have.
READ_ONLY_OPTIONS = {"--read-only"}


LARGE_COMMANDS = {
    "ls -l mid": ["ls", "-l", "mid"],
    "du -s big": ["du", "-s", "big"],
    "ls -f big": ["ls", "-f", "big"],
    "find big -type f": ["find", "big", "-type", "f"],
    "grep -r big": ["grep", "-r", "--count", "x", "big"],
}


def make_large_dirs(root):
    for name, count in (("mid", 1000), ("big", 10000)):
        os.mkdir(os.path.join(root, name))
        for i in range(count):
            with open(os.path.join(root, name, f"file_{i:05}.txt"), "w") as out:
                out.write(f"x{i}\n")


def make_tree(root):
    for d in range(100):
        os.mkdir(os.path.join(root, f"d{d:03}"))
        for f in range(100):
            with open(os.path.join(root, f"d{d:03}", f"f{f:03}.txt"), "w") as out:
                for line in range(30):
                    out.write(f"line {line} of file {f} in directory {d}: {d * f * line:x}\n")


def settled_clone(source, dest):
    subprocess.run(["git", "clone", "-q", source, dest], check=True)
    # Entries whose mtime is not older than the index are re-read by every status
    # until the index is written again later: wait, then let status rewrite it.
    time.sleep(1.1)
    subprocess.run(["git", "-C", dest, "status", "--porcelain"], check=True,
                   stdout=subprocess.DEVNULL)


def prepare(directory, source, large):
    if large:
        return make_large_dirs(directory)
    os.makedirs(os.path.join(directory, "tree"))
    make_tree(os.path.join(directory, "tree"))
    settled_clone(source, os.path.join(directory, "repo"))


def mount(command, work, name, filling=False):
    """Mounts target `name`; `filling`: without the options of a read-only mount."""
    binary, *options = command.split()
    if filling:
        options = [o for o in options if o not in READ_ONLY_OPTIONS]
    db = os.path.join(work, f"{name}.db")
    mnt = os.path.join(work, name)
    subprocess.run([binary, "mount", db, mnt, "--daemon", "-q", *options], check=True,
                   stdout=subprocess.DEVNULL)
    return mnt


def is_read_only(command):
    return "--read-only" in command.split()


def time_once(argv, cwd, cold=False, pause_ms=0):
    if cold:
        drop_caches()
    time.sleep(pause_ms / 1000)
    started = time.perf_counter()
    subprocess.run(argv, cwd=cwd, check=True, stdout=subprocess.DEVNULL)
    return (time.perf_counter() - started) * 1000


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--computerd", action="append", required=True,
                        metavar="NAME=BIN", help="a computerd binary to mount, then any "
                        "mount options (repeatable)")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--cold", action="store_true",
                        help="drop the kernel's caches before every timed run")
    parser.add_argument("--pause", type=float, default=0, metavar="MS",
                        help="sleep this long before every timed run")
    parser.add_argument("--large", action="store_true",
                        help="two large directories and the walks over them instead")
    parser.add_argument("--repo", default=os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), help="the git repository to clone")
    parser.add_argument("--work", help="where the targets go (default: a temp dir)")
    args = parser.parse_args()

    work = args.work or tempfile.mkdtemp(prefix="walks.")
    targets = {"ext4": os.path.join(work, "ext4")}
    mounted = []
    try:
        os.makedirs(targets["ext4"])
        read_only = set()
        for spec in args.computerd:
            name, _, binary = spec.partition("=")
            targets[name] = mount(binary, work, name, filling=True)
            mounted.append(targets[name])
            if is_read_only(binary):
                read_only.add(name)
        for directory in targets.values():
            prepare(directory, args.repo, args.large)
        for spec in args.computerd:
            name, _, binary = spec.partition("=")
            if name in read_only:
                subprocess.run(["umount", targets[name]], check=True)
                mount(binary, work, name)
        commands = LARGE_COMMANDS if args.large else COMMANDS
        runs = [(t, c) for t in targets for c in commands
                if not (t in read_only and c in WRITING_COMMANDS)]
        times = {run: [] for run in runs}
        for target, command in runs:
            time_once(commands[command], targets[target])
        for _ in range(args.rounds):
            for command, argv in commands.items():
                for target, directory in targets.items():
                    if (target, command) in times:
                        elapsed = time_once(argv, directory, args.cold, args.pause)
                        times[(target, command)].append(elapsed)
        report(targets, commands, times, args.rounds, args.cold, args.pause)
    finally:
        for mnt in mounted:
            subprocess.run(["umount", mnt], check=False)
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


def report(targets, commands, times, rounds, cold, pause_ms):
    caches = "cold" if cold else "warm"
    after = f", each after a {pause_ms:g} ms pause" if pause_ms else ""
    print(f"{caches}{after}: median (min) ms of {rounds} rounds; ratio of medians to ext4")
    print("| command | " + " | ".join(targets) + " |")
    print("|---|" + "---:|" * len(targets))
    for command in commands:
        base = statistics.median(times[("ext4", command)])
        cells = []
        for target in targets:
            runs = times.get((target, command))
            if not runs:
                cells.append("-")
                continue
            median = statistics.median(runs)
            ratio = "" if target == "ext4" else f" x{median / base:.2f}"
            cells.append(f"{median:.2f} ({min(runs):.2f}){ratio}")
        print(f"| {command} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
