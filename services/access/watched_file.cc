// File stamps and bounded reads for credential files (see watched_file.h).
#include "services/access/watched_file.h"

#include <sys/stat.h>

#include <fstream>

#include "absl/strings/str_cat.h"

namespace riskkv {

std::string FileStamp(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "";
  return absl::StrCat(st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec, "/", st.st_size, "/", st.st_ino);
}

absl::StatusOr<std::string> ReadBoundedFile(const std::string& path, int64_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError("cannot read " + path);
  std::string text(static_cast<size_t>(max_bytes) + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.gcount() > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is larger than ", max_bytes, " bytes"));
  }
  text.resize(static_cast<size_t>(in.gcount()));
  return text;
}

}  // namespace riskkv
