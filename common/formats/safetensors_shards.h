// The weights of a Hugging Face model directory: one model.safetensors, or the shards a
// model.safetensors.index.json names (how every checkpoint above about 1B parameters is
// published), each memory-mapped.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/formats/safetensors_file.h"

namespace riskkv {

class SafetensorsShards {
 public:
  // Reads DIR/model.safetensors.index.json when it exists, else DIR/model.safetensors alone.
  // The index's "weight_map" maps each tensor to a shard: a plain file name in DIR (no
  // directories, no "..") that must exist and hold that tensor; every shard is validated by
  // SafetensorsFile::Open. A tensor a shard holds but the map does not list is not used.
  static absl::StatusOr<std::unique_ptr<SafetensorsShards>> Open(const std::string& dir);

  const TensorView* FindTensor(std::string_view name) const;
  // The shard files in the order their names sort.
  const std::vector<std::unique_ptr<SafetensorsFile>>& shards() const { return shards_; }

 private:
  SafetensorsShards() = default;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, const TensorView*, std::less<>> tensors_;
};

}  // namespace riskkv
