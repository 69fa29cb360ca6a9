// ModelFingerprint: SHA-256 (OpenSSL EVP) over a canonical text of the config and the weights.
#include "common/model/model_fingerprint.h"

#include <openssl/evp.h>

#include <array>
#include <charconv>
#include <memory>
#include <string_view>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace riskkv {
namespace {

// Shortest text that reads back as the same double; independent of the C locale.
std::string DoubleText(double v) {
  std::array<char, 64> buf;
  const auto r = std::to_chars(buf.data(), buf.data() + buf.size(), v);
  return std::string(buf.data(), r.ptr);
}

std::string CanonicalConfig(const ModelConfig& c) {
  // Scaled RoPE adds its lines; an unscaled model's text (and fingerprint) is as before.
  std::string scaling;
  if (!c.rope_scaling.freq_divisors.empty() || c.rope_scaling.attn_factor != 1.0) {
    absl::StrAppend(&scaling, "rope_scaling=", c.rope_scaling.type, "\n",
                    "rope_attn_factor=", DoubleText(c.rope_scaling.attn_factor), "\n");
    for (double d : c.rope_scaling.freq_divisors) {
      absl::StrAppend(&scaling, "rope_freq_divisor=", DoubleText(d), "\n");
    }
  }
  return absl::StrCat("riskkv-model-fingerprint v1\n", "arch=", ArchitectureName(c.arch), "\n",
                      "n_layers=", c.n_layers, "\n", "hidden=", c.hidden, "\n",
                      "n_heads=", c.n_heads, "\n", "n_kv_heads=", c.n_kv_heads, "\n",
                      "head_dim=", c.head_dim, "\n", "ffn=", c.ffn, "\n", "vocab=", c.vocab, "\n",
                      "context_length=", c.context_length, "\n", "rms_eps=", DoubleText(c.rms_eps),
                      "\n", "rope_base=", DoubleText(c.rope_base), "\n", "rope_dim=", c.rope_dim,
                      "\n",
                      "rope_layout=", c.rope_layout == RopeLayout::kHalf ? "half" : "interleaved",
                      "\n", "tied_embeddings=", c.tied_embeddings ? 1 : 0, "\n",
                      "qkv_bias=", c.qkv_bias ? 1 : 0, "\n", scaling);
}

struct MdCtxFree {
  void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
};

}  // namespace

absl::StatusOr<std::string> ModelFingerprint(const Model& model) {
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx(EVP_MD_CTX_new());
  if (ctx == nullptr || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    return absl::InternalError("model fingerprint: cannot initialise SHA-256 (OpenSSL)");
  }
  bool ok = true;
  auto update = [&](const void* data, size_t n) {
    if (n > 0) ok = ok && EVP_DigestUpdate(ctx.get(), data, n) == 1;
  };
  const std::string config = CanonicalConfig(model.config());
  update(config.data(), config.size());
  model.ForEachWeight([&](std::string_view name, DType dtype, const void* data, size_t bytes) {
    const std::string line = absl::StrCat("tensor ", absl::string_view(name.data(), name.size()),
                                          " ", DTypeName(dtype), " ", bytes, "\n");
    update(line.data(), line.size());
    update(data, bytes);
  });
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!ok || EVP_DigestFinal_ex(ctx.get(), digest, &len) != 1 || len != 32) {
    return absl::InternalError("model fingerprint: SHA-256 failed (OpenSSL)");
  }
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), len));
}

}  // namespace riskkv
