#!/usr/bin/env bash
# Commands over many trace files hold descriptors per file (`orrery doctor` about two per file):
# the CLI raises the soft open-file limit to the hard one (cli/main.cpp), and what stays short is a
# clear error naming the file and "Too many open files", exit 2.
#  1. 30 trace files (60+ descriptors) under a soft limit of 40, the hard limit as it is: the doctor
#     reads them all and finds nothing wrong (exit 0).
#  2. The same with the hard limit lowered to 40 too: exit 2, a file named, "Too many open files".
# Needs a hard limit of at least 200 for part 1 (else exit 77: skipped, with the reason).
# Usage: file_limit_checks.sh ORRERY
set -u
ORRERY=$1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$TMP" || exit 1
hard=$(ulimit -Hn)
if [ "$hard" != unlimited ] && [ "$hard" -lt 200 ]; then
  echo "skipped: the hard open-file limit here is $hard (< 200)"
  exit 77
fi
fails=0
"$ORRERY" synth --ranks 2 --steps 2 --out base.db > /dev/null || { echo "FAIL: synth"; exit 1; }
for i in $(seq 1 30); do cp base.db "t$i.db"; done

(ulimit -Sn 40; "$ORRERY" doctor t*.db) > raised.out 2>&1
rc=$?
if [ $rc -ne 0 ] || ! grep -q "^No problem found" raised.out; then
  echo "FAIL: doctor over 30 files under soft limit 40 -> exit $rc:"
  cat raised.out
  fails=$((fails + 1))
fi

(ulimit -n 40; "$ORRERY" doctor t*.db) > short.out 2>&1
rc=$?
if [ $rc -ne 2 ] || ! grep -qE "^orrery: error: t[0-9]+\.db: cannot open trace \(.*Too many open files\)" short.out; then
  echo "FAIL: doctor over 30 files under hard limit 40 -> exit $rc (want 2, the file and 'Too many open files'):"
  cat short.out
  fails=$((fails + 1))
fi

[ $fails -eq 0 ] && echo "all file-limit checks passed"
exit $((fails > 0))
