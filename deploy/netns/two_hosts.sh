#!/usr/bin/env bash
# Two edge hosts for real on one machine: network namespaces A and B joined by a veth pair shaped
# with tbf (100 Mbit/s by default, both directions), the control plane in a third namespace with
# its own link to each. Starts riskkv-control, puts the policy, starts a riskkv-node in A and in
# B following it, runs the migration scenario of deploy/demo.sh from A to B across the shaped
# link in every mode, scrapes every /metrics and prints the table (mode, KV bytes, the transfer
# rate achieved, recovery time, dNLL). Everything is torn down on exit, Ctrl-C included.
# Needs root; only uses addresses inside the namespaces it creates (10.199.0.0/22).
#   sudo deploy/netns/two_hosts.sh [--model GGUF] [--policy-dir DIR] [--rate 100mbit]
#                                  [--bin DIR] [--tokens JSON] [--chart OUT.svg]
#   --policy-dir: riskkv-calibrate's output (policy.pb, bank.rkvbank); by default the SmolLM2
#   policy that ships with the project (deploy/policies/smollm2-135m-instruct); a directory
#   without one gets a --quick calibration of --model. --tokens: the session's history as token ids instead of the
#   Jargon File text the demo uses. --chart: draw recovery time and bytes sent per mode there.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
# Under sudo, the invoking user's cache (where deploy/setup.sh put the model), not root's.
home=$HOME
[ -n "${SUDO_USER:-}" ] && home=$(getent passwd "$SUDO_USER" | cut -d: -f6)
RISKKV_HOME="${RISKKV_HOME:-$home/.cache/riskkv}"
MODEL="$RISKKV_HOME/models/SmolLM2-135M-Instruct.Q4_1.gguf"
POLICY_DIR="$REPO/deploy/policies/smollm2-135m-instruct"
RATE=100mbit
BIN=$REPO/build/release/services
TOKENS=""
CHART=""
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL=$(realpath -m "$2"); shift 2 ;;
    --policy-dir) POLICY_DIR=$(realpath -m "$2"); shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --bin) BIN=$(realpath -m "$2"); shift 2 ;;
    --tokens) TOKENS=$2; shift 2 ;;
    --chart) CHART=$(realpath -m "$2"); shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "two_hosts.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
cd "$REPO"
if [ "$(id -u)" -ne 0 ]; then
  echo "two_hosts.sh: skipped: creating network namespaces needs root (run it with sudo)" >&2
  exit 77
fi
for tool in ip tc curl python3; do
  command -v $tool >/dev/null || { echo "two_hosts.sh: $tool is missing (deploy/setup.sh)" >&2; exit 1; }
done
JARGON=/usr/share/doc/jargon-text/jargon.txt.gz
if [ -z "$TOKENS" ] && [ ! -f "$JARGON" ]; then
  echo "two_hosts.sh: $JARGON is missing (Debian package jargon-text; or pass --tokens)" >&2
  exit 1
fi
[ -x "$BIN/riskkv-node" ] || { echo "two_hosts.sh: no $BIN/riskkv-node (deploy/build.sh)" >&2; exit 1; }
[ -f "$MODEL" ] || { echo "two_hosts.sh: no model $MODEL (deploy/setup.sh)" >&2; exit 1; }
if [ ! -f "$POLICY_DIR/policy.pb" ]; then
  echo "== calibrating a retention policy for $MODEL (--quick) into $POLICY_DIR"
  "$BIN/riskkv-calibrate" --model "$MODEL" --out "$POLICY_DIR" --quick
fi

NA=rkv$$a NB=rkv$$b NC=rkv$$c
WORK=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  # Whatever else still runs inside the namespaces.
  for ns in $NA $NB $NC; do ip netns pids $ns 2>/dev/null | xargs -r kill 2>/dev/null || true; done
  wait 2>/dev/null || true
  for ns in $NA $NB $NC; do ip netns del $ns 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
fail() { echo "two_hosts.sh: FAIL: $*" >&2; for f in "$WORK"/*.log; do echo "--- $f"; tail -5 "$f"; done >&2; exit 1; }

echo "== namespaces $NA (A, 10.199.0.1), $NB (B, 10.199.0.2), $NC (control plane); A <-> B at $RATE"
for ns in $NA $NB $NC; do
  ip netns add $ns
  ip -n $ns link set lo up
done
link() {  # ns1 ip1 ns2 ip2 name: a /30 between two namespaces
  ip link add "$5x" netns "$1" type veth peer name "$5y" netns "$3"
  ip -n "$1" addr add "$2/30" dev "$5x"
  ip -n "$3" addr add "$4/30" dev "$5y"
  ip -n "$1" link set "$5x" up
  ip -n "$3" link set "$5y" up
}
link $NA 10.199.0.1 $NB 10.199.0.2 rkv$$ab
link $NA 10.199.1.1 $NC 10.199.1.2 rkv$$ac
link $NB 10.199.2.1 $NC 10.199.2.2 rkv$$bc
# The edge backhaul: token-bucket shaping on both ends of A <-> B.
ip netns exec $NA tc qdisc add dev rkv$$abx root tbf rate $RATE burst 64kb latency 400ms
ip netns exec $NB tc qdisc add dev rkv$$aby root tbf rate $RATE burst 64kb latency 400ms

in_ns() { local ns=$1; shift; ip netns exec "$ns" "$@"; }
wait_port_file() {
  for _ in $(seq 600); do [ -s "$1" ] && return 0; sleep 0.1; done
  fail "$(basename "$1") did not start"
}
# The servers listen beyond loopback, so they check their callers: an access file and tokens from
# deploy/credentials.sh; riskkvctl acts as the operator, the nodes present the node token.
deploy/credentials.sh "$WORK/credentials" >/dev/null
export RISKKV_TOKEN_FILE="$WORK/credentials/operator.token"
ip netns exec $NC "$BIN/riskkv-control" --store "$WORK/store" --listen 0.0.0.0:7000 \
  --metrics-listen 0.0.0.0:9400 --port-file "$WORK/control" \
  --access-file "$WORK/credentials/access" >"$WORK/control.log" 2>&1 &
pids+=($!)
wait_port_file "$WORK/control"
bank=()
[ -f "$POLICY_DIR/bank.rkvbank" ] && bank=(--bank "$POLICY_DIR/bank.rkvbank")
POLICY_ID=$(in_ns $NC "$BIN/riskkvctl" --control 127.0.0.1:7000 policy-put \
  --policy "$POLICY_DIR/policy.pb" "${bank[@]}" |
  python3 -c "import json,sys; print(json.load(sys.stdin)['policy']['policyId'])")
start_node() {  # ns name advertise control
  ip netns exec "$1" "$BIN/riskkv-node" --model "$MODEL" --listen 0.0.0.0:7070 \
    --metrics-listen 0.0.0.0:9470 --advertise "$3" --control "$4" --policy-id "$POLICY_ID" \
    --cache-dir "$WORK/cache-$2" --port-file "$WORK/$2" --access-file "$WORK/credentials/access" \
    --peer-token-file "$WORK/credentials/node.token" >"$WORK/$2.log" 2>&1 &
  pids+=($!)
}
start_node $NA a 10.199.0.1:7070 10.199.1.2:7000
start_node $NB b 10.199.0.2:7070 10.199.2.2:7000
wait_port_file "$WORK/a"
wait_port_file "$WORK/b"
scrape() { in_ns "$1" curl -sf "http://127.0.0.1:$2/metrics"; }
has_policy() { grep -q '^riskkv_policy_version{.*} 1$' <<<"$(scrape "$1" 9470 || true)"; }
for ns in $NA $NB; do
  for _ in $(seq 100); do has_policy $ns && break; sleep 0.1; done
  has_policy $ns || fail "$ns did not get the policy"
done

ctl_a() { in_ns $NA "$BIN/riskkvctl" --node 127.0.0.1:7070 "$@"; }
ctl_b() { in_ns $NB "$BIN/riskkvctl" --node 127.0.0.1:7070 "$@"; }
source deploy/scenario.sh
SCENARIO_CHART=$CHART
SCENARIO_TITLE="two namespaces, A -> B over tbf $RATE"
if [ -n "$TOKENS" ]; then
  run_scenario 10.199.0.2:7070 --tokens "$TOKENS"
else
  prompt=$(zcat "$JARGON" | sed -n '/^The Story of Mel/,$p' |
    sed -n '2,40p' | tr -s ' \n' ' ')
  run_scenario 10.199.0.2:7070 --prompt "$prompt"
fi
ctl_b generate --session "$SCENARIO_LAST" -n 8 >/dev/null || fail "the moved session does not continue on B"

echo
echo "== metrics"
ma=$(scrape $NA 9470) mb=$(scrape $NB 9470) mc=$(scrape $NC 9400)
for mode in full_kv token_replay reconstruct; do
  grep -q "^riskkv_migrations_total{mode=\"$mode\",.*outcome=\"ok\",role=\"source\"}" <<<"$ma" ||
    fail "A counted no $mode migration"
  grep -q "^riskkv_migrations_total{mode=\"$mode\",.*outcome=\"ok\",role=\"target\"}" <<<"$mb" ||
    fail "B counted no $mode migration"
done
grep -q '^riskkv_control_watchers 2$' <<<"$mc" || fail "the control plane does not see both nodes"
grep -E '^riskkv_(migrations_total|kv_omitted_bytes_total)' <<<"$ma"
grep -E '^riskkv_(recovery_seconds_(sum|count)|policy_version|node_info)' <<<"$mb"
grep -E '^riskkv_control_(watchers|bank_downloads_total)' <<<"$mc"
echo "two hosts: done"
