#!/usr/bin/env bash
# Fuzzes TARGET for SECONDS from its checked-in corpus (fuzz/seeds/TARGET), then merges
# what the run found into that corpus: libFuzzer's -set_cover_merge keeps only a small
# set of inputs that reach what the corpus did not, so it grows by what is new and stays
# small (every input is run when a fuzzer starts: sync_recovery runs 10 to 20 a second).
# Commit the result: every later run, CI's smoke run included, starts from it.
#
# Usage: scripts/fuzz-keep.sh TARGET [SECONDS] [-- LIBFUZZER_FLAGS...]
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

target="${1:?usage: scripts/fuzz-keep.sh TARGET [SECONDS] [-- LIBFUZZER_FLAGS...]}"
seconds="${2:-600}"
shift $(( $# >= 2 ? 2 : 1 ))
[ "${1:-}" = "--" ] && shift
export PATH="$HOME/.cargo/bin:$PATH"
export RUSTC_BOOTSTRAP=1
if ! command -v cargo-fuzz >/dev/null; then
  cargo install cargo-fuzz --locked
fi

kept="seeds/$target"
found="corpus/$target"
mkdir -p "$kept" "$found"
before=$(find "$kept" -type f | wc -l)
cargo fuzz run "$target" "$found" "$kept" -- -max_total_time="$seconds" "$@"
cargo fuzz run "$target" "$kept" "$found" -- -set_cover_merge=1 "$@"
after=$(find "$kept" -type f | wc -l)
echo "fuzz-keep: $target: $kept holds $after input(s), $((after - before)) new; commit them"
