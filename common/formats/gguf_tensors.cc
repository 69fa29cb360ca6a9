// GGUF tensor directory: the tensor infos (name, shape, ggml type, offset) and where each
// tensor's bytes lie in the data section; tensors of a type we cannot compute with are rejected.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/formats/gguf_file.h"
#include "common/formats/gguf_parser.h"
#include "common/model/tensor_view.h"

namespace riskkv {
namespace {

constexpr uint32_t kMaxDims = 4;

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
    {6, "Q5_0", DType::kQ5_0},
    {7, "Q5_1", DType::kQ5_1},
    {8, "Q8_0", DType::kQ8_0},
    {9, "Q8_1", {}},
    {10, "Q2_K", {}},
    {11, "Q3_K", {}},
    {12, "Q4_K", DType::kQ4_K},
    {13, "Q5_K", DType::kQ5_K},
    {14, "Q6_K", DType::kQ6_K},
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
    return Error(
        type_at, "ggml type",
        absl::StrCat("tensor '", name, "' has unsupported ggml type ", type_id, " (", ggml.name,
                     "); supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, "
                     "Q4_K, Q5_K, Q6_K"));
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

absl::Status GgufParser::ReadTensorDirectory(uint64_t count) {
  f_.tensors_.reserve(std::min<uint64_t>(count, 4096));
  std::vector<uint64_t> rel_offsets, info_offsets;
  for (uint64_t i = 0; i < count; ++i) {
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

const TensorView* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace riskkv
