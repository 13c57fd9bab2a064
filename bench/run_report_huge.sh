#!/usr/bin/env bash
# orrery report on a huge synthetic trace (issue 22 item 5: under 15 s and 1 GB at 50 M spans): two
# builds alternated (OLD, NEW, OLD, NEW...), text and --json, each run's wall time and peak
# resident set (/usr/bin/time), and whether the two builds' outputs are byte-identical. The trace
# is written by NEW's orrery synth (about 100 bytes of memory per span while writing; 1.45 GB on
# disk at 50 M) and removed at the end. Figures, not assertions.
#
#   bench/run_report_huge.sh OLD_ORRERY NEW_ORRERY [SPANS=50000000] [ROUNDS=2] [DIR=/tmp]
set -eu
OLD=$1
NEW=$2
SPANS=${3:-50000000}
ROUNDS=${4:-2}
DIR=${5:-/tmp}
TRACE=$DIR/orrery_report_huge_$$.db
OUT=$DIR/orrery_report_huge_$$
trap 'rm -f "$TRACE" "$TRACE"-wal "$TRACE"-shm "$OUT".*' EXIT
"$NEW" synth --spans "$SPANS" --out "$TRACE" | head -1
for mode in text json; do
  flag=""
  [ "$mode" = json ] && flag=--json
  for round in $(seq "$ROUNDS"); do
    for which in old new; do
      bin=$OLD
      [ "$which" = new ] && bin=$NEW
      # shellcheck disable=SC2086
      /usr/bin/time -f "$mode round $round $which: wall %e s, user %U s, sys %S s, peak RSS %M KB" \
        "$bin" report $flag "$TRACE" > "$OUT.$which.$mode"
    done
  done
  if cmp -s "$OUT.old.$mode" "$OUT.new.$mode"; then
    echo "$mode: outputs identical ($(wc -c < "$OUT.new.$mode") bytes)"
  else
    echo "$mode: outputs DIFFER"
  fi
done
echo "for scale: $NEW --help alone peaks at $( { /usr/bin/time -f %M "$NEW" --help > /dev/null; } 2>&1 ) KB (its shared libraries)"
