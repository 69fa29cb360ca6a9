// absl::Status <-> grpc::Status for the servers and clients in services/ (the two share their
// code numbering, so only the message needs carrying), and seconds as gRPC deadlines count them.
#pragma once

#include <grpcpp/support/status.h>

#include <chrono>
#include <string>

#include "absl/status/status.h"

namespace riskkv {

// A duration in seconds as the clock gRPC deadlines use.
inline std::chrono::system_clock::duration Seconds(double seconds) {
  return std::chrono::duration_cast<std::chrono::system_clock::duration>(
      std::chrono::duration<double>(seconds));
}

inline grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

inline absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace riskkv
