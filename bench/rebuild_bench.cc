// riskkv-rebuild-bench: time to rebuild every rebuildable layer of an N-token history on the CPU
// (features with inverse RoPE, folded maps, RoPE, cache writes) against a prefill of the same
// history (token replay), measured in one run. The folded maps here have the real shapes but
// random values: the cost of applying them does not depend on the values.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/model/model.h"
#include "common/recovery/features.h"
#include "common/recovery/layer_group.h"
#include "common/recovery/rebuild.h"
#include "services/cli_args.h"

ABSL_FLAG(std::string, model, "", "GGUF file or Hugging Face model directory");
ABSL_FLAG(int, tokens, 512, "history length");
ABSL_FLAG(int, threads, 0, "CPU threads (0: all)");
ABSL_FLAG(int, repetitions, 5, "runs; medians are reported");
ABSL_FLAG(std::string, map_dtype, "f16", "folded map storage: f32 or f16");

namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Fail(const std::string& m) {
  std::fprintf(stderr, "riskkv-rebuild-bench: %s\n", m.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("riskkv-rebuild-bench --model PATH [--tokens 512]");
  std::vector<std::string> store;
  std::vector<char*> args = riskkv::NormalizeFlagNames(argc, argv, &store);
  absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  const int n = absl::GetFlag(FLAGS_tokens);
  const int reps = absl::GetFlag(FLAGS_repetitions);
  if (n < 1 || reps < 1) return Fail("--tokens >= 1, --repetitions >= 1");
  const auto dtype_flag = riskkv::FloatDTypeFromFlag("map-dtype", absl::GetFlag(FLAGS_map_dtype));
  if (!dtype_flag.ok()) return Fail(dtype_flag.status().ToString());
  const riskkv::DType dtype = *dtype_flag;
  auto model =
      riskkv::Model::Load(absl::GetFlag(FLAGS_model), {.threads = absl::GetFlag(FLAGS_threads)});
  if (!model.ok()) return Fail(model.status().ToString());
  const riskkv::ModelConfig& c = (*model)->config();
  auto groups = riskkv::CandidateGroups(static_cast<int32_t>(c.n_layers), {});
  if (!groups.ok()) return Fail(groups.status().ToString());

  // Random maps of the real shapes, stored like a predictor bank stores them.
  const int64_t w = c.kv_width();
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<std::vector<uint8_t>> storage;
  std::vector<float> bias(w, 0.0f);
  std::vector<riskkv::FoldedGroup> folded;
  int64_t rebuilt_layers = 0;
  for (const riskkv::LayerGroup& g : *groups) {
    const int64_t f = riskkv::FeatureWidth(g, w);
    riskkv::FoldedGroup fg{g, {}};
    for (int32_t layer : g.targets) {
      riskkv::FoldedMap m;
      m.layer = layer;
      for (riskkv::WeightMatrix* mat : {&m.k, &m.v}) {
        std::vector<float> values(w * f);
        for (float& v : values) v = normal(rng);
        std::vector<uint8_t> bytes(riskkv::RowBytes(dtype, f) * w);
        if (dtype == riskkv::DType::kF16) {
          riskkv::F32ToF16Row(values.data(), reinterpret_cast<uint16_t*>(bytes.data()), w * f);
        } else {
          std::memcpy(bytes.data(), values.data(), bytes.size());
        }
        storage.push_back(std::move(bytes));
        *mat = {dtype, storage.back().data(), w, f};
      }
      m.c_k = bias;
      m.c_v = bias;
      fg.maps.push_back(m);
      ++rebuilt_layers;
    }
    folded.push_back(std::move(fg));
  }

  std::vector<int32_t> tokens(n);
  for (int i = 0; i < n; ++i) tokens[i] = (i * 7919) % static_cast<int32_t>(c.vocab);
  std::vector<double> prefill_s, rebuild_s;
  for (int r = 0; r <= reps; ++r) {  // r == 0 is an untimed warm-up
    auto cache = (*model)->NewKvCache(n);
    if (!cache.ok()) return Fail(cache.status().ToString());
    const auto t0 = std::chrono::steady_clock::now();
    auto logits = (*model)->Prefill(tokens, **cache);
    if (!logits.ok()) return Fail(logits.status().ToString());
    const auto t1 = std::chrono::steady_clock::now();
    for (const auto& fg : folded) {
      auto s = riskkv::RebuildGroup(**cache, fg, c, (*model)->backend(), 0, n);
      if (!s.ok()) return Fail(s.ToString());
    }
    const auto t2 = std::chrono::steady_clock::now();
    if (r == 0) continue;
    prefill_s.push_back(std::chrono::duration<double>(t1 - t0).count());
    rebuild_s.push_back(std::chrono::duration<double>(t2 - t1).count());
    std::fprintf(stderr, "repetition %d/%d: prefill %.3f s, rebuild %.4f s\n", r, reps,
                 prefill_s.back(), rebuild_s.back());
  }
  const double p = Median(prefill_s), b = Median(rebuild_s);
  std::printf(
      "%s: %d-token history, %lld of %lld layers rebuilt in %zu groups, maps %s, %d threads\n"
      "prefill (token replay)  %.4f s\nrebuild omitted layers  %.4f s\nrebuild / prefill       "
      "%.3f\n",
      c.name.c_str(), n, static_cast<long long>(rebuilt_layers), static_cast<long long>(c.n_layers),
      folded.size(), riskkv::DTypeName(dtype), (*model)->backend().threads(), p, b, b / p);
  return 0;
}
