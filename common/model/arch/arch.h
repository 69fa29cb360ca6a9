// Per-architecture tensor-name tables for the two on-disk naming schemes (GGUF and Hugging Face).
#pragma once

#include <string>

#include "common/model/model_config.h"

namespace riskkv {

enum class WeightFormat : uint8_t { kGguf, kHuggingFace };

// Names with "$0" standing for the layer index. Empty means the tensor does not exist.
struct LayerTensorNames {
  std::string attn_norm, wq, wk, wv, wo, bq, bk, bv, ffn_norm, w_gate, w_up, w_down;
};
struct ArchTensorNames {
  std::string token_embedding, output_norm, lm_head;
  LayerTensorNames layer;
};

const ArchTensorNames& LlamaTensorNames(WeightFormat format);
const ArchTensorNames& Qwen2TensorNames(WeightFormat format);

inline const ArchTensorNames& TensorNamesFor(Architecture arch, WeightFormat format) {
  return arch == Architecture::kQwen2 ? Qwen2TensorNames(format) : LlamaTensorNames(format);
}

}  // namespace riskkv
