// PredictorBank: FromFits lays the maps out as the file image in memory and Open maps the file;
// both then go through the same validating parser, so an in-memory bank and a loaded one are
// built by the same code and have the same content hash.
#include "common/recovery/predictor_bank.h"

#include <openssl/evp.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/base/atomic_file.h"
#include "common/base/mapped_file.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"

namespace riskkv {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the predictor bank format assumes a little-endian host");

constexpr char kMagic[8] = {'R', 'K', 'V', 'B', 'A', 'N', 'K', '\0'};
constexpr uint64_t kChecksumOffset = 16;
constexpr uint64_t kChecksumBytes = 32;
constexpr uint64_t kFileBytesOffset = 48;
constexpr uint64_t kFixedBytes = 68;  // through the fingerprint length
constexpr uint64_t kLayerRecordBytes = 96;
constexpr uint64_t kMinGroupBytes = 8 + 4 + kLayerRecordBytes;
constexpr uint64_t kBlockAlign = 64;
// Bounds far above any real model; they keep hostile counts from exhausting memory.
constexpr uint32_t kMaxFingerprintBytes = 1024;
constexpr uint32_t kMaxGroups = 1u << 16;
constexpr uint32_t kMaxGroupLayers = 1u << 12;
constexpr int64_t kMaxDim = int64_t{1} << 24;
constexpr int32_t kMaxLayerId = 1 << 20;
constexpr uint64_t kTransformHeadBytes = 16;  // kind, layer count, heads, head_dim
constexpr uint64_t kTransformRecordBytes = 48;
// Heads, and head_dim, each: far above any real model's, and low enough that checking a basis
// orthonormal on opening stays cheap.
constexpr uint32_t kMaxTransformDim = 1024;

// A transform kind's code in the file, and back.
uint32_t TransformKindCode(TransformKind kind) {
  switch (kind) {
    case TransformKind::kHadamard:
      return 1;
    case TransformKind::kIdentity:
      return 2;
    case TransformKind::kPca:
      break;
  }
  return 0;
}

// Bytes of a transform's mean, basis and variance blocks.
std::array<uint64_t, 3> TransformBlockBytes(uint64_t heads, uint64_t dim) {
  return {4 * heads * dim, 4 * heads * dim * dim, 4 * heads * dim};
}

uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

struct MdCtxFree {
  void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
};

// SHA-256 of `data`, with the bytes [hole, hole + hole_len) read as zeros.
absl::StatusOr<std::string> Sha256(const uint8_t* data, uint64_t size, uint64_t hole = 0,
                                   uint64_t hole_len = 0) {
  static const uint8_t kZeros[kChecksumBytes] = {};
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx(EVP_MD_CTX_new());
  bool ok = ctx != nullptr && EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) == 1;
  if (hole_len > 0) {
    ok = ok && EVP_DigestUpdate(ctx.get(), data, hole) == 1 &&
         EVP_DigestUpdate(ctx.get(), kZeros, hole_len) == 1 &&
         EVP_DigestUpdate(ctx.get(), data + hole + hole_len, size - hole - hole_len) == 1;
  } else {
    ok = ok && EVP_DigestUpdate(ctx.get(), data, size) == 1;
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!ok || EVP_DigestFinal_ex(ctx.get(), digest, &len) != 1 || len != kChecksumBytes) {
    return absl::InternalError("predictor bank: SHA-256 failed (OpenSSL)");
  }
  return std::string(AsChars(digest, len));
}

std::string Hex(std::string_view bytes) { return absl::BytesToHexString(AbslView(bytes)); }

// Target and anchor ids of the groups so far: what both FromFits and the parser require. A bank
// does not know the model's depth, so only the id ceiling bounds the layers here.
absl::Status CheckGroupLayers(const std::vector<LayerGroup>& groups) {
  return ValidateGroups(groups, kMaxLayerId + 1, {.keep_first = false, .keep_last = false});
}

// Little-endian field writer over a zeroed image.
class ImageWriter {
 public:
  explicit ImageWriter(uint8_t* base) : base_(base) {}
  template <typename T>
  void Put(T v) {
    std::memcpy(base_ + pos_, &v, sizeof(T));
    pos_ += sizeof(T);
  }
  void PutBytes(const void* p, size_t n) {
    std::memcpy(base_ + pos_, p, n);
    pos_ += n;
  }
  void Align(uint64_t a) { pos_ = AlignUp(pos_, a); }
  void Seek(uint64_t pos) { pos_ = pos; }
  uint64_t pos() const { return pos_; }

 private:
  uint8_t* base_;
  uint64_t pos_ = 0;
};

}  // namespace

// The bytes of the bank: a private read-only mapping of the file, or an owned, 64-byte aligned
// heap image with the same layout.
struct PredictorBank::Storage {
  const uint8_t* data = nullptr;
  uint64_t size = 0;
  MappedFile mapped;
  uint8_t* owned = nullptr;

  ~Storage() { std::free(owned); }
};

// Sequential reader over the image, limited to [0, end). Errors name the source, the field and
// its byte offset.
class PredictorBank::Parser {
 public:
  Parser(std::string_view source, const uint8_t* base, uint64_t end)
      : source_(source), base_(base), end_(end) {}

  absl::Status Error(absl::string_view what, uint64_t at, absl::string_view problem) const {
    return absl::InvalidArgumentError(
        absl::StrCat(AbslView(source_), ": ", what, " at byte offset ", at, ": ", problem));
  }

  template <typename T>
  absl::StatusOr<T> Read(absl::string_view what) {
    if (pos_ > end_ || sizeof(T) > end_ - pos_) {
      return Error(what, pos_,
                   absl::StrCat("needs ", sizeof(T), " bytes but the header ends at byte ", end_));
    }
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  uint64_t remaining() const { return end_ - pos_; }
  uint64_t pos() const { return pos_; }
  void Seek(uint64_t pos) { pos_ = pos; }

 private:
  std::string_view source_;
  const uint8_t* base_;
  uint64_t end_;
  uint64_t pos_ = 0;
};

PredictorBank::PredictorBank() = default;
PredictorBank::~PredictorBank() = default;

absl::StatusOr<const uint8_t*> PredictorBank::ReadBlock(Parser& p, const std::string& name,
                                                        uint64_t expected, uint64_t payload_start,
                                                        uint64_t& payload_end) {
  const uint64_t size = storage_->size;
  const uint64_t field_at = p.pos();
  ASSIGN_OR_RETURN(const uint64_t offset, p.Read<uint64_t>(name + " offset"));
  ASSIGN_OR_RETURN(const uint64_t length, p.Read<uint64_t>(name + " length"));
  if (length != expected) {
    return p.Error(name, field_at + 8, absl::StrCat("length ", length, ", expected ", expected));
  }
  if (offset % kBlockAlign != 0 || offset < payload_start || offset < payload_end ||
      offset > size || length > size - offset) {
    return p.Error(name, field_at,
                   absl::StrCat("block [", offset, ", +", length,
                                ") is misaligned, overlaps another or lies outside the payload [",
                                payload_start, ", ", size, ")"));
  }
  payload_end = offset + length;
  payload_bytes_ += static_cast<int64_t>(length);
  return storage_->data + offset;
}

absl::Status PredictorBank::LoadTransforms(Parser& p, int64_t kv_width, uint64_t payload_start,
                                           uint64_t& payload_end) {
  const uint64_t at = p.pos();
  ASSIGN_OR_RETURN(const uint32_t kind_code, p.Read<uint32_t>("transform kind"));
  ASSIGN_OR_RETURN(const uint32_t n_layers, p.Read<uint32_t>("transform layer count"));
  ASSIGN_OR_RETURN(const uint32_t heads, p.Read<uint32_t>("transform heads"));
  ASSIGN_OR_RETURN(const uint32_t dim, p.Read<uint32_t>("transform head_dim"));
  if (kind_code > 2) return p.Error("transform kind", at, absl::StrCat("unknown code ", kind_code));
  if (n_layers == 0 || n_layers > static_cast<uint32_t>(kMaxLayerId) ||
      p.remaining() / (2 * kTransformRecordBytes) < n_layers) {
    return p.Error("transform layer count", at + 4,
                   absl::StrCat(n_layers, " layers' records do not fit the header"));
  }
  if (heads == 0 || heads > kMaxTransformDim || dim == 0 || dim > kMaxTransformDim) {
    return p.Error("transform shape", at + 8,
                   absl::StrCat(heads, " heads of ", dim, " outside [1, ", kMaxTransformDim, "]"));
  }
  if (kv_width != 0 && int64_t{heads} * dim != kv_width) {
    return p.Error(
        "transform shape", at + 8,
        absl::StrCat(heads, " heads of ", dim, " do not make the maps' kv_width ", kv_width));
  }
  BankTransforms t;
  t.kind = kind_code == 0   ? TransformKind::kPca
           : kind_code == 1 ? TransformKind::kHadamard
                            : TransformKind::kIdentity;
  t.layers.resize(n_layers);
  const std::array<uint64_t, 3> expected = TransformBlockBytes(heads, dim);
  const char* kNames[3] = {"mean", "basis", "variance"};
  for (uint32_t l = 0; l < n_layers; ++l) {
    for (int v = 0; v < 2; ++v) {
      const uint64_t record_at = p.pos();
      const std::string name = absl::StrCat("layer ", l, (v ? " values" : " keys"), " transform");
      const float* block[3];
      for (int b = 0; b < 3; ++b) {
        ASSIGN_OR_RETURN(const uint8_t* bytes, ReadBlock(p, absl::StrCat(name, " ", kNames[b]),
                                                         expected[b], payload_start, payload_end));
        block[b] = reinterpret_cast<const float*>(bytes);
      }
      LayerTransform& lt = t.layers[l][v];
      lt.heads = heads;
      lt.dim = dim;
      lt.head.resize(heads);
      for (uint32_t h = 0; h < heads; ++h) {
        HeadTransform& ht = lt.head[h];
        ht.mean.assign(block[0] + h * dim, block[0] + (h + 1) * dim);
        ht.basis.assign(block[1] + uint64_t{h} * dim * dim, block[1] + uint64_t{h + 1} * dim * dim);
        ht.variance.assign(block[2] + h * dim, block[2] + (h + 1) * dim);
      }
      if (absl::Status s = CheckTransform(lt, heads, dim); !s.ok()) {
        return p.Error(name, record_at, s.message());
      }
    }
  }
  transforms_ = std::move(t);
  return absl::OkStatus();
}

absl::Status PredictorBank::Load(std::string_view source, std::string_view expected_fingerprint) {
  const uint8_t* base = storage_->data;
  const uint64_t size = storage_->size;
  const absl::string_view src = AbslView(source);

  // Magic, version and length come first, so a foreign, newer or truncated file is reported as
  // such rather than as a checksum mismatch.
  const uint64_t magic_seen = std::min<uint64_t>(size, sizeof(kMagic));
  if (std::memcmp(base, kMagic, magic_seen) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        src, ": not a predictor bank (bad magic at byte offset 0, expected \"RKVBANK\")"));
  }
  if (size < kFixedBytes) {
    return absl::DataLossError(absl::StrCat(
        src, ": truncated: ", size, " bytes, shorter than the fixed header of ", kFixedBytes));
  }
  Parser header(source, base, kFixedBytes);
  header.Seek(sizeof(kMagic));
  ASSIGN_OR_RETURN(const uint32_t version, header.Read<uint32_t>("format version"));
  if (version != 1 && version != kFormatVersion) {
    return header.Error("format version", 8,
                        absl::StrCat("unsupported version ", version, " (this build reads 1 to ",
                                     kFormatVersion, ")"));
  }
  ASSIGN_OR_RETURN(const uint32_t header_bytes, header.Read<uint32_t>("header size"));
  header.Seek(kFileBytesOffset);
  ASSIGN_OR_RETURN(const uint64_t file_bytes, header.Read<uint64_t>("file size"));
  if (file_bytes != size) {
    return absl::DataLossError(absl::StrCat(
        src, ": ", size < file_bytes ? "truncated: " : "", "the file has ", size,
        " bytes but its header (byte offset ", kFileBytesOffset, ") says ", file_bytes));
  }
  ASSIGN_OR_RETURN(const std::string checksum, Sha256(base, size, kChecksumOffset, kChecksumBytes));
  const std::string_view stored = AsChars(base + kChecksumOffset, kChecksumBytes);
  if (stored != checksum) {
    return absl::DataLossError(absl::StrCat(src, ": checksum mismatch (byte offset ",
                                            kChecksumOffset, "): stored ", Hex(stored),
                                            ", computed ", Hex(checksum), "; the file is corrupt"));
  }

  // The directory, read only within [0, header_bytes).
  if (header_bytes < kFixedBytes || header_bytes > size) {
    return header.Error("header size", 12,
                        absl::StrCat(header_bytes, " is outside [", kFixedBytes, ", ", size, "]"));
  }
  Parser p(source, base, header_bytes);
  p.Seek(56);
  ASSIGN_OR_RETURN(const uint32_t dtype_code, p.Read<uint32_t>("dtype"));
  if (dtype_code > 1) return p.Error("dtype", 56, absl::StrCat("unknown code ", dtype_code));
  dtype_ = dtype_code == 0 ? DType::kF32 : DType::kF16;
  const uint64_t elem_bytes = dtype_code == 0 ? 4 : 2;
  ASSIGN_OR_RETURN(const uint32_t n_groups, p.Read<uint32_t>("group count"));
  ASSIGN_OR_RETURN(const uint32_t fp_len, p.Read<uint32_t>("fingerprint length"));
  if (fp_len == 0 || fp_len > kMaxFingerprintBytes || fp_len > p.remaining()) {
    return p.Error("fingerprint length", 64,
                   absl::StrCat(fp_len, " is outside [1, ", kMaxFingerprintBytes,
                                "] or past the header's end at byte ", header_bytes));
  }
  fingerprint_.assign(AsChars(base + p.pos(), fp_len));
  p.Seek(AlignUp(p.pos() + fp_len, 8));
  if (p.pos() > header_bytes ||
      (n_groups > 0 && (n_groups > kMaxGroups || p.remaining() / kMinGroupBytes < n_groups))) {
    return p.Error(
        "group count", 60,
        absl::StrCat(n_groups, " groups cannot fit in a header of ", header_bytes, " bytes"));
  }

  const uint64_t payload_start = AlignUp(header_bytes, kBlockAlign);
  uint64_t payload_end = header_bytes;  // end of the last block seen
  int64_t kv_width = 0;
  std::vector<LayerGroup> parsed;
  groups_.assign(n_groups, {});
  lambdas_.assign(n_groups, {});
  for (uint32_t g = 0; g < n_groups; ++g) {
    const std::string gname = absl::StrCat("group ", g);
    const uint64_t group_at = p.pos();
    ASSIGN_OR_RETURN(const uint32_t n_targets, p.Read<uint32_t>(gname + " target count"));
    ASSIGN_OR_RETURN(const uint32_t n_anchors, p.Read<uint32_t>(gname + " anchor count"));
    if (n_targets == 0 || n_targets > kMaxGroupLayers || n_anchors > kMaxGroupLayers ||
        uint64_t{4} * (n_targets + n_anchors) > p.remaining()) {
      return p.Error(
          gname, group_at,
          absl::StrCat(n_targets, " targets and ", n_anchors, " anchors do not fit the header"));
    }
    LayerGroup& group = groups_[g].group;
    for (uint32_t i = 0; i < n_targets; ++i) {
      ASSIGN_OR_RETURN(int32_t t, p.Read<int32_t>(gname + " target"));
      group.targets.push_back(t);
    }
    for (uint32_t i = 0; i < n_anchors; ++i) {
      ASSIGN_OR_RETURN(int32_t a, p.Read<int32_t>(gname + " anchor"));
      group.anchors.push_back(a);
    }
    parsed.push_back(group);
    if (absl::Status s = CheckGroupLayers(parsed); !s.ok()) {
      return p.Error(gname, group_at, s.message());
    }
    p.Seek(AlignUp(p.pos(), 8));
    if (p.pos() > header_bytes || p.remaining() / kLayerRecordBytes < n_targets) {
      return p.Error(gname, group_at, "its layer records run past the end of the header");
    }
    for (uint32_t i = 0; i < n_targets; ++i) {
      const uint64_t at = p.pos();
      const std::string lname = absl::StrCat(gname, " layer record ", i);
      ASSIGN_OR_RETURN(const int32_t layer, p.Read<int32_t>(lname));
      ASSIGN_OR_RETURN(const uint32_t reserved, p.Read<uint32_t>(lname));
      ASSIGN_OR_RETURN(const int64_t n_features, p.Read<int64_t>(lname));
      ASSIGN_OR_RETURN(const int64_t width, p.Read<int64_t>(lname));
      ASSIGN_OR_RETURN(const double lambda, p.Read<double>(lname));
      if (layer != group.targets[i]) {
        return p.Error(
            lname, at,
            absl::StrCat("layer ", layer, " is not the group's target ", group.targets[i]));
      }
      if (reserved != 0) return p.Error(lname, at + 4, "reserved field is not zero");
      if (n_features < 1 || n_features > kMaxDim || width < 1 || width > kMaxDim) {
        return p.Error(lname, at + 8,
                       absl::StrCat("F = ", n_features, ", kv_width = ", width, " outside [1, ",
                                    kMaxDim, "]"));
      }
      if (kv_width != 0 && width != kv_width) {
        return p.Error(lname, at + 16,
                       absl::StrCat("kv_width ", width, " differs from the bank's ", kv_width));
      }
      kv_width = width;
      if (!std::isfinite(lambda) || lambda < 0) {
        return p.Error(lname, at + 24, absl::StrCat("ridge lambda ", lambda));
      }
      const uint64_t matrix_bytes = static_cast<uint64_t>(width * n_features) * elem_bytes;
      const uint64_t vector_bytes = static_cast<uint64_t>(width) * 4;
      const uint64_t expected[4] = {matrix_bytes, matrix_bytes, vector_bytes, vector_bytes};
      const char* kBlockNames[4] = {"A_k", "A_v", "c_k", "c_v"};
      const uint8_t* block[4];
      for (int b = 0; b < 4; ++b) {
        ASSIGN_OR_RETURN(block[b], ReadBlock(p, absl::StrCat(lname, " ", kBlockNames[b]),
                                             expected[b], payload_start, payload_end));
      }
      FoldedMap map;
      map.layer = layer;
      map.k = WeightMatrix{dtype_, block[0], width, n_features};
      map.v = WeightMatrix{dtype_, block[1], width, n_features};
      map.c_k = std::span<const float>(reinterpret_cast<const float*>(block[2]), width);
      map.c_v = std::span<const float>(reinterpret_cast<const float*>(block[3]), width);
      groups_[g].maps.push_back(map);
      lambdas_[g].push_back(lambda);
    }
  }
  if (version >= 2) RETURN_IF_ERROR(LoadTransforms(p, kv_width, payload_start, payload_end));
  if (p.pos() != header_bytes) {
    return p.Error("directory", p.pos(),
                   absl::StrCat("ends here but the header size says ", header_bytes));
  }
  if (payload_end != size) {
    return p.Error("payload", payload_end,
                   absl::StrCat("the last block ends here but the file has ", size, " bytes"));
  }
  if (!expected_fingerprint.empty() && expected_fingerprint != fingerprint_) {
    return absl::FailedPreconditionError(
        absl::StrCat(src, ": the bank was calibrated for model ", AbslView(fingerprint_),
                     ", not for this model (", AbslView(expected_fingerprint), ")"));
  }
  ASSIGN_OR_RETURN(const std::string whole, Sha256(base, size));
  content_hash_ = Hex(whole);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PredictorBank>> PredictorBank::FromFits(
    std::string model_fingerprint, DType dtype, const std::vector<GroupFit>& fits,
    const BankTransforms* transforms) {
  const std::string src = "predictor bank (from fits)";
  if (dtype != DType::kF32 && dtype != DType::kF16) {
    return absl::InvalidArgumentError(
        absl::StrCat(src, ": dtype ", DTypeName(dtype), " is not f32 or f16"));
  }
  if (model_fingerprint.empty() || model_fingerprint.size() > kMaxFingerprintBytes) {
    return absl::InvalidArgumentError(absl::StrCat(src, ": the model fingerprint has ",
                                                   model_fingerprint.size(),
                                                   " bytes, expected 1 to ", kMaxFingerprintBytes));
  }
  if (fits.size() > kMaxGroups) {
    return absl::InvalidArgumentError(absl::StrCat(src, ": ", fits.size(), " groups"));
  }
  const uint64_t elem_bytes = dtype == DType::kF32 ? 4 : 2;

  // Validate, and lay out the directory and the payload.
  std::vector<LayerGroup> checked;
  int64_t kv_width = 0;
  uint64_t header_bytes = AlignUp(kFixedBytes + model_fingerprint.size(), 8);
  for (size_t g = 0; g < fits.size(); ++g) {
    const GroupFit& fit = fits[g];
    const std::string where = absl::StrCat(src, ": group ", g, " (", fit.group.ToString(), ")");
    if (fit.group.targets.size() > kMaxGroupLayers || fit.group.anchors.size() > kMaxGroupLayers) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": too many layers"));
    }
    checked.push_back(fit.group);
    if (absl::Status s = CheckGroupLayers(checked); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", s.message()));
    }
    if (fit.layers.size() != fit.group.targets.size()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", fit.layers.size(),
                                                     " layer fits for ", fit.group.targets.size(),
                                                     " targets"));
    }
    for (size_t i = 0; i < fit.layers.size(); ++i) {
      const LayerFit& l = fit.layers[i];
      const std::string lwhere = absl::StrCat(where, ", layer ", l.layer);
      if (l.layer != fit.group.targets[i]) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": layer fit ", i, " is for layer ",
                                                       l.layer, ", expected target ",
                                                       fit.group.targets[i]));
      }
      if (l.n_features < 1 || l.n_features > kMaxDim || l.kv_width < 1 || l.kv_width > kMaxDim) {
        return absl::InvalidArgumentError(absl::StrCat(lwhere, ": F = ", l.n_features,
                                                       ", kv_width = ", l.kv_width, " outside [1, ",
                                                       kMaxDim, "]"));
      }
      if (kv_width != 0 && l.kv_width != kv_width) {
        return absl::InvalidArgumentError(
            absl::StrCat(lwhere, ": kv_width ", l.kv_width, " differs from the bank's ", kv_width));
      }
      kv_width = l.kv_width;
      const size_t n_a = static_cast<size_t>(l.kv_width * l.n_features);
      const size_t n_c = static_cast<size_t>(l.kv_width);
      if (l.a_k.size() != n_a || l.a_v.size() != n_a || l.c_k.size() != n_c ||
          l.c_v.size() != n_c) {
        return absl::InvalidArgumentError(absl::StrCat(
            lwhere, ": a_k/a_v/c_k/c_v have ", l.a_k.size(), "/", l.a_v.size(), "/", l.c_k.size(),
            "/", l.c_v.size(), " values, expected kv_width*F = ", n_a, " and ", n_c));
      }
      if (!std::isfinite(l.ridge_lambda) || l.ridge_lambda < 0) {
        return absl::InvalidArgumentError(absl::StrCat(lwhere, ": ridge lambda ", l.ridge_lambda));
      }
    }
    header_bytes =
        AlignUp(header_bytes + 8 + 4 * (fit.group.targets.size() + fit.group.anchors.size()), 8) +
        kLayerRecordBytes * fit.layers.size();
  }
  int64_t t_heads = 0, t_dim = 0;
  if (transforms != nullptr) {
    const auto& layers = transforms->layers;
    if (layers.empty() || layers.size() > static_cast<size_t>(kMaxLayerId)) {
      return absl::InvalidArgumentError(
          absl::StrCat(src, ": transforms of ", layers.size(), " layers"));
    }
    t_heads = layers[0][0].heads;
    t_dim = layers[0][0].dim;
    if (t_heads < 1 || t_heads > kMaxTransformDim || t_dim < 1 || t_dim > kMaxTransformDim ||
        (kv_width != 0 && t_heads * t_dim != kv_width)) {
      return absl::InvalidArgumentError(absl::StrCat(src, ": transforms of ", t_heads, " heads of ",
                                                     t_dim, " for maps of kv_width ", kv_width));
    }
    for (size_t l = 0; l < layers.size(); ++l) {
      for (int v = 0; v < 2; ++v) {
        if (absl::Status s = CheckTransform(layers[l][v], t_heads, t_dim); !s.ok()) {
          return absl::InvalidArgumentError(absl::StrCat(
              src, ": layer ", l, (v ? " values" : " keys"), " transform: ", s.message()));
        }
      }
    }
    header_bytes += kTransformHeadBytes + 2 * kTransformRecordBytes * layers.size();
  }
  if (header_bytes > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(src, ": directory too large"));
  }
  uint64_t file_bytes = header_bytes;
  for (const GroupFit& fit : fits) {
    for (const LayerFit& l : fit.layers) {
      const uint64_t m = static_cast<uint64_t>(l.kv_width * l.n_features) * elem_bytes;
      const uint64_t c = static_cast<uint64_t>(l.kv_width) * 4;
      for (uint64_t len : {m, m, c, c}) file_bytes = AlignUp(file_bytes, kBlockAlign) + len;
    }
  }
  if (transforms != nullptr) {
    const std::array<uint64_t, 3> lens = TransformBlockBytes(t_heads, t_dim);
    for (size_t i = 0; i < 2 * transforms->layers.size(); ++i) {
      for (uint64_t len : lens) file_bytes = AlignUp(file_bytes, kBlockAlign) + len;
    }
  }

  auto bank = std::unique_ptr<PredictorBank>(new PredictorBank());
  bank->storage_ = std::make_unique<Storage>();
  Storage& st = *bank->storage_;
  st.owned =
      static_cast<uint8_t*>(std::aligned_alloc(kBlockAlign, AlignUp(file_bytes, kBlockAlign)));
  if (st.owned == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat(src, ": cannot allocate ", file_bytes, " bytes"));
  }
  std::memset(st.owned, 0, file_bytes);
  st.data = st.owned;
  st.size = file_bytes;

  ImageWriter w(st.owned);
  w.PutBytes(kMagic, sizeof(kMagic));
  w.Put<uint32_t>(transforms != nullptr ? kFormatVersion : 1);
  w.Put<uint32_t>(static_cast<uint32_t>(header_bytes));
  w.Seek(kFileBytesOffset);  // the checksum is filled in last
  w.Put<uint64_t>(file_bytes);
  w.Put<uint32_t>(dtype == DType::kF32 ? 0 : 1);
  w.Put<uint32_t>(static_cast<uint32_t>(fits.size()));
  w.Put<uint32_t>(static_cast<uint32_t>(model_fingerprint.size()));
  w.PutBytes(model_fingerprint.data(), model_fingerprint.size());
  w.Align(8);
  uint64_t block_pos = header_bytes;
  std::vector<float> row;
  for (size_t g = 0; g < fits.size(); ++g) {
    const GroupFit& fit = fits[g];
    w.Put<uint32_t>(static_cast<uint32_t>(fit.group.targets.size()));
    w.Put<uint32_t>(static_cast<uint32_t>(fit.group.anchors.size()));
    for (int32_t t : fit.group.targets) w.Put<int32_t>(t);
    for (int32_t a : fit.group.anchors) w.Put<int32_t>(a);
    w.Align(8);
    for (const LayerFit& l : fit.layers) {
      w.Put<int32_t>(l.layer);
      w.Put<uint32_t>(0);
      w.Put<int64_t>(l.n_features);
      w.Put<int64_t>(l.kv_width);
      w.Put<double>(l.ridge_lambda);
      const std::vector<double>* values[4] = {&l.a_k, &l.a_v, &l.c_k, &l.c_v};
      const char* kNames[4] = {"a_k", "a_v", "c_k", "c_v"};
      for (int b = 0; b < 4; ++b) {
        const std::vector<double>& v = *values[b];
        const bool half = b < 2 && dtype == DType::kF16;
        row.resize(v.size());
        for (size_t i = 0; i < v.size(); ++i) row[i] = static_cast<float>(v[i]);
        block_pos = AlignUp(block_pos, kBlockAlign);
        uint8_t* dst = st.owned + block_pos;
        const uint64_t len = v.size() * (half ? 2 : 4);
        if (half) {
          F32ToF16Row(row.data(), reinterpret_cast<uint16_t*>(dst), static_cast<int64_t>(len / 2));
        } else {
          std::memcpy(dst, row.data(), len);
        }
        // Overflow (|x| > 65504 in f16, > 3.4e38 in f32) and NaN show up as an all-ones exponent.
        for (size_t i = 0; i < v.size(); ++i) {
          uint16_t h = 0;
          if (half) std::memcpy(&h, dst + 2 * i, 2);
          if (half ? (h & 0x7c00) == 0x7c00 : !std::isfinite(row[i])) {
            return absl::InvalidArgumentError(absl::StrCat(
                src, ": group ", g, " (", fit.group.ToString(), "), layer ", l.layer, ": ",
                kNames[b], "[", i, "] = ", v[i], " is not finite in ", half ? "f16" : "f32"));
          }
        }
        w.Put<uint64_t>(block_pos);
        w.Put<uint64_t>(len);
        block_pos += len;
      }
    }
  }
  if (transforms != nullptr) {
    w.Put<uint32_t>(TransformKindCode(transforms->kind));
    w.Put<uint32_t>(static_cast<uint32_t>(transforms->layers.size()));
    w.Put<uint32_t>(static_cast<uint32_t>(t_heads));
    w.Put<uint32_t>(static_cast<uint32_t>(t_dim));
    for (const std::array<LayerTransform, 2>& layer : transforms->layers) {
      for (const LayerTransform& t : layer) {
        for (int b = 0; b < 3; ++b) {
          block_pos = AlignUp(block_pos, kBlockAlign);
          const uint64_t start = block_pos;
          for (const HeadTransform& h : t.head) {
            const std::vector<float>& v = b == 0 ? h.mean : b == 1 ? h.basis : h.variance;
            std::memcpy(st.owned + block_pos, v.data(), v.size() * 4);
            block_pos += v.size() * 4;
          }
          w.Put<uint64_t>(start);
          w.Put<uint64_t>(block_pos - start);
        }
      }
    }
  }
  ASSIGN_OR_RETURN(const std::string checksum, Sha256(st.owned, file_bytes));
  std::memcpy(st.owned + kChecksumOffset, checksum.data(), kChecksumBytes);
  RETURN_IF_ERROR(bank->Load(src, ""));
  return bank;
}

uint64_t PredictorBank::HeadBytes() { return kFixedBytes + kMaxFingerprintBytes; }

absl::Status PredictorBank::CheckHead(std::string_view source, std::string_view head,
                                      uint64_t file_bytes, std::string_view expected_fingerprint) {
  const absl::string_view src = AbslView(source);
  const auto* base = reinterpret_cast<const uint8_t*>(head.data());
  const uint64_t size = head.size();
  auto le = [&](uint64_t at, auto zero) {
    decltype(zero) v;
    std::memcpy(&v, base + at, sizeof(v));
    return v;
  };
  if (std::memcmp(base, kMagic, std::min<uint64_t>(size, sizeof(kMagic))) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        src, ": not a predictor bank (bad magic at byte offset 0, expected \"RKVBANK\")"));
  }
  if (file_bytes < kFixedBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        src, ": ", file_bytes, " bytes announced, shorter than the fixed header of ", kFixedBytes));
  }
  if (size >= 12 && le(8, uint32_t{}) != 1 && le(8, uint32_t{}) != kFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat(src,
                                                   ": format version (byte offset 8): "
                                                   "unsupported version ",
                                                   le(8, uint32_t{}), " (this build reads 1 to ",
                                                   kFormatVersion, ")"));
  }
  if (size >= kFileBytesOffset + 8 && le(kFileBytesOffset, uint64_t{}) != file_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(src, ": its header (byte offset ", kFileBytesOffset, ") says ",
                     le(kFileBytesOffset, uint64_t{}), " bytes, ", file_bytes, " were announced"));
  }
  if (size < kFixedBytes) return absl::OkStatus();
  const uint32_t fp_len = le(64, uint32_t{});
  if (fp_len == 0 || fp_len > kMaxFingerprintBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(src, ": fingerprint length (byte offset 64): ", fp_len, " is outside [1, ",
                     kMaxFingerprintBytes, "]"));
  }
  if (size < kFixedBytes + fp_len || expected_fingerprint.empty()) return absl::OkStatus();
  const std::string_view fp = AsChars(base + kFixedBytes, fp_len);
  if (fp != expected_fingerprint) {
    return absl::FailedPreconditionError(absl::StrCat(src, ": the bank was calibrated for model ",
                                                      AbslView(fp), ", not for this model (",
                                                      AbslView(expected_fingerprint), ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PredictorBank>> PredictorBank::Open(
    const std::string& path, std::string_view expected_fingerprint) {
  auto bank = std::unique_ptr<PredictorBank>(new PredictorBank());
  bank->storage_ = std::make_unique<Storage>();
  Storage& st = *bank->storage_;
  ASSIGN_OR_RETURN(st.mapped, MappedFile::Open(path));
  st.data = st.mapped.data();  // an empty file maps nothing; Load reports it as truncated
  st.size = st.mapped.size();
  RETURN_IF_ERROR(bank->Load(path, expected_fingerprint));
  return bank;
}

absl::Status PredictorBank::Write(const std::string& path) const {
  return WriteFileAtomically(path, AsChars(storage_->data, storage_->size));
}

const LayerTransform* PredictorBank::transform(int32_t layer, bool values) const {
  if (!transforms_ || layer < 0 || static_cast<size_t>(layer) >= transforms_->layers.size()) {
    return nullptr;
  }
  return &transforms_->layers[static_cast<size_t>(layer)][values ? 1 : 0];
}

const FoldedGroup* PredictorBank::FindGroupForLayer(int32_t layer) const {
  for (const FoldedGroup& g : groups_) {
    if (!g.group.targets.empty() && layer >= g.group.targets.front() &&
        layer <= g.group.targets.back()) {
      return &g;
    }
  }
  return nullptr;
}

}  // namespace riskkv
