#!/usr/bin/env bash
# Checks that sync/src/generated/sync_capnp.rs is what sync/schema/sync.capnp generates.
#
# The generated code is committed so that plain builds never need the Cap'n Proto
# compiler. This regenerates it into a temporary directory with the same tool
# (sync/codegen: the `capnpc` crate's generator, pinned, behind the `capnp` compiler) and
# fails, showing the diff, if the committed file differs.
#
# Needs the `capnp` compiler (Debian: `apt-get install capnproto`; the committed file was
# made with 0.9.2, and names the compiler's version in its header) and cargo; builds the
# generator itself. To regenerate after a schema change:
#   cargo run --manifest-path sync/codegen/Cargo.toml --locked
set -euo pipefail
cd "$(dirname "$0")/.."

committed=sync/src/generated/sync_capnp.rs

if ! command -v capnp >/dev/null; then
  echo "check-capnp: the capnp compiler is not on PATH (Debian: apt-get install capnproto)" >&2
  exit 2
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# The generator's own target dir, beside the workspace's: it is not a workspace member.
cargo run --quiet --locked --manifest-path sync/codegen/Cargo.toml \
  --target-dir target/capnp-codegen -- "$tmp" >/dev/null

if ! diff -u "$committed" "$tmp/sync_capnp.rs" >"$tmp/diff"; then
  echo "check-capnp: $committed is stale: it differs from what sync/schema/sync.capnp" >&2
  echo "generates ($(capnp --version)). Regenerate it with" >&2
  echo "  cargo run --manifest-path sync/codegen/Cargo.toml --locked" >&2
  echo "and commit the result. The difference (committed -> generated):" >&2
  cat "$tmp/diff" >&2
  exit 1
fi
echo "check-capnp: $committed is up to date ($(capnp --version))"
