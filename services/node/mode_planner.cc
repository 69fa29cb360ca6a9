// AUTO's mode planner (see mode_planner.h).
#include "services/node/mode_planner.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace riskkv {
namespace {

constexpr double kWeight = 0.3;         // of a new measurement in the running estimate
constexpr int64_t kMinTokens = 8;       // shorter prefills and rebuilds say little about speed
constexpr double kMinBytes = 64 << 10;  // likewise for transfers
constexpr size_t kMaxPeers = 256;
constexpr double kAssumedBytesPerSecond = 125e6;

void Blend(double* estimate, bool* measured, double value) {
  *estimate = *measured ? (1 - kWeight) * *estimate + kWeight * value : value;
  *measured = true;
}

}  // namespace

ModePlanner::ModePlanner(ModePlannerOptions options)
    : options_(options),
      prefill_spt_(options.prefill_seconds_per_token),
      rebuild_spt_(options.rebuild_seconds_per_token) {}

void ModePlanner::MeasurePrefill(double seconds, int64_t tokens) {
  if (!options_.measure_speeds || tokens < kMinTokens || !(seconds > 0)) return;
  absl::MutexLock lock(&mu_);
  Blend(&prefill_spt_, &prefill_measured_, seconds / static_cast<double>(tokens));
}

void ModePlanner::MeasureRebuild(double seconds, int64_t tokens) {
  if (!options_.measure_speeds || tokens < kMinTokens || !(seconds > 0)) return;
  absl::MutexLock lock(&mu_);
  Blend(&rebuild_spt_, &rebuild_measured_, seconds / static_cast<double>(tokens));
}

void ModePlanner::MeasurePeer(const std::string& target, double bytes, double seconds,
                              double prefill_seconds_per_token, double rebuild_seconds_per_token) {
  if (!options_.measure_speeds) return;
  absl::MutexLock lock(&mu_);
  if (!peers_.count(target) && peers_.size() >= kMaxPeers) peers_.erase(peers_.begin());
  Peer& p = peers_[target];
  if (bytes >= kMinBytes && seconds > 0) {
    bool measured = p.bytes_per_second > 0;
    Blend(&p.bytes_per_second, &measured, bytes / seconds);
  }
  if (prefill_seconds_per_token > 0) p.prefill_seconds_per_token = prefill_seconds_per_token;
  if (rebuild_seconds_per_token > 0) p.rebuild_seconds_per_token = rebuild_seconds_per_token;
}

double ModePlanner::measured_prefill_seconds_per_token() const {
  absl::MutexLock lock(&mu_);
  return prefill_measured_ ? prefill_spt_ : 0;
}

double ModePlanner::measured_rebuild_seconds_per_token() const {
  absl::MutexLock lock(&mu_);
  return rebuild_measured_ ? rebuild_spt_ : 0;
}

ModePlan ModePlanner::Rank(const PlanInput& in) const {
  const auto history = static_cast<double>(in.history_tokens);
  // Each input: measured toward this target, measured here, configured, or assumed.
  const double link = options_.link_bytes_per_second;
  double rate = link > 0 ? link : kAssumedBytesPerSecond;
  std::string rate_from = link > 0 ? "--link-mbps" : "assumed";
  double prefill, rebuild;
  std::string prefill_from, rebuild_from;
  {
    absl::MutexLock lock(&mu_);
    prefill = prefill_spt_;
    rebuild = rebuild_spt_;
    prefill_from = prefill_measured_ ? "measured here" : "assumed";
    rebuild_from = rebuild_measured_ ? "measured here" : "assumed";
    if (auto it = peers_.find(in.target); it != peers_.end()) {
      const Peer& p = it->second;
      if (p.bytes_per_second > 0 && (rate_from == "assumed" || p.bytes_per_second < rate)) {
        rate = p.bytes_per_second;
        rate_from = "measured to the target";
      }
      if (p.prefill_seconds_per_token > 0) {
        prefill = p.prefill_seconds_per_token;
        prefill_from = "the target's";
      }
      if (p.rebuild_seconds_per_token > 0) {
        rebuild = p.rebuild_seconds_per_token;
        rebuild_from = "the target's";
      }
    }
  }
  const double full = static_cast<double>(in.full_kv_bytes) / rate;
  const double replay = history * prefill;
  std::vector<std::pair<double, MigrationMode>> est = {{full, MigrationMode::kFullKv},
                                                       {replay, MigrationMode::kTokenReplay}};
  double recon = -1;
  if (in.reconstruct_bytes >= 0) {
    recon = static_cast<double>(in.reconstruct_bytes) / rate + history * rebuild;
    est.insert(est.begin(), {recon, MigrationMode::kReconstruct});
  }
  std::stable_sort(est.begin(), est.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  ModePlan plan;
  plan.reason =
      absl::StrCat("auto: estimated reconstruct ",
                   recon >= 0 ? absl::StrCat(recon, " s") : std::string("n/a (no policy)"),
                   ", full_kv ", full, " s, token_replay ", replay, " s at ", rate * 8 / 1e6,
                   " Mbit/s (", rate_from, "), prefill ", prefill * 1e3, " ms/token (",
                   prefill_from, "), rebuild ", rebuild * 1e3, " ms/token (", rebuild_from, ")");
  for (const auto& e : est) plan.modes.push_back(e.second);
  plan.seconds = est.front().first;
  return plan;
}

}  // namespace riskkv
