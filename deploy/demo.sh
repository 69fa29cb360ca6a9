#!/usr/bin/env bash
# The main job: sets everything up, builds, takes the retention policy for SmolLM2-135M that ships
# with the project (deploy/policies/smollm2-135m-instruct: calibrated by riskkv-calibrate, its
# report beside it; RISKKV_POLICY_DIR names another), starts the control plane and puts the policy
# there, starts two edge nodes on this machine that follow it (node A sends over an emulated
# 100 Mbit/s link), starts a session on A, generates, migrates copies of it to B in each mode,
# continues on B, and prints mode, KV bytes sent, transfer and recovery time and the
# continuation's NLL change against the never-migrated session; then migrates copies live while
# they generate (downtime against the whole migration, the stream following to B); then the
# metrics.
#   deploy/demo.sh [--stop]     the servers stay up afterwards (control plane 7000, nodes
#                               7070/7071, metrics 9470/9471) for riskkvctl and curl; --stop
#                               stops them at the end. A new run first stops the previous one's.
set -euo pipefail
cd "$(dirname "$0")/.."
stop_at_end=0
case "${1:-}" in
  --stop) stop_at_end=1 ;;
  "") ;;
  *) echo "usage: deploy/demo.sh [--stop]" >&2; exit 2 ;;
esac
deploy/setup.sh
deploy/build.sh release
RISKKV_HOME="${RISKKV_HOME:-$HOME/.cache/riskkv}"
MODEL="$RISKKV_HOME/models/SmolLM2-135M-Instruct.Q4_1.gguf"
BIN=build/release/services
POLICY_DIR="${RISKKV_POLICY_DIR:-deploy/policies/smollm2-135m-instruct}"
if [ ! -f "$POLICY_DIR/policy.pb" ]; then
  echo "no policy.pb in $POLICY_DIR (RISKKV_POLICY_DIR names a riskkv-calibrate --out directory)" >&2
  exit 1
fi

# Logs, the control plane's store and the nodes' policy caches, fresh for every run.
DEMO="$RISKKV_HOME/demo"
if [ -f "$DEMO/pids" ]; then
  # Only processes that still are this demo's servers (pids may have been reused since).
  old=()
  for p in $(cat "$DEMO/pids"); do
    grep -q riskkv- "/proc/$p/cmdline" 2>/dev/null && old+=("$p")
  done
  if ((${#old[@]})); then
    kill "${old[@]}" 2>/dev/null || true
    for _ in $(seq 100); do
      alive=0
      for p in "${old[@]}"; do [ -d "/proc/$p" ] && alive=1; done
      [ $alive = 0 ] && break
      sleep 0.1
    done
  fi
fi
rm -rf "$DEMO"
mkdir -p "$DEMO"
LOGS=$DEMO
pids=()
stop() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap 'stop' EXIT
wait_port_file() {
  for _ in $(seq 300); do [ -s "$1" ] && return 0; sleep 0.1; done
  cat "$1.log"; exit 1
}
# Every server checks its callers: the access file and tokens deploy/credentials.sh writes (kept
# between runs); riskkvctl here acts as the operator, the nodes present the node token.
CRED="$DEMO/credentials"
deploy/credentials.sh "$CRED" >/dev/null
export RISKKV_TOKEN_FILE="$CRED/operator.token"
ACCESS=(--access-file "$CRED/access")
CONTROL=127.0.0.1:7000
echo "== control plane on $CONTROL (store $LOGS/control-store, access file $CRED/access)"
"$BIN/riskkv-control" --store "$LOGS/control-store" --listen $CONTROL "${ACCESS[@]}" \
  --port-file "$LOGS/control" >"$LOGS/control.log" 2>&1 &
pids+=($!)
echo "${pids[*]}" >"$DEMO/pids"
wait_port_file "$LOGS/control"
bank=()  # none when the calibration's gate fell back to exact KV
[ -f "$POLICY_DIR/bank.rkvbank" ] && bank=(--bank "$POLICY_DIR/bank.rkvbank")
put=$("$BIN/riskkvctl" --control $CONTROL policy-put --policy "$POLICY_DIR/policy.pb" "${bank[@]}")
POLICY_ID=$(echo "$put" | python3 -c "import json,sys; print(json.load(sys.stdin)['policy']['policyId'])")
echo "policy $POLICY_ID version 1 stored; the nodes fetch it and its bank from the control plane"

"$BIN/riskkv-node" --model "$MODEL" --listen 127.0.0.1:7070 --metrics-listen 127.0.0.1:9470 \
  --port-file "$LOGS/a" --link-mbps 100 --control $CONTROL --policy-id "$POLICY_ID" \
  "${ACCESS[@]}" --peer-token-file "$CRED/node.token" --cache-dir "$LOGS/cache-a" \
  >"$LOGS/a.log" 2>&1 &
pids+=($!)
"$BIN/riskkv-node" --model "$MODEL" --listen 127.0.0.1:7071 --metrics-listen 127.0.0.1:9471 \
  --port-file "$LOGS/b" --control $CONTROL --policy-id "$POLICY_ID" \
  "${ACCESS[@]}" --peer-token-file "$CRED/node.token" --cache-dir "$LOGS/cache-b" \
  >"$LOGS/b.log" 2>&1 &
pids+=($!)
echo "${pids[*]}" >"$DEMO/pids"
for n in a b; do wait_port_file "$LOGS/$n"; done
has_policy() { grep -q '^riskkv_policy_version{.*} 1$' <<<"$(curl -s "http://127.0.0.1:$1/metrics")"; }
for port in 9470 9471; do
  for _ in $(seq 100); do has_policy $port && break; sleep 0.1; done
  has_policy $port || { echo "the node with metrics on $port did not get the policy"; tail "$LOGS"/*.log; exit 1; }
done
A=127.0.0.1:7070 B=127.0.0.1:7071
ctl_a() { "$BIN/riskkvctl" --node $A "$@"; }
ctl_b() { "$BIN/riskkvctl" --node $B "$@"; }
source deploy/scenario.sh

# The start of "The Story of Mel" from the Jargon File: 521 tokens (riskkvctl start prints
# tokens); the 24 the scenario generates make the 544-token history that migrates.
prompt=$(zcat /usr/share/doc/jargon-text/jargon.txt.gz | sed -n '/^The Story of Mel/,$p' |
  sed -n '2,40p' | tr -s ' \n' ' ')
SCENARIO_CHART="$DEMO/recovery-by-mode.svg" \
  SCENARIO_TITLE="SmolLM2-135M, 544-token session, A -> B over 100 Mbit/s" \
  run_scenario $B --prompt "$prompt"
last=$SCENARIO_LAST
echo
echo "== live hand-over: the same history migrated while it generates (riskkvctl migrate --live)"
run_live_scenario $B "$SCENARIO_HISTORY"
"$BIN/riskkvctl" --control $CONTROL policy-get --policy-id "$POLICY_ID" | python3 -c "
import json,sys; p=json.load(sys.stdin)['policy']; t=p.get('testDeltaNll', {})
print('the policy (%s v%s) rebuilds %d of %d layers and sends the others %s; calibration measured dNLL %+.5f [95%% CI %+.5f, %+.5f] in %s arithmetic'
      % (p['policyId'], p['version'], sum(len(g['targets']) for g in p.get('rebuiltGroups', [])),
         len(p.get('keptLayers', [])) + sum(len(g['targets']) for g in p.get('rebuiltGroups', [])),
         p.get('wireForm') or 'plain', t.get('mean', 0), t.get('ciLow', 0), t.get('ciHigh', 0),
         p.get('arithmetic') or 'unknown'))
print('on %s held-out requests of %s + %s tokens; the dNLL column above is one %s-token continuation'
      % (t.get('requests', 0), p.get('historyTokens'), p.get('evalTokens'), $SCENARIO_CONTINUATION_TOKENS))"
echo
echo "== the last session continues on B"
ctl_b generate --session "$last" -n 24
echo
echo "== metrics (curl http://127.0.0.1:9470/metrics, :9471)"
curl -s http://127.0.0.1:9470/metrics | grep -E '^riskkv_(migrations_total|kv_omitted_bytes_total|migration_downtime_seconds_(sum|count)|active_sessions|policy_version)'
curl -s http://127.0.0.1:9471/metrics | grep -E '^riskkv_(migrations_total|recovery_seconds_(sum|count)|active_sessions|policy_version)'
if [ $stop_at_end = 0 ]; then
  trap - EXIT
  echo
  echo "servers left running: control plane $CONTROL, A=$A (metrics :9470), B=$B (metrics :9471); logs in $LOGS"
  echo "try: RISKKV_TOKEN_FILE=$CRED/operator.token $BIN/riskkvctl --node $B list; curl -s 127.0.0.1:9471/metrics | grep ^riskkv_"
  echo "stop them with: kill \$(cat $DEMO/pids)   (or run deploy/demo.sh --stop)"
else
  stop
  rm -f "$DEMO/pids"
fi
