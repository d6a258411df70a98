#!/usr/bin/env bash
# A short run of every cargo-fuzz target, for CI: each runs SECONDS seconds (default 20)
# with a fixed seed (-seed=1), starting from its checked-in seeds (fuzz/seeds/TARGET) when
# it has any. Fails if a target crashes, panics, leaks or times out. Installs cargo-fuzz if
# it is missing; builds with RUSTC_BOOTSTRAP=1 on the stable toolchain.
#
# Usage: scripts/fuzz-smoke.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

seconds="${1:-20}"
export PATH="$HOME/.cargo/bin:$PATH"
export RUSTC_BOOTSTRAP=1
if ! command -v cargo-fuzz >/dev/null; then
  cargo install cargo-fuzz --locked
fi

mapfile -t targets < <(cargo fuzz list)
if [ "${#targets[@]}" -eq 0 ]; then
  echo "fuzz-smoke: no fuzz targets found" >&2
  exit 1
fi
for target in "${targets[@]}"; do
  corpus="corpus/$target"
  mkdir -p "$corpus"
  dirs=("$corpus")
  if [ -d "seeds/$target" ]; then
    dirs+=("seeds/$target")
  fi
  echo "fuzz-smoke: $target for ${seconds}s"
  cargo fuzz run "$target" "${dirs[@]}" -- -max_total_time="$seconds" -seed=1
done
echo "fuzz-smoke: ${#targets[@]} target(s) ran ${seconds}s each without a failure"
