// Internals shared by the model loader and the forward pass.
#pragma once

#include <memory>
#include <vector>

#include "common/formats/gguf_file.h"
#include "common/formats/safetensors_shards.h"
#include "common/model/model.h"

namespace riskkv {

// Keeps the mapped model file alive for as long as the weights point into it.
class ModelFiles {
 public:
  std::unique_ptr<GgufFile> gguf;
  std::unique_ptr<SafetensorsShards> safetensors;
};

struct Model::Layer {
  std::vector<float> attn_norm, ffn_norm;  // [hidden]
  std::vector<float> bq, bk, bv;  // [n_heads*head_dim], [kv_width], [kv_width]; empty if none
  WeightMatrix wq, wk, wv, wo, w_gate, w_up, w_down;
};

}  // namespace riskkv
