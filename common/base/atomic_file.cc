// Files replaced in one step (see atomic_file.h).
#include "common/base/atomic_file.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>

namespace riskkv {

std::string TemporaryPathFor(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return path + ".tmp." + std::to_string(getpid()) + "." + std::to_string(counter++);
}

void RemoveAbandonedTemporaries(const std::string& dir) {
  const std::string self = std::to_string(getpid());
  std::error_code ec;
  for (const auto& f : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = f.path().filename().string();
    const size_t at = name.rfind(".tmp.");
    if (at == std::string::npos) continue;
    const std::string pid = name.substr(at + 5, name.find('.', at + 5) - (at + 5));
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::error_code ignored;
    if (pid == self || !std::filesystem::exists(std::filesystem::path("/proc") / pid, ignored)) {
      std::filesystem::remove(f.path(), ignored);
    }
  }
}

absl::Status WriteFileAtomically(const std::string& path, std::string_view bytes) {
  const std::string tmp = TemporaryPathFor(path);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) {
      std::error_code ignored;
      std::filesystem::remove(tmp, ignored);
      return absl::InternalError("cannot write " + tmp);
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    return absl::InternalError("cannot rename " + tmp + " to " + path + ": " + ec.message());
  }
  return absl::OkStatus();
}

}  // namespace riskkv
