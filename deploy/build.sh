#!/usr/bin/env bash
# Configures and builds one CMake preset (release by default, or asan).
#   deploy/build.sh [release|asan]
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-release}"
jobs="$(nproc)"
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$jobs"
