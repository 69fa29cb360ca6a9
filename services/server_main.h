// What every riskkv server's main() does around its gRPC server: leave SIGINT / SIGTERM to one
// waiting thread, publish the ports it got, and shut down on the first signal (exit at once on a
// second).
#pragma once

#include <grpcpp/server.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "spdlog/spdlog.h"

namespace riskkv {

// Call first in main(): every thread started afterwards inherits the blocked signals, so only
// ServeUntilSignal's thread receives them.
inline sigset_t BlockTerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

// Writes `line` to `path` through a temporary file, so a script polling `path` never reads half
// of it. Nothing when `path` is empty.
inline void WritePortFile(const std::string& path, const std::string& line) {
  if (path.empty()) return;
  std::ofstream(path + ".tmp") << line << "\n";
  std::rename((path + ".tmp").c_str(), path.c_str());
}

// Serves until the first signal of `set`, then gives running calls `grace` to finish.
inline void ServeUntilSignal(grpc::Server& server, sigset_t set, const char* name,
                             std::chrono::seconds grace) {
  std::thread stopper([&server, set, name, grace] {
    int sig = 0;
    sigwait(&set, &sig);
    spdlog::info("{}: signal {}, shutting down (again to exit now)", name, sig);
    std::thread([set] {
      int again = 0;
      sigwait(&set, &again);
      std::_Exit(1);
    }).detach();
    server.Shutdown(std::chrono::system_clock::now() + grace);
  });
  server.Wait();
  stopper.join();
}

}  // namespace riskkv
