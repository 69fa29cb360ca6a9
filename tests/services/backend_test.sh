#!/usr/bin/env bash
# riskkv-node's compute backend: --backend and --gpu-device are validated, the log and
# riskkv_node_info{backend} say which backend serves, and --backend cuda refuses to start without
# a usable GPU. Where a GPU is usable (label gpu), a CPU node and a GPU node migrate sessions to
# each other in every mode (GPU to GPU, CPU to GPU and back) with the continuation's NLL kept,
# and RECONSTRUCT onto the GPU rebuilds there.
#   backend_test.sh BIN_DIR MODEL PYTHON
set -euo pipefail
BIN=$1 MODEL=$2 PY=$3
source "$(dirname "$0")/process_test_lib.sh"

node() { "$BIN/riskkv-node" --model "$MODEL" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 "$@"; }
refused() {  # expected message, flags...
  local want=$1; shift
  local out
  out=$(node --port-file "$T/never.ports" "$@" 2>&1) && fail "riskkv-node $* started"
  grep -qF -- "$want" <<<"$out" || fail "riskkv-node $*: expected '$want', got: $out"
}
refused "--backend must be auto, cpu or cuda, not 'gpu'" --backend gpu
refused "--backend cuda keeps KV in f16" --backend cuda --kv-dtype f32
refused "--gpu-device must be >= 0" --gpu-device -1

start_node() {  # name flags...
  local name=$1; shift
  node --port-file "$T/$name.ports" --threads 1 "$@" >"$T/$name.log" 2>&1 &
  pids+=($!)
  wait_file "$T/$name.ports" || fail "node $name did not start"
}
addr() { echo "127.0.0.1:$(cut -d' ' -f1 "$T/$1.ports")"; }
metrics() {  # through Python, which GPU machines without curl have too
  "$PY" -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' \
    "http://127.0.0.1:$(cut -d' ' -f2 "$T/$1.ports")/metrics"
}
ctl() { local n=$1; shift; "$BIN/riskkvctl" --node "$(addr "$n")" "$@"; }

start_node cpu --backend cpu
grep -q 'riskkv_node_info{.*backend="cpu".*} 1' <<<"$(metrics cpu)" || fail "cpu info: $(metrics cpu | grep node_info)"
grep -q " on cpu," "$T/cpu.log" || fail "the log does not name the cpu backend"

start_node auto --backend auto
if grep -q " on cpu (" "$T/auto.log"; then
  # No usable GPU here: auto says why and serves on the CPU; cuda refuses to start.
  grep -q 'riskkv_node_info{.*backend="cpu".*} 1' <<<"$(metrics auto)" || fail "auto info"
  refused "--backend cuda: UNAVAILABLE" --backend cuda
  echo "backend_test: no usable GPU ($(grep -o ' on cpu ([^)]*)' "$T/auto.log")); the GPU migrations were not run"
  exit 0
fi
grep -q " on cuda (" "$T/auto.log" || fail "the log names no backend"
grep -q 'riskkv_node_info{.*backend="cuda".*} 1' <<<"$(metrics auto)" || fail "cuda info: $(metrics auto | grep node_info)"

"$BIN/riskkv-calibrate" --model "$MODEL" --out "$T/cal" --quick --epsilon 10 --quiet \
  --corpus "${RISKKV_CORPUS:-/usr/share/doc/jargon-text/jargon.txt.gz}" >"$T/calibrate.log" 2>&1 ||
  fail "riskkv-calibrate"
policy=(--policy "$T/cal/policy.pb" --bank "$T/cal/bank.rkvbank")
start_node gpu_a --backend cuda "${policy[@]}"
start_node gpu_b --backend cuda "${policy[@]}"
start_node cpu_p --backend cpu "${policy[@]}"
start() {
  local out
  out=$(ctl "$1" start --tokens '[5,36,67,98,129,160,191,222,253,284]' 2>&1) || fail "start on $1: $out"
  echo "$out" | json "['sessionId']"
}

# Every mode GPU to GPU, CPU to GPU and back: the continuation's NLL on the target matches the
# never-migrated session's on the source.
cont='[7,11,13,17,19,23,29,31,37,41,43,47,53,59,61,67]'
for mode in full_kv token_replay reconstruct; do
  for dir in "gpu_a gpu_b" "cpu_p gpu_b" "gpu_b cpu_p"; do
    set -- $dir
    stay=$(start "$1"); s=$(start "$1")
    reply=$(ctl "$1" migrate --session "$s" --to "$(addr "$2")" --mode "$mode" --nofallback 2>&1) ||
      fail "$mode $1 -> $2: $reply"
    moved=$(echo "$reply" | json "['targetSessionId']")
    exact=$(ctl "$1" score --session "$stay" --tokens "$cont" | json "['meanNll']")
    got=$(ctl "$2" score --session "$moved" --tokens "$cont" | json "['meanNll']")
    "$PY" -c "
d = $got - $exact
print('backend_test: %-12s %s -> %s  recovery %.4f s  dNLL %+.5f' % ('$mode', '$1', '$2', $(echo "$reply" | json "['recoverySeconds']"), d))
assert abs(d) < 0.05, 'continuation NLL moved by %f' % d
" || fail "$mode $1 -> $2"
  done
done
grep -q 'riskkv_migrations_total{.*mode="reconstruct".*outcome="ok".*role="target"} [1-9]' <<<"$(metrics gpu_b)" ||
  fail "gpu_b counted no reconstruct: $(metrics gpu_b | grep migrations_total)"
