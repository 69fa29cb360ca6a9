// GGUF v2/v3 parser: maps the file read-only and checks every length and offset against the file
// size before touching the bytes, so a truncated or hostile file yields a Status, never a crash.
#include "common/formats/gguf_file.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"

namespace riskkv {
namespace {

// Multi-byte fields are copied straight out of the mapping.
static_assert(std::endian::native == std::endian::little,
              "GGUF parsing assumes a little-endian host");

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint64_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;
// Far above any real vocabulary (~10^5 entries); keeps a hostile count from exhausting memory.
constexpr uint64_t kMaxArrayLength = uint64_t{1} << 24;
// Smallest possible encodings, used to reject absurd counts before looping or reserving.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;  // key length, value type, 1-byte value
// Tensor info: name length, n_dims, ne[0], type, offset.
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;

using Type = GgufValue::Type;

// Per metadata value type, indexed by its id: name, and encoded size (for strings the 8-byte
// length prefix, for arrays the element-type field: lower bounds used to bound counts).
struct TypeInfo {
  const char* name;
  uint64_t min_size;
  bool is_integer;
};
constexpr TypeInfo kTypeInfo[] = {
    {"uint8", 1, true},    {"int8", 1, true},   {"uint16", 2, true},   {"int16", 2, true},
    {"uint32", 4, true},   {"int32", 4, true},  {"float32", 4, false}, {"bool", 1, false},
    {"string", 8, false},  {"array", 4, false}, {"uint64", 8, true},   {"int64", 8, true},
    {"float64", 8, false},
};
const TypeInfo& Info(Type t) { return kTypeInfo[static_cast<uint32_t>(t)]; }
const char* TypeName(Type t) { return Info(t).name; }
bool IsInteger(Type t) { return Info(t).is_integer; }
bool IsFloat(Type t) { return t == Type::kFloat32 || t == Type::kFloat64; }

// ggml type ids we can load, plus names of common ones we cannot (for the error message).
struct GgmlType {
  uint32_t id;
  const char* name;
  std::optional<DType> dtype;
};
const GgmlType kGgmlTypes[] = {
    {0, "F32", DType::kF32},
    {1, "F16", DType::kF16},
    {2, "Q4_0", DType::kQ4_0},
    {3, "Q4_1", DType::kQ4_1},
    {6, "Q5_0", {}},
    {7, "Q5_1", {}},
    {8, "Q8_0", DType::kQ8_0},
    {9, "Q8_1", {}},
    {10, "Q2_K", {}},
    {11, "Q3_K", {}},
    {12, "Q4_K", {}},
    {13, "Q5_K", {}},
    {14, "Q6_K", {}},
    {15, "Q8_K", {}},
    {24, "I8", {}},
    {25, "I16", {}},
    {26, "I32", {}},
    {27, "I64", {}},
    {28, "F64", {}},
    {30, "BF16", DType::kBF16},
};
GgmlType LookupGgmlType(uint32_t id) {
  for (const GgmlType& t : kGgmlTypes) {
    if (t.id == id) return t;
  }
  return {id, "unknown", std::nullopt};
}

}  // namespace

// Sequential reader over the mapping. Every read checks the bytes remaining first; errors name
// the file, the current context (which entry is being parsed), what was read and its offset.
class GgufParser {
 public:
  explicit GgufParser(GgufFile& file)
      : f_(file), base_(file.mapping_.data()), size_(file.mapping_.size()) {}

  absl::Status Parse();

 private:
  uint64_t remaining() const { return size_ - pos_; }

  absl::Status Error(uint64_t at, absl::string_view what, absl::string_view problem) const {
    return absl::InvalidArgumentError(absl::StrCat(f_.path_, ": ", context_,
                                                   context_.empty() ? "" : ": ", what,
                                                   " at byte offset ", at, ": ", problem));
  }

  absl::Status Need(uint64_t n, absl::string_view what) const {
    if (n <= remaining()) return absl::OkStatus();
    return Error(pos_, what,
                 absl::StrCat("needs ", n, " bytes but the file ends after ", remaining(),
                              " (file size ", size_, ")"));
  }

  template <typename T>
  absl::StatusOr<T> Read(absl::string_view what) {
    RETURN_IF_ERROR(Need(sizeof(T), what));
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  absl::StatusOr<std::string> ReadString(absl::string_view what) {
    const uint64_t at = pos_;
    ASSIGN_OR_RETURN(uint64_t len, Read<uint64_t>(what));
    if (len > remaining()) {
      return Error(at, what,
                   absl::StrCat("string length ", len, " exceeds the ", remaining(),
                                " bytes left in the file (file size ", size_, ")"));
    }
    std::string s(AsChars(base_ + pos_, len));
    pos_ += len;
    return s;
  }

  absl::StatusOr<Type> ReadType(absl::string_view what) {
    const uint64_t at = pos_;
    ASSIGN_OR_RETURN(uint32_t raw, Read<uint32_t>(what));
    if (raw > static_cast<uint32_t>(Type::kFloat64)) {
      return Error(at, what, absl::StrCat("unknown metadata value type ", raw));
    }
    return static_cast<Type>(raw);
  }

  template <typename T>
  absl::StatusOr<int64_t> Widen(absl::string_view what) {
    ASSIGN_OR_RETURN(T v, Read<T>(what));
    return static_cast<int64_t>(v);
  }

  absl::StatusOr<GgufValue> ReadValue(Type type);
  absl::Status ReadArray(GgufValue& value);
  // Reads one integer or bool of `type` (not float/string/array) as int64, or reports overflow.
  absl::StatusOr<int64_t> ReadIntElement(Type type);
  absl::Status ReadMetadata(uint64_t index);
  absl::Status ReadTensorInfo(uint64_t index, std::vector<uint64_t>& rel_offsets,
                              std::vector<uint64_t>& info_offsets);

  GgufFile& f_;
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
  uint64_t alignment_ = kDefaultAlignment;
  std::string context_;
};

absl::StatusOr<int64_t> GgufParser::ReadIntElement(Type type) {
  const uint64_t at = pos_;
  switch (type) {
    case Type::kUint8:
      return Widen<uint8_t>("uint8");
    case Type::kInt8:
      return Widen<int8_t>("int8");
    case Type::kUint16:
      return Widen<uint16_t>("uint16");
    case Type::kInt16:
      return Widen<int16_t>("int16");
    case Type::kUint32:
      return Widen<uint32_t>("uint32");
    case Type::kInt32:
      return Widen<int32_t>("int32");
    case Type::kInt64:
      return Widen<int64_t>("int64");
    case Type::kUint64: {
      ASSIGN_OR_RETURN(uint64_t v, Read<uint64_t>("uint64"));
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Error(at, "uint64 array element",
                     absl::StrCat("value ", v, " does not fit in int64"));
      }
      return static_cast<int64_t>(v);
    }
    case Type::kBool: {
      ASSIGN_OR_RETURN(uint8_t v, Read<uint8_t>("bool"));
      if (v > 1) return Error(at, "bool", absl::StrCat("value ", int{v}, " is neither 0 nor 1"));
      return v;
    }
    default:
      return Error(at, TypeName(type), "not an integer type");
  }
}

absl::StatusOr<GgufValue> GgufParser::ReadValue(Type type) {
  GgufValue value;
  value.type = type;
  if (type == Type::kUint64) {  // the one integer type that may not fit in int64
    ASSIGN_OR_RETURN(uint64_t v, Read<uint64_t>("uint64 value"));
    value.scalar = v;
  } else if (IsInteger(type) || type == Type::kBool) {
    ASSIGN_OR_RETURN(int64_t v, ReadIntElement(type));
    const bool is_signed =
        type == Type::kInt8 || type == Type::kInt16 || type == Type::kInt32 || type == Type::kInt64;
    if (is_signed) {
      value.scalar = v;
    } else {
      value.scalar = static_cast<uint64_t>(v);
    }
  } else if (type == Type::kFloat32) {
    ASSIGN_OR_RETURN(float v, Read<float>("float32 value"));
    value.scalar = static_cast<double>(v);
  } else if (type == Type::kFloat64) {
    ASSIGN_OR_RETURN(double v, Read<double>("float64 value"));
    value.scalar = v;
  } else if (type == Type::kString) {
    ASSIGN_OR_RETURN(std::string s, ReadString("string value"));
    value.scalar = std::move(s);
  } else {
    RETURN_IF_ERROR(ReadArray(value));
  }
  return value;
}

absl::Status GgufParser::ReadArray(GgufValue& value) {
  const uint64_t type_at = pos_;
  ASSIGN_OR_RETURN(Type elem, ReadType("array element type"));
  if (elem == Type::kArray) {
    return Error(type_at, "array element type", "nested arrays are not supported");
  }
  value.array_type = elem;
  const uint64_t count_at = pos_;
  ASSIGN_OR_RETURN(uint64_t count, Read<uint64_t>("array length"));
  // Bound the count before reserving anything: parsed elements take up to 32x their encoded size
  // (a 1-byte value widened to int64, an empty string as std::string), hence also a hard cap.
  if (count > kMaxArrayLength) {
    return Error(count_at, "array length",
                 absl::StrCat("array of ", count, " ", TypeName(elem),
                              " elements exceeds the limit of ", kMaxArrayLength));
  }
  const uint64_t min_size = Info(elem).min_size;
  if (count > remaining() / min_size) {
    return Error(count_at, "array length",
                 absl::StrCat("array of ", count, " ", TypeName(elem), " elements needs at least ",
                              min_size, " bytes each but only ", remaining(),
                              " bytes are left in the file (file size ", size_, ")"));
  }
  if (elem == Type::kString) {
    value.strings.reserve(count);
    for (uint64_t i = 0; i < count; ++i) {
      ASSIGN_OR_RETURN(std::string s, ReadString("string array element"));
      value.strings.push_back(std::move(s));
    }
  } else if (IsFloat(elem)) {
    value.floats.reserve(count);
    for (uint64_t i = 0; i < count; ++i) {
      if (elem == Type::kFloat32) {
        ASSIGN_OR_RETURN(float v, Read<float>("float32 array element"));
        value.floats.push_back(v);
      } else {
        ASSIGN_OR_RETURN(double v, Read<double>("float64 array element"));
        value.floats.push_back(v);
      }
    }
  } else {
    value.ints.reserve(count);
    for (uint64_t i = 0; i < count; ++i) {
      ASSIGN_OR_RETURN(int64_t v, ReadIntElement(elem));
      value.ints.push_back(v);
    }
  }
  return absl::OkStatus();
}

absl::Status GgufParser::ReadMetadata(uint64_t index) {
  context_ = absl::StrCat("metadata entry #", index);
  const uint64_t key_at = pos_;
  ASSIGN_OR_RETURN(std::string key, ReadString("key"));
  context_ = absl::StrCat("metadata entry #", index, " '", key, "'");
  if (f_.metadata_index_.count(key) != 0) return Error(key_at, "key", "duplicate metadata key");
  ASSIGN_OR_RETURN(Type type, ReadType("value type"));
  const uint64_t value_at = pos_;
  ASSIGN_OR_RETURN(GgufValue value, ReadValue(type));
  if (key == "general.alignment") {
    // Any integer type is accepted (the spec says uint32); the value must be a power of two.
    if (!IsInteger(type)) {
      return Error(value_at, "value",
                   absl::StrCat("alignment must be an integer, got ", TypeName(type)));
    }
    const auto* s = std::get_if<int64_t>(&value.scalar);
    if (s != nullptr && *s <= 0) {
      return Error(value_at, "value",
                   absl::StrCat("alignment must be a positive power of two, got ", *s));
    }
    const uint64_t a = s != nullptr ? static_cast<uint64_t>(*s) : std::get<uint64_t>(value.scalar);
    if (!std::has_single_bit(a)) {
      return Error(value_at, "value",
                   absl::StrCat("alignment must be a positive power of two, got ", a));
    }
    alignment_ = a;
  }
  f_.metadata_index_.emplace(key, f_.metadata_.size());
  f_.metadata_.emplace_back(std::move(key), std::move(value));
  return absl::OkStatus();
}

absl::Status GgufParser::ReadTensorInfo(uint64_t index, std::vector<uint64_t>& rel_offsets,
                                        std::vector<uint64_t>& info_offsets) {
  context_ = absl::StrCat("tensor info #", index);
  const uint64_t info_at = pos_;
  ASSIGN_OR_RETURN(std::string name, ReadString("name"));
  context_ = absl::StrCat("tensor info #", index, " '", name, "'");
  if (f_.tensor_index_.count(name) != 0) return Error(info_at, "name", "duplicate tensor name");
  const uint64_t dims_at = pos_;
  ASSIGN_OR_RETURN(uint32_t n_dims, Read<uint32_t>("n_dims"));
  if (n_dims < 1 || n_dims > kMaxDims) {
    return Error(dims_at, "n_dims",
                 absl::StrCat("n_dims ", n_dims, " is outside [1, ", kMaxDims, "]"));
  }
  int64_t ne[kMaxDims] = {};
  int64_t numel = 1;
  for (uint32_t i = 0; i < n_dims; ++i) {
    const uint64_t at = pos_;
    ASSIGN_OR_RETURN(uint64_t d, Read<uint64_t>("dimension"));
    if (d == 0 || d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Error(at, "dimension", absl::StrCat("ne[", i, "] = ", d, " is not in [1, 2^63)"));
    }
    ne[i] = static_cast<int64_t>(d);
    if (__builtin_mul_overflow(numel, ne[i], &numel)) {
      return Error(at, "dimension", "element count overflows int64");
    }
  }
  const uint64_t type_at = pos_;
  ASSIGN_OR_RETURN(uint32_t type_id, Read<uint32_t>("ggml type"));
  const GgmlType ggml = LookupGgmlType(type_id);
  if (!ggml.dtype) {
    return Error(type_at, "ggml type",
                 absl::StrCat("tensor '", name, "' has unsupported ggml type ", type_id, " (",
                              ggml.name, "); supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1"));
  }
  const int64_t block = BlockSize(*ggml.dtype);
  if (ne[0] % block != 0) {
    return Error(type_at, "ggml type",
                 absl::StrCat("innermost dimension ", ne[0], " is not a multiple of the ",
                              ggml.name, " block size ", block));
  }
  // RowBytes(dtype, ne0) times the outer dims, each step checked: F32 rows alone can overflow.
  int64_t nbytes = ne[0] / block;
  bool overflow = __builtin_mul_overflow(nbytes, BlockBytes(*ggml.dtype), &nbytes);
  for (uint32_t i = 1; i < n_dims; ++i) overflow |= __builtin_mul_overflow(nbytes, ne[i], &nbytes);
  if (overflow) return Error(type_at, "ggml type", "tensor byte size overflows int64");
  const uint64_t offset_at = pos_;
  ASSIGN_OR_RETURN(uint64_t rel, Read<uint64_t>("data offset"));
  if (rel % alignment_ != 0) {
    return Error(offset_at, "data offset",
                 absl::StrCat("offset ", rel, " is not a multiple of the alignment ", alignment_));
  }
  TensorView t;
  t.name = name;
  t.dtype = *ggml.dtype;
  for (uint32_t i = 0; i < n_dims; ++i) t.shape.push_back(ne[n_dims - 1 - i]);
  t.nbytes = static_cast<uint64_t>(nbytes);
  f_.tensor_index_.emplace(std::move(name), f_.tensors_.size());
  f_.tensors_.push_back(std::move(t));
  rel_offsets.push_back(rel);
  info_offsets.push_back(info_at);
  return absl::OkStatus();
}

absl::Status GgufParser::Parse() {
  context_ = "header";
  ASSIGN_OR_RETURN(uint32_t magic, Read<uint32_t>("magic"));
  if (magic != kGgufMagic) {
    return Error(
        0, "magic",
        absl::StrCat("bad magic 0x", absl::Hex(magic, absl::kZeroPad8), ", not a GGUF file"));
  }
  ASSIGN_OR_RETURN(uint32_t version, Read<uint32_t>("version"));
  if (version == 1) {
    return Error(4, "version", "GGUF version 1 is not supported (only versions 2 and 3)");
  }
  if (version != 2 && version != 3) {
    const uint32_t swapped = __builtin_bswap32(version);
    return Error(
        4, "version",
        swapped == 2 || swapped == 3
            ? std::string("big-endian GGUF files are not supported")
            : absl::StrCat("unsupported GGUF version ", version, " (only versions 2 and 3)"));
  }
  f_.version_ = version;
  const uint64_t tensor_count_at = pos_;
  ASSIGN_OR_RETURN(uint64_t tensor_count, Read<uint64_t>("tensor count"));
  const uint64_t kv_count_at = pos_;
  ASSIGN_OR_RETURN(uint64_t kv_count, Read<uint64_t>("metadata count"));
  if (kv_count > remaining() / kMinKvBytes) {
    return Error(kv_count_at, "metadata count",
                 absl::StrCat(kv_count, " entries cannot fit in the ", remaining(), " bytes left"));
  }
  if (tensor_count > remaining() / kMinTensorInfoBytes) {
    return Error(
        tensor_count_at, "tensor count",
        absl::StrCat(tensor_count, " tensor infos cannot fit in the ", remaining(), " bytes left"));
  }
  // The counts are only bounded by the file size, so reserve modestly and let vectors grow:
  // a hostile count must not turn into a huge allocation before the entries are read.
  f_.metadata_.reserve(std::min<uint64_t>(kv_count, 1024));
  for (uint64_t i = 0; i < kv_count; ++i) RETURN_IF_ERROR(ReadMetadata(i));

  f_.tensors_.reserve(std::min<uint64_t>(tensor_count, 4096));
  std::vector<uint64_t> rel_offsets, info_offsets;
  for (uint64_t i = 0; i < tensor_count; ++i) {
    RETURN_IF_ERROR(ReadTensorInfo(i, rel_offsets, info_offsets));
  }

  // Tensor data starts at the next multiple of the alignment after the directory. pos_ <= size_
  // and the padding is below alignment_ <= 2^63, so this cannot wrap.
  const uint64_t data_start = pos_ + (alignment_ - pos_ % alignment_) % alignment_;
  for (size_t i = 0; i < f_.tensors_.size(); ++i) {
    TensorView& t = f_.tensors_[i];
    uint64_t begin = 0, end = 0;
    if (__builtin_add_overflow(data_start, rel_offsets[i], &begin) ||
        __builtin_add_overflow(begin, t.nbytes, &end) || end > size_) {
      context_ = absl::StrCat("tensor info #", i, " '", t.name, "'");
      return Error(info_offsets[i], "tensor data",
                   absl::StrCat("data of ", t.nbytes, " bytes at relative offset ", rel_offsets[i],
                                " (data section starts at ", data_start,
                                ") lies past the end of the file (file size ", size_, ")"));
    }
    t.data = base_ + begin;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = path;
  // An empty file maps nothing; the parser then reports the missing magic.
  ASSIGN_OR_RETURN(file->mapping_, MappedFile::Open(path));
  GgufParser parser(*file);
  RETURN_IF_ERROR(parser.Parse());
  return file;
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = metadata_index_.find(key);
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].second;
}

const TensorView* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

absl::StatusOr<const GgufValue*> Lookup(const GgufFile& f, std::string_view key) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr) {
    return absl::NotFoundError(absl::StrCat(f.path(), ": no metadata key '", AbslView(key), "'"));
  }
  return v;
}

absl::Status WrongType(const GgufFile& f, std::string_view key, const GgufValue& v,
                       absl::string_view want) {
  std::string have = TypeName(v.type);
  if (v.type == Type::kArray) have = absl::StrCat("array of ", TypeName(v.array_type));
  return absl::InvalidArgumentError(absl::StrCat(f.path(), ": metadata key '", AbslView(key),
                                                 "' has type ", have, ", expected ", want));
}

}  // namespace

absl::StatusOr<uint64_t> GgufFile::GetUint(std::string_view key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*this, key));
  if (!IsInteger(v->type)) return WrongType(*this, key, *v, "an integer");
  if (const auto* u = std::get_if<uint64_t>(&v->scalar)) return *u;
  const int64_t s = std::get<int64_t>(v->scalar);
  if (s < 0) {
    return absl::OutOfRangeError(
        absl::StrCat(path_, ": metadata key '", AbslView(key), "' = ", s, " is negative"));
  }
  return static_cast<uint64_t>(s);
}

absl::StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*this, key));
  if (!IsInteger(v->type)) return WrongType(*this, key, *v, "an integer");
  if (const auto* s = std::get_if<int64_t>(&v->scalar)) return *s;
  const uint64_t u = std::get<uint64_t>(v->scalar);
  if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return absl::OutOfRangeError(absl::StrCat(path_, ": metadata key '", AbslView(key), "' = ", u,
                                              " does not fit in int64"));
  }
  return static_cast<int64_t>(u);
}

absl::StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*this, key));
  if (!IsFloat(v->type)) return WrongType(*this, key, *v, "float32 or float64");
  return std::get<double>(v->scalar);
}

absl::StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*this, key));
  if (v->type != Type::kBool) return WrongType(*this, key, *v, "bool");
  return std::get<uint64_t>(v->scalar) != 0;
}

absl::StatusOr<std::string> GgufFile::GetString(std::string_view key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*this, key));
  if (v->type != Type::kString) return WrongType(*this, key, *v, "string");
  return std::get<std::string>(v->scalar);
}

absl::StatusOr<std::vector<std::string>> GgufFile::GetStringArray(std::string_view key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*this, key));
  if (v->type != Type::kArray || v->array_type != Type::kString) {
    return WrongType(*this, key, *v, "array of string");
  }
  return v->strings;
}

absl::StatusOr<std::vector<double>> GgufFile::GetFloatArray(std::string_view key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*this, key));
  if (v->type != Type::kArray || !IsFloat(v->array_type)) {
    return WrongType(*this, key, *v, "array of float32 or float64");
  }
  return v->floats;
}

// Bool arrays are accepted too: they are stored as 0/1 in `ints` and have no getter of their own.
absl::StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(std::string_view key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*this, key));
  if (v->type != Type::kArray || !(IsInteger(v->array_type) || v->array_type == Type::kBool)) {
    return WrongType(*this, key, *v, "array of integers");
  }
  return v->ints;
}

}  // namespace riskkv
