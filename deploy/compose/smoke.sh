#!/usr/bin/env bash
# The compose stack under a real container engine, the way deploy/compose/README.md runs it:
# builds riskkv:cpu (docker/Dockerfile) and a Prometheus image from Debian's package
# (docker/Dockerfile.prometheus; no registry is needed), copies the model into each node's
# volume, brings up the control plane, edge-a, edge-b and Prometheus, puts the shipped SmolLM2
# policy, migrates a session from edge-a to edge-b in every mode (the demo's table), migrates
# live while the session generates, generates on edge-b, asks Prometheus for
# riskkv_recovery_seconds by mode and runs every query of the Grafana dashboard through it.
# Then it takes everything down again (containers, networks, volumes) and stops the engine it
# started, leaving nothing running. Grafana itself cannot run here (no image, no package); its
# dashboard's queries are what is checked.
#
# As root. Uses the Docker engine that answers, or starts one of its own (deploy/compose/
# engine.sh: data root under $RISKKV_HOME/docker, kept between runs so the base images and the
# build dependencies' layer are reused; a bridge in 10.199.128.0/20). Makes debian:12 and
# debian:12-slim with debootstrap when absent. Exits 77 (skipped) when not root or when no engine
# can be started, naming why. Takes about 10 minutes, most of it the image build. With --binaries
# BUILD_DIR (CI, on its release build) the image is docker/Dockerfile's runtime stage filled with
# that tree's binaries (docker/Dockerfile.prebuilt) instead of a second compile inside the image.
#   deploy/compose/smoke.sh [--binaries BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(cd ../.. && pwd)
BINARIES=""
while [ $# -gt 0 ]; do
  case "$1" in
    --binaries)
      [ $# -ge 2 ] && [ -x "$2/services/riskkv-node" ] ||
        { echo "FAIL: --binaries needs a build tree with services/riskkv-node" >&2; exit 2; }
      BINARIES=$(cd "$2" && pwd)
      shift 2
      ;;
    *) echo "FAIL: unknown argument '$1' (usage: smoke.sh [--binaries BUILD_DIR])" >&2; exit 2 ;;
  esac
done
RISKKV_HOME="${RISKKV_HOME:-$HOME/.cache/riskkv}"
MODEL_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
POLICY="$ROOT/deploy/policies/smollm2-135m-instruct"
PROJECT=riskkv-smoke
T0=$(date +%s)

log() { printf '[smoke %4ds] %s\n' $(($(date +%s) - T0)) "$*" >&2; }
skip() {
  echo "SKIPPED: $*"
  exit 77
}
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

[ "$(id -u)" = 0 ] || skip "needs root (to start a container engine)"
[ -f "$RISKKV_HOME/models/$MODEL_FILE" ] || fail "no $RISKKV_HOME/models/$MODEL_FILE (run deploy/setup.sh)"
[ -f "$POLICY/policy.pb" ] || fail "no shipped policy in $POLICY"
command -v curl >/dev/null || fail "no curl (run deploy/setup.sh)"
if command -v docker-compose >/dev/null; then
  COMPOSE=(docker-compose)
elif docker compose version >/dev/null 2>&1; then
  COMPOSE=(docker compose)
else
  skip "no docker-compose (apt-get install docker-compose)"
fi
command -v docker >/dev/null || skip "no docker CLI (apt-get install docker.io)"

source ./engine.sh
source "$ROOT/deploy/scenario.sh"

# Settings from here, never from a .env a user keeps beside the compose file.
export RISKKV_POLICY_ID
RISKKV_POLICY_ID=$(sed -n 's/^policy_id: "\(.*\)"$/\1/p' "$POLICY/policy.txt")
export RISKKV_PROMETHEUS_IMAGE=${RISKKV_PROMETHEUS_IMAGE:-riskkv-prometheus:debian12}
export RISKKV_MODEL_FILE=$MODEL_FILE
WORK=$(mktemp -d)
echo "# smoke.sh: settings come from its environment" >"$WORK/settings.env"
dc() { "${COMPOSE[@]}" -p $PROJECT --env-file "$WORK/settings.env" "$@"; }
# The stack's credentials (README step 1), its own: every service mounts them.
export RISKKV_SECRETS_DIR="$WORK/secrets"
"$ROOT/deploy/credentials.sh" "$RISKKV_SECRETS_DIR" --owner 10001 >/dev/null

# The summary table: each step with its time.
STEPS=()
LAST=$T0
step() {
  local now
  now=$(date +%s)
  STEPS+=("$(printf '%-72s %-4s %5ds' "$1" "${2:-ok}" $((now - LAST)))")
  LAST=$now
}

STACK_UP=0
finish() {
  local rc=$?
  trap - EXIT
  if [ "$STACK_UP" = 1 ]; then
    if [ $rc != 0 ]; then
      dc ps >&2 || true
      dc logs --tail 40 >&2 || true
    fi
    log "taking the stack down (containers, networks, volumes)"
    dc --profile gpu down -v --remove-orphans >/dev/null 2>&1 || true
  fi
  local left
  left=$(docker ps -aq --filter "label=com.docker.compose.project=$PROJECT" 2>/dev/null || true)
  if [ -n "$left" ]; then
    echo "FAIL: containers left behind: $left" >&2
    rc=1
  fi
  # Earlier builds' images, now untagged; the tagged ones (bases, deps, riskkv:cpu) stay cached.
  docker image prune -f >/dev/null 2>&1 || true
  engine_down
  rm -rf "$WORK"
  if [ $rc = 0 ]; then
    echo
    printf '%-72s %-4s %6s\n' "compose smoke" "" "time"
    printf '%s\n' "${STEPS[@]}"
    printf '%-72s %-4s %5ds\n' "total" "PASS" $(($(date +%s) - T0))
  fi
  log "done (rc $rc)"
  exit $rc
}
trap finish EXIT

engine_up || skip "no container engine: $ENGINE_WHY"
log "engine: $(docker version --format 'server {{.Server.Version}}, API {{.Server.APIVersion}}')"
log "base images"
base_images || fail "cannot make the base images"

step "engine $(docker version --format '{{.Server.Version}}'), base images debian:12, debian:12-slim"
if [ -n "$BINARIES" ]; then
  log "riskkv:cpu from the binaries of $BINARIES (docker/Dockerfile.prebuilt)"
  docker build -q --target runtime -t riskkv:runtime -f "$ROOT/docker/Dockerfile" "$ROOT" \
    >/dev/null || fail "docker/Dockerfile's runtime stage does not build"
  context="$WORK/image"
  "$ROOT/docker/collect-runtime.sh" "$BINARIES" "$context/opt/riskkv" --cpu-only >&2 ||
    fail "cannot collect the binaries of $BINARIES"
  for corpus in /usr/share/doc/jargon-text/jargon.txt.gz \
    /usr/share/debian-reference/debian-reference.en.txt.gz; do
    mkdir -p "$context$(dirname "$corpus")"
    cp "$corpus" "$context$corpus" || fail "no $corpus (run deploy/setup.sh)"
  done
  docker build -q -f "$ROOT/docker/Dockerfile.prebuilt" -t riskkv:cpu "$context" >/dev/null ||
    fail "docker/Dockerfile.prebuilt does not build"
else
  log "building the build dependencies (riskkv:build-deps) and riskkv:cpu (docker-compose build)"
  docker build -q --target deps -t riskkv:build-deps -f "$ROOT/docker/Dockerfile" "$ROOT" >/dev/null
  # Progress: the Dockerfile's steps and the build's percentage, as they come.
  set +e
  dc build control 2>&1 | tee "$WORK/build.log" |
    grep --line-buffered -E '^Step |^\[ *[0-9]+0%\]' | sed -u 's/^/[build] /' >&2
  build_rc=${PIPESTATUS[0]}
  set -e
  [ "$build_rc" = 0 ] || { tail -n 30 "$WORK/build.log" >&2; fail "docker-compose build control failed"; }
fi
if [ "$RISKKV_PROMETHEUS_IMAGE" = riskkv-prometheus:debian12 ]; then
  log "building $RISKKV_PROMETHEUS_IMAGE from Debian's prometheus package"
  docker build -q -f "$ROOT/docker/Dockerfile.prometheus" -t "$RISKKV_PROMETHEUS_IMAGE" \
    "$ROOT/docker" >"$WORK/prometheus.log" 2>&1 ||
    { tail -n 30 "$WORK/prometheus.log" >&2; fail "docker/Dockerfile.prometheus does not build"; }
else
  docker image inspect "$RISKKV_PROMETHEUS_IMAGE" >/dev/null 2>&1 ||
    fail "no image $RISKKV_PROMETHEUS_IMAGE (RISKKV_PROMETHEUS_IMAGE)"
fi
step "riskkv:cpu ($(docker image inspect riskkv:cpu --format '{{.Size}}' |
  awk '{printf "%.0f MB", $1 / 1e6}')) and $RISKKV_PROMETHEUS_IMAGE built"

# A stack left by an interrupted run goes first.
dc --profile gpu down -v --remove-orphans >/dev/null 2>&1 || true
STACK_UP=1
log "the model into each node's volume"
for node in edge-a edge-b; do
  dc run --rm --no-deps --user 0 -v "$RISKKV_HOME/models:/host:ro" --entrypoint cp $node \
    /host/$MODEL_FILE /models/ >/dev/null 2>&1 || fail "cannot copy the model into $node's volume"
done
step "the model copied into edge-a's and edge-b's volumes"

wait_healthy() {
  local service=$1 id status i
  id=$(dc ps -q "$service")
  for i in $(seq 180); do
    status=$(docker inspect --format '{{.State.Health.Status}}' "$id" 2>/dev/null || echo gone)
    [ "$status" = healthy ] && return 0
    [ "$status" = gone ] && break
    sleep 1
  done
  fail "$service is not healthy after ${i}s (status $status)"
}

log "the control plane, and the policy put into it as the operator"
dc up -d control >/dev/null 2>&1
wait_healthy control
bank_args=()
[ -f "$POLICY/bank.rkvbank" ] && bank_args=(--bank /policy/bank.rkvbank)
dc run --rm --no-deps -v "$POLICY:/policy:ro" control riskkvctl --control control:7000 \
  policy-put --policy /policy/policy.pb "${bank_args[@]}" >/dev/null 2>&1 ||
  fail "policy-put of $POLICY failed"
step "control plane healthy, policy $RISKKV_POLICY_ID put as the operator"

log "everything up: control, edge-a, edge-b, prometheus"
dc up -d control edge-a edge-b prometheus >/dev/null 2>&1
wait_healthy edge-a
wait_healthy edge-b
step "edge-a, edge-b healthy; prometheus up"

# A /metrics page fetched whole, then matched: `curl | grep -q` under pipefail fails whenever
# grep stops reading before curl has written the page.
metrics_match() { grep -q "$2" <<<"$(curl -s "http://127.0.0.1:$1/metrics")"; }

# Each node's /metrics on its published host port (README step 7), until the policy arrived.
for port in 9470 9471; do
  for _ in $(seq 100); do
    metrics_match "$port" '^riskkv_policy_version{.*} 1$' && break
    sleep 0.2
  done
  metrics_match "$port" '^riskkv_policy_version{.*} 1$' ||
    fail "the node with metrics on 127.0.0.1:$port did not get policy version 1"
done
metrics_match 9400 '^riskkv_control_watchers' ||
  fail "the control plane's /metrics on 127.0.0.1:9400 does not answer"
metrics_match 9470 'riskkv_node_info{.*address="edge-a:7070"' ||
  fail "edge-a does not advertise edge-a:7070 in riskkv_node_info"
step "policy v1 on both nodes; /metrics on 127.0.0.1:9400, 9470, 9471"

# riskkvctl inside edge-a reaches both nodes by their service names, as the README's ctl does.
A_ID=$(dc ps -q edge-a)
ctl_a() { docker exec -i "$A_ID" riskkvctl --node edge-a:7070 "$@"; }
ctl_b() { docker exec -i "$A_ID" riskkvctl --node edge-b:7070 "$@"; }

prompt=$(zcat /usr/share/doc/jargon-text/jargon.txt.gz | sed -n '/^The Story of Mel/,$p' |
  sed -n '2,40p' | tr -s ' \n' ' ')
echo
echo "== edge-a -> edge-b (edge-b:7070) over edge-a's emulated ${RISKKV_LINK_MBPS:-100} Mbit/s, every mode"
run_scenario edge-b:7070 --prompt "$prompt"
step "migrations edge-a -> edge-b: full_kv x3, token_replay, reconstruct, auto"
echo
echo "== live hand-over while the session generates"
run_live_scenario edge-b:7070 "$SCENARIO_HISTORY"
step "live migrations while generating: full_kv, token_replay, reconstruct"
echo
echo "== the last session generates on edge-b"
generated=$(ctl_b generate --session "$SCENARIO_LAST" -n 16)
echo "$generated"
[ -n "$generated" ] || fail "nothing generated on edge-b"
# A migration refused by its target counts as a failure by reason (a dashboard panel).
ctl_a migrate --session "$(ctl_a start --prompt "a refused migration" | _scenario_field "['sessionId']")" \
  --to edge-b:1 --mode full_kv --nofallback --timeout 5 >/dev/null 2>&1 &&
  fail "a migration to a closed port succeeded"
metrics_match 9470 '^riskkv_migration_failures_total{.*reason="transfer_failed",role="source"} 1$' ||
  fail "edge-a did not count the refused migration in riskkv_migration_failures_total"
# Without the operator's token a call is refused (the stack runs with credentials).
out=$(docker exec -i "$A_ID" env -u RISKKV_TOKEN_FILE riskkvctl --node edge-b:7070 list 2>&1) &&
  fail "edge-b served a call without credentials: $out"
grep -q "needs credentials" <<<"$out" || fail "anonymous call to edge-b: $out"
step "generated on edge-b; a refused migration failed as it should; no call without credentials"

PROM=http://127.0.0.1:9090
query() { curl -s --get --data-urlencode "query=$1" "$PROM/api/v1/query"; }
log "waiting for Prometheus to scrape the migrations"
want_modes="full_kv reconstruct token_replay"
for i in $(seq 60); do
  got=$(query 'sum by (mode) (riskkv_recovery_seconds_count)' | python3 -c "
import json,sys; print(' '.join(sorted(r['metric']['mode'] for r in json.load(sys.stdin)['data']['result'])))" 2>/dev/null || true)
  [ "$got" = "$want_modes" ] && break
  sleep 1
done
[ "$got" = "$want_modes" ] || fail "Prometheus has riskkv_recovery_seconds for '$got', not '$want_modes'"
# increase() over the failure counter, born last, needs two of its samples.
for i in $(seq 60); do
  n=$(query 'min(count_over_time(riskkv_migration_failures_total[10m]))' | python3 -c "
import json,sys; r=json.load(sys.stdin)['data']['result']; print(int(r[0]['value'][1]) if r else 0)")
  [ "$n" -ge 2 ] && break
  sleep 1
done
step "Prometheus scraped riskkv_recovery_seconds for $want_modes"

echo
echo "== Prometheus (127.0.0.1:9090): riskkv_recovery_seconds by mode"
python3 - "$PROM" <<'EOF'
import json, sys, urllib.parse, urllib.request
prom = sys.argv[1]
def q(expr):
    url = prom + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    return {r["metric"].get("mode"): float(r["value"][1])
            for r in json.load(urllib.request.urlopen(url))["data"]["result"]}
count = q("sum by (mode) (riskkv_recovery_seconds_count)")
total = q("sum by (mode) (riskkv_recovery_seconds_sum)")
p95 = q("histogram_quantile(0.95, sum by (le, mode) (riskkv_recovery_seconds_bucket))")
print("%-13s %10s %13s %11s" % ("mode", "recoveries", "mean s", "p95 s"))
for m in sorted(count):
    print("%-13s %10d %13.4f %11.4f" % (m, count[m], total[m] / count[m], p95[m]))
    if not total[m] > 0:
        sys.exit("FAIL: mode %s has no recovery time" % m)
EOF

echo
echo "== every query of the Grafana dashboard, through Prometheus"
python3 - "$PROM" "$ROOT/deploy/compose/grafana/dashboards" <<'EOF'
import glob, json, sys, urllib.parse, urllib.request
prom, folder = sys.argv[1:]
bad = 0
print("%-52s %-40s %s" % ("panel", "query", "series"))
for path in sorted(glob.glob(folder + "/*.json")):
    for panel in json.load(open(path))["panels"]:
        for target in panel.get("targets", []):
            # Grafana's rate interval: at least four scrape intervals; a window that holds the run.
            expr = target["expr"].replace("$__rate_interval", "10m")
            url = prom + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
            reply = json.load(urllib.request.urlopen(url))
            n = len(reply["data"]["result"]) if reply["status"] == "success" else 0
            bad += n == 0
            short = expr if len(expr) <= 40 else expr[:37] + "..."
            print("%-52s %-40s %s" % (panel["title"][:52], short, n if n else "NONE"))
if bad:
    sys.exit("FAIL: %d dashboard queries return no series" % bad)
EOF
step "every Grafana dashboard query returns series"
