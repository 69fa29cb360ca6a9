// A predictor bank and retention policy for the 8-layer tiny test model: both default groups
// (L1-2 <- L0,L3 and L4-5 <- L3,L6) fitted on a few synthetic requests and rebuilt.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "common/model.h"
#include "common/recovery/calibration.h"
#include "common/recovery/predictor_bank.h"
#include "riskkv/v1/retention_policy.pb.h"

namespace riskkv::testing {

struct TinyPolicy {
  std::unique_ptr<PredictorBank> bank;
  v1::RetentionPolicy policy;
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
  return out;
}

}  // namespace riskkv::testing
