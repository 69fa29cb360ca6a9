// The control plane's Prometheus metrics.
#include "services/control/control_metrics.h"

namespace riskkv {

ControlMetrics::ControlMetrics(prometheus::Registry& r)
    : puts_(prometheus::BuildCounter()
                .Name("riskkv_control_puts_total")
                .Help("PutPolicy calls by outcome")
                .Register(r)),
      downloads_(prometheus::BuildCounter()
                     .Name("riskkv_control_bank_downloads_total")
                     .Help("Banks sent whole to a node")
                     .Register(r)),
      bank_bytes_(prometheus::BuildCounter()
                      .Name("riskkv_control_bank_sent_bytes_total")
                      .Help("Bank bytes sent to nodes")
                      .Register(r)),
      watchers_(prometheus::BuildGauge()
                    .Name("riskkv_control_watchers")
                    .Help("Nodes watching a policy now")
                    .Register(r)),
      policies_(prometheus::BuildGauge()
                    .Name("riskkv_control_policies")
                    .Help("Policy ids in the store")
                    .Register(r)),
      latest_(prometheus::BuildGauge()
                  .Name("riskkv_control_policy_latest_version")
                  .Help("Latest stored version of each policy")
                  .Register(r)),
      denied_(prometheus::BuildCounter()
                  .Name("riskkv_control_requests_denied_total")
                  .Help("Calls refused by the access check, by reason (unauthenticated, "
                        "permission_denied)")
                  .Register(r)) {
  watchers_.Add({}).Set(0);
  downloads_.Add({});
  bank_bytes_.Add({});
}

void ControlMetrics::Put(const std::string& outcome) {
  puts_.Add({{"outcome", outcome}}).Increment();
}

void ControlMetrics::BankDownload(double bytes) {
  downloads_.Add({}).Increment();
  bank_bytes_.Add({}).Increment(bytes);
}

void ControlMetrics::AddWatchers(double delta) { watchers_.Add({}).Increment(delta); }

void ControlMetrics::SetPolicies(double ids) { policies_.Add({}).Set(ids); }

void ControlMetrics::Denied(const std::string& reason) {
  denied_.Add({{"reason", reason}}).Increment();
}

void ControlMetrics::SetLatestVersion(const std::string& policy_id, double version) {
  latest_.Add({{"policy_id", policy_id}}).Set(version);
}

}  // namespace riskkv
