// An access file (access_list.h) that can be rotated without a restart: it is read again when it
// changes on disk, checked at most once a second. A new version that does not parse is logged and
// ignored; the last good one stays in force.
#pragma once

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/access/access_list.h"

namespace riskkv {

class AccessFile {
 public:
  // The file must exist and parse now. A file other users may read is accepted with a warning:
  // it holds secrets.
  static absl::StatusOr<std::unique_ptr<AccessFile>> Open(std::string path);

  // The list in force, after reading the file again if it changed on disk.
  std::shared_ptr<const AccessList> Current() ABSL_LOCKS_EXCLUDED(mu_);
  const std::string& path() const { return path_; }

  // How often the file's status is looked at (tests shorten it).
  void set_check_interval(absl::Duration d) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  explicit AccessFile(std::string path) : path_(std::move(path)) {}

  const std::string path_;
  absl::Mutex mu_;
  std::shared_ptr<const AccessList> list_ ABSL_GUARDED_BY(mu_);
  std::string stamp_ ABSL_GUARDED_BY(mu_);
  absl::Time checked_ ABSL_GUARDED_BY(mu_);
  absl::Duration interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(1);
};

}  // namespace riskkv
