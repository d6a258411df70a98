#!/usr/bin/env bash
# Builds the workspace's benchmark harness and computerd in release mode, then runs
# fsbench with the given arguments. Run as root (it mounts a tmpfs). See benches/README.md.
#   benches/fsbench.sh --computerd target/release/computerd --markdown bench.md
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cargo build --release --manifest-path "$root/Cargo.toml" -p computer-benches -p computerd
exec "${CARGO_TARGET_DIR:-$root/target}/release/fsbench" "$@"
