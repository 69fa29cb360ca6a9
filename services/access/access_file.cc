// Reading and re-reading an access file (see access_file.h).
#include "services/access/access_file.h"

#include <sys/stat.h>

#include "services/access/watched_file.h"
#include "spdlog/spdlog.h"

namespace riskkv {
namespace {

// An access file lists credentials, not data: anything larger is refused unread.
constexpr int64_t kMaxAccessFileBytes = 1 << 20;

}  // namespace

absl::StatusOr<std::unique_ptr<AccessFile>> AccessFile::Open(std::string path) {
  std::unique_ptr<AccessFile> f(new AccessFile(std::move(path)));
  const std::string stamp = FileStamp(f->path_);
  auto text = ReadBoundedFile(f->path_, kMaxAccessFileBytes);
  if (!text.ok()) return absl::InvalidArgumentError("--access-file: " + text.status().ToString());
  auto list = AccessList::Parse(*text, f->path_);
  if (!list.ok()) return absl::InvalidArgumentError("--access-file: " + list.status().ToString());
  struct stat st {};
  if (::stat(f->path_.c_str(), &st) == 0 && (st.st_mode & 0077) != 0) {
    spdlog::warn("access file {} may be read by other users (mode {:o}): it holds secrets",
                 f->path_, st.st_mode & 0777);
  }
  absl::MutexLock lock(&f->mu_);
  f->list_ = std::make_shared<const AccessList>(*std::move(list));
  f->stamp_ = stamp;
  f->checked_ = absl::Now();
  return f;
}

void AccessFile::set_check_interval(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  interval_ = d;
}

std::shared_ptr<const AccessList> AccessFile::Current() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (now - checked_ < interval_) return list_;
  checked_ = now;
  const std::string stamp = FileStamp(path_);
  if (stamp.empty() || stamp == stamp_) return list_;
  stamp_ = stamp;
  auto text = ReadBoundedFile(path_, kMaxAccessFileBytes);
  if (!text.ok()) {
    spdlog::error("access file {} changed but cannot be read ({}); the previous version stays",
                  path_, text.status().ToString());
    return list_;
  }
  auto list = AccessList::Parse(*text, path_);
  if (!list.ok()) {
    spdlog::error("access file {} changed but is refused ({}); the previous version stays", path_,
                  std::string(list.status().message()));
    return list_;
  }
  spdlog::info("access file {} read again: {} credentials", path_, list->size());
  list_ = std::make_shared<const AccessList>(*std::move(list));
  return list_;
}

}  // namespace riskkv
