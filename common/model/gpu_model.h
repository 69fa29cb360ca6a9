// A Model's forward passes on the GPU: its weights dequantized once to f16 and uploaded through
// the CUDA module, sessions whose f16 KV cache lives on the device, and the same Prefill /
// Decode / TeacherForcedNll / ForwardMany contract as Model (common/model/model.h), which stays
// the oracle.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/kv_cache.h"
#include "common/model/model.h"
#include "kernels/gpu.h"

namespace riskkv {

class GpuModel;

// One decoding session's KV cache on the device ([capacity, n_kv_heads, head_dim] f16 per layer,
// keys after RoPE: the host KvCache's layout, so rows move between them as bytes).
class GpuSession {
 public:
  int64_t n_tokens() const { return session_->n_tokens(); }
  int64_t capacity() const { return session_->capacity(); }
  absl::Status SetTokens(int64_t n);

  // Queues f16 rows [first, first + count) of a layer's keys or values for upload on the
  // session's transfer stream. Pageable `f16_rows` may be reused when this returns; page-locked
  // ones (GpuModel::PinKv) must stay unchanged until the upload is done (Synchronize, or a
  // rebuild or forward pass that reads the layer).
  absl::Status UploadRows(int32_t layer, bool values, int64_t first, int64_t count,
                          const uint8_t* f16_rows);
  // Everything uploaded into `layer` so far is complete before a rebuild reading it runs.
  absl::Status MarkLayerUploaded(int32_t layer);
  // Uploads rows [0, n_tokens) of the given layers of an f16 host cache and marks them.
  absl::Status UploadFrom(const KvCache& cache, std::span<const int32_t> layers);
  // Copies f16 rows [first, first + count) of a layer's keys or values to host memory, after the
  // work queued on the layer.
  absl::Status DownloadRows(int32_t layer, bool values, int64_t first, int64_t count,
                            uint8_t* f16_rows);
  // Copies rows [0, n_tokens) of every layer into a host cache of the same shape and dtype f16
  // and sets its token count.
  absl::Status DownloadTo(KvCache& cache);
  absl::Status Synchronize();
  // Waits for the rebuilds queued so far (GpuPredictors::Rebuild), not for uploads.
  absl::Status WaitRebuilds();

  cuda::Session& device_session() { return *session_; }

 private:
  friend class GpuModel;
  GpuSession(const GpuModel* owner, std::unique_ptr<cuda::Session> s)
      : owner_(owner), session_(std::move(s)) {}
  const GpuModel* owner_;  // whose engine holds the cache
  std::unique_ptr<cuda::Session> session_;
};

// One session's part of a shared forward pass (GpuModel::ForwardMany), as ForwardSegment on the
// CPU: `tokens` at positions [n_tokens, n_tokens + n); `logits`, when not null, receives the last
// position's logits [vocab], or [n, vocab] when all_logits.
struct GpuSegment {
  std::span<const int32_t> tokens;
  GpuSession* session = nullptr;
  bool all_logits = false;
  std::vector<float>* logits = nullptr;
};

class GpuModel {
 public:
  // Uploads `model`'s weights to GPU `device`. Unavailable (with the reason) when no GPU can be
  // used; InvalidArgument when a weight does not fit f16.
  static absl::StatusOr<std::unique_ptr<GpuModel>> Create(const Model& model, int device = 0);

  // A model of `config`'s shape whose weights are random (N(0, 0.02)-like, norms 1), for timing
  // shapes no model file here has. Its outputs mean nothing.
  static absl::StatusOr<std::unique_ptr<GpuModel>> CreateRandom(const ModelConfig& config,
                                                                int device = 0);

  const ModelConfig& config() const { return config_; }
  int64_t device_bytes() const { return engine_->device_bytes(); }
  cuda::Engine& engine() { return *engine_; }

  // Page-locks every layer of a host cache so uploads from it (GpuSession::UploadFrom) run as
  // direct DMA instead of through staging buffers; UnpinKv before the cache is freed.
  absl::Status PinKv(KvCache& cache);
  absl::Status UnpinKv(KvCache& cache);

  // A session with room for `capacity` tokens (clamped to the context length).
  absl::StatusOr<std::unique_ptr<GpuSession>> NewSession(int64_t capacity);

  // As Model::Forward / Prefill / Decode / TeacherForcedNll, on the device.
  absl::Status Forward(std::span<const int32_t> tokens, GpuSession& session, bool all_logits,
                       std::vector<float>* logits);
  // As Model::ForwardMany: several sessions' tokens in shared passes, the weight GEMMs once over
  // every segment's rows (micro-batches of at most 1,024 rows; a segment is cut only where it
  // would be alone), RoPE, the K/V store and attention per session. A status per segment: one
  // that fails CheckTokens, names a session of another model or one an earlier segment holds,
  // or has no tokens fails alone and its session is left as it was. A device error fails every
  // segment that ran, and no session advances. Forward is this with one segment.
  std::vector<absl::Status> ForwardMany(std::span<const GpuSegment> segments);
  absl::StatusOr<std::vector<float>> Prefill(std::span<const int32_t> tokens, GpuSession& session);
  absl::StatusOr<std::vector<float>> Decode(int32_t token, GpuSession& session);
  absl::StatusOr<NllResult> TeacherForcedNll(std::span<const int32_t> continuation,
                                             GpuSession& session,
                                             std::span<const float> first_logits = {});

 private:
  GpuModel() = default;
  absl::Status CheckTokens(std::span<const int32_t> tokens, const GpuSession& session) const;

  ModelConfig config_;
  std::unique_ptr<cuda::Engine> engine_;
};

// The model's shape as the CUDA module takes it.
cuda::ModelDims GpuDims(const ModelConfig& config);

// One of a model's weights as the engine takes it: a matrix [rows, cols] dequantized to f16, or
// a vector of `rows` f32 values (cols == 0), for engine slot `slot` of `layer` (-1: the model's).
struct GpuWeight {
  std::string name;  // Model::ForEachWeight's
  int32_t layer = -1;
  int slot = 0;
  int64_t rows = 0, cols = 0;
  std::vector<uint16_t> f16;
  std::vector<float> f32;
};

// Converts every weight of `model` for the engine and hands it to `fn`, stopping at the first
// error. InvalidArgument, naming the weight and row, for a value outside f16's range.
absl::Status ForEachGpuWeight(const Model& model,
                              const std::function<absl::Status(const GpuWeight&)>& fn);

}  // namespace riskkv
