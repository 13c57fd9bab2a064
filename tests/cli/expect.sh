# Shared by the CLI check scripts (source it after setting ORRERY, TMP and EXPECT_DIR, the folder
# orrery runs in): fail MESSAGE counts a failure in $fails; expect RC "text" orrery-args... runs
# orrery and passes when it exits RC, its output holds the text, and it says no "internal error".
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

expect() {
  local want_rc=$1 want=$2
  shift 2
  (cd "$EXPECT_DIR" && timeout 120 "$ORRERY" "$@") >"$TMP/out" 2>&1
  local rc=$?
  if [ $rc -ne "$want_rc" ] || ! grep -qF -- "$want" "$TMP/out" || grep -q "internal error" "$TMP/out"; then
    fail "orrery $* -> exit $rc (want $want_rc and '$want'):"
    tail -n 20 "$TMP/out"
  else
    echo "ok: orrery $* -> exit $rc: $(grep -F -m1 -- "$want" "$TMP/out")"
  fi
}
