# What the process-level service tests share; source it after setting BIN, MODEL and PY.
# Gives T (a temporary directory, removed on exit with every process recorded in pids; a process
# naming T that outlives them fails the test), fail
# (prints the tail of every log in T and exits 1), json (a field of the JSON on stdin), wait_file
# (until a port file appears, 30 s: a SmolLM2 node loading while the suite runs in parallel), and for a server NAME started with --port-file $T/NAME.ports:
# addr NAME (its gRPC address), ctl NAME ARGS (riskkvctl against it), metrics NAME (its /metrics,
# empty when unreachable; through Python, which machines without curl have too) and
# wait_metric NAME LINE (until that exact line shows, 10 s).
T=$(mktemp -d)
pids=()
cleanup() {
  local rc=$? left=""
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  # Every process a test starts names T in its flags: none may outlive the test.
  for _ in $(seq 50); do
    left=$(pgrep -f -- "$T/" || true)
    [ -z "$left" ] && break
    sleep 0.1
  done
  if [ -n "$left" ]; then
    echo "FAIL: processes outlived the test: $(ps -o pid=,args= -p "${left//$'\n'/,}" | cut -c1-160)" >&2
    kill $left 2>/dev/null || true
    rc=1
  fi
  rm -rf "$T"
  exit "$rc"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$T"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -8 "$f"; }; done >&2
  exit 1
}
json() { "$PY" -c "import json,sys; d=json.load(sys.stdin); print(d$1)"; }
wait_file() { for _ in $(seq 300); do [ -s "$1" ] && return 0; sleep 0.1; done; return 1; }
addr() { echo "127.0.0.1:$(cut -d' ' -f1 "$T/$1.ports")"; }
ctl() { local n=$1; shift; "$BIN/riskkvctl" --node "$(addr "$n")" "$@"; }
metrics() {
  "$PY" -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' \
    "http://127.0.0.1:$(cut -d' ' -f2 "$T/$1.ports")/metrics" 2>/dev/null || true
}
wait_metric() {  # name line
  local m
  for _ in $(seq 100); do
    m=$(metrics "$1")
    grep -qxF -- "$2" <<<"$m" && return 0
    sleep 0.1
  done
  fail "$1 never showed '$2': $(metrics "$1" | grep -E 'policy|control')"
}
