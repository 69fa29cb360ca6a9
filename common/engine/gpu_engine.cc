// The GPU engine (see gpu_engine.h).
#include "common/engine/gpu_engine.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/base/stopwatch.h"
#include "common/recovery/gpu_rebuild.h"

namespace riskkv {
namespace {

class GpuBankPredictors final : public EnginePredictors {
 public:
  GpuBankPredictors(const Engine* engine, std::shared_ptr<const PredictorBank> bank,
                    std::unique_ptr<GpuPredictors> device)
      : EnginePredictors(engine, std::move(bank)), device_(std::move(device)) {}
  const GpuPredictors& device() const { return *device_; }

 private:
  std::unique_ptr<GpuPredictors> device_;
};

}  // namespace

absl::Status GpuKvStore::WriteRows(int32_t layer, bool values, int64_t first, int64_t count,
                                   DType rows_dtype, const uint8_t* rows) {
  RETURN_IF_ERROR(CheckRows(layer, first, count));
  host_.reset();
  if (rows_dtype == DType::kF32) {  // buffers reused chunk after chunk
    const int64_t n = count * engine().config().kv_width();
    f32_.resize(n);
    std::memcpy(f32_.data(), rows, n * 4);
    f16_.resize(n);
    F32ToF16Row(f32_.data(), f16_.data(), n);
    rows = reinterpret_cast<const uint8_t*>(f16_.data());
  } else if (rows_dtype != DType::kF16) {
    return absl::InvalidArgumentError("KV rows must be f32 or f16");
  }
  return session_->UploadRows(layer, values, first, count, rows);
}

absl::Status GpuKvStore::FinishLayer(int32_t layer) {
  RETURN_IF_ERROR(CheckRows(layer, 0, 0));
  host_.reset();
  return session_->MarkLayerUploaded(layer);
}

absl::Status GpuKvStore::ReadRows(int32_t layer, bool values, int64_t first, int64_t count,
                                  uint8_t* out) const {
  RETURN_IF_ERROR(CheckRows(layer, first, count));
  if (host_ != nullptr && first + count <= host_->n_tokens()) {
    const uint8_t* src = values ? host_->ValueRows(layer, first) : host_->KeyRows(layer, first);
    std::memcpy(out, src, count * row_bytes());
    return absl::OkStatus();
  }
  return session_->DownloadRows(layer, values, first, count, out);
}

absl::Status GpuKvStore::PrepareRead(int64_t count) const {
  RETURN_IF_ERROR(CheckRows(0, 0, count));
  const ModelConfig& c = engine().config();
  host_.reset();
  ASSIGN_OR_RETURN(std::unique_ptr<KvCache> host,
                   KvCache::Create(c.n_layers, c.n_kv_heads, c.head_dim,
                                   std::max<int64_t>(1, count), DType::kF16));
  for (int32_t l = 0; l < c.n_layers; ++l) {
    RETURN_IF_ERROR(session_->DownloadRows(l, false, 0, count, host->KeyRows(l, 0)));
    RETURN_IF_ERROR(session_->DownloadRows(l, true, 0, count, host->ValueRows(l, 0)));
  }
  RETURN_IF_ERROR(host->SetTokens(count));
  host_ = std::move(host);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<KvStore>> GpuEngine::NewStore(int64_t capacity) {
  ASSIGN_OR_RETURN(std::unique_ptr<GpuSession> session, gpu_->NewSession(capacity));
  return std::make_unique<GpuKvStore>(this, std::move(session));
}

absl::StatusOr<std::unique_ptr<KvStore>> GpuEngine::CopyStore(const KvStore& from) {
  RETURN_IF_ERROR(CheckOwner(from));
  auto& source = const_cast<GpuKvStore&>(static_cast<const GpuKvStore&>(from));
  ASSIGN_OR_RETURN(std::unique_ptr<KvStore> to, NewStore(from.capacity()));
  GpuSession& copy = static_cast<GpuKvStore&>(*to).session();
  // Through host memory, a layer at a time: the engine has no device-to-device copy.
  const int64_t n = from.n_tokens();
  std::vector<uint8_t> rows(std::max<int64_t>(1, n) * from.row_bytes());
  for (int32_t l = 0; l < config().n_layers; ++l) {
    for (bool values : {false, true}) {
      RETURN_IF_ERROR(source.session().DownloadRows(l, values, 0, n, rows.data()));
      RETURN_IF_ERROR(copy.UploadRows(l, values, 0, n, rows.data()));
    }
    RETURN_IF_ERROR(copy.MarkLayerUploaded(l));
  }
  RETURN_IF_ERROR(copy.SetTokens(n));
  return to;
}

std::vector<absl::Status> GpuEngine::Step(std::span<const BatchItem> items,
                                          const BetweenLayers& /*between_layers*/) {
  std::vector<absl::Status> status(items.size());
  const std::vector<GpuKvStore*> stores = OwnItems<GpuKvStore>(items, &status);
  std::vector<GpuSegment> segments;
  std::vector<size_t> index;  // item of each segment
  for (size_t i = 0; i < items.size(); ++i) {
    if (stores[i] == nullptr) continue;
    // GpuModel::ForwardMany refuses a session named twice; session() drops the store's host
    // copy, which a forward pass would make stale.
    segments.push_back({.tokens = items[i].tokens,
                        .session = &stores[i]->session(),
                        .all_logits = items[i].all_logits,
                        .logits = items[i].logits});
    index.push_back(i);
  }
  if (segments.empty()) return status;
  absl::MutexLock lock(&mu_);
  std::vector<absl::Status> ran = gpu_->ForwardMany(segments);
  for (size_t j = 0; j < ran.size(); ++j) status[index[j]] = std::move(ran[j]);
  return status;
}

absl::StatusOr<std::shared_ptr<const EnginePredictors>> GpuEngine::LoadPredictors(
    std::shared_ptr<const PredictorBank> bank) {
  if (bank == nullptr) return absl::InvalidArgumentError("no predictor bank to load");
  ASSIGN_OR_RETURN(std::unique_ptr<GpuPredictors> device, GpuPredictors::Create(*gpu_, *bank));
  return std::make_shared<const GpuBankPredictors>(this, std::move(bank), std::move(device));
}

absl::StatusOr<double> GpuEngine::Rebuild(KvStore& store, const EnginePredictors& predictors,
                                          const FoldedGroup& group, int64_t begin, int64_t count) {
  ASSIGN_OR_RETURN(GpuKvStore * s, Own<GpuKvStore>(store));
  RETURN_IF_ERROR(CheckOwner(predictors));
  const auto& p = static_cast<const GpuBankPredictors&>(predictors);
  absl::MutexLock lock(&mu_);
  const Stopwatch clock;
  RETURN_IF_ERROR(p.device().Rebuild(s->session(), group, begin, count));
  return clock.Seconds();
}

absl::StatusOr<double> GpuEngine::WaitRebuilds(KvStore& store) {
  ASSIGN_OR_RETURN(GpuKvStore * s, Own<GpuKvStore>(store));
  const Stopwatch clock;
  RETURN_IF_ERROR(s->session().WaitRebuilds());
  return clock.Seconds();
}

}  // namespace riskkv
