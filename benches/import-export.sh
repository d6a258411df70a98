#!/bin/bash
# Import/export/compact of /usr/share/doc against cp -a, measured in one run.
# Usage (root, for the tmpfs): cargo build --release -p computerd && benches/import-export.sh
# WORK (default /var/tmp/import-bench) must be on the disk to compare with (ext4 here).
set -e
B=${COMPUTERD:-target/release/computerd}
SRC=/usr/share/doc
W=${WORK:-/var/tmp/import-bench}/ext4; rm -rf $W; mkdir -p $W
T=${WORK:-/var/tmp/import-bench}/tmpfs; mkdir -p $T; mountpoint -q $T || mount -t tmpfs -o size=2g tmpfs $T
t() { local s=$(date +%s.%N); sh -c "$1" >/dev/null 2>&1; local e=$(date +%s.%N); awk "BEGIN { print $e - $s }"; }
du -sb $SRC >/dev/null  # the source in the page cache
for rep in 1 2 3; do
  rm -rf $W/cp $T/cp $W/db* $W/exp $T/exp $T/db*
  cp_ext4_cached=$(t "cp -a $SRC $W/cp"); sync -f $W; rm -rf $W/cp; sync -f $W
  cp_ext4=$(t "cp -a $SRC $W/cp; sync -f $W")
  imp_cached=$( $B -q init $W/dbc >/dev/null; t "$B -q fs $W/dbc import $SRC /doc" ); rm -f $W/dbc*
  cp_tmpfs=$(t "cp -a $SRC $T/cp")
  $B -q init $W/db >/dev/null; $B -q init $T/db >/dev/null
  wb=$(sh -c "$B -q fs $W/db import $SRC /doc >/dev/null; grep '^write_bytes' /proc/\$\$/io" | awk '{print $2}')
  rm -f $W/db*; $B -q init $W/db >/dev/null
  imp_ext4=$(t "$B -q fs $W/db import $SRC /doc; sync -f $W")
  dbsize=$(stat -c %s $W/db)
  imp_tmpfs=$(t "$B -q fs $T/db import $SRC /doc")
  exp_ext4=$(t "$B -q fs $W/db export /doc $W/exp; sync -f $W")
  exp_tmpfs=$(t "$B -q fs $T/db export /doc $T/exp")
  $B -q fs $W/db rm -r /doc
  before=$(stat -c %s $W/db)
  comp=$(t "$B -q fs $W/db compact")
  after=$(stat -c %s $W/db)
  echo "rep $rep: cp_ext4_cached $cp_ext4_cached import_ext4_cached $imp_cached cp_ext4 $cp_ext4 cp_tmpfs $cp_tmpfs import_ext4 $imp_ext4 import_tmpfs $imp_tmpfs write_bytes $wb db_bytes $dbsize export_ext4 $exp_ext4 export_tmpfs $exp_tmpfs compact $comp before $before after $after"
done
umount $T
