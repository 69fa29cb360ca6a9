#!/usr/bin/env bash
# deploy/netns/two_hosts.sh on the tiny model over a 2 Mbit/s link: every mode migrates across
# the namespaces, and the rate the KV transfers achieved shows the shaping (well under the
# Gbit/s an unshaped veth gives). Skips (77) when not root.
#   netns_test.sh SRC_DIR BIN_DIR MODEL
set -euo pipefail
SRC=$1 BIN=$2 MODEL=$3
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
tokens="[$(seq -s, 3 2 361)]"  # 180 history tokens
set +e
"$SRC/deploy/netns/two_hosts.sh" --bin "$BIN" --model "$MODEL" --policy-dir "$T/policy" \
  --rate 2mbit --tokens "$tokens" >"$T/out" 2>&1
rc=$?
set -e
cat "$T/out"
[ $rc = 77 ] && exit 77
[ $rc = 0 ] || { echo "FAIL: two_hosts.sh exited $rc" >&2; exit 1; }
for mode in full_kv token_replay reconstruct; do
  grep -q "^$mode " "$T/out" || { echo "FAIL: no $mode row" >&2; exit 1; }
done
rate=$(awk '$1 == "full_kv" && $2 == "plain" {print $5}' "$T/out")  # mode wire bytes share Mbit/s ...
python3 -c "import sys; r=float('$rate'); sys.exit(0 if 0.5 < r < 4.0 else 1)" ||
  { echo "FAIL: full_kv moved at $rate Mbit/s over a 2 Mbit/s link" >&2; exit 1; }
echo "netns test passed: full_kv at $rate Mbit/s over a 2 Mbit/s link"
