// The control plane's Prometheus metrics (riskkv_control_ prefix, bounded labels).
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <string>

namespace riskkv {

class ControlMetrics {
 public:
  explicit ControlMetrics(prometheus::Registry& registry);

  // One PutPolicy: "ok", or the gRPC status name in lower case ("invalid_argument", ...).
  void Put(const std::string& outcome);
  void BankDownload(double bytes);
  void AddWatchers(double delta);
  // Stored policy ids and, per id, the latest version (ids are few and chosen by operators).
  void SetPolicies(double ids);
  void SetLatestVersion(const std::string& policy_id, double version);
  // A call refused by the access check: reason "unauthenticated" or "permission_denied".
  void Denied(const std::string& reason);

 private:
  prometheus::Family<prometheus::Counter>& puts_;
  prometheus::Family<prometheus::Counter>& downloads_;
  prometheus::Family<prometheus::Counter>& bank_bytes_;
  prometheus::Family<prometheus::Gauge>& watchers_;
  prometheus::Family<prometheus::Gauge>& policies_;
  prometheus::Family<prometheus::Gauge>& latest_;
  prometheus::Family<prometheus::Counter>& denied_;
};

}  // namespace riskkv
