// A predictor bank and retention policy for the 8-layer tiny test model: both default groups
// (L1-2 <- L0,L3 and L4-5 <- L3,L6) fitted on a few synthetic requests and rebuilt.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "common/model/model.h"
#include "common/recovery/calibration.h"
#include "common/recovery/predictor_bank.h"
#include "common/recovery/quality_gate.h"
#include "common/recovery/retention_policy.h"

namespace riskkv::testing {

struct TinyPolicy {
  std::unique_ptr<PredictorBank> bank;
  RetentionPolicy policy;  // validated for the tiny model, as a reader would have
  // Held-out requests and the NLL change rebuilding costs each (rebuilt - exact), measured
  // offline as riskkv-calibrate does; the policy's test_delta_nll summarises them.
  std::vector<Request> test_requests;
  std::vector<double> test_deltas;
};

// With `transforms`, the bank carries them too (PredictorBank format version 2).
inline TinyPolicy MakeTinyPolicy(Model& model, const std::string& fingerprint, uint64_t version = 3,
                                 DType bank_dtype = DType::kF32,
                                 const BankTransforms* transforms = nullptr) {
  TinyPolicy out;
  std::vector<int32_t> text(6 * 64);
  for (size_t i = 0; i < text.size(); ++i) text[i] = static_cast<int32_t>((i * 53 + 7) % 500);
  const auto requests = MakeRequests(text, 48, 16, 0);
  auto groups = CandidateGroups(static_cast<int32_t>(model.config().n_layers), {});
  EXPECT_TRUE(groups.ok());
  auto fits = FitGroups(model, std::span<const Request>(requests).first(4),
                        std::span<const Request>(requests).subspan(4), *groups);
  EXPECT_TRUE(fits.ok()) << fits.status();
  auto bank = PredictorBank::FromFits(fingerprint, bank_dtype, *fits, transforms);
  EXPECT_TRUE(bank.ok()) << bank.status();
  out.bank = std::move(*bank);
  RetentionPolicy& p = out.policy;
  p.model_fingerprint = fingerprint;
  p.policy_id = "tiny";
  p.version = version;
  p.gate = "upper90";
  p.rebuilt_groups = *groups;
  std::vector<bool> rebuilt(model.config().n_layers, false);
  for (const auto& g : *groups) {
    for (int32_t l : g.targets) rebuilt[l] = true;
  }
  for (int32_t l = 0; l < model.config().n_layers; ++l) {
    if (!rebuilt[l]) p.kept_layers.push_back(l);
  }
  p.predictor_bank_sha256 = out.bank->content_hash();
  p.history_tokens = 48;
  p.eval_tokens = 16;
  std::vector<int32_t> held_out(4 * 64);
  for (size_t i = 0; i < held_out.size(); ++i) {
    held_out[i] = static_cast<int32_t>((i * 71 + 13) % 500);
  }
  out.test_requests = MakeRequests(held_out, 48, 16, 0);
  const std::vector<std::vector<int>> configs = {{}, {0, 1}};
  auto nll = MeasureNll(model, out.test_requests, out.bank->groups(), configs);
  EXPECT_TRUE(nll.ok()) << nll.status();
  for (size_t r = 0; r < out.test_requests.size(); ++r) {
    out.test_deltas.push_back((*nll)[1][r] - (*nll)[0][r]);
  }
  auto ci = BootstrapMeanInterval(out.test_deltas, 0.95);
  EXPECT_TRUE(ci.ok()) << ci.status();
  p.test_delta_nll = {ci->mean, ci->lo, ci->hi, static_cast<int32_t>(out.test_deltas.size())};
  EXPECT_TRUE(p.Validate(static_cast<int32_t>(model.config().n_layers)).ok());
  return out;
}

// `policy` as its gate falling back to exact KV would leave it: every layer kept, no bank.
inline RetentionPolicy KeepingEveryLayer(RetentionPolicy policy, int32_t n_layers) {
  policy.rebuilt_groups.clear();
  policy.kept_layers.clear();
  for (int32_t l = 0; l < n_layers; ++l) policy.kept_layers.push_back(l);
  policy.predictor_bank_sha256.clear();
  return policy;
}

}  // namespace riskkv::testing
