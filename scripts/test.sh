#!/usr/bin/env bash
# The project's test command (README.md): unit, model, crash, FUSE and replica
# integration tests and the seeded sync simulation sweeps; the store's tests again in a
# debug build, for the invariants it asserts there; the mount tests again over
# /dev/fuse (the first run carries requests over FUSE's io_uring transport where the
# kernel offers it, as a mount does by default); then the POSIX conformance suite and
# the random-I/O exerciser against a real mount (by default, then over /dev/fuse), then
# a short seeded run of every fuzz target. Needs root (FUSE mounts, apt-get); first installs what it needs and does not
# have (scripts/install-test-deps.sh: the capnp compiler, pjdfstest, fsx, cargo-fuzz,
# ...). Long fuzz/soak/benchmark runs are separate commands (README.md).
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
export PATH="$HOME/.cargo/bin:$PATH"
# Runs a step and says how long it took, so that the run's budget (about 25 minutes on
# 2 cores) can be kept with figures.
step() {
  local started=$SECONDS
  "$@"
  echo "test.sh: $((SECONDS - started)) s for: $*" >&2
}

step scripts/install-test-deps.sh

step scripts/check-capnp.sh
step cargo build --release --workspace --all-targets
# The fuzz targets build beside the tests, which spend about a third of the two cores'
# time waiting on mounts and processes; the smoke run at the end waits for the build.
# The build has a session of its own, so that it can be stopped with whatever it runs.
fuzz_build_log=$(mktemp)
setsid -w scripts/fuzz-smoke.sh --build-only > "$fuzz_build_log" 2>&1 &
fuzz_build=$!
trap 'kill -- -$fuzz_build 2>/dev/null || true; rm -f "$fuzz_build_log"' EXIT
wait_for_fuzz_build() {
  if ! wait "$fuzz_build"; then
    cat "$fuzz_build_log" >&2
    echo "test.sh: building the fuzz targets failed (its output above)" >&2
    return 1
  fi
  tail -n 1 "$fuzz_build_log" >&2
}
step cargo test --release --workspace
# The invariants the store asserts in debug builds only (extent coverage and reference
# counts after each content change, cursors never backwards), under the tests that
# drive every write path and replication.
step cargo test -p computer-vfs --test model --test peers --test replication --test check
# Every test that mounts through the shared harness, and the conformance suite, again
# with the requests carried over /dev/fuse (`computerd mount --no-io-uring`); but for
# the 4 GiB written by passthrough (none of it crosses the transport, and it is the
# longest test: 34 s).
step env COMPUTERD_TEST_MOUNT_ARGS=--no-io-uring cargo test --release -p computerd \
  --test mount_basic --test mount_tools --test mount_concurrency --test mount_crash \
  --test mount_permissions --test mount_disk_full --test mount_memory --test mount_readonly \
  --test replica --test owner --test exec --test js --test mcp --test shell --test mount_cached_opens \
  --test mount_transport --test mount_pages -- --skip four_gib_through_passthrough_keeps_the_daemon_small
# The tests of what a workspace's files hold and who may reach them, with files opened
# without asking the daemon (`computerd mount --cached-opens`).
step env COMPUTERD_TEST_MOUNT_ARGS=--cached-opens cargo test --release -p computerd \
  --test mount_basic --test mount_tools --test mount_concurrency --test mount_crash \
  --test mount_permissions --test owner --test mount_pages
step scripts/conformance.sh
step scripts/conformance.sh --mount-args "--no-io-uring"
step wait_for_fuzz_build
step scripts/fuzz-smoke.sh "${FUZZ_SMOKE_SECONDS:-10}"
