#!/usr/bin/env bash
# Mutual TLS on every endpoint: a control plane and two nodes with certificates from one CA;
# riskkvctl puts a policy, the nodes fetch it and its bank over TLS and migrate a session in
# RECONSTRUCT; a plaintext client and a client with a certificate from another CA are refused;
# bad TLS flags stop a server at start with a message naming them.
#   tls_test.sh BIN_DIR MODEL PYTHON
set -euo pipefail
BIN=$1 MODEL=$2 PY=$3
source "$(dirname "$0")/process_test_lib.sh"

# A CA, a certificate for 127.0.0.1 that every process uses as server and as client, and a
# second CA with its own certificate.
cert() {  # name ca
  openssl req -newkey rsa:2048 -nodes -keyout "$T/$1.key" -out "$T/$1.csr" -subj "/CN=$1" \
    2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' >"$T/$1.ext"
  openssl x509 -req -in "$T/$1.csr" -CA "$T/$2.pem" -CAkey "$T/$2.key" -CAcreateserial \
    -out "$T/$1.pem" -days 2 -extfile "$T/$1.ext" 2>/dev/null
}
for ca in ca rogue-ca; do
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$T/$ca.key" -out "$T/$ca.pem" -days 2 \
    -subj "/CN=riskkv test $ca" 2>/dev/null
done
cert peer ca
cert rogue rogue-ca
TLS=(--tls-cert "$T/peer.pem" --tls-key "$T/peer.key" --tls-ca "$T/ca.pem")
ROGUE=(--tls-cert "$T/rogue.pem" --tls-key "$T/rogue.key" --tls-ca "$T/ca.pem")

# Bad TLS flags stop a server before it loads anything.
out=$("$BIN/riskkv-control" --store "$T/x" --metrics-listen 127.0.0.1:0 --tls-cert "$T/peer.pem" 2>&1) && fail "cert without key: $out"
grep -q -- "--tls-cert and --tls-key go together" <<<"$out" || fail "cert without key: $out"
echo "not a certificate" >"$T/junk.pem"
out=$("$BIN/riskkv-node" --model "$MODEL" --tls-cert "$T/peer.pem" --tls-key "$T/peer.key" \
  --tls-ca "$T/junk.pem" 2>&1) && fail "junk CA: $out"
grep -q -- "--tls-ca: .*junk.pem holds no PEM block" <<<"$out" || fail "junk CA: $out"

"$BIN/riskkv-calibrate" --model "$MODEL" --out "$T/cal" --quick --epsilon 10 --quiet >/dev/null
"$BIN/riskkv-control" --store "$T/store" --listen 127.0.0.1:0 --metrics-listen "" \
  --port-file "$T/control.ports" "${TLS[@]}" >"$T/control.log" 2>&1 &
pids+=($!)
wait_file "$T/control.ports" || fail "control plane did not start"
CONTROL=127.0.0.1:$(cut -d' ' -f1 "$T/control.ports")
"$BIN/riskkvctl" --control "$CONTROL" "${TLS[@]}" policy-put --policy "$T/cal/policy.pb" \
  --bank "$T/cal/bank.rkvbank" >"$T/put.json" || fail "policy-put over TLS"
ID=$(json "['policy']['policyId']" <"$T/put.json")
out=$("$BIN/riskkvctl" --control "$CONTROL" policy-list 2>&1) && fail "plaintext client served: $out"

for n in a b; do
  "$BIN/riskkv-node" --model "$MODEL" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
    --port-file "$T/$n.ports" --threads 1 --activations f32 --kv-dtype f32 "${TLS[@]}" \
    --control "$CONTROL" --policy-id "$ID" --cache-dir "$T/cache-$n" >"$T/$n.log" 2>&1 &
  pids+=($!)
  wait_file "$T/$n.ports" || fail "node $n did not start"
done
for n in a b; do
  wait_metric $n 'riskkv_policy_version{model="tiny_llama_deep"} 1'
  grep -q "now using policy $ID v1" "$T/$n.log" || fail "node $n did not get the policy over TLS"
done
s=$(ctl a "${TLS[@]}" start --tokens '[5,36,67,98,129,160,191,222,253,284]' | json "['sessionId']")
reply=$(ctl a "${TLS[@]}" migrate --session "$s" --to "$(addr b)" --mode reconstruct --nofallback) ||
  fail "migration between TLS nodes"
[ "$(echo "$reply" | json "['mode']")" = RECONSTRUCT ] || fail "reconstruct over TLS: $reply"
[ "$(ctl a "${TLS[@]}" health)" = "$(addr a) SERVING" ] || fail "health over TLS"
out=$(ctl a health 2>&1) && fail "plaintext client served by a TLS node: $out"
out=$(ctl a "${ROGUE[@]}" health 2>&1) && fail "a certificate from another CA was accepted: $out"
echo "TLS test passed"
