#!/usr/bin/env bash
# The project's test command (README.md): unit, model, crash, FUSE and replica
# integration tests and the seeded sync simulation sweeps, then the POSIX conformance
# suite and the random-I/O exerciser against a real mount, then a short seeded run of
# every fuzz target. Needs root (FUSE mounts, apt-get); first installs what it needs
# and does not have (scripts/install-test-deps.sh: the capnp compiler, pjdfstest, fsx,
# cargo-fuzz, ...). Long fuzz/soak/benchmark runs are separate commands (README.md).
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
export PATH="$HOME/.cargo/bin:$PATH"
scripts/install-test-deps.sh

scripts/check-capnp.sh
cargo build --release --workspace --all-targets
cargo test --release --workspace
scripts/conformance.sh
scripts/fuzz-smoke.sh "${FUZZ_SMOKE_SECONDS:-10}"
