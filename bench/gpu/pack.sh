#!/usr/bin/env bash
# Prepares what bench/gpu/check.sh needs on a GPU machine that cannot build the host side (no
# gRPC, Abseil or Eigen there) and cannot download anything:
#   .gpu/        the binaries and gpu tests of the portable image-cuda build, every shared library
#                they load except glibc, libstdc++ and CUDA's own (the GPU machine has those), and
#                the tiny test models;
#   .gpu-model/  the default model (SmolLM2-135M-Instruct Q4_1) cut into 20 MiB parts with their
#                SHA-256, so it can travel in several transfers of a bounded size.
# Both folders are git-ignored.
#   bench/gpu/pack.sh [--no-model]
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
with_model=1
[ "${1:-}" = --no-model ] && with_model=0
HOME_DIR=${RISKKV_HOME:-$HOME/.cache/riskkv}
MODEL=$HOME_DIR/models/SmolLM2-135M-Instruct.Q4_1.gguf
note() { echo "[pack] $*" >&2; }

TARGETS=(riskkv_cuda cuda_ops_test gpu_model_test engine_test riskkv-gpu-bench riskkv-node riskkvctl
  riskkv-calibrate)
note "building ${TARGETS[*]} (preset image-cuda: x86-64-v3, sm_80 and sm_90)"
deploy/build.sh image-cuda "${TARGETS[@]}"
B=build/image-cuda
testdata=build/release/testdata
[ -f "$testdata/tiny_llama_deep.gguf" ] || {
  note "generating the tiny test models"
  bash tests/tools/make_testdata.sh "$testdata" "$MODEL"
}

rm -rf .gpu && mkdir -p .gpu/bin .gpu/lib .gpu/testdata
cp "$B/kernels/cuda/libriskkv_cuda.so" "$B/kernels/cuda/libriskkv_cuda_probe.so" \
  "$B/tests/kernels/cuda_ops_test" \
  "$B/tests/common/model/gpu_model_test" "$B/tests/common/engine/engine_test" \
  "$B/bench/riskkv-gpu-bench" "$B/services/riskkv-node" \
  "$B/services/riskkvctl" "$B/services/riskkv-calibrate" .gpu/bin/
skip='/(libc|libm|libpthread|libdl|librt|libresolv|libstdc\+\+|libgcc_s|ld-linux[^/]*|libcuda|libcudart|libcublas|libcublasLt)\.so'
ldd .gpu/bin/* | awk '/=> \// {print $3}' | sort -u | { grep -v -E "$skip" || true; } |
  while read -r lib; do cp -L "$lib" .gpu/lib/; done
# Every tiny model a gpu test loads (gpu_model_test's GpuModelMatchesCpu and GpuBatchStep
# cases, engine_test, backend_test): on a GPU machine a case skipped for a missing file counts
# as a failure.
for m in tiny_llama.gguf tiny_llama_q4_1.gguf tiny_qwen2.gguf tiny_qwen2_untied.gguf \
  tiny_qwen2_yarn.gguf tiny_llama_llama3.gguf tiny_llama_linear.gguf tiny_llama_kquant.gguf \
  tiny_phi3.gguf tiny_llama_deep.gguf; do
  cp "$testdata/$m" .gpu/testdata/
done
# backend_test calibrates a policy on the default corpus, which only Debian's jargon-text has.
cp /usr/share/doc/jargon-text/jargon.txt.gz .gpu/testdata/
note ".gpu: $(du -sh .gpu | cut -f1) ($(ls .gpu/lib | wc -l) libraries)"

if [ "$with_model" = 1 ]; then
  rm -rf .gpu-model && mkdir -p .gpu-model
  split -b 20M -d "$MODEL" .gpu-model/model.part-
  (cd "$(dirname "$MODEL")" && sha256sum "$(basename "$MODEL")") >.gpu-model/SHA256SUMS
  note ".gpu-model: $(ls .gpu-model | grep -c part) parts of at most 20 MiB"
fi
for d in .gpu .gpu-model; do
  grep -qx "/$d/" "$ROOT/.git/info/exclude" 2>/dev/null || grep -qx "/$d/" .gitignore ||
    note "warning: $d is not git-ignored"
done
