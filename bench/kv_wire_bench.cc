// riskkv-kv-wire-bench: how much each KV wire form damages a real model's KV, and what each
// migration mode sends in each form.
//
// 1. Prefills --tokens tokens of --text and measures, over every layer, the NRMSE
//    (sqrt(sum err^2 / sum x^2)) of keys and values quantized by each candidate scheme (8 and 4
//    bits; symmetric or with a min; f16 or f32 parameters) in the wire forms' grouping (keys
//    per channel over 32-token groups, values per token and head), with its bytes per value;
//    then the wire forms themselves through RoundTrip.
// 2. The KV bytes a migration of a --history-token session sends: FULL_KV in every form and,
//    with --policy, RECONSTRUCT in every form, each as a share of FULL_KV plain f16.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/kvcodec/kv_codec.h"
#include "common/model/kv_cache.h"
#include "common/model/model.h"
#include "common/model/model_fingerprint.h"
#include "common/recovery/retention_policy.h"
#include "services/cli_args.h"

ABSL_FLAG(std::string, model, "", "GGUF file or Hugging Face model directory");
ABSL_FLAG(std::string, text, "", "plain text to prefill");
ABSL_FLAG(int, tokens, 1024, "tokens of --text to prefill");
ABSL_FLAG(int, threads, 0, "CPU threads (0: all)");
ABSL_FLAG(std::string, activations, "int8", "int8 or f32");
ABSL_FLAG(int, history, 544, "history length of the migration whose bytes are counted");
ABSL_FLAG(std::string, policy, "", "retention policy (policy.pb) for the RECONSTRUCT rows");

namespace {

using riskkv::DType;
using riskkv::QuantScheme;
using riskkv::WireForm;

int Fail(const std::string& m) {
  std::fprintf(stderr, "riskkv-kv-wire-bench: %s\n", m.c_str());
  return 1;
}

struct Tensor {
  std::vector<float> x;  // [tokens, width]
};

// Sum of squared errors of `s` over one layer's keys or values, quantized in the wire grouping.
double SquaredError(const QuantScheme& s, bool values, const std::vector<float>& x, int64_t n,
                    int64_t heads, int64_t dim) {
  const int64_t c = heads * dim;
  std::vector<uint8_t> codes(x.size());
  std::vector<float> y(x.size());
  if (values) {
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t o = t * c + h * dim;
        auto p = riskkv::QuantizeGroup(s, x.data() + o, dim, 1, codes.data() + o);
        riskkv::DequantizeGroup(s, p, codes.data() + o, dim, 1, y.data() + o);
      }
    }
  } else {
    for (int64_t t = 0; t < n; t += riskkv::kTokenGroup) {
      const int64_t m = std::min<int64_t>(riskkv::kTokenGroup, n - t);
      for (int64_t ch = 0; ch < c; ++ch) {
        const int64_t o = t * c + ch;
        auto p = riskkv::QuantizeGroup(s, x.data() + o, m, c, codes.data() + o);
        riskkv::DequantizeGroup(s, p, codes.data() + o, m, c, y.data() + o);
      }
    }
  }
  double e = 0;
  for (size_t i = 0; i < x.size(); ++i) e += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
  return e;
}

double BytesPerValue(const QuantScheme& s, bool values, int64_t dim) {
  const double code = s.bits / 8.0;
  const double params = static_cast<double>(riskkv::ParamBytes(s));
  return code + params / (values ? static_cast<double>(dim) : riskkv::kTokenGroup);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "riskkv-kv-wire-bench --model PATH --text FILE [--tokens 1024] [--policy policy.pb]");
  std::vector<std::string> store;
  std::vector<char*> args = riskkv::NormalizeFlagNames(argc, argv, &store);
  absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  auto options =
      riskkv::ModelOptionsFromFlags(absl::GetFlag(FLAGS_threads), absl::GetFlag(FLAGS_activations));
  if (!options.ok()) return Fail(options.status().ToString());
  auto model = riskkv::Model::Load(absl::GetFlag(FLAGS_model), *options);
  if (!model.ok()) return Fail(model.status().ToString());
  const riskkv::ModelConfig& c = (*model)->config();
  const int64_t heads = c.n_kv_heads, dim = c.head_dim, width = c.kv_width();

  std::ifstream in(absl::GetFlag(FLAGS_text));
  if (!in) return Fail("cannot read --text " + absl::GetFlag(FLAGS_text));
  std::stringstream text;
  text << in.rdbuf();
  auto ids = (*model)->tokenizer().Encode(text.str(), /*add_special=*/true, false);
  if (!ids.ok()) return Fail(ids.status().ToString());
  const int64_t n = absl::GetFlag(FLAGS_tokens);
  if (n < 1 || static_cast<int64_t>(ids->size()) < n) {
    return Fail("--text has " + std::to_string(ids->size()) + " tokens, --tokens asks for " +
                std::to_string(n));
  }
  ids->resize(static_cast<size_t>(n));
  auto cache = riskkv::KvCache::Create(c.n_layers, heads, dim, n, DType::kF32);
  if (!cache.ok()) return Fail(cache.status().ToString());
  if (auto l = (*model)->Prefill(*ids, **cache); !l.ok()) return Fail(l.status().ToString());

  std::vector<Tensor> keys(c.n_layers), vals(c.n_layers);
  double key_energy = 0, val_energy = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    keys[l].x.resize(n * width);
    vals[l].x.resize(n * width);
    if (!(*cache)->ReadKeys(l, 0, n, keys[l].x.data()).ok() ||
        !(*cache)->ReadValues(l, 0, n, vals[l].x.data()).ok()) {
      return Fail("cannot read the cache");
    }
    for (float v : keys[l].x) key_energy += double(v) * v;
    for (float v : vals[l].x) val_energy += double(v) * v;
  }

  std::printf("%s, %lld tokens of %s, %s activations: NRMSE over %lld layers\n\n", c.name.c_str(),
              static_cast<long long>(n), absl::GetFlag(FLAGS_text).c_str(),
              absl::GetFlag(FLAGS_activations).c_str(), static_cast<long long>(c.n_layers));
  std::printf("| bits | scheme | params | K NRMSE | K bytes/value | V NRMSE | V bytes/value |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (int bits : {8, 4}) {
    for (bool with_min : {false, true}) {
      for (DType pd : {DType::kF16, DType::kF32}) {
        const QuantScheme s{.bits = bits, .with_min = with_min, .param_dtype = pd};
        double ek = 0, ev = 0;
        for (int64_t l = 0; l < c.n_layers; ++l) {
          ek += SquaredError(s, false, keys[l].x, n, heads, dim);
          ev += SquaredError(s, true, vals[l].x, n, heads, dim);
        }
        std::printf("| %d | %s | %s | %.5f | %.4f | %.5f | %.4f |\n", bits,
                    with_min ? "scale+min" : "symmetric", riskkv::DTypeName(pd),
                    std::sqrt(ek / key_energy), BytesPerValue(s, false, dim),
                    std::sqrt(ev / val_energy), BytesPerValue(s, true, dim));
      }
    }
  }

  std::printf("\nThe wire forms (RoundTrip):\n\n| form | K NRMSE | V NRMSE |\n|---|---|---|\n");
  for (WireForm f : {WireForm::kInt8, WireForm::kInt4}) {
    double e[2] = {0, 0};
    for (int64_t l = 0; l < c.n_layers; ++l) {
      for (int v = 0; v < 2; ++v) {
        std::vector<float> y = v ? vals[l].x : keys[l].x;
        if (auto st = riskkv::RoundTrip(f, v == 1, y.data(), 0, n, heads, dim); !st.ok()) {
          return Fail(st.ToString());
        }
        const std::vector<float>& x = v ? vals[l].x : keys[l].x;
        for (size_t i = 0; i < x.size(); ++i) e[v] += (double(x[i]) - y[i]) * (x[i] - y[i]);
      }
    }
    std::printf("| %s | %.5f | %.5f |\n", std::string(riskkv::WireFormName(f)).c_str(),
                std::sqrt(e[0] / key_energy), std::sqrt(e[1] / val_energy));
  }

  // Bytes a migration sends.
  const int64_t h = absl::GetFlag(FLAGS_history);
  auto layer_bytes = [&](WireForm f) {
    return riskkv::LayerWireBytes(f, h, heads, dim, DType::kF16);
  };
  int64_t kept = -1;
  if (!absl::GetFlag(FLAGS_policy).empty()) {
    auto fp = riskkv::ModelFingerprint(**model);
    if (!fp.ok()) return Fail(fp.status().ToString());
    auto p = riskkv::ReadPolicy(absl::GetFlag(FLAGS_policy), static_cast<int32_t>(c.n_layers), *fp);
    if (!p.ok()) return Fail(p.status().ToString());
    kept = static_cast<int64_t>(p->kept_layers.size());
  }
  const double base = static_cast<double>(c.n_layers * layer_bytes(WireForm::kPlain));
  std::printf(
      "\nKV bytes of a %lld-token history (KV f16):\n\n| mode | wire | layers sent | bytes | "
      "share of FULL_KV plain |\n|---|---|---|---|---|\n",
      static_cast<long long>(h));
  for (int64_t layers : {static_cast<int64_t>(c.n_layers), kept}) {
    if (layers < 0) continue;
    for (WireForm f : {WireForm::kPlain, WireForm::kInt8, WireForm::kInt4}) {
      const int64_t b = layers * layer_bytes(f);
      std::printf("| %s | %s | %lld | %lld | %.1f%% |\n",
                  layers == c.n_layers ? "full_kv" : "reconstruct",
                  std::string(riskkv::WireFormName(f)).c_str(), static_cast<long long>(layers),
                  static_cast<long long>(b), 100.0 * static_cast<double>(b) / base);
    }
  }
  return 0;
}
