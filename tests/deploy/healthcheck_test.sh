#!/usr/bin/env bash
# docker/healthcheck.sh, the images' HEALTHCHECK, in a PID namespace of its own (what a container
# has): healthy for a riskkv-node on its --listen port and for a riskkv-control on a wildcard
# --listen=HOST:PORT, unhealthy once the server is gone or for a server that does not answer.
# Needs root (unshare); skipped otherwise.
#   healthcheck_test.sh SRC_DIR BIN_DIR MODEL
set -euo pipefail
SRC=$1 BIN=$2 MODEL=$3
if [ "${INSIDE:-}" != 1 ]; then
  [ "$(id -u)" = 0 ] || { echo "SKIPPED: needs root for a PID namespace"; exit 77; }
  INSIDE=1 exec unshare --pid --fork --mount-proc bash "$0" "$@"
fi
T=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; tail -5 "$T"/*.log >&2 || true; exit 1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
probe() { PATH="$BIN:$PATH" sh "$SRC/docker/healthcheck.sh"; }

probe 2>"$T/none.err" && fail "healthy with no server running"
grep -q "no riskkv-node or riskkv-control" "$T/none.err" || fail "no reason given: $(cat "$T/none.err")"

port=$(free_port)
"$BIN/riskkv-node" --model "$MODEL" --listen 127.0.0.1:$port --metrics-listen "" >"$T/node.log" 2>&1 &
node=$!
for _ in $(seq 100); do "$BIN/riskkvctl" --node 127.0.0.1:$port health >/dev/null 2>&1 && break; sleep 0.1; done
probe >/dev/null || fail "a serving node is not healthy"
kill $node
wait $node || true
probe >/dev/null 2>&1 && fail "healthy after the node exited"

# A server whose port nobody answers on: a node still loading, or a wrong --listen.
port=$(free_port)
"$BIN/riskkv-control" --store "$T/store" --listen=0.0.0.0:$port --metrics-listen "" >"$T/control.log" 2>&1 &
control=$!
for _ in $(seq 100); do "$BIN/riskkvctl" --control 127.0.0.1:$port control-health >/dev/null 2>&1 && break; sleep 0.1; done
probe >/dev/null || fail "a serving control plane on 0.0.0.0:$port is not healthy"
kill -STOP $control
timeout 20 sh -c "PATH='$BIN:$PATH' sh '$SRC/docker/healthcheck.sh'" >/dev/null 2>&1 &&
  fail "healthy while the control plane does not answer"
kill -CONT $control
echo "healthcheck: node and control plane probed at their --listen addresses"
