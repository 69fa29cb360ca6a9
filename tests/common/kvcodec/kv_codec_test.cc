// The KV wire forms against an fp64 reference quantizer: error bounds, exact sizes, independence
// from chunking, and every kind of malformed input Decode must refuse.
#include "common/kvcodec/kv_codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace riskkv {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kHeads = 3, kDim = 64, kWidth = kHeads * kDim;

// KV-like rows: per-channel offsets and scales (a few outlier channels, as real keys have).
std::vector<float> Rows(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> scale(kWidth), offset(kWidth);
  for (int64_t c = 0; c < kWidth; ++c) {
    scale[c] = (c % 17 == 0) ? 12.f : 0.5f + 0.01f * static_cast<float>(c % 23);
    offset[c] = (c % 11 == 0) ? 4.f : 0.f;
  }
  std::vector<float> x(n * kWidth);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t c = 0; c < kWidth; ++c) x[t * kWidth + c] = offset[c] + scale[c] * g(rng);
  }
  return x;
}

// The reference: scale + min in exact arithmetic over the same groups as the wire forms; returns
// the reconstruction and, per element, the step d of its group.
struct Reference {
  std::vector<double> y, step;
};
Reference ReferenceQuantize(const std::vector<float>& x, bool values, int64_t first, int64_t n,
                            int bits) {
  const double qmax = (1 << bits) - 1;
  Reference r{std::vector<double>(x.size()), std::vector<double>(x.size())};
  auto group = [&](std::vector<int64_t> idx) {
    double lo = x[idx[0]], hi = lo;
    for (int64_t i : idx) lo = std::min(lo, double(x[i])), hi = std::max(hi, double(x[i]));
    const double d = (hi - lo) / qmax;
    for (int64_t i : idx) {
      r.y[i] = d > 0 ? lo + d * std::nearbyint((x[i] - lo) / d) : lo;
      r.step[i] = d;
    }
  };
  if (values) {
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t h = 0; h < kHeads; ++h) {
        std::vector<int64_t> idx;
        for (int64_t j = 0; j < kDim; ++j) idx.push_back(t * kWidth + h * kDim + j);
        group(idx);
      }
    }
    return r;
  }
  for (int64_t t0 = 0; t0 < n;) {
    const int64_t t1 = std::min(n, ((first + t0) / kTokenGroup + 1) * kTokenGroup - first);
    for (int64_t c = 0; c < kWidth; ++c) {
      std::vector<int64_t> idx;
      for (int64_t t = t0; t < t1; ++t) idx.push_back(t * kWidth + c);
      group(idx);
    }
    t0 = t1;
  }
  return r;
}

std::vector<float> Decoded(WireForm f, bool values, const std::vector<float>& x, int64_t first,
                           int64_t n) {
  std::string bytes;
  Encode(f, values, x.data(), first, n, kHeads, kDim, &bytes);
  EXPECT_EQ(static_cast<int64_t>(bytes.size()),
            EncodedBytes(f, values, first, n, kHeads, kDim, DType::kF32));
  std::vector<float> y(x.size());
  EXPECT_TRUE(Decode(f, values, bytes, first, n, kHeads, kDim, y.data()).ok());
  return y;
}

TEST(WireForm, NamesRoundTripAndBadTextIsNamed) {
  for (WireForm f : {WireForm::kPlain, WireForm::kInt8, WireForm::kInt4}) {
    auto parsed = ParseWireForm(WireFormName(f));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, f);
  }
  EXPECT_EQ(WireFormName(WireForm::kInt4), "int4");
  auto bad = ParseWireForm("int3");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("'int3'"));
  EXPECT_FALSE(ParseWireForm("").ok());
}

TEST(KvCodec, ErrorWithinHalfAStepOfTheReferenceAndAsSmall) {
  for (WireForm f : {WireForm::kInt8, WireForm::kInt4}) {
    const int bits = f == WireForm::kInt8 ? 8 : 4;
    for (bool values : {false, true}) {
      SCOPED_TRACE(std::string(WireFormName(f)) + (values ? " values" : " keys"));
      const int64_t first = 64, n = 77;  // two whole groups and a partial one
      const std::vector<float> x = Rows(n, 7);
      const std::vector<float> y = Decoded(f, values, x, first, n);
      const Reference ref = ReferenceQuantize(x, values, first, n, bits);
      double err = 0, ref_err = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        // The stored d is the reference's rounded up to f16 (at most 2^-10 more) and m rounded
        // down: every value within half a step.
        ASSERT_LE(std::fabs(y[i] - x[i]), 0.5 * ref.step[i] * (1 + 1.0 / 512) + 1e-5) << i;
        err += (y[i] - double(x[i])) * (y[i] - double(x[i]));
        ref_err += (ref.y[i] - x[i]) * (ref.y[i] - x[i]);
      }
      EXPECT_GT(err, 0);
      EXPECT_LT(err, ref_err * 1.05);
      EXPECT_GT(err, ref_err * 0.95);
    }
  }
}

TEST(KvCodec, ExactSizes) {
  // SmolLM2's shape at the demo's 544 tokens: the sink row in f16, then 17 key groups ([1, 32)
  // and 16 of 32) and 543 quantized value rows.
  const int64_t sink = kSinkTokens * 192 * 2;
  ASSERT_EQ(kSinkTokens, 1);
  EXPECT_EQ(EncodedBytes(WireForm::kInt8, false, 0, 544, 3, 64, DType::kF16),
            sink + 17 * 192 * 4 + 543 * 192);
  EXPECT_EQ(EncodedBytes(WireForm::kInt8, true, 0, 544, 3, 64, DType::kF16),
            sink + 543 * (3 * 4 + 192));
  EXPECT_EQ(EncodedBytes(WireForm::kInt4, false, 0, 544, 3, 64, DType::kF16),
            sink + 17 * 192 * 4 + 543 * 96);
  EXPECT_EQ(EncodedBytes(WireForm::kInt4, true, 0, 544, 3, 64, DType::kF16),
            sink + 543 * (3 * 4 + 96));
  EXPECT_EQ(LayerWireBytes(WireForm::kInt8, 544, 3, 64, DType::kF16), 228852);
  EXPECT_EQ(LayerWireBytes(WireForm::kPlain, 544, 3, 64, DType::kF16), 2 * 544 * 192 * 2);
  EXPECT_EQ(EncodedBytes(WireForm::kPlain, false, 5, 7, 3, 64, DType::kF32), 7 * 192 * 4);
  // A partial group at the end: [32, 64) and [64, 72); no sink row after the first group.
  EXPECT_EQ(EncodedBytes(WireForm::kInt8, false, 32, 40, 3, 64, DType::kF16),
            2 * 192 * 4 + 40 * 192);
  // An odd number of 4-bit codes is padded to a byte per group (keys) or token (values).
  EXPECT_EQ(EncodedBytes(WireForm::kInt4, false, 32, 1, 1, 3, DType::kF16), 3 * 4 + 2);
  EXPECT_EQ(EncodedBytes(WireForm::kInt4, true, 32, 2, 1, 3, DType::kF16), 2 * (4 + 2));
  // A chunk of the sink row alone, and the sink row and one more.
  EXPECT_EQ(EncodedBytes(WireForm::kInt4, false, 0, 1, 1, 3, DType::kF16), 3 * 2);
  EXPECT_EQ(EncodedBytes(WireForm::kInt4, true, 0, 2, 1, 3, DType::kF16), 3 * 2 + 4 + 2);
  EXPECT_EQ(EncodedBytes(WireForm::kInt4, true, 0, 0, 3, 64, DType::kF16), 0);
}

TEST(KvCodec, TheSinkRowCrossesInF16AndStaysOutOfTheGroups) {
  for (WireForm f : {WireForm::kInt8, WireForm::kInt4}) {
    const int bits = f == WireForm::kInt8 ? 8 : 4;
    for (bool values : {false, true}) {
      SCOPED_TRACE(std::string(WireFormName(f)) + (values ? " values" : " keys"));
      const int64_t n = 40;
      std::vector<float> x = Rows(n, 13);
      for (int64_t c = 0; c < kWidth; ++c) x[c] = 300.f + static_cast<float>(c);  // an outlier row
      const std::vector<float> y = Decoded(f, values, x, 0, n);
      for (int64_t c = 0; c < kWidth; ++c) ASSERT_EQ(y[c], F16ToF32(F32ToF16(x[c]))) << c;
      // The other rows decode as if the sink row were not there: their groups start at token 1.
      const std::vector<float> rest(x.begin() + kWidth, x.end());
      const Reference ref = ReferenceQuantize(rest, values, kSinkTokens, n - 1, bits);
      double err = 0, ref_err = 0;
      for (size_t i = 0; i < rest.size(); ++i) {
        const double e = y[kWidth + i] - double(rest[i]);
        ASSERT_LE(std::fabs(e), 0.5 * ref.step[i] * (1 + 1.0 / 512) + 1e-5) << i;
        err += e * e;
        ref_err += (ref.y[i] - rest[i]) * (ref.y[i] - rest[i]);
      }
      EXPECT_LT(err, ref_err * 1.05);
      std::vector<float> zero_sink = x;
      std::fill(zero_sink.begin(), zero_sink.begin() + kWidth, 0.f);
      const std::vector<float> z = Decoded(f, values, zero_sink, 0, n);
      EXPECT_TRUE(std::equal(z.begin() + kWidth, z.end(), y.begin() + kWidth));
    }
  }
}

TEST(KvCodec, ChunkingDoesNotChangeTheResult) {
  const int64_t n = 100;
  for (WireForm f : {WireForm::kInt8, WireForm::kInt4}) {
    for (bool values : {false, true}) {
      const std::vector<float> x = Rows(n, 3);
      std::vector<float> whole = x, cut = x;
      ASSERT_TRUE(RoundTrip(f, values, whole.data(), 0, n, kHeads, kDim).ok());
      int64_t sizes[] = {32, 64, 4};
      int64_t first = 0;
      int64_t bytes = 0;
      for (int64_t s : sizes) {
        ASSERT_TRUE(RoundTrip(f, values, cut.data() + first * kWidth, first, s, kHeads, kDim).ok());
        bytes += EncodedBytes(f, values, first, s, kHeads, kDim, DType::kF16);
        first += s;
      }
      EXPECT_EQ(bytes, EncodedBytes(f, values, 0, n, kHeads, kDim, DType::kF16));
      EXPECT_EQ(std::memcmp(whole.data(), cut.data(), whole.size() * 4), 0);
      EXPECT_NE(std::memcmp(whole.data(), x.data(), x.size() * 4), 0);
    }
  }
}

TEST(KvCodec, PlainIsTheRowsInTheirDtype) {
  const std::vector<float> x = Rows(5, 1);
  std::vector<float> y = x;
  ASSERT_TRUE(RoundTrip(WireForm::kPlain, false, y.data(), 3, 5, kHeads, kDim).ok());
  EXPECT_EQ(y, x);
  ASSERT_TRUE(RoundTrip(WireForm::kPlain, true, y.data(), 3, 5, kHeads, kDim, DType::kF16).ok());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], F16ToF32(F32ToF16(x[i])));
}

TEST(KvCodec, ConstantAndZeroGroupsDecodeExactly) {
  for (WireForm f : {WireForm::kInt8, WireForm::kInt4}) {
    for (bool values : {false, true}) {
      std::vector<float> zeros(40 * kWidth, 0.f), fives(40 * kWidth, 5.f);
      ASSERT_TRUE(RoundTrip(f, values, zeros.data(), 0, 40, kHeads, kDim).ok());
      ASSERT_TRUE(RoundTrip(f, values, fives.data(), 0, 40, kHeads, kDim).ok());
      for (float v : zeros) ASSERT_EQ(v, 0.f);
      for (float v : fives) ASSERT_EQ(v, 5.f);
    }
  }
}

TEST(KvCodec, HugeAndNonFiniteInputsSaturate) {
  for (WireForm f : {WireForm::kInt8, WireForm::kInt4}) {
    for (bool values : {false, true}) {
      for (int64_t first : {0, 32}) {  // in the f16 sink row and in quantized rows
        std::vector<float> x(32 * kWidth, 1.f);
        x[0] = 1e30f;
        x[1] = -std::numeric_limits<float>::infinity();
        x[2] = std::numeric_limits<float>::quiet_NaN();
        x[kWidth + 5] = -7e4f;
        std::vector<float> y = x;
        ASSERT_TRUE(RoundTrip(f, values, y.data(), first, 32, kHeads, kDim).ok());
        for (float v : y) ASSERT_TRUE(std::isfinite(v));
        const double step = 131008.0 / (f == WireForm::kInt8 ? 255 : 15);
        EXPECT_NEAR(y[0], 65504.0, step);
        EXPECT_NEAR(y[1], -65504.0, step);
        EXPECT_NEAR(y[2], 0.0, step);
        EXPECT_NEAR(y[kWidth + 5], -65504.0, step);
        // Every decoded value fits the target's f16 cache.
        for (float v : y) ASSERT_LE(std::fabs(v), 65504.f);
      }
    }
  }
}

// The byte offset of the first parameter of key channel `c` of the first group, or of value
// head `h` of the first token.
int64_t ParamOffset(int64_t i) { return 4 * i; }

absl::Status DecodeBytes(WireForm f, bool values, const std::string& bytes, int64_t first,
                         int64_t n) {
  std::vector<float> y(static_cast<size_t>(std::max<int64_t>(n, 1) * kWidth));
  return Decode(f, values, bytes, first, n, kHeads, kDim, y.data());
}

void SetF16(std::string* bytes, int64_t at, uint16_t h) {
  (*bytes)[at] = static_cast<char>(h & 0xff);
  (*bytes)[at + 1] = static_cast<char>(h >> 8);
}

TEST(KvCodec, DecodeRefusesNonFiniteAndNegativeParameters) {
  const std::vector<float> x = Rows(40, 5);
  struct Case {
    uint16_t bits;
    int64_t extra;  // 0: the scale, 2: the min
    const char* shows;
  };
  const Case cases[] = {{0x7e00, 0, "scale nan"},
                        {0x7c00, 0, "scale inf"},
                        {0xbc00, 0, "scale -1"},
                        {0xfc00, 2, "min -inf"},
                        {0x7e00, 2, "min nan"}};
  for (WireForm f : {WireForm::kInt8, WireForm::kInt4}) {
    for (bool values : {false, true}) {
      std::string good;
      Encode(f, values, x.data(), 32, 40, kHeads, kDim, &good);
      for (const Case& c : cases) {
        std::string bytes = good;
        const int64_t i = values ? 2 : 100;  // value head 2 of token 32; key channel 100
        SetF16(&bytes, ParamOffset(i) + c.extra, c.bits);
        const absl::Status st = DecodeBytes(f, values, bytes, 32, 40);
        ASSERT_FALSE(st.ok()) << c.shows;
        EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
        EXPECT_THAT(st.message(), HasSubstr(c.shows));
        EXPECT_THAT(st.message(),
                    HasSubstr(values ? "token 32 head 2" : "channel 100 of the token group at 32"));
      }
    }
  }
}

TEST(KvCodec, DecodeRefusesParametersThatLeaveTheF16Range) {
  const std::vector<float> x = Rows(40, 5);
  struct Case {
    uint16_t scale, min;
  };
  // Scale and min 60000, and scale 60000 with min 0: the higher codes decode past the f16
  // range. Min -65504 with scale 1 stays within it whatever the codes.
  const Case cases[] = {{0x7b53, 0x7b53}, {0x7b53, 0x0000}, {0x3c00, 0xfbff}};
  for (WireForm f : {WireForm::kInt8, WireForm::kInt4}) {
    for (bool values : {false, true}) {
      std::string good;
      Encode(f, values, x.data(), 32, 40, kHeads, kDim, &good);
      for (const Case& c : cases) {
        SCOPED_TRACE(std::to_string(c.scale) + " " + std::to_string(c.min));
        std::string bytes = good;
        const int64_t i = values ? 2 : 100;
        SetF16(&bytes, ParamOffset(i), c.scale);
        SetF16(&bytes, ParamOffset(i) + 2, c.min);
        const absl::Status st = DecodeBytes(f, values, bytes, 32, 40);
        if (c.scale == 0x3c00) {
          // min -65504 and scale 1 stay in range whatever the codes: accepted.
          EXPECT_TRUE(st.ok()) << st;
          continue;
        }
        ASSERT_FALSE(st.ok());
        EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
        EXPECT_THAT(st.message(), HasSubstr("within ±65504"));
        EXPECT_THAT(st.message(),
                    HasSubstr(values ? "token 32 head 2" : "channel 100 of the token group at 32"));
      }
    }
  }
}

TEST(KvCodec, DecodeRefusesANonFiniteSinkValue) {
  const std::vector<float> x = Rows(40, 5);
  for (WireForm f : {WireForm::kInt8, WireForm::kInt4}) {
    for (bool values : {false, true}) {
      std::string bytes;
      Encode(f, values, x.data(), 0, 40, kHeads, kDim, &bytes);
      ASSERT_TRUE(DecodeBytes(f, values, bytes, 0, 40).ok());
      for (uint16_t bad : {uint16_t{0x7c00}, uint16_t{0x7e00}}) {
        std::string b = bytes;
        SetF16(&b, 2 * 7, bad);  // channel 7 of the sink row
        const absl::Status st = DecodeBytes(f, values, b, 0, 40);
        ASSERT_FALSE(st.ok());
        EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
        EXPECT_THAT(st.message(), HasSubstr("token 0 channel 7 (sent in f16) is"));
      }
    }
  }
}

TEST(KvCodec, DecodeRefusesWrongSizesAlignmentAndShapes) {
  const std::vector<float> x = Rows(64, 9);
  for (WireForm f : {WireForm::kPlain, WireForm::kInt8, WireForm::kInt4}) {
    for (bool values : {false, true}) {
      std::string bytes;
      Encode(f, values, x.data(), 0, 64, kHeads, kDim, &bytes);
      ASSERT_TRUE(DecodeBytes(f, values, bytes, 0, 64).ok());
      const std::string want = std::to_string(bytes.size()) + " expected";
      for (std::string wrong : {bytes + "x", bytes.substr(0, bytes.size() - 1), std::string()}) {
        const absl::Status st = DecodeBytes(f, values, wrong, 0, 64);
        ASSERT_FALSE(st.ok());
        EXPECT_THAT(st.message(), HasSubstr(std::to_string(wrong.size()) + " bytes"));
        EXPECT_THAT(st.message(), HasSubstr(want));
      }
      // The same bytes read as a different number of rows.
      EXPECT_FALSE(DecodeBytes(f, values, bytes, 0, 63).ok());
      const absl::Status none = DecodeBytes(f, values, std::string(), 0, 0);
      ASSERT_FALSE(none.ok());
      EXPECT_THAT(none.message(), HasSubstr("0 rows"));
      EXPECT_FALSE(DecodeBytes(f, values, bytes, -32, 64).ok());
      std::vector<float> y(64 * kWidth);
      EXPECT_FALSE(Decode(f, values, bytes, 0, 64, 0, kDim, y.data()).ok());
    }
  }
  for (WireForm f : {WireForm::kInt8, WireForm::kInt4}) {
    std::string bytes;
    Encode(f, false, x.data(), 16, 48, kHeads, kDim, &bytes);
    const absl::Status st = DecodeBytes(f, false, bytes, 16, 48);
    ASSERT_FALSE(st.ok());
    EXPECT_THAT(st.message(), HasSubstr("first_token 16 is not a multiple of the 32-token group"));
    std::vector<float> y = x;
    EXPECT_FALSE(RoundTrip(f, true, y.data(), 16, 48, kHeads, kDim).ok());
  }
  // Plain rows in a dtype other than f16 and f32.
  std::string plain(64 * kWidth, '\0');
  std::vector<float> y(64 * kWidth);
  EXPECT_FALSE(
      Decode(WireForm::kPlain, false, plain, 0, 64, kHeads, kDim, y.data(), DType::kQ8_0).ok());
}

TEST(KvCodec, DecodeRefusesNonZeroPadding) {
  // One head of 3 values: 3 codes per token, the fourth nibble is padding.
  const float x[3] = {1.f, -2.f, 0.5f};
  for (bool values : {false, true}) {
    std::string bytes;
    Encode(WireForm::kInt4, values, x, 32, 1, 1, 3, &bytes);
    float y[3];
    ASSERT_TRUE(Decode(WireForm::kInt4, values, bytes, 32, 1, 1, 3, y).ok());
    bytes.back() = static_cast<char>(bytes.back() | 0x10);
    const absl::Status st = Decode(WireForm::kInt4, values, bytes, 32, 1, 1, 3, y);
    ASSERT_FALSE(st.ok());
    EXPECT_THAT(st.message(), HasSubstr("padding"));
  }
}

TEST(GroupQuant, SymmetricSchemesStayWithinHalfAStep) {
  const std::vector<float> x = Rows(1, 11);
  for (int bits : {8, 4}) {
    for (DType pd : {DType::kF16, DType::kF32}) {
      const QuantScheme s{.bits = bits, .with_min = false, .param_dtype = pd};
      std::vector<uint8_t> codes(kWidth);
      std::vector<float> y(kWidth);
      const GroupParams p = QuantizeGroup(s, x.data(), kWidth, 1, codes.data());
      ASSERT_TRUE(ParamsValid(s, p));
      uint8_t stored[8];
      StoreParams(s, p, stored);
      const GroupParams back = LoadParams(s, stored);
      EXPECT_EQ(back.scale, p.scale);
      DequantizeGroup(s, back, codes.data(), kWidth, 1, y.data());
      double absmax = 0;
      for (float v : x) absmax = std::max(absmax, std::fabs(double(v)));
      const double d = absmax / ((1 << (bits - 1)) - 1);
      for (int64_t i = 0; i < kWidth; ++i) {
        ASSERT_TRUE(CodeValid(s, codes[i]));
        ASSERT_LE(std::fabs(y[i] - x[i]), 0.5 * d * (1 + 1.0 / 512) + 1e-5);
      }
    }
  }
}

TEST(GroupQuant, FittedRangesNeverLoseToMinMax) {
  std::mt19937 rng(5);
  std::student_t_distribution<float> heavy(3.f);
  for (int bits : {8, 4}) {
    for (DType pd : {DType::kF16, DType::kF32}) {
      SCOPED_TRACE(std::to_string(bits) + " bits, " + DTypeName(pd));
      const QuantScheme minmax{.bits = bits, .with_min = true, .param_dtype = pd};
      QuantScheme fit = minmax;
      fit.fit_range = true;
      double total_fit = 0, total_minmax = 0;
      for (int g = 0; g < 300; ++g) {
        const int64_t n = g % 2 ? 32 : 64;
        std::vector<float> x(n);
        for (float& v : x) v = 0.3f + 2.f * heavy(rng);
        const float lo = *std::min_element(x.begin(), x.end());
        const float hi = *std::max_element(x.begin(), x.end());
        double err[2];
        for (int k = 0; k < 2; ++k) {
          const QuantScheme& s = k ? fit : minmax;
          std::vector<uint8_t> codes(n);
          std::vector<float> y(n);
          uint8_t stored[8];
          StoreParams(s, QuantizeGroup(s, x.data(), n, 1, codes.data()), stored);
          const GroupParams p = LoadParams(s, stored);
          ASSERT_TRUE(ParamsValid(s, p));
          DequantizeGroup(s, p, codes.data(), n, 1, y.data());
          err[k] = 0;
          for (int64_t i = 0; i < n; ++i) {
            // Within a min-max step of [lo, hi] (a least-squares line may reach a little
            // beyond its group), up to f16 rounding of m and d.
            const float slack =
                (hi - lo) / ((1 << bits) - 1) + (std::fabs(lo) + std::fabs(hi)) / 512 + 1e-6f;
            ASSERT_GE(y[i], lo - slack) << i;
            ASSERT_LE(y[i], hi + slack) << i;
            err[k] += (double(y[i]) - x[i]) * (double(y[i]) - x[i]);
          }
        }
        ASSERT_LE(err[1], err[0] * (1 + 1e-6)) << g;
        total_minmax += err[0];
        total_fit += err[1];
      }
      EXPECT_LT(total_fit, 0.9 * total_minmax);
    }
  }
}

}  // namespace
}  // namespace riskkv
