// The serving half of the node's metrics (see serving_metrics.h).
#include "services/node/serving_metrics.h"

namespace riskkv {
namespace {

// Token latencies: half a millisecond to ten seconds.
const prometheus::Histogram::BucketBoundaries kTokenSeconds = {
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03,
    0.05,   0.075, 0.1,   0.25,  0.5,   1,      2.5,  5,     10};
// Items or tokens in one step: 1 to the largest budgets.
const prometheus::Histogram::BucketBoundaries kCounts = {1,  2,  3,  4,   6,   8,   12,  16,
                                                         24, 32, 64, 128, 256, 512, 1024};

}  // namespace

ServingMetrics::ServingMetrics(prometheus::Registry& r, const std::string& model) {
  const prometheus::Labels labels = {{"model", model}};
  first_token_ = &prometheus::BuildHistogram()
                      .Name("riskkv_time_to_first_token_seconds")
                      .Help(
                          "A Generate call's arrival to its first token, plus the session's "
                          "StartSession prefill for its first")
                      .Register(r)
                      .Add(labels, kTokenSeconds);
  inter_token_ = &prometheus::BuildHistogram()
                      .Name("riskkv_inter_token_latency_seconds")
                      .Help("The gap between two tokens of one Generate call")
                      .Register(r)
                      .Add(labels, kTokenSeconds);
  generated_ = &prometheus::BuildCounter()
                    .Name("riskkv_generated_tokens_total")
                    .Help("Tokens generated for Generate calls")
                    .Register(r)
                    .Add(labels);
  batch_items_ = &prometheus::BuildHistogram()
                      .Name("riskkv_batch_items")
                      .Help("Sessions' items in one engine step")
                      .Register(r)
                      .Add(labels, kCounts);
  batch_tokens_ = &prometheus::BuildHistogram()
                       .Name("riskkv_batch_tokens")
                       .Help("Tokens in one engine step")
                       .Register(r)
                       .Add(labels, kCounts);
  step_ = &prometheus::BuildHistogram()
               .Name("riskkv_batch_step_seconds")
               .Help("One engine step (a shared forward pass of every item in it)")
               .Register(r)
               .Add(labels, kTokenSeconds);
  auto& wait = prometheus::BuildHistogram()
                   .Name("riskkv_queue_wait_seconds")
                   .Help("An engine work item's wait from submission to its first step, by kind")
                   .Register(r);
  for (int k = 0; k < kWorkKinds; ++k) {
    prometheus::Labels l = labels;
    l["kind"] = std::string(WorkKindName(static_cast<WorkKind>(k)));
    wait_[k] = &wait.Add(l, kTokenSeconds);
  }
}

void ServingMetrics::FirstToken(double seconds) { first_token_->Observe(seconds); }
void ServingMetrics::InterToken(double seconds) { inter_token_->Observe(seconds); }
void ServingMetrics::TokenGenerated() { generated_->Increment(); }

void ServingMetrics::StepRan(int64_t items, int64_t tokens, double seconds) {
  batch_items_->Observe(static_cast<double>(items));
  batch_tokens_->Observe(static_cast<double>(tokens));
  step_->Observe(seconds);
}

void ServingMetrics::Waited(WorkKind kind, double seconds) {
  wait_[static_cast<int>(kind)]->Observe(seconds);
}

}  // namespace riskkv
