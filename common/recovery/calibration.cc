// Fitting group predictors and measuring NLL with rebuilt KV.
#include "common/recovery/calibration.h"

#include <cmath>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/recovery/features.h"
#include "common/recovery/fold.h"
#include "common/recovery/rebuild.h"
#include "common/recovery/ridge.h"

namespace riskkv {
namespace {

// Runs a request's history with exact KV, collecting features of every group and the attention
// inputs of every target layer.
struct HistoryData {
  std::vector<std::vector<float>> features;  // per group, [history, F]
  std::vector<std::vector<float>> attn_in;   // per layer, [history, hidden] (targets only)
};

absl::Status CollectHistory(Model& model, const Request& r, std::span<const LayerGroup> groups,
                            HistoryData* out) {
  const ModelConfig& c = model.config();
  ASSIGN_OR_RETURN(auto cache, model.NewKvCache(r.history));
  out->attn_in.assign(c.n_layers, {});
  std::vector<bool> wanted(c.n_layers, false);
  for (const LayerGroup& g : groups) {
    for (int32_t l : g.targets) wanted[l] = true;
  }
  ForwardOptions options;
  options.attn_input_hook = [&](int64_t layer, int64_t, int64_t n, const float* a) {
    if (wanted[layer]) out->attn_in[layer].insert(out->attn_in[layer].end(), a, a + n * c.hidden);
  };
  RETURN_IF_ERROR(
      model.Forward(std::span<const int32_t>(r.tokens).first(r.history), *cache, options, nullptr));
  out->features.clear();
  for (const LayerGroup& g : groups) {
    std::vector<float> f(r.history * FeatureWidth(g, c.kv_width()));
    RETURN_IF_ERROR(BuildFeatures(*cache, g, c, model.backend(), 0, r.history, f.data()));
    out->features.push_back(std::move(f));
  }
  return absl::OkStatus();
}

absl::Status CheckRequests(std::span<const Request> requests, const ModelConfig& c) {
  for (size_t i = 0; i < requests.size(); ++i) {
    const Request& r = requests[i];
    if (r.history < 1 || r.history >= static_cast<int64_t>(r.tokens.size()) ||
        static_cast<int64_t>(r.tokens.size()) > c.context_length) {
      return absl::InvalidArgumentError(absl::StrCat("request ", i, " has history ", r.history,
                                                     " of ", r.tokens.size(), " tokens"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<Request> MakeRequests(std::span<const int32_t> tokens, int64_t history, int64_t eval,
                                  int64_t max_requests) {
  std::vector<Request> out;
  const int64_t len = history + eval;
  if (history < 1 || eval < 1) return out;
  for (int64_t start = 0; start + len <= static_cast<int64_t>(tokens.size()); start += len) {
    if (max_requests > 0 && static_cast<int64_t>(out.size()) >= max_requests) break;
    out.push_back({{tokens.begin() + start, tokens.begin() + start + len}, history});
  }
  return out;
}

absl::StatusOr<std::vector<GroupFit>> FitGroups(Model& model, std::span<const Request> train,
                                                std::span<const Request> validation,
                                                std::span<const LayerGroup> groups,
                                                const Progress& progress) {
  const ModelConfig& c = model.config();
  if (train.empty()) return absl::InvalidArgumentError("no training requests");
  RETURN_IF_ERROR(CheckRequests(train, c));
  RETURN_IF_ERROR(CheckRequests(validation, c));
  RETURN_IF_ERROR(
      ValidateGroups({groups.begin(), groups.end()}, static_cast<int32_t>(c.n_layers), {}));
  // Concatenate every request's history rows: features per group, attention inputs per layer.
  auto gather = [&](std::span<const Request> reqs, HistoryData* all, int64_t* done,
                    int64_t total) -> absl::Status {
    all->features.assign(groups.size(), {});
    all->attn_in.assign(c.n_layers, {});
    for (const Request& r : reqs) {
      HistoryData one;
      RETURN_IF_ERROR(CollectHistory(model, r, groups, &one));
      for (size_t g = 0; g < groups.size(); ++g) {
        all->features[g].insert(all->features[g].end(), one.features[g].begin(),
                                one.features[g].end());
      }
      for (int64_t l = 0; l < c.n_layers; ++l) {
        all->attn_in[l].insert(all->attn_in[l].end(), one.attn_in[l].begin(), one.attn_in[l].end());
      }
      if (progress) progress(++*done, total);
    }
    return absl::OkStatus();
  };
  int64_t target_count = 0;
  for (const LayerGroup& g : groups) target_count += static_cast<int64_t>(g.targets.size());
  const int64_t total = static_cast<int64_t>(train.size() + validation.size()) + target_count;
  int64_t done = 0;
  HistoryData tr, va;
  RETURN_IF_ERROR(gather(train, &tr, &done, total));
  RETURN_IF_ERROR(gather(validation, &va, &done, total));

  std::vector<GroupFit> fits;
  for (size_t g = 0; g < groups.size(); ++g) {
    const int64_t f = FeatureWidth(groups[g], c.kv_width());
    const int64_t n_train = static_cast<int64_t>(tr.features[g].size()) / f;
    const int64_t n_val = static_cast<int64_t>(va.features[g].size()) / f;
    GroupFit fit{groups[g], {}};
    for (int32_t layer : groups[g].targets) {
      ASSIGN_OR_RETURN(RidgeResult ridge,
                       FitRidge({tr.features[g].data(), tr.attn_in[layer].data(), n_train},
                                {va.features[g].data(), va.attn_in[layer].data(), n_val}, f,
                                c.hidden, DefaultRidgeGrid()));
      ASSIGN_OR_RETURN(LayerFit folded, FoldIntoProjections(ridge, f, layer, model));
      fit.layers.push_back(std::move(folded));
      if (progress) progress(++done, total);
    }
    fits.push_back(std::move(fit));
  }
  return fits;
}

absl::StatusOr<std::vector<std::vector<double>>> MeasureNll(
    Model& model, std::span<const Request> requests, std::span<const FoldedGroup> groups,
    std::span<const std::vector<int>> configs, const Progress& progress) {
  for (const auto& config : configs) {
    for (int g : config) {
      if (g < 0 || g >= static_cast<int>(groups.size())) {
        return absl::InvalidArgumentError(
            absl::StrCat("configuration names group ", g, " of ", groups.size()));
      }
    }
  }
  const ModelConfig& c = model.config();
  auto apply = [&](size_t k, size_t r, const KvCache&, KvCache& work) -> absl::Status {
    for (int g : configs[k]) {
      RETURN_IF_ERROR(
          RebuildGroup(work, groups[g], c, model.backend(), 0, requests[r].moved_rows()));
    }
    return absl::OkStatus();
  };
  return MeasureNllWith(model, requests, configs.size(), apply, progress);
}

absl::StatusOr<std::vector<std::vector<double>>> MeasureNllWith(Model& model,
                                                                std::span<const Request> requests,
                                                                size_t n_configs,
                                                                const ApplyConfig& apply,
                                                                const Progress& progress) {
  RETURN_IF_ERROR(CheckRequests(requests, model.config()));
  std::vector<std::vector<double>> nll(n_configs, std::vector<double>(requests.size()));
  int64_t done = 0;
  const int64_t total = static_cast<int64_t>(requests.size() * n_configs);
  for (size_t r = 0; r < requests.size(); ++r) {
    const Request& req = requests[r];
    const auto tokens = std::span<const int32_t>(req.tokens);
    ASSIGN_OR_RETURN(auto exact, model.NewKvCache(static_cast<int64_t>(req.tokens.size())));
    if (req.moved_rows() > 0) {
      RETURN_IF_ERROR(model.Prefill(tokens.first(req.moved_rows()), *exact).status());
    }
    ASSIGN_OR_RETURN(auto work, exact->Clone());
    for (size_t k = 0; k < n_configs; ++k) {
      RETURN_IF_ERROR(work->CopyFrom(*exact));
      RETURN_IF_ERROR(apply(k, r, *exact, *work));
      // What a migration target does next: decode the last history token over the moved (and
      // rebuilt) rows; its logits score the first eval token.
      ASSIGN_OR_RETURN(std::vector<float> last, model.Decode(tokens[req.moved_rows()], *work));
      ASSIGN_OR_RETURN(NllResult res,
                       model.TeacherForcedNll(tokens.subspan(req.history), *work, last));
      nll[k][r] = res.mean;
      if (progress) progress(++done, total);
    }
  }
  return nll;
}

absl::StatusOr<KvError> LayerNrmse(const KvCache& exact, const KvCache& approx, int64_t layer,
                                   int64_t count) {
  if (exact.width() != approx.width() || exact.n_layers() != approx.n_layers() || count < 0) {
    return absl::InvalidArgumentError("LayerNrmse: caches of different shapes");
  }
  const int64_t n = count * exact.width();
  std::vector<float> a(n), b(n);
  auto nrmse = [&]() {
    double diff = 0.0, ref = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const double d = static_cast<double>(b[i]) - a[i];
      diff += d * d;
      ref += static_cast<double>(a[i]) * a[i];
    }
    if (ref > 0.0) return std::sqrt(diff / ref);
    return diff > 0.0 ? std::numeric_limits<double>::infinity() : 0.0;
  };
  KvError e;
  RETURN_IF_ERROR(exact.ReadKeys(layer, 0, count, a.data()));
  RETURN_IF_ERROR(approx.ReadKeys(layer, 0, count, b.data()));
  e.k = nrmse();
  RETURN_IF_ERROR(exact.ReadValues(layer, 0, count, a.data()));
  RETURN_IF_ERROR(approx.ReadValues(layer, 0, count, b.data()));
  e.v = nrmse();
  return e;
}

absl::Status ReplaceWithMatchedNoise(const KvCache& exact, KvCache& cache, int64_t layer,
                                     int64_t count, const KvError& error, uint64_t seed) {
  if (!(error.k >= 0.0) || !(error.v >= 0.0) || !std::isfinite(error.k) ||
      !std::isfinite(error.v)) {
    return absl::InvalidArgumentError("ReplaceWithMatchedNoise: NRMSE must be finite and >= 0");
  }
  if (exact.width() != cache.width() || exact.n_layers() != cache.n_layers() || count < 0) {
    return absl::InvalidArgumentError("ReplaceWithMatchedNoise: caches of different shapes");
  }
  const int64_t n = count * exact.width();
  std::vector<float> x(n);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  // E||noise||^2 = n sigma^2 = (nrmse ||x||)^2.
  auto perturb = [&](double nrmse) {
    double ss = 0.0;
    for (float v : x) ss += static_cast<double>(v) * v;
    const double sigma = n > 0 ? nrmse * std::sqrt(ss / static_cast<double>(n)) : 0.0;
    for (float& v : x) v = static_cast<float>(v + sigma * normal(rng));
  };
  RETURN_IF_ERROR(exact.ReadKeys(layer, 0, count, x.data()));
  perturb(error.k);
  RETURN_IF_ERROR(cache.WriteKeys(layer, 0, count, x.data()));
  RETURN_IF_ERROR(exact.ReadValues(layer, 0, count, x.data()));
  perturb(error.v);
  return cache.WriteValues(layer, 0, count, x.data());
}

}  // namespace riskkv
