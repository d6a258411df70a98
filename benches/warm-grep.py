#!/usr/bin/env python3
"""Warm `grep -r zzz` over each directory given, in rounds of shuffled order.

One untimed run per directory first, then 15 rounds (`--rounds`), each timing one run
per directory in a new random order, so that a shared machine's noise falls on every
directory alike. Prints each directory's median and minimum, and the median as a
multiple of the first directory's (give ext4 first).

    python3 benches/warm-grep.py /tmp/ext4-copy MNT1 MNT2 [--rounds 15]
"""
import argparse
import random
import statistics
import subprocess
import time


def grep_ms(directory):
    start = time.perf_counter()
    subprocess.run(["grep", "-r", "zzz", directory], stdout=subprocess.DEVNULL, check=False)
    return (time.perf_counter() - start) * 1000


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    times = {d: [] for d in args.dirs}
    for d in args.dirs:
        grep_ms(d)
    for _ in range(args.rounds):
        order = args.dirs[:]
        random.shuffle(order)
        for d in order:
            times[d].append(grep_ms(d))
    base = statistics.median(times[args.dirs[0]])
    for d in args.dirs:
        median = statistics.median(times[d])
        print(f"{d}: median {median:.1f} ms ({median / base:.2f}x) min {min(times[d]):.1f}")


if __name__ == "__main__":
    main()
