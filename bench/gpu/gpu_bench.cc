// riskkv-gpu-bench: recovery of a migrated session on the GPU against the two alternatives, in one
// run, at several history lengths:
//   token_replay  prefill of the history on the GPU, then the first decode step;
//   full_kv       every layer's KV copied in from host memory, then the first decode step;
//   reconstruct   the retained layers copied in (anchors first), the omitted layers rebuilt as
//                 their anchors land, then the first decode step.
// It also times the rebuild alone (KV already on the device) and reports prefill GEMM throughput
// as a fraction of the chip's f16 tensor peak. Without --policy the predictors have the real
// shapes and random values (the cost does not depend on them) and rebuild about 30% of the
// layers, the share of SmolLM2's default policy.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/model/gpu_model.h"
#include "common/model/model_fingerprint.h"
#include "common/recovery/gpu_rebuild.h"
#include "common/recovery/layer_group.h"
#include "common/recovery/retention_policy.h"
#include "services/cli_args.h"

ABSL_FLAG(std::string, model, "", "GGUF file or Hugging Face directory to benchmark");
ABSL_FLAG(std::string, random_shape, "",
          "instead of --model: a random-weight model of this shape (smollm2-135m, qwen2.5-1.5b); "
          "costs do not depend on the weights");
ABSL_FLAG(std::string, policy, "",
          "directory with policy.pb and bank.rkvbank for --model (default: synthetic predictors)");
ABSL_FLAG(std::string, tokens, "512,4096", "history lengths, comma-separated");
ABSL_FLAG(int, repetitions, 5, "runs per measurement; medians are reported");
ABSL_FLAG(int, device, 0, "CUDA device");
ABSL_FLAG(bool, pin, true,
          "page-lock the host KV so uploads are direct DMA (--nopin: through the staging buffers, "
          "as chunks arriving in pageable memory go)");
ABSL_FLAG(std::string, jsonl, "", "append one JSON row per history and mode here (for charts)");

namespace {

using riskkv::DType;
using Clock = std::chrono::steady_clock;

int Fail(const std::string& m) {
  std::fprintf(stderr, "riskkv-gpu-bench: %s\n", m.c_str());
  return 1;
}

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

riskkv::ModelConfig Qwen25_1_5B() {
  riskkv::ModelConfig c;
  c.arch = riskkv::Architecture::kQwen2;
  c.name = "random Qwen2.5-1.5B shape";
  c.n_layers = 28;
  c.hidden = 1536;
  c.n_heads = 12;
  c.n_kv_heads = 2;
  c.head_dim = 128;
  c.ffn = 8960;
  c.vocab = 151936;
  c.context_length = 32768;
  c.rms_eps = 1e-6;
  c.rope_base = 1e6;
  c.rope_dim = 128;
  c.rope_layout = riskkv::RopeLayout::kHalf;
  c.tied_embeddings = true;
  c.qkv_bias = true;
  return c;
}

riskkv::ModelConfig SmolLM2_135M() {
  riskkv::ModelConfig c;
  c.arch = riskkv::Architecture::kLlama;
  c.name = "random SmolLM2-135M shape";
  c.n_layers = 30;
  c.hidden = 576;
  c.n_heads = 9;
  c.n_kv_heads = 3;
  c.head_dim = 64;
  c.ffn = 1536;
  c.vocab = 49152;
  c.context_length = 8192;
  c.rms_eps = 1e-5;
  c.rope_base = 100000;
  c.rope_dim = 64;
  c.rope_layout = riskkv::RopeLayout::kInterleaved;
  c.tied_embeddings = true;
  return c;
}

// Candidate groups in layer order until about 30% of the layers are rebuilt, with random maps.
absl::StatusOr<std::unique_ptr<riskkv::PredictorBank>> SyntheticBank(const riskkv::ModelConfig& c) {
  auto candidates = riskkv::CandidateGroups(static_cast<int32_t>(c.n_layers), {});
  if (!candidates.ok()) return candidates.status();
  const int64_t want = (3 * c.n_layers + 5) / 10;
  std::vector<riskkv::GroupFit> fits;
  int64_t rebuilt = 0;
  std::mt19937 rng(7);
  std::normal_distribution<double> normal(0.0, 0.01);
  const int64_t w = c.kv_width();
  for (const auto& g : *candidates) {
    if (rebuilt >= want) break;
    riskkv::GroupFit fit{g, {}};
    const int64_t f = 2 * static_cast<int64_t>(g.anchors.size()) * w;
    for (int32_t layer : g.targets) {
      riskkv::LayerFit lf;
      lf.layer = layer;
      lf.n_features = f;
      lf.kv_width = w;
      lf.a_k.resize(w * f);
      lf.a_v.resize(w * f);
      for (auto& v : lf.a_k) v = normal(rng);
      for (auto& v : lf.a_v) v = normal(rng);
      lf.c_k.assign(w, 0.0);
      lf.c_v.assign(w, 0.0);
      lf.ridge_lambda = 1.0;
      fit.layers.push_back(std::move(lf));
    }
    rebuilt += static_cast<int64_t>(g.targets.size());
    fits.push_back(std::move(fit));
  }
  return riskkv::PredictorBank::FromFits("synthetic", DType::kF16, fits);
}

struct Row {
  int64_t history = 0;
  double replay = 0, full = 0, reconstruct = 0;  // recovery, seconds
  double prefill = 0;                            // the replay's prefill alone
  double upload = 0, rebuild = 0, decode = 0;    // reconstruct's parts, measured apart
  int64_t full_bytes = 0, retained_bytes = 0;
};

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "riskkv-gpu-bench (--model PATH [--policy DIR] | --random-shape qwen2.5-1.5b) "
      "[--tokens 512,4096]");
  std::vector<std::string> store;
  std::vector<char*> args = riskkv::NormalizeFlagNames(argc, argv, &store);
  absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  const int reps = absl::GetFlag(FLAGS_repetitions);
  if (reps < 1) return Fail("--repetitions must be >= 1");
  std::vector<int64_t> histories;
  for (absl::string_view t : absl::StrSplit(absl::GetFlag(FLAGS_tokens), ',')) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(t, &n) || n < 2) {
      return Fail("--tokens takes history lengths >= 2, not '" + std::string(t) + "'");
    }
    histories.push_back(n);
  }
  const std::string model_path = absl::GetFlag(FLAGS_model);
  const std::string shape = absl::GetFlag(FLAGS_random_shape);
  if (model_path.empty() == shape.empty()) return Fail("give --model or --random-shape");
  if (!shape.empty() && shape != "qwen2.5-1.5b" && shape != "smollm2-135m") {
    return Fail("--random-shape knows smollm2-135m and qwen2.5-1.5b, not '" + shape + "'");
  }
  if (!shape.empty() && !absl::GetFlag(FLAGS_policy).empty()) {
    return Fail("--policy needs --model (a random model has no calibrated policy)");
  }
  auto runtime = riskkv::LoadGpuRuntime();
  if (!runtime.ok()) return Fail(runtime.status().ToString());
  const int device = absl::GetFlag(FLAGS_device);
  if (device < 0 || device >= static_cast<int>((*runtime)->probe.devices.size())) {
    return Fail("--device " + std::to_string(device) + " does not exist");
  }
  const riskkv::GpuDevice& dev = (*runtime)->probe.devices[device];
  const double peak = riskkv::PeakF16Flops(dev);

  std::fprintf(stderr, "[gpu-bench] loading %s\n",
               shape.empty() ? model_path.c_str() : shape.c_str());
  std::unique_ptr<riskkv::Model> cpu;
  std::unique_ptr<riskkv::GpuModel> gpu;
  std::unique_ptr<riskkv::PredictorBank> bank;
  std::string predictors = "synthetic (random values, about 30% of layers)";
  if (!shape.empty()) {
    auto g = riskkv::GpuModel::CreateRandom(
        shape == "smollm2-135m" ? SmolLM2_135M() : Qwen25_1_5B(), device);
    if (!g.ok()) return Fail(g.status().ToString());
    gpu = std::move(*g);
  } else {
    auto m = riskkv::Model::Load(model_path);
    if (!m.ok()) return Fail(m.status().ToString());
    cpu = std::move(*m);
    auto g = riskkv::GpuModel::Create(*cpu, device);
    if (!g.ok()) return Fail(g.status().ToString());
    gpu = std::move(*g);
  }
  const riskkv::ModelConfig& c = gpu->config();
  if (const std::string dir = absl::GetFlag(FLAGS_policy); !dir.empty()) {
    auto fp = riskkv::ModelFingerprint(*cpu);
    if (!fp.ok()) return Fail(fp.status().ToString());
    auto b = riskkv::PredictorBank::Open(dir + "/bank.rkvbank", *fp);
    if (!b.ok()) return Fail(b.status().ToString());
    bank = std::move(*b);
    predictors = "the policy in " + dir;
  } else {
    auto b = SyntheticBank(c);
    if (!b.ok()) return Fail(b.status().ToString());
    bank = std::move(*b);
  }
  auto preds = riskkv::GpuPredictors::Create(*gpu, *bank);
  if (!preds.ok()) return Fail(preds.status().ToString());

  // Sending order: each group's anchors, then the other kept layers.
  std::vector<bool> rebuilt(c.n_layers, false), sent(c.n_layers, false);
  for (const auto& g : bank->groups()) {
    for (int32_t t : g.group.targets) rebuilt[t] = true;
  }
  std::vector<int32_t> all_layers, rest;
  for (int32_t l = 0; l < c.n_layers; ++l) {
    all_layers.push_back(l);
    if (!rebuilt[l]) rest.push_back(l);
  }
  int64_t n_rebuilt = 0;
  for (bool r : rebuilt) n_rebuilt += r ? 1 : 0;

  std::printf("riskkv-gpu-bench: %s, %lld layers (%lld rebuilt), predictors: %s\n", c.name.c_str(),
              static_cast<long long>(c.n_layers), static_cast<long long>(n_rebuilt),
              predictors.c_str());
  std::printf("device: %s, %d SMs at %d MHz, f16 tensor peak %.0f TFLOP/s; weights %.0f MiB\n",
              dev.name.c_str(), dev.multiprocessors, dev.clock_khz / 1000, peak / 1e12,
              gpu->device_bytes() / 1048576.0);

  std::vector<Row> rows;
  std::mt19937 rng(3);
  for (const int64_t h : histories) {
    std::fprintf(stderr, "[gpu-bench] %lld-token history\n", static_cast<long long>(h));
    std::vector<int32_t> tokens(h + 1);
    for (auto& t : tokens) t = static_cast<int32_t>(rng() % c.vocab);
    const std::span<const int32_t> history(tokens.data(), h);
    const int64_t capacity = h + 8;
    // The history's KV in host memory, as a migration delivers it (made by the GPU itself).
    auto host =
        riskkv::KvCache::Create(c.n_layers, c.n_kv_heads, c.head_dim, capacity, DType::kF16);
    if (!host.ok()) return Fail(host.status().ToString());
    {
      auto s = gpu->NewSession(capacity);
      if (!s.ok()) return Fail(s.status().ToString());
      if (auto l = gpu->Prefill(history, **s); !l.ok()) return Fail(l.status().ToString());
      if (auto st = (*s)->DownloadTo(**host); !st.ok()) return Fail(st.ToString());
    }
    if (absl::GetFlag(FLAGS_pin)) {
      if (auto st = gpu->PinKv(**host); !st.ok()) return Fail(st.ToString());
    }
    Row row;
    row.history = h;
    row.full_bytes = 2 * h * (*host)->token_bytes() * c.n_layers;
    row.retained_bytes = 2 * h * (*host)->token_bytes() * static_cast<int64_t>(rest.size());
    std::vector<double> replay, prefill, full, recon, upload, rebuild, decode;
    // One extra untimed round warms cuBLAS heuristics and the allocator.
    for (int r = 0; r <= reps; ++r) {
      auto s1 = gpu->NewSession(capacity), s2 = gpu->NewSession(capacity),
           s3 = gpu->NewSession(capacity), s4 = gpu->NewSession(capacity);
      if (!s1.ok() || !s2.ok() || !s3.ok() || !s4.ok()) return Fail("session allocation");
      auto check = [](const absl::Status& st) {
        if (!st.ok()) {
          std::fprintf(stderr, "riskkv-gpu-bench: %s\n", st.ToString().c_str());
          std::exit(1);
        }
      };
      // token_replay
      auto t0 = Clock::now();
      check(gpu->Prefill(history, **s1).status());
      const double p = Seconds(t0);
      check(gpu->Decode(tokens.back(), **s1).status());
      const double tr = Seconds(t0);
      // full_kv
      t0 = Clock::now();
      check((*s2)->SetTokens(h));
      check((*s2)->UploadFrom(**host, all_layers));
      check(gpu->Decode(tokens.back(), **s2).status());
      const double tf = Seconds(t0);
      // reconstruct: anchors of each group, its rebuild, then the remaining kept layers
      t0 = Clock::now();
      check((*s3)->SetTokens(h));
      std::fill(sent.begin(), sent.end(), false);
      for (const auto& g : bank->groups()) {
        std::vector<int32_t> anchors;
        for (int32_t a : g.group.anchors) {
          if (!sent[a]) anchors.push_back(a), sent[a] = true;
        }
        check((*s3)->UploadFrom(**host, anchors));
        check((*preds)->Rebuild(**s3, g, 0, h));
      }
      std::vector<int32_t> remaining;
      for (int32_t l : rest) {
        if (!sent[l]) remaining.push_back(l);
      }
      check((*s3)->UploadFrom(**host, remaining));
      check(gpu->Decode(tokens.back(), **s3).status());
      const double trc = Seconds(t0);
      // the parts apart: upload of the retained layers, rebuild with KV resident, decode
      t0 = Clock::now();
      check((*s4)->SetTokens(h));
      check((*s4)->UploadFrom(**host, rest));
      check((*s4)->Synchronize());
      const double tu = Seconds(t0);
      t0 = Clock::now();
      for (const auto& g : bank->groups()) check((*preds)->Rebuild(**s4, g, 0, h));
      check((*s4)->Synchronize());
      const double tb = Seconds(t0);
      t0 = Clock::now();
      check(gpu->Decode(tokens.back(), **s4).status());
      const double td = Seconds(t0);
      if (r == 0) continue;
      replay.push_back(tr), prefill.push_back(p), full.push_back(tf), recon.push_back(trc);
      upload.push_back(tu), rebuild.push_back(tb), decode.push_back(td);
    }
    row.replay = Median(replay), row.prefill = Median(prefill), row.full = Median(full);
    row.reconstruct = Median(recon), row.upload = Median(upload), row.rebuild = Median(rebuild);
    row.decode = Median(decode);
    rows.push_back(row);
    if (absl::GetFlag(FLAGS_pin)) {
      if (auto st = gpu->UnpinKv(**host); !st.ok()) return Fail(st.ToString());
    }
  }

  std::printf("\n%8s %13s %11s %13s | %9s %9s %9s | %14s %12s\n", "history", "token_replay",
              "full_kv", "reconstruct", "upload", "rebuild", "decode", "replay/recon",
              "full/recon");
  for (const Row& r : rows) {
    std::printf(
        "%8lld %11.3f ms %8.3f ms %10.3f ms | %6.3f ms %6.3f ms %6.3f ms | %13.1fx %11.2fx\n",
        static_cast<long long>(r.history), r.replay * 1e3, r.full * 1e3, r.reconstruct * 1e3,
        r.upload * 1e3, r.rebuild * 1e3, r.decode * 1e3, r.replay / r.reconstruct,
        r.full / r.reconstruct);
  }
  std::printf(
      "KV copied in from %s host memory: full_kv %.1f MB, reconstruct %.1f MB at %lld "
      "tokens\n",
      absl::GetFlag(FLAGS_pin) ? "page-locked" : "pageable", rows.back().full_bytes / 1e6,
      rows.back().retained_bytes / 1e6, static_cast<long long>(rows.back().history));

  // Prefill work: the projections of every token, plus QK^T and PV over the causal triangle
  // (the useful work; the engine computes and masks the whole rectangle of each micro-batch).
  const int64_t q = c.n_heads * c.head_dim, kv = c.kv_width();
  const double per_token =
      2.0 * c.n_layers * (c.hidden * (q + 2 * kv) + q * c.hidden + 3.0 * c.hidden * c.ffn);
  for (const Row& r : rows) {
    const double attn = 2.0 * 2.0 * c.n_layers * c.n_heads * c.head_dim *
                        static_cast<double>(r.history) * (r.history + 1) / 2.0;
    const double flops = per_token * r.history + attn;
    std::printf("prefill %lld tokens: %.1f TFLOP/s in GEMMs", static_cast<long long>(r.history),
                flops / r.prefill / 1e12);
    if (peak > 0) std::printf(" = %.1f%% of peak", 100.0 * flops / r.prefill / peak);
    std::printf("\n");
  }
  const double gemm = gpu->engine().TimeGemm(1024, 2 * c.ffn, c.hidden, 20);
  if (gemm > 0) {
    const double rate = 2.0 * 1024 * 2 * c.ffn * c.hidden / gemm;
    std::printf("largest projection alone ([1024 x %lld] x [%lld x %lld]): %.1f TFLOP/s",
                static_cast<long long>(c.hidden), static_cast<long long>(c.hidden),
                static_cast<long long>(2 * c.ffn), rate / 1e12);
    if (peak > 0) std::printf(" = %.1f%% of peak", 100.0 * rate / peak);
    std::printf("\n");
  }

  // The goals, stated against what this run measured.
  std::printf("\ngoals:\n");
  for (const Row& r : rows) {
    if (r.history == 512) {
      std::printf("  rebuild of a 512-token history < 1 ms: %s (%.3f ms)\n",
                  r.rebuild < 1e-3 ? "met" : "NOT met", r.rebuild * 1e3);
      std::printf("  recovery >= 5x faster than token replay at 512: %s (%.1fx)\n",
                  r.replay / r.reconstruct >= 5 ? "met" : "NOT met", r.replay / r.reconstruct);
    }
    if (r.history == 4096) {
      std::printf("  recovery >= 10x faster than token replay at 4096: %s (%.1fx)\n",
                  r.replay / r.reconstruct >= 10 ? "met" : "NOT met", r.replay / r.reconstruct);
    }
  }
  if (const std::string path = absl::GetFlag(FLAGS_jsonl); !path.empty()) {
    std::ofstream out(path, std::ios::app);
    const std::string model =
        (shape.empty() ? c.name : shape) + (absl::GetFlag(FLAGS_pin) ? "" : ", pageable KV");
    for (const Row& r : rows) {
      auto line = [&](const char* mode, double seconds, int64_t bytes, double rebuild_s) {
        out << "{\"model\": \"" << model << "\", \"history\": " << r.history << ", \"mode\": \""
            << mode << "\", \"recovery_seconds\": " << seconds << ", \"kv_bytes_sent\": " << bytes
            << ", \"rebuild_seconds\": " << rebuild_s << "}\n";
      };
      line("token_replay", r.replay, 0, 0);
      line("full_kv", r.full, r.full_bytes, 0);
      line("reconstruct", r.reconstruct, r.retained_bytes, r.rebuild);
    }
    if (!out) return Fail("cannot write " + path);
  }
  return 0;
}
