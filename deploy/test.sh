#!/usr/bin/env bash
# Sets everything up, builds, and runs the whole test suite: the Release build, then the same
# tests under AddressSanitizer + UndefinedBehaviorSanitizer, the service tests under
# ThreadSanitizer, a clang build of the whole tree that checks the lock annotations, and every
# parser's fuzz target under libFuzzer for a minute each.
#   deploy/test.sh            # release + asan + tsan + thread-safety + fuzz
#   deploy/test.sh release    # one preset only
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/setup.sh
presets=("${@:-release asan tsan thread-safety fuzz}")
for preset in ${presets[*]}; do
  targets=()
  case "$preset" in
    # The tsan test preset runs the service tests only (label "service").
    tsan) targets=(node_test live_handover_test migration_test live_migration_test control_test
                   policy_follower_test session_table_test mode_planner_test rate_limiter_test
                   migration_outcomes_test kv_budget_test node_access_test access_list_test
                   access_file_test authorizer_test client_token_test) ;;
    # The lock annotations live in the libraries (tests and benches hold none): the thread-safety
    # preset compiles every library and server, not the tests.
    thread-safety) targets=(riskkv-node riskkv-control riskkvctl riskkv-calibrate riskkv-generate
                            riskkv-score riskkv_cli riskkv_services riskkv_calibrate
                            riskkv_access_list riskkv_access riskkv_migration riskkv_node
                            riskkv_client riskkv_control riskkv_kvcodec riskkv_model riskkv_engine
                            riskkv_model_files riskkv_tokenizer riskkv_base riskkv_recovery
                            riskkv_kernels riskkv_proto riskkv_grpc_proto) ;;
    # The fuzz preset builds and runs the fuzz targets only (label "fuzz").
    fuzz) targets=(gguf_fuzz safetensors_fuzz tokenizer_json_fuzz bank_fuzz policy_fuzz
                   session_codec_fuzz migration_receiver_fuzz) ;;
  esac
  echo "=== build ($preset) ==="
  deploy/build.sh "$preset" "${targets[@]}"
  # -Wthread-safety is checked by the compiler: for that preset the build is the test.
  [ "$preset" = thread-safety ] && continue
  echo "=== test ($preset) ==="
  ctest --preset "$preset" -j 2
done
