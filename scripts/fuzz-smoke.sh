#!/usr/bin/env bash
# A short run of every cargo-fuzz target, for CI: each runs SECONDS seconds (default 20)
# starting from its checked-in corpus (fuzz/seeds/TARGET) when it has one. libFuzzer's
# seed is derived from the commit (its first 8 hex digits; FUZZ_SEED overrides), so each
# commit explores its own paths and a run can be repeated exactly; the seed is printed.
# Fails if a target crashes, panics, leaks or times out. Installs cargo-fuzz if it is
# missing; builds with RUSTC_BOOTSTRAP=1 on the stable toolchain.
#
# The targets are built at opt-level 1 without debug info (a panic still names its
# file and line), which builds in little more than half the time and replays the seeds
# as fast (figures in fuzz/README.md); long runs (scripts/fuzz-keep.sh) keep the full
# release profile. Each target starts from its seeds, except sync_recovery: loading its
# kept corpus under the instrumentation takes about a minute, and the sync simulation's
# tests replay that corpus already (sync/tests/sim.rs, kept_fuzz_corpus_replays).
#
# Usage: scripts/fuzz-smoke.sh [SECONDS]
#        scripts/fuzz-smoke.sh --build-only   (builds the targets as the run would, and
#                                              stops: scripts/test.sh builds them early)
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

seconds="${1:-20}"
export PATH="$HOME/.cargo/bin:$PATH"
export RUSTC_BOOTSTRAP=1
if ! command -v cargo-fuzz >/dev/null; then
  cargo install cargo-fuzz --locked
fi
# The smoke run's profile, for the build and every run alike.
smoke_profile=(env CARGO_PROFILE_RELEASE_OPT_LEVEL=1 CARGO_PROFILE_RELEASE_DEBUG=0)
if [ "$seconds" = --build-only ]; then
  exec "${smoke_profile[@]}" cargo fuzz build
fi

if [ -z "${FUZZ_SEED:-}" ]; then
  commit=$(git rev-parse HEAD 2>/dev/null || echo 00000001)
  # libFuzzer takes a 32-bit seed; 0 would mean "pick one at random".
  FUZZ_SEED=$(( 0x${commit:0:8} % 4294967295 + 1 ))
fi
echo "fuzz-smoke: libFuzzer seed $FUZZ_SEED (repeat with FUZZ_SEED=$FUZZ_SEED)"

mapfile -t targets < <(cargo fuzz list)
if [ "${#targets[@]}" -eq 0 ]; then
  echo "fuzz-smoke: no fuzz targets found" >&2
  exit 1
fi
for target in "${targets[@]}"; do
  corpus="corpus/$target"
  mkdir -p "$corpus"
  dirs=("$corpus")
  if [ -d "seeds/$target" ] && [ "$target" != sync_recovery ]; then
    dirs+=("seeds/$target")
  fi
  echo "fuzz-smoke: $target for ${seconds}s"
  "${smoke_profile[@]}" \
    cargo fuzz run "$target" "${dirs[@]}" -- -max_total_time="$seconds" -seed="$FUZZ_SEED"
done
echo "fuzz-smoke: ${#targets[@]} target(s) ran ${seconds}s each without a failure"
