#!/usr/bin/env bash
# Stop-and-copy against live migration of SmolLM2 sessions, in one run: a target node and one
# source node per link rate (20 and 100 Mbit/s), each on its own core with one thread (two edge
# machines), all with the shipped policy, then riskkv-live-bench against them. Results go to
# OUT (default docs/live-handover): live_handover.{csv,json,svg}, and the table to stdout.
#   bench/live_handover.sh [OUT] [riskkv-live-bench flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/live-handover}
[ $# -gt 0 ] && shift
bin=build/release/services
bench=build/release/bench/riskkv-live-bench
model=${RISKKV_MODEL:-${RISKKV_HOME:-$HOME/.cache/riskkv}/models/SmolLM2-135M-Instruct.Q4_1.gguf}
policy=deploy/policies/smollm2-135m-instruct/policy.pb
for f in "$bin/riskkv-node" "$bench" "$model" "$policy"; do
  [ -e "$f" ] || { echo "live_handover.sh: $f is missing (deploy/setup.sh, deploy/build.sh)" >&2; exit 1; }
done
mkdir -p "$out"
T=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$T"' EXIT
cores=$(nproc)
node() {  # name core [flags...]
  local name=$1 core=$2
  shift 2
  taskset -c "$((core % cores))" "$bin/riskkv-node" --model "$model" --policy "$policy" \
    --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --port-file "$T/$name.ports" \
    --threads 1 --timeout 3600 "$@" >"$T/$name.log" 2>&1 &
  pids+=($!)
}
node target 1
node src20 0 --link-mbps 20
node src100 0 --link-mbps 100
addr() {
  for _ in $(seq 300); do [ -s "$T/$1.ports" ] && break; sleep 0.1; done
  [ -s "$T/$1.ports" ] || { echo "node $1 did not start:" >&2; tail "$T/$1.log" >&2; exit 1; }
  echo "127.0.0.1:$(cut -d' ' -f1 "$T/$1.ports")"
}
target=$(addr target)
s20=$(addr src20)
s100=$(addr src100)
taskset -c 0 "$bench" --sources "20=$s20,100=$s100" --target "$target" --out "$out" "$@"
