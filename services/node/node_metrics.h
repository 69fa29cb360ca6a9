// The edge node's Prometheus metrics (riskkv_ prefix, base units, bounded labels: model, mode,
// role, outcome, reason; never a session id).
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <string>

#include "services/node/serving_metrics.h"

namespace riskkv {

class NodeMetrics {
 public:
  NodeMetrics(prometheus::Registry& registry, const std::string& model);

  // One finished migration, seen from `role` ("source" or "target").
  void Migration(const std::string& role, const std::string& mode, const std::string& outcome,
                 double seconds);
  void Failure(const std::string& role, const std::string& reason);
  void Transfer(const std::string& mode, double seconds, double bytes, double omitted_bytes);
  void Rebuild(double seconds);
  void Recovery(const std::string& mode, double seconds);
  // A source's committed migration: how long the session was paused, and whether it was live
  // (handover "live") or stop-and-copy ("stop_and_copy").
  void Downtime(const std::string& mode, bool live, double seconds);
  void SetActiveSessions(double n);
  // riskkv_kv_bytes{state}: KV bytes held by "sessions" or by "receiving" migrations (the
  // node's KV budget counts both); riskkv_kv_budget_bytes: that budget (0: none).
  void SetKvBytes(const std::string& state, double bytes);  // state: "sessions" or "receiving"
  void SetKvBudget(double bytes);
  void SessionExpired();
  // Sessions held on this node as sources whose hand-over outcome is not known yet (+1 / -1).
  void SessionsInDoubt(double change);
  // A call refused by the access check: reason "unauthenticated" or "permission_denied".
  void Denied(const std::string& reason);
  void SetPolicyVersion(double version);
  // Following the control plane: whether the Watch stream is up, and each pushed version
  // ("applied" or "rejected").
  void SetControlConnected(bool connected);
  // riskkv_node_info: the address other nodes reach this one at, and the compute backend.
  void SetInfo(const std::string& address, const std::string& backend);
  void PolicyUpdate(const std::string& outcome);
  // Tokens and the engine's steps.
  ServingMetrics& serving() { return serving_; }

 private:
  std::string model_;
  ServingMetrics serving_;
  prometheus::Family<prometheus::Histogram>& duration_;
  prometheus::Family<prometheus::Histogram>& transfer_;
  prometheus::Family<prometheus::Histogram>& rebuild_;
  prometheus::Family<prometheus::Histogram>& recovery_;
  prometheus::Family<prometheus::Histogram>& bytes_;
  prometheus::Family<prometheus::Histogram>& downtime_;
  prometheus::Family<prometheus::Counter>& migrations_;
  prometheus::Family<prometheus::Counter>& omitted_;
  prometheus::Family<prometheus::Counter>& failures_;
  prometheus::Family<prometheus::Gauge>& sessions_;
  prometheus::Family<prometheus::Gauge>& kv_bytes_;
  // Its two series, looked up once: the budget sets one on every decode step.
  prometheus::Gauge* kv_sessions_ = nullptr;
  prometheus::Gauge* kv_receiving_ = nullptr;
  prometheus::Family<prometheus::Gauge>& kv_budget_;
  prometheus::Family<prometheus::Gauge>& in_doubt_;
  prometheus::Family<prometheus::Counter>& expired_;
  prometheus::Family<prometheus::Counter>& denied_;
  prometheus::Family<prometheus::Gauge>& policy_version_;
  prometheus::Family<prometheus::Gauge>& control_connected_;
  prometheus::Family<prometheus::Counter>& policy_updates_;
  prometheus::Family<prometheus::Gauge>& info_;
};

}  // namespace riskkv
