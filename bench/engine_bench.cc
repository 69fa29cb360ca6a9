// riskkv-bench: prefill of an N-token history (the token replay a migration competes with) and
// greedy decode speed on one model, medians over repetitions, plus peak resident memory.
// Prints one JSON object on stdout and a readable summary on stderr.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/model/model.h"
#include "common/model/sampler.h"
#include "services/cli_args.h"

ABSL_FLAG(std::string, model, "", "GGUF file or Hugging Face model directory");
ABSL_FLAG(std::string, tokens_file, "",
          "JSON list of token ids for the history (else --text_file)");
ABSL_FLAG(std::string, text_file, "/usr/share/common-licenses/GPL-3",
          "text whose tokens form the history");
ABSL_FLAG(int, prompt_tokens, 512, "history length to prefill");
ABSL_FLAG(int, decode_tokens, 128, "greedy decode steps after the prefill");
ABSL_FLAG(int, threads, 0, "CPU threads (0: all)");
ABSL_FLAG(
    std::string, activations, "int8",
    "how activations meet quantized weights: int8 (llama.cpp's arithmetic, fast) or f32 (exact)");
ABSL_FLAG(int, repetitions, 3, "runs; medians are reported");
ABSL_FLAG(std::string, sessions, "",
          "comma-separated session counts: also time decode steps that advance that many "
          "sessions at once (Model::ForwardMany), each after its own --prompt-tokens history");
ABSL_FLAG(std::string, kv_dtype, "f32", "KV cache storage: f32 or f16");
ABSL_FLAG(bool, json, true, "print the JSON result on stdout");
ABSL_FLAG(bool, cpu_panels, true,
          "Q4_1 and Q8_0 weights also regrouped for the AVX-512 VNNI kernel (int8; the same bits)");

namespace {

using Clock = std::chrono::steady_clock;

int Fail(const std::string& message) {
  std::fprintf(stderr, "riskkv-bench: %s\n", message.c_str());
  return 1;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "riskkv-bench --model PATH [--prompt-tokens 512] [--decode-tokens 128]");
  std::vector<std::string> arg_store;
  std::vector<char*> args = riskkv::NormalizeFlagNames(argc, argv, &arg_store);
  absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  const int n_prompt = absl::GetFlag(FLAGS_prompt_tokens);
  const int n_decode = absl::GetFlag(FLAGS_decode_tokens);
  const int reps = absl::GetFlag(FLAGS_repetitions);
  if (n_prompt < 1 || n_decode < 0 || reps < 1)
    return Fail("--prompt-tokens >= 1, --decode-tokens >= 0, --repetitions >= 1");
  const auto dtype_flag = riskkv::FloatDTypeFromFlag("kv-dtype", absl::GetFlag(FLAGS_kv_dtype));
  if (!dtype_flag.ok()) return Fail(dtype_flag.status().ToString());
  const riskkv::DType dtype = *dtype_flag;

  auto options =
      riskkv::ModelOptionsFromFlags(absl::GetFlag(FLAGS_threads), absl::GetFlag(FLAGS_activations));
  if (!options.ok()) return Fail(options.status().ToString());
  options->cpu_panels = absl::GetFlag(FLAGS_cpu_panels);
  auto model = riskkv::Model::Load(absl::GetFlag(FLAGS_model), *options);
  if (!model.ok()) return Fail(model.status().ToString());

  auto loaded = riskkv::LoadTokens((*model)->tokenizer(), absl::GetFlag(FLAGS_tokens_file),
                                   absl::GetFlag(FLAGS_text_file));
  if (!loaded.ok()) return Fail(loaded.status().ToString());
  std::vector<int32_t> tokens = std::move(*loaded);
  if (static_cast<int>(tokens.size()) < n_prompt)
    return Fail("history file has fewer tokens than --prompt-tokens");
  tokens.resize(n_prompt);

  std::vector<double> prefill_s, decode_s;
  // One untimed warm-up (page-in of the mapped weights, thread start-up, allocator growth), as
  // llama-bench and bench/compare_llamacpp.py do for llama.cpp.
  {
    auto cache = (*model)->NewKvCache(n_prompt + 2, dtype);
    if (!cache.ok()) return Fail(cache.status().ToString());
    auto logits = (*model)->Prefill(tokens, **cache);
    if (!logits.ok()) return Fail(logits.status().ToString());
    if (!(*model)->Decode(riskkv::Argmax(*logits), **cache).ok())
      return Fail("warm-up decode failed");
  }
  for (int r = 0; r < reps; ++r) {
    auto cache = (*model)->NewKvCache(n_prompt + n_decode + 1, dtype);
    if (!cache.ok()) return Fail(cache.status().ToString());
    const auto t0 = Clock::now();
    auto logits = (*model)->Prefill(tokens, **cache);
    if (!logits.ok()) return Fail(logits.status().ToString());
    const auto t1 = Clock::now();
    for (int i = 0; i < n_decode; ++i) {
      logits = (*model)->Decode(riskkv::Argmax(*logits), **cache);
      if (!logits.ok()) return Fail(logits.status().ToString());
    }
    const auto t2 = Clock::now();
    prefill_s.push_back(std::chrono::duration<double>(t1 - t0).count());
    decode_s.push_back(std::chrono::duration<double>(t2 - t1).count());
    std::fprintf(stderr, "repetition %d/%d: prefill %.3f s, decode %.3f s\n", r + 1, reps,
                 prefill_s.back(), decode_s.back());
  }
  // Batched decode: N sessions, each with a history of its own (the text rotated by 7 tokens a
  // session), advanced together one token a step.
  nlohmann::json batched = nlohmann::json::array();
  for (const absl::string_view part :
       absl::StrSplit(absl::GetFlag(FLAGS_sessions), ',', absl::SkipEmpty())) {
    int n_sessions = 0;
    if (!absl::SimpleAtoi(part, &n_sessions) || n_sessions < 1 || n_sessions > 256)
      return Fail("--sessions takes counts from 1 to 256");
    std::vector<double> step_s;
    for (int r = 0; r < reps; ++r) {
      std::vector<std::unique_ptr<riskkv::KvCache>> caches;
      std::vector<std::vector<float>> logits(n_sessions);
      std::vector<int32_t> next(n_sessions);
      for (int s = 0; s < n_sessions; ++s) {
        std::vector<int32_t> history = tokens;
        std::rotate(history.begin(), history.begin() + (7 * s) % n_prompt, history.end());
        auto cache = (*model)->NewKvCache(n_prompt + n_decode + 1, dtype);
        if (!cache.ok()) return Fail(cache.status().ToString());
        auto l = (*model)->Prefill(history, **cache);
        if (!l.ok()) return Fail(l.status().ToString());
        next[s] = riskkv::Argmax(*l);
        caches.push_back(std::move(*cache));
      }
      const auto t0 = Clock::now();
      for (int i = 0; i < n_decode; ++i) {
        std::vector<riskkv::ForwardSegment> segments(n_sessions);
        for (int s = 0; s < n_sessions; ++s) {
          segments[s] = {std::span<const int32_t>(&next[s], 1), caches[s].get(), false, &logits[s]};
        }
        for (const absl::Status& st : (*model)->ForwardMany(segments)) {
          if (!st.ok()) return Fail(st.ToString());
        }
        for (int s = 0; s < n_sessions; ++s) next[s] = riskkv::Argmax(logits[s]);
      }
      step_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count() /
                       std::max(1, n_decode));
    }
    const double step = Median(step_s);
    std::fprintf(stderr, "%d sessions: step %.2f ms, %.1f tokens/s all sessions\n", n_sessions,
                 step * 1e3, n_sessions / step);
    batched.push_back({{"sessions", n_sessions},
                       {"step_seconds", step},
                       {"tokens_per_second", n_sessions / step}});
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const double p = Median(prefill_s), d = Median(decode_s);
  nlohmann::json out = {
      {"model", (*model)->config().name},
      {"threads", (*model)->backend().threads()},
      {"prompt_tokens", n_prompt},
      {"decode_tokens", n_decode},
      {"prefill_seconds", p},
      {"prefill_tokens_per_second", n_prompt / p},
      {"decode_seconds", d},
      {"decode_tokens_per_second", n_decode > 0 ? n_decode / d : 0.0},
      {"peak_rss_bytes", static_cast<int64_t>(usage.ru_maxrss) * 1024},
      {"all_prefill_seconds", prefill_s},
      {"all_decode_seconds", decode_s},
      {"activations", absl::GetFlag(FLAGS_activations)},
      {"cpu_panels", absl::GetFlag(FLAGS_cpu_panels)},
  };
  if (!batched.empty()) out["batched_decode"] = batched;
  std::fprintf(
      stderr,
      "prefill %d tokens: %.3f s (%.1f tokens/s); decode: %.1f tokens/s; peak RSS %.1f MiB\n",
      n_prompt, p, n_prompt / p, n_decode > 0 ? n_decode / d : 0.0, usage.ru_maxrss / 1024.0);
  if (absl::GetFlag(FLAGS_json)) std::printf("%s\n", out.dump().c_str());
  return 0;
}
