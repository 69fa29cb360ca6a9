// A node following the control plane (see policy_follower.h).
#include "services/node/policy_follower.h"

#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/atomic_file.h"
#include "common/base/status_macros.h"
#include "common/recovery/policy_codec.h"
#include "common/recovery/retention_policy.h"
#include "services/grpc_status.h"
#include "spdlog/spdlog.h"

namespace riskkv {
namespace {

namespace fs = std::filesystem;

bool Transient(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable ||
         s.code() == absl::StatusCode::kDeadlineExceeded ||
         s.code() == absl::StatusCode::kCancelled;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PolicyFollower>> PolicyFollower::Create(
    PolicyFollowerOptions options, Apply apply, NodeMetrics* metrics) {
  if (options.control_address.empty()) {
    return absl::InvalidArgumentError("the control plane's address is empty");
  }
  RETURN_IF_ERROR(ValidatePolicyId(options.policy_id));
  if (options.cache_dir.empty()) return absl::InvalidArgumentError("the cache directory is empty");
  if (!(options.min_backoff_seconds > 0 &&
        options.max_backoff_seconds >= options.min_backoff_seconds)) {
    return absl::InvalidArgumentError("backoff must satisfy 0 < min <= max");
  }
  if (options.n_layers < 1 || options.model_fingerprint.empty()) {
    return absl::InvalidArgumentError("the follower needs the node's model");
  }
  std::error_code ec;
  fs::create_directories(fs::path(options.cache_dir) / "policies", ec);
  if (!ec) fs::create_directories(fs::path(options.cache_dir) / "banks", ec);
  if (ec) {
    return absl::PermissionDeniedError("cannot create the policy cache in " + options.cache_dir +
                                       ": " + ec.message());
  }
  for (const char* sub : {"policies", "banks"}) {
    RemoveAbandonedTemporaries((fs::path(options.cache_dir) / sub).string());
  }
  return std::unique_ptr<PolicyFollower>(
      new PolicyFollower(std::move(options), std::move(apply), metrics));
}

PolicyFollower::PolicyFollower(PolicyFollowerOptions options, Apply apply, NodeMetrics* metrics)
    : options_(std::move(options)), apply_(std::move(apply)), metrics_(metrics) {
  if (metrics_) metrics_->SetControlConnected(false);
}

PolicyFollower::~PolicyFollower() { Stop(); }

std::string PolicyFollower::PolicyPath() const {
  return (fs::path(options_.cache_dir) / "policies" / (options_.policy_id + ".pb")).string();
}

std::string PolicyFollower::BankPath(const std::string& sha256) const {
  return (fs::path(options_.cache_dir) / "banks" / (sha256 + ".rkvbank")).string();
}

uint64_t PolicyFollower::version() const {
  absl::MutexLock lock(&mu_);
  return version_;
}

absl::StatusOr<std::shared_ptr<const Retention>> PolicyFollower::LoadCache() {
  const std::string path = PolicyPath();
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::shared_ptr<const Retention>();
  ASSIGN_OR_RETURN(RetentionPolicy policy,
                   ReadPolicy(path, options_.n_layers, options_.model_fingerprint));
  if (policy.policy_id != options_.policy_id) {
    return absl::InvalidArgumentError(path + " holds policy '" + policy.policy_id + "', not '" +
                                      options_.policy_id + "'");
  }
  const std::string bank_path =
      PolicyNeedsBank(policy) ? BankPath(policy.predictor_bank_sha256) : "";
  std::unique_ptr<PredictorBank> bank;
  if (!bank_path.empty()) {
    ASSIGN_OR_RETURN(bank, PredictorBank::Open(bank_path, options_.model_fingerprint));
  }
  auto retention = MakeRetention(std::move(policy), std::move(bank));
  if (!retention.ok()) {
    return absl::Status(retention.status().code(),
                        path + (bank_path.empty() ? "" : " with " + bank_path) + ": " +
                            std::string(retention.status().message()));
  }
  absl::MutexLock apply_lock(&apply_mu_);
  absl::MutexLock lock(&mu_);
  version_ = (*retention)->policy.version;
  return retention;
}

void PolicyFollower::Start() {
  absl::MutexLock lock(&mu_);
  if (thread_.joinable() || stopping_) return;
  thread_ = std::thread([this] { Run(); });
}

void PolicyFollower::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (grpc::ClientContext* c : {watch_, fetch_}) {
      if (c != nullptr) c->TryCancel();
    }
  }
  if (thread_.joinable()) thread_.join();
}

bool PolicyFollower::SetActive(grpc::ClientContext** slot, grpc::ClientContext* ctx) {
  absl::MutexLock lock(&mu_);
  if (stopping_ && ctx != nullptr) return false;
  *slot = ctx;
  return true;
}

bool PolicyFollower::Sleep(double seconds) {
  absl::MutexLock lock(&mu_);
  return !mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Seconds(seconds));
}

void PolicyFollower::Run() {
  grpc::ChannelArguments args;
  // A control plane that vanishes without closing the connection is noticed within ~30 s.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);  // a Watch sends no data for hours
  auto channel =
      OpenChannel(options_.control_address,
                  options_.credentials ? options_.credentials : grpc::InsecureChannelCredentials(),
                  options_.token, args);
  auto stub = v1::Control::NewStub(channel);
  std::mt19937_64 rng(std::random_device{}());
  double backoff = options_.min_backoff_seconds;
  std::string last_error;
  bool fetch_failed = false;  // the last stream ended on a failed bank download
  while (true) {
    grpc::ClientContext ctx;
    if (!SetActive(&watch_, &ctx)) break;
    v1::WatchRequest req;
    req.set_policy_id(options_.policy_id);
    req.set_known_version(version());
    auto reader = stub->Watch(&ctx, req);
    // The control plane answers a Watch with initial metadata at once, so a stream that has
    // them is up even before any version arrives.
    reader->WaitForInitialMetadata();
    const bool connected = ctx.GetServerInitialMetadata().count(kWatchMetadataKey) > 0;
    if (connected) {
      spdlog::info("riskkv-node: following policy {} at control plane {} (in use: v{})",
                   options_.policy_id, options_.control_address, version());
      if (metrics_) metrics_->SetControlConnected(true);
      // A download that keeps failing (a bank too large for its deadline on this link) must
      // not be retried at the pace of a fresh connection.
      if (!fetch_failed) backoff = options_.min_backoff_seconds;
      last_error.clear();
      WarnIfStoreWasReset(*stub);
    }
    absl::Status lost;
    v1::PolicyRecord record;
    while (lost.ok() && reader->Read(&record)) {
      if (record.policy().version() <= version()) continue;
      const absl::Status s = Accept(*stub, record.policy());
      if (s.ok()) {
        spdlog::info("riskkv-node: now using policy {} v{} (bank {})", options_.policy_id,
                     record.policy().version(),
                     record.policy().predictor_bank_sha256().substr(0, 12));
      } else if (Transient(s)) {
        lost = s;  // fetched again after reconnecting
      } else {
        spdlog::error("riskkv-node: rejected {} v{} from the control plane, keeping v{}: {}",
                      options_.policy_id, record.policy().version(), version(), s.ToString());
        if (metrics_) metrics_->PolicyUpdate("rejected");
      }
    }
    if (!lost.ok()) ctx.TryCancel();
    fetch_failed = !lost.ok();
    const grpc::Status st = reader->Finish();
    SetActive(&watch_, nullptr);
    if (metrics_) metrics_->SetControlConnected(false);
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) break;
    }
    const std::string why = !lost.ok() ? lost.ToString()
                            : st.ok()  ? std::string("the control plane ended the Watch")
                                       : st.error_message();
    std::uniform_real_distribution<double> jitter(0.8, 1.2);
    const double wait = backoff * jitter(rng);
    if (connected || why != last_error) {
      spdlog::warn(
          "riskkv-node: control plane {} unreachable ({}); serving policy v{} meanwhile, "
          "retrying with backoff (next in {:.2f} s)",
          options_.control_address, why, version(), wait);
    }
    last_error = why;
    if (!Sleep(wait)) break;
    backoff = std::min(backoff * 2, options_.max_backoff_seconds);
  }
}

void PolicyFollower::WarnIfStoreWasReset(v1::Control::Stub& stub) {
  const uint64_t mine = version();
  if (mine == 0) return;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + Seconds(10));
  v1::GetPolicyRequest req;
  req.set_policy_id(options_.policy_id);
  v1::PolicyRecord latest;
  const grpc::Status st = stub.GetPolicy(&ctx, req, &latest);
  const uint64_t theirs = st.ok() ? latest.policy().version() : 0;
  if (theirs < mine && (st.ok() || st.error_code() == grpc::StatusCode::NOT_FOUND)) {
    spdlog::warn(
        "riskkv-node: the control plane's latest version of {} is {}, below the v{} this node "
        "uses: its store was reset or restored from an older copy; this node keeps v{} and "
        "applies versions above it only",
        options_.policy_id, theirs, mine, mine);
  }
}

absl::StatusOr<std::shared_ptr<const PredictorBank>> PolicyFollower::Bank(
    v1::Control::Stub& stub, const std::string& sha256) {
  const std::string path = BankPath(sha256);
  auto cached = PredictorBank::Open(path, options_.model_fingerprint);
  if (cached.ok() && (*cached)->content_hash() == sha256) {
    return std::shared_ptr<const PredictorBank>(std::move(*cached));
  }
  if (cached.status().code() != absl::StatusCode::kNotFound) {
    spdlog::warn(
        "riskkv-node: cached bank {} does not load ({}); fetching it again", path,
        cached.ok() ? "content hash " + (*cached)->content_hash() : cached.status().ToString());
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + Seconds(options_.bank_timeout_seconds));
  if (!SetActive(&fetch_, &ctx)) return absl::CancelledError("the node is stopping");
  // A writer that is not committed removes its temporary, on every return below.
  absl::StatusOr<AtomicFileWriter> out = AtomicFileWriter::Create(path);
  if (!out.ok()) {
    SetActive(&fetch_, nullptr);
    return out.status();
  }
  absl::Status status;
  {
    v1::GetBankRequest req;
    req.set_sha256(sha256);
    auto reader = stub.GetBank(&ctx, req);
    v1::BankChunk chunk;
    int64_t total = 0;
    while (reader->Read(&chunk)) {
      total += static_cast<int64_t>(chunk.data().size());
      if (total > options_.max_bank_bytes) {
        status = absl::ResourceExhaustedError(absl::StrCat(
            "bank ", sha256, " is larger than the limit of ", options_.max_bank_bytes, " bytes"));
      } else {
        status = out->Append(chunk.data());
      }
      if (!status.ok()) {
        ctx.TryCancel();
        break;
      }
    }
    const grpc::Status st = reader->Finish();
    if (status.ok() && !st.ok()) {
      status = absl::Status(FromGrpc(st).code(),
                            "fetching bank " + sha256 + " failed: " + st.error_message());
    }
  }
  SetActive(&fetch_, nullptr);
  if (!status.ok()) return status;
  auto bank = PredictorBank::Open(out->temp_path(), options_.model_fingerprint);
  if (!bank.ok()) {
    return absl::InvalidArgumentError("the control plane's bank " + sha256 +
                                      " does not load: " + bank.status().ToString());
  }
  if ((*bank)->content_hash() != sha256) {
    return absl::DataLossError("the control plane sent bank bytes with SHA-256 " +
                               (*bank)->content_hash() + " for " + sha256);
  }
  RETURN_IF_ERROR(out->Commit());  // the mapping stays valid under the new name
  return std::shared_ptr<const PredictorBank>(std::move(*bank));
}

absl::Status PolicyFollower::Accept(v1::Control::Stub& stub, const v1::RetentionPolicy& policy) {
  const std::string name = absl::StrCat("policy ", policy.policy_id(), " v", policy.version());
  if (policy.policy_id() != options_.policy_id) {
    return absl::InvalidArgumentError(name + " is not the policy this node follows (" +
                                      options_.policy_id + ")");
  }
  // Checked before the bank is fetched: a policy for other weights costs no download.
  auto checked = PolicyFromProto(policy, options_.n_layers, options_.model_fingerprint);
  if (!checked.ok()) {
    return absl::Status(checked.status().code(),
                        name + ": " + std::string(checked.status().message()));
  }
  std::shared_ptr<const PredictorBank> bank;  // none for a policy that needs none
  if (PolicyNeedsBank(*checked)) {
    ASSIGN_OR_RETURN(bank, Bank(stub, policy.predictor_bank_sha256()));
  }
  ASSIGN_OR_RETURN(auto retention, MakeRetention(*std::move(checked), std::move(bank)));
  RETURN_IF_ERROR(WriteFileAtomically(PolicyPath(), policy.SerializeAsString()));
  absl::MutexLock apply_lock(&apply_mu_);
  if (policy.version() <= version()) return absl::OkStatus();
  apply_(retention);
  PruneBanks(policy.predictor_bank_sha256());
  if (metrics_) metrics_->PolicyUpdate("applied");
  absl::MutexLock lock(&mu_);
  version_ = policy.version();
  return absl::OkStatus();
}

void PolicyFollower::PruneBanks(const std::string& keep) {
  // Banks that no cached policy names (other ids, even other models, may share the directory).
  std::set<std::string> named = {keep};
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(fs::path(options_.cache_dir) / "policies", ec)) {
    if (f.path().extension() != ".pb") continue;
    // Other ids' policies may be for other models, so none is checked against this one's.
    if (auto p = ReadPolicy(f.path().string(), 0, ""); p.ok()) {
      named.insert(p->predictor_bank_sha256);
    }
  }
  for (const auto& f : fs::directory_iterator(fs::path(options_.cache_dir) / "banks", ec)) {
    if (f.path().extension() == ".rkvbank" && !named.count(f.path().stem().string())) {
      std::error_code ignored;
      fs::remove(f.path(), ignored);
    }
  }
}

}  // namespace riskkv
