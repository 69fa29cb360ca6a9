// The edge node's Prometheus metrics.
#include "services/node/node_metrics.h"

namespace riskkv {
namespace {

// Edge latencies: 1 ms to a minute.
const prometheus::Histogram::BucketBoundaries kSeconds = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
// KV transfers: 4 KiB to 1 GiB.
const prometheus::Histogram::BucketBoundaries kBytes = {
    4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864, 268435456, 1073741824};

}  // namespace

NodeMetrics::NodeMetrics(prometheus::Registry& r, const std::string& model)
    : model_(model),
      serving_(r, model),
      duration_(prometheus::BuildHistogram()
                    .Name("riskkv_migration_duration_seconds")
                    .Help("A migration end to end, as its source or target saw it")
                    .Register(r)),
      transfer_(prometheus::BuildHistogram()
                    .Name("riskkv_kv_transfer_seconds")
                    .Help("Sending a session's KV chunks, first chunk to trailer")
                    .Register(r)),
      rebuild_(prometheus::BuildHistogram()
                   .Name("riskkv_rebuild_seconds")
                   .Help("Rebuilding omitted layers on the target")
                   .Register(r)),
      recovery_(prometheus::BuildHistogram()
                    .Name("riskkv_recovery_seconds")
                    .Help("On the target: first byte received to first token ready")
                    .Register(r)),
      bytes_(prometheus::BuildHistogram()
                 .Name("riskkv_migration_sent_bytes")
                 .Help("KV payload bytes one migration sent")
                 .Register(r)),
      downtime_(prometheus::BuildHistogram()
                    .Name("riskkv_migration_downtime_seconds")
                    .Help("On the source: the session paused until the target took it over")
                    .Register(r)),
      migrations_(prometheus::BuildCounter()
                      .Name("riskkv_migrations_total")
                      .Help("Finished migrations by mode and outcome")
                      .Register(r)),
      omitted_(prometheus::BuildCounter()
                   .Name("riskkv_kv_omitted_bytes_total")
                   .Help("KV bytes not sent because the policy rebuilds their layers")
                   .Register(r)),
      failures_(prometheus::BuildCounter()
                    .Name("riskkv_migration_failures_total")
                    .Help("Failed or refused migrations by reason")
                    .Register(r)),
      sessions_(prometheus::BuildGauge()
                    .Name("riskkv_active_sessions")
                    .Help("Decoding sessions this node serves")
                    .Register(r)),
      kv_bytes_(prometheus::BuildGauge()
                    .Name("riskkv_kv_bytes")
                    .Help("KV bytes held, by sessions or by migrations being received")
                    .Register(r)),
      kv_budget_(prometheus::BuildGauge()
                     .Name("riskkv_kv_budget_bytes")
                     .Help("The node's KV budget (--kv-budget; 0: none)")
                     .Register(r)),
      in_doubt_(prometheus::BuildGauge()
                    .Name("riskkv_sessions_in_doubt")
                    .Help("Sessions this node sent whose commit went unconfirmed and whose "
                          "target cannot be asked yet: held here, served by neither node")
                    .Register(r)),
      expired_(prometheus::BuildCounter()
                   .Name("riskkv_sessions_expired_total")
                   .Help("Sessions closed because they were idle past the node's TTL")
                   .Register(r)),
      denied_(prometheus::BuildCounter()
                  .Name("riskkv_requests_denied_total")
                  .Help("Calls refused by the access check, by reason (unauthenticated, "
                        "permission_denied)")
                  .Register(r)),
      policy_version_(prometheus::BuildGauge()
                          .Name("riskkv_policy_version")
                          .Help("Version of the retention policy in use (0: none)")
                          .Register(r)),
      control_connected_(prometheus::BuildGauge()
                             .Name("riskkv_control_connected")
                             .Help("1 while the node's Watch stream to the control plane is up")
                             .Register(r)),
      policy_updates_(prometheus::BuildCounter()
                          .Name("riskkv_policy_updates_total")
                          .Help("Policy versions pushed by the control plane, by outcome")
                          .Register(r)),
      info_(prometheus::BuildGauge()
                .Name("riskkv_node_info")
                .Help("1, labelled with the node's advertised address and compute backend")
                .Register(r)) {
  // Series a dashboard queries exist from the start, at zero: a policy that omits nothing or a
  // node that never rebuilt shows 0 (or no quantile), not a missing series.
  sessions_.Add({{"model", model_}}).Set(0);
  kv_sessions_ = &kv_bytes_.Add({{"model", model_}, {"state", "sessions"}});
  kv_receiving_ = &kv_bytes_.Add({{"model", model_}, {"state", "receiving"}});
  kv_budget_.Add({{"model", model_}}).Set(0);
  in_doubt_.Add({{"model", model_}}).Set(0);
  expired_.Add({{"model", model_}});
  omitted_.Add({{"model", model_}});
  rebuild_.Add({{"model", model_}}, kSeconds);
  policy_version_.Add({{"model", model_}}).Set(0);
}

void NodeMetrics::Migration(const std::string& role, const std::string& mode,
                            const std::string& outcome, double seconds) {
  migrations_.Add({{"model", model_}, {"role", role}, {"mode", mode}, {"outcome", outcome}})
      .Increment();
  if (outcome == "ok") {
    duration_.Add({{"model", model_}, {"role", role}, {"mode", mode}}, kSeconds).Observe(seconds);
  }
}

void NodeMetrics::SessionsInDoubt(double change) {
  in_doubt_.Add({{"model", model_}}).Increment(change);
}

void NodeMetrics::SessionExpired() { expired_.Add({{"model", model_}}).Increment(); }

void NodeMetrics::Denied(const std::string& reason) {
  denied_.Add({{"model", model_}, {"reason", reason}}).Increment();
}

void NodeMetrics::Failure(const std::string& role, const std::string& reason) {
  failures_.Add({{"model", model_}, {"role", role}, {"reason", reason}}).Increment();
}

void NodeMetrics::Transfer(const std::string& mode, double seconds, double bytes,
                           double omitted_bytes) {
  transfer_.Add({{"model", model_}, {"mode", mode}}, kSeconds).Observe(seconds);
  bytes_.Add({{"model", model_}, {"mode", mode}}, kBytes).Observe(bytes);
  if (omitted_bytes > 0) omitted_.Add({{"model", model_}}).Increment(omitted_bytes);
}

void NodeMetrics::Rebuild(double seconds) {
  rebuild_.Add({{"model", model_}}, kSeconds).Observe(seconds);
}

void NodeMetrics::Recovery(const std::string& mode, double seconds) {
  recovery_.Add({{"model", model_}, {"mode", mode}}, kSeconds).Observe(seconds);
}

void NodeMetrics::Downtime(const std::string& mode, bool live, double seconds) {
  downtime_
      .Add({{"model", model_}, {"mode", mode}, {"handover", live ? "live" : "stop_and_copy"}},
           kSeconds)
      .Observe(seconds);
}

void NodeMetrics::SetActiveSessions(double n) { sessions_.Add({{"model", model_}}).Set(n); }

void NodeMetrics::SetKvBytes(const std::string& state, double bytes) {
  (state == "receiving" ? kv_receiving_ : kv_sessions_)->Set(bytes);
}

void NodeMetrics::SetKvBudget(double bytes) { kv_budget_.Add({{"model", model_}}).Set(bytes); }

void NodeMetrics::SetPolicyVersion(double v) { policy_version_.Add({{"model", model_}}).Set(v); }

void NodeMetrics::SetControlConnected(bool connected) {
  control_connected_.Add({{"model", model_}}).Set(connected ? 1 : 0);
}

void NodeMetrics::SetInfo(const std::string& address, const std::string& backend) {
  info_.Add({{"model", model_}, {"address", address}, {"backend", backend}}).Set(1);
}

void NodeMetrics::PolicyUpdate(const std::string& outcome) {
  policy_updates_.Add({{"model", model_}, {"outcome", outcome}}).Increment();
}

}  // namespace riskkv
