// Where the tests find generated test data and the default model.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace riskkv::testing {

// Directory filled by the testdata_setup fixture (tests/tools/make_testdata.sh).
inline std::filesystem::path TestdataDir() {
  if (const char* env = std::getenv("RISKKV_TESTDATA_DIR")) return env;
  return RISKKV_TESTDATA_DIR;
}

// SmolLM2-135M-Instruct Q4_1, fetched by deploy/setup.sh.
inline std::filesystem::path DefaultModelPath() {
  if (const char* env = std::getenv("RISKKV_MODEL")) return env;
  return RISKKV_DEFAULT_MODEL;
}

}  // namespace riskkv::testing
