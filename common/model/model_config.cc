// Reading and validating model hyper-parameters.
#include "common/model/model_config.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/formats/gguf_file.h"

namespace riskkv {

const char* ArchitectureName(Architecture a) {
  switch (a) {
    case Architecture::kLlama:
      return "llama";
    case Architecture::kQwen2:
      return "qwen2";
    case Architecture::kPhi3:
      return "phi3";
  }
  return "?";
}

namespace {

// GGUF: "<arch>.rope.scaling.*" keys (linear, yarn) or Llama 3's factors as the F32 tensor
// rope_freqs.weight, as llama.cpp's converter writes them.
absl::Status ReadGgufRopeScaling(const GgufFile& gguf, const std::string& arch, ModelConfig* c) {
  auto key = [&](const char* k) { return absl::StrCat(arch, ".rope.scaling.", k); };
  // Phi-3 128k and Phi-3.5 (longrope): llama.cpp's converter writes no scaling type, only the
  // two factor tensors and an attention factor.
  for (const char* longrope : {"rope_factors_long.weight", "rope_factors_short.weight"}) {
    if (gguf.FindTensor(longrope) != nullptr) {
      return absl::UnimplementedError(
          absl::StrCat(gguf.path(), ": ", longrope, " (longrope RoPE scaling) is not supported"));
    }
  }
  RopeScalingSpec spec;
  if (auto type = gguf.GetString(key("type")); type.ok()) spec.type = *type;
  if (spec.type == "none") {
    if (auto attn = gguf.GetFloat(key("attn_factor")); attn.ok() && *attn != 1.0) {
      return absl::UnimplementedError(absl::StrCat(gguf.path(), ": ", key("attn_factor"), " ",
                                                   *attn,
                                                   " without a scaling type is not "
                                                   "supported"));
    }
  }
  const TensorView* factors = gguf.FindTensor("rope_freqs.weight");
  if (factors != nullptr) {
    if (spec.type != "none") {
      return absl::InvalidArgumentError(absl::StrCat(gguf.path(), ": RoPE scaling '", spec.type,
                                                     "' and rope_freqs.weight both given"));
    }
    if (factors->dtype != DType::kF32 || factors->shape.size() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(gguf.path(), ": rope_freqs.weight must be a 1-D F32 tensor, not ",
                       DTypeName(factors->dtype), " of ", factors->shape.size(), " dimensions"));
    }
    std::vector<double> f(static_cast<size_t>(factors->shape[0]));
    for (size_t i = 0; i < f.size(); ++i) {
      float v;
      std::memcpy(&v, factors->data + i * sizeof(float), sizeof(v));
      f[i] = v;
    }
    absl::StatusOr<RopeScaling> scaling = RopeScalingFromFactors(std::move(f), c->rope_dim);
    if (!scaling.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(gguf.path(), ": rope_freqs.weight: ", scaling.status().message()));
    }
    c->rope_scaling = *std::move(scaling);
    return absl::OkStatus();
  }
  if (spec.type == "none") return absl::OkStatus();
  if (gguf.Find(key("yarn_log_multiplier")) != nullptr) {
    return absl::UnimplementedError(absl::StrCat(gguf.path(), ": ", key("yarn_log_multiplier"),
                                                 " (YaRN with a log multiplier) is not "
                                                 "supported"));
  }
  spec.factor = gguf.GetFloat(key("factor")).value_or(1.0);
  spec.original_context = gguf.GetInt(key("original_context_length")).value_or(c->context_length);
  spec.beta_fast = gguf.GetFloat(key("yarn_beta_fast")).value_or(32.0);
  spec.beta_slow = gguf.GetFloat(key("yarn_beta_slow")).value_or(1.0);
  spec.attention_factor = gguf.GetFloat(key("attn_factor")).value_or(0.0);
  absl::StatusOr<RopeScaling> scaling = ComputeRopeScaling(spec, c->rope_base, c->rope_dim);
  if (!scaling.ok()) {
    return absl::Status(scaling.status().code(),
                        absl::StrCat(gguf.path(), ": ", scaling.status().message()));
  }
  c->rope_scaling = *std::move(scaling);
  return absl::OkStatus();
}

// config.json's "rope_scaling": {"rope_type" (or "type"): "linear" | "llama3" | "yarn",
// "factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor",
// "beta_fast", "beta_slow", "attention_factor"}.
// The original context defaults to max_position_embeddings (c->context_length before any cap).
absl::Status ReadHfRopeScaling(const nlohmann::json& r, ModelConfig* c) {
  if (!r.is_object()) return absl::InvalidArgumentError("\"rope_scaling\" must be an object");
  RopeScalingSpec spec;
  for (const char* k : {"rope_type", "type"}) {
    if (r.contains(k) && r[k].is_string()) {
      spec.type = r[k].get<std::string>();
      break;
    }
  }
  if (spec.type == "default") spec.type = "none";
  auto number = [&](const char* k, double* out) -> absl::Status {
    if (!r.contains(k) || r[k].is_null()) return absl::OkStatus();
    if (!r[k].is_number()) {
      return absl::InvalidArgumentError(absl::StrCat("rope_scaling.", k, " must be a number"));
    }
    *out = r[k].get<double>();
    return absl::OkStatus();
  };
  double original = static_cast<double>(c->context_length);
  RETURN_IF_ERROR(number("factor", &spec.factor));
  RETURN_IF_ERROR(number("original_max_position_embeddings", &original));
  RETURN_IF_ERROR(number("low_freq_factor", &spec.low_freq_factor));
  RETURN_IF_ERROR(number("high_freq_factor", &spec.high_freq_factor));
  RETURN_IF_ERROR(number("beta_fast", &spec.beta_fast));
  RETURN_IF_ERROR(number("beta_slow", &spec.beta_slow));
  RETURN_IF_ERROR(number("attention_factor", &spec.attention_factor));
  if (r.contains("mscale") || r.contains("mscale_all_dim") ||
      (r.contains("truncate") && r["truncate"] != true)) {
    return absl::UnimplementedError(
        "rope_scaling with mscale, mscale_all_dim or truncate=false is not supported");
  }
  if (!(original >= 1 && original <= static_cast<double>(int64_t{1} << 30))) {
    return absl::InvalidArgumentError(absl::StrCat("rope_scaling.original_max_position_embeddings ",
                                                   original, " is out of range"));
  }
  spec.original_context = static_cast<int64_t>(original);
  ASSIGN_OR_RETURN(c->rope_scaling, ComputeRopeScaling(spec, c->rope_base, c->rope_dim));
  return absl::OkStatus();
}

// Sliding-window attention is not implemented: a model that declares a window is served only as
// far as the window reaches, where its attention is still full (context_length capped).
void CapContextAtWindow(int64_t window, ModelConfig* c) {
  if (window > 0 && window < c->context_length) c->context_length = window;
}

}  // namespace

absl::Status ModelConfig::Validate() const {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("model config of '", name, "': ", what));
  };
  // Upper bounds reject nonsense that would otherwise turn into huge allocations.
  if (n_layers <= 0 || n_layers > 1024)
    return bad(absl::StrCat("layer count ", n_layers, " out of range"));
  if (hidden <= 0 || hidden > 65536)
    return bad(absl::StrCat("hidden size ", hidden, " out of range"));
  if (n_heads <= 0 || n_heads > 1024)
    return bad(absl::StrCat("head count ", n_heads, " out of range"));
  if (n_kv_heads <= 0 || n_kv_heads > n_heads || n_heads % n_kv_heads != 0) {
    return bad(absl::StrCat("KV head count ", n_kv_heads, " must divide head count ", n_heads));
  }
  if (head_dim <= 0 || head_dim > 1024 || head_dim % 2 != 0)
    return bad(absl::StrCat("head dim ", head_dim, " invalid"));
  if (ffn <= 0 || ffn > 1 << 20) return bad(absl::StrCat("FFN size ", ffn, " out of range"));
  if (vocab <= 0 || vocab > 1 << 22)
    return bad(absl::StrCat("vocabulary size ", vocab, " out of range"));
  if (context_length <= 0 || context_length > 1 << 24)
    return bad(absl::StrCat("context length ", context_length, " out of range"));
  if (!(rms_eps > 0 && rms_eps < 1))
    return bad(absl::StrCat("RMSNorm epsilon ", rms_eps, " out of range"));
  if (!(rope_base > 1)) return bad(absl::StrCat("RoPE base ", rope_base, " must be > 1"));
  if (rope_dim <= 0 || rope_dim > head_dim || rope_dim % 2 != 0) {
    return bad(
        absl::StrCat("RoPE dimension ", rope_dim, " must be even and <= head dim ", head_dim));
  }
  if (!rope_scaling.freq_divisors.empty() &&
      static_cast<int64_t>(rope_scaling.freq_divisors.size()) != rope_dim / 2) {
    return bad(absl::StrCat(rope_scaling.freq_divisors.size(), " RoPE frequency divisors for ",
                            rope_dim / 2, " rotated pairs"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ConfigFromGguf(const GgufFile& gguf) {
  ModelConfig c;
  ASSIGN_OR_RETURN(std::string arch, gguf.GetString("general.architecture"));
  if (arch == "llama") {
    c.arch = Architecture::kLlama;
    // convert_hf_to_gguf permutes llama Q/K rows so that interleaved pairs rotate together.
    c.rope_layout = RopeLayout::kInterleaved;
  } else if (arch == "qwen2") {
    c.arch = Architecture::kQwen2;
    c.rope_layout = RopeLayout::kHalf;
  } else if (arch == "phi3") {
    c.arch = Architecture::kPhi3;
    c.rope_layout = RopeLayout::kHalf;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(gguf.path(), ": unsupported architecture '",
                                                   arch, "' (supported: llama, qwen2, phi3)"));
  }
  c.name = gguf.GetString("general.name").value_or(arch);
  auto u = [&](const char* key) -> absl::StatusOr<int64_t> {
    auto v = gguf.GetUint(absl::StrCat(arch, ".", key));
    if (!v.ok()) return v.status();
    if (*v > (uint64_t{1} << 40)) {
      return absl::InvalidArgumentError(
          absl::StrCat(gguf.path(), ": ", arch, ".", key, " = ", *v, " is out of range"));
    }
    return static_cast<int64_t>(*v);
  };
  ASSIGN_OR_RETURN(c.n_layers, u("block_count"));
  ASSIGN_OR_RETURN(c.hidden, u("embedding_length"));
  ASSIGN_OR_RETURN(c.ffn, u("feed_forward_length"));
  ASSIGN_OR_RETURN(c.n_heads, u("attention.head_count"));
  c.n_kv_heads = u("attention.head_count_kv").value_or(c.n_heads);
  ASSIGN_OR_RETURN(c.context_length, u("context_length"));
  ASSIGN_OR_RETURN(c.rms_eps,
                   gguf.GetFloat(absl::StrCat(arch, ".attention.layer_norm_rms_epsilon")));
  c.rope_base = gguf.GetFloat(absl::StrCat(arch, ".rope.freq_base")).value_or(10000.0);
  c.head_dim = u("attention.key_length").value_or(c.n_heads > 0 ? c.hidden / c.n_heads : 0);
  c.rope_dim = u("rope.dimension_count").value_or(c.head_dim);
  RETURN_IF_ERROR(ReadGgufRopeScaling(gguf, arch, &c));
  if (auto window = gguf.GetUint(absl::StrCat(arch, ".attention.sliding_window")); window.ok()) {
    CapContextAtWindow(static_cast<int64_t>(std::min<uint64_t>(*window, 1u << 30)), &c);
  }
  if (auto v = u("vocab_size"); v.ok()) {
    c.vocab = *v;
  } else if (auto tokens = gguf.Find("tokenizer.ggml.tokens"); tokens != nullptr) {
    c.vocab = static_cast<int64_t>(tokens->strings.size());
  }
  return c;
}

absl::StatusOr<ModelConfig> ConfigFromHfJson(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  auto integer = [&](const char* key, bool required, int64_t fallback) -> absl::StatusOr<int64_t> {
    if (!j.contains(key) || j[key].is_null()) {
      if (required)
        return absl::InvalidArgumentError(absl::StrCat(path, ": missing \"", key, "\""));
      return fallback;
    }
    if (!j[key].is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": \"", key, "\" must be an integer"));
    }
    return j[key].get<int64_t>();
  };
  auto number = [&](const char* key, double fallback) -> absl::StatusOr<double> {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_number())
      return absl::InvalidArgumentError(absl::StrCat(path, ": \"", key, "\" must be a number"));
    return j[key].get<double>();
  };
  auto string = [&](const char* key) -> absl::StatusOr<std::string> {
    if (!j.contains(key) || j[key].is_null()) return std::string();
    if (!j[key].is_string())
      return absl::InvalidArgumentError(absl::StrCat(path, ": \"", key, "\" must be a string"));
    return j[key].get<std::string>();
  };
  ModelConfig c;
  ASSIGN_OR_RETURN(const std::string model_type, string("model_type"));
  if (model_type == "llama") {
    c.arch = Architecture::kLlama;
  } else if (model_type == "qwen2") {
    c.arch = Architecture::kQwen2;
    c.qkv_bias = true;
  } else if (model_type == "phi3") {
    c.arch = Architecture::kPhi3;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(path, ": unsupported model_type '", model_type,
                                                   "' (supported: llama, qwen2, phi3)"));
  }
  c.rope_layout = RopeLayout::kHalf;  // HF weights are not permuted
  ASSIGN_OR_RETURN(c.name, string("_name_or_path"));
  if (c.name.empty()) c.name = ArchitectureName(c.arch);
  ASSIGN_OR_RETURN(c.n_layers, integer("num_hidden_layers", true, 0));
  ASSIGN_OR_RETURN(c.hidden, integer("hidden_size", true, 0));
  ASSIGN_OR_RETURN(c.ffn, integer("intermediate_size", true, 0));
  ASSIGN_OR_RETURN(c.n_heads, integer("num_attention_heads", true, 0));
  ASSIGN_OR_RETURN(c.n_kv_heads, integer("num_key_value_heads", false, c.n_heads));
  ASSIGN_OR_RETURN(c.vocab, integer("vocab_size", true, 0));
  ASSIGN_OR_RETURN(c.context_length, integer("max_position_embeddings", false, 2048));
  ASSIGN_OR_RETURN(c.head_dim,
                   integer("head_dim", false, c.n_heads > 0 ? c.hidden / c.n_heads : 0));
  ASSIGN_OR_RETURN(c.rms_eps, number("rms_norm_eps", 1e-6));
  ASSIGN_OR_RETURN(c.rope_base, number("rope_theta", 10000.0));
  c.rope_dim = c.head_dim;
  if (j.contains("tie_word_embeddings") && j["tie_word_embeddings"].is_boolean()) {
    c.tied_embeddings = j["tie_word_embeddings"].get<bool>();
  }
  // Before the sliding window caps the context: YaRN's original context defaults to the full one.
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    absl::Status s = ReadHfRopeScaling(j["rope_scaling"], &c);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  }
  // Qwen2 configs declare a sliding window; all ship it switched off, which is what is served.
  if (j.contains("use_sliding_window") && j["use_sliding_window"] == true) {
    return absl::UnimplementedError(absl::StrCat(
        path, ": sliding-window attention (use_sliding_window: true) is not supported"));
  }
  // Phi-3 attends over a sliding window with no switch; within it attention is full.
  if (c.arch == Architecture::kPhi3 && j.contains("sliding_window") &&
      !j["sliding_window"].is_null()) {
    ASSIGN_OR_RETURN(const int64_t window, integer("sliding_window", false, 0));
    CapContextAtWindow(window, &c);
  }
  if (c.arch == Architecture::kPhi3 && j.contains("partial_rotary_factor") &&
      j["partial_rotary_factor"] != 1.0) {
    return absl::UnimplementedError(absl::StrCat(path, ": partial_rotary_factor other than 1"));
  }
  return c;
}

absl::Status CheckTokenIds(std::span<const int32_t> tokens, int64_t vocab) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token id ", tokens[i], " at index ", i, " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace riskkv
