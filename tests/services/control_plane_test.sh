#!/usr/bin/env bash
# Real riskkv-node processes following a real riskkv-control: a policy put while they run reaches
# both; with the control plane stopped a restarted node serves RECONSTRUCT from its cache; when
# the control plane comes back the nodes catch up on the version put meanwhile. The policy sends
# its kept layers in the transform form (a coarse step makes it the cheapest point the wide budget
# admits), so its bank carries the transforms and every RECONSTRUCT codes with them.
#   control_plane_test.sh BIN_DIR MODEL PYTHON
set -euo pipefail
BIN=$1 MODEL=$2 PY=$3
source "$(dirname "$0")/process_test_lib.sh"

"$BIN/riskkv-calibrate" --model "$MODEL" --out "$T/cal" --quick --epsilon 10 --quiet \
  --wire-forms int4,transform --transform-step 2 >/dev/null
grep -q 'wire_form: "transform"' "$T/cal/policy.txt" || fail "the policy is not in the transform form"
ID=tiny-llama-deep

start_control() {  # [port]
  rm -f "$T/control.ports"
  "$BIN/riskkv-control" --store "$T/store" --listen "127.0.0.1:${1:-0}" --metrics-listen 127.0.0.1:0 \
    --port-file "$T/control.ports" >>"$T/control.log" 2>&1 &
  control_pid=$!
  pids+=($control_pid)
  wait_file "$T/control.ports" || fail "control plane did not start"
  CONTROL=127.0.0.1:$(cut -d' ' -f1 "$T/control.ports")
}
put() { "$BIN/riskkvctl" --control "$CONTROL" policy-put "$@" | json "['policy']['version']"; }
start_node() {  # name
  rm -f "$T/$1.ports"
  "$BIN/riskkv-node" --model "$MODEL" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
    --port-file "$T/$1.ports" --threads 1 --activations f32 --kv-dtype f32 \
    --control "$CONTROL" --policy-id "$ID" --cache-dir "$T/cache-$1" >>"$T/$1.log" 2>&1 &
  pids+=($!)
  eval "pid_$1=$!"
  wait_file "$T/$1.ports" || fail "node $1 did not start"
}
reconstruct() {  # from to: a RECONSTRUCT migration that must run as such
  local s reply
  s=$(ctl "$1" start --tokens '[5,36,67,98,129,160,191,222,253,284]' | json "['sessionId']")
  reply=$(ctl "$1" migrate --session "$s" --to "$(addr "$2")" --mode reconstruct --nofallback) ||
    fail "reconstruct $1 -> $2"
  [ "$(echo "$reply" | json "['mode']")" = RECONSTRUCT ] || fail "reconstruct: $reply"
  [ "$(echo "$reply" | json "['wireForm']")" = KV_WIRE_TRANSFORM ] || fail "wire form: $reply"
}

# Flags are checked before the model loads.
out=$("$BIN/riskkv-node" --model "$MODEL" --control 127.0.0.1:1 2>&1) && fail "no --policy-id: $out"
grep -q -- "--control and --policy-id go together" <<<"$out" || fail "flag error: $out"
out=$("$BIN/riskkv-node" --model "$MODEL" --control 127.0.0.1:1 --policy-id "$ID" \
  --policy "$T/cal/policy.pb" --bank "$T/cal/bank.rkvbank" 2>&1) && fail "both sources: $out"
grep -q "exclude each other" <<<"$out" || fail "flag error: $out"
out=$("$BIN/riskkv-node" --model "$MODEL" --receive-idle-timeout 0 2>&1) && fail "idle 0: $out"
grep -q -- "--receive-idle-timeout must be > 0" <<<"$out" || fail "flag error: $out"

start_control
grep -q "SERVING$" <<<"$("$BIN/riskkvctl" --control "$CONTROL" control-health)" || fail "control health"
[ "$(put --policy "$T/cal/policy.pb" --bank "$T/cal/bank.rkvbank")" = 1 ] || fail "first put"
start_node a
start_node b
for n in a b; do
  wait_metric $n 'riskkv_policy_version{model="tiny_llama_deep"} 1'
  wait_metric $n 'riskkv_control_connected{model="tiny_llama_deep"} 1'
done
reconstruct a b
# The control plane's own metrics: two watchers, each node downloaded the bank once.
cm=$(metrics control)
[ -n "$cm" ] || fail "control plane metrics"
grep -q '^riskkv_control_watchers 2$' <<<"$cm" || fail "watchers: $(grep watchers <<<"$cm")"
grep -q '^riskkv_control_bank_downloads_total 2$' <<<"$cm" || fail "downloads: $(grep bank <<<"$cm")"
grep -q '^riskkv_control_puts_total{outcome="ok"} 1$' <<<"$cm" || fail "puts: $(grep puts <<<"$cm")"
grep -q "^riskkv_control_policy_latest_version{policy_id=\"$ID\"} 1$" <<<"$cm" ||
  fail "latest version: $(grep latest <<<"$cm")"
grep -q '^riskkv_node_info{address="127.0.0.1:[0-9]*",backend="cpu",model="tiny_llama_deep"} 1$' \
  <<<"$(metrics a)" || fail "node info: $(metrics a | grep node_info)"

# A new version put while the nodes run reaches both; migrations name it in their handshake.
[ "$(put --policy "$T/cal/policy.pb" --assign-version)" = 2 ] || fail "second put"
for n in a b; do wait_metric $n 'riskkv_policy_version{model="tiny_llama_deep"} 2'; done
reconstruct b a
grep -q "now using policy $ID v2" "$T/a.log" || fail "A did not log the update"

# The control plane stops: the nodes keep version 2; B restarted meanwhile starts from its
# cache and still rebuilds.
port=$(cut -d' ' -f1 "$T/control.ports")
kill "$control_pid"; wait "$control_pid" 2>/dev/null || true
wait_metric a 'riskkv_control_connected{model="tiny_llama_deep"} 0'
kill "$pid_b"; wait "$pid_b" 2>/dev/null || true
start_node b
m=$(metrics b)  # at once: a restarted node serves its cached version before any Watch
grep -qxF 'riskkv_policy_version{model="tiny_llama_deep"} 2' <<<"$m" ||
  fail "restarted B does not serve the cached policy: $(grep policy <<<"$m")"
grep -q "policy $ID v2 from the cache" "$T/b.log" || fail "B did not say it used the cache"
reconstruct a b
reconstruct b a

# Version 3 is stored while the control plane is down (a second instance on the same store);
# once the control plane is back on its address the nodes catch up.
start_control
[ "$(put --policy "$T/cal/policy.pb" --assign-version)" = 3 ] || fail "third put"
kill "$control_pid"; wait "$control_pid" 2>/dev/null || true
start_control "$port"
for n in a b; do
  wait_metric $n 'riskkv_policy_version{model="tiny_llama_deep"} 3'
  wait_metric $n 'riskkv_control_connected{model="tiny_llama_deep"} 1'
done
reconstruct a b
grep -q '\.rkvbank$' <<<"$(ls "$T/cache-a/banks")" || fail "A cached no bank"
echo "control plane test passed"
