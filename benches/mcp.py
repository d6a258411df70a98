#!/usr/bin/env python3
"""Latency of each agent tool called over MCP, as an agent host sees it.

A fresh workspace is mounted (`computerd mount --daemon`), and `computerd mcp DB` is
started by the official Python MCP SDK's stdio client (computerd/tests/mcp/client.py,
scenario `timing:REPS`), which calls each tool `--reps` times in turn (round-robin, so
the noise of a shared machine falls on all alike) and reports, per call, the first
one's time (the first of its kind in the session: for the js backend the first exec in
the daemon's life), the median and the minimum, in ms. A call's time covers JSON-RPC
over stdio, the MCP process, the owner's channel and the work in the owner.

    ~/.cache/computer/mcp-venv/bin/python benches/mcp.py [--reps 50] [--computerd target/release/computerd]

Needs root, FUSE, bubblewrap and the MCP SDK (scripts/install-test-deps.sh installs
it into that virtual environment). Prints a markdown table.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT = os.path.join(HERE, "..", "computerd", "tests", "mcp", "client.py")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--computerd", default=os.path.join(HERE, "..", "target", "release", "computerd"))
    args = parser.parse_args()
    computerd = os.path.abspath(args.computerd)
    with tempfile.TemporaryDirectory(prefix="mcp-bench-") as dir:
        db, mnt = os.path.join(dir, "ws.db"), os.path.join(dir, "mnt")
        os.mkdir(mnt)
        subprocess.run([computerd, "init", "-q", db], check=True, stdout=subprocess.DEVNULL)
        subprocess.run([computerd, "mount", "--daemon", "--quiet", db, mnt], check=True, stdout=subprocess.DEVNULL)
        try:
            out = subprocess.run([sys.executable, CLIENT, f"timing:{args.reps}", computerd, "mcp", db],
                                 check=True, capture_output=True, text=True).stdout
        finally:
            subprocess.run([computerd, "umount", mnt], check=True)
    report = json.loads(out)
    print(f"| tool call ({args.reps} each) | first ms | median ms | min ms |")
    print("|---|---:|---:|---:|")
    for label, t in report.items():
        print(f"| {label} | {t['first_ms']:.2f} | {t['median_ms']:.2f} | {t['min_ms']:.2f} |")


if __name__ == "__main__":
    main()
