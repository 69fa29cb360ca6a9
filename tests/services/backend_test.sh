#!/usr/bin/env bash
# riskkv-node's compute backend.
#   backend_test.sh BIN_DIR MODEL PYTHON        --backend and --gpu-device are validated, the log
#                                               and riskkv_node_info{backend} say which backend
#                                               serves, --backend cuda refuses to start without a
#                                               usable GPU
#   backend_test.sh BIN_DIR MODEL PYTHON gpu    CPU and GPU nodes migrate sessions to each other in
#                                               every mode (GPU to GPU, CPU to GPU and back), each
#                                               continuation scoring as the same migration between
#                                               two CPU nodes does; exits 77 (skipped) without a GPU
set -euo pipefail
BIN=$1 MODEL=$2 PY=$3 PART=${4:-flags}
source "$(dirname "$0")/process_test_lib.sh"

# exec: a node started in the background is its own PID (pids, the cleanup), not a subshell's.
node() { exec "$BIN/riskkv-node" --model "$MODEL" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 "$@"; }
refused() {  # expected message, flags...
  local want=$1; shift
  local out
  out=$(node --port-file "$T/never.ports" "$@" 2>&1) && fail "riskkv-node $* started"
  grep -qF -- "$want" <<<"$out" || fail "riskkv-node $*: expected '$want', got: $out"
}
start_node() {  # name flags...
  local name=$1; shift
  node --port-file "$T/$name.ports" --threads 1 "$@" >"$T/$name.log" 2>&1 &
  pids+=($!)
  wait_file "$T/$name.ports" || fail "node $name did not start"
}

start_node auto --backend auto
gpu=1
grep -q " on cpu (" "$T/auto.log" && gpu=0

if [ "$PART" = flags ]; then
  refused "--backend must be auto, cpu or cuda, not 'gpu'" --backend gpu
  refused "--backend cuda keeps KV in f16" --backend cuda --kv-dtype f32
  refused "--gpu-device must be >= 0" --gpu-device -1
  start_node cpu --backend cpu
  grep -q 'riskkv_node_info{.*backend="cpu".*} 1' <<<"$(metrics cpu)" || fail "cpu info: $(metrics cpu | grep node_info)"
  grep -q " on cpu," "$T/cpu.log" || fail "the log does not name the cpu backend"
  if [ $gpu = 0 ]; then
    # No usable GPU: auto says why and serves on the CPU; cuda refuses to start.
    grep -q 'riskkv_node_info{.*backend="cpu".*} 1' <<<"$(metrics auto)" || fail "auto info"
    refused "--backend cuda: UNAVAILABLE" --backend cuda
  else
    grep -q " on cuda (" "$T/auto.log" || fail "the log names no backend"
    grep -q 'riskkv_node_info{.*backend="cuda".*} 1' <<<"$(metrics auto)" || fail "cuda info: $(metrics auto | grep node_info)"
  fi
  exit 0
fi
if [ $gpu = 0 ]; then
  echo "backend_test: no usable GPU ($(grep -o ' on cpu ([^)]*)' "$T/auto.log"))"
  exit 77
fi

"$BIN/riskkv-calibrate" --model "$MODEL" --out "$T/cal" --quick --epsilon 10 --quiet \
  --corpus "${RISKKV_CORPUS:-/usr/share/doc/jargon-text/jargon.txt.gz}" >"$T/calibrate.log" 2>&1 ||
  fail "riskkv-calibrate"
policy=(--policy "$T/cal/policy.pb" --bank "$T/cal/bank.rkvbank")
start_node gpu_a --backend cuda "${policy[@]}"
start_node gpu_b --backend cuda "${policy[@]}"
oracle=(--backend cpu --activations f32 "${policy[@]}")
start_node cpu_p "${oracle[@]}"
start_node cpu_q "${oracle[@]}"
start() {
  local out
  out=$(ctl "$1" start --tokens '[5,36,67,98,129,160,191,222,253,284]' 2>&1) || fail "start on $1: $out"
  echo "$out" | json "['sessionId']"
}
moved_nll() {  # mode from to: the continuation's mean NLL after migrating a fresh session
  local s reply
  s=$(start "$2")
  reply=$(ctl "$2" migrate --session "$s" --to "$(addr "$3")" --mode "$1" --nofallback 2>&1) ||
    fail "$1 $2 -> $3: $reply"
  ctl "$3" score --session "$(echo "$reply" | json "['targetSessionId']")" --tokens "$cont" |
    json "['meanNll']"
}

# Each migration's continuation scores as the same migration between the two f32 CPU nodes (for
# RECONSTRUCT: the same rebuild on the CPU). GPU weights and KV are f16, hence the tolerance.
cont='[7,11,13,17,19,23,29,31,37,41,43,47,53,59,61,67]'
for mode in full_kv token_replay reconstruct; do
  want=$(moved_nll $mode cpu_p cpu_q)
  for dir in "gpu_a gpu_b" "cpu_p gpu_b" "gpu_b cpu_p"; do
    set -- $dir
    got=$(moved_nll $mode "$1" "$2")
    "$PY" -c "
d = $got - $want
print('backend_test: %-12s %s -> %s  NLL %.5f, on the CPU %.5f' % ('$mode', '$1', '$2', $got, $want))
assert abs(d) < 0.02, 'the continuation NLL differs by %f from the CPU migration' % d
" || fail "$mode $1 -> $2"
  done
done
grep -q 'riskkv_migrations_total{.*mode="reconstruct".*outcome="ok".*role="target"} [1-9]' <<<"$(metrics gpu_b)" ||
  fail "gpu_b counted no reconstruct: $(metrics gpu_b | grep migrations_total)"
