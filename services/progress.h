// A progress bar on stderr for the long phases of the offline tools:
//   fit        [##########..........]  12/24  50%  0:31 elapsed  0:31 left
// On a terminal the line is redrawn in place; otherwise (CI logs, pipes) a line is printed at
// every tenth of the work, so logs stay short.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>

namespace riskkv {

class ProgressBar {
 public:
  explicit ProgressBar(std::string phase, bool quiet = false)
      : phase_(std::move(phase)),
        quiet_(quiet),
        tty_(isatty(fileno(stderr)) != 0),
        start_(std::chrono::steady_clock::now()) {}

  // The callback the calibration library takes: (done, total).
  std::function<void(int64_t, int64_t)> Callback() {
    return [this](int64_t done, int64_t total) { Update(done, total); };
  }

  // A bar left unfinished (a failed phase) still ends its line, so the error shows on its own.
  ~ProgressBar() {
    if (!quiet_ && tty_ && open_) std::fprintf(stderr, "\n");
  }

  void Update(int64_t done, int64_t total) {
    if (quiet_ || total <= 0) return;
    done = std::clamp<int64_t>(done, 0, total);
    const int tenth = static_cast<int>(10 * done / total);
    if (!tty_ && tenth == last_tenth_ && done != total) return;
    last_tenth_ = tenth;
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const double left = done > 0 ? elapsed * static_cast<double>(total - done) / done : 0.0;
    constexpr int kWidth = 20;
    const int filled = static_cast<int>(kWidth * done / total);
    std::string bar(filled, '#');
    bar.append(kWidth - filled, '.');
    std::fprintf(stderr, "%s%-12s [%s] %5lld/%-5lld %3d%%  %s elapsed  %s left%s", tty_ ? "\r" : "",
                 phase_.c_str(), bar.c_str(), static_cast<long long>(done),
                 static_cast<long long>(total), static_cast<int>(100 * done / total),
                 Clock(elapsed).c_str(), Clock(left).c_str(), tty_ && done != total ? "" : "\n");
    open_ = done != total;
    std::fflush(stderr);
  }

 private:
  static std::string Clock(double seconds) {
    const long s = static_cast<long>(seconds + 0.5);
    char buf[32];
    if (s >= 3600) {
      std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
    } else {
      std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
    }
    return buf;
  }

  std::string phase_;
  bool quiet_;
  bool tty_;
  int last_tenth_ = -1;
  bool open_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace riskkv
