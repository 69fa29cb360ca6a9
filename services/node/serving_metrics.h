// The serving half of the node's metrics, with the names users of other LLM servers know: time
// to first token, the gap between tokens, tokens generated, and how the engine's scheduler
// batches (items and tokens per step, each step's time, each kind of item's wait in the queue).
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <array>
#include <string>

#include "common/engine/scheduler.h"

namespace riskkv {

class ServingMetrics final : public SchedulerObserver {
 public:
  ServingMetrics(prometheus::Registry& registry, const std::string& model);

  // A Generate call's first token, `seconds` after the call arrived.
  void FirstToken(double seconds);
  // The gap between two tokens of one Generate call.
  void InterToken(double seconds);
  void TokenGenerated();

  void StepRan(int64_t items, int64_t tokens, double seconds) override;
  void Waited(WorkKind kind, double seconds) override;

 private:
  prometheus::Histogram* first_token_;
  prometheus::Histogram* inter_token_;
  prometheus::Counter* generated_;
  prometheus::Histogram* batch_items_;
  prometheus::Histogram* batch_tokens_;
  prometheus::Histogram* step_;
  std::array<prometheus::Histogram*, kWorkKinds> wait_{};
};

}  // namespace riskkv
