// Live migration in memory: the sender's pre-copy rounds while the session keeps decoding, the
// receiver applying each round, and the session the target resumes, compared with the session
// that never moved and with a stop-and-copy migration of the same final state.
#include <gtest/gtest.h>

#include <functional>

#include "common/kvcodec/kv_codec.h"
#include "services/migration/migration_receiver.h"
#include "services/migration/migration_sender.h"
#include "tests/services/migration/migration_fixture.h"

namespace riskkv {
namespace {

// Every row of layer `layer` (keys or values) of a store, [n_tokens, kv_width] floats.
std::vector<float> Rows(KvStore& kv, int32_t layer, bool values, int64_t n) {
  KvCache& c = CacheOf(kv);
  std::vector<float> out(static_cast<size_t>(n * c.width()));
  const bool f16 = c.dtype() == DType::kF16;
  std::vector<uint8_t> raw(static_cast<size_t>(n * c.token_bytes()));
  std::memcpy(raw.data(), values ? c.ValueRows(layer, 0) : c.KeyRows(layer, 0), raw.size());
  if (f16) {
    F16ToF32Row(reinterpret_cast<const uint16_t*>(raw.data()), out.data(), n * c.width());
  } else {
    std::memcpy(out.data(), raw.data(), raw.size());
  }
  return out;
}

class LiveMigration : public Migration {
 protected:
  // The handshake and the first pre-copy round, delivered in memory: the sender is then in
  // kRoundDone.
  static void FirstRound(MigrationSender& sender, MigrationReceiver& receiver) {
    auto deliver = [&](const v1::MigrationFrame& f) {
      auto reply = receiver.OnFrame(f);
      ASSERT_TRUE(reply.ok()) << reply.status();
      if (reply->has_value()) {
        ASSERT_TRUE(sender.OnReply(**reply).ok());
      }
    };
    auto h = sender.Handshake();
    ASSERT_TRUE(h.ok());
    deliver(*h);
    while (sender.state() == MigrationSender::State::kStreaming) {
      auto f = sender.NextFrame();
      ASSERT_TRUE(f.ok() && f->has_value());
      deliver(**f);
    }
    ASSERT_EQ(sender.state(), MigrationSender::State::kRoundDone);
  }
  struct LiveResult {
    Received received;
    int rounds = 0;
    int64_t bytes_before_pause = 0, bytes_sent = 0;
    std::vector<v1::MigrationFrame> frames;  // every frame the sender emitted
  };

  // Runs a live migration of `source` to a receiver while the session decodes growth[k] tokens
  // during round k (one every few chunks, the rest before the sender decides whether to pause;
  // the last figure repeats).
  static absl::StatusOr<LiveResult> RunLive(Session& source, SendOptions options,
                                            std::vector<int> growth, TargetContext ctx = Target()) {
    options.live = true;
    LiveResult out;
    std::optional<ResumedSession> adopted;
    ctx.adopt = [&](ResumedSession r) -> absl::StatusOr<std::string> {
      adopted = std::move(r);
      return std::string("adopted-1");
    };
    MigrationReceiver receiver(ctx);
    MigrationSender sender(source.View(), options, nullptr);
    auto deliver = [&](const v1::MigrationFrame& f) -> absl::Status {
      out.frames.push_back(f);
      auto reply = receiver.OnFrame(f);
      if (!reply.ok()) return reply.status();
      if (reply->has_value()) return sender.OnReply(**reply);
      return absl::OkStatus();
    };
    auto h = sender.Handshake();
    if (!h.ok()) return h.status();
    if (auto st = deliver(*h); !st.ok()) return st;
    int grown = 0;
    size_t round = 0;
    auto grow = [&] { return growth[std::min(round, growth.size() - 1)]; };
    while (sender.state() != MigrationSender::State::kResumed) {
      if (sender.state() == MigrationSender::State::kRoundDone) {
        // The rest of the round's growth happens before the decision.
        Continue(source, std::max(0, grow() - grown));
        grown = 0;
        ++round;
        const auto history = static_cast<int64_t>(source.tokens.size()) - 1;
        absl::Status st = sender.ShouldPause(history) ? sender.Pause(source.tokens, *source.sampler)
                                                      : sender.NextRound(source.tokens);
        if (!st.ok()) return st;
        continue;
      }
      auto f = sender.NextFrame();
      if (!f.ok()) return f.status();
      if (!f->has_value()) return absl::InternalError("the sender stopped without a reply due");
      if ((*f)->has_chunk() && grown < grow() && (*f)->chunk().sequence() % 3 == 0 &&
          sender.bytes_before_pause() == 0) {
        Continue(source, 1);  // the session decodes while the round streams
        ++grown;
      }
      if (auto st = deliver(**f); !st.ok()) return st;
    }
    auto c = sender.Commit();
    if (!c.ok()) return c.status();
    if (auto st = deliver(*c); !st.ok()) return st;
    if (!adopted) return absl::InternalError("nothing adopted");
    out.received = Received{*std::move(adopted), receiver.figures()};
    out.rounds = sender.rounds();
    out.bytes_before_pause = sender.bytes_before_pause();
    out.bytes_sent = sender.bytes_sent();
    return out;
  }
};

TEST_F(LiveMigration, EveryExactModeContinuesAsTheSessionThatNeverMoved) {
  for (MigrationMode mode : {MigrationMode::kFullKv, MigrationMode::kTokenReplay}) {
    for (float temperature : {0.0f, 0.9f}) {
      Session source =
          Start(4, {.temperature = temperature, .top_k = 40, .top_p = 0.95f, .seed = 11});
      auto run = RunLive(source, Options(mode, *fingerprint_, policy_, 1000), {20, 3});
      ASSERT_TRUE(run.ok()) << run.status();
      EXPECT_GE(run->rounds, 2) << "the session grew during the first round";
      // The pause found the session where the sender last saw it.
      EXPECT_EQ(run->received.session.tokens, source.tokens);
      Session stay = Clone(source);
      Continue(stay, 12);
      Session moved = FromResumed(std::move(run->received.session));
      Continue(moved, 11);
      EXPECT_EQ(moved.tokens, stay.tokens)
          << MigrationModeName(mode) << " at temperature " << temperature;
    }
  }
}

TEST_F(LiveMigration, RowsAndRebuildsMatchAStopAndCopyOfTheFinalSession) {
  // Every form and mode that sends rows: what the target holds after the live migration is bit
  // for bit what a stop-and-copy migration of the paused session gives.
  struct Case {
    MigrationMode mode;
    WireForm form;
  };
  RetentionPolicy int8_policy = *policy_;
  int8_policy.wire_form = "int8";
  for (const Case& c : {Case{MigrationMode::kFullKv, WireForm::kPlain},
                        Case{MigrationMode::kFullKv, WireForm::kInt8},
                        Case{MigrationMode::kFullKv, WireForm::kInt4},
                        Case{MigrationMode::kReconstruct, WireForm::kPlain},
                        Case{MigrationMode::kReconstruct, WireForm::kInt8}}) {
    const RetentionPolicy* policy =
        c.form == WireForm::kInt8 && c.mode == MigrationMode::kReconstruct ? &int8_policy : policy_;
    TargetContext ctx = Target();
    ctx.policy = policy;
    Session source = Start(3, {}, DType::kF16);
    auto run = RunLive(source, Options(c.mode, *fingerprint_, policy, 4000, c.form), {37, 5}, ctx);
    ASSERT_TRUE(run.ok()) << run.status();
    const std::string what =
        absl::StrCat(MigrationModeName(c.mode), " ", std::string(WireFormName(c.form)));
    EXPECT_GE(run->rounds, 2) << what;
    auto stop = Receive(Frames(source, c.mode, 4000, c.form, policy), ctx);
    ASSERT_TRUE(stop.ok()) << stop.status();
    KvStore& live = *run->received.session.kv;
    KvStore& copied = *stop->session.kv;
    const auto n = static_cast<int64_t>(source.tokens.size());
    ASSERT_EQ(live.n_tokens(), n) << what;
    ASSERT_EQ(copied.n_tokens(), n) << what;
    for (int32_t layer = 0; layer < engine_->config().n_layers; ++layer) {
      for (bool values : {false, true}) {
        EXPECT_EQ(Rows(live, layer, values, n), Rows(copied, layer, values, n))
            << what << ": layer " << layer << (values ? " values" : " keys");
      }
    }
    EXPECT_EQ(run->received.session.logits, stop->session.logits) << what;
    if (c.mode == MigrationMode::kReconstruct) {
      EXPECT_GT(run->received.figures.rebuild_seconds, 0);
    }
    EXPECT_GT(run->bytes_before_pause, 0) << what;
    EXPECT_LT(run->bytes_before_pause, run->bytes_sent) << what;
    EXPECT_EQ(run->bytes_sent, stop->figures.kv_bytes_received) << what;
  }
}

TEST_F(LiveMigration, QuantizedRoundsEndOnWholeTokenGroups) {
  Session source = Start(3, {}, DType::kF16);
  auto run = RunLive(source,
                     Options(MigrationMode::kFullKv, *fingerprint_, policy_, 4000, WireForm::kInt8),
                     {37, 5});
  ASSERT_TRUE(run.ok()) << run.status();
  int rounds = 0;
  for (const auto& f : run->frames) {
    if (f.has_round()) {
      ++rounds;
      EXPECT_EQ(f.round().history_tokens() % kTokenGroup, 0);
    }
    if (f.has_chunk()) {
      EXPECT_EQ(f.chunk().first_token() % kTokenGroup, 0);
    }
  }
  EXPECT_EQ(rounds, run->rounds);
  EXPECT_EQ(run->frames[0].handshake().history_tokens(), 32);  // 42 rows: one whole group
}

TEST_F(LiveMigration, AQuantizedPauseIsOfferedTheNextGroupEndOnce) {
  Session source = Start(3, {}, DType::kF16);
  for (WireForm form : {WireForm::kPlain, WireForm::kInt8}) {
    SCOPED_TRACE(WireFormName(form));
    SendOptions o = Options(MigrationMode::kFullKv, *fingerprint_, policy_, 4000, form);
    o.live = true;
    MigrationReceiver receiver(Target());
    MigrationSender sender(source.View(), o, nullptr);
    EXPECT_EQ(sender.AwaitGroupEnd(50), 0) << "before a round is done";
    ASSERT_NO_FATAL_FAILURE(FirstRound(sender, receiver));
    const int64_t sent = sender.rows_sent();  // 42 rows: plain sends them all, int8 one group
    EXPECT_EQ(sent, form == WireForm::kPlain ? 42 : 32);
    if (form == WireForm::kPlain) {
      EXPECT_EQ(sender.AwaitGroupEnd(50), 0) << "a plain round ends on any row";
      continue;
    }
    EXPECT_EQ(sender.AwaitGroupEnd(sent + o.pause_rows), 0) << "few rows left: pause now";
    EXPECT_EQ(sender.AwaitGroupEnd(42), 64) << "10 rows left: the next group ends at 64";
    EXPECT_EQ(sender.AwaitGroupEnd(43), 0) << "once per migration";
  }
}

// TOKEN_REPLAY's target prefills what the pause leaves while the session waits, so it pauses
// at one remaining token, however many rows pause_rows allows the other modes.
TEST_F(LiveMigration, TokenReplayPausesAtOneRemainingToken) {
  Session source = Start(3);
  for (MigrationMode mode : {MigrationMode::kFullKv, MigrationMode::kTokenReplay}) {
    SCOPED_TRACE(MigrationModeName(mode));
    SendOptions o = Options(mode, *fingerprint_, policy_, 4000);
    o.live = true;
    o.pause_rows = 4;
    MigrationReceiver receiver(Target());
    MigrationSender sender(source.View(), o, nullptr);
    ASSERT_NO_FATAL_FAILURE(FirstRound(sender, receiver));
    const int64_t sent = sender.rows_sent();
    EXPECT_TRUE(sender.ShouldPause(sent + 1));
    EXPECT_EQ(sender.ShouldPause(sent + 3), mode == MigrationMode::kFullKv);
    EXPECT_FALSE(sender.ShouldPause(sent + 5));
  }
}

TEST_F(LiveMigration, TheRoundCapPausesASessionThatOutgrowsTheLink) {
  // 20 new tokens every round, never under pause_rows: only the cap ends the pre-copy.
  Session source = Start(2);
  SendOptions o = Options(MigrationMode::kFullKv, *fingerprint_, policy_, 1000);
  o.max_rounds = 3;
  o.pause_rows = 4;
  auto run = RunLive(source, o, {20});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->rounds, 3);
  EXPECT_EQ(run->received.session.tokens, source.tokens);
}

// Through a scheduler: the first rounds (the whole history, then 20 new tokens) replay at a
// prefill's priority, the closing rounds of 2 tokens at a hand-over's (the first 8 of them, the
// rest a prefill's again), and the resume at a hand-over's.
TEST_F(LiveMigration, ClosingRoundsGoAtAHandOversPriority) {
  class Kinds final : public SchedulerObserver {
   public:
    void Waited(WorkKind kind, double) override {
      absl::MutexLock lock(&mu);
      seen.push_back(kind);
    }
    absl::Mutex mu;
    std::vector<WorkKind> seen ABSL_GUARDED_BY(mu);
  } kinds;
  Scheduler scheduler(*engine_, {}, &kinds);
  TargetContext ctx = Target();
  ctx.scheduler = &scheduler;
  Session source = Start(3);
  SendOptions o = Options(MigrationMode::kTokenReplay, *fingerprint_, policy_, 4000);
  o.max_rounds = 12;
  o.pause_rows = 1;
  auto run = RunLive(source, o, {20, 2}, ctx);
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->rounds, 12);
  EXPECT_EQ(run->received.session.tokens, source.tokens);
  std::vector<WorkKind> want(2, WorkKind::kPrefill);  // rounds 1 and 2
  want.insert(want.end(), 8, WorkKind::kHandOver);    // rounds 3 to 10
  want.insert(want.end(), 2, WorkKind::kPrefill);     // rounds 11 and 12
  want.push_back(WorkKind::kHandOver);                // the resume
  absl::MutexLock lock(&kinds.mu);
  EXPECT_EQ(kinds.seen, want);
}

TEST_F(LiveMigration, TheSenderRefusesTokensThatDoNotExtendWhatItSent) {
  Session source = Start(3);
  SendOptions o = Options(MigrationMode::kFullKv, *fingerprint_, policy_, 100000);
  o.live = true;
  MigrationSender sender(source.View(), o, nullptr);
  ASSERT_TRUE(sender.Handshake().ok());
  ASSERT_TRUE(sender.OnReply(Accepted()).ok());
  std::optional<v1::MigrationFrame> last;
  while (true) {
    auto f = sender.NextFrame();
    ASSERT_TRUE(f.ok());
    if (!f->has_value()) break;
    last = **f;
  }
  ASSERT_TRUE(last && last->has_round());
  v1::ReceiveReply wrong;
  wrong.mutable_round_done()->set_history_tokens(last->round().history_tokens() + 1);
  {
    MigrationSender other(source.View(), o, nullptr);
    ASSERT_TRUE(other.Handshake().ok());
    EXPECT_FALSE(other.OnReply(wrong).ok()) << "a round_done before accepted";
  }
  v1::ReceiveReply done;
  done.mutable_round_done()->set_history_tokens(last->round().history_tokens());
  ASSERT_TRUE(sender.OnReply(done).ok());
  std::vector<int32_t> other = source.tokens;
  other[3] ^= 1;
  EXPECT_EQ(sender.NextRound(other).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sender.state(), MigrationSender::State::kFailed);
}

// A live stream up to its first round's frame, for the bad-input cases below to alter.
class LiveStream : public LiveMigration {
 protected:
  void SetUp() override {
    source_ = Start(3, {}, DType::kF16);
    SendOptions o = Options(MigrationMode::kFullKv, *fingerprint_, policy_, 4000, form_);
    o.live = true;
    sender_.emplace(source_.View(), o, nullptr);
    auto h = sender_->Handshake();
    ASSERT_TRUE(h.ok());
    frames_.push_back(*h);
    ASSERT_TRUE(sender_->OnReply(Accepted()).ok());
    while (true) {
      auto f = sender_->NextFrame();
      ASSERT_TRUE(f.ok());
      if (!f->has_value()) break;
      frames_.push_back(**f);
    }
    ASSERT_TRUE(frames_.back().has_round());
  }
  // Feeds the frames; the first error, or OK.
  static absl::Status Feed(const std::vector<v1::MigrationFrame>& frames,
                           std::string* reason = nullptr) {
    MigrationReceiver r(Target());
    for (const auto& f : frames) {
      auto reply = r.OnFrame(f);
      if (!reply.ok()) {
        if (reason) *reason = r.failure_reason();
        return reply.status();
      }
    }
    return absl::OkStatus();
  }
  WireForm form_ = WireForm::kPlain;
  Session source_;
  std::optional<MigrationSender> sender_;
  std::vector<v1::MigrationFrame> frames_;
};

TEST_F(LiveStream, ARoundIsAcknowledgedWithItsHistory) {
  MigrationReceiver r(Target());
  std::optional<v1::ReceiveReply> last;
  for (const auto& f : frames_) {
    auto reply = r.OnFrame(f);
    ASSERT_TRUE(reply.ok()) << reply.status();
    if (reply->has_value()) last = **reply;
  }
  ASSERT_TRUE(last && last->has_round_done());
  EXPECT_EQ(last->round_done().history_tokens(), 42);
}

TEST_F(LiveStream, BadRoundsAreRefusedNamingWhatIsWrong) {
  std::string reason;
  {
    auto f = frames_;
    f.back().mutable_round()->set_history_tokens(43);  // a row that never came
    f.back().mutable_round()->add_token_ids(5);
    const absl::Status st = Feed(f, &reason);
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
    EXPECT_EQ(reason, "corrupt");
  }
  {
    auto f = frames_;
    f.back().mutable_round()->add_token_ids(5);  // one token too many
    const absl::Status st = Feed(f, &reason);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("new tokens"), std::string::npos) << st;
  }
  {
    auto f = frames_;
    f.back().mutable_round()->set_history_tokens(100000);
    const absl::Status st = Feed(f, &reason);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  }
  {
    auto f = frames_;
    f.erase(f.end() - 2);  // the round's last chunk lost
    const absl::Status st = Feed(f, &reason);
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  }
  {
    auto f = frames_;
    f[0].mutable_handshake()->set_live(false);  // a round in a stop-and-copy stream
    const absl::Status st = Feed(f, &reason);
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
    EXPECT_EQ(reason, "protocol");
  }
  {
    auto f = frames_;
    f.pop_back();
    f.emplace_back().mutable_trailer();  // a live trailer with no round before it
    const absl::Status st = Feed(f, &reason);
    EXPECT_FALSE(st.ok());
  }
}

TEST_F(LiveStream, ALiveTrailerMustKeepTheSamplingAndFitTheCache) {
  // The pause: a real trailer, then one with other sampling, then one that overflows.
  v1::ReceiveReply done;
  done.mutable_round_done()->set_history_tokens(42);
  ASSERT_TRUE(sender_->OnReply(done).ok());
  Continue(source_, 2);
  ASSERT_TRUE(sender_->Pause(source_.tokens, *source_.sampler).ok());
  auto f = frames_;
  while (true) {
    auto next = sender_->NextFrame();
    ASSERT_TRUE(next.ok());
    if (!next->has_value()) break;
    f.push_back(**next);
  }
  ASSERT_TRUE(f.back().has_trailer());
  EXPECT_TRUE(Feed(f).ok());
  {
    auto g = f;
    g.back().mutable_trailer()->mutable_session()->mutable_sampling()->set_temperature(0.5f);
    const absl::Status st = Feed(g);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("sampling"), std::string::npos) << st;
  }
  {
    auto g = f;
    for (int i = 0; i < 200; ++i) g.back().mutable_trailer()->mutable_session()->add_token_ids(1);
    const absl::Status st = Feed(g);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  }
  {
    auto g = f;
    g.back().mutable_trailer()->mutable_session()->add_token_ids(1);  // a row never sent
    const absl::Status st = Feed(g);
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  }
}

class LiveStreamInt8 : public LiveStream {
 protected:
  void SetUp() override {
    form_ = WireForm::kInt8;
    LiveStream::SetUp();
  }
};

TEST_F(LiveStreamInt8, ARoundInsideATokenGroupIsRefused) {
  auto f = frames_;
  ASSERT_EQ(f.back().round().history_tokens(), 32);
  // Round 0 moved to row 40, with the rows and tokens it would need: refused for its boundary.
  f.back().mutable_round()->set_history_tokens(40);
  for (int i = 0; i < 8; ++i) f.back().mutable_round()->add_token_ids(7);
  const absl::Status st = Feed(f);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("token group"), std::string::npos) << st;
}

}  // namespace
}  // namespace riskkv
