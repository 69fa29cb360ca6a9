// Per-architecture tensor-name tables for the two on-disk naming schemes (GGUF and Hugging Face).
#pragma once

#include <string>

#include "common/model/model_config.h"

namespace riskkv {

enum class WeightFormat : uint8_t { kGguf, kHuggingFace };

// Names with "$0" standing for the layer index. Empty means the tensor does not exist.
struct LayerTensorNames {
  std::string attn_norm, wq, wk, wv, wo, bq, bk, bv, ffn_norm, w_gate, w_up, w_down;
  // Fused forms (Phi-3): when set, wq/wk/wv (or w_gate/w_up) are row ranges of this matrix.
  std::string wqkv, w_gate_up;
};
struct ArchTensorNames {
  std::string token_embedding, output_norm, lm_head;
  LayerTensorNames layer;
};

const ArchTensorNames& LlamaTensorNames(WeightFormat format);
const ArchTensorNames& Qwen2TensorNames(WeightFormat format);
const ArchTensorNames& Phi3TensorNames(WeightFormat format);

inline const ArchTensorNames& TensorNamesFor(Architecture arch, WeightFormat format) {
  switch (arch) {
    case Architecture::kQwen2:
      return Qwen2TensorNames(format);
    case Architecture::kPhi3:
      return Phi3TensorNames(format);
    case Architecture::kLlama:
      break;
  }
  return LlamaTensorNames(format);
}

}  // namespace riskkv
