// Safetensors parser: maps the file read-only, parses the JSON header and validates every tensor
// entry against the data section, so a truncated or hostile file yields a Status, never a crash.
#include "common/formats/safetensors_file.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace riskkv {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors parsing assumes a little-endian host");

// Hugging Face's reference implementation caps the header at 100 MB; we do the same so a bogus
// length cannot make us parse (or allocate for) the whole file as JSON.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr uint64_t kHeaderLengthBytes = 8;

// The std::map-backed json (not ordered_json, whose lookups are linear in the key count, so a
// hostile header with many keys would take quadratic time). Tensors are put in data order below.
using Json = nlohmann::json;

struct DTypeInfo {
  DType dtype;
  uint64_t element_bytes;
};
bool ParseDType(const std::string& s, DTypeInfo& out) {
  if (s == "F32") {
    out = {DType::kF32, 4};
  } else if (s == "F16") {
    out = {DType::kF16, 2};
  } else if (s == "BF16") {
    out = {DType::kBF16, 2};
  } else {
    return false;
  }
  return true;
}

}  // namespace

class SafetensorsParser {
 public:
  explicit SafetensorsParser(SafetensorsFile& file)
      : f_(file), base_(file.mapping_.data()), size_(file.mapping_.size()) {}

  absl::Status Parse();

 private:
  absl::Status Error(uint64_t at, absl::string_view what, absl::string_view problem) const {
    return absl::InvalidArgumentError(
        absl::StrCat(f_.path_, ": ", what, " at byte offset ", at, ": ", problem));
  }
  absl::Status TensorError(const std::string& name, absl::string_view problem) const {
    return Error(kHeaderLengthBytes, "JSON header", absl::StrCat("tensor '", name, "': ", problem));
  }
  absl::Status ParseMetadata(const Json& meta);
  // Validates one entry; `begin` is its offset in the data section.
  absl::Status ParseTensor(const std::string& name, const Json& entry, uint64_t data_size,
                           TensorView& t, uint64_t& begin);

  SafetensorsFile& f_;
  const uint8_t* base_;
  uint64_t size_;
  const uint8_t* data_ = nullptr;
};

absl::Status SafetensorsParser::ParseMetadata(const Json& meta) {
  if (!meta.is_object()) return TensorError("__metadata__", "must be an object of strings");
  for (const auto& [key, value] : meta.items()) {
    if (!value.is_string()) {
      return TensorError("__metadata__", absl::StrCat("value of '", key, "' is not a string"));
    }
    f_.metadata_.emplace_back(key, value.get_ref<const std::string&>());
  }
  return absl::OkStatus();
}

absl::Status SafetensorsParser::ParseTensor(const std::string& name, const Json& entry,
                                            uint64_t data_size, TensorView& t, uint64_t& begin) {
  if (!entry.is_object()) return TensorError(name, "entry is not an object");
  const auto dtype_it = entry.find("dtype");
  const auto shape_it = entry.find("shape");
  const auto offsets_it = entry.find("data_offsets");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    return TensorError(name, "missing string 'dtype'");
  }
  if (shape_it == entry.end() || !shape_it->is_array()) {
    return TensorError(name, "missing array 'shape'");
  }
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2) {
    return TensorError(name, "'data_offsets' must be an array of two integers");
  }
  const std::string& dtype_name = dtype_it->get_ref<const std::string&>();
  DTypeInfo info;
  if (!ParseDType(dtype_name, info)) {
    return TensorError(
        name, absl::StrCat("unsupported dtype '", dtype_name, "' (supported: F32, F16, BF16)"));
  }

  t.name = name;
  t.dtype = info.dtype;
  uint64_t numel = 1;
  for (const Json& d : *shape_it) {
    // Non-negative JSON integers parse as unsigned; negatives and fractions are rejected here.
    if (!d.is_number_unsigned() ||
        d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return TensorError(name, "shape entries must be non-negative integers below 2^63");
    }
    const uint64_t dim = d.get<uint64_t>();
    if (__builtin_mul_overflow(numel, dim, &numel) ||
        numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return TensorError(name, "element count overflows int64");
    }
    t.shape.push_back(static_cast<int64_t>(dim));
  }
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, info.element_bytes, &nbytes)) {
    return TensorError(name, "byte size overflows uint64");
  }

  const Json& b = (*offsets_it)[0];
  const Json& e = (*offsets_it)[1];
  if (!b.is_number_unsigned() || !e.is_number_unsigned()) {
    return TensorError(name, "'data_offsets' must be non-negative integers");
  }
  begin = b.get<uint64_t>();
  const uint64_t end = e.get<uint64_t>();
  if (end < begin) {
    return TensorError(name,
                       absl::StrCat("data_offsets [", begin, ", ", end, ") end before they begin"));
  }
  if (end - begin != nbytes) {
    return TensorError(name,
                       absl::StrCat("data_offsets [", begin, ", ", end, ") span ", end - begin,
                                    " bytes but shape x ", dtype_name, " needs ", nbytes));
  }
  if (end > data_size) {
    return TensorError(name, absl::StrCat("data_offsets [", begin, ", ", end, ") run past the ",
                                          data_size, "-byte data section (file size ", size_, ")"));
  }
  t.data = data_ + begin;
  t.nbytes = nbytes;
  return absl::OkStatus();
}

absl::Status SafetensorsParser::Parse() {
  if (size_ < kHeaderLengthBytes) {
    return Error(0, "header length", absl::StrCat("needs 8 bytes but the file has only ", size_));
  }
  uint64_t header_len = 0;
  std::memcpy(&header_len, base_, sizeof(header_len));
  const uint64_t room = size_ - kHeaderLengthBytes;
  if (header_len < 2 || header_len > kMaxHeaderBytes || header_len > room) {
    return Error(0, "header length",
                 absl::StrCat("JSON header length ", header_len, " is not in [2, min(",
                              kMaxHeaderBytes, ", ", room, " bytes left in the file)]"));
  }
  const char* json_begin = reinterpret_cast<const char*>(base_ + kHeaderLengthBytes);
  data_ = base_ + kHeaderLengthBytes + header_len;
  const uint64_t data_size = room - header_len;

  // nlohmann keeps the last of duplicate keys silently; the callback sees every top-level key
  // (depth 1) so a repeated tensor name can be reported instead.
  std::string duplicate;
  std::set<std::string> seen;
  const Json::parser_callback_t on_event = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (depth == 1 && event == Json::parse_event_t::key && duplicate.empty()) {
      const std::string& k = parsed.get_ref<const std::string&>();
      if (!seen.insert(k).second) duplicate = k;
    }
    return true;
  };
  Json header;
  try {
    header = Json::parse(json_begin, json_begin + header_len, on_event);
  } catch (const Json::exception& ex) {
    // parse_error::byte is 1-based within the header text.
    uint64_t at = kHeaderLengthBytes;
    if (const auto* pe = dynamic_cast<const Json::parse_error*>(&ex)) {
      at += pe->byte > 0 ? pe->byte - 1 : 0;
    }
    return Error(at, "JSON header", absl::StrCat("invalid JSON: ", ex.what()));
  }
  if (!header.is_object()) {
    return Error(kHeaderLengthBytes, "JSON header", "top level is not an object");
  }
  if (!duplicate.empty()) return TensorError(duplicate, "duplicate key in the header");

  struct Entry {
    uint64_t begin;
    TensorView t;
  };
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      RETURN_IF_ERROR(ParseMetadata(value));
      continue;
    }
    Entry& e = entries.emplace_back();
    RETURN_IF_ERROR(ParseTensor(name, value, data_size, e.t, e.begin));
  }
  // Data order is the file's physical order, and makes the overlap check a single pass.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.t.nbytes, a.t.name) < std::tie(b.begin, b.t.nbytes, b.t.name);
  });
  const Entry* prev = nullptr;  // the last non-empty tensor; empty ones cannot overlap anything
  for (const Entry& e : entries) {
    if (e.t.nbytes == 0) continue;
    if (prev != nullptr && e.begin < prev->begin + prev->t.nbytes) {
      return TensorError(
          e.t.name, absl::StrCat("data [", e.begin, ", ", e.begin + e.t.nbytes,
                                 ") overlaps tensor '", prev->t.name, "' at [", prev->begin, ", ",
                                 prev->begin + prev->t.nbytes, ")"));
    }
    prev = &e;
  }
  f_.tensors_.reserve(entries.size());
  for (Entry& e : entries) {
    f_.tensor_index_.emplace(e.t.name, f_.tensors_.size());
    f_.tensors_.push_back(std::move(e.t));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  // An empty file maps nothing; the parser rejects it before reading.
  ASSIGN_OR_RETURN(file->mapping_, MappedFile::Open(path));
  SafetensorsParser parser(*file);
  RETURN_IF_ERROR(parser.Parse());
  return file;
}

const TensorView* SafetensorsFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace riskkv
