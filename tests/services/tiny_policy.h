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
#include "riskkv/v1/retention_policy.pb.h"

namespace riskkv::testing {

struct TinyPolicy {
  std::unique_ptr<PredictorBank> bank;
  v1::RetentionPolicy policy;
  // Held-out requests and the NLL change rebuilding costs each (rebuilt - exact), measured
  // offline as riskkv-calibrate does; the policy's test_delta_nll summarises them.
  std::vector<Request> test_requests;
  std::vector<double> test_deltas;
};

inline TinyPolicy MakeTinyPolicy(Model& model, const std::string& fingerprint, uint64_t version = 3,
                                 DType bank_dtype = DType::kF32) {
  TinyPolicy out;
  std::vector<int32_t> text(6 * 64);
  for (size_t i = 0; i < text.size(); ++i) text[i] = static_cast<int32_t>((i * 53 + 7) % 500);
  const auto requests = MakeRequests(text, 48, 16, 0);
  auto groups = CandidateGroups(static_cast<int32_t>(model.config().n_layers), {});
  EXPECT_TRUE(groups.ok());
  auto fits = FitGroups(model, std::span<const Request>(requests).first(4),
                        std::span<const Request>(requests).subspan(4), *groups);
  EXPECT_TRUE(fits.ok()) << fits.status();
  auto bank = PredictorBank::FromFits(fingerprint, bank_dtype, *fits);
  EXPECT_TRUE(bank.ok()) << bank.status();
  out.bank = std::move(*bank);
  v1::RetentionPolicy& p = out.policy;
  p.set_format_version(1);
  p.set_model_fingerprint(fingerprint);
  p.set_policy_id("tiny");
  p.set_version(version);
  p.set_gate("upper90");
  std::vector<bool> rebuilt(model.config().n_layers, false);
  for (const auto& g : *groups) {
    auto* pg = p.add_rebuilt_groups();
    for (int32_t l : g.targets) pg->add_targets(l), rebuilt[l] = true;
    for (int32_t l : g.anchors) pg->add_anchors(l);
  }
  for (int32_t l = 0; l < model.config().n_layers; ++l) {
    if (!rebuilt[l]) p.add_kept_layers(l);
  }
  p.set_predictor_bank_sha256(out.bank->content_hash());
  p.set_history_tokens(48);
  p.set_eval_tokens(16);
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
  p.mutable_test_delta_nll()->set_mean(ci->mean);
  p.mutable_test_delta_nll()->set_ci_low(ci->lo);
  p.mutable_test_delta_nll()->set_ci_high(ci->hi);
  p.mutable_test_delta_nll()->set_requests(static_cast<int32_t>(out.test_deltas.size()));
  return out;
}

// `policy` as its gate falling back to exact KV would leave it: every layer kept, no bank.
inline v1::RetentionPolicy KeepingEveryLayer(v1::RetentionPolicy policy, int32_t n_layers) {
  policy.clear_rebuilt_groups();
  policy.clear_kept_layers();
  for (int32_t l = 0; l < n_layers; ++l) policy.add_kept_layers(l);
  policy.clear_predictor_bank_sha256();
  return policy;
}

}  // namespace riskkv::testing
