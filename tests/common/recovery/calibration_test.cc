// Calibration measurements on a tiny model: requests, fitted groups through a bank, and paired
// per-request NLL with and without rebuilt layers.
#include "common/recovery/calibration.h"

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/model_fingerprint.h"
#include "common/recovery/predictor_bank.h"
#include "common/recovery/rebuild.h"
#include "common/recovery/wire_apply.h"
#include "tests/common/recovery/concurrent_requests.h"
#include "tests/test_paths.h"

namespace riskkv {
namespace {

using testing::ExpectConcurrentRequestsMatch;
using testing::Perturb;

TEST(Calibration, MakeRequestsCutsDisjointWindows) {
  std::vector<int32_t> tokens(100);
  for (int i = 0; i < 100; ++i) tokens[i] = i;
  auto r = MakeRequests(tokens, 20, 10, 0);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[1].tokens.front(), 30);
  EXPECT_EQ(r[1].tokens.size(), 30u);
  EXPECT_EQ(r[1].history, 20);
  EXPECT_EQ(MakeRequests(tokens, 20, 10, 2).size(), 2u);
  EXPECT_TRUE(MakeRequests(tokens, 0, 10, 0).empty());
}

TEST(Calibration, ExactConfigurationMatchesPlainScoringAndRebuildIsPaired) {
  auto model = Model::Load((testing::TestdataDir() / "tiny_llama.gguf").string(),
                           {.threads = 2, .activations = ActivationPrecision::kF32});
  ASSERT_TRUE(model.ok());
  Model& m = **model;
  std::vector<int32_t> tokens(6 * 48);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 37 + 11) % 500);
  const auto requests = MakeRequests(tokens, 32, 16, 0);
  ASSERT_EQ(requests.size(), 6u);
  const std::span<const Request> all(requests);

  auto groups = CandidateGroups(static_cast<int32_t>(m.config().n_layers), {});
  ASSERT_TRUE(groups.ok());
  ASSERT_FALSE(groups->empty());
  int64_t last_done = 0, calls = 0;
  auto fits =
      FitGroups(m, all.first(3), all.subspan(3, 1), *groups, [&](int64_t done, int64_t total) {
        EXPECT_EQ(done, last_done + 1);
        EXPECT_LE(done, total);
        last_done = done;
        ++calls;
      });
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_GT(calls, 0);
  auto fingerprint = ModelFingerprint(m);
  ASSERT_TRUE(fingerprint.ok());
  auto bank = PredictorBank::FromFits(*fingerprint, DType::kF32, *fits);
  ASSERT_TRUE(bank.ok()) << bank.status();

  const std::vector<std::vector<int>> configs = {{}, {0}};
  auto nll = MeasureNll(m, all.subspan(4), (*bank)->groups(), configs);
  ASSERT_TRUE(nll.ok()) << nll.status();
  ASSERT_EQ(nll->size(), 2u);
  ASSERT_EQ((*nll)[0].size(), 2u);
  for (size_t r = 0; r < 2; ++r) {
    // Rebuilding nothing is the exact cache: bit-identical to scoring the request directly the
    // way a migration target resumes (all history rows but the last, then a decode step).
    const Request& req = requests[4 + r];
    auto cache = m.NewKvCache(req.tokens.size());
    const auto tokens = std::span<const int32_t>(req.tokens);
    ASSERT_TRUE(m.Prefill(tokens.first(req.moved_rows()), **cache).ok());
    auto last = m.Decode(tokens[req.moved_rows()], **cache);
    ASSERT_TRUE(last.ok());
    auto direct = m.TeacherForcedNll(std::span<const int32_t>(req.tokens).subspan(req.history),
                                     **cache, *last);
    ASSERT_TRUE(direct.ok());
    EXPECT_EQ((*nll)[0][r], direct->mean);
    // A random tiny model's layers are not predictable from each other: rebuilding changes the
    // scores, finitely.
    EXPECT_TRUE(std::isfinite((*nll)[1][r]));
    EXPECT_NE((*nll)[1][r], (*nll)[0][r]);
  }
  const std::vector<std::vector<int>> bad = {{7}};
  EXPECT_FALSE(MeasureNll(m, all.subspan(4), (*bank)->groups(), bad).ok());
  EXPECT_FALSE(FitGroups(m, {}, {}, *groups).ok());
}

// Joint calibration: one pass over the requests fits every form. The exact-anchor fits are
// FitGroups' bit for bit; a quantized form's fits are its own, and on the requests they were
// fitted on they rebuild the targets' KV from that form's decoded anchors more closely than the
// exact-anchor fits do.
TEST(Calibration, EachWireFormGetsPredictorsFittedOnItsDecodedAnchors) {
  auto model = Model::Load((testing::TestdataDir() / "tiny_llama.gguf").string(),
                           {.threads = 2, .activations = ActivationPrecision::kF32});
  ASSERT_TRUE(model.ok());
  Model& m = **model;
  std::vector<int32_t> tokens(6 * 80);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 53 + 7) % 500);
  const auto requests = MakeRequests(tokens, 64, 16, 0);
  ASSERT_EQ(requests.size(), 6u);
  const std::span<const Request> all(requests);
  auto groups = CandidateGroups(static_cast<int32_t>(m.config().n_layers), {});
  ASSERT_TRUE(groups.ok());
  const WireForm forms[] = {WireForm::kPlain, WireForm::kInt4};
  auto fits = FitGroupsForForms(m, all.first(4), all.subspan(4), *groups, forms);
  ASSERT_TRUE(fits.ok()) << fits.status();
  ASSERT_EQ(fits->size(), 2u);
  auto plain = FitGroups(m, all.first(4), all.subspan(4), *groups);
  ASSERT_TRUE(plain.ok());
  auto fingerprint = ModelFingerprint(m);
  ASSERT_TRUE(fingerprint.ok());
  std::array<std::unique_ptr<PredictorBank>, 2> banks;
  for (size_t f = 0; f < 2; ++f) {
    auto b = PredictorBank::FromFits(*fingerprint, DType::kF32, (*fits)[f]);
    ASSERT_TRUE(b.ok()) << b.status();
    banks[f] = std::move(*b);
  }
  auto alone = PredictorBank::FromFits(*fingerprint, DType::kF32, *plain);
  ASSERT_TRUE(alone.ok());
  EXPECT_EQ(banks[0]->content_hash(), (*alone)->content_hash());
  EXPECT_NE(banks[1]->content_hash(), banks[0]->content_hash());

  const ModelConfig& c = m.config();
  for (size_t g = 0; g < groups->size(); ++g) {
    const LayerGroup& group = (*groups)[g];
    double error[2] = {0, 0};
    for (const Request& r : all.first(4)) {
      auto exact = m.NewKvCache(r.history);
      ASSERT_TRUE(m.Prefill(std::span<const int32_t>(r.tokens).first(r.history), **exact).ok());
      for (size_t f = 0; f < 2; ++f) {
        auto work = (*exact)->Clone();
        ASSERT_TRUE(work.ok());
        ASSERT_TRUE(ApplyWireForm(WireForm::kInt4, group.anchors, r.history, **work).ok());
        ASSERT_TRUE(RebuildGroup(**work, banks[f]->groups()[g], c, m.backend(), 0, r.history).ok());
        for (int32_t layer : group.targets) {
          auto e = LayerNrmse(**exact, **work, layer, r.history);
          ASSERT_TRUE(e.ok());
          error[f] += e->k * e->k + e->v * e->v;
        }
      }
    }
    EXPECT_LT(error[1], error[0]) << group.ToString();
  }
}

// What a migration target holds after the moved rows (with `layers` perturbed) and the decode
// of the last history token: its cache and that decode's logits.
struct Decoded {
  std::unique_ptr<KvCache> cache;
  std::vector<float> last;
};
Decoded DecodeAfterMove(Model& m, const Request& req, const std::vector<int64_t>& layers) {
  auto cache = m.NewKvCache(req.tokens.size());
  EXPECT_TRUE(cache.ok());
  const auto tokens = std::span<const int32_t>(req.tokens);
  EXPECT_TRUE(m.Prefill(tokens.first(req.moved_rows()), **cache).ok());
  EXPECT_TRUE(Perturb(layers, req.moved_rows(), **cache).ok());
  auto last = m.Decode(tokens[req.moved_rows()], **cache);
  EXPECT_TRUE(last.ok());
  return {std::move(*cache), last.ok() ? *last : std::vector<float>{}};
}

// The full pass a migration target runs, every layer from the start.
double FullPassNll(Model& m, const Request& req, const std::vector<int64_t>& layers) {
  Decoded d = DecodeAfterMove(m, req, layers);
  auto nll = m.TeacherForcedNll(std::span<const int32_t>(req.tokens).subspan(req.history), *d.cache,
                                d.last);
  EXPECT_TRUE(nll.ok()) << nll.status();
  return nll.ok() ? nll->mean : NAN;
}

// Scores `configs` of `req` through MeasureNllWith and checks each against a full pass.
void ExpectFullPassResults(Model& m, const Request& req,
                           const std::vector<std::vector<int64_t>>& configs) {
  auto nll = MeasureNllWith(m, std::span<const Request>(&req, 1), configs.size(),
                            [&](size_t k, size_t, const KvCache&, KvCache& work, Backend&) {
                              return Perturb(configs[k], req.moved_rows(), work);
                            });
  ASSERT_TRUE(nll.ok()) << nll.status();
  for (size_t k = 0; k < configs.size(); ++k) {
    EXPECT_EQ((*nll)[k][0], FullPassNll(m, req, configs[k])) << "configuration " << k;
  }
  // With the divergences: the same NLLs, none for the exact configuration, some for the others.
  if (!configs[0].empty()) return;
  auto quality = MeasureQualityWith(m, std::span<const Request>(&req, 1), configs.size(),
                                    [&](size_t k, size_t, const KvCache&, KvCache& work, Backend&) {
                                      return Perturb(configs[k], req.moved_rows(), work);
                                    });
  ASSERT_TRUE(quality.ok()) << quality.status();
  for (size_t k = 0; k < configs.size(); ++k) {
    EXPECT_EQ(quality->nll[k][0], (*nll)[k][0]) << "configuration " << k;
    if (configs[k].empty()) {
      EXPECT_EQ(quality->kl[k][0], 0.0);
      EXPECT_EQ(quality->top1[k][0], 1.0);
    } else {
      EXPECT_GT(quality->kl[k][0], 0.0) << "configuration " << k;
    }
  }
}

TEST(RequestScorer, StartsAtTheLowestChangedLayerAndMatchesFullPassesBitForBit) {
  auto model = Model::Load((testing::TestdataDir() / "tiny_llama_deep.gguf").string(),
                           {.threads = 2, .activations = ActivationPrecision::kF32});
  ASSERT_TRUE(model.ok());
  Model& m = **model;
  ASSERT_EQ(m.config().n_layers, 8);
  std::vector<int32_t> tokens(80);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 29 + 3) % 300);
  const Request req = MakeRequests(tokens, 50, 30, 1).at(0);
  // Each configuration starts from the exact pass or the previous configuration, whichever
  // agrees on more layers; repeats cost nothing.
  const std::vector<std::vector<int64_t>> configs = {{}, {5}, {2}, {2, 5}, {2, 5}, {}, {6}, {1, 6}};
  const std::vector<int64_t> layers_run = {8, 3, 6, 3, 0, 0, 2, 7};
  auto scorer = RequestScorer::Create(m, req);
  ASSERT_TRUE(scorer.ok()) << scorer.status();
  for (size_t k = 0; k < configs.size(); ++k) {
    const int64_t before = (*scorer)->layers_run();
    auto work = (*scorer)->NextConfiguration();
    ASSERT_TRUE(work.ok());
    ASSERT_TRUE(Perturb(configs[k], req.moved_rows(), **work).ok());
    auto nll = (*scorer)->Score();
    ASSERT_TRUE(nll.ok()) << nll.status();
    EXPECT_EQ(*nll, FullPassNll(m, req, configs[k])) << "configuration " << k;
    EXPECT_EQ((*scorer)->layers_run() - before, layers_run[k]) << "configuration " << k;
  }
  EXPECT_EQ((*scorer)->Score().status().code(), absl::StatusCode::kFailedPrecondition);

  // Without the exact configuration the first one runs in full, the next from it.
  auto chain = RequestScorer::Create(m, req);
  ASSERT_TRUE(chain.ok());
  for (const auto& [config, run] :
       std::vector<std::pair<std::vector<int64_t>, int64_t>>{{{3}, 8}, {{3, 5}, 3}}) {
    const int64_t before = (*chain)->layers_run();
    auto work = (*chain)->NextConfiguration();
    ASSERT_TRUE(work.ok());
    ASSERT_TRUE(Perturb(config, req.moved_rows(), **work).ok());
    auto nll = (*chain)->Score();
    ASSERT_TRUE(nll.ok());
    EXPECT_EQ(*nll, FullPassNll(m, req, config));
    EXPECT_EQ((*chain)->layers_run() - before, run);
  }
}

// Each eval position's logits in the full pass of FullPassNll: the decode's, then the
// teacher-forced rows.
std::vector<std::vector<float>> FullPassLogits(Model& m, const Request& req,
                                               const std::vector<int64_t>& layers) {
  Decoded d = DecodeAfterMove(m, req, layers);
  const auto tokens = std::span<const int32_t>(req.tokens);
  std::vector<std::vector<float>> out = {d.last};
  std::vector<float> rows;
  ForwardOptions options;
  options.all_logits = true;
  const auto eval = tokens.subspan(req.history);
  EXPECT_TRUE(m.Forward(eval.first(eval.size() - 1), *d.cache, options, &rows).ok());
  const int64_t vocab = m.config().vocab;
  for (size_t i = 0; i + 1 < eval.size(); ++i) {
    out.emplace_back(rows.begin() + i * vocab, rows.begin() + (i + 1) * vocab);
  }
  return out;
}

// Log-probabilities of a row of logits, in long double.
std::vector<long double> LogSoftmax(const std::vector<float>& logits) {
  long double max = logits[0], sum = 0;
  for (float v : logits) max = std::max<long double>(max, v);
  for (float v : logits) sum += std::exp(static_cast<long double>(v) - max);
  std::vector<long double> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] - max - std::log(sum);
  return out;
}

TEST(RequestScorer, DivergenceFromTheExactConfigurationAsAFullComputationGivesIt) {
  auto model = Model::Load((testing::TestdataDir() / "tiny_llama_deep.gguf").string(),
                           {.threads = 2, .activations = ActivationPrecision::kF32});
  ASSERT_TRUE(model.ok());
  Model& m = **model;
  ASSERT_GT(m.config().vocab, kKlTopTokens);  // the rest of the vocabulary is lumped
  std::vector<int32_t> tokens(80);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 29 + 3) % 300);
  const Request req = MakeRequests(tokens, 50, 30, 1).at(0);
  auto scorer = RequestScorer::Create(m, req);
  ASSERT_TRUE(scorer.ok());
  // Before the exact configuration there is nothing to diverge from, nor after one scored for
  // its NLL alone (Score keeps no reference).
  ASSERT_TRUE(Perturb({4}, req.moved_rows(), *(*scorer)->NextConfiguration().value()).ok());
  EXPECT_EQ((*scorer)->ScoreQuality().status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*scorer)->NextConfiguration().ok());
  ASSERT_TRUE((*scorer)->Score().ok());
  ASSERT_TRUE(Perturb({4}, req.moved_rows(), *(*scorer)->NextConfiguration().value()).ok());
  EXPECT_EQ((*scorer)->ScoreQuality().status().code(), absl::StatusCode::kFailedPrecondition);

  const std::vector<std::vector<float>> exact = FullPassLogits(m, req, {});
  for (const std::vector<int64_t>& config : std::vector<std::vector<int64_t>>{{}, {4}, {1, 6}}) {
    auto work = (*scorer)->NextConfiguration();
    ASSERT_TRUE(work.ok());
    ASSERT_TRUE(Perturb(config, req.moved_rows(), **work).ok());
    auto q = (*scorer)->ScoreQuality();
    ASSERT_TRUE(q.ok()) << q.status();
    const std::vector<std::vector<float>> got = FullPassLogits(m, req, config);
    long double lumped = 0, full = 0, agree = 0;
    for (size_t i = 0; i < exact.size(); ++i) {
      const std::vector<long double> p = LogSoftmax(exact[i]), r = LogSoftmax(got[i]);
      std::vector<size_t> order(p.size());
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](size_t a, size_t b) { return exact[i][a] > exact[i][b]; });
      long double p_top = 0, q_top = 0, kl = 0;
      for (int64_t j = 0; j < kKlTopTokens; ++j) {
        const size_t v = order[j];
        kl += std::exp(p[v]) * (p[v] - r[v]);
        p_top += std::exp(p[v]);
        q_top += std::exp(r[v]);
      }
      kl += (1 - p_top) * std::log((1 - p_top) / (1 - q_top));
      lumped += kl;
      for (size_t v = 0; v < p.size(); ++v) full += std::exp(p[v]) * (p[v] - r[v]);
      const size_t best = std::max_element(got[i].begin(), got[i].end()) - got[i].begin();
      agree += best == order[0] ? 1 : 0;
    }
    const double n = static_cast<double>(exact.size());
    EXPECT_EQ(q->nll, FullPassNll(m, req, config));
    EXPECT_NEAR(q->kl, static_cast<double>(lumped / n),
                1e-6 + 1e-4 * static_cast<double>(lumped / n));
    EXPECT_LE(q->kl, static_cast<double>(full / n) + 1e-6);  // a lower bound on the full KL
    EXPECT_DOUBLE_EQ(q->top1, static_cast<double>(agree / n));
    if (config.empty()) {
      EXPECT_EQ(q->kl, 0.0);
      EXPECT_EQ(q->top1, 1.0);
    } else {
      EXPECT_GT(q->kl, 0.0);
    }
  }
}

TEST(RequestScorer, SmolLM2ScoresAcrossMicroBatchesMatchFullPasses) {
  // 300 scored tokens span two of the model's 256-token micro-batches, so the saved stream is
  // read back at the right offsets.
  auto model = Model::Load(testing::DefaultModelPath().string(),
                           {.threads = 2, .activations = ActivationPrecision::kF32});
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<int32_t> tokens(333);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 97 + 5) % 20000);
  ExpectFullPassResults(**model, MakeRequests(tokens, 33, 300, 1).at(0), {{}, {20}, {20, 9}, {28}});
}

TEST(MeasureNllWith, SmolLM2ConcurrentRequestsMatchOneAtATimeInInt8) {
  ExpectConcurrentRequestsMatch(testing::DefaultModelPath().string(), ActivationPrecision::kInt8, 2,
                                40, 24, 3, {{}, {4, 5}, {0}});
}

}  // namespace
}  // namespace riskkv
