#!/usr/bin/env bash
# Sets everything up, builds, and runs the whole test suite: the Release build and its tests, the
# lock annotations of every library and server checked by clang (-Wthread-safety, as errors, on
# the Release tree's compile commands), the same tests under AddressSanitizer +
# UndefinedBehaviorSanitizer, the service tests under ThreadSanitizer, and every parser's fuzz
# target under libFuzzer. Ends with each stage's time.
#   deploy/test.sh            # release + thread-safety + asan + tsan + fuzz
#   deploy/test.sh release    # one stage only
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/setup.sh
stages=("${@:-release thread-safety asan tsan fuzz}")
T0=$(date +%s)
TIMES=()
timed() {
  local start rc=0
  start=$(date +%s)
  "$@" || rc=$?
  TIMES+=("$(printf '%-40s %6ds' "$*" $(($(date +%s) - start)))")
  return $rc
}
report() {
  local rc=$?
  echo "=== stage times ==="
  printf '%s\n' "${TIMES[@]}"
  printf '%-40s %6ds (rc %d)\n' "total" $(($(date +%s) - T0)) $rc
}
trap report EXIT
for stage in ${stages[*]}; do
  targets=()
  case "$stage" in
    # Syntax only, with the flags the Release tree compiles with; its protos are generated first.
    thread-safety)
      echo "=== thread-safety (clang -Wthread-safety on build/release) ==="
      timed deploy/build.sh release riskkv_proto riskkv_grpc_proto >/dev/null
      timed deploy/thread_safety.py build/release
      continue ;;
    # The tsan test preset runs the service tests and the calibration's concurrent scoring
    # (labels "service" and "threads").
    tsan) targets=(node_test live_handover_test migration_test live_migration_test control_test
                   policy_follower_test session_table_test mode_planner_test rate_limiter_test
                   migration_outcomes_test kv_budget_test node_access_test access_list_test
                   access_file_test authorizer_test client_token_test
                   concurrent_requests_test scheduler_test) ;;
    # The fuzz preset builds and runs the fuzz targets only (label "fuzz").
    fuzz) targets=(gguf_fuzz safetensors_fuzz tokenizer_json_fuzz bank_fuzz policy_fuzz
                   session_codec_fuzz migration_receiver_fuzz
                   transform_codec_fuzz) ;;
  esac
  echo "=== build ($stage) ==="
  timed deploy/build.sh "$stage" "${targets[@]}"
  echo "=== test ($stage) ==="
  timed ctest --preset "$stage" -j 2
done
