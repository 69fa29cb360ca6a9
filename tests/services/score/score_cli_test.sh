#!/usr/bin/env bash
# riskkv-score against a reference, as a user compares two configurations of a model: one run
# writes each position's top tokens (--top), later runs of the same tokens report their KL
# divergence from it, top-1 agreement and NLL change (--reference); a bad reference is refused
# with its reason.
#   score_cli_test.sh BIN_DIR MODEL PYTHON
set -euo pipefail
BIN=$1 MODEL=$2 PY=$3
fail() { echo "FAIL: $*" >&2; exit 1; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$PY" -c "import json; print(json.dumps([(i * 37 + 11) % 500 for i in range(80)]))" >"$T/t.json"
score() { "$BIN/riskkv-score" --model "$MODEL" --tokens-file "$T/t.json" --threads 1 "$@"; }
field() { "$PY" -c "import json,sys; print(json.load(open('$1'))$2)"; }

score --activations f32 --top --out "$T/ref.json"
[ "$(field "$T/ref.json" "['top'].__len__()")" = 79 ] || fail "one distribution per position"
# The same configuration: no divergence, every top token agreeing, no NLL change.
score --activations f32 --reference "$T/ref.json" --out "$T/same.json"
"$PY" - "$T/same.json" <<'PY' || fail "against itself: $(cat "$T/same.json")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["mean_kl"] < 1e-6 and r["top1_agreement"] == 1.0 and abs(r["delta_nll"]) < 1e-12, r
assert len(r["kl"]) == 79 and "top" not in r
PY
# Another arithmetic and KV dtype: a small divergence, measured.
score --activations int8 --kv-dtype f16 --reference "$T/ref.json" --out "$T/int8.json"
"$PY" - "$T/int8.json" <<'PY' || fail "int8 + f16 KV: $(head -c 300 "$T/int8.json")"
import json, sys
r = json.load(open(sys.argv[1]))
assert 0 < r["mean_kl"] < 0.5 and 0 < r["top1_agreement"] <= 1 and abs(r["delta_nll"]) < 0.5, r
assert abs(r["mean_kl"] - sum(r["kl"]) / len(r["kl"])) < 1e-12
print("int8 activations, f16 KV against f32: KL %.6f, top-1 %.3f, dNLL %+.5f"
      % (r["mean_kl"], r["top1_agreement"], r["delta_nll"]))
PY
# Bad references: refused before any work, naming what is wrong.
refused() {
  local needle=$1 out
  shift
  out=$(score "$@" 2>&1) && fail "accepted: $needle"
  grep -q -- "$needle" <<<"$out" || fail "no '$needle' in: $out"
}
refused "scored other tokens" --max-tokens 40 --reference "$T/ref.json"
echo '{"top": 3}' >"$T/bad.json"
refused "is not a riskkv-score --top output" --reference "$T/bad.json"
echo 'not json' >"$T/bad.json"
refused "is not a riskkv-score --top output" --reference "$T/bad.json"
"$PY" -c "
import json; r=json.load(open('$T/ref.json')); r['top'][5]['logprobs'][0]=2.5
json.dump(r, open('$T/bad.json','w'))"
refused "position 5: reference log-probability 2.5" --reference "$T/bad.json"
"$PY" -c "
import json; r=json.load(open('$T/ref.json')); r['top'].pop()
json.dump(r, open('$T/bad.json','w'))"
refused "does not hold one distribution per position" --reference "$T/bad.json"
refused "cannot open" --reference "$T/missing.json"
echo "PASS"
