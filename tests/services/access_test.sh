#!/usr/bin/env bash
# Identities and roles with real processes: a control plane and two nodes with one access file,
# riskkvctl as alice, bob, an operator and nobody. Anonymous calls are refused; only an operator
# puts a policy; a session is its owner's (bob neither sees nor touches alice's) and stays hers
# when it migrates, the source presenting its node token; a rotated token takes effect without a
# restart; an operator known by its client certificate's name (mutual TLS); a server without
# credentials (an access file, or mutual TLS: TLS with a server certificate alone does not count)
# listens on loopback only unless --insecure.
#   access_test.sh BIN_DIR MODEL PYTHON
set -euo pipefail
BIN=$1 MODEL=$2 PY=$3
source "$(dirname "$0")/process_test_lib.sh"

secret() { "$PY" -c 'import secrets; print(secrets.token_hex(16))'; }
for who in alice bob edge ops; do secret >"$T/$who.token"; done
chmod 600 "$T"/*.token
cat >"$T/access" <<ACCESS
# role identity credential
client   alice token $(cat "$T/alice.token")
client   bob   token $(cat "$T/bob.token")
node     edge  token $(cat "$T/edge.token")
operator ops   token $(cat "$T/ops.token")
operator ops   san   ops.riskkv.test
ACCESS
chmod 600 "$T/access"

# A broken access file stops a server at start, naming the line.
printf 'client alice token short\n' >"$T/bad-access"
out=$("$BIN/riskkv-control" --store "$T/x" --metrics-listen 127.0.0.1:0 --access-file "$T/bad-access" 2>&1) &&
  fail "bad access file accepted: $out"
grep -q "bad-access:1: the token of 'alice' is shorter than 16" <<<"$out" || fail "bad access: $out"
out=$("$BIN/riskkv-node" --model "$MODEL" --peer-token-file "$T/missing" 2>&1) &&
  fail "missing peer token accepted: $out"
grep -q -- "--peer-token-file: cannot read" <<<"$out" || fail "missing peer token: $out"

"$BIN/riskkv-calibrate" --model "$MODEL" --out "$T/cal" --quick --epsilon 10 --quiet >/dev/null
"$BIN/riskkv-control" --store "$T/store" --listen 127.0.0.1:0 --metrics-listen "" \
  --port-file "$T/control.ports" --access-file "$T/access" >"$T/control.log" 2>&1 &
pids+=($!)
wait_file "$T/control.ports" || fail "control plane did not start"
CONTROL=127.0.0.1:$(cut -d' ' -f1 "$T/control.ports")
cctl() { local who=$1; shift; "$BIN/riskkvctl" --control "$CONTROL" ${who:+--token-file "$T/$who.token"} "$@"; }

out=$(cctl "" policy-list 2>&1) && fail "anonymous policy-list served: $out"
grep -q "needs credentials" <<<"$out" || fail "anonymous policy-list: $out"
out=$(cctl alice policy-put --policy "$T/cal/policy.pb" --bank "$T/cal/bank.rkvbank" 2>&1) &&
  fail "a client put a policy: $out"
grep -q "'alice' (role client) may not put policies: that needs the operator role" <<<"$out" ||
  fail "client policy-put: $out"
cctl ops policy-put --policy "$T/cal/policy.pb" --bank "$T/cal/bank.rkvbank" >"$T/put.json" ||
  fail "operator policy-put"
ID=$(json "['policy']['policyId']" <"$T/put.json")
cctl alice policy-list >/dev/null || fail "a client may read policies"

for n in a b; do
  "$BIN/riskkv-node" --model "$MODEL" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
    --port-file "$T/$n.ports" --threads 1 --activations f32 --kv-dtype f32 \
    --access-file "$T/access" --peer-token-file "$T/edge.token" \
    --control "$CONTROL" --policy-id "$ID" --cache-dir "$T/cache-$n" >"$T/$n.log" 2>&1 &
  pids+=($!)
  wait_file "$T/$n.ports" || fail "node $n did not start"
done
for n in a b; do wait_metric $n 'riskkv_policy_version{model="tiny_llama_deep"} 1'; done
as() { local who=$1 n=$2; shift 2; ctl "$n" ${who:+--token-file "$T/$who.token"} "$@"; }

out=$(as "" a list 2>&1) && fail "anonymous list served: $out"
s=$(as alice a start --tokens '[5,36,67,98,129,160,191,222,253,284]' | json "['sessionId']")
[ ${#s} -eq 32 ] || fail "session id '$s' is not 128 bits in hex"
[ "$(as bob a list | json "['sessions'] if 'sessions' in d else []")" = "[]" ] ||
  fail "bob lists alice's session"
out=$(as bob a show --session "$s" 2>&1) && fail "bob read alice's session: $out"
grep -q "no session '$s' on this node" <<<"$out" || fail "bob show: $out"
out=$(as bob a generate --session "$s" -n 2 2>&1) && fail "bob generated in alice's session: $out"
out=$(as bob a migrate --session "$s" --to "$(addr b)" --mode full_kv 2>&1) &&
  fail "bob migrated alice's session: $out"
[ "$(as ops a list | json "['sessions'][0]['sessionId']")" = "$s" ] || fail "operator list"
as alice a generate --session "$s" -n 3 >/dev/null || fail "alice generates in her session"

reply=$(as alice a migrate --session "$s" --to "$(addr b)" --mode reconstruct --nofallback) ||
  fail "alice's migration between nodes presenting their node token"
s2=$(echo "$reply" | json "['targetSessionId']")
as alice b show --session "$s2" >/dev/null || fail "alice's session on the target is hers"
out=$(as bob b show --session "$s2" 2>&1) && fail "bob read alice's migrated session: $out"
as alice b generate --session "$s2" -n 2 >/dev/null || fail "alice generates on the target"
[ "$(metrics a | grep -c '^riskkv_requests_denied_total{.*reason="unauthenticated"} 1')" = 1 ] ||
  fail "node a counts the anonymous call: $(metrics a | grep denied)"

# Rotation: alice gets a new token; the old stops working and the new works, no restart.
old=$(cat "$T/alice.token")
new=$(secret)
sed "s/$old/$new/" "$T/access" >"$T/access.new" && mv "$T/access.new" "$T/access"
cp "$T/alice.token" "$T/alice-old.token"
echo "$new" >"$T/alice.token"
sleep 1.2
out=$(ctl b --token-file "$T/alice-old.token" show --session "$s2" 2>&1) &&
  fail "the rotated-out token still works: $out"
grep -q "not in this server's access file" <<<"$out" || fail "old token: $out"
as alice b show --session "$s2" >/dev/null || fail "the new token works without a restart"
grep -q "access file $T/access read again" "$T/b.log" || fail "node b did not log the reload"

# An operator known by its client certificate's name, over mutual TLS.
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$T/ca.key" -out "$T/ca.pem" -days 2 \
  -subj "/CN=riskkv access test CA" 2>/dev/null
cert() {  # name san
  openssl req -newkey rsa:2048 -nodes -keyout "$T/$1.key" -out "$T/$1.csr" -subj "/CN=$1" \
    2>/dev/null
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$2" >"$T/$1.ext"
  openssl x509 -req -in "$T/$1.csr" -CA "$T/ca.pem" -CAkey "$T/ca.key" -CAcreateserial \
    -out "$T/$1.pem" -days 2 -extfile "$T/$1.ext" 2>/dev/null
}
cert server IP:127.0.0.1
cert ops DNS:ops.riskkv.test
cert stranger DNS:stranger.riskkv.test
"$BIN/riskkv-control" --store "$T/tls-store" --listen 127.0.0.1:0 --metrics-listen "" \
  --port-file "$T/tls-control.ports" --access-file "$T/access" --tls-cert "$T/server.pem" \
  --tls-key "$T/server.key" --tls-ca "$T/ca.pem" >"$T/tls-control.log" 2>&1 &
pids+=($!)
wait_file "$T/tls-control.ports" || fail "TLS control plane did not start"
TCONTROL=127.0.0.1:$(cut -d' ' -f1 "$T/tls-control.ports")
"$BIN/riskkvctl" --control "$TCONTROL" --tls-cert "$T/ops.pem" --tls-key "$T/ops.key" \
  --tls-ca "$T/ca.pem" policy-put --policy "$T/cal/policy.pb" --bank "$T/cal/bank.rkvbank" \
  >/dev/null ||
  fail "the operator's certificate did not put a policy"
out=$("$BIN/riskkvctl" --control "$TCONTROL" --tls-cert "$T/stranger.pem" \
  --tls-key "$T/stranger.key" --tls-ca "$T/ca.pem" policy-list 2>&1) &&
  fail "a certificate named nowhere was served: $out"
grep -q "stranger.riskkv.test" <<<"$out" || fail "stranger: $out"

# Without caller credentials (an access file, or mutual TLS) a server listens on loopback only,
# unless --insecure; TLS with a server certificate alone encrypts but lets anyone in, so it is
# narrowed too.
other=$(hostname -I 2>/dev/null | tr ' ' '\n' | grep -v '^127\.' | grep -v : | head -1 || true)
for mode in default insecure tls; do
  flag=()
  client=()
  [ $mode = insecure ] && flag=(--insecure)
  if [ $mode = tls ]; then
    flag=(--tls-cert "$T/server.pem" --tls-key "$T/server.key")
    client=(--tls-ca "$T/ca.pem")
  fi
  "$BIN/riskkv-control" --store "$T/open-$mode" --listen 0.0.0.0:0 --metrics-listen "" \
    --port-file "$T/open-$mode.ports" "${flag[@]}" >"$T/open-$mode.log" 2>&1 &
  pids+=($!)
  wait_file "$T/open-$mode.ports" || fail "open control plane ($mode) did not start"
  port=$(cut -d' ' -f1 "$T/open-$mode.ports")
  "$BIN/riskkvctl" --control "127.0.0.1:$port" "${client[@]}" policy-list >/dev/null ||
    fail "loopback refused ($mode)"
  if [ $mode = insecure ]; then
    grep -q -- "--insecure: serving 0.0.0.0:0 without caller credentials" "$T/open-$mode.log" ||
      fail "no warning for --insecure: $(cat "$T/open-$mode.log")"
  else
    grep -q "listening on 127.0.0.1:0 only instead of 0.0.0.0:0" "$T/open-$mode.log" ||
      fail "no note of the narrowed address ($mode): $(cat "$T/open-$mode.log")"
  fi
  if [ -n "$other" ]; then
    # Whether anything accepts a TCP connection there, whatever the protocol.
    if timeout 5 bash -c "exec 3<>/dev/tcp/$other/$port" 2>/dev/null; then
      [ $mode = insecure ] || fail "a server without caller credentials ($mode) listened on $other"
    else
      [ $mode != insecure ] || fail "--insecure did not listen on $other"
    fi
  fi
done
echo "access test passed"
