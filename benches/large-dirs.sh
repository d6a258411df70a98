#!/usr/bin/env bash
# Cold walks over large directories: a mount as computerd mounts by default (every page
# of a listing comes with the entries' attributes), one with --readdirplus-auto (the
# first page only, the kernel's own rule), and the local disk, alternated in one loop.
# Every timed command runs after a fresh mount and dropped caches. Prints the median
# wall time of each command on each target in milliseconds, and its ratio to the disk.
#
#   sudo benches/large-dirs.sh [COMPUTERD] [ROUNDS] [WORKDIR]
#
# Defaults: target/release/computerd, 5 rounds, a new directory under /tmp. Run as
# root (dropping caches needs it). docs/benchmarks.md has results.
set -euo pipefail

computerd=$(realpath "${1:-target/release/computerd}")
rounds=${2:-5}
work=${3:-$(mktemp -d /tmp/large-dirs.XXXXXX)}
mnt=$work/mnt
disk=$work/disk
trap 'umount "$mnt" 2>/dev/null || true; rm -rf "$work"' EXIT

commands=("ls -l mid" "du -s big" "ls -f big" "find big -type f" "grep -r -c x big")

make_dirs() { # in the current directory: 1,000 and 10,000 small files
    python3 -c "
import os
for name, count in (('mid', 1000), ('big', 10000)):
    os.mkdir(name)
    for i in range(count):
        with open(f'{name}/file_{i:05}.txt', 'w') as f:
            f.write(f'x{i}\n')
"
}

timed_ms() { # DIR COMMAND: wall time after dropping the caches
    cd "$1"
    sync
    echo 3 > /proc/sys/vm/drop_caches
    local start end
    start=$(date +%s%N)
    eval "$2" > /dev/null
    end=$(date +%s%N)
    cd /
    echo $(((end - start) / 1000))
}

mkdir -p "$disk"
(cd "$disk" && make_dirs)
"$computerd" mount -q --daemon "$work/ws.db" "$mnt" > /dev/null
(cd "$mnt" && make_dirs)
umount "$mnt"

results=$work/results
for _ in $(seq "$rounds"); do
    for target in every first; do
        options=()
        [[ $target == first ]] && options=(--readdirplus-auto)
        for command in "${commands[@]}"; do
            "$computerd" mount -q --daemon "${options[@]}" "$work/ws.db" "$mnt" > /dev/null
            echo "$target|$command|$(timed_ms "$mnt" "$command")" >> "$results"
            umount "$mnt"
        done
    done
    for command in "${commands[@]}"; do
        echo "disk|$command|$(timed_ms "$disk" "$command")" >> "$results"
    done
done

python3 - "$results" <<'EOF'
import collections, statistics, sys
times = collections.defaultdict(list)
order = []
for line in open(sys.argv[1]):
    target, command, us = line.rstrip("\n").split("|")
    times[command, target].append(int(us) / 1000)
    if command not in order:
        order.append(command)
print("| command | disk ms | default ms (x disk) | --readdirplus-auto ms (x disk) |")
print("|---|---:|---:|---:|")
for command in order:
    disk = statistics.median(times[command, "disk"])
    cells = [f"{disk:.1f}"]
    for target in ("every", "first"):
        median = statistics.median(times[command, target])
        cells.append(f"{median:.1f} ({median / disk:.2f})")
    print(f"| `{command}` | " + " | ".join(cells) + " |")
EOF
