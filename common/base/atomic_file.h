// Files replaced in one step: written under a temporary name next to the target, flushed to disk
// and renamed over it, so a reader (or a crash, or a power cut) sees the old content or the new,
// never a part.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace riskkv {

// A temporary name next to `path`, unique to this process and call (NAME.tmp.PID.N).
std::string TemporaryPathFor(const std::string& path);

// Removes the temporaries in `dir` that no running writer can finish: those of processes that no
// longer run, and this process's own. Call it at start, before this process writes there: in a
// container a restarted server has the same PID (often 1) as the one whose crash left them.
void RemoveAbandonedTemporaries(const std::string& dir);

// Writes one file in pieces and then puts it in place: Create makes the temporary
// (TemporaryPathFor), Append writes to it, Commit flushes it to disk, renames it over the target
// and flushes the directory, so the rename itself survives a crash. Every error names the file
// and the system's reason; its code says what to do about it: NotFound when the directory does
// not exist, PermissionDenied when it may not be written (a read-only directory or file system),
// ResourceExhausted when the disk or quota is full, Internal otherwise. After any failure, and
// when a writer is destroyed without a successful Commit, the temporary is removed and the target
// is untouched. Move-only; not for use from two threads at once.
class AtomicFileWriter {
 public:
  static absl::StatusOr<AtomicFileWriter> Create(const std::string& path);

  ~AtomicFileWriter();
  AtomicFileWriter(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  // Appends `bytes` to the temporary. FailedPrecondition once the writer has failed or committed.
  absl::Status Append(std::string_view bytes);

  // Puts the file in place (see above). A file opened or mapped under temp_path() before Commit
  // is the committed file afterwards: the rename keeps the inode. FailedPrecondition once the
  // writer has failed or committed.
  absl::Status Commit();

  // The file this writer replaces.
  const std::string& path() const { return path_; }
  // Where the bytes are until Commit: for a caller that checks them (reads or maps the file)
  // before they replace the target.
  const std::string& temp_path() const { return temp_path_; }

 private:
  AtomicFileWriter(std::string path, std::string temp_path, int fd, int dir_fd);
  // Closes everything, removes the temporary, and returns `error`.
  absl::Status Fail(absl::Status error);
  void Discard();

  std::string path_;
  std::string temp_path_;
  int fd_ = -1;      // the temporary, open for writing; -1 once failed or committed
  int dir_fd_ = -1;  // the directory holding path_, opened to flush the rename
};

// Replaces `path` with `bytes` in one step, as AtomicFileWriter does (same errors).
absl::Status WriteFileAtomically(const std::string& path, std::string_view bytes);

}  // namespace riskkv
