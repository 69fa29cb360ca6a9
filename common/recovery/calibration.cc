// Fitting group predictors and measuring NLL with rebuilt KV.
#include "common/recovery/calibration.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/status_macros.h"
#include "common/kvcodec/kv_transform.h"
#include "common/recovery/features.h"
#include "common/recovery/fold.h"
#include "common/recovery/parallel_for.h"
#include "common/recovery/rebuild.h"
#include "common/recovery/ridge.h"
#include "common/recovery/wire_apply.h"

namespace riskkv {
namespace {

// Runs a request's history with exact KV and adds its rows to every group's moments, once per
// anchor form: the group's features as x, computed from the anchors as a target holds them after
// a migration in that form, and its targets' (exact) attention inputs side by side as y.
// moments[f][g] is form f's group g.
absl::Status AddHistory(Model& model, const Request& r, std::span<const LayerGroup> groups,
                        std::span<const WireForm> forms, const WireTransforms* transforms,
                        std::vector<std::vector<RidgeMoments>>& moments) {
  const ModelConfig& c = model.config();
  ASSIGN_OR_RETURN(auto cache, model.NewKvCache(r.history));
  std::vector<std::vector<float>> attn_in(c.n_layers);  // [history, hidden], targets only
  std::vector<int32_t> anchors;
  for (const LayerGroup& g : groups) {
    for (int32_t l : g.targets) attn_in[l].resize(r.history * c.hidden);
    anchors.insert(anchors.end(), g.anchors.begin(), g.anchors.end());
  }
  std::sort(anchors.begin(), anchors.end());
  anchors.erase(std::unique(anchors.begin(), anchors.end()), anchors.end());
  ForwardOptions options;
  options.attn_input_hook = [&](int64_t layer, int64_t pos0, int64_t n, const float* a) {
    if (!attn_in[layer].empty()) std::copy(a, a + n * c.hidden, &attn_in[layer][pos0 * c.hidden]);
  };
  RETURN_IF_ERROR(
      model.Forward(std::span<const int32_t>(r.tokens).first(r.history), *cache, options, nullptr));
  std::vector<std::vector<float>> y(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& targets = groups[g].targets;
    const int64_t d = static_cast<int64_t>(targets.size()) * c.hidden;
    y[g].resize(r.history * d);
    for (int64_t i = 0; i < r.history; ++i) {
      for (size_t t = 0; t < targets.size(); ++t) {
        const float* src = &attn_in[targets[t]][i * c.hidden];
        std::copy(src, src + c.hidden, &y[g][i * d + t * c.hidden]);
      }
    }
  }
  std::unique_ptr<KvCache> decoded;  // the anchors through a quantized form
  for (size_t f = 0; f < forms.size(); ++f) {
    const KvCache* anchor_kv = cache.get();
    if (forms[f] != WireForm::kPlain) {
      if (decoded == nullptr) {
        ASSIGN_OR_RETURN(decoded, cache->Clone());
      } else {
        RETURN_IF_ERROR(decoded->CopyFrom(*cache));
      }
      RETURN_IF_ERROR(ApplyWireForm(forms[f], anchors, r.history, *decoded, transforms));
      anchor_kv = decoded.get();
    }
    // Features of every group first (the backend runs the inverse RoPE), then the groups'
    // moments on separate threads.
    std::vector<std::vector<float>> x(groups.size());
    for (size_t g = 0; g < groups.size(); ++g) {
      x[g].resize(r.history * FeatureWidth(groups[g], c.kv_width()));
      RETURN_IF_ERROR(
          BuildFeatures(*anchor_kv, groups[g], c, model.backend(), 0, r.history, x[g].data()));
    }
    std::vector<absl::Status> status(groups.size());
    ParallelChunks(static_cast<int64_t>(groups.size()), model.backend().threads(),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t g = begin; g < end; ++g) {
                       status[g] = moments[f][g].Add(x[g].data(), y[g].data(), r.history);
                     }
                   });
    for (const absl::Status& st : status) RETURN_IF_ERROR(st);
  }
  return absl::OkStatus();
}

// Fits and folds every target of one group from its moments.
absl::Status FitGroup(const Model& model, const LayerGroup& group, const RidgeMoments& train,
                      const RidgeMoments& validation, GroupFit* fit) {
  const int64_t hidden = model.config().hidden;
  *fit = GroupFit{group, {}};
  for (size_t t = 0; t < group.targets.size(); ++t) {
    ASSIGN_OR_RETURN(
        RidgeResult ridge,
        FitRidge(train, validation, static_cast<int64_t>(t) * hidden, hidden, DefaultRidgeGrid()));
    ASSIGN_OR_RETURN(LayerFit folded,
                     FoldIntoProjections(ridge, train.f(), group.targets[t], model));
    fit->layers.push_back(std::move(folded));
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

// The requests MeasureNllWith's workers share: each takes the next one until none is left or
// one has failed, and progress counts configurations in order. Requests are handed out in
// order, so every request before a failed one has run: the failure kept, the lowest request's,
// is the one a sequential measurement returns.
class RequestQueue {
 public:
  explicit RequestQueue(size_t n) : n_(n) {}

  std::optional<size_t> Next() {
    absl::MutexLock lock(&mu_);
    if (!status_.ok() || next_ == n_) return std::nullopt;
    return next_++;
  }
  void Report(size_t request, const absl::Status& s) {
    absl::MutexLock lock(&mu_);
    if (!s.ok() && (status_.ok() || request < failed_)) {
      status_ = s;
      failed_ = request;
    }
  }
  // One configuration scored: `report` gets the running count, under the lock so that counts
  // arrive in order.
  void Advance(const std::function<void(int64_t)>& report) {
    absl::MutexLock lock(&mu_);
    report(++done_);
  }
  absl::Status status() const {
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  const size_t n_;
  mutable absl::Mutex mu_;
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
  size_t failed_ ABSL_GUARDED_BY(mu_) = 0;  // the request status_ failed on
  int64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

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
  const WireForm plain[] = {WireForm::kPlain};
  ASSIGN_OR_RETURN(auto fits, FitGroupsForForms(model, train, validation, groups, plain, progress));
  return std::move(fits[0]);
}

absl::StatusOr<std::vector<std::vector<GroupFit>>> FitGroupsForForms(
    Model& model, std::span<const Request> train, std::span<const Request> validation,
    std::span<const LayerGroup> groups, std::span<const WireForm> forms, const Progress& progress,
    const WireTransforms* transforms) {
  const ModelConfig& c = model.config();
  if (train.empty()) return absl::InvalidArgumentError("no training requests");
  if (forms.empty()) return absl::InvalidArgumentError("no anchor form to fit for");
  RETURN_IF_ERROR(CheckRequests(train, c));
  RETURN_IF_ERROR(CheckRequests(validation, c));
  RETURN_IF_ERROR(
      ValidateGroups({groups.begin(), groups.end()}, static_cast<int32_t>(c.n_layers), {}));
  const size_t n_forms = forms.size();
  int64_t target_count = 0;
  std::vector<std::vector<RidgeMoments>> tr(n_forms), va(n_forms);
  for (const LayerGroup& g : groups) {
    const auto t = static_cast<int64_t>(g.targets.size());
    target_count += t;
    for (size_t f = 0; f < n_forms; ++f) {
      tr[f].emplace_back(FeatureWidth(g, c.kv_width()), t * c.hidden);
      va[f].emplace_back(FeatureWidth(g, c.kv_width()), t * c.hidden);
    }
  }
  const int64_t total = static_cast<int64_t>(train.size() + validation.size()) +
                        target_count * static_cast<int64_t>(n_forms);
  int64_t done = 0;
  for (const Request& r : train) {
    RETURN_IF_ERROR(AddHistory(model, r, groups, forms, transforms, tr));
    if (progress) progress(++done, total);
  }
  for (const Request& r : validation) {
    RETURN_IF_ERROR(AddHistory(model, r, groups, forms, transforms, va));
    if (progress) progress(++done, total);
  }

  // Each group's targets solved and folded on separate threads, a thread's worth of groups at a
  // time so that progress advances and the moments are freed as they are used.
  std::vector<std::vector<GroupFit>> fits(n_forms, std::vector<GroupFit>(groups.size()));
  const int threads = model.backend().threads();
  for (size_t f = 0; f < n_forms; ++f) {
    std::vector<absl::Status> status(groups.size());
    for (size_t g0 = 0; g0 < groups.size(); g0 += threads) {
      const size_t g1 = std::min(groups.size(), g0 + threads);
      ParallelChunks(static_cast<int64_t>(g1 - g0), threads, [&](int64_t begin, int64_t end) {
        for (size_t g = g0 + begin; g < g0 + end; ++g)
          status[g] = FitGroup(model, groups[g], tr[f][g], va[f][g], &fits[f][g]);
      });
      for (size_t g = g0; g < g1; ++g) {
        RETURN_IF_ERROR(status[g]);
        tr[f][g] = RidgeMoments(0, 0);
        va[f][g] = RidgeMoments(0, 0);
        for (size_t t = 0; t < groups[g].targets.size(); ++t) {
          if (progress) progress(++done, total);
        }
      }
    }
  }
  return fits;
}

absl::StatusOr<WireTransformFit> FitWireTransforms(Model& model, std::span<const Request> train,
                                                   TransformKind kind, double step_ratio,
                                                   int byte_requests, const Progress& progress) {
  const ModelConfig& c = model.config();
  if (train.empty()) return absl::InvalidArgumentError("no requests to fit transforms to");
  if (!(step_ratio > 0.0) || !std::isfinite(step_ratio)) {
    return absl::InvalidArgumentError(
        absl::StrCat("transform step ratio ", step_ratio, " is not a finite number > 0"));
  }
  RETURN_IF_ERROR(CheckRequests(train, c));
  const auto n_bytes = static_cast<size_t>(
      std::clamp<int64_t>(byte_requests, 0, static_cast<int64_t>(train.size())));
  const int64_t total = static_cast<int64_t>(train.size() + n_bytes);
  int64_t done = 0;
  // The moved rows of a request's exact prefill.
  auto prefill = [&](const Request& r) -> absl::StatusOr<std::unique_ptr<KvCache>> {
    ASSIGN_OR_RETURN(auto cache, model.NewKvCache(r.history));
    RETURN_IF_ERROR(model.Forward(std::span<const int32_t>(r.tokens).first(r.moved_rows()), *cache,
                                  {}, nullptr));
    return cache;
  };
  WireTransformFit out;
  std::vector<std::array<TransformMoments, 2>> moments;
  moments.reserve(static_cast<size_t>(c.n_layers));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    moments.push_back(
        {TransformMoments(c.n_kv_heads, c.head_dim), TransformMoments(c.n_kv_heads, c.head_dim)});
  }
  std::vector<float> rows;
  for (const Request& r : train) {
    ASSIGN_OR_RETURN(auto cache, prefill(r));
    const int64_t n = r.moved_rows() - 1;  // the sink row left out
    if (n > 0) {
      rows.resize(static_cast<size_t>(n * c.kv_width()));
      for (int64_t l = 0; l < c.n_layers; ++l) {
        for (int v = 0; v < 2; ++v) {
          RETURN_IF_ERROR(v ? cache->ReadValues(l, 1, n, rows.data())
                            : cache->ReadKeys(l, 1, n, rows.data()));
          moments[l][v].Add(rows.data(), n);
        }
      }
      out.rows += n;
    }
    if (progress) progress(++done, total);
  }
  out.transforms.kind = kind;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    std::array<LayerTransform, 2> layer;
    for (int v = 0; v < 2; ++v) {
      absl::StatusOr<LayerTransform> t = moments[l][v].Fit(kind);
      if (!t.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("layer ", l, v ? " values" : " keys",
                                                       " transform: ", t.status().message()));
      }
      layer[v] = *std::move(t);
    }
    out.transforms.layers.push_back(std::move(layer));
  }
  std::vector<int32_t> every(static_cast<size_t>(c.n_layers));
  std::iota(every.begin(), every.end(), 0);
  const WireTransforms wt{&out.transforms, step_ratio};
  int64_t bytes = 0;
  for (size_t i = 0; i < n_bytes; ++i) {
    const Request& r = train[i];
    ASSIGN_OR_RETURN(auto cache, prefill(r));
    int64_t b = 0;
    RETURN_IF_ERROR(ApplyWireForm(WireForm::kTransform, every, r.moved_rows(), *cache, &wt, &b));
    bytes += b;
    out.byte_rows += r.moved_rows();
    if (progress) progress(++done, total);
  }
  if (out.byte_rows > 0) {
    out.bytes_per_token =
        static_cast<double>(bytes) / static_cast<double>(out.byte_rows * c.n_layers);
  }
  return out;
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
  auto apply = [&](size_t k, size_t r, const KvCache&, KvCache& work,
                   Backend& backend) -> absl::Status {
    for (int g : configs[k]) {
      RETURN_IF_ERROR(RebuildGroup(work, groups[g], c, backend, 0, requests[r].moved_rows()));
    }
    return absl::OkStatus();
  };
  return MeasureNllWith(model, requests, configs.size(), apply, progress);
}

namespace {

// Scores every configuration of every request, with the divergences when `divergence`.
absl::StatusOr<QualityTable> Measure(Model& model, std::span<const Request> requests,
                                     size_t n_configs, const ApplyConfig& apply,
                                     const Progress& progress, bool divergence) {
  RETURN_IF_ERROR(CheckRequests(requests, model.config()));
  QualityTable table;
  for (auto* m : {&table.nll, &table.kl, &table.top1}) {
    m->assign(n_configs, std::vector<double>(requests.size()));
  }
  const int64_t total = static_cast<int64_t>(requests.size() * n_configs);
  RequestQueue queue(requests.size());
  // Request r's configurations, on `backend` (null: the model's).
  auto score = [&](size_t r, Backend* backend) -> absl::Status {
    ASSIGN_OR_RETURN(std::unique_ptr<RequestScorer> scorer,
                     RequestScorer::Create(model, requests[r], backend));
    for (size_t k = 0; k < n_configs; ++k) {
      ASSIGN_OR_RETURN(KvCache * work, scorer->NextConfiguration());
      RETURN_IF_ERROR(apply(k, r, scorer->exact(), *work, scorer->backend()));
      if (divergence) {
        ASSIGN_OR_RETURN(const ScoredQuality q, scorer->ScoreQuality());
        table.nll[k][r] = q.nll;
        table.kl[k][r] = q.kl;
        table.top1[k][r] = q.top1;
      } else {
        ASSIGN_OR_RETURN(table.nll[k][r], scorer->Score());
      }
      if (progress) queue.Advance([&](int64_t done) { progress(done, total); });
    }
    return absl::OkStatus();
  };
  Backend& shared = model.backend();
  const int threads = std::max(shared.threads(), 1);
  const int workers =
      shared.name() == "cpu"
          ? static_cast<int>(std::min<size_t>(
                {static_cast<size_t>(threads), requests.size(), kMaxRequestsAtOnce}))
          : 1;
  if (workers <= 1) {
    for (size_t r = 0; r < requests.size(); ++r) RETURN_IF_ERROR(score(r, nullptr));
    return table;
  }
  std::vector<std::thread> pool;
  for (int w = 0; w < workers; ++w) {
    // The backend's threads shared out among the workers.
    const int own_threads = threads / workers + (w < threads % workers ? 1 : 0);
    pool.emplace_back([&, own_threads] {
      const std::unique_ptr<Backend> own =
          MakeCpuBackend(own_threads, shared.activation_precision());
      while (const std::optional<size_t> r = queue.Next()) queue.Report(*r, score(*r, own.get()));
    });
  }
  for (std::thread& t : pool) t.join();
  RETURN_IF_ERROR(queue.status());
  return table;
}

}  // namespace

absl::StatusOr<std::vector<std::vector<double>>> MeasureNllWith(Model& model,
                                                                std::span<const Request> requests,
                                                                size_t n_configs,
                                                                const ApplyConfig& apply,
                                                                const Progress& progress) {
  ASSIGN_OR_RETURN(QualityTable table,
                   Measure(model, requests, n_configs, apply, progress, /*divergence=*/false));
  return std::move(table.nll);
}

absl::StatusOr<QualityTable> MeasureQualityWith(Model& model, std::span<const Request> requests,
                                                size_t n_configs, const ApplyConfig& apply,
                                                const Progress& progress) {
  return Measure(model, requests, n_configs, apply, progress, /*divergence=*/true);
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
