#!/usr/bin/env python3
"""Where a burst of small-file creations goes: a loop of `os.open(O_CREAT | O_WRONLY)`,
one short `write`, `close`, in a fresh directory of a computerd mount and in one of the
host's file system, the two alternating round after round. For the mount it also
reports the CPU the daemon spent per file, by thread (queue threads, ingest worker,
committer), from /proc/PID/task/*/stat before and after each round.

    python3 benches/create_loop.py --mount MNT --host DIR [--files 5000] [--rounds 3]

MNT is a mounted computerd workspace (its daemon is found by its mount point); DIR a
directory on the disk to compare with, best the one holding the workspace. Each round
makes new directories `create-N` under both and leaves them (delete them afterwards: on
ext4 without a journal, a mass deletion slows the creations of the next minutes, see
docs/benchmarks.md).
"""

import argparse
import os
import sys
import time

CONTENT = b"hello world\n" * 10
# Clock ticks per second of /proc/PID/task/TID/stat's utime and stime.
TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


def daemon_pid(mount):
    """The computerd process serving `mount`: one whose command line names it, relative
    paths taken from the process's own working directory."""
    mount = os.path.realpath(mount)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if not args or os.path.basename(args[0]) != "computerd" or "mount" not in args:
            continue
        if any(os.path.realpath(os.path.join(cwd, a)) == mount for a in args[1:]):
            return int(pid)
    sys.exit(f"create_loop: no computerd daemon serves {mount}")


def cpu_by_thread(pid):
    """CPU seconds used so far by each thread name of `pid` (threads of one name summed)."""
    totals = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                # The name field may hold spaces; the counters follow its closing paren.
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        used = (int(fields[11]) + int(fields[12])) / TICKS_PER_SECOND
        totals[name] = totals.get(name, 0.0) + used
    return totals


def create_files(directory, files):
    """Seconds per file for creating `files` files in the new `directory`."""
    os.mkdir(directory)
    started = time.perf_counter()
    for i in range(files):
        fd = os.open(f"{directory}/f{i}", os.O_CREAT | os.O_WRONLY, 0o644)
        os.write(fd, CONTENT)
        os.close(fd)
    return (time.perf_counter() - started) / files


def thread_group(name):
    for prefix, group in (("fuse-ring", "queues"), ("fuser", "queues"), ("vfs-ingest", "ingest"),
                          ("vfs-commit", "commit")):
        if name.startswith(prefix):
            return group
    return "other"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mount", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    pid = daemon_pid(args.mount)
    taken = set(os.listdir(args.mount)) | set(os.listdir(args.host))
    first = next(n for n in range(1_000_000) if f"create-{n}" not in taken)
    print(f"{'round':>5} {'host us':>9} {'mount us':>9} {'ratio':>6}  daemon CPU us a file")
    for n in range(first, first + args.rounds):
        host = create_files(f"{args.host}/create-{n}", args.files)
        before = cpu_by_thread(pid)
        mount = create_files(f"{args.mount}/create-{n}", args.files)
        # The ingest worker lets files settle for a second before it takes them.
        time.sleep(2)
        after = cpu_by_thread(pid)
        groups = {}
        for name, used in after.items():
            group = thread_group(name)
            groups[group] = groups.get(group, 0.0) + used - before.get(name, 0.0)
        cpu = "  ".join(f"{g} {s * 1e6 / args.files:.0f}" for g, s in sorted(groups.items()))
        print(f"{n:>5} {host * 1e6:>9.1f} {mount * 1e6:>9.1f} {mount / host:>6.2f}  {cpu}")


if __name__ == "__main__":
    main()
