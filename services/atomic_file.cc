// Files replaced in one step (see atomic_file.h).
#include "services/atomic_file.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>

namespace riskkv {

std::string TemporaryPathFor(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return path + ".tmp." + std::to_string(getpid()) + "." + std::to_string(counter++);
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
