#!/usr/bin/env bash
# Every binary's --help (and -h) prints its usage and its own flags with their defaults on stdout
# and exits 0; an unknown flag still fails.
#   help_test.sh BIN_DIR
set -euo pipefail
BIN=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
check() {
  local bin=$1 usage=$2 flag=$3 out arg
  for arg in --help -h --helpfull; do
    out=$("$BIN/$bin" $arg) || fail "$bin $arg exited $?"
    grep -q "^$usage" <<<"$out" || fail "$bin $arg: no usage line '$usage': $out"
    grep -q -- "^  --$flag (default: " <<<"$out" || fail "$bin $arg does not list --$flag: $out"
  done
  grep -q -- "--flagfile\|--undefok" <<<"$out" && fail "$bin --help lists absl's own flags"
  "$BIN/$bin" --no-such-flag >/dev/null 2>&1 && fail "$bin accepts --no-such-flag"
  echo "$bin --help: $(grep -c '^  --' <<<"$out") flags"
}
check riskkv-node "riskkv-node --model PATH" metrics-listen
check riskkv-control "riskkv-control --store DIR" store
check riskkvctl "riskkvctl" wire-form
check riskkv-calibrate "riskkv-calibrate --model PATH --out DIR" corpus
check riskkv-generate "riskkv-generate --model PATH" prompt
check riskkv-score "riskkv-score" model
