// PredictorBank: round trips in f32 and f16, fingerprint checks, and hostile files (every
// truncation, random corruption, re-signed headers with bad fields) that must yield errors.
#include "common/recovery/predictor_bank.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <span>

#include "absl/strings/escaping.h"

namespace riskkv {
namespace {

using ::testing::HasSubstr;

constexpr char kFingerprint[] = "f00dfeed";
constexpr int64_t kKvWidth = 4;

GroupFit MakeFit(std::vector<int32_t> targets, std::vector<int32_t> anchors, int64_t f,
                 uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-3.0, 3.0);
  GroupFit fit;
  fit.group = {std::move(targets), std::move(anchors)};
  for (size_t i = 0; i < fit.group.targets.size(); ++i) {
    LayerFit l;
    l.layer = fit.group.targets[i];
    l.n_features = f;
    l.kv_width = kKvWidth;
    for (auto* v : {&l.a_k, &l.a_v}) {
      for (int64_t j = 0; j < kKvWidth * f; ++j) v->push_back(u(rng));
    }
    for (auto* v : {&l.c_k, &l.c_v}) {
      for (int64_t j = 0; j < kKvWidth; ++j) v->push_back(u(rng));
    }
    l.ridge_lambda = 0.25 * (i + 1) + seed;
    fit.layers.push_back(std::move(l));
  }
  return fit;
}

// Two groups with different feature counts: L1-2 <- L0,L3 (F = 8) and L5 <- L4,L6 (F = 12).
std::vector<GroupFit> SmallFits() {
  return {MakeFit({1, 2}, {0, 3}, 8, 1), MakeFit({5}, {4, 6}, 12, 2)};
}

std::string TempPath(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string test = info->name();
  std::replace(test.begin(), test.end(), '/', '_');  // parameterised tests: "Name/F32"
  return (std::filesystem::path(::testing::TempDir()) / (test + "_" + name)).string();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteFile(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string Sha256(std::string_view bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &len, EVP_sha256(), nullptr);
  return std::string(reinterpret_cast<const char*>(digest), len);
}

// Recomputes the checksum (SHA-256 of the file with bytes [16, 48) zeroed), so a test can reach
// the validation behind it.
void Resign(std::string& bytes) {
  std::memset(bytes.data() + 16, 0, 32);
  const std::string sum = Sha256(bytes);
  std::memcpy(bytes.data() + 16, sum.data(), 32);
}

template <typename T>
void Poke(std::string& bytes, size_t at, T v) {
  std::memcpy(bytes.data() + at, &v, sizeof(T));
}
template <typename T>
T Peek(const std::string& bytes, size_t at) {
  T v;
  std::memcpy(&v, bytes.data() + at, sizeof(T));
  return v;
}

// A header field set to a bad value (`width` bytes at `at`), and what the error must name.
struct PokedField {
  const char* name;
  size_t at;
  uint64_t value;
  int width;
  const char* expect;
};

// Each field poked into `file` and the file re-signed (so only the structural checks can tell),
// written to `path` and opened: InvalidArgument naming the field and its byte offset.
void ExpectResignedFieldsRefused(const std::string& file, const std::string& path,
                                 std::span<const PokedField> cases) {
  for (const PokedField& c : cases) {
    std::string bytes = file;
    if (c.width == 4) {
      Poke<uint32_t>(bytes, c.at, static_cast<uint32_t>(c.value));
    } else {
      Poke<uint64_t>(bytes, c.at, c.value);
    }
    Resign(bytes);
    WriteFile(path, bytes);
    auto opened = PredictorBank::Open(path, "");
    ASSERT_FALSE(opened.ok()) << c.name;
    EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(std::string(opened.status().message()), HasSubstr(c.expect)) << c.name;
    EXPECT_THAT(std::string(opened.status().message()), HasSubstr("byte offset")) << c.name;
  }
}

float MatrixValue(const WeightMatrix& w, int64_t r, int64_t c) {
  if (w.dtype == DType::kF32) return reinterpret_cast<const float*>(w.row(r))[c];
  return F16ToF32(reinterpret_cast<const uint16_t*>(w.row(r))[c]);
}

// Every value of `bank` matches `fits`: exactly in f32, within half-precision rounding in f16.
void ExpectMatches(const PredictorBank& bank, const std::vector<GroupFit>& fits) {
  ASSERT_EQ(bank.groups().size(), fits.size());
  for (size_t g = 0; g < fits.size(); ++g) {
    const FoldedGroup& fg = bank.groups()[g];
    EXPECT_EQ(fg.group, fits[g].group);
    ASSERT_EQ(fg.maps.size(), fits[g].layers.size());
    for (size_t i = 0; i < fg.maps.size(); ++i) {
      const FoldedMap& m = fg.maps[i];
      const LayerFit& l = fits[g].layers[i];
      EXPECT_EQ(m.layer, l.layer);
      EXPECT_EQ(bank.ridge_lambda(g, i), l.ridge_lambda);
      for (const WeightMatrix* w : {&m.k, &m.v}) {
        EXPECT_EQ(w->dtype, bank.dtype());
        EXPECT_EQ(w->rows, l.kv_width);
        EXPECT_EQ(w->cols, l.n_features);
        EXPECT_EQ(reinterpret_cast<uintptr_t>(w->data) % 64, 0u);
      }
      ASSERT_EQ(m.c_k.size(), static_cast<size_t>(l.kv_width));
      ASSERT_EQ(m.c_v.size(), static_cast<size_t>(l.kv_width));
      for (int64_t r = 0; r < l.kv_width; ++r) {
        EXPECT_EQ(m.c_k[r], static_cast<float>(l.c_k[r]));
        EXPECT_EQ(m.c_v[r], static_cast<float>(l.c_v[r]));
        for (int64_t c = 0; c < l.n_features; ++c) {
          const double ak = l.a_k[r * l.n_features + c], av = l.a_v[r * l.n_features + c];
          if (bank.dtype() == DType::kF32) {
            EXPECT_EQ(MatrixValue(m.k, r, c), static_cast<float>(ak));
            EXPECT_EQ(MatrixValue(m.v, r, c), static_cast<float>(av));
          } else {
            // Round to nearest with an 11-bit significand: relative error <= 2^-11.
            EXPECT_NEAR(MatrixValue(m.k, r, c), ak, std::abs(ak) * std::ldexp(1.0, -11) + 1e-7);
            EXPECT_NEAR(MatrixValue(m.v, r, c), av, std::abs(av) * std::ldexp(1.0, -11) + 1e-7);
          }
        }
      }
    }
  }
}

int64_t ExpectedPayloadBytes(const std::vector<GroupFit>& fits, int64_t elem) {
  int64_t n = 0;
  for (const GroupFit& f : fits) {
    for (const LayerFit& l : f.layers) n += 2 * l.kv_width * l.n_features * elem + 8 * l.kv_width;
  }
  return n;
}

class RoundTrip : public ::testing::TestWithParam<DType> {};

TEST_P(RoundTrip, PreservesEveryValueAndTheContentHash) {
  const std::vector<GroupFit> fits = SmallFits();
  auto made = PredictorBank::FromFits(kFingerprint, GetParam(), fits);
  ASSERT_TRUE(made.ok()) << made.status();
  const PredictorBank& mem = **made;
  EXPECT_EQ(mem.dtype(), GetParam());
  EXPECT_EQ(mem.model_fingerprint(), kFingerprint);
  EXPECT_EQ(mem.content_hash().size(), 64u);
  const int64_t elem = GetParam() == DType::kF32 ? 4 : 2;
  EXPECT_EQ(mem.bytes(), ExpectedPayloadBytes(fits, elem));
  ExpectMatches(mem, fits);

  const std::string path = TempPath("bank.rkv");
  ASSERT_TRUE(mem.Write(path).ok()) << mem.Write(path);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  const std::string file = ReadFile(path);
  EXPECT_EQ(file.substr(0, 8), std::string("RKVBANK\0", 8));
  // content_hash is what sha256sum prints for the file.
  EXPECT_EQ(mem.content_hash(), absl::BytesToHexString(Sha256(file)));

  auto opened = PredictorBank::Open(path, kFingerprint);
  ASSERT_TRUE(opened.ok()) << opened.status();
  const PredictorBank& disk = **opened;
  EXPECT_EQ(disk.content_hash(), mem.content_hash());
  EXPECT_EQ(disk.model_fingerprint(), kFingerprint);
  EXPECT_EQ(disk.dtype(), GetParam());
  EXPECT_EQ(disk.bytes(), mem.bytes());
  ExpectMatches(disk, fits);

  // Writing the opened bank reproduces the file byte for byte.
  const std::string copy = TempPath("copy.rkv");
  ASSERT_TRUE(disk.Write(copy).ok());
  EXPECT_EQ(ReadFile(copy), file);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, RoundTrip, ::testing::Values(DType::kF32, DType::kF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

TEST(PredictorBankTest, ContentHashNamesTheContent) {
  auto f32 = PredictorBank::FromFits(kFingerprint, DType::kF32, SmallFits());
  auto f32_again = PredictorBank::FromFits(kFingerprint, DType::kF32, SmallFits());
  auto f16 = PredictorBank::FromFits(kFingerprint, DType::kF16, SmallFits());
  std::vector<GroupFit> changed = SmallFits();
  changed[1].layers[0].a_v[3] += 1.0;
  auto other = PredictorBank::FromFits(kFingerprint, DType::kF32, changed);
  ASSERT_TRUE(f32.ok() && f32_again.ok() && f16.ok() && other.ok());
  EXPECT_EQ((*f32)->content_hash(), (*f32_again)->content_hash());
  EXPECT_NE((*f32)->content_hash(), (*f16)->content_hash());
  EXPECT_NE((*f32)->content_hash(), (*other)->content_hash());
}

TEST(PredictorBankTest, FindsTheGroupOfALayer) {
  auto bank = PredictorBank::FromFits(kFingerprint, DType::kF32, SmallFits());
  ASSERT_TRUE(bank.ok()) << bank.status();
  const auto& groups = (*bank)->groups();
  EXPECT_EQ((*bank)->FindGroupForLayer(1), &groups[0]);
  EXPECT_EQ((*bank)->FindGroupForLayer(2), &groups[0]);
  EXPECT_EQ((*bank)->FindGroupForLayer(5), &groups[1]);
  for (int32_t layer : {-1, 0, 3, 4, 6, 100}) {
    EXPECT_EQ((*bank)->FindGroupForLayer(layer), nullptr) << layer;
  }
}

TEST(PredictorBankTest, EmptyBankRoundTrips) {
  auto bank = PredictorBank::FromFits(kFingerprint, DType::kF16, {});
  ASSERT_TRUE(bank.ok()) << bank.status();
  const std::string path = TempPath("empty.rkv");
  ASSERT_TRUE((*bank)->Write(path).ok());
  auto opened = PredictorBank::Open(path, kFingerprint);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_TRUE((*opened)->groups().empty());
  EXPECT_EQ((*opened)->bytes(), 0);
  EXPECT_EQ((*opened)->content_hash(), (*bank)->content_hash());
}

TEST(PredictorBankTest, WriteReplacesAnExistingFile) {
  const std::string path = TempPath("bank.rkv");
  WriteFile(path, "old content");
  auto bank = PredictorBank::FromFits(kFingerprint, DType::kF32, SmallFits());
  ASSERT_TRUE(bank.ok());
  ASSERT_TRUE((*bank)->Write(path).ok());
  EXPECT_TRUE(PredictorBank::Open(path, kFingerprint).ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  const absl::Status s = (*bank)->Write(TempPath("no/such/dir/bank.rkv"));
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("no/such/dir/bank.rkv"));
}

TEST(PredictorBankTest, WrongModelIsAFailedPreconditionNamingBoth) {
  auto bank = PredictorBank::FromFits(kFingerprint, DType::kF32, SmallFits());
  ASSERT_TRUE(bank.ok());
  const std::string path = TempPath("bank.rkv");
  ASSERT_TRUE((*bank)->Write(path).ok());
  auto opened = PredictorBank::Open(path, "0123abcd");
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(opened.status().message()), HasSubstr(kFingerprint));
  EXPECT_THAT(std::string(opened.status().message()), HasSubstr("0123abcd"));
  EXPECT_THAT(std::string(opened.status().message()), HasSubstr(path));
  // An empty expectation skips the check.
  EXPECT_TRUE(PredictorBank::Open(path, "").ok());
}

// The check of a bank's first bytes as they arrive: every prefix of a sound bank passes, and each
// field it reads is refused, as Open would, once the prefix reaches it.
TEST(PredictorBankTest, CheckHeadPassesEveryPrefixAndRefusesEachFieldItReads) {
  auto bank = PredictorBank::FromFits(kFingerprint, DType::kF16, SmallFits());
  ASSERT_TRUE(bank.ok());
  const std::string path = TempPath("bank.rkv");
  ASSERT_TRUE((*bank)->Write(path).ok());
  const std::string file = ReadFile(path);
  const std::string_view whole(file);
  for (size_t n = 0; n <= std::min<size_t>(file.size(), PredictorBank::HeadBytes()); ++n) {
    EXPECT_TRUE(PredictorBank::CheckHead("b", whole.substr(0, n), file.size(), kFingerprint).ok())
        << n;
  }
  auto refused = [&](const std::string& bytes, uint64_t size, std::string_view fp,
                     absl::StatusCode code, const std::string& needle) {
    const absl::Status st = PredictorBank::CheckHead("b", bytes, size, fp);
    EXPECT_EQ(st.code(), code) << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr(needle));
  };
  std::string magic = file;
  magic[1] = 'X';
  refused(magic.substr(0, 2), file.size(), kFingerprint, absl::StatusCode::kInvalidArgument,
          "bad magic");
  std::string version = file;
  Poke<uint32_t>(version, 8, 3);
  refused(version.substr(0, 12), file.size(), kFingerprint, absl::StatusCode::kInvalidArgument,
          "unsupported version 3");
  EXPECT_TRUE(PredictorBank::CheckHead("b", version.substr(0, 11), file.size(), "").ok())
      << "the version is not read before its last byte arrives";
  refused(file.substr(0, 56), file.size() + 1, kFingerprint, absl::StatusCode::kInvalidArgument,
          "were announced");
  refused(file.substr(0, 20), 10, kFingerprint, absl::StatusCode::kInvalidArgument,
          "shorter than the fixed header");
  std::string fp_len = file;
  Poke<uint32_t>(fp_len, 64, 5000);
  refused(fp_len.substr(0, 68), file.size(), kFingerprint, absl::StatusCode::kInvalidArgument,
          "fingerprint length");
  refused(file, file.size(), "0123abcd", absl::StatusCode::kFailedPrecondition, kFingerprint);
  EXPECT_TRUE(PredictorBank::CheckHead("b", file, file.size(), "").ok())
      << "an empty expectation skips the fingerprint";
}

TEST(PredictorBankTest, MissingFileIsNotFound) {
  auto opened = PredictorBank::Open(TempPath("absent.rkv"), "");
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kNotFound);
}

TEST(PredictorBankTest, EveryTruncationIsDataLoss) {
  auto bank = PredictorBank::FromFits(kFingerprint, DType::kF16, SmallFits());
  ASSERT_TRUE(bank.ok());
  const std::string path = TempPath("bank.rkv");
  ASSERT_TRUE((*bank)->Write(path).ok());
  const std::string file = ReadFile(path);
  const std::string cut = TempPath("cut.rkv");
  for (size_t n = 0; n < file.size(); ++n) {
    WriteFile(cut, std::string_view(file).substr(0, n));
    auto opened = PredictorBank::Open(cut, "");
    ASSERT_FALSE(opened.ok()) << "truncated to " << n << " of " << file.size() << " bytes";
    EXPECT_EQ(opened.status().code(), absl::StatusCode::kDataLoss) << n << ": " << opened.status();
    EXPECT_THAT(std::string(opened.status().message()), HasSubstr("truncated")) << n;
  }
  // Trailing bytes are as wrong as missing ones.
  WriteFile(cut, file + std::string(64, '\0'));
  EXPECT_EQ(PredictorBank::Open(cut, "").status().code(), absl::StatusCode::kDataLoss);
}

TEST(PredictorBankTest, FlippedBytesFailTheChecksum) {
  auto bank = PredictorBank::FromFits(kFingerprint, DType::kF32, SmallFits());
  ASSERT_TRUE(bank.ok());
  const std::string path = TempPath("bank.rkv");
  ASSERT_TRUE((*bank)->Write(path).ok());
  const std::string file = ReadFile(path);
  std::mt19937 rng(7);
  std::uniform_int_distribution<size_t> where(16, file.size() - 1);
  std::uniform_int_distribution<int> bit(0, 7);
  const std::string bad = TempPath("bad.rkv");
  for (int trial = 0; trial < 300; ++trial) {
    size_t at = where(rng);
    if (at >= 48 && at < 56) continue;  // the file size field: a length error instead
    std::string corrupt = file;
    corrupt[at] = static_cast<char>(corrupt[at] ^ (1 << bit(rng)));
    WriteFile(bad, corrupt);
    auto opened = PredictorBank::Open(bad, kFingerprint);
    ASSERT_FALSE(opened.ok()) << "flipped byte " << at;
    EXPECT_EQ(opened.status().code(), absl::StatusCode::kDataLoss) << at;
    EXPECT_THAT(std::string(opened.status().message()), HasSubstr("checksum mismatch")) << at;
  }
}

TEST(PredictorBankTest, BadMagicAndVersion) {
  auto bank = PredictorBank::FromFits(kFingerprint, DType::kF32, SmallFits());
  ASSERT_TRUE(bank.ok());
  const std::string path = TempPath("bank.rkv");
  ASSERT_TRUE((*bank)->Write(path).ok());
  const std::string file = ReadFile(path);

  std::string magic = file;
  magic[3] = 'X';
  WriteFile(path, magic);
  auto opened = PredictorBank::Open(path, "");
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(opened.status().message()), HasSubstr("bad magic"));

  WriteFile(path, "GGUF and then something else entirely, longer than the fixed header......");
  opened = PredictorBank::Open(path, "");
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(opened.status().message()), HasSubstr("bad magic"));

  std::string version = file;
  Poke<uint32_t>(version, 8, 3);
  Resign(version);
  WriteFile(path, version);
  opened = PredictorBank::Open(path, "");
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(opened.status().message()), HasSubstr("unsupported version 3"));

  // A version 1 file relabelled 2 lacks the transform directory that version 2 puts after the
  // groups.
  Poke<uint32_t>(version, 8, 2);
  Resign(version);
  WriteFile(path, version);
  opened = PredictorBank::Open(path, "");
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(opened.status().message()), HasSubstr("transform"));
}

// Transforms for SmallFits' kv_width of 4 (2 heads of 2) for layers 0..6: PCA fitted to random
// correlated rows, so every basis is a real rotation.
BankTransforms SmallTransforms() {
  std::mt19937 rng(7);
  std::normal_distribution<float> n(0.0f, 1.0f);
  BankTransforms t;
  t.kind = TransformKind::kPca;
  for (int l = 0; l < 7; ++l) {
    std::array<LayerTransform, 2> layer;
    for (int v = 0; v < 2; ++v) {
      std::vector<float> rows;
      for (int r = 0; r < 64; ++r) {
        const float a = n(rng), b = n(rng);
        for (float x : {a + 0.3f * b + l, 2 * a - b, 0.5f * b, a - 3 * b + v}) rows.push_back(x);
      }
      auto fitted = FitTransform(TransformKind::kPca, rows.data(), 64, 2, 2);
      EXPECT_TRUE(fitted.ok()) << fitted.status();
      layer[v] = *std::move(fitted);
    }
    t.layers.push_back(std::move(layer));
  }
  return t;
}

void ExpectSameTransform(const LayerTransform& a, const LayerTransform& b) {
  ASSERT_EQ(a.heads, b.heads);
  ASSERT_EQ(a.dim, b.dim);
  ASSERT_EQ(a.head.size(), b.head.size());
  for (size_t h = 0; h < a.head.size(); ++h) {
    EXPECT_EQ(a.head[h].mean, b.head[h].mean);
    EXPECT_EQ(a.head[h].basis, b.head[h].basis);
    EXPECT_EQ(a.head[h].variance, b.head[h].variance);
  }
}

TEST(PredictorBankTest, TransformsRoundTripInVersion2AndBanksWithoutThemStayVersion1) {
  const BankTransforms transforms = SmallTransforms();
  auto with = PredictorBank::FromFits(kFingerprint, DType::kF16, SmallFits(), &transforms);
  ASSERT_TRUE(with.ok()) << with.status();
  auto without = PredictorBank::FromFits(kFingerprint, DType::kF16, SmallFits());
  ASSERT_TRUE(without.ok());
  EXPECT_EQ((*without)->transforms(), nullptr);
  EXPECT_EQ((*without)->transform(0, false), nullptr);
  EXPECT_NE((*with)->content_hash(), (*without)->content_hash());
  // 14 transforms of 2 heads: mean 4, basis 8 and variance 4 floats each.
  EXPECT_EQ((*with)->bytes(), (*without)->bytes() + 14 * 16 * 4);

  const std::string path = TempPath("bank.rkv"), plain = TempPath("plain.rkv");
  ASSERT_TRUE((*with)->Write(path).ok());
  ASSERT_TRUE((*without)->Write(plain).ok());
  const std::string file = ReadFile(path);
  EXPECT_EQ(Peek<uint32_t>(file, 8), 2u);
  EXPECT_EQ(Peek<uint32_t>(ReadFile(plain), 8), 1u);
  auto opened = PredictorBank::Open(path, kFingerprint);
  ASSERT_TRUE(opened.ok()) << opened.status();
  const PredictorBank& bank = **opened;
  EXPECT_EQ(bank.content_hash(), (*with)->content_hash());
  ExpectMatches(bank, SmallFits());
  ASSERT_NE(bank.transforms(), nullptr);
  EXPECT_EQ(bank.transforms()->kind, TransformKind::kPca);
  ASSERT_EQ(bank.transforms()->layers.size(), 7u);
  for (int32_t l = 0; l < 7; ++l) {
    for (bool v : {false, true}) {
      ASSERT_NE(bank.transform(l, v), nullptr);
      ExpectSameTransform(*bank.transform(l, v), transforms.layers[l][v ? 1 : 0]);
    }
  }
  EXPECT_EQ(bank.transform(7, false), nullptr);
  EXPECT_EQ(bank.transform(-1, true), nullptr);
  const std::string copy = TempPath("copy.rkv");
  ASSERT_TRUE(bank.Write(copy).ok());
  EXPECT_EQ(ReadFile(copy), file);

  // Transforms alone (no rebuilt group) make a bank too.
  auto alone = PredictorBank::FromFits(kFingerprint, DType::kF32, {}, &transforms);
  ASSERT_TRUE(alone.ok()) << alone.status();
  ASSERT_TRUE((*alone)->Write(path).ok());
  opened = PredictorBank::Open(path, kFingerprint);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_TRUE((*opened)->groups().empty());
  ExpectSameTransform(*(*opened)->transform(6, true), transforms.layers[6][1]);
}

TEST(PredictorBankTest, ResignedBadTransformFieldsAreInvalidArgument) {
  const BankTransforms transforms = SmallTransforms();
  auto bank = PredictorBank::FromFits(kFingerprint, DType::kF32, SmallFits(), &transforms);
  ASSERT_TRUE(bank.ok());
  const std::string path = TempPath("bank.rkv");
  ASSERT_TRUE((*bank)->Write(path).ok());
  const std::string file = ReadFile(path);
  // The transform directory closes the header: 16 bytes, then 14 records of 48.
  const size_t dir = Peek<uint32_t>(file, 12) - 16 - 14 * 48, rec = dir + 16;
  ASSERT_EQ(Peek<uint32_t>(file, dir + 4), 7u);
  const uint64_t basis0 = Peek<uint64_t>(file, rec + 16);
  const PokedField cases[] = {
      {"kind", dir, 9, 4, "transform kind"},
      {"layer count", dir + 4, 0, 4, "transform layer count"},
      {"too many layers", dir + 4, 1000, 4, "do not fit the header"},
      {"heads", dir + 8, 0, 4, "0 heads"},
      {"head_dim", dir + 12, 5000, 4, "outside [1, 1024]"},
      {"shape against kv_width", dir + 8, 1, 4, "kv_width"},
      {"mean length", rec + 8, 12, 8, "expected 16"},
      {"basis misaligned", rec + 16, basis0 + 4, 8, "misaligned"},
      {"basis not orthonormal", basis0, 0x3f800000u, 4, "orthonormal"},
      {"variance negative", Peek<uint64_t>(file, rec + 32), 0xbf800000u, 4, "varian"},
      {"mean not finite", Peek<uint64_t>(file, rec), 0x7fc00000u, 4, "mean 0 is nan"},
  };
  ExpectResignedFieldsRefused(file, path, cases);

  // Every byte of the transform directory changed and re-signed: an error or a bank whose
  // transforms have the shape they claim, never a crash.
  for (size_t at = dir; at < dir + 16 + 14 * 48; ++at) {
    for (uint8_t x : {0x01, 0x80, 0xff}) {
      std::string bytes = file;
      bytes[at] = static_cast<char>(bytes[at] ^ x);
      Resign(bytes);
      WriteFile(path, bytes);
      auto opened = PredictorBank::Open(path, "");
      if (!opened.ok()) continue;
      for (const auto& layer : (*opened)->transforms()->layers) {
        for (const LayerTransform& t : layer) EXPECT_TRUE(CheckTransform(t, 2, 2).ok());
      }
    }
  }
}

TEST(PredictorBankTest, FromFitsRejectsBadTransforms) {
  struct Case {
    const char* name;
    std::function<void(BankTransforms&)> mutate;
    const char* expect;
  };
  const Case cases[] = {
      {"no layers", [](auto& t) { t.layers.clear(); }, "transforms of 0 layers"},
      {"shape against kv_width",
       [](auto& t) {
         auto rows = std::vector<float>(3 * 64, 1.0f);
         for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(i % 7);
         for (auto& layer : t.layers) {
           for (auto& lt : layer)
             lt = *FitTransform(TransformKind::kIdentity, rows.data(), 64, 1, 3);
         }
       },
       "kv_width 4"},
      {"shape between layers", [](auto& t) { t.layers[3][1].head.pop_back(); }, "layer 3 values"},
      {"not orthonormal", [](auto& t) { t.layers[2][0].head[1].basis[0] = 2; }, "orthonormal"},
  };
  for (const Case& c : cases) {
    BankTransforms t = SmallTransforms();
    c.mutate(t);
    auto bank = PredictorBank::FromFits(kFingerprint, DType::kF32, SmallFits(), &t);
    ASSERT_FALSE(bank.ok()) << c.name;
    EXPECT_EQ(bank.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(std::string(bank.status().message()), HasSubstr(c.expect)) << c.name;
  }
}

// Header fields with a valid checksum, as a buggy writer could produce: each must be caught by
// the structural checks, with a message naming the field.
TEST(PredictorBankTest, ResignedBadFieldsAreInvalidArgument) {
  auto bank = PredictorBank::FromFits(kFingerprint, DType::kF32, SmallFits());
  ASSERT_TRUE(bank.ok());
  const std::string path = TempPath("bank.rkv");
  ASSERT_TRUE((*bank)->Write(path).ok());
  const std::string file = ReadFile(path);
  // Layout of SmallFits: fingerprint (8 bytes) at 68, group 0 at 80: counts, targets 1,2,
  // anchors 0,3 (24 bytes), then its first layer record at 104.
  ASSERT_EQ(Peek<uint32_t>(file, 80), 2u);
  ASSERT_EQ(Peek<int32_t>(file, 104), 1);
  const size_t rec = 104, kRecord = 96;
  const PokedField cases[] = {
      {"dtype", 56, 7, 4, "dtype"},
      {"group count", 60, 100000, 4, "group count"},
      {"fingerprint length", 64, 5000, 4, "fingerprint length"},
      {"header size", 12, 20, 4, "header size"},
      {"target order", 88, 3, 4, "consecutive"},
      {"anchor is a target", 96, 2, 4, "also a target"},
      {"layer id", rec, 2, 4, "not the group's target"},
      {"reserved", rec + 4, 1, 4, "reserved"},
      {"features", rec + 8, 0, 8, "F = 0"},
      {"kv width", rec + kRecord + 16, 5, 8, "differs from the bank's 4"},
      {"lambda", rec + 24, 0xfff0000000000000ull, 8, "ridge lambda"},  // -inf
      {"misaligned block", rec + 32, Peek<uint64_t>(file, rec + 32) + 4, 8, "misaligned"},
      {"overlapping block", rec + 48, Peek<uint64_t>(file, rec + 32), 8, "overlaps"},
      {"block past the end", rec + 80, uint64_t{1} << 62, 8, "outside"},
      {"block length", rec + 40, 4, 8, "expected 128"},
  };
  ExpectResignedFieldsRefused(file, path, cases);
}

// Every header byte changed and re-signed: Open must return (an error or a consistent bank),
// never crash or read out of bounds (this test is meant for the sanitizer build too).
TEST(PredictorBankTest, ResignedHeaderMutationsNeverCrash) {
  auto bank = PredictorBank::FromFits(kFingerprint, DType::kF16, SmallFits());
  ASSERT_TRUE(bank.ok());
  const std::string path = TempPath("bank.rkv");
  ASSERT_TRUE((*bank)->Write(path).ok());
  const std::string file = ReadFile(path);
  const uint32_t header_bytes = Peek<uint32_t>(file, 12);
  int errors = 0;
  for (size_t at = 8; at < header_bytes; ++at) {
    if (at >= 16 && at < 56) continue;  // checksum and file size: covered elsewhere
    for (uint8_t x : {0x01, 0x10, 0x80, 0xff}) {
      std::string bytes = file;
      bytes[at] = static_cast<char>(bytes[at] ^ x);
      Resign(bytes);
      WriteFile(path, bytes);
      auto opened = PredictorBank::Open(path, "");
      if (!opened.ok()) {
        ++errors;
        continue;
      }
      for (const FoldedGroup& g : (*opened)->groups()) {
        for (const FoldedMap& m : g.maps) {
          ASSERT_EQ(m.c_k.size(), static_cast<size_t>(m.k.rows));
          ASSERT_EQ(m.c_v.size(), static_cast<size_t>(m.v.rows));
        }
      }
    }
  }
  // Padding and lambda bits may change harmlessly; nearly everything else must be refused.
  EXPECT_GT(errors, static_cast<int>(header_bytes) * 2);
}

TEST(PredictorBankTest, FromFitsRejectsInconsistentFits) {
  struct Case {
    const char* name;
    std::function<void(std::vector<GroupFit>&)> mutate;
    const char* expect;
  };
  const Case cases[] = {
      {"a_k size", [](auto& f) { f[0].layers[0].a_k.pop_back(); }, "expected kv_width*F"},
      {"a_v size", [](auto& f) { f[1].layers[0].a_v.push_back(0); }, "expected kv_width*F"},
      {"c_k size", [](auto& f) { f[0].layers[1].c_k.pop_back(); }, "expected kv_width*F"},
      {"c_v size", [](auto& f) { f[0].layers[1].c_v.clear(); }, "expected kv_width*F"},
      {"layer id", [](auto& f) { f[0].layers[1].layer = 7; }, "expected target 2"},
      {"layer count", [](auto& f) { f[0].layers.pop_back(); }, "1 layer fits for 2 targets"},
      {"kv width across groups",
       [](auto& f) {
         f[1] = MakeFit({5}, {4, 6}, 12, 2);
         for (auto& l : f[1].layers) {
           l.kv_width = 2;
           l.a_k.resize(24);
           l.a_v.resize(24);
           l.c_k.resize(2);
           l.c_v.resize(2);
         }
       },
       "differs from the bank's 4"},
      {"zero features", [](auto& f) { f[0].layers[0].n_features = 0; }, "F = 0"},
      {"targets not consecutive",
       [](auto& f) {
         f[0].group.targets = {1, 3};
       },
       "consecutive"},
      {"target twice",
       [](auto& f) {
         f.push_back(MakeFit({2}, {0, 3}, 8, 3));
       },
       "two groups"},
      {"anchor is a target",
       [](auto& f) {
         f[0].group.anchors = {0, 2};
       },
       "also a target"},
      {"no targets",
       [](auto& f) {
         f[0].group.targets.clear();
         f[0].layers.clear();
       },
       "no target"},
      {"NaN", [](auto& f) { f[0].layers[0].a_v[5] = std::nan(""); }, "a_v[5]"},
      {"f32 overflow", [](auto& f) { f[0].layers[0].c_k[1] = 1e300; }, "c_k[1]"},
      {"negative lambda", [](auto& f) { f[1].layers[0].ridge_lambda = -1; }, "ridge lambda"},
  };
  for (const Case& c : cases) {
    std::vector<GroupFit> fits = SmallFits();
    c.mutate(fits);
    auto bank = PredictorBank::FromFits(kFingerprint, DType::kF32, fits);
    ASSERT_FALSE(bank.ok()) << c.name;
    EXPECT_EQ(bank.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(std::string(bank.status().message()), HasSubstr(c.expect)) << c.name;
  }
}

TEST(PredictorBankTest, FromFitsChecksDtypeFingerprintAndHalfRange) {
  std::vector<GroupFit> big = SmallFits();
  big[0].layers[0].a_k[2] = 1e6;  // fine in f32, infinite in f16
  EXPECT_TRUE(PredictorBank::FromFits(kFingerprint, DType::kF32, big).ok());
  auto half = PredictorBank::FromFits(kFingerprint, DType::kF16, big);
  EXPECT_EQ(half.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(half.status().message()), HasSubstr("a_k[2]"));
  EXPECT_THAT(std::string(half.status().message()), HasSubstr("f16"));
  big[0].layers[0].a_k[2] = 65504.0;  // the largest half
  EXPECT_TRUE(PredictorBank::FromFits(kFingerprint, DType::kF16, big).ok());

  EXPECT_EQ(PredictorBank::FromFits(kFingerprint, DType::kQ4_0, SmallFits()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PredictorBank::FromFits("", DType::kF32, SmallFits()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace riskkv
