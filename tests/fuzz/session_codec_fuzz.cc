// Fuzz target: a migrating session's decoding state (token ids, sampling parameters, RNG state)
// as a handshake carries it. Run with a corpus directory, it first writes there the states of a
// greedy and of a sampled session, as seeds.
#include <google/protobuf/stubs/logging.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "riskkv/v1/session.pb.h"
#include "services/session_codec.h"

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  google::protobuf::SetLogHandler(nullptr);  // malformed strings are the point, not news
  for (int i = 1; i < *argc; ++i) {
    const std::string arg = (*argv)[i];
    if (arg.empty() || arg[0] == '-' || !std::filesystem::is_directory(arg)) continue;
    const std::vector<int32_t> tokens = {1, 42, 7, 300, 5};
    riskkv::SamplingParams sampled;
    sampled.temperature = 0.8f;
    sampled.top_p = 0.9f;
    sampled.seed = 11;
    int n = 0;
    for (const riskkv::SamplingParams& p : {riskkv::SamplingParams{}, sampled}) {
      auto sampler = riskkv::Sampler::Create(p);
      if (!sampler.ok()) std::abort();
      std::vector<float> logits(16, 0.25f);
      (void)sampler->Sample(logits);  // an RNG state past its start
      std::ofstream(arg + "/seed_state_" + std::to_string(n++), std::ios::binary)
          << riskkv::EncodeDecodingState(tokens, *sampler).SerializeAsString();
    }
    break;
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  riskkv::v1::DecodingState proto;
  if (!proto.ParseFromArray(data, static_cast<int>(size))) return 0;
  auto state = riskkv::DecodeDecodingState(proto);
  if (!state.ok()) return 0;
  // A restored sampler draws as the source's would.
  std::vector<float> logits(16, 0.5f);
  (void)state->sampler.Sample(logits);
  return 0;
}
