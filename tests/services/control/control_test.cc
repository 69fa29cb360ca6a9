// The control plane: the policy store on disk (versions, banks by hash, restarts, bad puts) and
// its gRPC service (Get/List/Put, bank download, Watch pushing a new version).
#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/model/model_fingerprint.h"
#include "common/recovery/policy_codec.h"
#include "services/access/client_token.h"
#include "services/control/control_service.h"
#include "services/control/policy_store.h"
#include "tests/services/tiny_policy.h"
#include "tests/test_paths.h"

namespace riskkv {
namespace {

namespace fs = std::filesystem;

class Control : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto m = Model::Load((testing::TestdataDir() / "tiny_llama_deep.gguf").string(),
                         {.threads = 1, .activations = ActivationPrecision::kF32});
    ASSERT_TRUE(m.ok());
    tiny_ = new testing::TinyPolicy(testing::MakeTinyPolicy(**m, *ModelFingerprint(**m), 0));
    const fs::path tmp = fs::temp_directory_path() / ("riskkv_bank_" + std::to_string(getpid()));
    ASSERT_TRUE(tiny_->bank->Write(tmp.string()).ok());
    std::ifstream in(tmp, std::ios::binary);
    bank_bytes_ = new std::string((std::istreambuf_iterator<char>(in)), {});
    fs::remove(tmp);
  }
  static void TearDownTestSuite() {
    delete tiny_;
    delete bank_bytes_;
  }
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("riskkv_store_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static testing::TinyPolicy* tiny_;
  static std::string* bank_bytes_;
  fs::path dir_;
};
testing::TinyPolicy* Control::tiny_ = nullptr;
std::string* Control::bank_bytes_ = nullptr;

// `service` on a loopback port with the server's default message bound, and a client of it.
std::pair<std::unique_ptr<grpc::Server>, std::unique_ptr<v1::Control::Stub>> Serve(
    ControlService& service) {
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.RegisterService(&service);
  auto server = b.BuildAndStart();
  return {std::move(server),
          v1::Control::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                   grpc::InsecureChannelCredentials()))};
}

TEST_F(Control, StoresVersionsAndBanksAndSurvivesARestart) {
  {
    auto store = PolicyStore::Open(dir_.string());
    ASSERT_TRUE(store.ok()) << store.status();
    auto v1 = (*store)->Put(PolicyToProto(tiny_->policy), *bank_bytes_);
    ASSERT_TRUE(v1.ok()) << v1.status();
    EXPECT_EQ(v1->version, 1u);
    RetentionPolicy next = tiny_->policy;
    next.epsilon = 0.01;
    auto v2 = (*store)->Put(PolicyToProto(next), "");  // the store already holds the bank
    ASSERT_TRUE(v2.ok()) << v2.status();
    EXPECT_EQ(v2->version, 2u);
  }
  auto store = PolicyStore::Open(dir_.string());
  ASSERT_TRUE(store.ok()) << store.status();
  auto latest = (*store)->Get("tiny", 0);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->version, 2u);
  EXPECT_EQ(latest->epsilon, 0.01);
  // Read back from its file whole: groups, quality data and all.
  RetentionPolicy first = tiny_->policy;
  first.version = 1;
  EXPECT_EQ(*(*store)->Get("tiny", 1), first);
  EXPECT_EQ((*store)->Get("tiny", 3).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*store)->Get("other", 0).status().code(), absl::StatusCode::kNotFound);
  const auto list = (*store)->List();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].latest_version(), 2u);
  auto path = (*store)->BankPath(tiny_->bank->content_hash());
  ASSERT_TRUE(path.ok());
  std::ifstream in(*path, std::ios::binary);
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(in)), {}), *bank_bytes_);
}

TEST_F(Control, BankPutsCutShortByACrashAreRemovedAtOpen) {
  const fs::path banks = dir_ / "banks";
  fs::create_directories(banks);
  const fs::path dead = banks / "incoming.tmp.999999999.0";
  std::ofstream(dead) << "partial";
  ASSERT_TRUE(PolicyStore::Open(dir_.string()).ok());
  EXPECT_FALSE(fs::exists(dead));
}

TEST_F(Control, AMalformedStoredPolicyIsDataLossNamingItsFile) {
  RetentionPolicy p = tiny_->policy;
  p.version = 1;
  p.kept_layers.push_back(1);  // both kept and rebuilt
  const fs::path file = dir_ / "policies" / "tiny" / "1.pb";
  fs::create_directories(file.parent_path());
  ASSERT_TRUE(WritePolicy(p, file.string()).ok());
  auto store = PolicyStore::Open(dir_.string());
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(store.status().message().find(file.string() + ": retention policy: "),
            std::string_view::npos)
      << store.status();
}

TEST_F(Control, BadPutsAreRefusedAndChangeNothing) {
  auto store = *PolicyStore::Open(dir_.string());
  auto expect = [&](const RetentionPolicy& p, std::string_view bank, absl::StatusCode code,
                    const std::string& needle) {
    auto r = store->Put(PolicyToProto(p), bank);
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_EQ(r.status().code(), code) << r.status();
    EXPECT_NE(r.status().message().find(needle), std::string_view::npos) << r.status();
    // The caller learns what was wrong, not where this machine keeps its files.
    EXPECT_EQ(r.status().message().find(dir_.string()), std::string_view::npos) << r.status();
    EXPECT_EQ(r.status().message().find("tmp."), std::string_view::npos) << r.status();
  };
  expect(tiny_->policy, "", absl::StatusCode::kFailedPrecondition, "does not hold");
  RetentionPolicy p = tiny_->policy;
  p.policy_id = "../escape";
  expect(p, *bank_bytes_, absl::StatusCode::kInvalidArgument, "policy_id");
  p = tiny_->policy;
  p.kept_layers.push_back(1);  // both kept and rebuilt
  expect(p, *bank_bytes_, absl::StatusCode::kInvalidArgument, "both kept and rebuilt");
  std::string corrupt = *bank_bytes_;
  corrupt[100] ^= 1;
  expect(tiny_->policy, corrupt, absl::StatusCode::kInvalidArgument, "does not load");
  p = tiny_->policy;
  p.predictor_bank_sha256 = std::string(64, 'b');  // a sound bank, but not the one named
  expect(p, *bank_bytes_, absl::StatusCode::kInvalidArgument, "the bank's SHA-256 is");
  p = tiny_->policy;
  p.model_fingerprint = std::string(64, 'a');  // a bank for another model
  expect(p, *bank_bytes_, absl::StatusCode::kInvalidArgument, "does not load");
  EXPECT_TRUE(store->List().empty());

  ASSERT_TRUE(store->Put(PolicyToProto(tiny_->policy), *bank_bytes_).ok());
  p = tiny_->policy;
  p.version = 1;  // stale: the next version is 2
  expect(p, "", absl::StatusCode::kFailedPrecondition, "next version is 2");
  p.version = 2;
  EXPECT_TRUE(store->Put(PolicyToProto(p), "").ok());
}

TEST_F(Control, ServiceServesBanksAndPushesNewVersionsToWatchers) {
  auto store = *PolicyStore::Open(dir_.string());
  ControlService service(*store);
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.SetMaxReceiveMessageSize(64 << 20);
  b.RegisterService(&service);
  auto server = b.BuildAndStart();
  auto stub = v1::Control::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));

  v1::PutPolicyRequest put;
  *put.mutable_policy() = PolicyToProto(tiny_->policy);
  put.set_bank(*bank_bytes_);
  v1::PolicyRecord rec;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->PutPolicy(&ctx, put, &rec).ok());
    EXPECT_EQ(rec.policy().version(), 1u);
  }
  {
    // What a client gets is what was put, numbered.
    grpc::ClientContext ctx;
    v1::GetPolicyRequest get;
    get.set_policy_id("tiny");
    ASSERT_TRUE(stub->GetPolicy(&ctx, get, &rec).ok());
    auto got = PolicyFromProto(rec.policy(), 0, "");
    ASSERT_TRUE(got.ok()) << got.status();
    RetentionPolicy put_one = tiny_->policy;
    put_one.version = 1;
    EXPECT_EQ(*got, put_one);
  }
  // A watcher that knows nothing gets version 1 at once, then version 2 when it is put.
  grpc::ClientContext wctx;
  wctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  v1::WatchRequest w;
  w.set_policy_id("tiny");
  auto watch = stub->Watch(&wctx, w);
  ASSERT_TRUE(watch->Read(&rec));
  EXPECT_EQ(rec.policy().version(), 1u);
  std::thread putter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    grpc::ClientContext ctx;
    v1::PutPolicyRequest again;
    *again.mutable_policy() = PolicyToProto(tiny_->policy);
    again.mutable_policy()->set_epsilon(0.02);
    v1::PolicyRecord r;
    EXPECT_TRUE(stub->PutPolicy(&ctx, again, &r).ok());
  });
  ASSERT_TRUE(watch->Read(&rec));
  EXPECT_EQ(rec.policy().version(), 2u);
  EXPECT_EQ(rec.policy().epsilon(), 0.02);
  putter.join();
  wctx.TryCancel();
  watch->Finish();

  grpc::ClientContext bctx;
  v1::GetBankRequest gb;
  gb.set_sha256(tiny_->bank->content_hash());
  auto reader = stub->GetBank(&bctx, gb);
  std::string got;
  v1::BankChunk chunk;
  while (reader->Read(&chunk)) got += chunk.data();
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(got, *bank_bytes_);

  grpc::ClientContext nctx;
  gb.set_sha256(std::string(64, '0'));
  auto missing = stub->GetBank(&nctx, gb);
  while (missing->Read(&chunk)) {
  }
  EXPECT_EQ(missing->Finish().error_code(), grpc::StatusCode::NOT_FOUND);

  grpc::ClientContext lctx;
  v1::ListPoliciesReply list;
  ASSERT_TRUE(stub->ListPolicies(&lctx, {}, &list).ok());
  ASSERT_EQ(list.policies_size(), 1);
  EXPECT_EQ(list.policies(0).latest_version(), 2u);
  server->Shutdown();
}

// A bank in pieces (PutPolicyStream): stored as the unary put stores it, and a bad one refused at
// the piece that shows it, before the rest is sent, leaving nothing in the store.
TEST_F(Control, ServiceTakesABankInPiecesAndRefusesABadOneAtThePieceThatShowsIt) {
  auto store = *PolicyStore::Open(dir_.string());
  ControlService service(*store);
  auto [server, stub] = Serve(service);
  const std::string& bank = *bank_bytes_;
  ASSERT_GT(bank.size(), 2000u);
  // Sends the head and the bank's bytes [0, upto) in pieces of `piece`, then either ends the
  // stream or leaves it open (the server must answer without the rest); gives the status.
  auto put = [&](const RetentionPolicy& p, uint64_t announced, const std::string& bytes,
                 size_t upto, bool end, size_t piece = 777) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    v1::PolicyRecord rec;
    auto w = stub->PutPolicyStream(&ctx, &rec);
    v1::PutPolicyPart part;
    *part.mutable_head()->mutable_policy() = PolicyToProto(p);
    part.mutable_head()->set_bank_bytes(announced);
    bool ok = w->Write(part);
    for (size_t at = 0; ok && at < upto; at += piece) {
      part.set_bank(bytes.substr(at, std::min(piece, upto - at)));
      ok = w->Write(part);
    }
    if (end && ok) w->WritesDone();
    const auto t0 = std::chrono::steady_clock::now();
    const grpc::Status st = w->Finish();
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0)
        << "the server answered without waiting for the rest";
    return st;
  };
  auto expect = [&](const grpc::Status& st, grpc::StatusCode code, const std::string& needle) {
    EXPECT_EQ(st.error_code(), code) << st.error_message();
    EXPECT_NE(st.error_message().find(needle), std::string::npos) << st.error_message();
    EXPECT_EQ(st.error_message().find(dir_.string()), std::string::npos) << st.error_message();
  };
  std::string foreign = bank;
  foreign[0] = 'X';
  expect(put(tiny_->policy, bank.size(), foreign, 777, /*end=*/false),
         grpc::StatusCode::INVALID_ARGUMENT, "not a predictor bank");
  RetentionPolicy other = tiny_->policy;
  other.model_fingerprint = std::string(64, 'a');
  expect(put(other, bank.size(), bank, 1500, /*end=*/false), grpc::StatusCode::INVALID_ARGUMENT,
         "calibrated for model");
  expect(put(tiny_->policy, bank.size() + 10, bank, 777, /*end=*/false),
         grpc::StatusCode::INVALID_ARGUMENT, "were announced");
  const std::string longer = bank + "0123456789";
  expect(put(tiny_->policy, bank.size(), longer, longer.size(), /*end=*/true),
         grpc::StatusCode::INVALID_ARGUMENT, "runs past the");
  expect(put(tiny_->policy, bank.size(), bank, bank.size() / 2, /*end=*/true),
         grpc::StatusCode::INVALID_ARGUMENT, "the bank ended after");
  expect(put(tiny_->policy, kMaxBankBytes + 1, bank, 0, /*end=*/false),
         grpc::StatusCode::INVALID_ARGUMENT, "the store takes 1 to");
  std::string big(kMaxBankPieceBytes + 1, '\0');
  std::memcpy(big.data(), bank.data(), 100);
  expect(put(tiny_->policy, bank.size(), big, big.size(), /*end=*/false, big.size()),
         grpc::StatusCode::INVALID_ARGUMENT, "above the bound of 1048576");
  {
    grpc::ClientContext ctx;
    v1::PolicyRecord rec;
    auto w = stub->PutPolicyStream(&ctx, &rec);
    v1::PutPolicyPart part;
    part.set_bank(bank.substr(0, 100));
    w->Write(part);
    w->WritesDone();
    expect(w->Finish(), grpc::StatusCode::INVALID_ARGUMENT, "starts with its head");
  }
  EXPECT_TRUE(store->List().empty());
  for (const auto& e : fs::directory_iterator(dir_ / "banks")) {
    ADD_FAILURE() << "left in the store: " << e.path().filename();
  }

  ASSERT_TRUE(put(tiny_->policy, bank.size(), bank, bank.size(), /*end=*/true).ok());
  grpc::ClientContext bctx;
  v1::GetBankRequest gb;
  gb.set_sha256(tiny_->bank->content_hash());
  auto reader = stub->GetBank(&bctx, gb);
  std::string got;
  v1::BankChunk chunk;
  while (reader->Read(&chunk)) got += chunk.data();
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(got, bank);
  EXPECT_EQ(store->Get("tiny", 0)->version, 1u);
  server->Shutdown();
}

TEST_F(Control, ConcurrentPutsAreCapped) {
  auto store = *PolicyStore::Open(dir_.string());
  ControlService service(*store, nullptr, nullptr, /*max_concurrent_puts=*/1);
  auto [server, stub] = Serve(service);
  // One put holds the only slot, its bank half sent.
  grpc::ClientContext hctx;
  v1::PolicyRecord held_rec;
  auto held = stub->PutPolicyStream(&hctx, &held_rec);
  v1::PutPolicyPart part;
  *part.mutable_head()->mutable_policy() = PolicyToProto(tiny_->policy);
  part.mutable_head()->set_bank_bytes(bank_bytes_->size());
  ASSERT_TRUE(held->Write(part));
  const size_t half = bank_bytes_->size() / 2;
  part.set_bank(bank_bytes_->substr(0, half));
  ASSERT_TRUE(held->Write(part));
  // A second put, unary or streamed, is refused while it does (a malformed one: until the slot
  // is taken it is refused for what it is).
  auto unary = [&](const std::string& id) {
    grpc::ClientContext ctx;
    v1::PutPolicyRequest req;
    *req.mutable_policy() = PolicyToProto(tiny_->policy);
    req.mutable_policy()->set_policy_id(id);
    v1::PolicyRecord rec;
    return stub->PutPolicy(&ctx, req, &rec);
  };
  grpc::Status second = unary("../bad");
  for (int i = 0; i < 500 && second.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    second = unary("../bad");
  }
  EXPECT_EQ(second.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << second.error_message();
  EXPECT_NE(second.error_message().find("its limit of 1 policies at once"), std::string::npos)
      << second.error_message();
  {
    grpc::ClientContext ctx;
    v1::PolicyRecord rec;
    auto w = stub->PutPolicyStream(&ctx, &rec);
    v1::PutPolicyPart head;
    *head.mutable_head()->mutable_policy() = PolicyToProto(tiny_->policy);
    w->Write(head);
    w->WritesDone();
    EXPECT_EQ(w->Finish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  // The held put finishes; the slot serves the next one.
  part.set_bank(bank_bytes_->substr(half));
  ASSERT_TRUE(held->Write(part));
  held->WritesDone();
  const grpc::Status done = held->Finish();
  ASSERT_TRUE(done.ok()) << done.error_message();
  EXPECT_EQ(held_rec.policy().version(), 1u);
  EXPECT_EQ(unary("../bad").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  server->Shutdown();
}

// With an access file: only an operator puts policies (the attack of an anonymous
// `PutPolicy --assign-version` reaching the whole fleet), only nodes and operators follow them,
// every known identity may read them, and nobody without credentials does anything.
TEST_F(Control, OnlyAnOperatorPutsPoliciesAndOnlyNodesFollowThem) {
  fs::create_directories(dir_);
  std::ofstream((dir_ / "access").string()) << "client alice token alice-secret-0123456789\n"
                                               "node edge token edge-secret-0123456789\n"
                                               "operator ops token ops-secret-0123456789\n";
  auto access = AccessFile::Open((dir_ / "access").string());
  ASSERT_TRUE(access.ok()) << access.status();
  auto store = *PolicyStore::Open((dir_ / "store").string());
  prometheus::Registry registry;
  ControlMetrics metrics(registry);
  ControlService service(*store, &metrics, std::shared_ptr<AccessFile>(*std::move(access)));
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.SetMaxReceiveMessageSize(64 << 20);
  b.RegisterService(&service);
  auto server = b.BuildAndStart();
  const std::string address = "127.0.0.1:" + std::to_string(port);
  auto as = [&](const std::string& who) {
    std::shared_ptr<TokenFile> token;
    if (!who.empty()) {
      std::ofstream((dir_ / who).string()) << who << "-secret-0123456789\n";
      token = *TokenFile::Open((dir_ / who).string(), "token-file");
    }
    return v1::Control::NewStub(OpenChannel(address, grpc::InsecureChannelCredentials(), token));
  };
  v1::PutPolicyRequest put;
  *put.mutable_policy() = PolicyToProto(tiny_->policy);
  put.set_bank(*bank_bytes_);
  auto try_put = [&](v1::Control::Stub& stub) {
    grpc::ClientContext ctx;
    v1::PolicyRecord rec;
    return stub.PutPolicy(&ctx, put, &rec).error_code();
  };
  auto try_watch = [&](v1::Control::Stub& stub) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::WatchRequest w;
    w.set_policy_id("tiny");
    auto watch = stub.Watch(&ctx, w);
    v1::PolicyRecord rec;
    if (watch->Read(&rec)) {
      ctx.TryCancel();
      return grpc::StatusCode::OK;
    }
    return watch->Finish().error_code();
  };
  auto try_list = [&](v1::Control::Stub& stub) {
    grpc::ClientContext ctx;
    v1::ListPoliciesReply reply;
    return stub.ListPolicies(&ctx, {}, &reply).error_code();
  };
  auto anonymous = as(""), alice = as("alice"), edge = as("edge"), ops = as("ops");
  EXPECT_EQ(try_put(*anonymous), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(try_put(*alice), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(try_put(*edge), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(store->List().empty()) << "a refused put stored nothing";
  EXPECT_EQ(try_put(*ops), grpc::StatusCode::OK);
  EXPECT_EQ(store->List().size(), 1u);
  EXPECT_EQ(try_watch(*anonymous), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(try_watch(*alice), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(try_watch(*edge), grpc::StatusCode::OK);
  EXPECT_EQ(try_list(*anonymous), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(try_list(*alice), grpc::StatusCode::OK);
  {
    grpc::ClientContext ctx;
    v1::GetBankRequest req;
    req.set_sha256(tiny_->policy.predictor_bank_sha256);
    auto reader = alice->GetBank(&ctx, req);
    v1::BankChunk chunk;
    EXPECT_FALSE(reader->Read(&chunk)) << "a client downloads no bank";
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  const std::string text = prometheus::TextSerializer().Serialize(registry.Collect());
  EXPECT_NE(text.find("riskkv_control_requests_denied_total{reason=\"permission_denied\"} 4"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("riskkv_control_requests_denied_total{reason=\"unauthenticated\"} 3"),
            std::string::npos);
  server->Shutdown();
}

}  // namespace
}  // namespace riskkv
