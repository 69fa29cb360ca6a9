// riskkv-control: the control plane. Stores retention policies and predictor banks on local disk,
// versions them, serves Get/List/Put and pushes new versions to watching nodes.
//   riskkv-control --store DIR --listen 127.0.0.1:7000 --metrics-listen 127.0.0.1:9400
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "services/access/access_flags.h"
#include "services/cli_args.h"
#include "services/cli_help.h"
#include "services/control/control_service.h"
#include "services/server_main.h"
#include "services/tls.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, store, "", "directory of the policy store (created when missing)");
ABSL_FLAG(std::string, listen, "127.0.0.1:7000", "gRPC address (port 0: any free port)");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9400",
          "Prometheus /metrics address (port 0: any free port; empty: no metrics)");
ABSL_FLAG(int, max_concurrent_puts, 2,
          "policy puts served at once (each may carry a bank of up to 256 MiB); more are refused "
          "with RESOURCE_EXHAUSTED");
ABSL_FLAG(std::string, port_file, "",
          "write 'GRPC_PORT METRICS_PORT' here once listening (for scripts using port 0)");

namespace {

int Fail(const std::string& m) {
  spdlog::error("riskkv-control: {}", m);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const sigset_t signals = riskkv::BlockTerminationSignals();
  absl::SetProgramUsageMessage("riskkv-control --store DIR [--listen HOST:PORT]");
  std::vector<std::string> args_store;
  riskkv::ExitOnHelp(argc, argv);
  std::vector<char*> args = riskkv::NormalizeFlagNames(argc, argv, &args_store);
  absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  if (absl::GetFlag(FLAGS_store).empty()) return Fail("--store is required");
  if (absl::GetFlag(FLAGS_max_concurrent_puts) < 1) {
    return Fail("--max-concurrent-puts must be >= 1");
  }
  auto store = riskkv::PolicyStore::Open(absl::GetFlag(FLAGS_store));
  if (!store.ok()) return Fail(store.status().ToString());
  // Metrics first: civetweb's threads start before anything else takes thread-local storage.
  auto registry = std::make_shared<prometheus::Registry>();
  int metrics_port = 0;
  auto exposer = riskkv::ServeMetrics(absl::GetFlag(FLAGS_metrics_listen), registry, &metrics_port);
  if (!exposer.ok()) return Fail(exposer.status().ToString());
  riskkv::ControlMetrics metrics(*registry);
  auto access_file = riskkv::AccessFileFromFlags();
  if (!access_file.ok()) return Fail(access_file.status().ToString());
  riskkv::ControlService service(**store, &metrics, *access_file,
                                 absl::GetFlag(FLAGS_max_concurrent_puts));
  const riskkv::TlsFiles tls = riskkv::TlsFilesFromFlags();
  auto credentials = riskkv::ServerCredentialsFor(tls);
  if (!credentials.ok()) return Fail(credentials.status().ToString());
  const std::string listen =
      riskkv::ListenAddressFromFlags("riskkv-control", absl::GetFlag(FLAGS_listen), tls.enabled(),
                                     !tls.ca.empty(), *access_file != nullptr);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, *credentials, &port);
  // A policy, or one with a small bank; larger banks come through PutPolicyStream in pieces.
  builder.SetMaxReceiveMessageSize(4 << 20);
  // Watching nodes ping every 20 s to notice a vanished control plane; allow it.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.RegisterService(&service);
  auto server = builder.BuildAndStart();
  if (!server || port == 0) return Fail("cannot listen on " + listen);
  riskkv::WritePortFile(absl::GetFlag(FLAGS_port_file),
                        std::to_string(port) + " " + std::to_string(metrics_port));
  spdlog::info("riskkv-control: store {} ({} policies), listening on port {}, metrics on port {}",
               absl::GetFlag(FLAGS_store), (*store)->List().size(), port, metrics_port);
  riskkv::ServeUntilSignal(*server, signals, "riskkv-control", std::chrono::seconds(2));
  return 0;
}
