// riskkv-node: one edge node. Serves decoding sessions over gRPC and moves them to and from other
// nodes (see services/node/node_service.h); Prometheus metrics on /metrics; the standard gRPC
// health service and server reflection for generic clients.
//   riskkv-node --model M --listen 127.0.0.1:7070 --metrics-listen 127.0.0.1:9470
//               [--policy policy.pb --bank bank.rkvbank] [--link-mbps 100]
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <prometheus/exposer.h>

#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/model_fingerprint.h"
#include "common/recovery/retention_policy.h"
#include "services/cli_args.h"
#include "services/node/node_service.h"
#include "services/server_main.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, model, "", "GGUF file or Hugging Face model directory (required)");
ABSL_FLAG(std::string, listen, "127.0.0.1:7070", "gRPC address (port 0: any free port)");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9470",
          "Prometheus /metrics address (port 0: any free port; empty: no metrics)");
ABSL_FLAG(std::string, port_file, "",
          "write 'GRPC_PORT METRICS_PORT' here once listening (for scripts using port 0)");
ABSL_FLAG(std::string, policy, "", "retention policy file (riskkv-calibrate's policy.pb)");
ABSL_FLAG(std::string, bank, "", "predictor bank the policy names (bank.rkvbank)");
ABSL_FLAG(int, threads, 0, "CPU threads (0: all)");
ABSL_FLAG(std::string, activations, "int8", "int8 (llama.cpp's arithmetic) or f32 (exact)");
ABSL_FLAG(std::string, kv_dtype, "f16", "KV cache storage and wire dtype: f16 or f32");
ABSL_FLAG(int64_t, capacity, 0, "KV rows per session (0: the model's context)");
ABSL_FLAG(double, link_mbps, 0, "sender-side rate limit emulating a link, Mbit/s (0: none)");
ABSL_FLAG(int, max_sessions, 64, "sessions this node serves at most");
ABSL_FLAG(double, timeout, 120, "default deadline of a migration, seconds");

namespace {

int Fail(const std::string& m) {
  spdlog::error("riskkv-node: {}", m);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  // Every thread started from here on leaves SIGINT / SIGTERM to the one that waits for them.
  const sigset_t signals = riskkv::BlockTerminationSignals();
  absl::SetProgramUsageMessage(
      "riskkv-node --model PATH [--listen HOST:PORT] [--policy P --bank B]");
  std::vector<std::string> store;
  std::vector<char*> args = riskkv::NormalizeFlagNames(argc, argv, &store);
  absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  const std::string model_path = absl::GetFlag(FLAGS_model);
  if (model_path.empty()) return Fail("--model is required");
  const auto kv = riskkv::FloatDTypeFromFlag("kv-dtype", absl::GetFlag(FLAGS_kv_dtype));
  if (!kv.ok()) return Fail(kv.status().ToString());
  if (absl::GetFlag(FLAGS_link_mbps) < 0) return Fail("--link-mbps must be >= 0");
  if (absl::GetFlag(FLAGS_max_sessions) < 1) return Fail("--max-sessions must be >= 1");
  if (!(absl::GetFlag(FLAGS_timeout) > 0)) return Fail("--timeout must be > 0");
  if (absl::GetFlag(FLAGS_policy).empty() != absl::GetFlag(FLAGS_bank).empty()) {
    return Fail("--policy and --bank go together");
  }
  auto model_options =
      riskkv::ModelOptionsFromFlags(absl::GetFlag(FLAGS_threads), absl::GetFlag(FLAGS_activations));
  if (!model_options.ok()) return Fail(model_options.status().ToString());
  auto model = riskkv::Model::Load(model_path, *model_options);
  if (!model.ok()) return Fail(model.status().ToString());
  auto fingerprint = riskkv::ModelFingerprint(**model);
  if (!fingerprint.ok()) return Fail(fingerprint.status().ToString());

  riskkv::NodeOptions options;
  options.model_fingerprint = *fingerprint;
  options.kv_dtype = *kv;
  options.capacity = absl::GetFlag(FLAGS_capacity);
  options.link_mbps = absl::GetFlag(FLAGS_link_mbps);
  options.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  options.default_timeout_seconds = absl::GetFlag(FLAGS_timeout);
  riskkv::v1::RetentionPolicy policy;
  std::unique_ptr<riskkv::PredictorBank> bank;
  if (!absl::GetFlag(FLAGS_policy).empty()) {
    auto p = riskkv::ReadPolicy(absl::GetFlag(FLAGS_policy),
                                static_cast<int32_t>((*model)->config().n_layers), *fingerprint);
    if (!p.ok()) return Fail(p.status().ToString());
    policy = *p;
    auto b = riskkv::PredictorBank::Open(absl::GetFlag(FLAGS_bank), *fingerprint);
    if (!b.ok()) return Fail(b.status().ToString());
    bank = std::move(*b);
    if (!policy.rebuilt_groups().empty() &&
        bank->content_hash() != policy.predictor_bank_sha256()) {
      return Fail("bank " + absl::GetFlag(FLAGS_bank) + " has hash " + bank->content_hash() +
                  "; the policy needs " + policy.predictor_bank_sha256());
    }
    options.policy = &policy;
    options.bank = bank.get();
  }

  // Metrics first: civetweb's threads start before anything else takes thread-local storage.
  auto registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<prometheus::Exposer> exposer;
  int metrics_port = 0;
  if (const std::string m = absl::GetFlag(FLAGS_metrics_listen); !m.empty()) {
    try {
      exposer = std::make_unique<prometheus::Exposer>(m);
    } catch (const std::exception& e) {
      return Fail("cannot serve metrics on " + m + ": " + e.what());
    }
    exposer->RegisterCollectable(registry);
    metrics_port = exposer->GetListeningPorts().empty() ? 0 : exposer->GetListeningPorts()[0];
  }
  riskkv::NodeMetrics metrics(*registry, (*model)->config().name);
  riskkv::NodeService service(**model, options, &metrics);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen), grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(8 << 20);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) return Fail("cannot listen on " + absl::GetFlag(FLAGS_listen));
  riskkv::WritePortFile(absl::GetFlag(FLAGS_port_file),
                        std::to_string(port) + " " + std::to_string(metrics_port));
  spdlog::info("riskkv-node: {} ({}), policy {}, listening on port {}, metrics on port {}",
               (*model)->config().name, fingerprint->substr(0, 12),
               options.policy ? policy.policy_id() + " v" + std::to_string(policy.version())
                              : std::string("none"),
               port, metrics_port);

  riskkv::ServeUntilSignal(*server, signals, "riskkv-node", std::chrono::seconds(5));
  return 0;
}
