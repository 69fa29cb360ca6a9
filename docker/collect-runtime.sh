#!/usr/bin/env bash
# Gathers what a runtime image needs from a build tree: the binaries users run, the CUDA module
# when it was built, and every shared library they load except the C runtime the base image
# provides (glibc, libstdc++, libgcc_s) and, with --cuda-from-base, the CUDA libraries an NVIDIA
# CUDA runtime base provides; with --cpu-only the CUDA module stays out even where the tree has
# one (riskkv:cpu from a host build, docker/Dockerfile.prebuilt). Run by both Dockerfiles' build
# stages and by CI on the release build (tests/deploy), so what goes into the images is checked
# without a container engine.
#   docker/collect-runtime.sh BUILD_DIR OUT_DIR [--cuda-from-base|--cpu-only]
set -euo pipefail
usage="usage: collect-runtime.sh BUILD_DIR OUT_DIR [--cuda-from-base|--cpu-only]"
[ $# -ge 2 ] && [ $# -le 3 ] || { echo "$usage" >&2; exit 2; }
build=$1 out=$2 cuda_from_base=0 cpu_only=0
case "${3:-}" in
  "") ;;
  --cuda-from-base) cuda_from_base=1 ;;
  --cpu-only) cpu_only=1 ;;
  *) echo "collect-runtime: unknown option '$3' ($usage)" >&2; exit 2 ;;
esac
BINARIES=(services/riskkv-node services/riskkv-control services/riskkvctl
  services/riskkv-calibrate services/riskkv-generate services/riskkv-score)
mkdir -p "$out/bin" "$out/lib"
for b in "${BINARIES[@]}"; do
  [ -x "$build/$b" ] || { echo "collect-runtime: $build/$b is missing (build it first)" >&2; exit 1; }
  cp "$build/$b" "$out/bin/"
done
objects=("$out"/bin/*)
if [ "$cpu_only" = 0 ] && [ -f "$build/kernels/cuda/libriskkv_cuda.so" ]; then
  # Beside the binaries, where the node looks for them first: the engine and its small probe.
  for m in libriskkv_cuda.so libriskkv_cuda_probe.so; do
    cp "$build/kernels/cuda/$m" "$out/bin/"
    objects+=("$out/bin/$m")
  done
fi
skip='/(libc|libm|libpthread|libdl|librt|libresolv|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so'
[ "$cuda_from_base" = 1 ] && skip="$skip|/(libcuda|libcudart|libcublas|libcublasLt)\\.so"
missing=$(ldd "${objects[@]}" | awk '/not found/ {print $1}' | sort -u)
[ -z "$missing" ] || { echo "collect-runtime: unresolved libraries: $missing" >&2; exit 1; }
ldd "${objects[@]}" | awk '/=> \// {print $3}' | sort -u | { grep -v -E "$skip" || true; } |
  while read -r lib; do cp -L "$lib" "$out/lib/"; done
echo "collect-runtime: $(ls "$out/bin" | wc -l) files in $out/bin, $(ls "$out/lib" | wc -l) libraries in $out/lib"
