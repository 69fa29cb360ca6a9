// Llama (SmolLM2, TinyLlama): no projection biases; the lm head may be tied to the embedding.
#include "common/model/arch/arch.h"

namespace riskkv {

const ArchTensorNames& LlamaTensorNames(WeightFormat format) {
  static const ArchTensorNames gguf{
      "token_embd.weight",
      "output_norm.weight",
      "output.weight",
      {"blk.$0.attn_norm.weight", "blk.$0.attn_q.weight", "blk.$0.attn_k.weight",
       "blk.$0.attn_v.weight", "blk.$0.attn_output.weight", "", "", "", "blk.$0.ffn_norm.weight",
       "blk.$0.ffn_gate.weight", "blk.$0.ffn_up.weight", "blk.$0.ffn_down.weight", "", ""}};
  static const ArchTensorNames hf{
      "model.embed_tokens.weight",
      "model.norm.weight",
      "lm_head.weight",
      {"model.layers.$0.input_layernorm.weight", "model.layers.$0.self_attn.q_proj.weight",
       "model.layers.$0.self_attn.k_proj.weight", "model.layers.$0.self_attn.v_proj.weight",
       "model.layers.$0.self_attn.o_proj.weight", "", "", "",
       "model.layers.$0.post_attention_layernorm.weight", "model.layers.$0.mlp.gate_proj.weight",
       "model.layers.$0.mlp.up_proj.weight", "model.layers.$0.mlp.down_proj.weight", "", ""}};
  return format == WeightFormat::kGguf ? gguf : hf;
}

}  // namespace riskkv
