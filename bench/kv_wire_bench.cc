// riskkv-kv-wire-bench: how much each KV wire form damages a real model's KV, and what each
// migration mode sends in each form.
//
// 1. Prefills --tokens tokens of --text and measures, over every layer, the NRMSE
//    (sqrt(sum err^2 / sum x^2)) of keys and values quantized by each candidate scheme (8 and 4
//    bits; symmetric or with a min; f16 or f32 parameters) in the wire forms' grouping (keys
//    per channel over 32-token groups, values per token and head), with its bytes per value;
//    then the wire forms themselves, with their encode and decode rates on one thread.
// 2. Lossless entropy coding: zstd at levels 1, 3 and 9 over every layer's encoded keys and
//    values in each form, its ratio and rates.
// 3. Candidate quantizers (bench/kv_candidates.h) by NRMSE and, with --eval-text, by ΔNLL.
// 4. The KV bytes a migration of a --history-token session sends: FULL_KV in every form and,
//    with --policy, RECONSTRUCT in every form, each as a share of FULL_KV plain f16.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/eval_texts.h"
#include "bench/kv_candidates.h"
#include "bench/paired_mean.h"
#include "common/kvcodec/kv_codec.h"
#include "common/model/kv_cache.h"
#include "common/model/model.h"
#include "common/model/model_fingerprint.h"
#include "common/recovery/calibration.h"
#include "common/recovery/retention_policy.h"
#include "services/cli_args.h"
#include "zstd.h"

ABSL_FLAG(std::string, model, "", "GGUF file or Hugging Face model directory");
ABSL_FLAG(std::string, text, "", "plain text to prefill");
ABSL_FLAG(int, tokens, 1024, "tokens of --text to prefill");
ABSL_FLAG(int, threads, 0, "CPU threads (0: all)");
ABSL_FLAG(std::string, activations, "int8", "int8 or f32");
ABSL_FLAG(int, history, 544, "history length of the migration whose bytes are counted");
ABSL_FLAG(std::string, policy, "", "retention policy (policy.pb) for the RECONSTRUCT rows");
ABSL_FLAG(std::string, eval_text, "",
          "comma-separated plain-text files: ΔNLL of every candidate quantizer on requests cut "
          "from each");
ABSL_FLAG(int, eval_requests, 4, "requests per --eval-text file");
ABSL_FLAG(int, eval_history, 512, "history tokens of each ΔNLL request");
ABSL_FLAG(int, eval_tokens, 128, "scored tokens of each ΔNLL request");
ABSL_FLAG(std::string, candidates, "",
          "comma-separated 1-based numbers of the candidate quantizers to measure (empty: all)");

namespace {

using riskkv::DType;
using riskkv::QuantScheme;
using riskkv::WireForm;
using riskkv::bench::Mean;
using riskkv::bench::MeanCi;

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
  const riskkv::bench::Candidate c{.name = "wire grouping",
                                   .bits = s.bits,
                                   .with_min = s.with_min,
                                   .param_dtype = s.param_dtype,
                                   .value_group = dim};
  std::vector<float> y = x;
  riskkv::bench::Apply(c, values, y.data(), n, heads, dim);
  double e = 0;
  for (size_t i = 0; i < x.size(); ++i) e += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
  return e;
}

double BytesPerValue(const QuantScheme& s, bool values, int64_t dim) {
  const double code = s.bits / 8.0;
  const double params = static_cast<double>(riskkv::ParamBytes(s));
  return code + params / (values ? static_cast<double>(dim) : riskkv::kTokenGroup);
}

// Every candidate of kv_candidates.h: NRMSE over the prefill's keys and values, bytes at the
// --history of a migration as a share of plain f16, and the ΔNLL of --eval-tokens scored tokens
// after --eval-history tokens of each --eval-text file, the candidate applied to every layer's
// moved rows, paired with exact KV.
int CandidateTable(riskkv::Model& model, const std::vector<Tensor>& keys,
                   const std::vector<Tensor>& vals, double key_energy, double val_energy,
                   int64_t n) {
  const riskkv::ModelConfig& c = model.config();
  const int64_t heads = c.n_kv_heads, dim = c.head_dim;
  std::vector<riskkv::bench::Candidate> cands = riskkv::bench::Candidates();
  if (const std::string pick = absl::GetFlag(FLAGS_candidates); !pick.empty()) {
    std::vector<riskkv::bench::Candidate> picked;
    for (absl::string_view part : absl::StrSplit(pick, ',', absl::SkipEmpty())) {
      int i = 0;
      if (!absl::SimpleAtoi(part, &i) || i < 1 || i > static_cast<int>(cands.size())) {
        return Fail("--candidates: " + std::string(part) + " is not a candidate number (1 to " +
                    std::to_string(cands.size()) + ")");
      }
      picked.push_back(cands[i - 1]);
    }
    cands = std::move(picked);
  }
  const riskkv::bench::KeyRope rope{.backend = &model.backend(), .params = c.rope()};
  const std::vector<std::string> paths =
      absl::StrSplit(absl::GetFlag(FLAGS_eval_text), ',', absl::SkipEmpty());
  auto cut = riskkv::bench::CutEvalRequests(model, paths, absl::GetFlag(FLAGS_eval_history),
                                            absl::GetFlag(FLAGS_eval_tokens),
                                            absl::GetFlag(FLAGS_eval_requests));
  if (!cut.ok()) return Fail("--eval-text: " + cut.status().ToString());
  const std::vector<riskkv::Request>& requests = cut->requests;
  const std::vector<size_t>& file_of = cut->file_of;  // the file each request was cut from
  std::vector<std::vector<double>> nll;
  if (!requests.empty()) {
    const int64_t moved = requests[0].moved_rows();
    // Requests are scored concurrently: each call has its own buffer and rotates on the backend
    // its request is scored on.
    auto apply = [&](size_t k, size_t, const riskkv::KvCache&, riskkv::KvCache& work,
                     riskkv::Backend& backend) {
      if (k == 0) return absl::OkStatus();
      std::vector<float> buf(static_cast<size_t>(moved * c.kv_width()));
      const riskkv::bench::KeyRope own_rope{.backend = &backend, .params = rope.params};
      for (int64_t l = 0; l < c.n_layers; ++l) {
        for (const bool v : {false, true}) {
          absl::Status st =
              v ? work.ReadValues(l, 0, moved, buf.data()) : work.ReadKeys(l, 0, moved, buf.data());
          if (!st.ok()) return st;
          riskkv::bench::Apply(cands[k - 1], v, buf.data(), moved, heads, dim, &own_rope);
          st = v ? work.WriteValues(l, 0, moved, buf.data())
                 : work.WriteKeys(l, 0, moved, buf.data());
          if (!st.ok()) return st;
        }
      }
      return absl::OkStatus();
    };
    auto measured = riskkv::MeasureNllWith(
        model, requests, cands.size() + 1, apply, [](int64_t done, int64_t total) {
          std::fprintf(stderr, "\rΔNLL %lld/%lld", static_cast<long long>(done),
                       static_cast<long long>(total));
        });
    std::fprintf(stderr, "\n");
    if (!measured.ok()) return Fail(measured.status().ToString());
    nll = std::move(*measured);
  }
  const int64_t h = absl::GetFlag(FLAGS_history);
  std::printf(
      "\nCandidate quantizers (every layer; bytes at a %lld-token history as a share of plain "
      "f16; ΔNLL over %zu requests of %d + %d tokens, 95%% CI):\n\n| candidate | K NRMSE | V "
      "NRMSE | bytes | ΔNLL [95%% CI] | ΔPPL |",
      static_cast<long long>(h), requests.size(), absl::GetFlag(FLAGS_eval_history),
      absl::GetFlag(FLAGS_eval_tokens));
  if (!nll.empty()) {
    for (size_t f = 0; f < paths.size(); ++f) std::printf(" ΔNLL, text %zu |", f + 1);
  }
  std::string rule = "\n|---|---|---|---|---|---|";
  for (size_t f = 0; !nll.empty() && f < paths.size(); ++f) rule += "---|";
  std::printf("%s\n", rule.c_str());
  for (size_t k = 0; k < cands.size(); ++k) {
    double e[2] = {0, 0};
    for (int64_t l = 0; l < c.n_layers; ++l) {
      for (int v = 0; v < 2; ++v) {
        const std::vector<float>& x = v ? vals[l].x : keys[l].x;
        std::vector<float> y = x;
        riskkv::bench::Apply(cands[k], v == 1, y.data(), n, heads, dim, &rope);
        for (size_t i = 0; i < x.size(); ++i) e[v] += (double(x[i]) - y[i]) * (x[i] - y[i]);
      }
    }
    const double bytes = riskkv::bench::Bytes(cands[k], false, h, heads, dim) +
                         riskkv::bench::Bytes(cands[k], true, h, heads, dim);
    std::string quality = "– | –";
    if (!nll.empty()) {
      std::vector<double> d(requests.size());
      for (size_t r = 0; r < d.size(); ++r) d[r] = nll[k + 1][r] - nll[0][r];
      const Mean m = MeanCi(d);
      char buf[128];
      std::snprintf(buf, sizeof buf, "%+.5f [%+.5f, %+.5f] | %+.3f%%", m.mean, m.lo, m.hi,
                    100.0 * std::expm1(m.mean));
      quality = buf;
      for (size_t f = 0; f < paths.size(); ++f) {
        std::vector<double> own;
        for (size_t r = 0; r < d.size(); ++r) {
          if (file_of[r] == f) own.push_back(d[r]);
        }
        std::snprintf(buf, sizeof buf, " | %+.5f", MeanCi(own).mean);
        quality += buf;
      }
    }
    std::printf("| %s | %.5f | %.5f | %.1f%% | %s |\n", cands[k].name.c_str(),
                std::sqrt(e[0] / key_energy), std::sqrt(e[1] / val_energy),
                100.0 * bytes / (4.0 * static_cast<double>(h * heads * dim)), quality.c_str());
  }
  return 0;
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

  std::printf(
      "\nThe wire forms (RoundTrip; Encode and Decode on one thread, MB/s of the rows as f16):"
      "\n\n| form | K NRMSE | V NRMSE | encode MB/s | decode MB/s |\n|---|---|---|---|---|\n");
  for (WireForm f : {WireForm::kInt8, WireForm::kInt4}) {
    double e[2] = {0, 0}, encode_s = 0, decode_s = 0;
    std::string bytes;
    for (int64_t l = 0; l < c.n_layers; ++l) {
      for (int v = 0; v < 2; ++v) {
        const std::vector<float>& x = v ? vals[l].x : keys[l].x;
        std::vector<float> y(x.size());
        const auto t0 = std::chrono::steady_clock::now();
        riskkv::Encode(f, v == 1, x.data(), 0, n, heads, dim, &bytes, DType::kF16);
        const auto t1 = std::chrono::steady_clock::now();
        if (auto st = riskkv::Decode(f, v == 1, bytes, 0, n, heads, dim, y.data(), DType::kF16);
            !st.ok()) {
          return Fail(st.ToString());
        }
        const auto t2 = std::chrono::steady_clock::now();
        encode_s += std::chrono::duration<double>(t1 - t0).count();
        decode_s += std::chrono::duration<double>(t2 - t1).count();
        for (size_t i = 0; i < x.size(); ++i) e[v] += (double(x[i]) - y[i]) * (x[i] - y[i]);
      }
    }
    const double mb = 2.0 * 2 * static_cast<double>(c.n_layers * n * width) / 1e6;
    std::printf("| %s | %.5f | %.5f | %.0f | %.0f |\n",
                std::string(riskkv::WireFormName(f)).c_str(), std::sqrt(e[0] / key_energy),
                std::sqrt(e[1] / val_energy), mb / encode_s, mb / decode_s);
  }

  // Lossless entropy coding of what each form sends: zstd over each layer's encoded keys and
  // values (one chunk per layer and side, as a migration of up to a few thousand rows sends).
  std::printf(
      "\nzstd over the encoded rows (%lld tokens, every layer's keys and values):\n\n| form | "
      "level | encoded bytes | compressed | ratio | compress MB/s | decompress MB/s |\n"
      "|---|---|---|---|---|---|---|\n",
      static_cast<long long>(n));
  for (WireForm f : {WireForm::kPlain, WireForm::kInt8, WireForm::kInt4}) {
    std::vector<std::string> encoded;
    for (int64_t l = 0; l < c.n_layers; ++l) {
      for (int v = 0; v < 2; ++v) {
        encoded.emplace_back();
        riskkv::Encode(f, v == 1, (v ? vals[l] : keys[l]).x.data(), 0, n, heads, dim,
                       &encoded.back(), DType::kF16);
      }
    }
    for (int level : {1, 3, 9}) {
      int64_t raw = 0, packed = 0;
      double compress_s = 0, decompress_s = 0;
      std::string buf, back;
      for (const std::string& e : encoded) {
        buf.resize(ZSTD_compressBound(e.size()));
        auto t0 = std::chrono::steady_clock::now();
        const size_t z = ZSTD_compress(buf.data(), buf.size(), e.data(), e.size(), level);
        auto t1 = std::chrono::steady_clock::now();
        if (ZSTD_isError(z)) return Fail(ZSTD_getErrorName(z));
        back.resize(e.size());
        const size_t d = ZSTD_decompress(back.data(), back.size(), buf.data(), z);
        auto t2 = std::chrono::steady_clock::now();
        if (ZSTD_isError(d) || d != e.size() || back != e) return Fail("zstd round trip differs");
        compress_s += std::chrono::duration<double>(t1 - t0).count();
        decompress_s += std::chrono::duration<double>(t2 - t1).count();
        raw += static_cast<int64_t>(e.size());
        packed += static_cast<int64_t>(z);
      }
      std::printf("| %s | %d | %lld | %lld | %.3f | %.0f | %.0f |\n",
                  std::string(riskkv::WireFormName(f)).c_str(), level, static_cast<long long>(raw),
                  static_cast<long long>(packed),
                  static_cast<double>(packed) / static_cast<double>(raw),
                  static_cast<double>(raw) / 1e6 / compress_s,
                  static_cast<double>(raw) / 1e6 / decompress_s);
    }
  }

  if (int rc = CandidateTable(**model, keys, vals, key_energy, val_energy, n); rc != 0) return rc;

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
