// Fuzz target: a transform-coded chunk of KV rows (common/kvcodec/transform_codec.h) as a target
// decodes it. The first input byte picks the row count (1 to 64), the second the step; the rest
// is the chunk. The transform is fitted once to fixed rows of 3 heads of 16. Run with a corpus
// directory, it first writes there chunks the encoder makes at each step, as seeds.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "common/kvcodec/transform_codec.h"

namespace {

constexpr int64_t kHeads = 3, kDim = 16, kWidth = kHeads * kDim;
constexpr float kSteps[] = {0.01f, 0.1f, 1.0f, 8.0f};

// Deterministic correlated rows (a few shared factors per head).
std::vector<float> Rows(int64_t n, uint32_t seed) {
  std::vector<float> x(n * kWidth);
  uint32_t s = seed;
  auto next = [&s] {
    s = s * 1664525u + 1013904223u;
    return static_cast<float>(s >> 8) / 16777216.0f - 0.5f;
  };
  for (int64_t t = 0; t < n; ++t) {
    const float a = 6 * next(), b = 2 * next();
    for (int64_t c = 0; c < kWidth; ++c) {
      x[t * kWidth + c] = a * std::sin(0.3f * c) + b * std::cos(0.7f * c) + 0.05f * next();
    }
  }
  return x;
}

const riskkv::LayerTransform& Transform() {
  static const riskkv::LayerTransform t = [] {
    const std::vector<float> rows = Rows(256, 1);
    auto fitted = riskkv::FitTransform(riskkv::TransformKind::kPca, rows.data(), 256, kHeads, kDim);
    if (!fitted.ok()) std::abort();
    return *fitted;
  }();
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  for (int i = 1; i < *argc; ++i) {
    const std::string arg = (*argv)[i];
    if (arg.empty() || arg[0] == '-' || !std::filesystem::is_directory(arg)) continue;
    const int64_t n = 20;
    const std::vector<float> rows = Rows(n, 2);
    for (uint8_t k = 0; k < 4; ++k) {
      std::string chunk;
      if (!riskkv::EncodeTransformed(Transform(), kSteps[k], rows.data(), n, 3, &chunk).ok()) {
        std::abort();
      }
      std::ofstream(arg + "/seed_chunk_" + std::to_string(k), std::ios::binary)
          << static_cast<char>(n - 1) << static_cast<char>(k) << chunk;
    }
    break;
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int64_t count = 1 + data[0] % 64;
  const float step = kSteps[data[1] % 4];
  std::vector<float> out(static_cast<size_t>(count * kWidth));
  const std::string_view chunk(reinterpret_cast<const char*>(data + 2), size - 2);
  if (riskkv::DecodeTransformed(Transform(), step, chunk, count, out.data()).ok()) {
    for (float v : out) {
      if (!(std::abs(v) <= 65504.0f)) std::abort();  // a decoded chunk holds f16-range values
    }
  }
  return 0;
}
