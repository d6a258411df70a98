#!/bin/bash
# `computerd fs --remote` cat and write of one large file against a local `fs DB cat`
# and `cp`, measured in one run, with the client's peak RSS (bounded memory).
# Usage: cargo build --release -p computerd && benches/remote-files.sh [MIB]
set -e
B=$(realpath ${COMPUTERD:-target/release/computerd})
MIB=${1:-256}
W=${WORK:-/var/tmp/remote-files-bench}; rm -rf $W; mkdir -p $W; cd $W
export COMPUTERD_TOKEN=bench-token
head -c $((MIB << 20)) /dev/urandom > big
$B -q init db
$B -q serve db --listen $W/sock > serve.log 2>&1 & server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' EXIT
for _ in $(seq 100); do [ -S $W/sock ] && break; sleep 0.1; done
t() { local s=$(date +%s.%N); sh -c "$1" >/dev/null 2>&1; local e=$(date +%s.%N); awk "BEGIN { printf \"%.3f\", $e - $s }"; }
rss() { /usr/bin/time -f %M sh -c "$1" 2>&1 >/dev/null | tail -1; }
for rep in 1 2 3; do
  $B fs db rm -f /big /big2 2>/dev/null || $B fs --remote $W/sock rm -f /big /big2
  write=$(t "$B fs --remote $W/sock write /big < big")
  write_rss=$(rss "$B fs --remote $W/sock write /big2 < big")
  cat=$(t "$B fs --remote $W/sock cat /big > /dev/null")
  cat_rss=$(rss "$B fs --remote $W/sock cat /big > /dev/null")
  local_cat=$(t "$B fs db cat /big > /dev/null")
  cp=$(t "cp big big.copy && rm big.copy")
  echo "rep $rep: ${MIB} MiB remote_write ${write}s remote_cat ${cat}s local_cat ${local_cat}s cp ${cp}s client_rss_kib write ${write_rss} cat ${cat_rss}"
done
$B fs --remote $W/sock cat /big | cmp - big && echo "content checked"
