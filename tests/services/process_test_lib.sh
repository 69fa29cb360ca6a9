# What the process-level service tests share; source it after setting BIN, MODEL and PY.
# Gives T (a temporary directory, removed on exit with every process recorded in pids), fail
# (prints the tail of every log in T and exits 1), json (a field of the JSON on stdin) and
# wait_file (until a port file appears, 10 s).
T=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$T"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$T"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -8 "$f"; }; done >&2
  exit 1
}
json() { "$PY" -c "import json,sys; d=json.load(sys.stdin); print(d$1)"; }
wait_file() { for _ in $(seq 100); do [ -s "$1" ] && return 0; sleep 0.1; done; return 1; }
