#!/usr/bin/env python3
"""How the per-file cost of a workspace grows with its size.

For each size N, in a fresh workspace mounted by computerd and in a directory of the
host's file system measured in the same run: create N small files (directories of
1,000), list them (`os.walk`, warm, then cold after a remount and dropped caches), read
them all (warm, then cold), and stat each. Reports microseconds per file for every
step, the ratio to the host, the daemon's peak resident memory and the sizes of the
database and its write-ahead log. Timing runs inside this process, so no process start
is measured.

    python3 benches/scale.py [--sizes 1000,10000,100000,1000000] [--work DIR]
                             [--computerd target/release/computerd] [--markdown OUT]

Needs root (dropping caches). 1,000,000 files take about ten minutes.
"""

import argparse
import os
import shutil
import subprocess
import sys
import time

FILES_PER_DIR = 1000
CONTENT = b"x" * 100


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def timed(f):
    start = time.perf_counter()
    f()
    return time.perf_counter() - start


def create(root, n):
    for d in range((n + FILES_PER_DIR - 1) // FILES_PER_DIR):
        path = os.path.join(root, f"d{d:04}")
        os.mkdir(path)
        for i in range(min(FILES_PER_DIR, n - d * FILES_PER_DIR)):
            fd = os.open(os.path.join(path, f"f{i:04}"), os.O_WRONLY | os.O_CREAT, 0o644)
            os.write(fd, CONTENT)
            os.close(fd)


def walk(root, n):
    count = sum(len(files) for _, _, files in os.walk(root))
    assert count == n, f"{root}: {count} files listed, {n} expected"


def each_file(root):
    for d in sorted(os.listdir(root)):
        path = os.path.join(root, d)
        for name in os.listdir(path):
            yield os.path.join(path, name)


def read_all(root, n):
    total = 0
    for path in each_file(root):
        with open(path, "rb") as f:
            total += len(f.read())
    assert total == n * len(CONTENT), f"{root}: read {total} bytes"


def stat_all(root, n):
    count = sum(1 for path in each_file(root) if os.lstat(path).st_size == len(CONTENT))
    assert count == n


class Mount:
    """computerd serving a workspace in the foreground of a child process."""

    def __init__(self, computerd, db, mnt, extra_args=()):
        self.computerd, self.db, self.mnt = computerd, db, mnt
        self.extra_args = list(extra_args)
        self.proc = None

    def start(self):
        os.makedirs(self.mnt, exist_ok=True)
        self.proc = subprocess.Popen([self.computerd, "mount", self.db, self.mnt,
                                      *self.extra_args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 30
        while subprocess.run(["mountpoint", "-q", self.mnt]).returncode != 0:
            if self.proc.poll() is not None or time.time() > deadline:
                sys.exit(f"scale.py: computerd did not mount {self.mnt}")
            time.sleep(0.05)

    def peak_rss_mib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self):
        subprocess.run(["umount", self.mnt], check=True)
        self.proc.wait(timeout=600)


def file_mib(path):
    try:
        return os.path.getsize(path) / (1 << 20)
    except FileNotFoundError:
        return 0.0


def measure(root, n, remount=None):
    """Seconds per step in `root`; `remount` restarts the mount before the cold steps."""
    out = {"create": timed(lambda: create(root, n))}
    os.sync()
    walk(root, n)
    out["list warm"] = timed(lambda: walk(root, n))
    read_all(root, n)
    out["read warm"] = timed(lambda: read_all(root, n))
    out["stat warm"] = timed(lambda: stat_all(root, n))
    if remount:
        remount()
    drop_caches()
    out["list cold"] = timed(lambda: walk(root, n))
    if remount:
        remount()
    drop_caches()
    out["read cold"] = timed(lambda: read_all(root, n))
    return out


def run_size(args, n):
    work = os.path.join(args.work, str(n))
    shutil.rmtree(work, ignore_errors=True)
    host = os.path.join(work, "host")
    os.makedirs(host)
    mount = Mount(args.computerd, os.path.join(work, "ws.db"), os.path.join(work, "mnt"),
                  args.mount_args.split())
    mount.start()
    rss = {}

    def remount():
        rss["before remount"] = max(rss.get("before remount", 0), mount.peak_rss_mib())
        mount.stop()
        mount.start()

    ours = measure(mount.mnt, n, remount)
    rss["after"] = mount.peak_rss_mib()
    mount.stop()
    db = os.path.join(work, "ws.db")
    sizes = (file_mib(db), file_mib(db + "-wal"))
    theirs = measure(host, n)
    shutil.rmtree(work, ignore_errors=True)
    return ours, theirs, max(rss.values()), sizes


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000,1000000")
    parser.add_argument("--work", default="/tmp/computer-scale")
    parser.add_argument("--computerd", default="target/release/computerd")
    parser.add_argument("--markdown", help="also write the table to this file")
    parser.add_argument("--mount-args", default="",
                        help="options for every mount, e.g. --no-io-uring")
    args = parser.parse_args()
    args.computerd = os.path.abspath(args.computerd)
    steps = ["create", "list warm", "list cold", "read warm", "read cold", "stat warm"]
    header = ("| files | " + " | ".join(f"{s} µs/file (x host)" for s in steps)
              + " | daemon peak RSS MiB | db MiB | WAL MiB |")
    lines = [header, "|" + "---:|" * (len(steps) + 4)]
    print(header, flush=True)
    for n in [int(s) for s in args.sizes.split(",")]:
        ours, theirs, rss, (db, wal) = run_size(args, n)
        cells = [f"{ours[s] / n * 1e6:.1f} ({ours[s] / theirs[s]:.2f})" for s in steps]
        line = f"| {n:,} | " + " | ".join(cells) + f" | {rss:.0f} | {db:.0f} | {wal:.0f} |"
        lines.append(line)
        print(line, flush=True)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
