// The transform codec against a double-precision statement of what it promises: every coded
// component within half a step of the transformed row, every dropped one decoded as the mean,
// the same rows however a layer is cut into chunks, fewer bytes at a larger step, and every kind
// of malformed chunk refused.
#include "common/kvcodec/transform_codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <zstd.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/dtype.h"

namespace riskkv {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kHeads = 3, kDim = 16, kWidth = kHeads * kDim;

// Correlated rows: each head a mix of four latent factors of falling scale plus a little noise,
// over a per-channel offset.
std::vector<float> Rows(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  std::mt19937 mix_rng(99);
  std::vector<float> mix(kHeads * 4 * kDim);
  for (float& m : mix) m = g(mix_rng);
  std::vector<float> x(n * kWidth);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < kHeads; ++h) {
      float z[4];
      for (int f = 0; f < 4; ++f) z[f] = g(rng) * std::pow(0.3f, static_cast<float>(f)) * 4.f;
      for (int64_t j = 0; j < kDim; ++j) {
        float v = 0.2f * static_cast<float>(j) + 0.01f * g(rng);
        for (int f = 0; f < 4; ++f) v += z[f] * mix[(h * 4 + f) * kDim + j];
        x[t * kWidth + h * kDim + j] = v;
      }
    }
  }
  return x;
}

LayerTransform Fit(TransformKind kind = TransformKind::kPca) {
  const std::vector<float> rows = Rows(2000, 1);
  auto t = FitTransform(kind, rows.data(), 2000, kHeads, kDim);
  EXPECT_TRUE(t.ok()) << t.status();
  return *t;
}

// Coordinates of row r's head h in the transform, in double.
double Coordinate(const LayerTransform& t, const float* row, int64_t h, int64_t i) {
  double y = 0;
  for (int64_t j = 0; j < kDim; ++j) {
    y += static_cast<double>(t.head[h].basis[i * kDim + j]) *
         (row[h * kDim + j] - t.head[h].mean[j]);
  }
  return y;
}

TEST(TransformCodecTest, CodedComponentsWithinHalfAStepDroppedOnesAtTheMean) {
  const LayerTransform t = Fit();
  const int64_t n = 300;
  const std::vector<float> x = Rows(n, 2);
  for (const float step : {0.01f, 0.5f, 3.0f}) {
    std::vector<float> y = x;
    auto bytes = RoundTripTransformed(t, step, y.data(), n, 3);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    int coded = 0, dropped = 0;
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t h = 0; h < kHeads; ++h) {
        for (int64_t i = 0; i < kDim; ++i) {
          const double want = Coordinate(t, &x[r * kWidth], h, i);
          const double got = Coordinate(t, &y[r * kWidth], h, i);
          if (ComponentCoded(t.head[h].variance[i], step)) {
            ++coded;
            ASSERT_LE(std::abs(got - want), step / 2 + 1e-4 * (1 + std::abs(want)))
                << "step " << step << " row " << r << " head " << h << " component " << i;
          } else {
            ++dropped;
            ASSERT_NEAR(got, 0.0, 1e-4) << "step " << step << " component " << i;
          }
        }
      }
    }
    EXPECT_EQ(coded, n * CodedComponents(t, step));
    // Four latent factors per head: at the finest step the noise components (variance 1e-4, above
    // 0.01^2 / 12) are coded too.
    if (step == 0.01f) {
      EXPECT_GT(coded, n * kHeads * 4);
    }
    if (step == 3.0f) {
      EXPECT_GT(dropped, 0);
    }
  }
}

TEST(TransformCodecTest, LargerStepsCostFewerBytes) {
  const LayerTransform t = Fit();
  const int64_t n = 256;
  const std::vector<float> x = Rows(n, 4);
  int64_t previous = std::numeric_limits<int64_t>::max();
  for (const float step : {0.01f, 0.05f, 0.2f, 1.0f, 4.0f}) {
    std::string out;
    ASSERT_TRUE(EncodeTransformed(t, step, x.data(), n, 3, &out).ok());
    EXPECT_LT(static_cast<int64_t>(out.size()), previous) << "step " << step;
    previous = static_cast<int64_t>(out.size());
  }
  // Four factors a head at a step of a twentieth of the largest: far below f16's 2 bytes a value.
  std::string out;
  ASSERT_TRUE(EncodeTransformed(t, 0.2f, x.data(), n, 3, &out).ok());
  EXPECT_LT(static_cast<double>(out.size()), 0.15 * 2.0 * static_cast<double>(n * kWidth));
}

TEST(TransformCodecTest, RowsDecodeTheSameHoweverTheyAreChunked) {
  const LayerTransform t = Fit();
  const int64_t n = 100;
  const std::vector<float> x = Rows(n, 5);
  std::vector<float> whole = x;
  ASSERT_TRUE(RoundTripTransformed(t, 0.3f, whole.data(), n, 1).ok());
  std::vector<float> parts = x;
  ASSERT_TRUE(RoundTripTransformed(t, 0.3f, parts.data(), 37, 1).ok());
  ASSERT_TRUE(RoundTripTransformed(t, 0.3f, parts.data() + 37 * kWidth, n - 37, 9).ok());
  EXPECT_EQ(whole, parts);
}

TEST(TransformCodecTest, CodesSaturateAtTheLargestWritten) {
  const LayerTransform t = Fit(TransformKind::kIdentity);
  std::vector<float> x(kWidth);
  for (int64_t i = 0; i < kWidth; ++i) x[i] = t.head[i / kDim].mean[i % kDim];
  x[5] += 1000.0f;  // 10^6 steps of 0.001 from the mean
  x[7] -= 1000.0f;
  ASSERT_TRUE(ComponentCoded(t.head[0].variance[5], 0.001f));
  ASSERT_TRUE(ComponentCoded(t.head[0].variance[7], 0.001f));
  ASSERT_TRUE(RoundTripTransformed(t, 0.001f, x.data(), 1, 3).ok());
  EXPECT_NEAR(x[5] - t.head[0].mean[5], 32767 * 0.001, 1e-3);
  EXPECT_NEAR(x[7] - t.head[0].mean[7], -32767 * 0.001, 1e-3);
}

TEST(TransformCodecTest, NonFiniteInputCodesAsTheMean) {
  const LayerTransform t = Fit(TransformKind::kIdentity);
  std::vector<float> x(2 * kWidth, std::numeric_limits<float>::quiet_NaN());
  x[kWidth] = std::numeric_limits<float>::infinity();
  ASSERT_TRUE(RoundTripTransformed(t, 0.01f, x.data(), 2, 3).ok());
  for (int64_t i = 0; i < 2 * kWidth; ++i) {
    const int64_t h = (i % kWidth) / kDim, j = i % kDim;
    EXPECT_NEAR(x[i], t.head[h].mean[j], 0.005f) << i;
  }
}

// A chunk whose planes are `codes` (zigzagged, as the encoder lays them out) for `count` rows.
std::string Chunk(const std::vector<uint16_t>& codes) {
  std::vector<uint8_t> planes(2 * codes.size());
  for (size_t i = 0; i < codes.size(); ++i) {
    planes[i] = static_cast<uint8_t>(codes[i] & 0xff);
    planes[codes.size() + i] = static_cast<uint8_t>(codes[i] >> 8);
  }
  std::string out(ZSTD_compressBound(planes.size()), '\0');
  out.resize(ZSTD_compress(out.data(), out.size(), planes.data(), planes.size(), 3));
  return out;
}

TEST(TransformCodecTest, RefusesMalformedChunks) {
  const LayerTransform t = Fit();
  const int64_t n = 40;
  const float step = 0.5f;
  const std::vector<float> x = Rows(n, 6);
  std::string good;
  ASSERT_TRUE(EncodeTransformed(t, step, x.data(), n, 3, &good).ok());
  std::vector<float> out(n * kWidth);
  ASSERT_TRUE(DecodeTransformed(t, step, good, n, out.data()).ok());

  auto refused = [&](std::string_view data, int64_t count, float s = 0.5f) {
    std::vector<float> o(std::max<int64_t>(count, 1) * kWidth);
    const absl::Status st = DecodeTransformed(t, s, data, count, o.data());
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    return std::string(st.message());
  };
  EXPECT_THAT(refused(good.substr(0, good.size() - 3), n), HasSubstr("not a whole zstd frame"));
  EXPECT_THAT(refused(good + "xyz", n), HasSubstr("followed by 3 more"));
  EXPECT_THAT(refused("", n), HasSubstr("not a whole zstd frame"));
  EXPECT_THAT(refused(std::string(64, 'k'), n), HasSubstr("not a whole zstd frame"));
  EXPECT_THAT(refused(good, n + 1), HasSubstr("states"));
  EXPECT_THAT(refused(good, 0), HasSubstr("0 rows"));
  EXPECT_THAT(refused(good, n, 0.0f), HasSubstr("step 0"));
  EXPECT_THAT(refused(good, n, std::numeric_limits<float>::quiet_NaN()), HasSubstr("step nan"));
  EXPECT_THAT(refused(good, n, 0.01f), HasSubstr("states"));  // more components at a finer step

  // A decompression bomb: a small frame that states far more than n rows take is refused from its
  // header, before anything is allocated for it.
  const std::vector<uint16_t> zeros(5'000'000, 0);
  const std::string bomb = Chunk(zeros);
  EXPECT_LT(bomb.size(), 10'000u);
  EXPECT_THAT(refused(bomb, n), HasSubstr("states 10000000 bytes"));

  // A frame that does not state its size.
  {
    const std::vector<uint8_t> planes(2 * n * CodedComponents(t, step), 0);
    ZSTD_CCtx* cctx = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 0);
    std::string out(ZSTD_compressBound(planes.size()) + 64, '\0');
    ZSTD_outBuffer ob{out.data(), out.size(), 0};
    ZSTD_inBuffer ib{planes.data(), planes.size(), 0};
    ASSERT_EQ(ZSTD_compressStream2(cctx, &ob, &ib, ZSTD_e_end), 0u);
    ZSTD_freeCCtx(cctx);
    out.resize(ob.pos);
    EXPECT_THAT(refused(out, n), HasSubstr("does not state its content size"));
  }
  // A code the encoder never writes, and codes that decode beyond the f16 range.
  std::vector<uint16_t> codes(n * CodedComponents(t, step), 0);
  codes[5] = 0xffff;
  EXPECT_THAT(refused(Chunk(codes), n), HasSubstr("never written"));
  // +32767 on every coded component: at a step of 10, 327670 along each unit direction.
  ASSERT_GT(CodedComponents(t, 10.0f), 0);
  std::vector<float> o(n * kWidth);
  const absl::Status big = DecodeTransformed(
      t, 10.0f, Chunk(std::vector<uint16_t>(n * CodedComponents(t, 10.0f), 0xfffe)), n, o.data());
  EXPECT_THAT(big.message(), HasSubstr("f16 range"));
  // A frame whose header states the right size around blocks that hold less.
  {
    const int64_t rows = 2;
    const int64_t want = 2 * rows * CodedComponents(t, step);
    ASSERT_LT(want, 256);  // a one-byte content size field, the header's last byte
    std::vector<uint16_t> shorter(rows * CodedComponents(t, step) - 4, 0);
    std::string frame = Chunk(shorter);
    // A small frame's header: magic, a descriptor byte saying single segment, no dictionary and
    // a one-byte content size, then that byte.
    const auto descriptor = static_cast<uint8_t>(frame[4]);
    ASSERT_EQ(descriptor & 0xe3, 0x20);
    frame[5] = static_cast<char>(want);
    ASSERT_EQ(ZSTD_getFrameContentSize(frame.data(), frame.size()), static_cast<uint64_t>(want));
    EXPECT_THAT(refused(frame, rows), HasSubstr("does not decompress to the"));
  }
  // A skippable frame (no content) where no component is coded.
  {
    const float coarse = 1e4f;
    ASSERT_EQ(CodedComponents(t, coarse), 0);
    // Magic 0x184D2A50, little-endian, and a content size of 0.
    const std::string skippable("\x50\x2a\x4d\x18\0\0\0\0", 8);
    std::vector<float> o(n * kWidth);
    EXPECT_THAT(DecodeTransformed(t, coarse, skippable, n, o.data()).message(),
                HasSubstr("no frame magic"));
    std::string empty;
    ASSERT_TRUE(EncodeTransformed(t, coarse, x.data(), n, 3, &empty).ok());
    EXPECT_TRUE(DecodeTransformed(t, coarse, empty, n, o.data()).ok());
  }
  // A transform whose shape the codec cannot use, and counts past a chunk's bound.
  {
    LayerTransform short_mean = t;
    short_mean.head[2].mean.pop_back();
    std::vector<float> o(n * kWidth);
    EXPECT_THAT(DecodeTransformed(short_mean, step, good, n, o.data()).message(),
                HasSubstr("not of its size"));
    LayerTransform short_list = t;
    short_list.head.pop_back();
    std::string unused;
    EXPECT_THAT(EncodeTransformed(short_list, step, x.data(), n, 3, &unused).message(),
                HasSubstr("declared"));
    // Refused before anything is written: the buffer needs no room for them.
    EXPECT_THAT(DecodeTransformed(t, step, good, int64_t{1} << 40, o.data()).message(),
                HasSubstr("rows (1 to"));
  }
  // Bad encoder arguments.
  std::string unused;
  EXPECT_FALSE(EncodeTransformed(t, -1.0f, x.data(), n, 3, &unused).ok());
  EXPECT_FALSE(EncodeTransformed(t, 1e-40f, x.data(), n, 3, &unused).ok());  // subnormal
  EXPECT_FALSE(EncodeTransformed(t, step, x.data(), n, 99, &unused).ok());
  EXPECT_FALSE(EncodeTransformed(t, step, x.data(), 0, 3, &unused).ok());
}

// The wire chunk: the sink row in f16 ahead of the frame of the rest, decoding bit for bit what
// the frame alone and the f16 row decode to, the same however the layer is cut, within the bound.
TEST(TransformCodecTest, WireChunksSendTheSinkRowInHalfAndCodeTheRest) {
  const LayerTransform t = Fit();
  const float step = TransformStep(t, 0.25);
  EXPECT_FLOAT_EQ(step, static_cast<float>(0.25 * t.Rms()));
  const int64_t n = 40;
  const std::vector<float> rows = Rows(n, 11);
  std::string whole;
  ASSERT_TRUE(
      EncodeTransformChunk(t, step, rows.data(), 0, n, kTransformWireZstdLevel, &whole).ok());
  EXPECT_LE(static_cast<int64_t>(whole.size()), TransformChunkBound(kWidth, 0, n));
  std::vector<float> got(n * kWidth);
  ASSERT_TRUE(DecodeTransformChunk(t, step, whole, 0, n, got.data()).ok());
  // The sink row: its values rounded to f16.
  std::vector<uint16_t> half(kWidth);
  F32ToF16Row(rows.data(), half.data(), kWidth);
  for (int64_t i = 0; i < kWidth; ++i) EXPECT_EQ(got[i], F16ToF32(half[i])) << i;
  // The rest: what the frame codec gives those rows.
  std::vector<float> rest(rows.begin() + kWidth, rows.end());
  ASSERT_TRUE(RoundTripTransformed(t, step, rest.data(), n - 1, 1).ok());
  for (int64_t i = 0; i < (n - 1) * kWidth; ++i) ASSERT_EQ(got[kWidth + i], rest[i]) << i;
  // Cut as [0, 1), [1, 7), [7, n): the same rows; the sink-only chunk is exactly its f16 row.
  std::vector<float> cut(n * kWidth);
  int64_t total = 0;
  for (auto [first, count] : {std::pair<int64_t, int64_t>{0, 1}, {1, 6}, {7, n - 7}}) {
    std::string chunk;
    ASSERT_TRUE(
        EncodeTransformChunk(t, step, rows.data() + first * kWidth, first, count, 1, &chunk).ok());
    EXPECT_LE(static_cast<int64_t>(chunk.size()), TransformChunkBound(kWidth, first, count));
    if (first == 0) {
      EXPECT_EQ(static_cast<int64_t>(chunk.size()), kWidth * 2);
    }
    total += static_cast<int64_t>(chunk.size());
    ASSERT_TRUE(
        DecodeTransformChunk(t, step, chunk, first, count, cut.data() + first * kWidth).ok());
  }
  EXPECT_EQ(cut, got);
  EXPECT_LT(total, n * kWidth * 2);  // fewer bytes than f16 even cut in three
  // Rows that start after the sink carry no f16 row.
  EXPECT_EQ(TransformChunkBound(kWidth, 5, 3),
            static_cast<int64_t>(ZSTD_compressBound(3 * kWidth * 2)));
  EXPECT_EQ(TransformChunkBound(kWidth, 0, 3),
            2 * kWidth + static_cast<int64_t>(ZSTD_compressBound(2 * kWidth * 2)));
}

TEST(TransformCodecTest, RefusesMalformedWireChunks) {
  const LayerTransform t = Fit();
  const float step = TransformStep(t, 0.5);
  const std::vector<float> rows = Rows(8, 3);
  std::string chunk;
  ASSERT_TRUE(EncodeTransformChunk(t, step, rows.data(), 0, 8, 1, &chunk).ok());
  std::vector<float> out(8 * kWidth);
  auto refused = [&](std::string_view data, int64_t first, int64_t count, const char* needle) {
    const absl::Status s = DecodeTransformChunk(t, step, data, first, count, out.data());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << needle << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(needle));
  };
  refused(chunk, -1, 8, "first_token -1");
  refused(std::string_view(chunk).substr(0, kWidth), 0, 8, "sink rows");
  refused(std::string_view(chunk).substr(0, 2 * kWidth), 0, 8, "zstd frame");  // no frame
  refused(chunk, 0, 1, "sink rows");   // a sink-only chunk with a frame behind it
  refused(chunk, 3, 8, "zstd frame");  // no sink expected: f16 bytes are not a frame
  std::string nan = chunk;
  nan[10] = '\x00';
  nan[11] = '\x7e';  // f16 NaN in the sink row's sixth value
  refused(nan, 0, 8, "sink token 0 channel 5");
  std::string sink_only;
  ASSERT_TRUE(EncodeTransformChunk(t, step, rows.data(), 0, 1, 1, &sink_only).ok());
  refused(sink_only + "x", 0, 1, "sink rows");
  EXPECT_TRUE(DecodeTransformChunk(t, step, sink_only, 0, 1, out.data()).ok());
  EXPECT_EQ(EncodeTransformChunk(t, step, rows.data(), -2, 1, 1, &chunk).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeTransformChunk(t, 0.0f, rows.data(), 0, 1, 1, &chunk).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace riskkv
