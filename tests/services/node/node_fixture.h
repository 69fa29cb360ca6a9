// The fixture of the node's tests: edge nodes over real gRPC on 127.0.0.1 ephemeral ports, in
// one process, serving the 8-layer tiny model (with its tiny retention policy where asked), and
// clients of their API.
#pragma once

#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/engine/cpu_engine.h"
#include "common/model/model_fingerprint.h"
#include "services/grpc_status.h"
#include "services/node/node_service.h"
#include "tests/services/tiny_policy.h"
#include "tests/test_paths.h"

namespace riskkv {

struct TestNode {
  std::unique_ptr<Model> model;
  std::unique_ptr<Engine> engine;
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<NodeMetrics> metrics;
  std::unique_ptr<NodeService> service;
  std::unique_ptr<grpc::Server> server;
  std::string address;
  std::unique_ptr<v1::Node::Stub> stub;

  std::string Metrics() const {
    return prometheus::TextSerializer().Serialize(registry->Collect());
  }
  // The metrics once they hold `line` (a handler counts as it returns, which may come after its
  // client saw the call end), or after 5 s as they are.
  std::string AwaitMetrics(const std::string& line) const {
    std::string m = Metrics();
    for (int i = 0; i < 500 && m.find(line) == std::string::npos; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      m = Metrics();
    }
    return m;
  }
  // The value of one series, named with its labels as exported (-1 when absent).
  double MetricValue(const std::string& series) const {
    const std::string text = Metrics(), line = series + " ";
    const size_t at = text.find("\n" + line);
    return at == std::string::npos ? -1.0 : std::stod(text.substr(at + 1 + line.size()));
  }
};

class Nodes : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto m = Model::Load(Path(), {.threads = 1, .activations = ActivationPrecision::kF32});
    ASSERT_TRUE(m.ok());
    fingerprint_ = new std::string(*ModelFingerprint(**m));
    tiny_ = new testing::TinyPolicy(testing::MakeTinyPolicy(**m, *fingerprint_));
    auto r = MakeRetention(tiny_->policy, std::move(tiny_->bank));
    ASSERT_TRUE(r.ok()) << r.status();
    // The bank's predictors, matched to the policy's groups once and in its order.
    ASSERT_EQ((*r)->groups.size(), tiny_->policy.rebuilt_groups.size());
    for (size_t g = 0; g < (*r)->groups.size(); ++g) {
      ASSERT_EQ((*r)->groups[g]->group, tiny_->policy.rebuilt_groups[g]);
    }
    retention_ = new std::shared_ptr<const Retention>(*r);
  }
  static void TearDownTestSuite() {
    delete retention_;
    delete tiny_;
    delete fingerprint_;
  }
  static std::string Path() { return (testing::TestdataDir() / "tiny_llama_deep.gguf").string(); }

  // A node with its own model; `with_policy` gives it the bank and policy RECONSTRUCT needs.
  static std::unique_ptr<TestNode> Start(bool with_policy, double link_mbps = 0,
                                         double prefill_seconds_per_token = 3e-3,
                                         const std::function<void(NodeOptions&)>& tweak = nullptr) {
    return StartOn(Path(), ActivationPrecision::kF32, *fingerprint_, with_policy, link_mbps,
                   prefill_seconds_per_token, tweak);
  }

  // A node serving the model at `path` in `activations` arithmetic.
  static std::unique_ptr<TestNode> StartOn(
      const std::string& path, ActivationPrecision activations, const std::string& fingerprint,
      bool with_policy, double link_mbps = 0, double prefill_seconds_per_token = 3e-3,
      const std::function<void(NodeOptions&)>& tweak = nullptr) {
    auto n = std::make_unique<TestNode>();
    n->model = *Model::Load(path, {.threads = 2, .activations = activations});
    n->metrics = std::make_unique<NodeMetrics>(*n->registry, "tiny");
    NodeOptions o;
    o.model_fingerprint = fingerprint;
    if (with_policy) {
      o.retention = *retention_;
    }
    o.capacity = 200;
    o.link_mbps = link_mbps;
    o.prefill_seconds_per_token = prefill_seconds_per_token;
    o.max_chunk_bytes = 2048;
    if (tweak) tweak(o);
    n->engine = std::make_unique<CpuEngine>(*n->model, DType::kF32);
    n->service = std::make_unique<NodeService>(*n->engine, o, n->metrics.get());
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(n->service.get());
    n->server = b.BuildAndStart();
    EXPECT_GT(port, 0);
    n->address = "127.0.0.1:" + std::to_string(port);
    n->stub =
        v1::Node::NewStub(grpc::CreateChannel(n->address, grpc::InsecureChannelCredentials()));
    return n;
  }

  static std::string StartSession(TestNode& n, float temperature = 0,
                                  const std::vector<int32_t>& tokens = {}) {
    grpc::ClientContext ctx;
    v1::StartSessionRequest req;
    for (int i = 0; i < 30 && tokens.empty(); ++i) req.add_token_ids((i * 31 + 5) % 500);
    for (int32_t t : tokens) req.add_token_ids(t);
    req.mutable_sampling()->set_temperature(temperature);
    req.mutable_sampling()->set_top_p(1.0f);
    req.mutable_sampling()->set_seed(11);
    v1::SessionInfo info;
    const grpc::Status s = n.stub->StartSession(&ctx, req, &info);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return info.session_id();
  }

  // The tokens of one Generate stream; its last message, if the session moved, in *moved.
  static absl::StatusOr<std::vector<int32_t>> Generate(TestNode& n, const std::string& id,
                                                       int count,
                                                       v1::SessionMoved* moved = nullptr) {
    grpc::ClientContext ctx;
    v1::GenerateRequest req;
    req.set_session_id(id);
    req.set_max_tokens(count);
    auto reader = n.stub->Generate(&ctx, req);
    std::vector<int32_t> out;
    v1::GenerateReply r;
    while (reader->Read(&r)) {
      if (r.has_moved()) {
        if (moved != nullptr) *moved = r.moved();
        continue;
      }
      out.push_back(r.token_id());
    }
    const grpc::Status s = reader->Finish();
    if (!s.ok()) return FromGrpc(s);
    return out;
  }

  static double Score(TestNode& n, const std::string& id, const std::vector<int32_t>& x) {
    grpc::ClientContext ctx;
    v1::ScoreRequest req;
    req.set_session_id(id);
    for (int32_t t : x) req.add_token_ids(t);
    v1::ScoreReply reply;
    const grpc::Status s = n.stub->Score(&ctx, req, &reply);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(reply.tokens(), static_cast<int>(x.size()));
    return reply.mean_nll();
  }

  static std::vector<int32_t> Tokens(TestNode& n, const std::string& id) {
    grpc::ClientContext ctx;
    v1::GetSessionRequest req;
    req.set_session_id(id);
    req.set_with_tokens(true);
    v1::SessionInfo info;
    EXPECT_TRUE(n.stub->GetSession(&ctx, req, &info).ok());
    return {info.token_ids().begin(), info.token_ids().end()};
  }

  static grpc::Status Migrate(TestNode& from, const std::string& id, const TestNode& to,
                              v1::MigrationMode mode, v1::MigrateReply* reply,
                              bool fallback = false, const std::string& address = "",
                              double timeout_seconds = 20) {
    grpc::ClientContext ctx;
    v1::MigrateRequest req;
    req.set_session_id(id);
    req.set_target_address(address.empty() ? to.address : address);
    req.set_mode(mode);
    req.set_allow_fallback(fallback);
    req.set_timeout_seconds(timeout_seconds);
    return from.stub->Migrate(&ctx, req, reply);
  }

  inline static std::string* fingerprint_ = nullptr;
  inline static testing::TinyPolicy* tiny_ = nullptr;
  inline static std::shared_ptr<const Retention>* retention_ = nullptr;  // tiny_'s policy, bank
};

}  // namespace riskkv
