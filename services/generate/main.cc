// riskkv-generate: loads a model, prefills a prompt and decodes a continuation, printing the
// text as it is produced and the prefill and decode speed.
#include <chrono>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/model/model.h"
#include "common/model/sampler.h"
#include "common/tokenizer/chat_format.h"
#include "kernels/accelerator.h"
#include "services/cli_args.h"
#include "services/cli_help.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, model, "", "GGUF file or Hugging Face model directory");
ABSL_FLAG(std::string, prompt, "", "prompt text");
ABSL_FLAG(int, n, 64, "maximum number of tokens to generate");
ABSL_FLAG(bool, chat, false,
          "wrap the prompt in the model's chat turns: ChatML (SmolLM2, Qwen2.5) or Llama 3's "
          "headers, whichever control tokens the tokenizer has");
ABSL_FLAG(float, temperature, 0.0f, "sampling temperature; 0 decodes greedily");
ABSL_FLAG(int, top_k, 0, "sample from the k most likely tokens (0: all)");
ABSL_FLAG(float, top_p, 1.0f, "nucleus sampling mass in (0, 1]");
ABSL_FLAG(uint64_t, seed, 0, "sampling RNG seed");
ABSL_FLAG(int, threads, 0, "CPU threads (0: all)");
ABSL_FLAG(
    std::string, activations, "int8",
    "how activations meet quantized weights: int8 (llama.cpp's arithmetic, fast) or f32 (exact)");
ABSL_FLAG(std::string, kv_dtype, "f32", "KV cache storage: f32 or f16");

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Length of the longest prefix of s that does not end inside a UTF-8 sequence.
size_t CompleteUtf8Prefix(const std::string& s) {
  size_t i = s.size();
  for (size_t back = 0; back < 4 && i > 0; ++back) {
    const unsigned char c = s[i - 1];
    if ((c & 0xC0) != 0x80) {  // lead byte or ASCII
      const size_t need = c < 0x80         ? 1
                          : (c >> 5) == 6  ? 2
                          : (c >> 4) == 14 ? 3
                          : (c >> 3) == 30 ? 4
                                           : 1;
      return back + 1 >= need ? s.size() : i - 1;
    }
    --i;
  }
  return s.size();
}

int Fail(const absl::Status& status) {
  spdlog::error("{}", status.ToString());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("riskkv-generate --model PATH --prompt TEXT -n N");
  std::vector<std::string> arg_store;
  riskkv::ExitOnHelp(argc, argv);
  std::vector<char*> args = riskkv::NormalizeFlagNames(argc, argv, &arg_store);
  absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  if (absl::GetFlag(FLAGS_model).empty()) {
    spdlog::error("--model is required");
    return 2;
  }
  riskkv::SamplingParams params;
  params.temperature = absl::GetFlag(FLAGS_temperature);
  params.top_k = absl::GetFlag(FLAGS_top_k);
  params.top_p = absl::GetFlag(FLAGS_top_p);
  params.seed = absl::GetFlag(FLAGS_seed);
  auto sampler = riskkv::Sampler::Create(params);
  if (!sampler.ok()) return Fail(sampler.status());
  auto kv = riskkv::FloatDTypeFromFlag("kv-dtype", absl::GetFlag(FLAGS_kv_dtype));
  if (!kv.ok()) return Fail(kv.status());
  if (absl::GetFlag(FLAGS_n) < 0) return Fail(absl::InvalidArgumentError("-n must be >= 0"));

  const auto t_load = Clock::now();
  auto options =
      riskkv::ModelOptionsFromFlags(absl::GetFlag(FLAGS_threads), absl::GetFlag(FLAGS_activations));
  if (!options.ok()) return Fail(options.status());
  auto model = riskkv::Model::Load(absl::GetFlag(FLAGS_model), *options);
  if (!model.ok()) return Fail(model.status());
  const riskkv::ModelConfig& cfg = (*model)->config();
  if (const riskkv::AcceleratorProbe gpu = riskkv::ProbeCuda(); !gpu.devices.empty()) {
    spdlog::info("GPU present ({}); this engine runs on the CPU backend", gpu.devices[0].name);
  } else {
    spdlog::info("no GPU: {}", gpu.reason);
  }
  spdlog::info(
      "loaded {} ({}, {} layers, hidden {}, {} heads / {} KV heads, vocab {}, {:.1f} MB of "
      "weights) in {:.2f} s, {} backend with {} threads",
      cfg.name, riskkv::ArchitectureName(cfg.arch), cfg.n_layers, cfg.hidden, cfg.n_heads,
      cfg.n_kv_heads, cfg.vocab, (*model)->weight_bytes() / 1e6, Seconds(t_load, Clock::now()),
      (*model)->backend().name(), (*model)->backend().threads());

  std::string prompt = absl::GetFlag(FLAGS_prompt);
  const riskkv::Tokenizer& tok = (*model)->tokenizer();
  if (absl::GetFlag(FLAGS_chat)) {
    absl::StatusOr<riskkv::ChatFormat> format = riskkv::DetectChatFormat(tok);
    if (!format.ok()) return Fail(format.status());
    prompt = riskkv::ChatPrompt(*format, prompt);
  }
  auto ids = tok.Encode(prompt, /*add_special=*/true, /*parse_special=*/absl::GetFlag(FLAGS_chat));
  if (!ids.ok()) return Fail(ids.status());
  if (ids->empty()) return Fail(absl::InvalidArgumentError("the prompt encodes to no tokens"));
  int n_new = absl::GetFlag(FLAGS_n);
  const int64_t room = cfg.context_length - static_cast<int64_t>(ids->size());
  if (room <= 0) {
    return Fail(absl::OutOfRangeError("the prompt's " + std::to_string(ids->size()) +
                                      " tokens fill the model's context of " +
                                      std::to_string(cfg.context_length)));
  }
  if (n_new > room) {
    spdlog::info("generating {} tokens instead of {}: the context holds {}", room, n_new,
                 cfg.context_length);
    n_new = static_cast<int>(room);
  }
  auto cache = (*model)->NewKvCache(static_cast<int64_t>(ids->size()) + n_new, *kv);
  if (!cache.ok()) return Fail(cache.status());

  const auto t0 = Clock::now();
  auto logits = (*model)->Prefill(*ids, **cache);
  if (!logits.ok()) return Fail(logits.status());
  const auto t1 = Clock::now();

  std::fputs(absl::GetFlag(FLAGS_prompt).c_str(), stdout);
  std::fflush(stdout);
  std::string pending;
  int generated = 0;
  int decode_steps = 0;  // forward passes after the prefill
  for (; generated < n_new; ++generated) {
    const int32_t next = sampler->Sample(*logits);
    if (tok.IsEndOfGeneration(next)) break;
    pending += tok.TokenBytes(next);
    const size_t ready = CompleteUtf8Prefix(pending);
    std::fwrite(pending.data(), 1, ready, stdout);
    std::fflush(stdout);
    pending.erase(0, ready);
    if (generated + 1 == n_new) {
      ++generated;
      break;
    }
    logits = (*model)->Decode(next, **cache);
    if (!logits.ok()) return Fail(logits.status());
    ++decode_steps;
  }
  std::fwrite(pending.data(), 1, pending.size(), stdout);
  std::fputs("\n", stdout);
  const auto t2 = Clock::now();
  const double prefill_s = Seconds(t0, t1), decode_s = Seconds(t1, t2);
  std::fprintf(stderr, "prefill: %zu tokens in %.3f s (%.1f tokens/s)\n", ids->size(), prefill_s,
               ids->size() / prefill_s);
  std::fprintf(stderr, "decode:  %d tokens, %d forward passes in %.3f s (%.1f tokens/s)\n",
               generated, decode_steps, decode_s, decode_steps > 0 ? decode_steps / decode_s : 0.0);
  return 0;
}
