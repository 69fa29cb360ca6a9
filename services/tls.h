// TLS for every riskkv gRPC endpoint, from PEM files named by the same three flags in each
// binary: --tls-cert and --tls-key (this process's certificate chain and private key) and
// --tls-ca (the CA that signs its peers). All three empty: plaintext, as before.
//   server: cert + key serve TLS; with a CA, clients must present a certificate it signed
//           (mutual TLS).
//   client: a CA verifies the server (the system's roots without one); cert + key answer a
//           server that asks for a client certificate.
// ABSL_FLAG definitions live here so the binaries share their names and help text; include
// this header from one translation unit per binary (its main.cc).
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "common/base/status_macros.h"
#include "services/cli_args.h"

ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain of this process (TLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificates: servers require client certificates signed by them (mutual "
          "TLS); clients verify servers with them");

namespace riskkv {

struct TlsFiles {
  std::string cert, key, ca;
  bool enabled() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

inline TlsFiles TlsFilesFromFlags() {
  return {absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key), absl::GetFlag(FLAGS_tls_ca)};
}

namespace tls_internal {

inline absl::StatusOr<std::string> Read(const std::string& flag, const std::string& path) {
  if (path.empty()) return std::string();
  auto pem = ReadFileToString(path);
  if (!pem.ok()) return absl::InvalidArgumentError("--" + flag + ": " + pem.status().ToString());
  if (pem->find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError("--" + flag + ": " + path + " holds no PEM block");
  }
  return pem;
}

struct Pem {
  std::string cert, key, ca;
};

inline absl::StatusOr<Pem> Load(const TlsFiles& f) {
  if (f.cert.empty() != f.key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  Pem p;
  ASSIGN_OR_RETURN(p.cert, Read("tls-cert", f.cert));
  ASSIGN_OR_RETURN(p.key, Read("tls-key", f.key));
  ASSIGN_OR_RETURN(p.ca, Read("tls-ca", f.ca));
  return p;
}

}  // namespace tls_internal

// Plaintext when no file is named; InvalidArgument for a missing or non-PEM file, a key
// without a certificate, or a server without one.
inline absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const TlsFiles& files) {
  if (!files.enabled()) return grpc::InsecureServerCredentials();
  auto pem = tls_internal::Load(files);
  if (!pem.ok()) return pem.status();
  if (pem->cert.empty()) {
    return absl::InvalidArgumentError("a TLS server needs --tls-cert and --tls-key");
  }
  grpc::SslServerCredentialsOptions o(
      pem->ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                      : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  o.pem_root_certs = pem->ca;
  o.pem_key_cert_pairs.push_back({pem->key, pem->cert});
  return grpc::SslServerCredentials(o);
}

inline absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentialsFor(
    const TlsFiles& files) {
  if (!files.enabled()) return grpc::InsecureChannelCredentials();
  auto pem = tls_internal::Load(files);
  if (!pem.ok()) return pem.status();
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = pem->ca;
  o.pem_private_key = pem->key;
  o.pem_cert_chain = pem->cert;
  return grpc::SslCredentials(o);
}

}  // namespace riskkv
