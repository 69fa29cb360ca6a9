#!/usr/bin/env bash
# Three real riskkv-node processes on 127.0.0.1 ephemeral ports (A and B with a policy and bank
# from riskkv-calibrate --quick, C without), driven by riskkvctl and by a Python client that
# only knows the servers through reflection; then every /metrics is scraped.
#   two_nodes_test.sh BIN_DIR MODEL PYTHON
set -euo pipefail
BIN=$1 MODEL=$2 PY=$3
HERE=$(cd "$(dirname "$0")" && pwd)
source "$(dirname "$0")/process_test_lib.sh"

"$BIN/riskkv-calibrate" --model "$MODEL" --out "$T/cal" --quick --epsilon 10 --quiet >/dev/null

start_node() {  # name [policy] [extra flags...]
  local name=$1 extra=()
  [ "${2:-}" = policy ] && extra=(--policy "$T/cal/policy.pb" --bank "$T/cal/bank.rkvbank")
  shift; [ $# -gt 0 ] && shift
  extra+=("$@")
  "$BIN/riskkv-node" --model "$MODEL" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
    --port-file "$T/$name.ports" --threads 1 --activations f32 --kv-dtype f32 "${extra[@]}" \
    >"$T/$name.log" 2>&1 &
  pids+=($!)
  eval "pid_$name=$!"
}
start_node a policy
start_node b policy
start_node c
start_node slow none --link-mbps 1     # a source behind a slow link
start_node doomed                       # a target that dies mid-transfer
for n in a b c slow doomed; do
  wait_file "$T/$n.ports" || fail "node $n did not start"
done
tokens() { ctl "$1" show --session "$2" | json "['tokenIds']"; }

# The gRPC health service, through riskkvctl (what container health checks run).
out=$(ctl a health) || fail "health: $out"
[ "$out" = "$(addr a) SERVING" ] || fail "health: $out"
out=$("$BIN/riskkvctl" --node 127.0.0.1:1 health 2>&1) && fail "health of nothing: $out"

start() { ctl a start --tokens '[5,36,67,98,129,160,191,222,253,284]' | json "['sessionId']"; }

# FULL_KV: token-identical to the same session never migrated (greedy).
stay=$(start); move=$(start)
ctl a generate --session "$stay" -n 4 >/dev/null
ctl a generate --session "$move" -n 4 >/dev/null
reply=$(ctl a migrate --session "$move" --to "$(addr b)" --mode full_kv)
[ "$(echo "$reply" | json "['mode']")" = FULL_KV ] || fail "full_kv: $reply"
moved=$(echo "$reply" | json "['targetSessionId']")
ctl a generate --session "$stay" -n 12 >/dev/null
ctl b generate --session "$moved" -n 12 >/dev/null
[ "$(tokens a "$stay")" = "$(tokens b "$moved")" ] || fail "full_kv continuation differs: $(tokens a "$stay") vs $(tokens b "$moved")"
ctl a show --session "$move" >/dev/null 2>&1 && fail "the moved session is still on A"

# TOKEN_REPLAY: the target prefills the token ids; the first 32 tokens continue identically.
stay=$(start); move=$(start)
reply=$(ctl a migrate --session "$move" --to "$(addr b)" --mode token_replay --nofallback)
[ "$(echo "$reply" | json "['mode']")" = TOKEN_REPLAY ] || fail "token_replay: $reply"
moved=$(echo "$reply" | json "['targetSessionId']")
ctl a generate --session "$stay" -n 32 >/dev/null
ctl b generate --session "$moved" -n 32 >/dev/null
[ "$(tokens a "$stay")" = "$(tokens b "$moved")" ] || fail "token_replay continuation differs"

# RECONSTRUCT sends the kept layers only; the target rebuilds the others. The continuation's
# NLL change against the never-migrated session is reported (node_test holds it to the
# policy's measured bound).
stay=$(start); s=$(start)
reply=$(ctl a migrate --session "$s" --to "$(addr b)" --mode reconstruct --nofallback)
[ "$(echo "$reply" | json "['mode']")" = RECONSTRUCT ] || fail "reconstruct: $reply"
[ "$(echo "$reply" | json "['kvBytesOmitted']")" -gt 0 ] || fail "nothing omitted: $reply"
cont='[7,11,13,17,19,23,29,31,37,41,43,47,53,59,61,67]'
exact=$(ctl a score --session "$stay" --tokens "$cont" | json "['meanNll']")
rebuilt=$(ctl b score --session "$(echo "$reply" | json "['targetSessionId']")" --tokens "$cont" |
  json "['meanNll']")
"$PY" -c "print('reconstruct: continuation dNLL %+.5f nats/token' % ($rebuilt - $exact))"
# The KL divergence and top-1 agreement against the unmoved copy's top tokens, given as a file
# or on standard input.
ctl a score --session "$stay" --tokens "$cont" --top >"$T/top.json"
moved_id=$(echo "$reply" | json "['targetSessionId']")
ctl b score --session "$moved_id" --tokens "$cont" --reference "$T/top.json" >"$T/scored.json"
"$PY" - "$T/scored.json" <<'PY' || fail "KL against the unmoved copy: $(cat "$T/scored.json")"
import json, sys
q = json.load(open(sys.argv[1]))
assert 0 < q["meanKl"] < 5 and 0 <= q.get("top1Agreement", 0) <= 1, q
print("reconstruct: KL %.5f, top-1 %.3f" % (q["meanKl"], q.get("top1Agreement", 0)))
PY
self=$(ctl a score --session "$stay" --tokens "$cont" --reference - <"$T/top.json")
[ "$(echo "$self" | json "['top1Agreement']")" = 1 ] || fail "against itself: $self"
out=$(ctl a score --session "$stay" --tokens "$cont" --reference "$T/no-such.json" 2>&1) &&
  fail "a missing reference was accepted: $out"
grep -q -- "--reference" <<<"$out" || fail "no reason for a missing reference: $out"

# Another rung of the policy's ladder (the quick calibration chooses int4 with every group
# rebuilt; int4 with one group is a rung too): more layers sent, the rung named in the reply.
s=$(start)
reply=$(ctl a migrate --session "$s" --to "$(addr b)" --mode reconstruct --nofallback \
  --rebuilt-groups 1)
[ "$(echo "$reply" | json "['rebuiltGroups']")" = 1 ] || fail "rung k=1: $reply"
[ "$(echo "$reply" | json "['wireForm']")" = KV_WIRE_INT4 ] || fail "rung k=1's form: $reply"
ctl b generate --session "$(echo "$reply" | json "['targetSessionId']")" -n 2 >/dev/null ||
  fail "the session moved at rung k=1 does not decode"
out=$(ctl a migrate --session "$(start)" --to "$(addr b)" --mode reconstruct --nofallback \
  --rebuilt-groups 1 --wire-form int8 2>&1) && fail "a rung outside the ladder ran: $out"
grep -q "int8 k=1 is not a rung of policy" <<<"$out" || fail "no rung named: $out"

# C has no policy: RECONSTRUCT is refused at the handshake; with fallback FULL_KV runs, without
# it the session stays on A.
s=$(start)
out=$(ctl a migrate --session "$s" --to "$(addr c)" --mode reconstruct --nofallback 2>&1) &&
  fail "C accepted RECONSTRUCT: $out"
grep -q "no retention policy" <<<"$out" || fail "refusal without the reason: $out"
ctl a generate --session "$s" -n 2 >/dev/null || fail "session lost after a refused migration"
reply=$(ctl a migrate --session "$s" --to "$(addr c)" --mode reconstruct)
[ "$(echo "$reply" | json "['mode']")" = FULL_KV ] || fail "no fallback: $reply"
grep -q "fallback: reconstruct refused" <<<"$reply" || fail "fallback reason missing: $reply"

# A target killed mid-transfer: the migration fails, the session stays on the source, intact,
# and a retry to another node succeeds.
long=$(ctl slow start --tokens "[$(seq -s, 1 3 450)]" | json "['sessionId']")
ctl slow generate --session "$long" -n 2 >/dev/null
before=$(tokens slow "$long")
ctl slow migrate --session "$long" --to "$(addr doomed)" --mode full_kv --nofallback \
  >"$T/doomed.out" 2>&1 &
mig=$!
# Kill the target once the migration holds the session (show answers "busy"), mid-transfer:
# 300 KB at 1 Mbit/s take 2.4 s.
busy() { local out; out=$(ctl slow show --session "$long" 2>&1 || true); [[ $out == *busy* ]]; }
for _ in $(seq 200); do busy && break; sleep 0.02; done
busy || fail "the migration to the doomed node never started: $(cat "$T/doomed.out")"
sleep 0.5
kill -9 "$pid_doomed"; wait "$pid_doomed" 2>/dev/null || true
wait "$mig" && fail "migration to a killed target succeeded: $(cat "$T/doomed.out")"
grep -q "stays on this node" "$T/doomed.out" || fail "no clean error: $(cat "$T/doomed.out")"
[ "$(tokens slow "$long")" = "$before" ] || fail "session changed after a failed migration"
reply=$(ctl slow migrate --session "$long" --to "$(addr b)" --mode full_kv --nofallback) ||
  fail "retry after the killed target"
[ "$(echo "$reply" | json "['mode']")" = FULL_KV ] || fail "retry: $reply"

# A client the project did not generate.
reply=$("$PY" "$HERE/../tools/reflection_client.py" "$(addr a)" "$(addr b)" TOKEN_REPLAY) ||
  fail "reflection client"
[ "$(echo "$reply" | json "['mode']")" = TOKEN_REPLAY ] || fail "reflection client: $reply"

# The control plane: versioned puts, the bank sent once, a restart that keeps everything, and a
# malformed put refused.
start_control() {
  rm -f "$T/control.ports"
  "$BIN/riskkv-control" --store "$T/store" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
    --port-file "$T/control.ports" \
    >>"$T/control.log" 2>&1 &
  control_pid=$!
  pids+=($control_pid)
  wait_file "$T/control.ports" || fail "control plane did not start"
  CONTROL=127.0.0.1:$(cut -d' ' -f1 "$T/control.ports")
}
start_control
v=$("$BIN/riskkvctl" --control "$CONTROL" policy-put --policy "$T/cal/policy.pb" \
  --bank "$T/cal/bank.rkvbank" | json "['policy']['version']")
[ "$v" = 1 ] || fail "first put: version $v"
v=$("$BIN/riskkvctl" --control "$CONTROL" policy-put --policy "$T/cal/policy.pb" \
  --assign-version | json "['policy']['version']")
[ "$v" = 2 ] || fail "second put: version $v"
out=$("$BIN/riskkvctl" --control "$CONTROL" policy-put --policy "$T/cal/policy.pb" 2>&1) &&
  fail "a stale version was stored: $out"
grep -q "next version is 3" <<<"$out" || fail "stale put: $out"
kill "$control_pid"; wait "$control_pid" 2>/dev/null || true
start_control
v=$("$BIN/riskkvctl" --control "$CONTROL" policy-get --policy-id tiny-llama-deep |
  json "['policy']['version']")
[ "$v" = 2 ] || fail "after a restart: version $v"
echo garbage >"$T/bad.pb"
out=$("$BIN/riskkvctl" --control "$CONTROL" policy-put --policy "$T/bad.pb" 2>&1) &&
  fail "a malformed policy was stored: $out"
grep -q '"latestVersion":"2"' <<<"$("$BIN/riskkvctl" --control "$CONTROL" policy-list)" ||
  fail "policy-list: $("$BIN/riskkvctl" --control "$CONTROL" policy-list)"

# The counters moved (B received two RECONSTRUCT sessions: the policy's own rung and k=1).
ma=$(metrics a) mb=$(metrics b) mc=$(metrics c)
grep -q 'riskkv_migrations_total{mode="full_kv",model="tiny_llama_deep",outcome="ok",role="source"} 2' <<<"$ma" ||
  fail "A's full_kv count: $(grep migrations_total <<<"$ma")"
grep -q 'riskkv_migrations_total{mode="reconstruct",model="tiny_llama_deep",outcome="ok",role="target"} 2' <<<"$mb" ||
  fail "B's reconstruct count: $(grep migrations_total <<<"$mb")"
grep -q 'riskkv_migrations_total{mode="token_replay",model="tiny_llama_deep",outcome="ok",role="target"} 2' <<<"$mb" ||
  fail "B's token_replay count"
grep -q 'riskkv_migration_failures_total{model="tiny_llama_deep",reason="handshake",role="target"} 2' <<<"$mc" ||
  fail "C's refusals: $(grep failures <<<"$mc")"
grep -q '^riskkv_recovery_seconds_count{mode="reconstruct",model="tiny_llama_deep"} 2' <<<"$mb" ||
  fail "B's recovery histogram"
grep -q '^riskkv_active_sessions{model="tiny_llama_deep"} 6' <<<"$mb" || fail "B's sessions: $(grep active <<<"$mb")"
grep -q 'riskkv_migration_failures_total{model="tiny_llama_deep",reason="transfer_failed",role="source"} 1' <<<"$(metrics slow)" ||
  fail "the slow source's failure count: $(metrics slow | grep failures)"
echo "two-node test passed"
