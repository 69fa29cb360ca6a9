// Comparing two next-token distributions the way llama.cpp's perplexity tool does (KL divergence
// and top-token agreement) without holding both whole: one side keeps its most likely tokens with
// their log-probabilities, the other is scored against them.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"

namespace riskkv {

// The most likely tokens a reference keeps per position (the vocabulary's size where smaller).
inline constexpr int64_t kTopTokens = 64;

// The k most likely tokens of `logits` (k <= logits.size()), most likely first, the lowest id
// first among equals and NaN below every number, into ids[0, k), with their log-probabilities
// (log-softmax over the whole row) into logp[0, k). `lse` is the row's cpu::LogSumExp where the
// caller has it.
void TopLogProbs(std::span<const float> logits, int64_t k, int32_t* ids, float* logp);
void TopLogProbs(std::span<const float> logits, int64_t k, int32_t* ids, float* logp, double lse);

// KL(reference || logits) in nats, over the reference's tokens each on its own and the rest of
// the vocabulary as one outcome: a lower bound on the full KL (coarser outcomes never raise it),
// equal to it when the reference holds the whole vocabulary. A rest whose mass is within the
// rounding of the reference's float log-probabilities (1e-7 per token) counts as none. At
// least 0; NaN when the logits hold NaN. `lse` as above.
double TopKl(std::span<const int32_t> ids, std::span<const float> logp,
             std::span<const float> logits);
double TopKl(std::span<const int32_t> ids, std::span<const float> logp,
             std::span<const float> logits, double lse);

// Whether `logits`' most likely token (the lowest id among equals) is the reference's.
bool TopAgrees(std::span<const int32_t> ids, std::span<const float> logits);

// A reference from outside (a client's copy of TopLogProbs): 1..kTopTokens tokens, as many
// log-probabilities, distinct ids within [0, vocab), log-probabilities finite, <= 0 and most
// likely first (non-increasing), with a total probability within 1 (rounding of 1e-3 allowed).
// InvalidArgument naming what is wrong.
absl::Status CheckTopLogProbs(std::span<const int32_t> ids, std::span<const float> logp,
                              int64_t vocab);

}  // namespace riskkv
