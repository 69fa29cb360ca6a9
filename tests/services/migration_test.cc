// The migration stream on an 8-layer tiny model: a session moved in each mode resumes as the
// source would have continued, and every kind of bad stream is refused before it is applied.
#include "services/migration/migration.h"

#include <gtest/gtest.h>

#include "common/base/crc32c.h"
#include "common/model/model_fingerprint.h"
#include "common/recovery/calibration.h"
#include "common/recovery/rebuild.h"
#include "tests/services/tiny_policy.h"
#include "tests/test_paths.h"

namespace riskkv {
namespace {

struct Session {
  std::unique_ptr<KvCache> cache;
  std::vector<int32_t> tokens;
  std::optional<Sampler> sampler;

  SessionView View() const { return {cache.get(), tokens, &*sampler}; }
};

class Migration : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto m = Model::Load((testing::TestdataDir() / "tiny_llama_deep.gguf").string(),
                         {.threads = 2, .activations = ActivationPrecision::kF32});
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = m->release();
    auto fp = ModelFingerprint(*model_);
    ASSERT_TRUE(fp.ok());
    fingerprint_ = new std::string(*fp);
    auto tiny = testing::MakeTinyPolicy(*model_, *fingerprint_);
    ASSERT_EQ(tiny.bank->groups().size(), 2u);
    bank_ = tiny.bank.release();
    policy_ = new RetentionPolicy(tiny.policy);
    ASSERT_EQ(policy_->kept_layers.size(), 4u);
    // Matched once, as a node's Retention is.
    groups_ = new std::vector<const FoldedGroup*>();
    for (const LayerGroup& g : policy_->rebuilt_groups) {
      groups_->push_back(bank_->FindGroupForLayer(g.targets.front()));
      ASSERT_NE(groups_->back(), nullptr);
      ASSERT_EQ(groups_->back()->group, g);
    }
  }
  static void TearDownTestSuite() {
    delete groups_;
    delete policy_;
    delete bank_;
    delete fingerprint_;
    delete model_;
  }

  // A session that prefilled a 40-token prompt and generated `generated` tokens.
  static Session Start(int generated, SamplingParams params = {}) {
    Session s;
    s.cache = *model_->NewKvCache(128, DType::kF32);
    s.sampler = *Sampler::Create(params);
    for (int i = 0; i < 40; ++i) s.tokens.push_back((i * 31 + 5) % 500);
    auto logits = model_->Prefill(s.tokens, *s.cache);
    EXPECT_TRUE(logits.ok());
    s.tokens.push_back(s.sampler->Sample(*logits));
    Continue(s, generated - 1);
    return s;
  }
  // Feeds the pending token and samples `steps` more.
  static void Continue(Session& s, int steps) {
    for (int i = 0; i < steps; ++i) {
      auto logits = model_->Decode(s.tokens.back(), *s.cache);
      ASSERT_TRUE(logits.ok()) << logits.status();
      s.tokens.push_back(s.sampler->Sample(*logits));
    }
  }
  static Session Clone(const Session& s) {
    Session c;
    c.cache = *s.cache->Clone();
    c.tokens = s.tokens;
    c.sampler = s.sampler;
    return c;
  }

  static std::vector<v1::MigrationFrame> Frames(const Session& s, MigrationMode mode,
                                                int64_t max_chunk_bytes = 1000) {
    SendOptions o{mode, *fingerprint_, policy_, max_chunk_bytes};
    auto h = MakeHandshake(s.View(), o);
    EXPECT_TRUE(h.ok()) << h.status();
    std::vector<v1::MigrationFrame> frames(1);
    *frames[0].mutable_handshake() = *h;
    EXPECT_TRUE(SendKv(s.View(), *h, o, [&](v1::MigrationFrame f) {
                  frames.push_back(std::move(f));
                  return absl::OkStatus();
                }).ok());
    return frames;
  }

  static TargetContext Target() { return {model_, *fingerprint_, policy_, bank_, groups_, 128}; }

  // Feeds every frame; returns the first error or the resumed session.
  static absl::StatusOr<ResumedSession> Receive(const std::vector<v1::MigrationFrame>& frames,
                                                TargetContext ctx = Target()) {
    MigrationReceiver r(ctx);
    for (const auto& f : frames) {
      if (auto st = r.OnFrame(f); !st.ok()) return st;
    }
    return r.TakeResumed();
  }

  static Session FromResumed(ResumedSession r) {
    Session s;
    s.cache = std::move(r.cache);
    s.tokens = std::move(r.tokens);
    s.sampler = std::move(r.sampler);
    s.tokens.push_back(s.sampler->Sample(r.logits));
    return s;
  }

  static Model* model_;
  static std::string* fingerprint_;
  static PredictorBank* bank_;
  static RetentionPolicy* policy_;
  static std::vector<const FoldedGroup*>* groups_;  // policy_'s groups in bank_
};
Model* Migration::model_ = nullptr;
std::string* Migration::fingerprint_ = nullptr;
PredictorBank* Migration::bank_ = nullptr;
RetentionPolicy* Migration::policy_ = nullptr;
std::vector<const FoldedGroup*>* Migration::groups_ = nullptr;

TEST_F(Migration, FullKvResumesBitIdenticallyGreedyAndSampled) {
  for (float temperature : {0.0f, 0.9f}) {
    Session source = Start(6, {.temperature = temperature, .top_k = 40, .top_p = 0.95f, .seed = 7});
    const auto frames = Frames(source, MigrationMode::kFullKv);
    Session stay = Clone(source);
    Continue(stay, 16);  // the never-migrated continuation
    auto resumed = Receive(frames);
    ASSERT_TRUE(resumed.ok()) << resumed.status();
    EXPECT_EQ(resumed->mode, MigrationMode::kFullKv);
    EXPECT_EQ(resumed->kv_bytes_received, frames[0].handshake().kv_bytes());
    Session moved = FromResumed(*std::move(resumed));
    Continue(moved, 15);
    EXPECT_EQ(moved.tokens, stay.tokens) << "temperature " << temperature;
  }
}

TEST_F(Migration, ChunksAreBoundedAndCarryTheirCrc) {
  Session s = Start(3);
  const auto frames = Frames(s, MigrationMode::kFullKv, 1000);
  const auto& h = frames[0].handshake();
  EXPECT_EQ(h.layers_size(), 8);
  EXPECT_EQ(h.history_tokens(), 42);
  // 128-byte rows, 7 per chunk: 42 rows = 6 chunks per tensor, 2 tensors per layer.
  EXPECT_EQ(h.chunk_count(), 8 * 2 * 6);
  ASSERT_EQ(static_cast<int64_t>(frames.size()), 1 + h.chunk_count() + 1);
  int64_t bytes = 0;
  for (size_t i = 1; i + 1 < frames.size(); ++i) {
    const auto& c = frames[i].chunk();
    EXPECT_LE(c.data().size(), 1000u);
    EXPECT_EQ(c.sequence(), static_cast<int64_t>(i - 1));
    EXPECT_EQ(c.crc32c(),
              Crc32c({reinterpret_cast<const uint8_t*>(c.data().data()), c.data().size()}));
    bytes += static_cast<int64_t>(c.data().size());
  }
  EXPECT_EQ(bytes, h.kv_bytes());
  EXPECT_EQ(frames.back().trailer().kv_bytes(), bytes);
}

TEST_F(Migration, TokenReplaySendsNoKvAndContinuesTheSameTokens) {
  Session source = Start(4);
  const auto frames = Frames(source, MigrationMode::kTokenReplay);
  ASSERT_EQ(frames.size(), 2u);  // handshake and trailer
  EXPECT_EQ(frames[0].handshake().layers_size(), 0);
  Session stay = Clone(source);
  Continue(stay, 12);
  auto resumed = Receive(frames);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_GT(resumed->prefill_seconds, 0.0);
  Session moved = FromResumed(*std::move(resumed));
  Continue(moved, 11);
  EXPECT_EQ(moved.tokens, stay.tokens);
}

TEST_F(Migration, ReconstructSendsKeptLayersAnchorsFirstAndRebuildsTheRest) {
  Session source = Start(5);
  const auto frames = Frames(source, MigrationMode::kReconstruct);
  const auto& h = frames[0].handshake();
  EXPECT_EQ(std::vector<int32_t>(h.layers().begin(), h.layers().end()),
            (std::vector<int32_t>{0, 3, 6, 7}));
  EXPECT_EQ(h.policy_id(), "tiny");
  EXPECT_EQ(h.predictor_bank_sha256(), bank_->content_hash());
  auto full = Frames(source, MigrationMode::kFullKv);
  EXPECT_EQ(h.kv_bytes() * 8, full[0].handshake().kv_bytes() * 4);  // 4 of 8 layers sent

  auto resumed = Receive(frames);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_GT(resumed->rebuild_seconds, 0.0);
  // Kept layers arrive exact; rebuilt ones equal a rebuild from the source's own exact anchors.
  auto expect = *source.cache->Clone();
  for (const FoldedGroup& g : bank_->groups()) {
    ASSERT_TRUE(
        RebuildGroup(*expect, g, model_->config(), model_->backend(), 0, h.history_tokens()).ok());
  }
  const int64_t n = h.history_tokens() * expect->width();
  std::vector<float> a(n), b(n);
  for (int32_t layer = 0; layer < 8; ++layer) {
    ASSERT_TRUE(expect->ReadKeys(layer, 0, h.history_tokens(), a.data()).ok());
    ASSERT_TRUE(resumed->cache->ReadKeys(layer, 0, h.history_tokens(), b.data()).ok());
    EXPECT_EQ(a, b) << "keys of layer " << layer;
    ASSERT_TRUE(expect->ReadValues(layer, 0, h.history_tokens(), a.data()).ok());
    ASSERT_TRUE(resumed->cache->ReadValues(layer, 0, h.history_tokens(), b.data()).ok());
    EXPECT_EQ(a, b) << "values of layer " << layer;
  }
  // The resumed session decodes on: one more token than its history is cached.
  EXPECT_EQ(resumed->cache->n_tokens(), h.history_tokens() + 1);
  EXPECT_EQ(resumed->logits.size(), static_cast<size_t>(model_->config().vocab));
}

TEST_F(Migration, BadStreamsAreRefusedNamingTheProblem) {
  Session s = Start(3);
  const auto good = Frames(s, MigrationMode::kReconstruct);
  auto expect = [&](std::vector<v1::MigrationFrame> frames, absl::StatusCode code,
                    const std::string& needle, TargetContext ctx = Target()) {
    auto r = Receive(frames, ctx);
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_EQ(r.status().code(), code) << r.status();
    EXPECT_NE(r.status().message().find(needle), std::string_view::npos) << r.status();
  };
  auto f = good;
  (*f[3].mutable_chunk()->mutable_data())[5] ^= 0x40;
  expect(f, absl::StatusCode::kDataLoss, "CRC-32C");

  f = good;
  f.erase(f.end() - 2);  // the last chunk lost, the trailer still arrives
  expect(f, absl::StatusCode::kDataLoss, "stream ended after");

  f = good;
  f.erase(f.begin() + 2);  // a chunk lost in the middle
  expect(f, absl::StatusCode::kInvalidArgument, "was due");

  f = good;
  f[1].mutable_chunk()->set_layer(1);  // a layer the policy rebuilds
  expect(f, absl::StatusCode::kInvalidArgument, "does not announce");

  f = good;  // the first chunk again, numbered as the next one
  f.insert(f.begin() + 2, f[1]);
  for (size_t i = 2; i + 1 < f.size(); ++i) f[i].mutable_chunk()->set_sequence(i - 1);
  expect(f, absl::StatusCode::kInvalidArgument, "resends row 0 of layer 0");

  f = good;
  f[0].mutable_handshake()->set_model_fingerprint("other");
  expect(f, absl::StatusCode::kFailedPrecondition, "model fingerprint other is not");

  f = good;
  f[0].mutable_handshake()->set_policy_version(2);
  expect(f, absl::StatusCode::kFailedPrecondition, "version 2 is not this node's tiny version 3");

  f = good;
  f[0].mutable_handshake()->set_protocol_version(2);
  expect(f, absl::StatusCode::kFailedPrecondition, "protocol version 2");

  f = good;
  f[0].mutable_handshake()->mutable_layers()->RemoveLast();
  expect(f, absl::StatusCode::kFailedPrecondition, "should send layers [0,3,6,7]");

  f = good;
  f[0].mutable_handshake()->mutable_session()->set_token_ids(0, 100000);
  expect(f, absl::StatusCode::kInvalidArgument, "outside the vocabulary");

  f = good;
  f[0].mutable_handshake()->set_kv_dtype(static_cast<v1::KvDtype>(9));
  expect(f, absl::StatusCode::kInvalidArgument, "kv_dtype");

  f = good;
  f[0].mutable_handshake()->set_mode(v1::AUTO);
  expect(f, absl::StatusCode::kInvalidArgument, "migration mode");

  f = {good[1]};
  expect(f, absl::StatusCode::kFailedPrecondition, "outside the chunk phase");

  f = good;
  f.insert(f.begin() + 1, good[0]);
  expect(f, absl::StatusCode::kFailedPrecondition, "second handshake");

  TargetContext no_policy = Target();
  no_policy.policy = nullptr;
  expect(good, absl::StatusCode::kFailedPrecondition, "no retention policy", no_policy);

  TargetContext small = Target();
  small.capacity = 10;
  expect(good, absl::StatusCode::kInvalidArgument, "does not fit", small);

  // The good stream still goes through after all that.
  EXPECT_TRUE(Receive(good).ok());
}

TEST(Crc32c, MatchesRfc3720TestVectors) {
  std::vector<uint8_t> v(32, 0);
  EXPECT_EQ(Crc32c(v), 0x8A9136AAu);
  std::fill(v.begin(), v.end(), 0xFF);
  EXPECT_EQ(Crc32c(v), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) v[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(Crc32c(v), 0x46DD794Eu);
  const std::string s = "123456789";
  const std::span<const uint8_t> b(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  EXPECT_EQ(Crc32c(b), 0xE3069283u);
  EXPECT_EQ(Crc32cExtend(Crc32c(b.first(4)), b.subspan(4)), 0xE3069283u);
  std::vector<uint8_t> odd(1001);
  for (size_t i = 0; i < odd.size(); ++i) odd[i] = static_cast<uint8_t>(i * 7 + 3);
  EXPECT_EQ(Crc32c(odd), Crc32cExtendPortable(0, odd));
}

}  // namespace
}  // namespace riskkv
