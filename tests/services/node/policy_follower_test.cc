// A node following the control plane: versions pushed while it runs, the on-disk cache it serves
// while the control plane is down, catching up when it returns, and the versions and banks it
// must refuse (another model, corrupt or mislabelled bank bytes, a corrupt cache).
#include "services/node/policy_follower.h"

#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/model/model_fingerprint.h"
#include "common/recovery/policy_codec.h"
#include "services/control/control_service.h"
#include "services/control/policy_store.h"
#include "tests/services/tiny_policy.h"
#include "tests/test_paths.h"

namespace riskkv {
namespace {

namespace fs = std::filesystem;

std::string FileBytes(const PredictorBank& bank) {
  const fs::path tmp =
      fs::temp_directory_path() / ("riskkv_follow_bank_" + std::to_string(getpid()));
  EXPECT_TRUE(bank.Write(tmp.string()).ok());
  std::ifstream in(tmp, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  fs::remove(tmp);
  return bytes;
}

// A control plane on a fixed port that can be stopped and started again over the same store.
class ControlPlane {
 public:
  explicit ControlPlane(const fs::path& dir) {
    auto s = PolicyStore::Open(dir.string());
    EXPECT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
    service_ = std::make_unique<ControlService>(*store_);
  }
  ~ControlPlane() { Stop(); }
  void Start() {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:" + std::to_string(port_), grpc::InsecureServerCredentials(),
                       &port_);
    b.RegisterService(service_.get());
    server_ = b.BuildAndStart();
    ASSERT_TRUE(server_ != nullptr);
    ASSERT_GT(port_, 0);
  }
  void Stop() {
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
    server_.reset();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  PolicyStore& store() { return *store_; }

 private:
  std::unique_ptr<PolicyStore> store_;
  std::unique_ptr<ControlService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

// A control plane that pushes one version and answers GetBank with the given bytes.
// Serves `service` on an ephemeral loopback port and gives its address.
std::unique_ptr<grpc::Server> Serve(grpc::Service& service, std::string* address) {
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.RegisterService(&service);
  auto server = b.BuildAndStart();
  EXPECT_GT(port, 0);
  *address = "127.0.0.1:" + std::to_string(port);
  return server;
}

class FakeControl final : public v1::Control::Service {
 public:
  FakeControl(const RetentionPolicy& policy, std::string bank_bytes)
      : policy_(PolicyToProto(policy)), bank_(std::move(bank_bytes)) {}
  grpc::Status Watch(grpc::ServerContext* ctx, const v1::WatchRequest*,
                     grpc::ServerWriter<v1::PolicyRecord>* writer) override {
    ctx->AddInitialMetadata(kWatchMetadataKey, "1");
    v1::PolicyRecord r;
    *r.mutable_policy() = policy_;
    writer->Write(r);
    while (!ctx->IsCancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return grpc::Status::OK;
  }
  grpc::Status GetBank(grpc::ServerContext*, const v1::GetBankRequest*,
                       grpc::ServerWriter<v1::BankChunk>* writer) override {
    ++bank_requests;
    v1::BankChunk c;
    c.set_data(bank_);
    writer->Write(c);
    return grpc::Status::OK;
  }

  std::atomic<int> bank_requests = 0;

 private:
  v1::RetentionPolicy policy_;
  std::string bank_;
};

class Follower : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto m = Model::Load((testing::TestdataDir() / "tiny_llama_deep.gguf").string(),
                         {.threads = 1, .activations = ActivationPrecision::kF32});
    ASSERT_TRUE(m.ok());
    model_ = m->release();
    fingerprint_ = new std::string(*ModelFingerprint(*model_));
    tiny_ = new testing::TinyPolicy(testing::MakeTinyPolicy(*model_, *fingerprint_, 0));
    bank_bytes_ = new std::string(FileBytes(*tiny_->bank));
  }
  static void TearDownTestSuite() {
    delete bank_bytes_;
    delete tiny_;
    delete fingerprint_;
    delete model_;
  }
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("riskkv_follow_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  PolicyFollowerOptions Options(const std::string& address) const {
    PolicyFollowerOptions o;
    o.control_address = address;
    o.policy_id = "tiny";
    o.cache_dir = (dir_ / "cache").string();
    o.model_fingerprint = *fingerprint_;
    o.n_layers = static_cast<int32_t>(model_->config().n_layers);
    o.min_backoff_seconds = 0.05;
    o.max_backoff_seconds = 0.2;
    return o;
  }

  // A follower that records every version it applies.
  struct Watched {
    std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
    std::unique_ptr<NodeMetrics> metrics = std::make_unique<NodeMetrics>(*registry, "tiny");
    std::mutex mu;
    std::vector<std::shared_ptr<const Retention>> applied;
    std::unique_ptr<PolicyFollower> follower;

    std::string Metrics() const {
      return prometheus::TextSerializer().Serialize(registry->Collect());
    }
    bool Has(const std::string& line) const { return Metrics().find(line) != std::string::npos; }
    // Waits up to 10 s for `done`.
    template <typename F>
    bool WaitFor(F done) {
      for (int i = 0; i < 1000; ++i) {
        if (done()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      return done();
    }
  };
  // Serves `fake`, follows it until the follower counts one rejected version, and checks that
  // nothing was applied or cached.
  void ExpectRejected(FakeControl& fake, const std::string& what) {
    std::string address;
    auto server = Serve(fake, &address);
    auto w = Follow(Options(address));
    w->follower->Start();
    EXPECT_TRUE(w->WaitFor([&] {
      return w->Has("riskkv_policy_updates_total{model=\"tiny\",outcome=\"rejected\"} 1");
    })) << what;
    EXPECT_EQ(w->follower->version(), 0u) << what;
    w->follower->Stop();
    server->Shutdown(std::chrono::system_clock::now());
    EXPECT_FALSE(fs::exists(dir_ / "cache" / "policies" / "tiny.pb")) << what;
  }

  std::unique_ptr<Watched> Follow(PolicyFollowerOptions o) {
    auto w = std::make_unique<Watched>();
    auto* raw = w.get();
    auto f = PolicyFollower::Create(
        std::move(o),
        [raw](std::shared_ptr<const Retention> r) {
          std::lock_guard lock(raw->mu);
          raw->applied.push_back(std::move(r));
        },
        w->metrics.get());
    EXPECT_TRUE(f.ok()) << f.status();
    w->follower = std::move(*f);
    return w;
  }
  // Stores version 1 with its bank, starts `control` and lets a follower cache it.
  void FillCacheWithVersion1(ControlPlane& control) {
    ASSERT_TRUE(control.store().Put(PolicyToProto(Policy(0.01)), *bank_bytes_).ok());
    control.Start();
    auto first = Follow(Options(control.address()));
    first->follower->Start();
    ASSERT_TRUE(first->WaitFor([&] { return first->follower->version() == 1; }));
  }
  static RetentionPolicy Policy(double epsilon) {
    RetentionPolicy p = tiny_->policy;
    p.version = 0;
    p.epsilon = epsilon;
    return p;
  }

  static Model* model_;
  static std::string* fingerprint_;
  static testing::TinyPolicy* tiny_;
  static std::string* bank_bytes_;
  fs::path dir_;
};
Model* Follower::model_ = nullptr;
std::string* Follower::fingerprint_ = nullptr;
testing::TinyPolicy* Follower::tiny_ = nullptr;
std::string* Follower::bank_bytes_ = nullptr;

TEST_F(Follower, AppliesEveryPushedVersionAndCachesIt) {
  ControlPlane control(dir_ / "store");
  ASSERT_TRUE(control.store().Put(PolicyToProto(Policy(0.01)), *bank_bytes_).ok());
  control.Start();
  auto w = Follow(Options(control.address()));
  auto cached = w->follower->LoadCache();
  ASSERT_TRUE(cached.ok()) << cached.status();
  EXPECT_EQ(*cached, nullptr);  // nothing cached yet
  w->follower->Start();
  ASSERT_TRUE(w->WaitFor([&] { return w->follower->version() == 1; }));
  EXPECT_TRUE(w->WaitFor([&] { return w->Has("riskkv_control_connected{model=\"tiny\"} 1"); }));
  const std::string sha = tiny_->bank->content_hash();
  EXPECT_TRUE(fs::exists(dir_ / "cache" / "policies" / "tiny.pb"));
  EXPECT_TRUE(fs::exists(dir_ / "cache" / "banks" / (sha + ".rkvbank")));

  // A new version put while the node runs reaches it.
  ASSERT_TRUE(control.store().Put(PolicyToProto(Policy(0.02)), "").ok());
  ASSERT_TRUE(w->WaitFor([&] { return w->follower->version() == 2; }));
  {
    std::lock_guard lock(w->mu);
    ASSERT_EQ(w->applied.size(), 2u);
    EXPECT_EQ(w->applied[0]->policy.version, 1u);
    EXPECT_EQ(w->applied[1]->policy.version, 2u);
    EXPECT_EQ(w->applied[1]->policy.epsilon, 0.02);
    // Arrived whole over the Watch, quality data included.
    RetentionPolicy second = Policy(0.02);
    second.version = 2;
    EXPECT_EQ(w->applied[1]->policy, second);
    EXPECT_EQ(w->applied[1]->groups.size(), second.rebuilt_groups.size());
    EXPECT_EQ(w->applied[1]->bank->content_hash(), sha);
  }
  EXPECT_TRUE(w->Has("riskkv_policy_updates_total{model=\"tiny\",outcome=\"applied\"} 2"));
  w->follower->Stop();
  EXPECT_TRUE(w->Has("riskkv_control_connected{model=\"tiny\"} 0"));
  // Only finished files are left in the cache.
  for (const auto& e : fs::recursive_directory_iterator(dir_ / "cache")) {
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
  }
}

TEST_F(Follower, ServesTheCacheWhileTheControlPlaneIsDownAndCatchesUpWhenItReturns) {
  ControlPlane control(dir_ / "store");
  FillCacheWithVersion1(control);
  control.Stop();

  // A node restarted while the control plane is down starts from its cache.
  auto w = Follow(Options(control.address()));
  auto cached = w->follower->LoadCache();
  ASSERT_TRUE(cached.ok()) << cached.status();
  ASSERT_NE(*cached, nullptr);
  EXPECT_EQ((*cached)->policy.version, 1u);
  EXPECT_EQ((*cached)->bank->content_hash(), tiny_->bank->content_hash());
  w->follower->Start();
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // a few failed reconnections
  EXPECT_EQ(w->follower->version(), 1u);
  EXPECT_TRUE(w->Has("riskkv_control_connected{model=\"tiny\"} 0"));

  // Meanwhile a version 2 was stored; once the control plane is back the node catches up.
  ASSERT_TRUE(control.store().Put(PolicyToProto(Policy(0.03)), "").ok());
  control.Start();
  ASSERT_TRUE(w->WaitFor([&] { return w->follower->version() == 2; }));
  EXPECT_TRUE(w->WaitFor([&] { return w->Has("riskkv_control_connected{model=\"tiny\"} 1"); }));
  std::lock_guard lock(w->mu);
  ASSERT_EQ(w->applied.size(), 1u);
  EXPECT_EQ(w->applied[0]->policy.epsilon, 0.03);
}

TEST_F(Follower, APolicyThatRebuildsNothingNeedsNoBank) {
  ControlPlane control(dir_ / "store");
  const RetentionPolicy exact =
      testing::KeepingEveryLayer(Policy(0.01), static_cast<int32_t>(model_->config().n_layers));
  ASSERT_TRUE(control.store().Put(PolicyToProto(exact), "").ok());
  control.Start();
  auto w = Follow(Options(control.address()));
  w->follower->Start();
  ASSERT_TRUE(w->WaitFor([&] { return w->follower->version() == 1; }));
  {
    std::lock_guard lock(w->mu);
    ASSERT_EQ(w->applied.size(), 1u);
    EXPECT_EQ(w->applied[0]->bank, nullptr);
  }
  w->follower->Stop();
  auto cached = Follow(Options(control.address()))->follower->LoadCache();
  ASSERT_TRUE(cached.ok()) << cached.status();
  ASSERT_NE(*cached, nullptr);
  EXPECT_EQ((*cached)->policy.kept_layers, exact.kept_layers);
}

TEST_F(Follower, RefusesAVersionForAnotherModelAndKeepsTheOneInUse) {
  ControlPlane control(dir_ / "store");
  control.Start();
  auto w = Follow(Options(control.address()));
  w->follower->Start();
  // Version 1 is for other weights (a bank fitted under another fingerprint).
  const std::string other(64, 'a');
  auto foreign = testing::MakeTinyPolicy(*model_, other, 0);
  ASSERT_TRUE(control.store().Put(PolicyToProto(foreign.policy), FileBytes(*foreign.bank)).ok());
  ASSERT_TRUE(w->WaitFor([&] {
    return w->Has("riskkv_policy_updates_total{model=\"tiny\",outcome=\"rejected\"} 1");
  }));
  EXPECT_EQ(w->follower->version(), 0u);
  EXPECT_FALSE(fs::exists(dir_ / "cache" / "policies" / "tiny.pb"));
  // Version 2 is this model's.
  ASSERT_TRUE(control.store().Put(PolicyToProto(Policy(0.01)), *bank_bytes_).ok());
  ASSERT_TRUE(w->WaitFor([&] { return w->follower->version() == 2; }));
  std::lock_guard lock(w->mu);
  ASSERT_EQ(w->applied.size(), 1u);
  EXPECT_EQ(w->applied[0]->policy.model_fingerprint, *fingerprint_);
}

TEST_F(Follower, RefusesBankBytesThatAreCorruptOrDoNotHashToTheirName) {
  RetentionPolicy p = tiny_->policy;
  p.version = 1;
  std::string corrupt = *bank_bytes_;
  corrupt[corrupt.size() / 2] ^= 0x5a;
  // A valid bank for this model, but not the one the policy names.
  auto f16 = testing::MakeTinyPolicy(*model_, *fingerprint_, 0, DType::kF16);
  ASSERT_NE(f16.bank->content_hash(), p.predictor_bank_sha256);
  struct Case {
    std::string bytes, expect;
  };
  for (const Case& c : {Case{corrupt, "does not load"},
                        Case{FileBytes(*f16.bank), "sent bank bytes with SHA-256"}}) {
    FakeControl fake(p, c.bytes);
    ExpectRejected(fake, c.expect);
    // Nothing of the bad bank stays in the cache.
    EXPECT_TRUE(fs::is_empty(dir_ / "cache" / "banks")) << c.expect;
  }
}

TEST_F(Follower, RefusesAMalformedVersionBeforeFetchingItsBank) {
  // A layer both kept and rebuilt, a wire form no node decodes, and one in the measured path.
  const std::vector<std::function<void(RetentionPolicy&)>> malformations = {
      [](RetentionPolicy& p) { p.kept_layers.push_back(1); },
      [](RetentionPolicy& p) { p.wire_form = "int3"; },
      [](RetentionPolicy& p) {
        RetentionPolicy::PathPoint bad;
        bad.groups = 1;
        bad.wire_form = "bf8";
        p.path.push_back(bad);
      },
  };
  for (size_t i = 0; i < malformations.size(); ++i) {
    SCOPED_TRACE(i);
    RetentionPolicy p = tiny_->policy;
    p.version = 1;
    malformations[i](p);
    FakeControl fake(p, *bank_bytes_);
    ExpectRejected(fake, "malformation " + std::to_string(i));
    EXPECT_EQ(fake.bank_requests, 0);
  }
}

TEST_F(Follower, ACorruptCacheIsReportedAndHealedFromTheControlPlane) {
  ControlPlane control(dir_ / "store");
  FillCacheWithVersion1(control);
  const fs::path bank = dir_ / "cache" / "banks" / (tiny_->bank->content_hash() + ".rkvbank");
  {
    std::fstream f(bank, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x7f');
  }
  auto w = Follow(Options(control.address()));
  auto cached = w->follower->LoadCache();
  ASSERT_FALSE(cached.ok());
  EXPECT_NE(cached.status().message().find(bank.string()), std::string::npos) << cached.status();
  w->follower->Start();
  ASSERT_TRUE(w->WaitFor([&] { return w->follower->version() == 1; }));
  w->follower->Stop();
  auto healed = Follow(Options(control.address()))->follower->LoadCache();
  ASSERT_TRUE(healed.ok()) << healed.status();
  ASSERT_NE(*healed, nullptr);
}

TEST_F(Follower, AbandonedTemporariesAreRemovedAtStart) {
  const fs::path banks = dir_ / "cache" / "banks";
  fs::create_directories(banks);
  const fs::path dead = banks / "x.rkvbank.tmp.999999999.0";
  // This process's PID: a restarted container's server has the PID (often 1) of the one whose
  // crash left the file, and has written nothing yet.
  const fs::path own = banks / ("y.rkvbank.tmp." + std::to_string(getpid()) + ".0");
  const fs::path live = banks / ("z.rkvbank.tmp." + std::to_string(getppid()) + ".0");
  for (const fs::path& p : {dead, own, live}) std::ofstream(p) << "partial";
  auto w = Follow(Options("127.0.0.1:1"));
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_FALSE(fs::exists(own));
  EXPECT_TRUE(fs::exists(live));  // another running process may still be writing it
}

TEST_F(Follower, BadOptionsAreRefused) {
  auto o = Options("127.0.0.1:1");
  o.policy_id = "../escape";
  auto f = PolicyFollower::Create(o, nullptr, nullptr);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("policy_id '../escape'"), std::string::npos);
  o = Options("");
  EXPECT_FALSE(PolicyFollower::Create(o, nullptr, nullptr).ok());
  o = Options("127.0.0.1:1");
  o.min_backoff_seconds = 0;
  EXPECT_FALSE(PolicyFollower::Create(o, nullptr, nullptr).ok());
}

}  // namespace
}  // namespace riskkv
