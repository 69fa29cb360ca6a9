# The migration scenario the demo (deploy/demo.sh) and the two-namespace run (deploy/netns/)
# share; source it. `ctl_a` and `ctl_b` must be defined as functions running riskkvctl against
# node A and node B (however the caller reaches them).
#
#   run_scenario TARGET START_ARGS...
#     Starts a session on A with START_ARGS (riskkvctl start flags: --prompt TEXT or --tokens
#     JSON), generates 24 tokens, then 32 more as the continuation to score. Then, for each
#     mode, migrates a fresh copy of the history to TARGET (B's address as A reaches it), scores
#     the continuation on B against the never-migrated copy on A, and prints one row: mode, wire
#     form, KV bytes sent and their share of FULL_KV plain (f16 at the nodes' default KV dtype),
#     the transfer rate those bytes achieved, transfer, recovery and rebuild time, and the
#     continuation's NLL change, KL divergence from the unmoved copy's next-token distributions
#     (over its 64 most likely tokens and the rest as one) and top-1 agreement with them, as
#     `riskkvctl score --top` / `--reference` give them. FULL_KV runs three times, plain, int8 and int4 (compressed KV
#     without reconstruction); RECONSTRUCT sends the policy's wire form. Sets SCENARIO_LAST to the last session moved to B.
#     With SCENARIO_CHART set to a path, also draws recovery time and bytes sent per mode there
#     (deploy/chart_modes.py) and keeps the rows beside it (.jsonl).

_scenario_field() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }

run_scenario() {
  local target=$1
  shift
  local s0 history continuation ref ref_nll ref_top s reply moved scored mode wire run full_bytes=0
  s0=$(ctl_a start "$@" | _scenario_field "['sessionId']")
  echo "== session on A"
  ctl_a generate --session "$s0" -n 24
  history=$(ctl_a show --session "$s0" | _scenario_field "['tokenIds']")
  ctl_a generate --session "$s0" -n 32 >/dev/null
  continuation=$(ctl_a show --session "$s0" | python3 -c "
import json,sys; h=$history; t=json.load(sys.stdin)['tokenIds']; print(json.dumps(t[len(h):]))")
  ref=$(ctl_a start --tokens "$history" | _scenario_field "['sessionId']")
  ref_top=$(mktemp)
  ctl_a score --session "$ref" --tokens "$continuation" --top >"$ref_top"
  ref_nll=$(_scenario_field "['meanNll']" <"$ref_top")
  printf '\n%-17s %6s %14s %8s %10s %11s %11s %10s %10s %9s %6s %11s\n' mode wire \
    "KV bytes sent" "of full" "Mbit/s" "transfer s" "recovery s" "rebuild s" "dNLL" "KL" "top-1" \
    "downtime s"
  local rows=${SCENARIO_CHART:+${SCENARIO_CHART%.svg}.jsonl}
  [ -n "$rows" ] && : >"$rows"
  for run in full_kv:plain full_kv:int8 full_kv:int4 token_replay:plain reconstruct:plain \
    auto:plain; do
    mode=${run%%:*} wire=${run##*:}
    s=$(ctl_a start --tokens "$history" | _scenario_field "['sessionId']")
    reply=$(ctl_a migrate --session "$s" --to "$target" --mode $mode --wire-form $wire)
    [ "$run" = full_kv:plain ] && full_bytes=$(echo "$reply" | _scenario_field "['kvBytesSent']")
    moved=$(echo "$reply" | _scenario_field "['targetSessionId']")
    # The reference goes on standard input: riskkvctl may run where this host's files are not.
    scored=$(ctl_b score --session "$moved" --tokens "$continuation" --reference - <"$ref_top")
    echo "$reply" | SCORED="$scored" python3 -c "
import json,os,sys; r=json.load(sys.stdin); q=json.loads(os.environ['SCORED'])
dnll, kl, top1 = q['meanNll'] - $ref_nll, q.get('meanKl', 0), q.get('top1Agreement', 0)
sent, t = int(r.get('kvBytesSent', 0)), r.get('transferSeconds', 0)
rate = '%10.1f' % (sent * 8 / t / 1e6) if sent and t else '%10s' % '-'
mode = '$mode' if '$mode' != 'auto' else 'auto:' + r['mode'].lower()
wire = r.get('wireForm', 'KV_WIRE_FORM_UNSPECIFIED').replace('KV_WIRE_', '').lower()
wire = '-' if wire == 'form_unspecified' else wire
share = sent / $full_bytes if $full_bytes else 0
print('%-17s %6s %14d %7.1f%% %s %11.4f %11.4f %10.4f %+10.5f %9.5f %5.1f%% %11.4f' % (mode,
      wire, sent, 100 * share, rate, t, r['recoverySeconds'], r.get('rebuildSeconds', 0), dnll,
      kl, 100 * top1, r.get('downtimeSeconds', 0)))
if '$rows':
    with open('$rows', 'a') as f:
        f.write(json.dumps({'mode': mode, 'wire_form': wire, 'kv_bytes_sent': sent,
                            'bytes_share': share, 'recovery_seconds': r['recoverySeconds'],
                            'rebuild_seconds': r.get('rebuildSeconds', 0),
                            'delta_nll': dnll, 'kl': kl, 'top1': top1}) + '\\n')"
    SCENARIO_LAST=$moved
  done
  rm -f "$ref_top"
  if [ -n "$rows" ]; then
    python3 "$(dirname "${BASH_SOURCE[0]}")/chart_modes.py" "$rows" "$SCENARIO_CHART" \
      "${SCENARIO_TITLE:-migration by mode}"
    echo "chart: $SCENARIO_CHART"
  fi
  SCENARIO_CONTINUATION_TOKENS=$(echo "$continuation" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
  SCENARIO_HISTORY=$history
}

#   run_live_scenario TARGET HISTORY_JSON
#     The same history, now generating: for each mode, a session with HISTORY_JSON's tokens on A
#     generates 400 tokens with `riskkvctl generate --ids` while `migrate --live` moves it to
#     TARGET (enough to outlast the migration, so rows are still being added when it pauses);
#     the stream follows the session there. One row per mode: the downtime (pause to
#     the target's commit) against the whole migration, the pre-copy rounds, the bytes sent
#     after the pause, and whether the tokens the caller got equal those of the same request on
#     A never migrated (FULL_KV and TOKEN_REPLAY must).
run_live_scenario() {
  local target=$1 history=$2 n=400 ref expect s gen reply got mode
  ref=$(ctl_a start --tokens "$history" | _scenario_field "['sessionId']")
  expect=$(ctl_a generate --session "$ref" -n $n --ids)
  printf '\n%-13s %11s %9s %7s %12s %s\n' mode "downtime s" "total s" rounds "after pause" \
    "tokens the caller got"
  for mode in full_kv token_replay reconstruct; do
    s=$(ctl_a start --tokens "$history" | _scenario_field "['sessionId']")
    ctl_a generate --session "$s" -n $n --ids >"${TMPDIR:-/tmp}/riskkv-live.$$" 2>/dev/null &
    gen=$!
    for _ in $(seq 200); do
      ctl_a list | python3 -c "import json,sys; s=[x for x in json.load(sys.stdin).get('sessions',[]) if x['sessionId']=='$s']; sys.exit(0 if s and s[0].get('busy') else 1)" && break
      sleep 0.05
    done
    sleep 0.3
    reply=$(ctl_a migrate --session "$s" --to "$target" --mode $mode --live)
    wait $gen
    got=$(cat "${TMPDIR:-/tmp}/riskkv-live.$$")
    rm -f "${TMPDIR:-/tmp}/riskkv-live.$$"
    echo "$reply" | python3 -c "
import json,sys; r=json.load(sys.stdin); got=$got; expect=$expect
same = 'identical to the unmoved run' if got == expect else 'all %d, differing from the unmoved run after the move' % len(got)
if len(got) != len(expect): same = '%d of %d' % (len(got), len(expect))
print('%-13s %11.4f %9.4f %7d %9.1f KB %s' % ('$mode', r.get('downtimeSeconds', 0), r['totalSeconds'],
      r.get('precopyRounds', 0), int(r.get('kvBytesAfterPause', 0)) / 1e3, same))"
  done
}
