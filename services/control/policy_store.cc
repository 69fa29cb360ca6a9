// The control plane's store (see policy_store.h).
#include "services/control/policy_store.h"

#include <chrono>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/time.h"
#include "common/base/atomic_file.h"
#include "common/base/status_macros.h"
#include "common/recovery/policy_codec.h"
#include "common/recovery/predictor_bank.h"
#include "common/recovery/retention_policy.h"

namespace riskkv {
namespace {

namespace fs = std::filesystem;

// Errors go to the caller without this machine's paths.
absl::Status HideStorePaths(const absl::Status& st, const std::string& temp,
                            const std::string& dir) {
  std::string m(st.message());
  if (!temp.empty()) m = absl::StrReplaceAll(m, {{temp, "the received bank"}});
  return absl::Status(st.code(), absl::StrReplaceAll(m, {{dir, "the store's directory"}}));
}

}  // namespace

BankUpload::BankUpload(AtomicFileWriter out, std::string fingerprint, uint64_t bytes,
                       std::string store_dir)
    : out_(std::move(out)),
      fingerprint_(std::move(fingerprint)),
      store_dir_(std::move(store_dir)),
      bytes_(bytes) {}

absl::Status BankUpload::HidePaths(const absl::Status& st) const {
  return HideStorePaths(st, out_.temp_path(), store_dir_);
}

absl::Status BankUpload::Append(std::string_view bytes) {
  RETURN_IF_ERROR(failed_);
  if (bytes.size() > bytes_ - received_) {
    failed_ = absl::InvalidArgumentError(
        absl::StrCat("the bank runs past the ", bytes_, " bytes announced"));
    return failed_;
  }
  if (head_.size() < PredictorBank::HeadBytes()) {
    head_.append(bytes.substr(0, PredictorBank::HeadBytes() - head_.size()));
    if (absl::Status st =
            PredictorBank::CheckHead("the received bank", head_, bytes_, fingerprint_);
        !st.ok()) {
      failed_ = absl::InvalidArgumentError("the bank does not load for this policy: " +
                                           std::string(st.message()));
      return failed_;
    }
  }
  if (absl::Status st = out_.Append(bytes); !st.ok()) {
    failed_ = HidePaths(st);
    return failed_;
  }
  received_ += bytes.size();
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PolicyStore>> PolicyStore::Open(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(fs::path(dir) / "policies", ec);
  fs::create_directories(fs::path(dir) / "banks", ec);
  if (ec) return absl::InternalError("cannot create the store in " + dir + ": " + ec.message());
  std::unique_ptr<PolicyStore> store(new PolicyStore(dir));
  absl::MutexLock lock(&store->mu_);  // uncontended: no other thread has the store yet
  RemoveAbandonedTemporaries((fs::path(dir) / "banks").string());  // puts cut short by a crash
  for (const auto& e : fs::directory_iterator(fs::path(dir) / "banks")) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() == ".rkvbank" && name.size() == 64 + 8) {
      store->banks_.insert(name.substr(0, 64));
    }
  }
  for (const auto& idir : fs::directory_iterator(fs::path(dir) / "policies")) {
    if (!idir.is_directory()) continue;
    for (const auto& f : fs::directory_iterator(idir.path())) {
      if (f.path().extension() != ".pb") continue;
      auto p = ReadPolicy(f.path().string(), 0, "");  // no model: the layers the policy implies
      if (!p.ok()) return absl::DataLossError(p.status().message());
      store->policies_[p->policy_id][p->version] = *std::move(p);
    }
  }
  return store;
}

uint64_t PolicyStore::Latest(const std::string& id) const {
  auto it = policies_.find(id);
  return it == policies_.end() || it->second.empty() ? 0 : it->second.rbegin()->first;
}

absl::StatusOr<std::unique_ptr<BankUpload>> PolicyStore::StartBank(
    const v1::RetentionPolicy& policy, uint64_t bytes) const {
  RETURN_IF_ERROR(ValidatePolicyId(policy.policy_id()));
  ASSIGN_OR_RETURN(RetentionPolicy p, PolicyFromProto(policy, 0, ""));  // no model at hand
  if (bytes == 0 || bytes > kMaxBankBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a bank of ", bytes, " bytes announced; the store takes 1 to ", kMaxBankBytes));
  }
  auto created = AtomicFileWriter::Create(
      (fs::path(dir_) / "banks" / (p.predictor_bank_sha256 + ".rkvbank")).string());
  if (!created.ok()) return HideStorePaths(created.status(), "", dir_);
  return std::unique_ptr<BankUpload>(
      new BankUpload(*std::move(created), p.model_fingerprint, bytes, dir_));
}

absl::StatusOr<RetentionPolicy> PolicyStore::Put(const v1::RetentionPolicy& policy,
                                                 std::string_view bank) {
  if (bank.empty()) return Put(policy, std::unique_ptr<BankUpload>());
  ASSIGN_OR_RETURN(std::unique_ptr<BankUpload> upload, StartBank(policy, bank.size()));
  RETURN_IF_ERROR(upload->Append(bank));
  return Put(policy, std::move(upload));
}

absl::StatusOr<RetentionPolicy> PolicyStore::Put(const v1::RetentionPolicy& policy,
                                                 std::unique_ptr<BankUpload> bank) {
  RETURN_IF_ERROR(ValidatePolicyId(policy.policy_id()));
  ASSIGN_OR_RETURN(RetentionPolicy p, PolicyFromProto(policy, 0, ""));  // no model at hand
  const uint64_t requested = p.version;
  const std::string& sha = p.predictor_bank_sha256;
  if (bank) {
    RETURN_IF_ERROR(bank->failed_);
    if (bank->received_ != bank->bytes_) {
      return absl::InvalidArgumentError(absl::StrCat("the bank ended after ", bank->received_,
                                                     " of the ", bank->bytes_, " bytes announced"));
    }
    // Loading checks the bank whole (format, checksum, model fingerprint) and gives its content
    // hash, which must be the one the policy names; only then does it get its name.
    // A bank that fails the checks is never committed: the writer removes its temporary.
    auto parsed = PredictorBank::Open(bank->out_.temp_path(), p.model_fingerprint);
    if (!parsed.ok()) {
      return bank->HidePaths(absl::InvalidArgumentError("the bank does not load for this policy: " +
                                                        std::string(parsed.status().message())));
    }
    if ((*parsed)->content_hash() != sha) {
      return absl::InvalidArgumentError("the bank's SHA-256 is " + (*parsed)->content_hash() +
                                        ", the policy names " + sha);
    }
    parsed->reset();
    if (auto st = bank->out_.Commit(); !st.ok()) return bank->HidePaths(st);
  }
  absl::MutexLock lock(&mu_);
  if (bank) banks_.insert(sha);
  if (PolicyNeedsBank(p) && !banks_.count(sha)) {
    return absl::FailedPreconditionError(
        "the policy needs bank " + sha +
        ", which the store does not hold: send it with the policy");
  }
  const uint64_t next = Latest(p.policy_id) + 1;
  if (requested != 0 && requested != next) {
    return absl::FailedPreconditionError(absl::StrCat("policy ", p.policy_id, " version ",
                                                      requested,
                                                      " is stale or skips ahead; the "
                                                      "next version is ",
                                                      next));
  }
  p.version = next;
  const fs::path idir = fs::path(dir_) / "policies" / p.policy_id;
  std::error_code ec;
  fs::create_directories(idir, ec);
  RETURN_IF_ERROR(WritePolicy(p, (idir / absl::StrCat(next, ".pb")).string()));
  policies_[p.policy_id][next] = p;
  return p;
}

absl::StatusOr<RetentionPolicy> PolicyStore::Get(const std::string& id, uint64_t version) const {
  absl::MutexLock lock(&mu_);
  auto it = policies_.find(id);
  if (it == policies_.end()) return absl::NotFoundError("no policy '" + id + "'");
  if (version == 0) return it->second.rbegin()->second;
  auto v = it->second.find(version);
  if (v == it->second.end()) {
    return absl::NotFoundError(absl::StrCat("policy '", id, "' has no version ", version));
  }
  return v->second;
}

std::vector<v1::PolicySummary> PolicyStore::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::PolicySummary> out;
  for (const auto& [id, versions] : policies_) {
    const RetentionPolicy& p = versions.rbegin()->second;
    v1::PolicySummary s;
    s.set_policy_id(id);
    s.set_latest_version(p.version);
    s.set_model_fingerprint(p.model_fingerprint);
    s.set_predictor_bank_sha256(p.predictor_bank_sha256);
    out.push_back(s);
  }
  return out;
}

absl::StatusOr<std::string> PolicyStore::BankPath(const std::string& sha256) const {
  absl::MutexLock lock(&mu_);
  if (!banks_.count(sha256)) return absl::NotFoundError("no bank " + sha256 + " in the store");
  return (fs::path(dir_) / "banks" / (sha256 + ".rkvbank")).string();
}

std::optional<RetentionPolicy> PolicyStore::WaitNewer(const std::string& id, uint64_t known,
                                                      int64_t timeout_ms) const {
  absl::MutexLock lock(&mu_);
  const auto newer = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return Latest(id) > known; };
  mu_.AwaitWithTimeout(absl::Condition(&newer), absl::Milliseconds(timeout_ms));
  if (Latest(id) <= known) return std::nullopt;
  return policies_.at(id).rbegin()->second;
}

}  // namespace riskkv
