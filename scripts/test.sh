#!/usr/bin/env bash
# The project's test command (README.md): unit, model, crash, FUSE and replica
# integration tests and the seeded sync simulation sweep, then the POSIX conformance
# suite and the random-I/O exerciser against a real mount, then a short seeded run of
# every fuzz target. Needs root (FUSE mounts), the capnp compiler (to check the
# generated code is current), pjdfstest + fsx + cargo-fuzz on PATH or in ~/.cargo/bin
# (.ci/run installs them). Long fuzz/soak/benchmark runs are separate commands
# (README.md).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/check-capnp.sh
cargo build --release --workspace --all-targets
cargo test --release --workspace
scripts/conformance.sh
scripts/fuzz-smoke.sh "${FUZZ_SMOKE_SECONDS:-10}"
