// Fuzz target: a serialized retention policy, read as the control plane reads it (no model) and
// as a node of an 8-layer model does.
#include <google/protobuf/stubs/logging.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/recovery/policy_codec.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);  // malformed strings are the point, not news
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  (void)riskkv::ParsePolicy(bytes, 0, "");
  (void)riskkv::ParsePolicy(bytes, 8, "");
  return 0;
}
