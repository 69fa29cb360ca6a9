// riskkv-score: teacher-forced scoring of a token sequence (from token ids or text) in one
// batched pass; writes per-position NLL and argmax as JSON. Used by the llama.cpp peer check.
// With --top it also writes each position's 64 most likely tokens; a later run given that output
// as --reference (another model file, arithmetic or KV dtype, the same tokens) reports its KL
// divergence from the reference's distributions, top-1 agreement and NLL change, as llama.cpp's
// perplexity tool does with --kl-divergence.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/base/atomic_file.h"
#include "common/model/model.h"
#include "common/model/sampler.h"
#include "common/model/top_logprobs.h"
#include "services/cli_args.h"
#include "services/cli_help.h"

ABSL_FLAG(std::string, model, "", "GGUF file or Hugging Face model directory");
ABSL_FLAG(std::string, tokens_file, "", "JSON list of token ids to score");
ABSL_FLAG(std::string, text_file, "", "UTF-8 text to tokenize (no BOS) and score");
ABSL_FLAG(int, max_tokens, 0, "score at most this many tokens (0: all)");
ABSL_FLAG(int, threads, 0, "CPU threads (0: all)");
ABSL_FLAG(
    std::string, activations, "int8",
    "how activations meet quantized weights: int8 (llama.cpp's arithmetic, fast) or f32 (exact)");
ABSL_FLAG(std::string, kv_dtype, "f32", "KV cache storage: f32 or f16");
ABSL_FLAG(std::string, out, "", "output JSON path (stdout when empty)");
ABSL_FLAG(bool, top, false,
          "also write each position's 64 most likely tokens and their log-probabilities (`top`), "
          "for a later run's --reference");
ABSL_FLAG(std::string, reference, "",
          "a --top output of the same tokens: add the KL divergence from its distributions (over "
          "its 64 most likely tokens and the rest as one), top-1 agreement and the NLL change");

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "riskkv-score: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "riskkv-score --model PATH (--tokens-file F.json | --text-file F.txt) [--out OUT.json]");
  std::vector<std::string> arg_store;
  riskkv::ExitOnHelp(argc, argv);
  std::vector<char*> args = riskkv::NormalizeFlagNames(argc, argv, &arg_store);
  absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  auto options =
      riskkv::ModelOptionsFromFlags(absl::GetFlag(FLAGS_threads), absl::GetFlag(FLAGS_activations));
  if (!options.ok()) return Fail(options.status().ToString());
  auto model = riskkv::Model::Load(absl::GetFlag(FLAGS_model), *options);
  if (!model.ok()) return Fail(model.status().ToString());

  auto loaded = riskkv::LoadTokens((*model)->tokenizer(), absl::GetFlag(FLAGS_tokens_file),
                                   absl::GetFlag(FLAGS_text_file));
  if (!loaded.ok()) return Fail(loaded.status().ToString());
  std::vector<int32_t> tokens = std::move(*loaded);
  if (absl::GetFlag(FLAGS_max_tokens) > 0 &&
      static_cast<int>(tokens.size()) > absl::GetFlag(FLAGS_max_tokens)) {
    tokens.resize(absl::GetFlag(FLAGS_max_tokens));
  }
  if (tokens.size() < 2) return Fail("need at least 2 tokens to score");

  // The reference, checked whole before any work: the same tokens, one distribution per scored
  // position, each a valid top-token list.
  const int64_t vocab = (*model)->config().vocab;
  std::vector<std::vector<int32_t>> ref_ids;
  std::vector<std::vector<float>> ref_logp;
  double ref_mean_nll = 0.0;
  if (const std::string path = absl::GetFlag(FLAGS_reference); !path.empty()) {
    std::ifstream in(path);
    if (!in) return Fail("--reference: cannot open " + path);
    const nlohmann::json ref = nlohmann::json::parse(in, nullptr, false);
    if (ref.is_discarded() || !ref.is_object() || !ref.contains("top") || !ref["top"].is_array() ||
        !ref.contains("tokens") || !ref.contains("nll")) {
      return Fail("--reference: " + path + " is not a riskkv-score --top output");
    }
    try {
      if (ref["tokens"].get<std::vector<int32_t>>() != tokens) {
        return Fail("--reference: " + path + " scored other tokens");
      }
      const auto nlls = ref["nll"].get<std::vector<double>>();
      if (ref["top"].size() + 1 != tokens.size() || nlls.size() + 1 != tokens.size()) {
        return Fail("--reference: " + path + " does not hold one distribution per position");
      }
      for (double v : nlls) ref_mean_nll += v / static_cast<double>(nlls.size());
      for (size_t i = 0; i < ref["top"].size(); ++i) {
        ref_ids.push_back(ref["top"][i].at("token_ids").get<std::vector<int32_t>>());
        ref_logp.push_back(ref["top"][i].at("logprobs").get<std::vector<float>>());
        if (auto ok = riskkv::CheckTopLogProbs(ref_ids.back(), ref_logp.back(), vocab); !ok.ok()) {
          return Fail("--reference: position " + std::to_string(i) + ": " +
                      std::string(ok.message()));
        }
      }
    } catch (const nlohmann::json::exception& e) {
      return Fail("--reference: " + path + ": " + e.what());
    }
  }

  auto kv = riskkv::FloatDTypeFromFlag("kv-dtype", absl::GetFlag(FLAGS_kv_dtype));
  if (!kv.ok()) return Fail(kv.status().ToString());
  auto cache = (*model)->NewKvCache(static_cast<int64_t>(tokens.size()), *kv);
  if (!cache.ok()) return Fail(cache.status().ToString());
  nlohmann::json nll = nlohmann::json::array(), argmax = nlohmann::json::array();
  nlohmann::json top = nlohmann::json::array(), kl = nlohmann::json::array();
  const int64_t k = std::min(riskkv::kTopTokens, vocab);
  std::vector<int32_t> ids(static_cast<size_t>(k));
  std::vector<float> logp(static_cast<size_t>(k));
  double kl_sum = 0.0, nll_sum = 0.0, agree = 0.0;
  // Score in windows so the logits buffer stays bounded for long texts.
  constexpr size_t kWindow = 256;
  const auto t0 = std::chrono::steady_clock::now();
  riskkv::ForwardOptions fwd;
  fwd.all_logits = true;
  std::vector<float> logits;
  for (size_t start = 0; start < tokens.size(); start += kWindow) {
    const size_t m = std::min(kWindow, tokens.size() - start);
    auto s = (*model)->Forward(std::span<const int32_t>(tokens).subspan(start, m), **cache, fwd,
                               &logits);
    if (!s.ok()) return Fail(s.ToString());
    for (size_t i = 0; i < m && start + i + 1 < tokens.size(); ++i) {
      std::span<const float> row(logits.data() + i * vocab, vocab);
      const double v = riskkv::TokenNll(row, tokens[start + i + 1]);
      nll.push_back(v);
      nll_sum += v;
      argmax.push_back(riskkv::Argmax(row));
      if (absl::GetFlag(FLAGS_top)) {
        riskkv::TopLogProbs(row, k, ids.data(), logp.data());
        top.push_back({{"token_ids", ids}, {"logprobs", logp}});
      }
      if (!ref_ids.empty()) {
        const size_t at = start + i;
        const double d = riskkv::TopKl(ref_ids[at], ref_logp[at], row);
        kl.push_back(d);
        kl_sum += d;
        agree += riskkv::TopAgrees(ref_ids[at], row) ? 1.0 : 0.0;
      }
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  nlohmann::json out = {
      {"tokens", tokens}, {"nll", nll}, {"argmax", argmax}, {"prefill_seconds", seconds}};
  if (absl::GetFlag(FLAGS_top)) out["top"] = top;
  if (!ref_ids.empty()) {
    const auto n = static_cast<double>(ref_ids.size());
    out["kl"] = kl;
    out["mean_kl"] = kl_sum / n;
    out["top1_agreement"] = agree / n;
    out["delta_nll"] = nll_sum / n - ref_mean_nll;
  }
  if (absl::GetFlag(FLAGS_out).empty()) {
    std::printf("%s\n", out.dump().c_str());
  } else {
    if (auto st = riskkv::WriteFileAtomically(absl::GetFlag(FLAGS_out), out.dump() + "\n");
        !st.ok()) {
      return Fail("--out: " + st.ToString());
    }
  }
  return 0;
}
