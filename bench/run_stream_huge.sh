#!/usr/bin/env bash
# orrery doctor and orrery export (chrome, sqlite, chakra) on a huge synthetic trace (issue 22 item
# 5: memory bounded by ranks x streams and the collectives in flight, not by the span count): two
# builds alternated (OLD, NEW, OLD, NEW...), each run's wall time and peak resident set
# (/usr/bin/time), and whether the two builds' outputs are byte-identical. The trace has a
# straggler (rank 1 loads its data 300 ms late every step), so the doctor has a finding to print.
# It is written by NEW's orrery synth (about 100 bytes of memory per span while writing) and
# removed at the end, as are the outputs (each run's output is removed once compared, so that disk
# holds one trace and two outputs at a time). Figures, not assertions.
#
#   bench/run_stream_huge.sh OLD_ORRERY NEW_ORRERY [SPANS=50000000] [ROUNDS=2] [DIR=/tmp] [RANKS=64]
#     [COMMANDS="doctor chrome sqlite chakra"]
set -eu
OLD=$1
NEW=$2
SPANS=${3:-50000000}
ROUNDS=${4:-2}
DIR=${5:-/tmp}
RANKS=${6:-64}
COMMANDS=${7:-doctor chrome sqlite chakra}
TRACE=$DIR/orrery_stream_huge_$$.db
OUT=$DIR/orrery_stream_huge_$$
trap 'rm -rf "$TRACE" "$TRACE"-wal "$TRACE"-shm "$OUT".*' EXIT
"$NEW" synth --spans "$SPANS" --ranks "$RANKS" --straggler-rank 1 \
  --straggler-delay-ns 300000000 --out "$TRACE" | head -1
echo "trace: $(du -h "$TRACE" | cut -f1) on disk"

# run WHICH BIN COMMAND ROUND: one timed run, its output under $OUT.WHICH.
run() {
  local which=$1 bin=$2 cmd=$3 round=$4 out=$OUT.$1
  rm -rf "$out" "$out".*
  local args
  case $cmd in
    doctor) args=(doctor "$TRACE" --json) ;;
    chrome) args=(export "$TRACE" --format chrome --out "$out.json") ;;
    sqlite) args=(export "$TRACE" --format sqlite --out "$out.db") ;;
    chakra) mkdir -p "$out" && args=(export "$TRACE" --format chakra --out "$out/t") ;;
  esac
  /usr/bin/time -f "$cmd round $round $which: wall %e s, peak RSS %M KB" \
    "$bin" "${args[@]}" > "$out.stdout"
}

# The outputs of the last old and new runs, compared byte for byte.
compare() {
  local cmd=$1 o=$OUT.old n=$OUT.new same=yes
  case $cmd in
    doctor) cmp -s "$o.stdout" "$n.stdout" || same=no ;;
    chrome) cmp -s "$o.json" "$n.json" || same=no ;;
    sqlite) cmp -s "$o.db" "$n.db" || same=no ;;
    chakra) diff -rq "$o" "$n" > /dev/null || same=no ;;
  esac
  if [ $same = yes ]; then echo "$cmd: outputs identical"; else echo "$cmd: outputs DIFFER"; fi
  rm -rf "$o" "$o".* "$n" "$n".*
}

for cmd in $COMMANDS; do
  for round in $(seq "$ROUNDS"); do
    for which in old new; do
      bin=$OLD
      [ "$which" = new ] && bin=$NEW
      run "$which" "$bin" "$cmd" "$round"
      # Keep the last round's outputs for the comparison; drop the others now.
      [ "$round" = "$ROUNDS" ] || rm -rf "$OUT.$which" "$OUT.$which".*
    done
  done
  compare "$cmd"
done
echo "for scale: $NEW --help alone peaks at $( { /usr/bin/time -f %M "$NEW" --help > /dev/null; } 2>&1 ) KB (its shared libraries)"
