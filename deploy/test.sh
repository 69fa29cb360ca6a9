#!/usr/bin/env bash
# Sets everything up, builds, and runs the whole test suite: the Release build, then the same
# tests under AddressSanitizer + UndefinedBehaviorSanitizer.
#   deploy/test.sh            # release + asan
#   deploy/test.sh release    # one preset only
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/setup.sh
presets=("${@:-release asan}")
for preset in ${presets[*]}; do
  echo "=== build ($preset) ==="
  deploy/build.sh "$preset"
  echo "=== test ($preset) ==="
  ctest --preset "$preset" -j 2
done
