// Phi-3 (Phi-3-mini, Phi-3.5-mini): Llama blocks whose Q, K and V projections are one fused
// [q + 2 kv, hidden] matrix and whose gate and up projections are one [2 ffn, hidden] matrix
// (gate first); half-rotation RoPE in both file forms. The loader splits the fused matrices into
// row ranges without copying.
#include "common/model/arch/arch.h"

namespace riskkv {

const ArchTensorNames& Phi3TensorNames(WeightFormat format) {
  static const ArchTensorNames gguf = [] {
    ArchTensorNames n = LlamaTensorNames(WeightFormat::kGguf);
    n.layer.wq = n.layer.wk = n.layer.wv = n.layer.w_gate = n.layer.w_up = "";
    n.layer.wqkv = "blk.$0.attn_qkv.weight";
    n.layer.w_gate_up = "blk.$0.ffn_up.weight";
    return n;
  }();
  static const ArchTensorNames hf = [] {
    ArchTensorNames n = LlamaTensorNames(WeightFormat::kHuggingFace);
    n.layer.wq = n.layer.wk = n.layer.wv = n.layer.w_gate = n.layer.w_up = "";
    n.layer.wqkv = "model.layers.$0.self_attn.qkv_proj.weight";
    n.layer.w_gate_up = "model.layers.$0.mlp.gate_up_proj.weight";
    return n;
  }();
  return format == WeightFormat::kGguf ? gguf : hf;
}

}  // namespace riskkv
