#!/usr/bin/env bash
# Every GPU check in one run, for a short window on a GPU machine: builds the CUDA module there
# with nvcc, runs the gpu tests (each op, the engine, batched steps and the rebuild against the
# CPU oracle; CPU and GPU nodes migrating to each other), runs riskkv-gpu-bench on SmolLM2 and on a random-weight
# model of Qwen2.5-1.5B's shape at 512 and 4,096 tokens, draws the recovery chart, and prints a
# compact summary. About 3 minutes on an H200.
#
# The host binaries come prebuilt from bench/gpu/pack.sh (.gpu/; the GPU machine has no gRPC or
# Abseil to build them), and SmolLM2 from its parts in .gpu-model/ when they travelled; without
# them the SmolLM2 cases are skipped and the bench uses a random model of SmolLM2's shape.
#   bench/gpu/check.sh            results in $OUT (or ./gpu-check) and on stdout
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-check}
mkdir -p "$OUT"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
step() { echo "[check] $*" >&2; }
failures=0

[ -x .gpu/bin/cuda_ops_test ] || { echo "check.sh: .gpu/ is missing: run bench/gpu/pack.sh first" >&2; exit 2; }
PY=$(command -v python3 || true)

say "== riskkv GPU check, $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
command -v nvidia-smi >/dev/null &&
  say "device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"

# cuBLAS from the machine's CUDA toolkit or its Python wheels; the rest from the bundle.
cublas=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib; do
  [ -e "$d/libcublas.so.13" ] && { cublas=$d; break; }
done
if [ -z "$cublas" ] && [ -n "$PY" ]; then  # CUDA 13 wheels: nvidia/cu13/lib (older: nvidia/cublas/lib)
  cublas=$("$PY" -c '
import glob, os, site
for d in site.getsitepackages():
    for pattern in ("nvidia/cu13/lib/libcublas.so.13*", "nvidia/cublas/lib/libcublas.so.13*"):
        hits = glob.glob(os.path.join(d, pattern))
        if hits:
            print(os.path.dirname(hits[0]))
            raise SystemExit
' 2>/dev/null || true)
fi
gpu_present=0
[ -n "$(nvidia-smi -L 2>/dev/null)" ] && gpu_present=1
export LD_LIBRARY_PATH="$ROOT/.gpu/lib${cublas:+:$cublas}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# 1. The CUDA module, built here for this GPU's architecture.
step "building libriskkv_cuda.so and libriskkv_cuda_probe.so with nvcc"
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.')
arch=${arch:-90}
t0=$(date +%s)
if "$NVCC" -O3 -std=c++17 --shared -Xcompiler -fPIC -gencode "arch=compute_$arch,code=sm_$arch" \
  -I"$ROOT" kernels/cuda/device_query.cu kernels/cuda/engine.cu kernels/cuda/kernels.cu \
  ${cublas:+-L"$cublas"} -l:libcublas.so.13 -o "$W/libriskkv_cuda.so" >"$OUT/nvcc.log" 2>&1 &&
  "$NVCC" -O3 -std=c++17 --shared -Xcompiler -fPIC -gencode "arch=compute_$arch,code=sm_$arch" \
    -I"$ROOT" kernels/cuda/device_query.cu -o "$W/libriskkv_cuda_probe.so" >>"$OUT/nvcc.log" 2>&1; then
  export RISKKV_CUDA_MODULE=$W/libriskkv_cuda.so
  say "module: built here for sm_$arch in $(($(date +%s) - t0)) s"
else
  say "module: nvcc FAILED (see nvcc.log); using the bundled sm_80/90 build"
  failures=$((failures + 1))
fi

# 2. SmolLM2 from its parts, checked against its SHA-256.
MODEL=""
if ls .gpu-model/model.part-* >/dev/null 2>&1; then
  cat .gpu-model/model.part-* >"$W/SmolLM2-135M-Instruct.Q4_1.gguf"
  if (cd "$W" && sha256sum -c --quiet "$ROOT/.gpu-model/SHA256SUMS"); then
    MODEL=$W/SmolLM2-135M-Instruct.Q4_1.gguf
  else
    say "model: the SmolLM2 parts do not add up to the file they were cut from"
    failures=$((failures + 1))
  fi
fi
[ -n "$MODEL" ] && say "model: SmolLM2-135M-Instruct Q4_1" ||
  say "model: SmolLM2 absent (.gpu-model/ did not travel): its test cases are skipped"
export RISKKV_TESTDATA_DIR=$ROOT/.gpu/testdata
export RISKKV_CORPUS=$ROOT/.gpu/testdata/jargon.txt.gz
export RISKKV_MODEL=${MODEL:-/nonexistent}

# 3. The gpu tests.
run_gtest() {  # binary [gtest filter]
  local name=$1 filter=${2:-*}
  step "$name"
  timeout 300 ".gpu/bin/$name" --gtest_brief=1 --gtest_filter="$filter" >"$OUT/$name.log" 2>&1
  local rc=$?
  local passed skipped failed
  passed=$(grep -oP '\[  PASSED  \] \K[0-9]+' "$OUT/$name.log" | tail -1)
  skipped=$(grep -oP '\[  SKIPPED \] \K[0-9]+' "$OUT/$name.log" | tail -1)
  failed=$(grep -oP '\[  FAILED  \] \K[0-9]+(?= test)' "$OUT/$name.log" | tail -1)
  say "test $name: rc $rc, passed ${passed:-0}, skipped ${skipped:-0}, failed ${failed:-0}"
  grep -E '^\[  FAILED  \] [A-Za-z]' "$OUT/$name.log" | head -20 | sed 's/^/    /' | tee -a "$SUMMARY"
  grep -h 'Skipped\|no GPU' "$OUT/$name.log" | sort -u | head -3 | sed 's/^/    /' | tee -a "$SUMMARY"
  [ "$rc" = 0 ] || failures=$((failures + 1))
  # On a machine with a GPU nothing may skip: a skip means the module or the device was unusable.
  if [ "$gpu_present" = 1 ] && [ "${skipped:-0}" != 0 ]; then
    say "    FAILED: $skipped case(s) skipped although nvidia-smi lists a GPU"
    failures=$((failures + 1))
  fi
}
run_gtest cuda_ops_test
# gpu_model_test holds the batched step's cases (GpuBatchStep: mixed batches against each session
# run alone and against the CPU); a bundle packed before them would pass without running them.
if [[ "$(.gpu/bin/gpu_model_test --gtest_list_tests 2>/dev/null)" != *GpuBatchStep* ]]; then
  say "test gpu_model_test: FAILED: the bundled binary has no GpuBatchStep cases (re-run pack.sh)"
  failures=$((failures + 1))
fi
if [ -n "$MODEL" ]; then run_gtest gpu_model_test; else run_gtest gpu_model_test '-*smollm2*'; fi
run_gtest engine_test

if [ -n "$PY" ]; then
  for part in flags gpu; do  # the GPU part exits 77 (skipped) where the nodes found no GPU
    step "backend_test $part"
    timeout 300 bash tests/services/backend_test.sh "$ROOT/.gpu/bin" \
      "$ROOT/.gpu/testdata/tiny_llama_deep.gguf" "$PY" $part >"$OUT/backend_test-$part.log" 2>&1
    rc=$?
    say "test backend_test $part: rc $rc$([ $rc = 77 ] && echo ' (skipped: no usable GPU)')"
    grep '^backend_test:' "$OUT/backend_test-$part.log" | sed 's/^/    /' | tee -a "$SUMMARY"
    [ $rc = 0 ] || failures=$((failures + 1))
  done
else
  say "test backend_test: not run (needs python3)"
  failures=$((failures + 1))
fi

# 4. The benchmarks.
bench() {  # label args...
  local label=$1; shift
  step "riskkv-gpu-bench $label"
  if timeout 300 .gpu/bin/riskkv-gpu-bench "$@" --tokens 512,4096 --repetitions 5 \
    --jsonl "$OUT/gpu-bench.jsonl" >"$OUT/bench-$label.txt" 2>"$OUT/bench-$label.err"; then
    say ""
    sed 's/^/  /' "$OUT/bench-$label.txt" | tee -a "$SUMMARY"
  else
    say "bench $label: FAILED: $(tail -2 "$OUT/bench-$label.err")"
    failures=$((failures + 1))
  fi
}
rm -f "$OUT/gpu-bench.jsonl"
if [ -n "$MODEL" ]; then small=(--model "$MODEL"); else small=(--random-shape smollm2-135m); fi
bench smollm2 "${small[@]}"
bench smollm2-pageable "${small[@]}" --nopin  # KV through the staging buffers, as chunks arrive
bench qwen2.5-1.5b-shape --random-shape qwen2.5-1.5b
if [ -s "$OUT/gpu-bench.jsonl" ] && [ -n "$PY" ]; then
  "$PY" bench/gpu/chart_gpu.py "$OUT/gpu-bench.jsonl" "$OUT/gpu-recovery-by-mode.svg" &&
    say "chart: gpu-recovery-by-mode.svg"
fi

say ""
say "== $failures failed step(s); logs in $OUT"
[ "$failures" = 0 ]
