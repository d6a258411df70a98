#!/bin/bash
# Cold read of one large file, or of a tree: computerd against ext4, in the same run.
#
#   benches/cold-read.sh [ROUNDS] [MIB]          (root: it drops the page cache)
#   COLD_READ_TREE=DIR benches/cold-read.sh [ROUNDS]
#
# COMPUTERD_MOUNT_ARGS: extra `computerd mount` arguments for the timed mounts (e.g.
# "--io-uring").
#
# A workspace in a scratch directory on the ext4 disk gets one MIB MiB file of random
# bytes; the same bytes are a plain file beside it. Each round, in turn: drop the page
# cache and time `cat` of the plain file; mount the workspace, drop the page cache,
# time `cat` of the file in the mount, unmount. Prints one line per round (seconds,
# and computerd's time over ext4's) and the medians. With COLD_READ_TREE, the data is a
# copy of that directory (modes and times kept) instead, read with `tar -cf -` piped
# to `cat` (tar skips reading files when its archive is /dev/null itself).
set -euo pipefail
rounds=${1:-8}
mib=${2:-256}
tree=${COLD_READ_TREE:-}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${COMPUTERD:-$root/target/release/computerd}
[ -x "$bin" ] || cargo build --release -q -p computerd --manifest-path "$root/Cargo.toml"
scratch=$(mktemp -d -p "${TMPDIR:-/tmp}" cold-read.XXXXXX)
cleanup() {
    mountpoint -q "$scratch/m" && "$bin" umount "$scratch/m" >/dev/null 2>&1
    rm -rf "$scratch"
}
trap cleanup EXIT
cd "$scratch"
"$bin" init ws.db >/dev/null
mkdir m
"$bin" mount ws.db m --daemon >/dev/null
if [ -n "$tree" ]; then
    cp -r --preserve=mode,timestamps "$tree" plain
    cp -r --preserve=mode,timestamps "$tree" m/data
    what="tree $tree, $(du -sm plain | cut -f1) MiB"
else
    head -c "${mib}M" /dev/urandom > plain
    cp plain m/data
    what="$mib MiB"
fi
"$bin" umount m >/dev/null 2>&1

drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
seconds() {
    local start end
    start=$(date +%s%N)
    if [ -n "$tree" ]; then
        tar -cf - -C "$1" . | cat > /dev/null
    else
        cat "$1" > /dev/null
    fi
    end=$(date +%s%N)
    echo "scale=3; ($end - $start) / 1000000000" | bc
}
ext4=()
ours=()
for round in $(seq 1 "$rounds"); do
    drop
    e=$(seconds plain)
    # shellcheck disable=SC2086 # a list of arguments
    "$bin" mount ws.db m --daemon ${COMPUTERD_MOUNT_ARGS:-} >/dev/null
    drop
    c=$(seconds m/data)
    "$bin" umount m >/dev/null 2>&1
    ext4+=("$e")
    ours+=("$c")
    printf 'round %d: ext4 %s s, computerd %s s, ratio %.2f\n' \
        "$round" "$e" "$c" "$(echo "$c / $e" | bc -l)"
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
me=$(median "${ext4[@]}")
mc=$(median "${ours[@]}")
printf 'median: ext4 %s s, computerd %s s, ratio %.2f (%s, %d rounds)\n' \
    "$me" "$mc" "$(echo "$mc / $me" | bc -l)" "$what" "$rounds"
