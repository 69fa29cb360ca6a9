// Uploading a Model to the GPU and running it there.
#include "common/model/gpu_model.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace riskkv {
namespace {

constexpr float kF16Max = 65504.0f;

// One engine slot: its Model::ForEachWeight name (without "blk.N." for layer slots) and shape.
struct SlotSpec {
  const char* name;
  int slot;
  int64_t rows, cols;  // cols == 0: a vector of `rows`
};

// Every slot the engine takes for a model of config `c`: the model's own, then each layer's.
std::vector<SlotSpec> ModelSlots(const ModelConfig& c) {
  std::vector<SlotSpec> out = {{"token_embd", cuda::kTokenEmbedding, c.vocab, c.hidden},
                               {"output_norm", cuda::kOutputNorm, c.hidden, 0}};
  if (!c.tied_embeddings) out.push_back({"lm_head", cuda::kLmHead, c.vocab, c.hidden});
  return out;
}
std::vector<SlotSpec> LayerSlots(const ModelConfig& c) {
  const int64_t q = c.n_heads * c.head_dim, kv = c.kv_width();
  std::vector<SlotSpec> out = {{"wq", cuda::kWq, q, c.hidden},
                               {"wk", cuda::kWk, kv, c.hidden},
                               {"wv", cuda::kWv, kv, c.hidden},
                               {"wo", cuda::kWo, c.hidden, q},
                               {"w_gate", cuda::kWGate, c.ffn, c.hidden},
                               {"w_up", cuda::kWUp, c.ffn, c.hidden},
                               {"w_down", cuda::kWDown, c.hidden, c.ffn},
                               {"attn_norm", cuda::kAttnNorm, c.hidden, 0},
                               {"ffn_norm", cuda::kFfnNorm, c.hidden, 0}};
  if (c.qkv_bias) {
    out.insert(out.end(),
               {{"bq", cuda::kBq, q, 0}, {"bk", cuda::kBk, kv, 0}, {"bv", cuda::kBv, kv, 0}});
  }
  return out;
}

// The layer (-1: the model's own) and slot of one of Model::ForEachWeight's names.
absl::StatusOr<std::pair<int32_t, SlotSpec>> SlotFor(std::string_view name, const ModelConfig& c) {
  int32_t layer = -1;
  std::string_view rest = name;
  if (name.substr(0, 4) == "blk.") {
    const size_t dot = name.find('.', 4);
    if (dot == std::string_view::npos ||
        !absl::SimpleAtoi(std::string(name.substr(4, dot - 4)), &layer)) {
      return absl::InternalError(absl::StrCat("unknown weight ", std::string(name)));
    }
    rest = name.substr(dot + 1);
  }
  for (const SlotSpec& spec : layer >= 0 ? LayerSlots(c) : ModelSlots(c)) {
    if (rest == spec.name) return std::pair{layer, spec};
  }
  return absl::InternalError(absl::StrCat("unknown weight ", std::string(name)));
}

// Dequantizes a stored matrix to f16, refusing values f16 cannot hold.
absl::StatusOr<std::vector<uint16_t>> ToF16(std::string_view name, DType dtype, const void* data,
                                            int64_t rows, int64_t cols) {
  std::vector<uint16_t> out(rows * cols);
  std::vector<float> row(cols);
  const auto* bytes = static_cast<const uint8_t*>(data);
  for (int64_t r = 0; r < rows; ++r) {
    DequantizeRow(dtype, bytes + r * RowBytes(dtype, cols), row.data(), cols);
    for (float v : row) {
      if (!(std::fabs(v) <= kF16Max)) {
        return absl::InvalidArgumentError(absl::StrCat("weight ", std::string(name), " row ", r,
                                                       " holds ", v, ", outside f16's range"));
      }
    }
    F32ToF16Row(row.data(), out.data() + r * cols, cols);
  }
  return out;
}

// The CUDA engine takes a scaled RoPE's divisors by value, at most this many pairs of them.
constexpr size_t kMaxPairs = sizeof(cuda::ModelDims::rope_divisors) / sizeof(double);

absl::Status CheckGpuRope(const ModelConfig& c) {
  if (c.rope_scaling.freq_divisors.size() <= kMaxPairs) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(c.name, ": scaled RoPE over ", c.rope_scaling.freq_divisors.size(),
                   " pairs; the CUDA engine takes at most ", kMaxPairs));
}

}  // namespace

cuda::ModelDims GpuDims(const ModelConfig& c) {
  cuda::ModelDims d;
  d.n_layers = c.n_layers;
  d.hidden = c.hidden;
  d.n_heads = c.n_heads;
  d.n_kv_heads = c.n_kv_heads;
  d.head_dim = c.head_dim;
  d.ffn = c.ffn;
  d.vocab = c.vocab;
  d.rope_dim = c.rope_dim;
  d.rope_base = c.rope_base;
  d.rope_interleaved = c.rope_layout == RopeLayout::kInterleaved ? 1 : 0;
  d.rms_eps = static_cast<float>(c.rms_eps);
  d.qkv_bias = c.qkv_bias ? 1 : 0;
  d.tied = c.tied_embeddings ? 1 : 0;
  const std::vector<double>& divisors = c.rope_scaling.freq_divisors;
  if (!divisors.empty() || c.rope_scaling.attn_factor != 1.0) {
    d.rope_scaled = 1;
    d.rope_attn_factor = c.rope_scaling.attn_factor;
    for (size_t i = 0; i < kMaxPairs; ++i) {
      d.rope_divisors[i] = i < divisors.size() ? divisors[i] : 1.0;
    }
  }
  return d;
}

absl::Status GpuSession::SetTokens(int64_t n) {
  return FromGpu(session_->SetTokens(n), session_->error());
}

absl::Status GpuSession::UploadRows(int32_t layer, bool values, int64_t first, int64_t count,
                                    const uint8_t* f16_rows) {
  return FromGpu(session_->UploadRows(layer, values ? 1 : 0, first, count,
                                      reinterpret_cast<const uint16_t*>(f16_rows)),
                 session_->error());
}

absl::Status GpuSession::MarkLayerUploaded(int32_t layer) {
  return FromGpu(session_->MarkLayerUploaded(layer), session_->error());
}

absl::Status GpuSession::UploadFrom(const KvCache& cache, std::span<const int32_t> layers) {
  if (cache.dtype() != DType::kF16) {
    return absl::InvalidArgumentError("the GPU KV cache takes f16 rows");
  }
  const int64_t n = cache.n_tokens();
  if (n > capacity()) {
    return absl::OutOfRangeError(
        absl::StrCat(n, " rows do not fit the GPU session's ", capacity()));
  }
  for (int32_t l : layers) {
    if (l < 0 || l >= cache.n_layers()) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", l, " outside the cache"));
    }
    RETURN_IF_ERROR(UploadRows(l, false, 0, n, cache.KeyRows(l, 0)));
    RETURN_IF_ERROR(UploadRows(l, true, 0, n, cache.ValueRows(l, 0)));
    RETURN_IF_ERROR(MarkLayerUploaded(l));
  }
  return absl::OkStatus();
}

absl::Status GpuSession::DownloadTo(KvCache& cache) {
  if (cache.dtype() != DType::kF16) {
    return absl::InvalidArgumentError("the GPU KV cache gives f16 rows");
  }
  const int64_t n = n_tokens();
  if (n > cache.capacity()) {
    return absl::OutOfRangeError(
        absl::StrCat(n, " rows do not fit the host cache's ", cache.capacity()));
  }
  for (int64_t l = 0; l < cache.n_layers(); ++l) {
    const auto layer = static_cast<int32_t>(l);
    RETURN_IF_ERROR(FromGpu(
        session_->DownloadRows(layer, 0, 0, n, reinterpret_cast<uint16_t*>(cache.KeyRows(l, 0))),
        session_->error()));
    RETURN_IF_ERROR(FromGpu(
        session_->DownloadRows(layer, 1, 0, n, reinterpret_cast<uint16_t*>(cache.ValueRows(l, 0))),
        session_->error()));
  }
  return cache.SetTokens(n);
}

absl::Status GpuSession::DownloadRows(int32_t layer, bool values, int64_t first, int64_t count,
                                      uint8_t* f16_rows) {
  return FromGpu(session_->DownloadRows(layer, values ? 1 : 0, first, count,
                                        reinterpret_cast<uint16_t*>(f16_rows)),
                 session_->error());
}

absl::Status GpuSession::WaitRebuilds() {
  return FromGpu(session_->WaitRebuilds(), session_->error());
}

absl::Status GpuSession::Synchronize() {
  return FromGpu(session_->Synchronize(), session_->error());
}

absl::Status ForEachGpuWeight(const Model& model,
                              const std::function<absl::Status(const GpuWeight&)>& fn) {
  const ModelConfig& c = model.config();
  absl::Status status;
  model.ForEachWeight([&](std::string_view name, DType dtype, const void* data, size_t bytes) {
    if (!status.ok()) return;
    auto slot = SlotFor(name, c);
    if (!slot.ok()) {
      status = slot.status();
      return;
    }
    const auto [layer, shape] = *slot;
    GpuWeight w;
    w.name = std::string(name);
    w.layer = layer;
    w.slot = shape.slot;
    w.rows = shape.rows;
    w.cols = shape.cols;
    if (shape.cols == 0) {
      if (dtype != DType::kF32 || bytes != shape.rows * sizeof(float)) {
        status = absl::InternalError(
            absl::StrCat("vector ", w.name, " has ", bytes, " bytes, not ", shape.rows, " f32"));
        return;
      }
      const auto* v = static_cast<const float*>(data);
      w.f32.assign(v, v + shape.rows);
    } else {
      if (static_cast<int64_t>(bytes) != shape.rows * RowBytes(dtype, shape.cols)) {
        status = absl::InternalError(absl::StrCat("matrix ", w.name, " has ", bytes,
                                                  " bytes, not [", shape.rows, ", ", shape.cols,
                                                  "] of ", DTypeName(dtype)));
        return;
      }
      auto f16 = ToF16(name, dtype, data, shape.rows, shape.cols);
      if (!f16.ok()) {
        status = f16.status();
        return;
      }
      w.f16 = std::move(*f16);
    }
    status = fn(w);
  });
  return status;
}

absl::StatusOr<std::unique_ptr<GpuModel>> GpuModel::Create(const Model& model, int device) {
  RETURN_IF_ERROR(CheckGpuRope(model.config()));
  auto gpu = std::unique_ptr<GpuModel>(new GpuModel);
  gpu->config_ = model.config();
  ASSIGN_OR_RETURN(gpu->engine_, NewGpuEngine(GpuDims(gpu->config_), device));
  cuda::Engine& e = *gpu->engine_;
  RETURN_IF_ERROR(ForEachGpuWeight(model, [&e](const GpuWeight& w) {
    return w.cols == 0
               ? FromGpu(e.SetVector(w.layer, w.slot, w.f32.data(), w.rows), e.error())
               : FromGpu(e.SetMatrix(w.layer, w.slot, w.f16.data(), w.rows, w.cols), e.error());
  }));
  RETURN_IF_ERROR(FromGpu(e.Finalize(), e.error()));
  return gpu;
}

absl::StatusOr<std::unique_ptr<GpuModel>> GpuModel::CreateRandom(const ModelConfig& config,
                                                                 int device) {
  RETURN_IF_ERROR(config.Validate());
  RETURN_IF_ERROR(CheckGpuRope(config));
  auto gpu = std::unique_ptr<GpuModel>(new GpuModel);
  gpu->config_ = config;
  ASSIGN_OR_RETURN(gpu->engine_, NewGpuEngine(GpuDims(config), device));
  cuda::Engine& e = *gpu->engine_;
  // One buffer of random halfs, as large as the largest matrix, serves every matrix; norms are
  // ones, biases zeros.
  int64_t largest = 0;
  for (const SlotSpec& spec : ModelSlots(config))
    largest = std::max(largest, spec.rows * spec.cols);
  for (const SlotSpec& spec : LayerSlots(config))
    largest = std::max(largest, spec.rows * spec.cols);
  std::vector<uint16_t> random(largest);
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (auto& h : random) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    const float u = static_cast<float>(state >> 40) / static_cast<float>(1ull << 24);  // [0, 1)
    h = F32ToF16((u - 0.5f) * 0.07f);  // standard deviation 0.02
  }
  std::vector<float> ones, zeros;
  auto set = [&](int32_t layer, const SlotSpec& spec) {
    if (spec.cols > 0) {
      return FromGpu(e.SetMatrix(layer, spec.slot, random.data(), spec.rows, spec.cols), e.error());
    }
    const bool bias = spec.slot == cuda::kBq || spec.slot == cuda::kBk || spec.slot == cuda::kBv;
    std::vector<float>& v = bias ? zeros : ones;
    v.assign(spec.rows, bias ? 0.0f : 1.0f);
    return FromGpu(e.SetVector(layer, spec.slot, v.data(), spec.rows), e.error());
  };
  for (const SlotSpec& spec : ModelSlots(config)) RETURN_IF_ERROR(set(-1, spec));
  for (int32_t l = 0; l < config.n_layers; ++l) {
    for (const SlotSpec& spec : LayerSlots(config)) RETURN_IF_ERROR(set(l, spec));
  }
  RETURN_IF_ERROR(FromGpu(e.Finalize(), e.error()));
  return gpu;
}

absl::Status GpuModel::PinKv(KvCache& cache) {
  const int64_t bytes = cache.capacity() * cache.token_bytes();
  std::vector<void*> pinned;
  for (int64_t l = 0; l < cache.n_layers(); ++l) {
    for (void* p :
         {static_cast<void*>(cache.KeyRows(l, 0)), static_cast<void*>(cache.ValueRows(l, 0))}) {
      if (engine_->PinHostMemory(p, bytes) != 0) {
        const std::string error = engine_->error();
        for (void* q : pinned) engine_->UnpinHostMemory(q);  // all or nothing
        return absl::InternalError("GPU: " + error);
      }
      pinned.push_back(p);
    }
  }
  return absl::OkStatus();
}

absl::Status GpuModel::UnpinKv(KvCache& cache) {
  for (int64_t l = 0; l < cache.n_layers(); ++l) {
    RETURN_IF_ERROR(FromGpu(engine_->UnpinHostMemory(cache.KeyRows(l, 0)), engine_->error()));
    RETURN_IF_ERROR(FromGpu(engine_->UnpinHostMemory(cache.ValueRows(l, 0)), engine_->error()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<GpuSession>> GpuModel::NewSession(int64_t capacity) {
  if (capacity < 1) return absl::InvalidArgumentError("a session needs capacity >= 1");
  cuda::Session* s = engine_->NewSession(std::min(capacity, config_.context_length));
  if (s == nullptr) return absl::ResourceExhaustedError(std::string("GPU: ") + engine_->error());
  return std::unique_ptr<GpuSession>(new GpuSession(this, std::unique_ptr<cuda::Session>(s)));
}

absl::Status GpuModel::CheckTokens(std::span<const int32_t> tokens,
                                   const GpuSession& session) const {
  RETURN_IF_ERROR(CheckTokenIds(tokens, config_.vocab));
  const int64_t end = session.n_tokens() + static_cast<int64_t>(tokens.size());
  if (end > session.capacity()) {
    return absl::OutOfRangeError(
        absl::StrCat(end, " tokens exceed the GPU session's capacity of ", session.capacity()));
  }
  return absl::OkStatus();
}

absl::Status GpuModel::Forward(std::span<const int32_t> tokens, GpuSession& session,
                               bool all_logits, std::vector<float>* logits) {
  const GpuSegment segment{
      .tokens = tokens, .session = &session, .all_logits = all_logits, .logits = logits};
  return ForwardMany(std::span<const GpuSegment>(&segment, 1)).front();
}

std::vector<absl::Status> GpuModel::ForwardMany(std::span<const GpuSegment> segments) {
  std::vector<absl::Status> status(segments.size());
  std::vector<cuda::ForwardItem> items;
  std::vector<size_t> index;  // segment of each item
  for (size_t i = 0; i < segments.size(); ++i) {
    const GpuSegment& seg = segments[i];
    if (seg.session == nullptr) {
      status[i] = absl::InvalidArgumentError("a segment without a GPU session");
    } else if (seg.session->owner_ != this) {
      status[i] = absl::InvalidArgumentError("a GPU session of another model");
    } else if (seg.tokens.empty()) {
      status[i] = absl::InvalidArgumentError("no tokens to run");
    } else if (std::any_of(items.begin(), items.end(), [&](const cuda::ForwardItem& item) {
                 return item.session == seg.session->session_.get();
               })) {
      status[i] = absl::InvalidArgumentError("a GPU session appears twice in one pass");
    } else {
      status[i] = CheckTokens(seg.tokens, *seg.session);
    }
    if (!status[i].ok()) continue;
    const int64_t n = static_cast<int64_t>(seg.tokens.size());
    cuda::ForwardItem item;
    item.session = seg.session->session_.get();
    item.tokens = seg.tokens.data();
    item.n = n;
    item.all_logits = seg.all_logits ? 1 : 0;
    if (seg.logits != nullptr) {
      seg.logits->assign((seg.all_logits ? n : 1) * config_.vocab, 0.0f);
      item.logits = seg.logits->data();
    }
    items.push_back(item);
    index.push_back(i);
  }
  if (items.empty()) return status;
  const int rc = engine_->ForwardMany(items.data(), static_cast<int64_t>(items.size()));
  if (rc != 0) {
    const absl::Status failed = FromGpu(rc, engine_->error());
    for (size_t i : index) status[i] = failed;
  }
  return status;
}

absl::StatusOr<std::vector<float>> GpuModel::Prefill(std::span<const int32_t> tokens,
                                                     GpuSession& session) {
  std::vector<float> logits;
  RETURN_IF_ERROR(Forward(tokens, session, false, &logits));
  return logits;
}

absl::StatusOr<std::vector<float>> GpuModel::Decode(int32_t token, GpuSession& session) {
  return Prefill(std::span<const int32_t>(&token, 1), session);
}

absl::StatusOr<NllResult> GpuModel::TeacherForcedNll(std::span<const int32_t> continuation,
                                                     GpuSession& session,
                                                     std::span<const float> first_logits) {
  RETURN_IF_ERROR(CheckTokens(continuation, session));
  return ScoreContinuation(continuation, config_.vocab, first_logits,
                           [&](std::span<const int32_t> batch, std::vector<float>* logits) {
                             return Forward(batch, session, /*all_logits=*/true, logits);
                           });
}

}  // namespace riskkv
