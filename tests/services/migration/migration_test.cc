// The migration protocol on an 8-layer tiny model, sender and receiver against each other in
// memory: a session moved in each mode resumes as the source would have continued, every kind of
// bad stream is refused before it is applied, and the hand-over's second phase puts the session
// back on the source whenever the target does not confirm.
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/base/crc32c.h"
#include "common/engine/cpu_engine.h"
#include "common/kvcodec/kv_codec.h"
#include "common/model/model_fingerprint.h"
#include "common/recovery/calibration.h"
#include "common/recovery/rebuild.h"
#include "kernels/dtype.h"
#include "services/migration/migration_receiver.h"
#include "services/migration/migration_sender.h"
#include "services/migration/wire.h"
#include "tests/services/migration/migration_fixture.h"
#include "tests/services/tiny_policy.h"
#include "tests/test_paths.h"

namespace riskkv {
namespace {

TEST_F(Migration, FullKvResumesBitIdenticallyGreedyAndSampled) {
  for (float temperature : {0.0f, 0.9f}) {
    Session source = Start(6, {.temperature = temperature, .top_k = 40, .top_p = 0.95f, .seed = 7});
    const auto frames = Frames(source, MigrationMode::kFullKv);
    Session stay = Clone(source);
    Continue(stay, 16);  // the never-migrated continuation
    auto resumed = Receive(frames);
    ASSERT_TRUE(resumed.ok()) << resumed.status();
    EXPECT_EQ(resumed->session.mode, MigrationMode::kFullKv);
    EXPECT_EQ(resumed->figures.kv_bytes_received, frames[0].handshake().kv_bytes());
    Session moved = FromResumed(std::move(resumed->session));
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

TEST_F(Migration, ChunksAboveTheTargetsBoundAreRefused) {
  Session s = Start(3);
  TargetContext ctx = Target();
  ctx.max_chunk_bytes = 500;
  auto r = Receive(Frames(s, MigrationMode::kFullKv), ctx);  // 7 rows of 128 bytes per chunk
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(
                "chunk 0 carries 896 bytes, above this node's bound of 500 bytes per chunk"),
            std::string_view::npos)
      << r.status();
  EXPECT_TRUE(Receive(Frames(s, MigrationMode::kFullKv, 500), ctx).ok());
  ctx.max_chunk_bytes = 100;  // under one row: a chunk of one row is still accepted
  EXPECT_TRUE(Receive(Frames(s, MigrationMode::kFullKv, 128), ctx).ok());
  EXPECT_FALSE(Receive(Frames(s, MigrationMode::kFullKv, 256), ctx).ok());
}

TEST_F(Migration, TheTargetStoresRowsInItsOwnDtypeWhateverTheSourceSends) {
  // An f32 stream into a node that keeps f16 KV costs it f16 rows, not the f32 the source chose.
  Session s = Start(3);
  ASSERT_EQ(s.kv->dtype(), DType::kF32);
  TargetContext ctx = Target();
  ctx.engine = engine16_;
  auto r = Receive(Frames(s, MigrationMode::kFullKv), ctx);
  ASSERT_TRUE(r.ok()) << r.status();
  const KvStore& kv = *r->session.kv;
  ASSERT_EQ(kv.dtype(), DType::kF16);
  const int64_t n = static_cast<int64_t>(s.tokens.size()) - 1;
  std::vector<uint8_t> src(static_cast<size_t>(n * s.kv->row_bytes()));
  std::vector<uint8_t> got(static_cast<size_t>(n * kv.row_bytes()));
  for (int32_t layer : {0, 7}) {
    for (bool values : {false, true}) {
      ASSERT_TRUE(s.kv->ReadRows(layer, values, 0, n, src.data()).ok());
      ASSERT_TRUE(kv.ReadRows(layer, values, 0, n, got.data()).ok());
      const auto* f = reinterpret_cast<const float*>(src.data());
      const auto* h = reinterpret_cast<const uint16_t*>(got.data());
      for (size_t i = 0; i < got.size() / 2; ++i) {
        ASSERT_EQ(h[i], F32ToF16(f[i])) << "layer " << layer << " element " << i;
      }
    }
  }
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
  EXPECT_GT(resumed->figures.prefill_seconds, 0.0);
  Session moved = FromResumed(std::move(resumed->session));
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
  EXPECT_EQ(h.predictor_bank_sha256(), (*bank_)->content_hash());
  auto full = Frames(source, MigrationMode::kFullKv);
  EXPECT_EQ(h.kv_bytes() * 8, full[0].handshake().kv_bytes() * 4);  // 4 of 8 layers sent

  auto resumed = Receive(frames);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_GT(resumed->figures.rebuild_seconds, 0.0);
  // Kept layers arrive exact; rebuilt ones equal a rebuild from the source's own exact anchors.
  auto expect = *CacheOf(*source.kv).Clone();
  KvCache& got = CacheOf(*resumed->session.kv);
  for (const FoldedGroup& g : (*bank_)->groups()) {
    ASSERT_TRUE(
        RebuildGroup(*expect, g, model_->config(), model_->backend(), 0, h.history_tokens()).ok());
  }
  const int64_t n = h.history_tokens() * expect->width();
  std::vector<float> a(n), b(n);
  for (int32_t layer = 0; layer < 8; ++layer) {
    ASSERT_TRUE(expect->ReadKeys(layer, 0, h.history_tokens(), a.data()).ok());
    ASSERT_TRUE(got.ReadKeys(layer, 0, h.history_tokens(), b.data()).ok());
    EXPECT_EQ(a, b) << "keys of layer " << layer;
    ASSERT_TRUE(expect->ReadValues(layer, 0, h.history_tokens(), a.data()).ok());
    ASSERT_TRUE(got.ReadValues(layer, 0, h.history_tokens(), b.data()).ok());
    EXPECT_EQ(a, b) << "values of layer " << layer;
  }
  // The resumed session decodes on: one more token than its history is cached.
  EXPECT_EQ(got.n_tokens(), h.history_tokens() + 1);
  EXPECT_EQ(resumed->session.logits.size(), static_cast<size_t>(model_->config().vocab));
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
  f[0].mutable_handshake()->set_migration_id("Not/hex");
  expect(f, absl::StatusCode::kInvalidArgument, "migration_id must be at most 64 lowercase hex");

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
  expect(f, absl::StatusCode::kInvalidArgument, "the first frame must be a handshake");

  f = good;  // a commit before the trailer
  f.back().Clear();
  f.back().mutable_commit();
  expect(f, absl::StatusCode::kInvalidArgument, "commit before trailer");

  f = good;  // a chunk after the trailer
  f.push_back(good[1]);
  expect(f, absl::StatusCode::kFailedPrecondition, "only a commit may come");

  f = good;
  f.insert(f.begin() + 1, v1::MigrationFrame());
  expect(f, absl::StatusCode::kInvalidArgument, "an empty migration frame");

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

// Runs a sender against a receiver in memory, every reply carried back, through the commit.
// Returns the receiver's first error, if any.
absl::Status Pump(MigrationSender& sender, MigrationReceiver& receiver) {
  auto carry = [&](const v1::MigrationFrame& f) -> absl::Status {
    auto reply = receiver.OnFrame(f);
    if (!reply.ok()) return reply.status();
    if (reply->has_value()) return sender.OnReply(**reply);
    return absl::OkStatus();
  };
  auto h = sender.Handshake();
  if (!h.ok()) return h.status();
  if (auto st = carry(*h); !st.ok()) return st;
  while (sender.state() == MigrationSender::State::kStreaming) {
    auto f = sender.NextFrame();
    if (!f.ok()) return f.status();
    if (!f->has_value()) break;
    if (auto st = carry(**f); !st.ok()) return st;
  }
  auto commit = sender.Commit();
  if (!commit.ok()) return commit.status();
  return carry(*commit);
}

TEST_F(Migration, SenderAndReceiverHandOverInMemory) {
  for (MigrationMode mode :
       {MigrationMode::kReconstruct, MigrationMode::kFullKv, MigrationMode::kTokenReplay}) {
    Session source = Start(4);
    CountingHandOver hand_over;
    int64_t paced = 0;
    MigrationSender sender(source.View(),
                           {.mode = mode,
                            .model_fingerprint = *fingerprint_,
                            .policy = policy_,
                            .max_chunk_bytes = 4096,
                            .pace = [&](int64_t bytes) { paced += bytes; }},
                           &hand_over);
    std::optional<ResumedSession> adopted;
    TargetContext ctx = Target();
    ctx.prefill_seconds_per_token = 0.25;
    ctx.adopt = [&](ResumedSession r) -> absl::StatusOr<std::string> {
      EXPECT_EQ(hand_over.withdrawn, 1) << "the source stops serving before the target takes over";
      adopted = std::move(r);
      return std::string("target-7");
    };
    MigrationReceiver receiver(ctx);
    ASSERT_TRUE(Pump(sender, receiver).ok()) << MigrationModeName(mode);
    EXPECT_EQ(sender.state(), MigrationSender::State::kCommitted);
    EXPECT_EQ(sender.target_session_id(), "target-7");
    EXPECT_EQ(sender.accepted().prefill_seconds_per_token(), 0.25);
    EXPECT_EQ(sender.resumed().recovery_seconds(), receiver.figures().recovery_seconds);
    EXPECT_EQ(hand_over.withdrawn, 1);
    EXPECT_EQ(hand_over.restored, 0);
    EXPECT_EQ(paced, sender.handshake().kv_bytes()) << "every chunk's payload is paced";
    EXPECT_EQ(receiver.session_id(), "target-7");
    ASSERT_TRUE(adopted.has_value());
    EXPECT_EQ(adopted->tokens, source.tokens);
    EXPECT_EQ(adopted->kv->n_tokens(), static_cast<int64_t>(source.tokens.size()));
    sender.Abort();  // a no-op once committed
    EXPECT_EQ(hand_over.restored, 0);
  }
}

TEST_F(Migration, AnUnconfirmedCommitPutsTheSessionBack) {
  Session source = Start(3);
  CountingHandOver hand_over;
  MigrationSender sender(source.View(),
                         Options(MigrationMode::kFullKv, *fingerprint_, nullptr, 4096), &hand_over);
  TargetContext ctx = Target();
  ctx.adopt = [](ResumedSession) -> absl::StatusOr<std::string> {
    return absl::ResourceExhaustedError("this node serves its limit of 1 sessions");
  };
  MigrationReceiver receiver(ctx);
  const absl::Status st = Pump(sender, receiver);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_EQ(receiver.failure_reason(), "session_limit");
  EXPECT_EQ(sender.state(), MigrationSender::State::kAwaitCommitted);
  sender.Abort();  // the transport learns the stream failed
  EXPECT_EQ(sender.state(), MigrationSender::State::kFailed);
  EXPECT_EQ(hand_over.withdrawn, 1);
  EXPECT_EQ(hand_over.restored, 1);
}

TEST_F(Migration, TheSenderRefusesRepliesOutOfProtocol) {
  Session source = Start(2);
  CountingHandOver hand_over;
  MigrationSender sender(source.View(),
                         Options(MigrationMode::kFullKv, *fingerprint_, nullptr, 4096), &hand_over);
  EXPECT_FALSE(sender.NextFrame().ok());  // nothing before the handshake
  ASSERT_TRUE(sender.Handshake().ok());
  EXPECT_FALSE(sender.Commit().ok());
  v1::ReceiveReply resumed;
  resumed.mutable_resumed();
  const absl::Status st = sender.OnReply(resumed);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(sender.state(), MigrationSender::State::kFailed);
  EXPECT_EQ(hand_over.withdrawn + hand_over.restored, 0) << "nothing was withdrawn";

  MigrationSender tiny_chunks(source.View(),
                              Options(MigrationMode::kFullKv, *fingerprint_, nullptr, 8), nullptr);
  EXPECT_EQ(tiny_chunks.Handshake().status().code(), absl::StatusCode::kInvalidArgument);
  MigrationSender no_policy(
      source.View(), Options(MigrationMode::kReconstruct, *fingerprint_, nullptr, 4096), nullptr);
  EXPECT_EQ(no_policy.Handshake().status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(Migration, TheReceiverNamesWhyTheStreamEnded) {
  Session source = Start(2);
  auto frames = Frames(source, MigrationMode::kFullKv);
  MigrationReceiver before_trailer(Target());
  ASSERT_TRUE(before_trailer.OnFrame(frames[0]).ok());
  before_trailer.OnStreamEnd();
  EXPECT_EQ(before_trailer.failure_reason(), "truncated");
  MigrationReceiver after_trailer(Target());
  for (const auto& f : frames) ASSERT_TRUE(after_trailer.OnFrame(f).ok());
  ASSERT_NE(after_trailer.resumed(), nullptr);
  after_trailer.OnStreamEnd();
  EXPECT_EQ(after_trailer.failure_reason(), "not_committed");
  EXPECT_EQ(after_trailer.resumed(), nullptr) << "the resumed session was dropped";
  // A refused handshake still names its mode, for the metrics.
  auto foreign = frames[0];
  foreign.mutable_handshake()->set_model_fingerprint("other");
  MigrationReceiver refused(Target());
  EXPECT_EQ(refused.OnFrame(foreign).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.failure_reason(), "handshake");
  ASSERT_TRUE(refused.mode().has_value());
  EXPECT_EQ(*refused.mode(), MigrationMode::kFullKv);
}

// Rows [0, n) of a layer's keys or values, as f32.
std::vector<float> LayerRows(const KvStore& kv, int32_t layer, bool values, int64_t n) {
  const KvCache& cache = static_cast<const CpuKvStore&>(kv).cache();
  std::vector<float> rows(n * cache.width());
  EXPECT_TRUE((values ? cache.ReadValues(layer, 0, n, rows.data())
                      : cache.ReadKeys(layer, 0, n, rows.data()))
                  .ok());
  return rows;
}

// What a target holds for the source's rows sent in `form`: RoundTrip, stored in `dtype`.
std::vector<float> Expected(std::vector<float> rows, WireForm form, bool values, int64_t n,
                            const ModelConfig& c, DType dtype) {
  EXPECT_TRUE(RoundTrip(form, values, rows.data(), 0, n, c.n_kv_heads, c.head_dim).ok());
  if (dtype == DType::kF16) {
    for (float& v : rows) v = F16ToF32(F32ToF16(v));
  }
  return rows;
}

TEST_F(Migration, QuantizedFullKvSendsEncodedBytesAndTheTargetHoldsRoundTrip) {
  const ModelConfig& c = model_->config();
  for (DType dtype : {DType::kF32, DType::kF16}) {
    Session source = Start(60, {}, dtype);  // 99 history rows: three groups and 3 rows
    const int64_t history = 99;
    const auto plain = Frames(source, MigrationMode::kFullKv, 1000);
    for (WireForm form : {WireForm::kInt8, WireForm::kInt4}) {
      SCOPED_TRACE(std::string(WireFormName(form)) + " from " + DTypeName(dtype));
      const int64_t group = MinChunkBytes(form, c.n_kv_heads, c.head_dim, dtype);
      // One group per chunk, then every layer's tensor in one chunk.
      for (int64_t max_chunk : {group, int64_t{1} << 20}) {
        const auto frames = Frames(source, MigrationMode::kFullKv, max_chunk, form);
        const auto& h = frames[0].handshake();
        EXPECT_EQ(h.wire_form(), WireFormToProto(form));
        EXPECT_EQ(h.history_tokens(), history);
        EXPECT_EQ(h.kv_bytes(), 8 * LayerWireBytes(form, history, c.n_kv_heads, c.head_dim, dtype));
        EXPECT_LT(h.kv_bytes(),
                  plain[0].handshake().kv_bytes() / (form == WireForm::kInt8 ? 1 : 2));
        EXPECT_EQ(h.chunk_count(), 8 * 2 * (max_chunk == group ? 4 : 1));
        int64_t bytes = 0;
        for (size_t i = 1; i + 1 < frames.size(); ++i) {
          const v1::KvChunk& k = frames[i].chunk();
          EXPECT_EQ(k.first_token() % kTokenGroup, 0);
          EXPECT_TRUE(k.token_count() % kTokenGroup == 0 ||
                      k.first_token() + k.token_count() == history);
          EXPECT_EQ(static_cast<int64_t>(k.data().size()),
                    EncodedBytes(form, k.values(), k.first_token(), k.token_count(), c.n_kv_heads,
                                 c.head_dim, dtype));
          EXPECT_LE(static_cast<int64_t>(k.data().size()), max_chunk);
          EXPECT_EQ(k.crc32c(),
                    Crc32c({reinterpret_cast<const uint8_t*>(k.data().data()), k.data().size()}));
          bytes += static_cast<int64_t>(k.data().size());
        }
        EXPECT_EQ(bytes, h.kv_bytes());
        // A target that stores rows as the source does.
        TargetContext target = Target();
        target.engine = dtype == DType::kF16 ? engine16_ : engine_;
        auto resumed = Receive(frames, target);
        ASSERT_TRUE(resumed.ok()) << resumed.status();
        EXPECT_EQ(resumed->figures.kv_bytes_received, h.kv_bytes());
        for (int32_t layer = 0; layer < 8; ++layer) {
          for (bool values : {false, true}) {
            const std::vector<float> want = Expected(LayerRows(*source.kv, layer, values, history),
                                                     form, values, history, c, dtype);
            EXPECT_EQ(LayerRows(*resumed->session.kv, layer, values, history), want)
                << "layer " << layer << (values ? " values" : " keys");
          }
        }
        Session moved = FromResumed(std::move(resumed->session));
        Continue(moved, 8);  // the session decodes on
        EXPECT_EQ(moved.tokens.size(), source.tokens.size() + 9);
      }
    }
  }
}

TEST_F(Migration, ReconstructSendsThePolicysWireFormAndRebuildsFromDequantizedAnchors) {
  const ModelConfig& c = model_->config();
  RetentionPolicy int8 = *policy_;
  int8.wire_form = "int8";
  Session source = Start(60);
  const int64_t history = 99;
  // The request's form is FULL_KV's: RECONSTRUCT sends the policy's whatever it says.
  const auto frames = Frames(source, MigrationMode::kReconstruct, 1 << 20, WireForm::kInt4, &int8);
  const auto& h = frames[0].handshake();
  EXPECT_EQ(h.wire_form(), v1::KV_WIRE_INT8);
  EXPECT_EQ(h.kv_bytes(),
            4 * LayerWireBytes(WireForm::kInt8, history, c.n_kv_heads, c.head_dim, DType::kF32));
  TargetContext ctx = Target();
  ctx.policy = &int8;
  auto resumed = Receive(frames, ctx);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  // The target's cache: the kept layers as RoundTrip gives them, the rebuilt ones predicted from
  // those dequantized anchors.
  auto expect = *CacheOf(*source.kv).Clone();
  for (int32_t layer : int8.kept_layers) {
    for (bool values : {false, true}) {
      std::vector<float> rows = Expected(LayerRows(*source.kv, layer, values, history),
                                         WireForm::kInt8, values, history, c, DType::kF32);
      ASSERT_TRUE((values ? expect->WriteValues(layer, 0, history, rows.data())
                          : expect->WriteKeys(layer, 0, history, rows.data()))
                      .ok());
    }
  }
  for (const FoldedGroup& g : (*bank_)->groups()) {
    ASSERT_TRUE(RebuildGroup(*expect, g, c, model_->backend(), 0, history).ok());
  }
  KvCache& got = CacheOf(*resumed->session.kv);
  std::vector<float> a(history * c.kv_width()), b(a.size());
  for (int32_t layer = 0; layer < 8; ++layer) {
    ASSERT_TRUE(expect->ReadKeys(layer, 0, history, a.data()).ok());
    ASSERT_TRUE(got.ReadKeys(layer, 0, history, b.data()).ok());
    EXPECT_EQ(a, b) << "keys of layer " << layer;
    ASSERT_TRUE(expect->ReadValues(layer, 0, history, a.data()).ok());
    ASSERT_TRUE(got.ReadValues(layer, 0, history, b.data()).ok());
    EXPECT_EQ(a, b) << "values of layer " << layer;
  }
  EXPECT_NE(LayerRows(*resumed->session.kv, 0, false, history),
            LayerRows(*source.kv, 0, false, history))
      << "int8 anchors are not the exact rows";
}

TEST_F(Migration, BadWireFormsAreRefusedNamingThemAndNothingIsApplied) {
  const ModelConfig& c = model_->config();
  Session s = Start(60);
  const auto good = Frames(s, MigrationMode::kFullKv, 1 << 20, WireForm::kInt8);
  // Each case runs on a fresh receiver; a failure must leave nothing resumed or adopted.
  auto expect = [](std::vector<v1::MigrationFrame> frames, absl::StatusCode code,
                   const std::string& needle, const std::string& reason,
                   TargetContext ctx = Target()) {
    ExpectRefused(std::move(frames), code, needle, reason, std::move(ctx));
  };
  auto recrc = Recrc;
  // Key channel 5 of the first chunk: its value in the f16 sink row (bytes 10-11), then its f16
  // scale in the first group after that row, NaN and +inf; the CRC recomputed, so only the
  // decoder can tell.
  const int64_t sink_bytes = kSinkTokens * model_->config().kv_width() * 2;
  struct Poke {
    int64_t at;
    uint16_t bits;
    const char* shows;
    const char* where;
  };
  for (const Poke& p :
       {Poke{10, 0x7e00, "(sent in f16) is nan", "token 0 channel 5"},
        Poke{10, 0x7c00, "(sent in f16) is inf", "token 0 channel 5"},
        Poke{sink_bytes + 20, 0x7e00, "scale nan", "channel 5 of the token group at 1"},
        Poke{sink_bytes + 20, 0x7c00, "scale inf", "channel 5 of the token group at 1"}}) {
    auto f = good;
    std::string* d = f[1].mutable_chunk()->mutable_data();
    (*d)[p.at] = static_cast<char>(p.bits & 0xff);
    (*d)[p.at + 1] = static_cast<char>(p.bits >> 8);
    recrc(f[1].mutable_chunk());
    expect(f, absl::StatusCode::kInvalidArgument, p.shows, "bad_chunk");
    expect(f, absl::StatusCode::kInvalidArgument, p.where, "bad_chunk");
  }
  auto f = good;  // one byte too many for its form, CRC intact
  f[1].mutable_chunk()->mutable_data()->push_back('\0');
  recrc(f[1].mutable_chunk());
  expect(f, absl::StatusCode::kInvalidArgument,
         absl::StrCat(f[1].chunk().data().size(), " bytes for 99 rows in int8; ",
                      f[1].chunk().data().size() - 1, " expected"),
         "bad_chunk");

  // Chunks off their token groups: cut after 40 rows, or started at row 16.
  const auto cut = Frames(s, MigrationMode::kFullKv, 1 << 20, WireForm::kInt8);
  f = cut;
  {
    v1::KvChunk* k = f[1].mutable_chunk();
    std::vector<float> rows = LayerRows(*s.kv, k->layer(), k->values(), 40);
    Encode(WireForm::kInt8, k->values(), rows.data(), 0, 40, c.n_kv_heads, c.head_dim,
           k->mutable_data());
    k->set_token_count(40);
    recrc(k);
  }
  expect(f, absl::StatusCode::kInvalidArgument, "int8 chunks hold whole 32-token groups",
         "bad_chunk");
  f = cut;
  f[1].mutable_chunk()->set_first_token(16);
  f[1].mutable_chunk()->set_token_count(83);
  expect(f, absl::StatusCode::kInvalidArgument, "83 rows from row 16", "bad_chunk");

  // Handshakes: a form this node does not know, one the policy was not calibrated for, and a
  // form on TOKEN_REPLAY.
  f = good;
  f[0].mutable_handshake()->set_wire_form(static_cast<v1::KvWireForm>(7));
  expect(f, absl::StatusCode::kFailedPrecondition, "wire form 7 is not one this node decodes",
         "wire_form");
  RetentionPolicy int8 = *policy_;
  int8.wire_form = "int8";
  const auto recon = Frames(s, MigrationMode::kReconstruct, 1 << 20, WireForm::kPlain, &int8);
  EXPECT_TRUE(Receive(recon,
                      [&] {
                        TargetContext ctx = Target();
                        ctx.policy = &int8;
                        return ctx;
                      }())
                  .ok());
  // The same stream to a target whose policy is plain: refused before any KV.
  expect(recon, absl::StatusCode::kFailedPrecondition,
         "wire form int8 is not the plain that policy tiny v3 was calibrated for", "wire_form");
  f = recon;
  f[0].mutable_handshake()->set_wire_form(v1::KV_WIRE_INT4);
  TargetContext int8_target = Target();
  int8_target.policy = &int8;
  expect(f, absl::StatusCode::kFailedPrecondition,
         "wire form int4 is not the int8 that policy tiny v3 was calibrated for", "wire_form",
         int8_target);
  f = Frames(s, MigrationMode::kTokenReplay);
  f[0].mutable_handshake()->set_wire_form(v1::KV_WIRE_INT8);
  expect(f, absl::StatusCode::kInvalidArgument, "TOKEN_REPLAY sends no KV", "handshake");

  // A sender whose chunk bound is under one token group refuses before anything is sent.
  const int64_t group = MinChunkBytes(WireForm::kInt4, c.n_kv_heads, c.head_dim, DType::kF32);
  MigrationSender small(
      s.View(), Options(MigrationMode::kFullKv, *fingerprint_, nullptr, group - 1, WireForm::kInt4),
      nullptr);
  const absl::Status st = small.Handshake().status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("less than one token group in int4"), std::string::npos) << st;

  EXPECT_TRUE(Receive(good).ok()) << "the good stream still goes through";
}

}  // namespace
}  // namespace riskkv
