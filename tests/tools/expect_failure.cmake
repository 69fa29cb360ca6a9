# Runs a command that must fail: a non-zero exit status and output matching a regular expression.
#   cmake -DCMD="prog;arg;..." -DEXPECT="regex" -P expect_failure.cmake
execute_process(COMMAND ${CMD} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "expected a failure, but the command succeeded:\n${out}${err}")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "exit status ${rc}, but the output does not match '${EXPECT}':\n${out}${err}")
endif()
message(STATUS "failed as expected (exit status ${rc})")
