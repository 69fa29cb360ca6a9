// RECONSTRUCT in the transform wire form on the 8-layer tiny model, sender and receiver against
// each other in memory: the target holds exactly what the transform codec's chunks decode to and
// rebuilds from it, and a handshake or chunk that does not fit its policy, bank or bound is
// refused before anything is applied.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/base/crc32c.h"
#include "common/kvcodec/transform_codec.h"
#include "common/recovery/rebuild.h"
#include "common/recovery/wire_apply.h"
#include "services/migration/wire.h"
#include "tests/services/migration/migration_fixture.h"
#include "tests/services/tiny_policy.h"

namespace riskkv {
namespace {

class TransformMigration : public Migration {
 protected:
  static void SetUpTestSuite() {
    Migration::SetUpTestSuite();
    // Transforms fitted to another session's rows (a calibration fits them to other text).
    const ModelConfig& c = model_->config();
    Session fit = Start(80, {.temperature = 1.0f, .seed = 9});
    const int64_t n = 110;
    auto* t = new BankTransforms;
    std::vector<float> rows(n * c.kv_width());
    for (int32_t l = 0; l < c.n_layers; ++l) {
      std::array<LayerTransform, 2> layer;
      for (int v = 0; v < 2; ++v) {
        ASSERT_TRUE((v ? CacheOf(*fit.kv).ReadValues(l, 1, n, rows.data())
                       : CacheOf(*fit.kv).ReadKeys(l, 1, n, rows.data()))
                        .ok());
        auto fitted = FitTransform(TransformKind::kPca, rows.data(), n, c.n_kv_heads, c.head_dim);
        ASSERT_TRUE(fitted.ok()) << fitted.status();
        layer[v] = *std::move(fitted);
      }
      t->layers.push_back(std::move(layer));
    }
    transforms_ = t;
    auto tiny = testing::MakeTinyPolicy(*model_, *fingerprint_, 4, DType::kF32, transforms_);
    tiny.policy.wire_form = "transform";
    tiny.policy.transform_step = 0.5;
    tiny.policy.transform_bytes_per_token = 40;
    tiny.policy.predictor_bank_sha256 = tiny.bank->content_hash();
    ASSERT_TRUE(tiny.policy.Validate(static_cast<int32_t>(c.n_layers)).ok());
    tbank_ = new std::shared_ptr<const PredictorBank>(std::move(tiny.bank));
    tpredictors_ = new std::shared_ptr<const EnginePredictors>(*engine_->LoadPredictors(*tbank_));
    tpolicy_ = new RetentionPolicy(tiny.policy);
    tgroups_ = new std::vector<const FoldedGroup*>();
    for (const LayerGroup& g : tpolicy_->rebuilt_groups) {
      tgroups_->push_back((*tbank_)->FindGroupForLayer(g.targets.front()));
    }
  }
  static void TearDownTestSuite() {
    delete tgroups_;
    delete tpolicy_;
    delete tpredictors_;
    delete tbank_;
    delete transforms_;
    Migration::TearDownTestSuite();
  }

  static TargetContext TransformTarget() {
    TargetContext ctx = Target();
    ctx.policy = tpolicy_;
    ctx.bank = tbank_->get();
    ctx.groups = tgroups_;
    ctx.predictors = tpredictors_->get();
    return ctx;
  }
  static std::vector<v1::MigrationFrame> TransformFrames(const Session& s,
                                                         int64_t max_chunk_bytes = 1500) {
    return Frames(s, MigrationMode::kReconstruct, max_chunk_bytes, WireForm::kPlain, tpolicy_,
                  tbank_->get());
  }

  inline static BankTransforms* transforms_ = nullptr;
  inline static std::shared_ptr<const PredictorBank>* tbank_ = nullptr;
  inline static std::shared_ptr<const EnginePredictors>* tpredictors_ = nullptr;
  inline static RetentionPolicy* tpolicy_ = nullptr;
  inline static std::vector<const FoldedGroup*>* tgroups_ = nullptr;
};

TEST_F(TransformMigration, TheTargetHoldsTheDecodedChunksAndRebuildsFromThem) {
  const ModelConfig& c = model_->config();
  Session source = Start(60);
  const int64_t history = 99;
  const auto frames = TransformFrames(source);
  const auto& h = frames[0].handshake();
  EXPECT_EQ(h.wire_form(), v1::KV_WIRE_TRANSFORM);
  EXPECT_EQ(h.transform_step(), 0.5);
  EXPECT_EQ(h.transform_codec_version(), kTransformCodecVersion);
  EXPECT_EQ(h.kv_bytes(), 0);  // not known ahead
  int64_t bytes = 0, chunks = 0;
  for (const auto& f : frames) {
    if (!f.has_chunk()) continue;
    const v1::KvChunk& k = f.chunk();
    ++chunks;
    bytes += static_cast<int64_t>(k.data().size());
    EXPECT_LE(static_cast<int64_t>(k.data().size()),
              TransformChunkBound(c.kv_width(), k.first_token(), k.token_count()));
    EXPECT_LE(static_cast<int64_t>(k.data().size()), 1500);
  }
  EXPECT_EQ(chunks, h.chunk_count());
  EXPECT_GT(chunks, 2 * 4) << "several chunks a layer";
  EXPECT_EQ(frames.back().trailer().kv_bytes(), bytes);
  EXPECT_LT(bytes, 4 * 2 * history * c.kv_width() * 2) << "fewer bytes than f16";

  auto resumed = Receive(frames, TransformTarget());
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->figures.kv_bytes_received, bytes);
  // Expected independently: the kept layers through the codec whole (chunking does not change
  // what rows decode to), then the groups rebuilt from them.
  auto expect = *CacheOf(*source.kv).Clone();
  const WireTransforms wt{transforms_, 0.5};
  ASSERT_TRUE(
      ApplyWireForm(WireForm::kTransform, tpolicy_->kept_layers, history, *expect, &wt).ok());
  for (const FoldedGroup& g : (*tbank_)->groups()) {
    ASSERT_TRUE(RebuildGroup(*expect, g, c, model_->backend(), 0, history).ok());
  }
  KvCache& got = CacheOf(*resumed->session.kv);
  std::vector<float> a(history * c.kv_width()), b(a.size());
  for (int32_t layer = 0; layer < c.n_layers; ++layer) {
    ASSERT_TRUE(expect->ReadKeys(layer, 0, history, a.data()).ok());
    ASSERT_TRUE(got.ReadKeys(layer, 0, history, b.data()).ok());
    EXPECT_EQ(a, b) << "keys of layer " << layer;
    ASSERT_TRUE(expect->ReadValues(layer, 0, history, a.data()).ok());
    ASSERT_TRUE(got.ReadValues(layer, 0, history, b.data()).ok());
    EXPECT_EQ(a, b) << "values of layer " << layer;
  }
  // The session decodes on at the target.
  Session moved = FromResumed(std::move(resumed->session));
  Continue(moved, 5);
  EXPECT_EQ(moved.tokens.size(), source.tokens.size() + 6);
}

// Live: rounds of any length (rows code independently), and what the target holds at the end is
// bit for bit what a stop-and-copy of the paused session gives.
TEST_F(TransformMigration, ALiveMigrationEndsWhereAStopAndCopyOfTheFinalSessionDoes) {
  Session source = Start(3, {}, DType::kF16);
  TargetContext ctx = TransformTarget();
  std::optional<ResumedSession> adopted;
  ctx.adopt = [&](ResumedSession r) -> absl::StatusOr<std::string> {
    adopted = std::move(r);
    return std::string("adopted-1");
  };
  MigrationReceiver receiver(ctx);
  SendOptions options = Options(MigrationMode::kReconstruct, *fingerprint_, tpolicy_, 1500,
                                WireForm::kPlain, tbank_->get());
  options.live = true;
  options.pause_rows = 2;
  MigrationSender sender(source.View(), options, nullptr);
  auto deliver = [&](const v1::MigrationFrame& f) {
    auto reply = receiver.OnFrame(f);
    ASSERT_TRUE(reply.ok()) << reply.status();
    if (reply->has_value()) {
      ASSERT_TRUE(sender.OnReply(**reply).ok());
    }
  };
  auto h = sender.Handshake();
  ASSERT_TRUE(h.ok()) << h.status();
  deliver(*h);
  const int growth[] = {37, 5, 1};
  int round = 0;
  while (sender.state() != MigrationSender::State::kResumed) {
    if (sender.state() == MigrationSender::State::kRoundDone) {
      Continue(source, growth[std::min(round++, 2)]);
      const auto history = static_cast<int64_t>(source.tokens.size()) - 1;
      ASSERT_TRUE((sender.ShouldPause(history) ? sender.Pause(source.tokens, *source.sampler)
                                               : sender.NextRound(source.tokens))
                      .ok());
      continue;
    }
    auto f = sender.NextFrame();
    ASSERT_TRUE(f.ok() && f->has_value()) << f.status();
    deliver(**f);
  }
  auto commit = sender.Commit();
  ASSERT_TRUE(commit.ok());
  deliver(*commit);
  ASSERT_TRUE(adopted.has_value());
  EXPECT_GE(sender.rounds(), 2);
  // The rounds ended where the session was, not on token groups.
  EXPECT_EQ(sender.rows_sent(), static_cast<int64_t>(source.tokens.size()) - 1);
  auto stop = Receive(TransformFrames(source), TransformTarget());
  ASSERT_TRUE(stop.ok()) << stop.status();
  const auto n = static_cast<int64_t>(source.tokens.size()) - 1;
  const ModelConfig& c = model_->config();
  std::vector<float> a(n * c.kv_width()), b(a.size());
  for (int32_t layer = 0; layer < c.n_layers; ++layer) {
    for (bool values : {false, true}) {
      KvCache& live = CacheOf(*adopted->kv);
      KvCache& copied = CacheOf(*stop->session.kv);
      ASSERT_TRUE(
          (values ? live.ReadValues(layer, 0, n, a.data()) : live.ReadKeys(layer, 0, n, a.data()))
              .ok());
      ASSERT_TRUE((values ? copied.ReadValues(layer, 0, n, b.data())
                          : copied.ReadKeys(layer, 0, n, b.data()))
                      .ok());
      EXPECT_EQ(a, b) << "layer " << layer << (values ? " values" : " keys");
    }
  }
  EXPECT_EQ(adopted->logits, stop->session.logits);
}

TEST_F(TransformMigration, MismatchedHandshakesAndChunksAreRefusedBeforeAnythingIsApplied) {
  Session s = Start(30);
  const auto good = TransformFrames(s);
  auto refused = [](std::vector<v1::MigrationFrame> frames, absl::StatusCode code,
                    const std::string& needle, const std::string& reason,
                    TargetContext ctx = TransformTarget()) {
    ExpectRefused(std::move(frames), code, needle, reason, std::move(ctx));
  };
  auto f = good;
  f[0].mutable_handshake()->set_transform_codec_version(2);
  refused(f, absl::StatusCode::kFailedPrecondition, "transform codec version 2", "wire_form");
  f = good;
  f[0].mutable_handshake()->set_transform_step(0.25);
  refused(f, absl::StatusCode::kFailedPrecondition, "transform step 0.25", "wire_form");
  f = good;
  f[0].mutable_handshake()->set_kv_bytes(1000);
  refused(f, absl::StatusCode::kInvalidArgument, "handshake announces", "handshake");
  f = good;
  f[0].mutable_handshake()->set_mode(v1::FULL_KV);
  refused(f, absl::StatusCode::kInvalidArgument, "only RECONSTRUCT sends", "handshake");
  // A target whose policy is the same but whose bank holds no transforms.
  TargetContext no_transforms = TransformTarget();
  auto plain_bank = testing::MakeTinyPolicy(*model_, *fingerprint_, 4, DType::kF32);
  RetentionPolicy same = *tpolicy_;
  same.predictor_bank_sha256 = plain_bank.bank->content_hash();
  no_transforms.policy = &same;
  no_transforms.bank = plain_bank.bank.get();
  f = good;
  f[0].mutable_handshake()->set_predictor_bank_sha256(same.predictor_bank_sha256);
  refused(f, absl::StatusCode::kFailedPrecondition, "holds no transforms", "wire_form",
          no_transforms);
  // A chunk above its bound, and one whose frame is damaged (CRC recomputed: only the decoder
  // can tell).
  auto recrc = Recrc;
  f = good;
  f[1].mutable_chunk()->mutable_data()->append(200000, 'x');
  recrc(f[1].mutable_chunk());
  refused(f, absl::StatusCode::kInvalidArgument, "above their bound", "bad_chunk");
  f = good;
  ASSERT_GT(f[2].chunk().first_token(), 0);
  std::string* d = f[2].mutable_chunk()->mutable_data();
  d->resize(d->size() - 3);
  recrc(f[2].mutable_chunk());
  refused(f, absl::StatusCode::kInvalidArgument, "zstd frame", "bad_chunk");

  // A chunk that codes all of a layer's rows as zeros (every row at the mean): a few bytes, within
  // its bound, but more rows than a chunk within this node's bound holds.
  {
    const ModelConfig& c = model_->config();
    f = good;
    const int32_t layer = f[1].chunk().layer();
    const int64_t n = f[0].handshake().history_tokens() - 1;
    const LayerTransform& t = transforms_->layers[layer][0];
    std::vector<float> at_mean(n * c.kv_width());
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t h = 0; h < c.n_kv_heads; ++h) {
        std::copy(t.head[h].mean.begin(), t.head[h].mean.end(),
                  at_mean.begin() + r * c.kv_width() + h * c.head_dim);
      }
    }
    v1::KvChunk* k = f[1].mutable_chunk();
    ASSERT_TRUE(
        EncodeTransformChunk(t, TransformStep(t, 0.5), at_mean.data(), 1, n, 3, k->mutable_data())
            .ok());
    ASSERT_LT(k->data().size(), 1500u);
    k->set_values(false);
    k->set_first_token(1);
    k->set_token_count(n);
    recrc(k);
    TargetContext bounded = TransformTarget();
    bounded.max_chunk_bytes = 1500;
    refused(f, absl::StatusCode::kInvalidArgument, "above this node's", "bad_chunk", bounded);
  }

  // The sender: FULL_KV does not send the transform form, nor RECONSTRUCT without the bank.
  MigrationSender full(s.View(),
                       Options(MigrationMode::kFullKv, *fingerprint_, tpolicy_, 1500,
                               WireForm::kTransform, tbank_->get()),
                       nullptr);
  auto h = full.Handshake();
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(h.status().message().find("FULL_KV sends plain, int8 or int4"), std::string::npos);
  MigrationSender bankless(
      s.View(), Options(MigrationMode::kReconstruct, *fingerprint_, tpolicy_, 1500), nullptr);
  h = bankless.Handshake();
  EXPECT_EQ(h.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(h.status().message().find("needs the policy's predictor bank"), std::string::npos);
}

}  // namespace
}  // namespace riskkv
