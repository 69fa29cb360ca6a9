// riskkv-node: one edge node. Serves decoding sessions over gRPC and moves them to and from other
// nodes (see services/node/node_service.h); Prometheus metrics on /metrics; the standard gRPC
// health service and server reflection for generic clients.
//   riskkv-node --model M --listen 127.0.0.1:7070 --metrics-listen 127.0.0.1:9470
//               [--policy policy.pb --bank bank.rkvbank | --control HOST:PORT --policy-id ID]
//               [--link-mbps 100]
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <prometheus/exposer.h>

#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/engine/engine.h"
#include "common/model/model_fingerprint.h"
#include "common/recovery/retention_policy.h"
#include "services/access/access_flags.h"
#include "services/cli_args.h"
#include "services/cli_help.h"
#include "services/node/advertise.h"
#include "services/node/kv_budget.h"
#include "services/node/node_service.h"
#include "services/node/policy_follower.h"
#include "services/server_main.h"
#include "services/tls.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, model, "", "GGUF file or Hugging Face model directory (required)");
ABSL_FLAG(std::string, listen, "127.0.0.1:7070", "gRPC address (port 0: any free port)");
ABSL_FLAG(std::string, advertise, "",
          "the address other nodes and clients reach this node at, shown in riskkv_node_info "
          "(default: --listen's host with the port it got; this machine's host name for a "
          "wildcard such as 0.0.0.0)");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9470",
          "Prometheus /metrics address (port 0: any free port; empty: no metrics)");
ABSL_FLAG(std::string, port_file, "",
          "write 'GRPC_PORT METRICS_PORT' here once listening (for scripts using port 0)");
ABSL_FLAG(std::string, policy, "", "retention policy file (riskkv-calibrate's policy.pb)");
ABSL_FLAG(std::string, bank, "",
          "predictor bank the policy names (bank.rkvbank; none for a policy that rebuilds "
          "nothing)");
ABSL_FLAG(std::string, control, "",
          "riskkv-control address: follow --policy-id there instead of --policy/--bank");
ABSL_FLAG(std::string, policy_id, "", "the policy to follow at --control");
ABSL_FLAG(std::string, cache_dir, "",
          "where policies and banks from --control are cached (default: $RISKKV_HOME/node-cache, "
          "RISKKV_HOME defaulting to ~/.cache/riskkv)");
ABSL_FLAG(int, threads, 0, "CPU threads (0: all)");
ABSL_FLAG(std::string, backend, "auto",
          "where sessions run: auto (the GPU when one is usable and --kv-dtype is f16, else the "
          "CPU), cpu, or cuda (fail without a usable GPU)");
ABSL_FLAG(int, gpu_device, 0, "CUDA device index for --backend auto|cuda");
ABSL_FLAG(std::string, activations, "int8", "int8 (llama.cpp's arithmetic) or f32 (exact)");
ABSL_FLAG(bool, cpu_panels, true,
          "with int8 on an AVX-512 VNNI CPU, a second copy of the Q4_1 and Q8_0 weights regrouped "
          "for a kernel about twice as fast, with the same results (96 MB for SmolLM2; never with "
          "--backend cuda)");
ABSL_FLAG(std::string, kv_dtype, "f16", "KV cache storage and wire dtype: f16 or f32");
ABSL_FLAG(int64_t, capacity, 0, "KV rows per session (0: the model's context)");
ABSL_FLAG(int64_t, batch_tokens, 256,
          "the most tokens one engine step runs: every waiting decode, then one chunk of a "
          "prefill, replay or scoring");
ABSL_FLAG(int64_t, prefill_chunk, 64,
          "the most tokens of one prompt or scoring in one step, so decodes wait at most about one "
          "chunk's time behind a long prompt (at most --batch-tokens)");
ABSL_FLAG(double, batch_gather_ms, 2,
          "how long a step waits for the streams that just got a token to ask for the next one, "
          "so they share one step (a tenth of the step before when that is longer)");
ABSL_FLAG(double, link_mbps, 0, "sender-side rate limit emulating a link, Mbit/s (0: none)");
ABSL_FLAG(int, max_sessions, 64, "sessions this node serves at most");
ABSL_FLAG(int, max_sessions_per_identity, 16,
          "sessions one identity (a session's owner in --access-file) holds on this node at most "
          "(0: no limit but --max-sessions)");
ABSL_FLAG(int, max_migrations_per_identity, 2,
          "migrations of one identity's sessions in flight from this node at most (0: no limit)");
ABSL_FLAG(std::string, kv_budget, "0",
          "KV bytes that sessions and migrations being received may hold together, e.g. 2GiB "
          "(0: no limit but --capacity and --max-sessions); a call that would pass it is "
          "refused with RESOURCE_EXHAUSTED");
ABSL_FLAG(double, session_ttl, 3600,
          "seconds a session may go unused (no call, no migration) before the node closes it "
          "(0: never)");
ABSL_FLAG(int, max_receives, 4, "incoming migrations this node receives at once");
ABSL_FLAG(double, receive_idle_timeout, 60,
          "seconds an incoming migration may wait on its source without a frame (must exceed "
          "one 256 KiB chunk's time on the slowest link)");
ABSL_FLAG(double, receive_handshake_timeout, 10,
          "seconds an incoming migration may take to send its handshake");
ABSL_FLAG(double, receive_min_rate, 32768,
          "bytes per second an incoming migration's source must keep up after its handshake "
          "(the target's own work not counted, past a grace of at least 10 s; 0: no minimum)");
ABSL_FLAG(double, timeout, 120, "default deadline of a migration, seconds");
ABSL_FLAG(double, live_threshold_seconds, 0.1,
          "AUTO migrates live (pre-copy) when its transfer estimate exceeds this, seconds");
ABSL_FLAG(int64_t, live_pause_rows, 4,
          "a live migration pauses the session once a round would carry at most this many rows");
ABSL_FLAG(int, live_max_rounds, 8, "pre-copy rounds of a live migration at most");
ABSL_FLAG(double, in_doubt_seconds, 0,
          "after a commit whose confirmation was lost and whose target cannot be asked about it "
          "within the migration's deadline, hold the session (served by neither node) and ask "
          "on for this long, then serve it here again, which may leave it on both (0: ask until "
          "the target answers or this node stops)");
ABSL_FLAG(std::string, peer_token_file, "",
          "a file whose first line is the bearer token this node presents to migration targets "
          "and to --control (an identity with the node role in their access files); read again "
          "when it changes");

namespace {

int Fail(const std::string& m) {
  spdlog::error("riskkv-node: {}", m);
  return 1;
}

std::string DefaultCacheDir() {
  if (const char* home = std::getenv("RISKKV_HOME"); home && *home) {
    return std::string(home) + "/node-cache";
  }
  const char* user = std::getenv("HOME");
  return std::string(user && *user ? user : ".") + "/.cache/riskkv/node-cache";
}

}  // namespace

int main(int argc, char** argv) {
  // Every thread started from here on leaves SIGINT / SIGTERM to the one that waits for them.
  const sigset_t signals = riskkv::BlockTerminationSignals();
  absl::SetProgramUsageMessage(
      "riskkv-node --model PATH [--listen HOST:PORT] [--policy P --bank B | --control ADDR "
      "--policy-id ID [--cache-dir DIR]]");
  std::vector<std::string> store;
  riskkv::ExitOnHelp(argc, argv);
  std::vector<char*> args = riskkv::NormalizeFlagNames(argc, argv, &store);
  absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  const std::string model_path = absl::GetFlag(FLAGS_model);
  if (model_path.empty()) return Fail("--model is required");
  const auto kv = riskkv::FloatDTypeFromFlag("kv-dtype", absl::GetFlag(FLAGS_kv_dtype));
  if (!kv.ok()) return Fail(kv.status().ToString());
  if (absl::GetFlag(FLAGS_link_mbps) < 0) return Fail("--link-mbps must be >= 0");
  if (absl::GetFlag(FLAGS_max_sessions) < 1) return Fail("--max-sessions must be >= 1");
  if (absl::GetFlag(FLAGS_max_sessions_per_identity) < 0) {
    return Fail("--max-sessions-per-identity must be >= 0");
  }
  if (absl::GetFlag(FLAGS_max_migrations_per_identity) < 0) {
    return Fail("--max-migrations-per-identity must be >= 0");
  }
  const auto kv_budget = riskkv::ParseByteSize("kv-budget", absl::GetFlag(FLAGS_kv_budget));
  if (!kv_budget.ok()) return Fail(std::string(kv_budget.status().message()));
  if (!(absl::GetFlag(FLAGS_live_threshold_seconds) >= 0)) {
    return Fail("--live-threshold-seconds must be >= 0");
  }
  if (absl::GetFlag(FLAGS_live_pause_rows) < 0) return Fail("--live-pause-rows must be >= 0");
  if (absl::GetFlag(FLAGS_live_max_rounds) < 1) return Fail("--live-max-rounds must be >= 1");
  if (!(absl::GetFlag(FLAGS_timeout) > 0)) return Fail("--timeout must be > 0");
  if (absl::GetFlag(FLAGS_max_receives) < 1) return Fail("--max-receives must be >= 1");
  if (!(absl::GetFlag(FLAGS_in_doubt_seconds) >= 0 &&
        absl::GetFlag(FLAGS_in_doubt_seconds) <= 1e9)) {
    return Fail("--in-doubt-seconds must be >= 0 seconds (0: until the target answers)");
  }
  if (!(absl::GetFlag(FLAGS_session_ttl) >= 0 && absl::GetFlag(FLAGS_session_ttl) <= 1e9)) {
    return Fail("--session-ttl must be >= 0 seconds (0: sessions never expire)");
  }
  if (!(absl::GetFlag(FLAGS_receive_idle_timeout) > 0)) {
    return Fail("--receive-idle-timeout must be > 0");
  }
  if (!(absl::GetFlag(FLAGS_receive_handshake_timeout) > 0)) {
    return Fail("--receive-handshake-timeout must be > 0");
  }
  if (!(absl::GetFlag(FLAGS_receive_min_rate) >= 0 &&
        absl::GetFlag(FLAGS_receive_min_rate) <= 1e12)) {
    return Fail("--receive-min-rate must be >= 0 bytes/s (0: no minimum)");
  }
  if (absl::GetFlag(FLAGS_policy).empty() && !absl::GetFlag(FLAGS_bank).empty()) {
    return Fail("--bank needs the --policy that names it");
  }
  const bool follow = !absl::GetFlag(FLAGS_control).empty();
  if (follow && !absl::GetFlag(FLAGS_policy).empty()) {
    return Fail(
        "--control and --policy exclude each other: a node follows the control plane or "
        "serves a fixed policy");
  }
  if (follow != !absl::GetFlag(FLAGS_policy_id).empty()) {
    return Fail("--control and --policy-id go together");
  }
  const std::string backend = absl::GetFlag(FLAGS_backend);
  if (backend != "auto" && backend != "cpu" && backend != "cuda") {
    return Fail("--backend must be auto, cpu or cuda, not '" + backend + "'");
  }
  if (backend == "cuda" && *kv != riskkv::DType::kF16) {
    return Fail("--backend cuda keeps KV in f16: drop --kv-dtype f32 or use --backend cpu");
  }
  if (absl::GetFlag(FLAGS_gpu_device) < 0) return Fail("--gpu-device must be >= 0");
  auto model_options =
      riskkv::ModelOptionsFromFlags(absl::GetFlag(FLAGS_threads), absl::GetFlag(FLAGS_activations));
  if (!model_options.ok()) return Fail(model_options.status().ToString());
  model_options->cpu_panels = absl::GetFlag(FLAGS_cpu_panels) && backend != "cuda";
  auto model = riskkv::Model::Load(model_path, *model_options);
  if (!model.ok()) return Fail(model.status().ToString());
  auto fingerprint = riskkv::ModelFingerprint(**model);
  if (!fingerprint.ok()) return Fail(fingerprint.status().ToString());

  const riskkv::TlsFiles tls = riskkv::TlsFilesFromFlags();
  auto server_credentials = riskkv::ServerCredentialsFor(tls);
  if (!server_credentials.ok()) return Fail(server_credentials.status().ToString());
  auto peer_credentials = riskkv::ChannelCredentialsFor(tls);
  if (!peer_credentials.ok()) return Fail(peer_credentials.status().ToString());

  auto access_file = riskkv::AccessFileFromFlags();
  if (!access_file.ok()) return Fail(access_file.status().ToString());
  std::shared_ptr<riskkv::TokenFile> peer_token;
  if (!absl::GetFlag(FLAGS_peer_token_file).empty()) {
    auto t = riskkv::TokenFile::Open(absl::GetFlag(FLAGS_peer_token_file), "peer-token-file");
    if (!t.ok()) return Fail(t.status().ToString());
    peer_token = *std::move(t);
  }
  const std::string listen =
      riskkv::ListenAddressFromFlags("riskkv-node", absl::GetFlag(FLAGS_listen), tls.enabled(),
                                     !tls.ca.empty(), *access_file != nullptr);

  riskkv::NodeOptions options;
  options.peer_credentials = *peer_credentials;
  options.peer_token = peer_token;
  options.access_file = *access_file;
  options.model_fingerprint = *fingerprint;
  options.scheduler = {.batch_tokens = absl::GetFlag(FLAGS_batch_tokens),
                       .prefill_chunk = absl::GetFlag(FLAGS_prefill_chunk),
                       .gather = absl::Milliseconds(absl::GetFlag(FLAGS_batch_gather_ms))};
  if (!(absl::GetFlag(FLAGS_batch_gather_ms) >= 0)) return Fail("--batch-gather-ms must be >= 0");
  if (absl::Status ok = options.scheduler.Validate(); !ok.ok()) {
    return Fail("--batch-tokens/--prefill-chunk/--batch-gather-ms: " + std::string(ok.message()));
  }
  options.activations = absl::GetFlag(FLAGS_activations);
  options.capacity = absl::GetFlag(FLAGS_capacity);
  options.link_mbps = absl::GetFlag(FLAGS_link_mbps);
  options.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  options.max_sessions_per_identity = absl::GetFlag(FLAGS_max_sessions_per_identity);
  options.max_migrations_per_identity = absl::GetFlag(FLAGS_max_migrations_per_identity);
  options.kv_budget_bytes = *kv_budget;
  options.session_idle_ttl_seconds = absl::GetFlag(FLAGS_session_ttl);
  options.live_threshold_seconds = absl::GetFlag(FLAGS_live_threshold_seconds);
  options.live_pause_rows = absl::GetFlag(FLAGS_live_pause_rows);
  options.live_max_rounds = absl::GetFlag(FLAGS_live_max_rounds);
  options.in_doubt_seconds = absl::GetFlag(FLAGS_in_doubt_seconds);
  options.default_timeout_seconds = absl::GetFlag(FLAGS_timeout);
  options.max_concurrent_receives = absl::GetFlag(FLAGS_max_receives);
  options.receive_idle_seconds = absl::GetFlag(FLAGS_receive_idle_timeout);
  options.receive_handshake_seconds = absl::GetFlag(FLAGS_receive_handshake_timeout);
  options.min_receive_bytes_per_second = absl::GetFlag(FLAGS_receive_min_rate);
  if (!absl::GetFlag(FLAGS_policy).empty()) {
    auto r = riskkv::LoadRetention(absl::GetFlag(FLAGS_policy), absl::GetFlag(FLAGS_bank),
                                   static_cast<int32_t>((*model)->config().n_layers), *fingerprint);
    if (!r.ok()) return Fail(r.status().ToString());
    options.retention = *r;
  }

  const auto n_layers = static_cast<int32_t>((*model)->config().n_layers);

  // Metrics first: civetweb's threads start before anything else takes thread-local storage.
  auto registry = std::make_shared<prometheus::Registry>();
  int metrics_port = 0;
  auto exposer = riskkv::ServeMetrics(absl::GetFlag(FLAGS_metrics_listen), registry, &metrics_port);
  if (!exposer.ok()) return Fail(exposer.status().ToString());
  riskkv::NodeMetrics metrics(*registry, (*model)->config().name);

  // The GPU module is loaded only now, after civetweb's threads exist (see kernels/gpu.h).
  std::string backend_note;
  auto engine = riskkv::CreateEngine(
      **model, {.backend = backend, .gpu_device = absl::GetFlag(FLAGS_gpu_device), .kv_dtype = *kv},
      &backend_note);
  if (!engine.ok()) return Fail(std::string(engine.status().message()));

  // Following the control plane: start from the cached version, so the node serves RECONSTRUCT
  // even while the control plane is down, then watch for newer ones.
  std::unique_ptr<riskkv::PolicyFollower> follower;
  riskkv::NodeService* service_ptr = nullptr;
  if (follow) {
    riskkv::PolicyFollowerOptions fo;
    fo.control_address = absl::GetFlag(FLAGS_control);
    fo.policy_id = absl::GetFlag(FLAGS_policy_id);
    fo.cache_dir =
        absl::GetFlag(FLAGS_cache_dir).empty() ? DefaultCacheDir() : absl::GetFlag(FLAGS_cache_dir);
    fo.model_fingerprint = *fingerprint;
    fo.n_layers = n_layers;
    fo.credentials = *peer_credentials;
    fo.token = peer_token;
    auto f = riskkv::PolicyFollower::Create(
        fo,
        [&service_ptr](std::shared_ptr<const riskkv::Retention> r) {
          service_ptr->SetRetention(std::move(r));
        },
        &metrics);
    if (!f.ok()) return Fail(f.status().ToString());
    follower = std::move(*f);
    auto cached = follower->LoadCache();
    if (!cached.ok()) {
      spdlog::warn("riskkv-node: ignoring the cached policy: {}", cached.status().ToString());
    } else if (*cached) {
      spdlog::info("riskkv-node: policy {} v{} from the cache in {}", fo.policy_id,
                   (*cached)->policy.version, fo.cache_dir);
      options.retention = *cached;
    }
  }
  riskkv::NodeService service(**engine, options, &metrics);
  service_ptr = &service;

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, *server_credentials, &port);
  builder.SetMaxReceiveMessageSize(8 << 20);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) return Fail("cannot listen on " + listen);
  std::string advertise = absl::GetFlag(FLAGS_advertise);
  if (advertise.empty()) advertise = riskkv::DefaultAdvertise(listen, port, riskkv::HostName());
  metrics.SetInfo(advertise, std::string((*engine)->backend()));
  const auto retention = service.retention();
  spdlog::info(
      "riskkv-node: {} ({}) on {}, policy {}, listening on port {} (advertised as {}), metrics "
      "on port {}",
      (*model)->config().name, fingerprint->substr(0, 12), backend_note,
      retention ? retention->policy.Name() : std::string("none"), port, advertise, metrics_port);
  // Last: scripts waiting for the port file find the log line and the info metric in place.
  riskkv::WritePortFile(absl::GetFlag(FLAGS_port_file),
                        std::to_string(port) + " " + std::to_string(metrics_port));
  if (follower) follower->Start();

  riskkv::ServeUntilSignal(*server, signals, "riskkv-node", std::chrono::seconds(5),
                           [&service] { service.BeginShutdown(); });
  if (follower) follower->Stop();
  return 0;
}
