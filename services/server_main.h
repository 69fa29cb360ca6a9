// What every riskkv server's main() does around its gRPC server: leave SIGINT / SIGTERM to one
// waiting thread, publish the ports it got, and shut down on the first signal (exit at once on a
// second).
#pragma once

#include <grpcpp/server.h>
#include <prometheus/exposer.h>
#include <prometheus/registry.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/base/atomic_file.h"
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
  if (auto s = WriteFileAtomically(path, line + "\n"); !s.ok()) {
    spdlog::warn("cannot write the port file: {}", s.ToString());
  }
}

// Serves `registry` on http://ADDRESS/metrics and sets *port to the port it got; an empty address
// means no metrics (null, port 0). Start it before anything else takes thread-local storage:
// civetweb's threads have small fixed stacks.
inline absl::StatusOr<std::unique_ptr<prometheus::Exposer>> ServeMetrics(
    const std::string& address, std::shared_ptr<prometheus::Registry> registry, int* port) {
  *port = 0;
  if (address.empty()) return std::unique_ptr<prometheus::Exposer>();
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    exposer = std::make_unique<prometheus::Exposer>(address);
  } catch (const std::exception& e) {
    return absl::UnavailableError("cannot serve metrics on " + address + ": " + e.what());
  }
  exposer->RegisterCollectable(registry);
  if (!exposer->GetListeningPorts().empty()) *port = exposer->GetListeningPorts()[0];
  return exposer;
}

// Serves until the first signal of `set`, then runs `before_shutdown` (if given) and gives
// running calls `grace` to finish.
inline void ServeUntilSignal(grpc::Server& server, sigset_t set, const char* name,
                             std::chrono::seconds grace,
                             std::function<void()> before_shutdown = nullptr) {
  std::thread stopper([&server, set, name, grace, before_shutdown] {
    int sig = 0;
    sigwait(&set, &sig);
    spdlog::info("{}: signal {}, shutting down (again to exit now)", name, sig);
    if (before_shutdown) before_shutdown();
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
