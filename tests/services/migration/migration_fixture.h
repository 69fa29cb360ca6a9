// The fixture of the migration protocol's tests: an 8-layer tiny model, its CPU engine and a
// tiny retention policy with two rebuilt groups, sessions made on it, and a sender's frames fed
// to a receiver in memory.
#pragma once

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "common/base/crc32c.h"
#include "common/engine/cpu_engine.h"
#include "common/model/model_fingerprint.h"
#include "services/migration/migration_receiver.h"
#include "services/migration/migration_sender.h"
#include "tests/services/tiny_policy.h"
#include "tests/test_paths.h"

namespace riskkv {

struct Session {
  std::unique_ptr<KvStore> kv;
  std::vector<int32_t> tokens;
  std::optional<Sampler> sampler;

  SessionView View() const { return {kv.get(), tokens, &*sampler}; }
};

inline KvCache& CacheOf(KvStore& kv) { return static_cast<CpuKvStore&>(kv).cache(); }

// What a receiver gave for a whole stream: the adopted session and its figures.
struct Received {
  ResumedSession session;
  ResumeFigures figures;
};

// Counts the sender's hand-over calls.
struct CountingHandOver : HandOver {
  void Withdraw() override { ++withdrawn; }
  void Restore() override { ++restored; }
  int withdrawn = 0, restored = 0;
};

inline SendOptions Options(MigrationMode mode, const std::string& fingerprint,
                           const RetentionPolicy* policy, int64_t max_chunk_bytes,
                           WireForm wire_form = WireForm::kPlain,
                           const PredictorBank* bank = nullptr) {
  return {.mode = mode,
          .model_fingerprint = fingerprint,
          .policy = policy,
          .bank = bank,
          .wire_form = wire_form,
          .max_chunk_bytes = max_chunk_bytes,
          .pace = nullptr};
}

inline v1::ReceiveReply Accepted() {
  v1::ReceiveReply r;
  r.mutable_accepted();
  return r;
}

class Migration : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto m = Model::Load((testing::TestdataDir() / "tiny_llama_deep.gguf").string(),
                         {.threads = 2, .activations = ActivationPrecision::kF32});
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = m->release();
    engine_ = new CpuEngine(*model_, DType::kF32);
    engine16_ = new CpuEngine(*model_, DType::kF16);
    auto fp = ModelFingerprint(*model_);
    ASSERT_TRUE(fp.ok());
    fingerprint_ = new std::string(*fp);
    auto tiny = testing::MakeTinyPolicy(*model_, *fingerprint_);
    ASSERT_EQ(tiny.bank->groups().size(), 2u);
    bank_ = new std::shared_ptr<const PredictorBank>(std::move(tiny.bank));
    predictors_ = new std::shared_ptr<const EnginePredictors>(*engine_->LoadPredictors(*bank_));
    policy_ = new RetentionPolicy(tiny.policy);
    ASSERT_EQ(policy_->kept_layers.size(), 4u);
    // Matched once, as a node's Retention is.
    groups_ = new std::vector<const FoldedGroup*>();
    for (const LayerGroup& g : policy_->rebuilt_groups) {
      groups_->push_back((*bank_)->FindGroupForLayer(g.targets.front()));
      ASSERT_NE(groups_->back(), nullptr);
      ASSERT_EQ(groups_->back()->group, g);
    }
  }
  static void TearDownTestSuite() {
    delete groups_;
    delete policy_;
    delete predictors_;
    delete bank_;
    delete fingerprint_;
    delete engine16_;
    delete engine_;
    delete model_;
  }

  // A session that prefilled a 40-token prompt and generated `generated` tokens.
  static Session Start(int generated, SamplingParams params = {}, DType dtype = DType::kF32) {
    Session s;
    Engine* engine = dtype == DType::kF16 ? engine16_ : engine_;
    s.kv = *engine->NewStore(128);
    s.sampler = *Sampler::Create(params);
    for (int i = 0; i < 40; ++i) s.tokens.push_back((i * 31 + 5) % 500);
    auto logits = engine->Prefill(s.tokens, *s.kv);
    EXPECT_TRUE(logits.ok());
    s.tokens.push_back(s.sampler->Sample(*logits));
    Continue(s, generated - 1);
    return s;
  }
  // The engine whose store `kv` is.
  static Engine* EngineOf(const KvStore& kv) {
    return &kv.engine() == engine16_ ? static_cast<Engine*>(engine16_) : engine_;
  }
  // Feeds the pending token and samples `steps` more.
  static void Continue(Session& s, int steps) {
    for (int i = 0; i < steps; ++i) {
      auto logits = EngineOf(*s.kv)->Decode(s.tokens.back(), *s.kv);
      ASSERT_TRUE(logits.ok()) << logits.status();
      s.tokens.push_back(s.sampler->Sample(*logits));
    }
  }
  static Session Clone(const Session& s) {
    Session c;
    c.kv = *EngineOf(*s.kv)->CopyStore(*s.kv);
    c.tokens = s.tokens;
    c.sampler = s.sampler;
    return c;
  }

  // The handshake, chunks and trailer the sender emits (the target's `accepted` fed to it).
  static std::vector<v1::MigrationFrame> Frames(const Session& s, MigrationMode mode,
                                                int64_t max_chunk_bytes = 1000,
                                                WireForm wire_form = WireForm::kPlain,
                                                const RetentionPolicy* policy = policy_,
                                                const PredictorBank* bank = nullptr) {
    MigrationSender sender(
        s.View(), Options(mode, *fingerprint_, policy, max_chunk_bytes, wire_form, bank), nullptr);
    std::vector<v1::MigrationFrame> frames;
    auto h = sender.Handshake();
    EXPECT_TRUE(h.ok()) << h.status();
    frames.push_back(*h);
    EXPECT_TRUE(sender.OnReply(Accepted()).ok());
    while (true) {
      auto f = sender.NextFrame();
      EXPECT_TRUE(f.ok()) << f.status();
      if (!f.ok() || !f->has_value()) break;
      frames.push_back(**f);
    }
    EXPECT_EQ(sender.state(), MigrationSender::State::kAwaitResumed);
    return frames;
  }

  static TargetContext Target() {
    return {.engine = engine_,
            .model_fingerprint = *fingerprint_,
            .policy = policy_,
            .bank = bank_->get(),
            .groups = groups_,
            .predictors = predictors_->get(),
            .rungs = {},
            .capacity = 128,
            .adopt = nullptr,
            .on_resumed = nullptr};
  }

  // Feeds every frame and a commit; returns the first error or the adopted session.
  static absl::StatusOr<Received> Receive(std::vector<v1::MigrationFrame> frames,
                                          TargetContext ctx = Target()) {
    std::optional<ResumedSession> adopted;
    ctx.adopt = [&](ResumedSession r) -> absl::StatusOr<std::string> {
      adopted = std::move(r);
      return std::string("adopted-1");
    };
    MigrationReceiver r(ctx);
    frames.emplace_back().mutable_commit();
    for (const auto& f : frames) {
      auto reply = r.OnFrame(f);
      if (!reply.ok()) return reply.status();
    }
    EXPECT_TRUE(r.committed());
    if (!adopted) return absl::InternalError("nothing adopted");
    return Received{*std::move(adopted), r.figures()};
  }

  // Feeds `frames` and a commit to a fresh receiver and expects the stream refused with `code`,
  // a message holding `needle` and failure reason `reason`, leaving nothing resumed, adopted or
  // committed.
  static void ExpectRefused(std::vector<v1::MigrationFrame> frames, absl::StatusCode code,
                            const std::string& needle, const std::string& reason,
                            TargetContext ctx = Target()) {
    bool adopted = false;
    ctx.adopt = [&](ResumedSession) -> absl::StatusOr<std::string> {
      adopted = true;
      return std::string("x");
    };
    MigrationReceiver r(ctx);
    frames.emplace_back().mutable_commit();
    absl::Status st;
    for (const auto& f : frames) {
      auto reply = r.OnFrame(f);
      if (!reply.ok()) {
        st = reply.status();
        break;
      }
    }
    EXPECT_EQ(st.code(), code) << needle << ": " << st;
    EXPECT_NE(st.message().find(needle), std::string_view::npos) << st;
    EXPECT_EQ(r.failure_reason(), reason) << needle;
    EXPECT_EQ(r.resumed(), nullptr);
    EXPECT_FALSE(adopted);
    EXPECT_FALSE(r.committed());
  }
  // Sets a chunk's CRC-32C to that of its data, so only the decoder can tell a change.
  static void Recrc(v1::KvChunk* k) {
    k->set_crc32c(Crc32c({reinterpret_cast<const uint8_t*>(k->data().data()), k->data().size()}));
  }

  static Session FromResumed(ResumedSession r) {
    Session s;
    s.kv = std::move(r.kv);
    s.tokens = std::move(r.tokens);
    s.sampler = std::move(r.sampler);
    s.tokens.push_back(s.sampler->Sample(r.logits));
    return s;
  }

  inline static Model* model_ = nullptr;
  inline static CpuEngine* engine_ = nullptr;    // f32 rows
  inline static CpuEngine* engine16_ = nullptr;  // f16 rows
  inline static std::string* fingerprint_ = nullptr;
  inline static std::shared_ptr<const PredictorBank>* bank_ = nullptr;
  inline static std::shared_ptr<const EnginePredictors>* predictors_ = nullptr;
  inline static RetentionPolicy* policy_ = nullptr;
  inline static std::vector<const FoldedGroup*>* groups_ = nullptr;  // policy_'s groups in bank_
};

}  // namespace riskkv
