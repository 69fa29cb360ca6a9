// riskkv-control's gRPC service.
#include "services/control/control_service.h"

#include <algorithm>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/recovery/policy_codec.h"
#include "services/grpc_status.h"

namespace riskkv {

ControlService::ControlService(PolicyStore& store, ControlMetrics* metrics,
                               std::shared_ptr<AccessFile> access, int max_concurrent_puts)
    : store_(store),
      metrics_(metrics),
      access_(std::move(access)),
      max_puts_(std::max(1, max_concurrent_puts)) {
  CountPolicies();
}

absl::Status ControlService::TakePutSlot() {
  if (puts_.fetch_add(1) < max_puts_) return absl::OkStatus();
  puts_.fetch_sub(1);
  return absl::ResourceExhaustedError(absl::StrCat(
      "the control plane is already storing its limit of ", max_puts_, " policies at once"));
}

grpc::Status ControlService::Stored(const absl::StatusOr<RetentionPolicy>& p,
                                    v1::PolicyRecord* reply) {
  if (metrics_) {
    metrics_->Put(p.ok() ? "ok"
                         : absl::AsciiStrToLower(absl::StatusCodeToString(p.status().code())));
  }
  if (!p.ok()) return ToGrpc(p.status());
  CountPolicies();
  *reply->mutable_policy() = PolicyToProto(*p);
  return grpc::Status::OK;
}

grpc::Status ControlService::Authorize(grpc::ServerContext* ctx, Action action) const {
  const absl::StatusOr<Principal> who = access_.Check(*ctx, action);
  if (who.ok()) return grpc::Status::OK;
  if (metrics_) {
    metrics_->Denied(who.status().code() == absl::StatusCode::kUnauthenticated
                         ? "unauthenticated"
                         : "permission_denied");
  }
  return ToGrpc(who.status());
}

void ControlService::CountPolicies() {
  if (!metrics_) return;
  const auto list = store_.List();
  metrics_->SetPolicies(static_cast<double>(list.size()));
  for (const auto& s : list) {
    metrics_->SetLatestVersion(s.policy_id(), static_cast<double>(s.latest_version()));
  }
}

grpc::Status ControlService::PutPolicy(grpc::ServerContext* ctx, const v1::PutPolicyRequest* req,
                                       v1::PolicyRecord* reply) {
  if (grpc::Status st = Authorize(ctx, Action::kPutPolicies); !st.ok()) return st;
  if (absl::Status slot = TakePutSlot(); !slot.ok()) return Stored(slot, reply);
  const grpc::Status st = Stored(store_.Put(req->policy(), req->bank()), reply);
  ReleasePutSlot();
  return st;
}

grpc::Status ControlService::PutPolicyStream(grpc::ServerContext* ctx,
                                             grpc::ServerReader<v1::PutPolicyPart>* reader,
                                             v1::PolicyRecord* reply) {
  if (grpc::Status st = Authorize(ctx, Action::kPutPolicies); !st.ok()) return st;
  if (absl::Status slot = TakePutSlot(); !slot.ok()) return Stored(slot, reply);
  auto put = [&]() -> absl::StatusOr<RetentionPolicy> {
    v1::PutPolicyPart part;
    if (!reader->Read(&part) || !part.has_head()) {
      return absl::InvalidArgumentError(
          "a PutPolicyStream starts with its head: the policy and the bank's size");
    }
    const v1::PutPolicyHead head = part.head();
    std::unique_ptr<BankUpload> bank;
    if (head.bank_bytes() > 0) {
      ASSIGN_OR_RETURN(bank, store_.StartBank(head.policy(), head.bank_bytes()));
    }
    while (reader->Read(&part)) {
      if (part.has_head())
        return absl::InvalidArgumentError("a second head in one PutPolicyStream");
      if (!bank) {
        return absl::InvalidArgumentError("bank bytes after a head that announced no bank");
      }
      if (part.bank().size() > kMaxBankPieceBytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "a piece of ", part.bank().size(), " bytes, above the bound of ", kMaxBankPieceBytes));
      }
      RETURN_IF_ERROR(bank->Append(part.bank()));
    }
    return store_.Put(head.policy(), std::move(bank));
  };
  const grpc::Status st = Stored(put(), reply);
  ReleasePutSlot();
  return st;
}

grpc::Status ControlService::GetPolicy(grpc::ServerContext* ctx, const v1::GetPolicyRequest* req,
                                       v1::PolicyRecord* reply) {
  if (grpc::Status st = Authorize(ctx, Action::kReadPolicies); !st.ok()) return st;
  auto p = store_.Get(req->policy_id(), req->version());
  if (!p.ok()) return ToGrpc(p.status());
  *reply->mutable_policy() = PolicyToProto(*p);
  return grpc::Status::OK;
}

grpc::Status ControlService::ListPolicies(grpc::ServerContext* ctx, const v1::ListPoliciesRequest*,
                                          v1::ListPoliciesReply* reply) {
  if (grpc::Status st = Authorize(ctx, Action::kReadPolicies); !st.ok()) return st;
  for (auto& s : store_.List()) *reply->add_policies() = s;
  return grpc::Status::OK;
}

grpc::Status ControlService::GetBank(grpc::ServerContext* ctx, const v1::GetBankRequest* req,
                                     grpc::ServerWriter<v1::BankChunk>* writer) {
  if (grpc::Status st = Authorize(ctx, Action::kFollowPolicies); !st.ok()) return st;
  auto path = store_.BankPath(req->sha256());
  if (!path.ok()) return ToGrpc(path.status());
  std::ifstream in(*path, std::ios::binary);
  if (!in) return grpc::Status(grpc::StatusCode::INTERNAL, "cannot read " + *path);
  std::string buf(1 << 20, '\0');
  double sent = 0;
  bool whole = false;
  while (!ctx->IsCancelled()) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto n = in.gcount();
    if (n <= 0) {
      whole = true;
      break;
    }
    v1::BankChunk chunk;
    chunk.set_data(buf.data(), static_cast<size_t>(n));
    if (!writer->Write(chunk)) break;
    sent += static_cast<double>(n);
  }
  if (metrics_ && whole) metrics_->BankDownload(sent);
  return grpc::Status::OK;
}

grpc::Status ControlService::Watch(grpc::ServerContext* ctx, const v1::WatchRequest* req,
                                   grpc::ServerWriter<v1::PolicyRecord>* writer) {
  if (grpc::Status st = Authorize(ctx, Action::kFollowPolicies); !st.ok()) return st;
  if (req->policy_id().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "Watch needs a policy_id");
  }
  ctx->AddInitialMetadata(kWatchMetadataKey, "1");
  writer->SendInitialMetadata();
  if (metrics_) metrics_->AddWatchers(1);
  uint64_t known = req->known_version();
  while (!ctx->IsCancelled()) {
    auto p = store_.WaitNewer(req->policy_id(), known, 500);
    if (!p) continue;
    v1::PolicyRecord r;
    *r.mutable_policy() = PolicyToProto(*p);
    if (!writer->Write(r)) break;
    known = p->version;
  }
  if (metrics_) metrics_->AddWatchers(-1);
  return grpc::Status::OK;
}

}  // namespace riskkv
