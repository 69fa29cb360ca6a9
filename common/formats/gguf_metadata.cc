// GGUF metadata: parsing the key/value section and the typed getters over it. Arrays are bounded
// by count and by the bytes left before anything is reserved.
#include <bit>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/formats/gguf_file.h"
#include "common/formats/gguf_parser.h"

namespace riskkv {
namespace {

// Far above any real vocabulary (~10^5 entries); keeps a hostile count from exhausting memory.
constexpr uint64_t kMaxArrayLength = uint64_t{1} << 24;

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

}  // namespace

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

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = metadata_index_.find(key);
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].second;
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
