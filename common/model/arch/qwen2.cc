// Qwen2 / Qwen2.5: Llama blocks plus biases on the Q, K and V projections; GGUF keeps the
// Hugging Face (half-rotation) RoPE layout, so Q/K rows are not permuted.
#include "common/model/arch/arch.h"

namespace riskkv {

const ArchTensorNames& Qwen2TensorNames(WeightFormat format) {
  static const ArchTensorNames gguf = [] {
    ArchTensorNames n = LlamaTensorNames(WeightFormat::kGguf);
    n.layer.bq = "blk.$0.attn_q.bias";
    n.layer.bk = "blk.$0.attn_k.bias";
    n.layer.bv = "blk.$0.attn_v.bias";
    return n;
  }();
  static const ArchTensorNames hf = [] {
    ArchTensorNames n = LlamaTensorNames(WeightFormat::kHuggingFace);
    n.layer.bq = "model.layers.$0.self_attn.q_proj.bias";
    n.layer.bk = "model.layers.$0.self_attn.k_proj.bias";
    n.layer.bv = "model.layers.$0.self_attn.v_proj.bias";
    return n;
  }();
  return format == WeightFormat::kGguf ? gguf : hf;
}

}  // namespace riskkv
