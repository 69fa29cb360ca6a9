// Files replaced in one step (see atomic_file.h).
#include "common/base/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"

namespace riskkv {
namespace {

// `path`: cannot `what`: the system's reason, with a code chosen by what a caller can do.
absl::Status SystemError(const std::string& path, const std::string& what, int err) {
  const std::string msg = absl::StrCat(path, ": cannot ", what, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(msg);
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

void CloseIfOpen(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace

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

absl::StatusOr<AtomicFileWriter> AtomicFileWriter::Create(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  // Opened first, so a missing or unreadable directory is reported before anything is written.
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return SystemError(path, "open its directory " + dir, errno);
  std::string temp_path = TemporaryPathFor(path);
  // No O_EXCL: a file of this name can only be left by a dead process that had this PID.
  const int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    ::close(dir_fd);
    return SystemError(path, "create " + temp_path, err);
  }
  return AtomicFileWriter(path, std::move(temp_path), fd, dir_fd);
}

AtomicFileWriter::AtomicFileWriter(std::string path, std::string temp_path, int fd, int dir_fd)
    : path_(std::move(path)), temp_path_(std::move(temp_path)), fd_(fd), dir_fd_(dir_fd) {}

AtomicFileWriter::~AtomicFileWriter() { Discard(); }

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& other) noexcept
    : path_(std::move(other.path_)),
      temp_path_(std::move(other.temp_path_)),
      fd_(std::exchange(other.fd_, -1)),
      dir_fd_(std::exchange(other.dir_fd_, -1)) {}

AtomicFileWriter& AtomicFileWriter::operator=(AtomicFileWriter&& other) noexcept {
  if (this != &other) {
    Discard();
    path_ = std::move(other.path_);
    temp_path_ = std::move(other.temp_path_);
    fd_ = std::exchange(other.fd_, -1);
    dir_fd_ = std::exchange(other.dir_fd_, -1);
  }
  return *this;
}

void AtomicFileWriter::Discard() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(temp_path_.c_str());
    fd_ = -1;
  }
  CloseIfOpen(dir_fd_);
}

absl::Status AtomicFileWriter::Fail(absl::Status error) {
  Discard();
  return error;
}

absl::Status AtomicFileWriter::Append(std::string_view bytes) {
  if (fd_ < 0) {
    return absl::FailedPreconditionError(path_ + ": the atomic write has already ended");
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Fail(SystemError(path_, "write " + temp_path_, n < 0 ? errno : EIO));
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Commit() {
  if (fd_ < 0) {
    return absl::FailedPreconditionError(path_ + ": the atomic write has already ended");
  }
  if (::fsync(fd_) != 0) return Fail(SystemError(path_, "flush " + temp_path_, errno));
  // close() reports write-back errors that some file systems only find out at this point.
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(temp_path_.c_str());
    return Fail(SystemError(path_, "close " + temp_path_, err));
  }
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp_path_.c_str());
    return Fail(SystemError(path_, "rename " + temp_path_ + " over it", err));
  }
  // The new content is in place; this makes the directory entry durable too. Some file systems
  // cannot flush a directory (EINVAL): there is nothing more to do on those.
  const int dir_fd = std::exchange(dir_fd_, -1);
  const int synced = ::fsync(dir_fd);
  const int err = errno;
  ::close(dir_fd);
  if (synced != 0 && err != EINVAL) {
    return SystemError(path_, "flush its directory after replacing it", err);
  }
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path, std::string_view bytes) {
  absl::StatusOr<AtomicFileWriter> writer = AtomicFileWriter::Create(path);
  if (!writer.ok()) return writer.status();
  if (absl::Status s = writer->Append(bytes); !s.ok()) return s;
  return writer->Commit();
}

}  // namespace riskkv
