// Read-only, memory-mapped view of a Hugging Face safetensors file (F32, F16, BF16 tensors).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/mapped_file.h"
#include "common/model/tensor_view.h"

namespace riskkv {

class SafetensorsFile {
 public:
  // Maps the file, parses the JSON header and validates every tensor's dtype, shape and
  // [begin, end) offsets against the data section (in bounds, matching shape x element size,
  // non-overlapping). Unsupported dtypes (e.g. I64 or F8) are an error naming the tensor.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // Tensors in data order (by offset, i.e. their physical order in the file).
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const TensorView* FindTensor(std::string_view name) const;
  // The "__metadata__" string map of the header, if any.
  const std::vector<std::pair<std::string, std::string>>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  MappedFile mapping_;  // tensor data points into it
  std::vector<TensorView> tensors_;
  std::vector<std::pair<std::string, std::string>> metadata_;
  // Name -> index into tensors_; std::less<> allows lookup by string_view.
  std::map<std::string, size_t, std::less<>> tensor_index_;
  friend class SafetensorsParser;
};

}  // namespace riskkv
