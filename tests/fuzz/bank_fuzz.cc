// Fuzz target: the predictor bank reader (header, group directory, folded maps, checksum) from
// arbitrary file contents. Run with a corpus directory, it first writes two small sound banks
// there (f32 and f16), as seeds.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>

#include "common/recovery/predictor_bank.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  for (int i = 1; i < *argc; ++i) {
    const std::string arg = (*argv)[i];
    if (arg.empty() || arg[0] == '-' || !std::filesystem::is_directory(arg)) continue;
    // Layers 1-2 rebuilt from 0 and 3; kv_width 4, 8 features.
    riskkv::GroupFit fit;
    fit.group.targets = {1, 2};
    fit.group.anchors = {0, 3};
    for (int32_t layer : {1, 2}) {
      riskkv::LayerFit l;
      l.layer = layer;
      l.n_features = 8;
      l.kv_width = 4;
      for (int j = 0; j < 32; ++j) {
        l.a_k.push_back(0.01 * (j % 7));
        l.a_v.push_back(-0.02 * (j % 5));
      }
      l.c_k = {0.1, 0.2, 0.3, 0.4};
      l.c_v = {-0.1, 0.0, 0.1, 0.2};
      l.ridge_lambda = 0.5;
      fit.layers.push_back(l);
    }
    const std::pair<riskkv::DType, const char*> dtypes[] = {{riskkv::DType::kF32, "f32"},
                                                            {riskkv::DType::kF16, "f16"}};
    for (const auto& [dtype, name] : dtypes) {
      auto bank = riskkv::PredictorBank::FromFits("fuzz-model", dtype, {fit});
      if (!bank.ok() || !(*bank)->Write(arg + "/seed_bank_" + name).ok()) std::abort();
    }
    break;
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto bank = riskkv::PredictorBank::Open(riskkv::fuzz::AsFile(data, size, ".rkvbank"), "");
  if (bank.ok()) (void)(*bank)->content_hash();
  return 0;
}
