// The servers' access flags, shared by riskkv-node and riskkv-control so they spell them alike:
// --access-file (who may call, access_list.h) and --insecure (serve beyond loopback without
// credentials). Include from one translation unit per binary (its main.cc), as services/tls.h.
#pragma once

#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "services/access/access_file.h"
#include "services/access/authorizer.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, access_file, "",
          "who may call this server and as what: lines 'ROLE IDENTITY token SECRET' or 'ROLE "
          "IDENTITY san NAME' (roles client, node, operator), read again when it changes; empty: "
          "everyone is an operator, and the server listens on loopback only unless --insecure");
ABSL_FLAG(bool, insecure, false,
          "listen on --listen as given even without caller credentials (neither --access-file "
          "nor mutual TLS with --tls-ca): anyone who reaches it may do anything");

namespace riskkv {

// The access file the flags name (null for none), or why it cannot be used.
inline absl::StatusOr<std::shared_ptr<AccessFile>> AccessFileFromFlags() {
  const std::string path = absl::GetFlag(FLAGS_access_file);
  if (path.empty()) return std::shared_ptr<AccessFile>();
  auto f = AccessFile::Open(path);
  if (!f.ok()) return f.status();
  return std::shared_ptr<AccessFile>(*std::move(f));
}

// Where to listen given --listen, whether TLS is on (mutual: clients need a CA-signed
// certificate) and the access file; logs why when the address was narrowed to loopback.
inline std::string ListenAddressFromFlags(const std::string& program, const std::string& listen,
                                          bool tls, bool mutual_tls, bool access_file) {
  const Exposure e = ListenExposure(listen, mutual_tls, access_file, absl::GetFlag(FLAGS_insecure));
  if (!e.note.empty()) spdlog::warn("{}: {}", program, e.note);
  if (e.note.empty() && !mutual_tls && !access_file && absl::GetFlag(FLAGS_insecure)) {
    spdlog::warn(
        "{}: --insecure: serving {} without caller credentials; anyone who reaches it may do "
        "anything",
        program, listen);
  }
  if (access_file && !tls) {
    spdlog::warn("{}: bearer tokens travel in plaintext without TLS (--tls-cert, --tls-key)",
                 program);
  }
  return e.listen;
}

}  // namespace riskkv
