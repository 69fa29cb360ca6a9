// The control plane's store: retention policies by id and version, and the predictor banks they
// name, on local disk (survives restarts):
//   DIR/policies/<policy_id>/<version>.pb   binary riskkv.v1.RetentionPolicy
//   DIR/banks/<sha256>.rkvbank              the bank file, named by its content hash
// Every file is written to a temporary name and renamed, so a crash leaves the old state.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/base/atomic_file.h"
#include "common/recovery/retention_policy.h"
#include "riskkv/v1/control.pb.h"
#include "riskkv/v1/retention_policy.pb.h"

namespace riskkv {

// The largest bank the store takes.
inline constexpr uint64_t kMaxBankBytes = uint64_t{256} << 20;

// A bank arriving in pieces, written to a temporary in the store as it comes (never held whole in
// memory) and checked as far as its bytes allow (PredictorBank::CheckHead): a foreign file, a
// bank for another model or one longer than announced is refused at the piece that shows it.
// Errors name no path of the server's. Dropped without PolicyStore::Put, it leaves nothing.
class BankUpload {
 public:
  // InvalidArgument as soon as the bytes so far show the bank cannot be the one announced;
  // ResourceExhausted when the disk is full. After a failure every call gives the same error.
  absl::Status Append(std::string_view bytes);

 private:
  friend class PolicyStore;
  BankUpload(AtomicFileWriter out, std::string fingerprint, uint64_t bytes, std::string store_dir);
  absl::Status HidePaths(const absl::Status& st) const;

  AtomicFileWriter out_;
  std::string fingerprint_, store_dir_;
  uint64_t bytes_ = 0, received_ = 0;
  std::string head_;  // the file's first bytes, up to PredictorBank::HeadBytes()
  absl::Status failed_;
};

class PolicyStore {
 public:
  // Creates DIR when missing and loads what it holds, checking each policy as PolicyFromProto
  // does for a reader without a model; a malformed file is DataLoss naming it.
  static absl::StatusOr<std::unique_ptr<PolicyStore>> Open(const std::string& dir);

  // Validates (PolicyFromProto without a model: the one check a policy gets here) and stores a
  // new version (see PutPolicyRequest); returns it as stored, numbered. InvalidArgument for a
  // malformed policy, a policy id unfit for a file name, or bank bytes that do not hash to the
  // policy's bank or do not parse as a bank for its model; FailedPrecondition when the policy
  // needs a bank the store does not hold, or names a version other than latest + 1.
  absl::StatusOr<RetentionPolicy> Put(const v1::RetentionPolicy& policy, std::string_view bank)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The same with the bank in pieces: StartBank checks the policy (as Put does) and the announced
  // size (1 to kMaxBankBytes) before any bank byte; Put then takes the upload (null: no bank),
  // InvalidArgument when it ended short of its announced size.
  absl::StatusOr<std::unique_ptr<BankUpload>> StartBank(const v1::RetentionPolicy& policy,
                                                        uint64_t bytes) const;
  absl::StatusOr<RetentionPolicy> Put(const v1::RetentionPolicy& policy,
                                      std::unique_ptr<BankUpload> bank) ABSL_LOCKS_EXCLUDED(mu_);
  // NotFound for an unknown id or version.
  absl::StatusOr<RetentionPolicy> Get(const std::string& id, uint64_t version) const
      ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<v1::PolicySummary> List() const ABSL_LOCKS_EXCLUDED(mu_);
  // The path of a stored bank; NotFound otherwise.
  absl::StatusOr<std::string> BankPath(const std::string& sha256) const ABSL_LOCKS_EXCLUDED(mu_);
  // The latest version of `id` newer than `known`, waiting up to `timeout_ms` for one.
  std::optional<RetentionPolicy> WaitNewer(const std::string& id, uint64_t known,
                                           int64_t timeout_ms) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  explicit PolicyStore(std::string dir) : dir_(std::move(dir)) {}
  uint64_t Latest(const std::string& id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);  // 0: none

  std::string dir_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::map<uint64_t, RetentionPolicy>> policies_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> banks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace riskkv
