// Test helpers for MeasureNllWith: configurations that perturb chosen layers' moved rows, and
// the check that scoring requests concurrently gives the numbers of one request at a time.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/recovery/calibration.h"

namespace riskkv::testing {

// Configurations that change chosen layers' moved rows by a fixed perturbation.
inline absl::Status Perturb(const std::vector<int64_t>& layers, int64_t rows, KvCache& cache) {
  std::vector<float> k(rows * cache.width()), v(k.size());
  for (int64_t l : layers) {
    RETURN_IF_ERROR(cache.ReadKeys(l, 0, rows, k.data()));
    RETURN_IF_ERROR(cache.ReadValues(l, 0, rows, v.data()));
    for (size_t i = 0; i < k.size(); ++i) {
      k[i] += 0.3f * std::sin(0.7f * i + l);
      v[i] *= 1.0f + 0.2f * std::cos(0.3f * i);
    }
    RETURN_IF_ERROR(cache.WriteKeys(l, 0, rows, k.data()));
    RETURN_IF_ERROR(cache.WriteValues(l, 0, rows, v.data()));
  }
  return absl::OkStatus();
}

// On the CPU backend, MeasureNllWith scores as many requests at once as the model has threads,
// each on its own backend: the numbers are those of one request at a time, in both arithmetics;
// progress still counts every configuration once, in order; and configurations that fail stop
// the measurement with the error a sequential run returns (the lowest request's).
inline void ExpectConcurrentRequestsMatch(const std::string& path, ActivationPrecision activations,
                                          int threads, int64_t history, int64_t eval,
                                          int n_requests,
                                          const std::vector<std::vector<int64_t>>& configs) {
  auto one = Model::Load(path, {.threads = 1, .activations = activations});
  auto many = Model::Load(path, {.threads = threads, .activations = activations});
  ASSERT_TRUE(one.ok() && many.ok());
  std::vector<int32_t> tokens(n_requests * (history + eval));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 37 + 11) % 500);
  const auto requests = MakeRequests(tokens, history, eval, 0);
  ASSERT_EQ(requests.size(), static_cast<size_t>(n_requests));
  auto apply = [&](size_t k, size_t r, const KvCache&, KvCache& work, Backend&) {
    return Perturb(configs[k], requests[r].moved_rows(), work);
  };
  auto sequential = MeasureNllWith(**one, requests, configs.size(), apply);
  ASSERT_TRUE(sequential.ok()) << sequential.status();
  int64_t last = 0;
  std::atomic<int> on_workers{0};
  auto concurrent = MeasureNllWith(
      **many, requests, configs.size(),
      [&](size_t k, size_t r, const KvCache& exact, KvCache& work, Backend& b) {
        if (&b != &(*many)->backend() && b.threads() == 1) ++on_workers;
        return apply(k, r, exact, work, b);
      },
      [&](int64_t done, int64_t total) {
        EXPECT_EQ(done, last + 1);
        EXPECT_EQ(total, static_cast<int64_t>(n_requests * configs.size()));
        last = done;
      });
  ASSERT_TRUE(concurrent.ok()) << concurrent.status();
  EXPECT_EQ(last, static_cast<int64_t>(n_requests * configs.size()));
  EXPECT_EQ(*concurrent, *sequential);
  // Every configuration was made on a worker's single-threaded backend, not the model's.
  EXPECT_EQ(on_workers.load(), n_requests * static_cast<int>(configs.size()));
  for (size_t k = 1; k < configs.size(); ++k) EXPECT_NE((*sequential)[k], (*sequential)[0]);

  for (int run = 0; run < 3; ++run) {
    auto failing = MeasureNllWith(
        **many, requests, configs.size(),
        [&](size_t k, size_t r, const KvCache& exact, KvCache& work, Backend& b) {
          if (k == 1 && (r == 1 || r == 2)) {
            return absl::DataLossError(absl::StrCat("request ", r, " cannot be rebuilt"));
          }
          return apply(k, r, exact, work, b);
        });
    EXPECT_EQ(failing.status(), absl::DataLossError("request 1 cannot be rebuilt"));
  }
}

}  // namespace riskkv::testing
