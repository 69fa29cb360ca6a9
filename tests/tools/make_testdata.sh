#!/usr/bin/env bash
# Builds the generated test data (the ctest fixture `testdata_setup`): tiny tokenizers, tiny
# random-weight models in GGUF and safetensors form, golden outputs of an independent NumPy forward
# pass for each of them and for the default model, and tokenizer references.
#
# Usage: make_testdata.sh OUT MODEL
#   OUT    directory to fill (created if missing)
#   MODEL  the default model GGUF (SmolLM2-135M-Instruct Q4_1; deploy/setup.sh fetches it)
# Env:   RISKKV_PYTHON  python with numpy, gguf and safetensors (default: the riskkv venv)
#
# Re-runs are instant: a stamp in OUT records a hash of tests/tools/* and MODEL's path, size and
# mtime, and nothing is redone while it matches.
set -euo pipefail

die() { echo "make_testdata.sh: error: $*" >&2; exit 1; }
note() { echo "[make_testdata] $*" >&2; }

[[ $# -eq 2 ]] || die "usage: make_testdata.sh OUT MODEL"
OUT=$1
MODEL=$2
TOOLS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

PY=${RISKKV_PYTHON:-}
if [[ -z $PY ]]; then
  PY=${RISKKV_HOME:-$HOME/.cache/riskkv}/venv/bin/python
  note "RISKKV_PYTHON not set, using $PY"
fi
[[ -x $PY ]] || command -v "$PY" >/dev/null 2>&1 ||
  die "python '$PY' not found: set RISKKV_PYTHON or run deploy/setup.sh to create the venv"
"$PY" -c 'import numpy, gguf, safetensors' 2>/dev/null ||
  die "python '$PY' lacks numpy, gguf or safetensors (pip install numpy gguf safetensors)"
[[ -f $MODEL ]] || die "model '$MODEL' not found: run deploy/setup.sh to fetch it"

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
STAMP=$OUT/.testdata_stamp
# What the data depends on: the generator scripts and the default model's identity.
want=$({
  cd "$TOOLS" && find . -maxdepth 1 -type f ! -name '*.pyc' -print0 | sort -z | xargs -0 sha256sum
  echo "$(cd "$(dirname "$MODEL")" && pwd)/$(basename "$MODEL") $(stat -c '%s %Y' "$MODEL")"
} | sha256sum | cut -d' ' -f1)
if [[ -f $STAMP && $(cat "$STAMP") == "$want" ]]; then
  note "up to date ($OUT)"
  exit 0
fi

start=$SECONDS
# Drop the stamp first so an interrupted run is never mistaken for a finished one, and the old
# outputs so no stale golden set outlives a change to the generators.
rm -rf "$STAMP" "$OUT/golden" "$OUT/tokenizers" "$OUT"/tiny_* "$OUT"/bad_*

note "tokenizers"
"$PY" "$TOOLS/make_tiny_tokenizers.py" "$OUT"
note "tiny models"
"$PY" "$TOOLS/make_tiny_models.py" "$OUT"

ref() { "$PY" "$TOOLS/reference_forward.py" --out "$OUT" "$@"; }
note "broken models for the loader's error tests"
"$PY" "$TOOLS/make_bad_models.py" "$OUT"
note "golden outputs"
# Every tiny model sees the same 40 random tokens (fixed seed), so GGUF/HF and quantized variants
# can be compared with each other as well as with the engine. --same-as asserts that the GGUF and
# safetensors forms of one model agree to 1e-10 (this pins the Q/K RoPE permutation).
ref --model "$OUT/tiny_llama.gguf" --name tiny_llama --random-tokens 40 --same-as "$OUT/tiny_llama_hf"
ref --model "$OUT/tiny_llama.gguf" --name tiny_llama_text --passage-tokens 63 --bos
for variant in f16 bf16 q8_0 q4_0 q4_1; do
  ref --model "$OUT/tiny_llama_$variant.gguf" --name "tiny_llama_$variant" --random-tokens 40
done
for dir in tiny_llama_hf tiny_llama_hf_bf16 tiny_llama_hf_f16 tiny_llama_hf_sharded tiny_qwen2_hf \
  tiny_qwen2_untied_hf; do
  ref --model "$OUT/$dir" --name "$dir" --random-tokens 40
done
ref --model "$OUT/tiny_qwen2.gguf" --name tiny_qwen2 --random-tokens 40 --same-as "$OUT/tiny_qwen2_hf"
ref --model "$OUT/tiny_spm.gguf" --name tiny_spm --random-tokens 40
ref --model "$OUT/tiny_spm_hf" --name tiny_spm_hf --random-tokens 40 --same-as "$OUT/tiny_spm.gguf"
ref --model "$OUT/tiny_llama_kquant.gguf" --name tiny_llama_kquant --random-tokens 40
# Scaled RoPE: each GGUF form is also checked against its HF form (--same-as).
for dir in tiny_llama_hf_llama3 tiny_llama_hf_linear tiny_qwen2_hf_yarn; do
  ref --model "$OUT/$dir" --name "$dir" --random-tokens 40
done
ref --model "$OUT/tiny_llama_llama3.gguf" --name tiny_llama_llama3 --random-tokens 40 \
  --same-as "$OUT/tiny_llama_hf_llama3" --same-tol 1e-6
ref --model "$OUT/tiny_llama_linear.gguf" --name tiny_llama_linear --random-tokens 40 \
  --same-as "$OUT/tiny_llama_hf_linear"
ref --model "$OUT/tiny_qwen2_untied.gguf" --name tiny_qwen2_untied --random-tokens 40 \
  --same-as "$OUT/tiny_qwen2_untied_hf"
ref --model "$OUT/tiny_phi3_hf" --name tiny_phi3_hf --random-tokens 40
ref --model "$OUT/tiny_phi3.gguf" --name tiny_phi3 --random-tokens 40 --same-as "$OUT/tiny_phi3_hf"
ref --model "$OUT/tiny_qwen2_yarn.gguf" --name tiny_qwen2_yarn --random-tokens 40 \
  --same-as "$OUT/tiny_qwen2_hf_yarn"
ref --model "$MODEL" --name smollm2 --passage-tokens 48 --tol 1e-4 --nll-tol 5e-4

if [[ -f $TOOLS/tokenizer_reference.py ]]; then
  note "tokenizer references"
  "$PY" "$TOOLS/tokenizer_reference.py" "$OUT" "$MODEL"
fi

echo "$want" >"$STAMP"
note "done in $((SECONDS - start)) s ($OUT)"
