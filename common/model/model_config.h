// Hyper-parameters of a decoder-only Llama-family model, read from GGUF metadata or a Hugging
// Face config.json.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/rope_scaling.h"
#include "kernels/backend.h"

namespace riskkv {

class GgufFile;

enum class Architecture : uint8_t { kLlama, kQwen2, kPhi3 };
const char* ArchitectureName(Architecture a);

struct ModelConfig {
  Architecture arch = Architecture::kLlama;
  std::string name;  // general.name or the HF directory name
  int64_t n_layers = 0;
  int64_t hidden = 0;      // embedding width
  int64_t n_heads = 0;     // query heads
  int64_t n_kv_heads = 0;  // key/value heads (GQA when < n_heads)
  int64_t head_dim = 0;
  int64_t ffn = 0;  // SwiGLU inner width
  int64_t vocab = 0;
  int64_t context_length = 0;  // positions the model was trained for
  double rms_eps = 1e-5;
  double rope_base = 10000.0;
  int64_t rope_dim = 0;  // rotated leading dimensions of each head
  RopeLayout rope_layout = RopeLayout::kHalf;
  RopeScaling rope_scaling;      // unscaled unless the checkpoint declares it
  bool tied_embeddings = false;  // lm head reuses the token embedding
  bool qkv_bias = false;         // Qwen2 carries biases on q/k/v projections

  // Consistency checks (positive sizes, heads divide, rope_dim even and <= head_dim, ...).
  absl::Status Validate() const;
  // Points into rope_scaling: valid while this config is.
  RopeParams rope() const {
    return {rope_base,
            head_dim,
            rope_dim,
            rope_layout,
            rope_scaling.freq_divisors.empty() ? nullptr : rope_scaling.freq_divisors.data(),
            rope_scaling.attn_factor};
  }
  // Elements of K (or V) per token per layer.
  int64_t kv_width() const { return n_kv_heads * head_dim; }
};

// Every id in [0, vocab): InvalidArgument naming the first one outside it and its index. The one
// vocabulary check every engine and service uses.
absl::Status CheckTokenIds(std::span<const int32_t> tokens, int64_t vocab);

// From GGUF metadata: general.architecture and its "<arch>.*" keys. Tied embeddings and biases
// are decided by the loader from the tensors present.
absl::StatusOr<ModelConfig> ConfigFromGguf(const GgufFile& gguf);
// From a Hugging Face config.json (LlamaForCausalLM, Qwen2ForCausalLM).
absl::StatusOr<ModelConfig> ConfigFromHfJson(const std::string& path);

}  // namespace riskkv
