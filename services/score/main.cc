// riskkv-score: teacher-forced scoring of a token sequence (from token ids or text) in one
// batched pass; writes per-position NLL and argmax as JSON. Used by the llama.cpp peer check.
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/base/atomic_file.h"
#include "common/model/model.h"
#include "common/model/sampler.h"
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

  auto kv = riskkv::FloatDTypeFromFlag("kv-dtype", absl::GetFlag(FLAGS_kv_dtype));
  if (!kv.ok()) return Fail(kv.status().ToString());
  auto cache = (*model)->NewKvCache(static_cast<int64_t>(tokens.size()), *kv);
  if (!cache.ok()) return Fail(cache.status().ToString());
  const int64_t vocab = (*model)->config().vocab;
  nlohmann::json nll = nlohmann::json::array(), argmax = nlohmann::json::array();
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
      nll.push_back(riskkv::TokenNll(row, tokens[start + i + 1]));
      argmax.push_back(riskkv::Argmax(row));
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  nlohmann::json out = {
      {"tokens", tokens}, {"nll", nll}, {"argmax", argmax}, {"prefill_seconds", seconds}};
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
