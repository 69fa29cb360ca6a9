// Fuzz target: a migration target fed an arbitrary sequence of frames. The input is a series of
// records, each a 2-byte little-endian length and that many bytes of a serialized MigrationFrame;
// the first handshake is given this node's model fingerprint so the fuzzer explores past that
// check. The target serves the tiny test model (FULL_KV and TOKEN_REPLAY in every wire form, live
// rounds and trailers, and RECONSTRUCT in the transform form under a policy that keeps every
// layer, with a bank of transforms); every sequence must end in a status or a resumed session,
// never a crash.
//
// Run with a corpus directory, it first writes there the streams a real sender emits for a short
// session (stop-and-copy plain, int8 and int4, TOKEN_REPLAY, a live FULL_KV, and RECONSTRUCT in
// the transform form, stop-and-copy and live), as seeds.
#include <google/protobuf/stubs/logging.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/engine/cpu_engine.h"
#include "common/model/model.h"
#include "common/model/model_fingerprint.h"
#include "common/model/sampler.h"
#include "common/recovery/predictor_bank.h"
#include "common/recovery/retention_policy.h"
#include "services/migration/migration_receiver.h"
#include "services/migration/migration_sender.h"
#include "tests/test_paths.h"

namespace {

struct Node {
  std::unique_ptr<riskkv::Model> model;
  std::unique_ptr<riskkv::CpuEngine> engine;
  std::string fingerprint;
  std::unique_ptr<riskkv::PredictorBank> bank;  // transforms only
  riskkv::RetentionPolicy policy;               // every layer kept, sent in the transform form
};

// Transforms of every layer fitted to a 40-token prefill, in a bank of no groups, and a policy
// that sends every layer in the transform form with it.
void AddTransformPolicy(Node& n) {
  const riskkv::ModelConfig& c = n.model->config();
  auto kv = *n.engine->NewStore(64);
  std::vector<int32_t> tokens;
  for (int i = 0; i < 40; ++i) tokens.push_back((i * 17 + 3) % 200);
  if (!n.engine->Prefill(tokens, *kv).ok()) std::abort();
  riskkv::BankTransforms t;
  std::vector<float> rows(40 * c.kv_width());
  const riskkv::KvCache& cache = static_cast<riskkv::CpuKvStore&>(*kv).cache();
  for (int32_t l = 0; l < c.n_layers; ++l) {
    std::array<riskkv::LayerTransform, 2> layer;
    for (int v = 0; v < 2; ++v) {
      if (!(v ? cache.ReadValues(l, 0, 40, rows.data()) : cache.ReadKeys(l, 0, 40, rows.data()))
               .ok()) {
        std::abort();
      }
      auto fitted = riskkv::FitTransform(riskkv::TransformKind::kPca, rows.data(), 40, c.n_kv_heads,
                                         c.head_dim);
      if (!fitted.ok()) std::abort();
      layer[v] = *std::move(fitted);
    }
    t.layers.push_back(std::move(layer));
  }
  n.bank = *riskkv::PredictorBank::FromFits(n.fingerprint, riskkv::DType::kF32, {}, &t);
  riskkv::RetentionPolicy& p = n.policy;
  p.model_fingerprint = n.fingerprint;
  p.policy_id = "fuzz";
  p.version = 1;
  p.gate = "mean";
  for (int32_t l = 0; l < c.n_layers; ++l) p.kept_layers.push_back(l);
  p.predictor_bank_sha256 = n.bank->content_hash();
  p.wire_form = "transform";
  p.transform_step = 0.5;
  if (!p.Validate(static_cast<int32_t>(c.n_layers)).ok()) std::abort();
}

Node& TheNode() {
  static Node* node = [] {
    auto n = new Node;
    auto m = riskkv::Model::Load((riskkv::testing::TestdataDir() / "tiny_llama.gguf").string(),
                                 {.threads = 1, .activations = riskkv::ActivationPrecision::kF32});
    if (!m.ok()) std::abort();
    n->model = *std::move(m);
    n->fingerprint = *riskkv::ModelFingerprint(*n->model);
    n->engine = std::make_unique<riskkv::CpuEngine>(*n->model, riskkv::DType::kF32);
    AddTransformPolicy(*n);
    return n;
  }();
  return *node;
}

// A target of the tiny model with room for 64 rows that adopts every session it resumes.
riskkv::TargetContext Target(Node& n, int64_t max_chunk_bytes) {
  riskkv::TargetContext ctx;
  ctx.engine = n.engine.get();
  ctx.model_fingerprint = n.fingerprint;
  ctx.policy = &n.policy;
  ctx.bank = n.bank.get();
  ctx.capacity = 64;
  ctx.max_chunk_bytes = max_chunk_bytes;
  ctx.adopt = [](riskkv::ResumedSession) { return absl::StatusOr<std::string>("adopted"); };
  return ctx;
}

void Append(std::string* out, const riskkv::v1::MigrationFrame& f) {
  const std::string b = f.SerializeAsString();
  if (b.size() > 0xFFFF) return;
  out->push_back(static_cast<char>(b.size() & 0xFF));
  out->push_back(static_cast<char>(b.size() >> 8));
  out->append(b);
}

// The frames a sender emits for a 20-token session, answered as a target would.
std::string SenderStream(riskkv::MigrationMode mode, riskkv::WireForm form, bool live) {
  Node& n = TheNode();
  auto kv = *n.engine->NewStore(64);
  auto sampler = *riskkv::Sampler::Create({});
  std::vector<int32_t> tokens;
  for (int i = 0; i < 20; ++i) tokens.push_back((i * 31 + 5) % 200);
  auto logits = n.engine->Prefill(tokens, *kv);
  if (!logits.ok()) std::abort();
  tokens.push_back(sampler.Sample(*logits));
  riskkv::SendOptions options;
  options.mode = mode;
  options.model_fingerprint = n.fingerprint;
  options.wire_form = form;
  options.policy = &n.policy;
  options.bank = n.bank.get();
  options.max_chunk_bytes = 4096;
  options.live = live;
  riskkv::MigrationSender sender({kv.get(), tokens, &sampler}, options, nullptr);
  riskkv::MigrationReceiver receiver(Target(n, 0));
  std::string out;
  auto feed = [&](const riskkv::v1::MigrationFrame& f) {
    Append(&out, f);
    auto r = receiver.OnFrame(f);
    if (r.ok() && r->has_value()) (void)sender.OnReply(**r);
  };
  feed(*sender.Handshake());
  while (sender.state() != riskkv::MigrationSender::State::kResumed &&
         sender.state() != riskkv::MigrationSender::State::kFailed) {
    if (sender.state() == riskkv::MigrationSender::State::kRoundDone) {
      if (!sender.Pause(tokens, sampler).ok()) break;
      continue;
    }
    auto f = sender.NextFrame();
    if (!f.ok() || !f->has_value()) break;
    feed(**f);
  }
  if (auto c = sender.Commit(); c.ok()) feed(*c);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  google::protobuf::SetLogHandler(nullptr);  // malformed strings are the point, not news
  TheNode();
  // Seeds into the first corpus directory given.
  for (int i = 1; i < *argc; ++i) {
    const std::string arg = (*argv)[i];
    if (arg.empty() || arg[0] == '-' || !std::filesystem::is_directory(arg)) continue;
    using riskkv::MigrationMode;
    using riskkv::WireForm;
    const struct {
      const char* name;
      MigrationMode mode;
      WireForm form;
      bool live;
    } seeds[] = {
        {"full_kv_plain", MigrationMode::kFullKv, WireForm::kPlain, false},
        {"full_kv_int8", MigrationMode::kFullKv, WireForm::kInt8, false},
        {"full_kv_int4", MigrationMode::kFullKv, WireForm::kInt4, false},
        {"token_replay", MigrationMode::kTokenReplay, WireForm::kPlain, false},
        {"full_kv_live", MigrationMode::kFullKv, WireForm::kPlain, true},
        {"reconstruct_transform", MigrationMode::kReconstruct, WireForm::kPlain, false},
        {"reconstruct_transform_live", MigrationMode::kReconstruct, WireForm::kPlain, true}};
    for (const auto& s : seeds) {
      std::ofstream(arg + "/seed_" + s.name, std::ios::binary)
          << SenderStream(s.mode, s.form, s.live);
    }
    break;
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Node& n = TheNode();
  riskkv::MigrationReceiver receiver(Target(n, 4096));
  bool first = true;
  for (size_t at = 0; at + 2 <= size;) {
    const size_t len = data[at] | (static_cast<size_t>(data[at + 1]) << 8);
    at += 2;
    if (len > size - at) break;
    riskkv::v1::MigrationFrame f;
    if (!f.ParseFromArray(data + at, static_cast<int>(len))) break;
    at += len;
    if (first && f.has_handshake()) f.mutable_handshake()->set_model_fingerprint(n.fingerprint);
    first = false;
    auto r = receiver.OnFrame(f);
    if (!r.ok() || receiver.committed()) break;
  }
  receiver.OnStreamEnd();
  return 0;
}
