#!/usr/bin/env bash
# Live hand-over between real riskkv-node processes serving SmolLM2, driven by riskkvctl as a
# user drives it: `generate` streams while `migrate --live` moves the session, follows it to the
# target and prints exactly the tokens of the same request on a node that never migrated
# (greedy FULL_KV, sampled TOKEN_REPLAY); a target killed with SIGKILL during the pre-copy costs
# the stream nothing; a source killed during the pre-copy leaves nothing on the target.
#   live_handover_test.sh BIN_DIR MODEL PYTHON
set -euo pipefail
BIN=$1 MODEL=$2 PY=$3
source "$(dirname "$0")/process_test_lib.sh"
[ -f "$MODEL" ] || fail "no model at $MODEL (deploy/setup.sh fetches it)"

start_node() {  # name [flags...]
  local name=$1
  shift
  "$BIN/riskkv-node" --model "$MODEL" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
    --port-file "$T/$name.ports" --threads 1 "$@" >"$T/$name.log" 2>&1 &
  pids+=($!)
  eval "pid_$name=$!"
}
start_node a --link-mbps 100
start_node b
start_node victim   # a target killed mid-pre-copy
start_node slow --link-mbps 5
for n in a b victim slow; do wait_file "$T/$n.ports" || fail "node $n did not start"; done

start() {  # node prompt [start flags...]
  local n=$1 p=$2
  shift 2
  ctl "$n" start --prompt "$p" "$@" | json "['sessionId']"
}
# Until `generate` holds the session (ListSessions shows it busy), then a little more.
wait_generating() {  # node session
  for _ in $(seq 200); do
    ctl "$1" list | "$PY" -c "import json,sys; s=[x for x in json.load(sys.stdin).get('sessions',[]) if x['sessionId']=='$2']; sys.exit(0 if s and s[0].get('busy') else 1)" && {
      sleep 0.3
      return 0
    }
    sleep 0.05
  done
  fail "session $2 on $1 never started generating"
}
sessions() { ctl "$1" list | json ".get('sessions', []).__len__()"; }

prompt="The old lighthouse keeper climbed the stairs every evening and"
# Long enough that the generation outlasts a live migration on the fastest CPU kernels.
n=400
for run in "full_kv" "token_replay --temperature 0.8 --seed 5"; do
  read -r mode sampling <<<"$run"
  ref=$(start a "$prompt" $sampling)
  expect=$(ctl a generate --session "$ref" -n $n --ids)
  id=$(start a "$prompt" $sampling)
  ctl a generate --session "$id" -n $n --ids >"$T/gen.out" 2>"$T/gen.err" &
  gen=$!
  wait_generating a "$id"
  reply=$(ctl a migrate --session "$id" --to "$(addr b)" --mode "$mode" --live) ||
    fail "$mode: live migration failed: $reply"
  wait "$gen" || fail "$mode: generate failed: $(cat "$T/gen.err")"
  [ "$(echo "$reply" | json "['live']")" = True ] || fail "$mode: not live: $reply"
  [ "$(echo "$reply" | json "['precopyRounds']")" -ge 1 ] || fail "$mode: no pre-copy: $reply"
  grep -q "moved to $(addr b)" "$T/gen.err" || fail "$mode: the stream did not follow: $(cat "$T/gen.err")"
  [ "$(cat "$T/gen.out")" = "$expect" ] ||
    fail "$mode: tokens differ from the unmoved run: $(cat "$T/gen.out") vs $expect"
  echo "$mode live: downtime $(echo "$reply" | json "['downtimeSeconds']") s of $(echo "$reply" | json "['totalSeconds']") s, $(echo "$reply" | json "['precopyRounds']") rounds, tokens identical"
done
m=$(metrics a)
grep -q '^riskkv_migration_downtime_seconds_count{handover="live",mode="full_kv",model=.*} 1$' <<<"$m" ||
  fail "no live downtime in /metrics: $(grep downtime <<<"$m" | head -5)"

# A long history behind a 5 Mbit/s link: the pre-copy lasts seconds.
long="$prompt"
for _ in $(seq 25); do long="$long the waves kept their own time against the rocks below, and"; done
ref=$(start slow "$long")
expect=$(ctl slow generate --session "$ref" -n 60 --ids)

# The target dies (SIGKILL) a second into the pre-copy: the stream goes on, uninterrupted.
id=$(start slow "$long")
ctl slow generate --session "$id" -n 60 --ids >"$T/gen.out" 2>"$T/gen.err" &
gen=$!
wait_generating slow "$id"
ctl slow migrate --session "$id" --to "$(addr victim)" --mode full_kv --live >"$T/mig.out" 2>&1 &
mig=$!
sleep 1
kill -9 "$pid_victim"
wait "$mig" && fail "a migration to a killed target succeeded: $(cat "$T/mig.out")"
grep -q "stays on this node" "$T/mig.out" || fail "target killed: $(cat "$T/mig.out")"
wait "$gen" || fail "the stream broke with its target: $(cat "$T/gen.err")"
[ "$(cat "$T/gen.out")" = "$expect" ] || fail "target killed: tokens differ"
ctl slow show --session "$id" >/dev/null || fail "the session left the source"
echo "target killed during the pre-copy: the session generated on, tokens identical"

# The source dies (SIGKILL) a second into the pre-copy: nothing is registered on the target.
before=$(sessions b)
ctl slow migrate --session "$id" --to "$(addr b)" --mode full_kv --live >"$T/mig.out" 2>&1 &
mig=$!
sleep 1
kill -9 "$pid_slow"
wait "$mig" && fail "a migration from a killed source succeeded"
sleep 1
[ "$(sessions b)" = "$before" ] || fail "the killed source left a session on the target"
echo "source killed during the pre-copy: nothing registered on the target"
echo "live_handover_test: ok"
