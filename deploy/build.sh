#!/usr/bin/env bash
# Configures and builds one CMake preset (release by default; asan, tsan, fuzz; image
# and image-cuda for the container images), all targets or the ones named.
#   deploy/build.sh [release|asan|tsan|fuzz|image|image-cuda] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-release}"
[ $# -gt 0 ] && shift
jobs="$(nproc)"
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$jobs" "${targets[@]}"
