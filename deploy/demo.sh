#!/usr/bin/env bash
# Sets everything up, builds, and runs the main job: SmolLM2-135M generating a continuation of
# a prompt on the CPU, with prefill and decode speed.
#   deploy/demo.sh ["prompt text"] [tokens]
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/setup.sh
deploy/build.sh release
RISKKV_HOME="${RISKKV_HOME:-$HOME/.cache/riskkv}"
prompt="${1:-The three most useful things to pack for a week of hiking are}"
exec build/release/services/riskkv-generate \
  --model "$RISKKV_HOME/models/SmolLM2-135M-Instruct.Q4_1.gguf" --prompt "$prompt" -n "${2:-64}"
