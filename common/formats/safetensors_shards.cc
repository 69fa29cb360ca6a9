#include "common/formats/safetensors_shards.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace riskkv {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr char kIndexName[] = "model.safetensors.index.json";
// An index larger than this is not one (Llama-3.1-405B's is about 100 KB).
constexpr uintmax_t kMaxIndexBytes = 64 << 20;
constexpr size_t kMaxShards = 4096;

absl::Status CheckShardName(const std::string& index, const std::string& tensor,
                            const std::string& shard) {
  if (shard.empty() || shard.find('/') != std::string::npos ||
      shard.find('\\') != std::string::npos || shard == "." || shard == "..") {
    return absl::InvalidArgumentError(absl::StrCat(index, ": tensor '", tensor, "' maps to '",
                                                   shard, "', which is not a file name in ",
                                                   "the model directory"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsShards>> SafetensorsShards::Open(const std::string& dir) {
  auto out = std::unique_ptr<SafetensorsShards>(new SafetensorsShards());
  const fs::path index_path = fs::path(dir) / kIndexName;
  std::error_code ec;
  if (!fs::exists(index_path, ec)) {
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                     SafetensorsFile::Open((fs::path(dir) / "model.safetensors").string()));
    for (const TensorView& t : file->tensors()) out->tensors_.emplace(t.name, &t);
    out->shards_.push_back(std::move(file));
    return out;
  }
  const std::string index = index_path.string();
  const uintmax_t size = fs::file_size(index_path, ec);
  if (ec || size > kMaxIndexBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(index, ": ", ec ? "cannot read its size" : "larger than 64 MiB"));
  }
  std::ifstream in(index_path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const json root = json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(index, ": not JSON"));
  if (!root.is_object() || !root.contains("weight_map") || !root["weight_map"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(index, ": no \"weight_map\" object"));
  }
  std::map<std::string, std::vector<std::string>> by_shard;  // shard -> tensors
  for (const auto& [tensor, shard] : root["weight_map"].items()) {
    if (!shard.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index, ": tensor '", tensor, "' maps to a non-string"));
    }
    RETURN_IF_ERROR(CheckShardName(index, tensor, shard.get<std::string>()));
    by_shard[shard.get<std::string>()].push_back(tensor);
  }
  if (by_shard.empty())
    return absl::InvalidArgumentError(absl::StrCat(index, ": empty weight_map"));
  if (by_shard.size() > kMaxShards) {
    return absl::InvalidArgumentError(
        absl::StrCat(index, ": ", by_shard.size(), " shards (at most ", kMaxShards, ")"));
  }
  for (const auto& [shard, tensors] : by_shard) {
    const fs::path shard_path = fs::path(dir) / shard;
    if (!fs::exists(shard_path, ec)) {
      return absl::NotFoundError(absl::StrCat(index, ": shard ", shard, " (holding '",
                                              tensors.front(), "') is not in ", dir));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                     SafetensorsFile::Open(shard_path.string()));
    for (const std::string& name : tensors) {
      const TensorView* t = file->FindTensor(name);
      if (t == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(index, ": tensor '", name, "' is mapped to ",
                                                       shard, ", which does not hold it"));
      }
      out->tensors_.emplace(name, t);
    }
    out->shards_.push_back(std::move(file));
  }
  return out;
}

const TensorView* SafetensorsShards::FindTensor(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second;
}

}  // namespace riskkv
