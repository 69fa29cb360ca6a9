// The transform codec (see transform_codec.h).
#include "common/kvcodec/transform_codec.h"

#include <immintrin.h>
#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/kvcodec/kv_codec.h"
#include "kernels/dtype.h"

namespace riskkv {
namespace {

constexpr float kF16Max = 65504.0f;

uint16_t ZigZag(int32_t c) { return static_cast<uint16_t>((c << 1) ^ (c >> 31)); }
int32_t UnZigZag(uint16_t u) { return static_cast<int32_t>(u >> 1) ^ -static_cast<int32_t>(u & 1); }

absl::Status CheckStep(float step) {
  if (!(step >= std::numeric_limits<float>::min()) || !std::isfinite(step)) {
    return absl::InvalidArgumentError(
        absl::StrCat("transform codec: step ", step, " is not a finite number >= ",
                     std::numeric_limits<float>::min(), " (the smallest normal float)"));
  }
  return absl::OkStatus();
}

// Rows one chunk may hold: every size the codec computes from a count stays far inside int64.
constexpr int64_t kMaxRows = int64_t{1} << 24;

// The shape checks the codec relies on (CheckTransform makes the rest): InvalidArgument for a
// transform whose heads or head size are < 1, whose head list is not `heads` long, or a head whose
// vectors are not of the head size, and for a row count outside [1, kMaxRows].
absl::Status CheckShape(const LayerTransform& t, int64_t count) {
  if (count < 1 || count > kMaxRows) {
    return absl::InvalidArgumentError(
        absl::StrCat("transform codec: ", count, " rows (1 to ", kMaxRows, " a chunk)"));
  }
  if (t.heads < 1 || t.dim < 1 || t.dim > 4096 || static_cast<int64_t>(t.head.size()) != t.heads) {
    return absl::InvalidArgumentError(absl::StrCat("transform codec: a transform of ",
                                                   t.head.size(), " heads (", t.heads,
                                                   " declared) of ", t.dim));
  }
  for (const HeadTransform& h : t.head) {
    if (static_cast<int64_t>(h.mean.size()) != t.dim ||
        static_cast<int64_t>(h.variance.size()) != t.dim ||
        static_cast<int64_t>(h.basis.size()) != t.dim * t.dim) {
      return absl::InvalidArgumentError("transform codec: a head's vectors are not of its size");
    }
  }
  return absl::OkStatus();
}

// The coded components of one head, in index order.
std::vector<int64_t> Coded(const HeadTransform& h, float step) {
  std::vector<int64_t> idx;
  for (size_t i = 0; i < h.variance.size(); ++i) {
    if (ComponentCoded(h.variance[i], step)) idx.push_back(static_cast<int64_t>(i));
  }
  return idx;
}

// The coded rows of a head's basis, [coded, dim], and their transpose, [dim, coded].
void CodedBasis(const HeadTransform& h, const std::vector<int64_t>& idx, int64_t dim,
                std::vector<float>* rows, std::vector<float>* transposed) {
  const int64_t coded = static_cast<int64_t>(idx.size());
  rows->resize(static_cast<size_t>(coded * dim));
  transposed->resize(static_cast<size_t>(dim * coded));
  for (int64_t k = 0; k < coded; ++k) {
    for (int64_t j = 0; j < dim; ++j) {
      (*rows)[k * dim + j] = (*transposed)[j * coded + k] = h.basis[idx[k] * dim + j];
    }
  }
}

// out[r, :] = sum over j in ascending order of a[r, j] * b[j, :] (fused multiply-adds), for
// r < rows: every row's sums in the same order whatever the number of rows, so a row's result
// does not depend on its chunk. Columns go 32 at a time in registers, then 8, then one by one;
// which way a column goes depends on `cols` only.
void RowTimes(const float* __restrict a, int64_t rows, int64_t inner, const float* __restrict b,
              int64_t cols, float* __restrict out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict ar = a + r * inner;
    float* __restrict o = out + r * cols;
    int64_t k0 = 0;
    for (; k0 + 32 <= cols; k0 += 32) {
      __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
      for (int64_t j = 0; j < inner; ++j) {
        const __m256 s = _mm256_broadcast_ss(ar + j);
        const float* bj = b + j * cols + k0;
        acc0 = _mm256_fmadd_ps(s, _mm256_loadu_ps(bj), acc0);
        acc1 = _mm256_fmadd_ps(s, _mm256_loadu_ps(bj + 8), acc1);
        acc2 = _mm256_fmadd_ps(s, _mm256_loadu_ps(bj + 16), acc2);
        acc3 = _mm256_fmadd_ps(s, _mm256_loadu_ps(bj + 24), acc3);
      }
      _mm256_storeu_ps(o + k0, acc0);
      _mm256_storeu_ps(o + k0 + 8, acc1);
      _mm256_storeu_ps(o + k0 + 16, acc2);
      _mm256_storeu_ps(o + k0 + 24, acc3);
    }
    for (; k0 + 8 <= cols; k0 += 8) {
      __m256 acc = _mm256_setzero_ps();
      for (int64_t j = 0; j < inner; ++j) {
        acc = _mm256_fmadd_ps(_mm256_broadcast_ss(ar + j), _mm256_loadu_ps(b + j * cols + k0), acc);
      }
      _mm256_storeu_ps(o + k0, acc);
    }
    for (; k0 < cols; ++k0) {
      float acc = 0.0f;
      for (int64_t j = 0; j < inner; ++j) acc = std::fma(ar[j], b[j * cols + k0], acc);
      o[k0] = acc;
    }
  }
}

}  // namespace

int64_t CodedComponents(const LayerTransform& t, float step) {
  int64_t n = 0;
  for (const HeadTransform& h : t.head) n += static_cast<int64_t>(Coded(h, step).size());
  return n;
}

absl::Status EncodeTransformed(const LayerTransform& t, float step, const float* rows,
                               int64_t count, int zstd_level, std::string* out) {
  if (absl::Status s = CheckStep(step); !s.ok()) return s;
  if (absl::Status s = CheckShape(t, count); !s.ok()) return s;
  if (zstd_level < ZSTD_minCLevel() || zstd_level > ZSTD_maxCLevel()) {
    return absl::InvalidArgumentError(absl::StrCat("transform codec: zstd level ", zstd_level,
                                                   " is outside [", ZSTD_minCLevel(), ", ",
                                                   ZSTD_maxCLevel(), "]"));
  }
  const int64_t dim = t.dim, width = t.heads * t.dim;
  const int64_t n = count * CodedComponents(t, step);
  std::vector<uint8_t> planes(static_cast<size_t>(2 * n));
  int64_t at = 0;
  std::vector<float> centred(static_cast<size_t>(count * dim)), y, basis, transposed;
  const float inv = 1.0f / step;
  for (int64_t h = 0; h < t.heads; ++h) {
    const HeadTransform& ht = t.head[static_cast<size_t>(h)];
    const std::vector<int64_t> idx = Coded(ht, step);
    const int64_t coded = static_cast<int64_t>(idx.size());
    if (coded == 0) continue;
    CodedBasis(ht, idx, dim, &basis, &transposed);
    for (int64_t r = 0; r < count; ++r) {
      const float* x = rows + r * width + h * dim;
      for (int64_t j = 0; j < dim; ++j) {
        const float d = x[j] - ht.mean[j];
        centred[r * dim + j] = std::abs(d) <= std::numeric_limits<float>::max() ? d : 0.0f;
      }
    }
    y.resize(static_cast<size_t>(count * coded));
    RowTimes(centred.data(), count, dim, transposed.data(), coded, y.data());
    for (int64_t k = 0; k < coded; ++k) {
      for (int64_t r = 0; r < count; ++r, ++at) {
        float q = std::nearbyint(y[r * coded + k] * inv);
        if (std::isnan(q)) q = 0.0f;
        const int32_t c = static_cast<int32_t>(std::clamp(q, -32767.0f, 32767.0f));
        const uint16_t u = ZigZag(c);
        planes[static_cast<size_t>(at)] = static_cast<uint8_t>(u & 0xff);
        planes[static_cast<size_t>(n + at)] = static_cast<uint8_t>(u >> 8);
      }
    }
  }
  out->resize(ZSTD_compressBound(planes.size()));
  const size_t z =
      ZSTD_compress(out->data(), out->size(), planes.data(), planes.size(), zstd_level);
  if (ZSTD_isError(z)) {
    return absl::InternalError(absl::StrCat("transform codec: zstd: ", ZSTD_getErrorName(z)));
  }
  out->resize(z);
  return absl::OkStatus();
}

absl::Status DecodeTransformed(const LayerTransform& t, float step, std::string_view data,
                               int64_t count, float* out) {
  if (absl::Status s = CheckStep(step); !s.ok()) return s;
  if (absl::Status s = CheckShape(t, count); !s.ok()) return s;
  const int64_t n = count * CodedComponents(t, step);
  const uint64_t expected = static_cast<uint64_t>(2 * n);
  // A zstd frame, not a skippable one: its magic number first.
  if (data.size() < 4 ||
      (static_cast<uint32_t>(static_cast<uint8_t>(data[0])) |
       static_cast<uint32_t>(static_cast<uint8_t>(data[1])) << 8 |
       static_cast<uint32_t>(static_cast<uint8_t>(data[2])) << 16 |
       static_cast<uint32_t>(static_cast<uint8_t>(data[3])) << 24) != ZSTD_MAGICNUMBER) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transform codec: ", data.size(), " bytes are not a whole zstd frame (no frame magic)"));
  }
  const size_t frame = ZSTD_findFrameCompressedSize(data.data(), data.size());
  if (ZSTD_isError(frame)) {
    return absl::InvalidArgumentError(absl::StrCat("transform codec: ", data.size(),
                                                   " bytes are not a whole zstd frame (",
                                                   ZSTD_getErrorName(frame), ")"));
  }
  if (frame != data.size()) {
    return absl::InvalidArgumentError(absl::StrCat("transform codec: a zstd frame of ", frame,
                                                   " bytes followed by ", data.size() - frame,
                                                   " more"));
  }
  const unsigned long long stated = ZSTD_getFrameContentSize(data.data(), data.size());
  if (stated == ZSTD_CONTENTSIZE_UNKNOWN || stated == ZSTD_CONTENTSIZE_ERROR) {
    return absl::InvalidArgumentError(
        "transform codec: the zstd frame does not state its content size");
  }
  if (stated != expected) {
    return absl::InvalidArgumentError(absl::StrCat("transform codec: the zstd frame states ",
                                                   stated, " bytes, ", count, " rows take ",
                                                   expected));
  }
  std::vector<uint8_t> planes(static_cast<size_t>(expected));
  const size_t got = ZSTD_decompress(planes.data(), planes.size(), data.data(), data.size());
  if (ZSTD_isError(got) || got != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transform codec: the zstd frame does not decompress to the ", expected, " bytes it states",
        ZSTD_isError(got) ? absl::StrCat(" (", ZSTD_getErrorName(got), ")") : std::string()));
  }
  const int64_t dim = t.dim, width = t.heads * t.dim;
  int64_t at = 0;
  std::vector<float> y, x(static_cast<size_t>(count * dim)), basis, transposed;
  for (int64_t h = 0; h < t.heads; ++h) {
    const HeadTransform& ht = t.head[static_cast<size_t>(h)];
    const std::vector<int64_t> idx = Coded(ht, step);
    const int64_t coded = static_cast<int64_t>(idx.size());
    CodedBasis(ht, idx, dim, &basis, &transposed);
    y.resize(static_cast<size_t>(count * coded));
    for (int64_t k = 0; k < coded; ++k) {
      for (int64_t r = 0; r < count; ++r, ++at) {
        const uint16_t u = static_cast<uint16_t>(planes[static_cast<size_t>(at)] |
                                                 planes[static_cast<size_t>(n + at)] << 8);
        if (u == 0xffff) {
          return absl::InvalidArgumentError(absl::StrCat("transform codec: token ", r, " of head ",
                                                         h, " component ", idx[k],
                                                         " has code -32768, never written"));
        }
        y[r * coded + k] = static_cast<float>(UnZigZag(u)) * step;
      }
    }
    RowTimes(y.data(), count, coded, basis.data(), dim, x.data());
    for (int64_t r = 0; r < count; ++r) {
      float* o = out + r * width + h * dim;
      for (int64_t j = 0; j < dim; ++j) o[j] = x[r * dim + j] + ht.mean[j];
    }
  }
  for (int64_t r = 0; r < count; ++r) {
    for (int64_t i = 0; i < width; ++i) {
      const float v = out[r * width + i];
      if (!(std::abs(v) <= kF16Max)) {
        return absl::InvalidArgumentError(
            absl::StrCat("transform codec: token ", r, " channel ", i, " decodes to ", v,
                         ", which is not finite or leaves the f16 range"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> RoundTripTransformed(const LayerTransform& t, float step, float* rows,
                                             int64_t count, int zstd_level) {
  std::string bytes;
  if (absl::Status s = EncodeTransformed(t, step, rows, count, zstd_level, &bytes); !s.ok()) {
    return s;
  }
  if (absl::Status s = DecodeTransformed(t, step, bytes, count, rows); !s.ok()) return s;
  return static_cast<int64_t>(bytes.size());
}

float TransformStep(const LayerTransform& t, double ratio) {
  const double step = std::max(1e-6, ratio * t.Rms());
  return static_cast<float>(std::min<double>(step, std::numeric_limits<float>::max()));
}

namespace {

// Rows of [first_token, first_token + count) that cross in f16 ahead of the frame.
int64_t ChunkSinkRows(int64_t first_token, int64_t count) {
  return std::clamp<int64_t>(kSinkTokens - first_token, 0, count);
}

}  // namespace

int64_t TransformChunkBound(int64_t width, int64_t first_token, int64_t count) {
  const int64_t sink = ChunkSinkRows(first_token, count);
  const int64_t coded = count - sink;
  return sink * width * 2 +
         (coded > 0
              ? static_cast<int64_t>(ZSTD_compressBound(static_cast<size_t>(2 * coded * width)))
              : 0);
}

absl::Status EncodeTransformChunk(const LayerTransform& t, float step, const float* rows,
                                  int64_t first_token, int64_t count, int zstd_level,
                                  std::string* out) {
  if (first_token < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("transform codec: first_token ", first_token, " is negative"));
  }
  if (absl::Status s = CheckShape(t, count); !s.ok()) return s;
  const int64_t width = t.heads * t.dim;
  const int64_t sink = ChunkSinkRows(first_token, count);
  std::string frame;
  if (count > sink) {
    if (absl::Status s =
            EncodeTransformed(t, step, rows + sink * width, count - sink, zstd_level, &frame);
        !s.ok()) {
      return s;
    }
  } else if (absl::Status s = CheckStep(step); !s.ok()) {
    return s;
  }
  out->assign(static_cast<size_t>(sink * width * 2), '\0');
  if (sink > 0) {
    std::vector<float> clamped(rows, rows + sink * width);
    for (float& v : clamped) v = std::isnan(v) ? 0.0f : std::clamp(v, -kF16Max, kF16Max);
    F32ToF16Row(clamped.data(), reinterpret_cast<uint16_t*>(out->data()), sink * width);
  }
  out->append(frame);
  return absl::OkStatus();
}

absl::Status DecodeTransformChunk(const LayerTransform& t, float step, std::string_view data,
                                  int64_t first_token, int64_t count, float* out) {
  if (first_token < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("transform codec: first_token ", first_token, " is negative"));
  }
  if (absl::Status s = CheckStep(step); !s.ok()) return s;
  if (absl::Status s = CheckShape(t, count); !s.ok()) return s;
  const int64_t width = t.heads * t.dim;
  const int64_t sink = ChunkSinkRows(first_token, count);
  const auto sink_bytes = static_cast<size_t>(sink * width * 2);
  if (data.size() < sink_bytes || (count == sink && data.size() != sink_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("transform codec: ", data.size(), " bytes for ",
                                                   sink, " sink rows of ", width, " f16 values",
                                                   count > sink ? " and a frame" : ""));
  }
  if (sink > 0) {
    // The f16 rows may sit at any alignment in the message: copied out first.
    std::vector<uint16_t> half(static_cast<size_t>(sink * width));
    std::memcpy(half.data(), data.data(), sink_bytes);
    F16ToF32Row(half.data(), out, sink * width);
    for (int64_t i = 0; i < sink * width; ++i) {
      if (!std::isfinite(out[i])) {
        return absl::InvalidArgumentError(absl::StrCat("transform codec: sink token ", i / width,
                                                       " channel ", i % width, " is ", out[i]));
      }
    }
  }
  if (count == sink) return absl::OkStatus();
  return DecodeTransformed(t, step, data.substr(sink_bytes), count - sink, out + sink * width);
}

}  // namespace riskkv
