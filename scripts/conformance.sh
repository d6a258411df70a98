#!/usr/bin/env bash
# Mounts a fresh workspace and runs pjdfstest (POSIX semantics) and fsx (random I/O
# checked against a model) in it. Unmounts on exit, also on failure.
#
#   scripts/conformance.sh [--fsx-ops N] [--fsx-seed S] [--mount-args "ARGS"]
#
# --mount-args: extra `computerd mount` arguments, e.g. "--no-io-uring" for the same suite
# over /dev/fuse instead of FUSE's io_uring transport (the default where offered).
#
# Uses target/release/computerd (build it first) or $COMPUTERD.
set -euo pipefail
cd "$(dirname "$0")/.."

FSX_OPS=10000
FSX_SEED=1
MOUNT_ARGS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --fsx-ops) FSX_OPS="$2"; shift 2 ;;
    --fsx-seed) FSX_SEED="$2"; shift 2 ;;
    --mount-args) MOUNT_ARGS="$2"; shift 2 ;;
    *) echo "conformance.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

COMPUTERD="${COMPUTERD:-$PWD/target/release/computerd}"
[ -x "$COMPUTERD" ] || { echo "conformance.sh: $COMPUTERD not built (cargo build --release)" >&2; exit 2; }

WORK="$(mktemp -d /tmp/computer-conformance.XXXXXX)"
MNT="$WORK/mnt"
cleanup() {
  status=$?
  if grep -q " $MNT " /proc/mounts; then
    umount "$MNT" 2>/dev/null || umount -l "$MNT" || true
  fi
  if [ $status -ne 0 ] && [ -f "$WORK/computerd.log" ]; then
    echo "--- computerd log (last 50 lines) ---" >&2
    tail -n 50 "$WORK/computerd.log" >&2
  fi
  rm -rf "$WORK"
  exit $status
}
trap cleanup EXIT INT TERM

mkdir -p "$MNT"
# pjdfstest switches to other users: the mount must let them in.
# shellcheck disable=SC2086 # MOUNT_ARGS is a list of arguments
"$COMPUTERD" --log info mount "$WORK/ws.db" "$MNT" --daemon --allow-other --log-file "$WORK/computerd.log" \
  $MOUNT_ARGS >/dev/null
chmod 0755 "$WORK" "$MNT"

echo "== pjdfstest"
scripts/pjdfstest.sh "$MNT" --expect docs/pjdfstest-expected.txt --secondary-fs /tmp

echo "== fsx ($FSX_OPS ops, seed $FSX_SEED)"
scripts/fsx.sh "$MNT" --ops "$FSX_OPS" --seed "$FSX_SEED" --disable punch_hole

echo "== integrity of the database after the run"
umount "$MNT"
for _ in $(seq 1 100); do grep -q " $MNT " /proc/mounts || break; sleep 0.1; done
"$COMPUTERD" fs "$WORK/ws.db" check

if [[ " $MOUNT_ARGS " == *" --io-uring "* ]]; then
  # The suite proves nothing about the ring unless the ring carried it.
  served="$(grep -o 'served over io_uring, per CPU: .*' "$WORK/computerd.log" || true)"
  echo "== FUSE requests $served"
  [[ "$served" =~ [1-9] ]] || { echo "conformance.sh: the io_uring queues served nothing" >&2; exit 1; }
fi
