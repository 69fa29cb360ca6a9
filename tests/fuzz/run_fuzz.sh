#!/usr/bin/env bash
# One fuzz target under libFuzzer for a bounded time, from its seeds and the inputs that once
# crashed it (tests/fuzz/regressions/NAME, run first).
#   run_fuzz.sh TARGET SECONDS WORKDIR [SEED_FILE_OR_DIR...]
# A crash, leak, timeout or out-of-memory input fails the run and is left in WORKDIR as
# crash-*, leak-*, timeout-* or oom-*; copy it to tests/fuzz/regressions/NAME once fixed.
set -euo pipefail
bin=$1 secs=$2 work=$3
shift 3
rm -rf "$work"
mkdir -p "$work/corpus" "$work/seeds"
n=0
for s in "$@"; do
  if [ -d "$s" ]; then
    for f in "$s"/*; do [ -f "$f" ] && cp "$f" "$work/seeds/$((n++))-$(basename "$f")"; done
  elif [ -f "$s" ]; then
    cp "$s" "$work/seeds/$((n++))-$(basename "$s")"
  fi
done
exec "$bin" -max_total_time="$secs" -timeout=20 -rss_limit_mb=2560 -print_final_stats=1 \
  -artifact_prefix="$work/" "$work/corpus" "$work/seeds"
