#include "services/node/kv_budget.h"

#include <cctype>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace riskkv {

const char* KvBudget::StateName(State s) {
  return s == State::kSessions ? "sessions" : "receiving";
}

KvBudget::KvBudget(int64_t limit_bytes, int64_t bytes_per_row,
                   std::function<void(State, int64_t)> on_change)
    : limit_bytes_(limit_bytes), bytes_per_row_(bytes_per_row), on_change_(std::move(on_change)) {}

int64_t KvBudget::used_bytes(State state) const {
  absl::MutexLock lock(&mu_);
  return used_[static_cast<int>(state)];
}

absl::Status KvBudget::Add(State state, int64_t bytes) {
  int64_t now = 0;
  {
    absl::MutexLock lock(&mu_);
    const int64_t total = used_[0] + used_[1];
    if (limit_bytes_ > 0 && total + bytes > limit_bytes_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the node's KV budget (--kv-budget ", limit_bytes_,
                       " bytes) is full: ", total, " bytes in use (", used_[0], " by sessions, ",
                       used_[1], " by receives), ", bytes, " more asked"));
    }
    now = used_[static_cast<int>(state)] += bytes;
  }
  if (on_change_) on_change_(state, now);
  return absl::OkStatus();
}

void KvBudget::Sub(State state, int64_t bytes) {
  int64_t now = 0;
  {
    absl::MutexLock lock(&mu_);
    now = used_[static_cast<int>(state)] -= bytes;
  }
  if (on_change_) on_change_(state, now);
}

KvBudget::Charge::Charge(Charge&& other) noexcept
    : budget_(std::exchange(other.budget_, nullptr)),
      state_(other.state_),
      rows_(std::exchange(other.rows_, 0)) {}

KvBudget::Charge& KvBudget::Charge::operator=(Charge&& other) noexcept {
  if (this != &other) {
    Release();
    budget_ = std::exchange(other.budget_, nullptr);
    state_ = other.state_;
    rows_ = std::exchange(other.rows_, 0);
  }
  return *this;
}

KvBudget::Charge::~Charge() { Release(); }

void KvBudget::Charge::Release() {
  if (budget_ != nullptr && rows_ > 0) budget_->Sub(state_, rows_ * budget_->bytes_per_row_);
  rows_ = 0;
}

absl::Status KvBudget::Charge::GrowTo(int64_t rows) {
  if (budget_ == nullptr || rows <= rows_) return absl::OkStatus();
  if (absl::Status s = budget_->Add(state_, (rows - rows_) * budget_->bytes_per_row_); !s.ok()) {
    return s;
  }
  rows_ = rows;
  return absl::OkStatus();
}

void KvBudget::Charge::MoveTo(State state) {
  if (budget_ == nullptr || state == state_) return;
  const int64_t bytes = rows_ * budget_->bytes_per_row_;
  const State from = state_;
  state_ = state;
  if (bytes == 0) return;
  int64_t from_now = 0, to_now = 0;
  {
    // One step, so the total never dips for another charge to take what is moving.
    absl::MutexLock lock(&budget_->mu_);
    from_now = budget_->used_[static_cast<int>(from)] -= bytes;
    to_now = budget_->used_[static_cast<int>(state)] += bytes;
  }
  if (budget_->on_change_) {
    budget_->on_change_(from, from_now);
    budget_->on_change_(state, to_now);
  }
}

absl::StatusOr<int64_t> ParseByteSize(const std::string& flag, const std::string& text) {
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, " '", text, "' is not a size in bytes (e.g. 2147483648, 512MiB, 2GiB, 1.5GB)"));
  };
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) {
    ++i;
  }
  if (i == 0) return bad();
  double value = 0;
  try {
    size_t used = 0;
    value = std::stod(text.substr(0, i), &used);
    if (used != i) return bad();
  } catch (...) {
    return bad();
  }
  std::string unit = text.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
  double scale = 1;
  static const std::pair<const char*, double> kUnits[] = {{"", 1},
                                                          {"B", 1},
                                                          {"KB", 1e3},
                                                          {"MB", 1e6},
                                                          {"GB", 1e9},
                                                          {"TB", 1e12},
                                                          {"KiB", 1024.0},
                                                          {"MiB", 1048576.0},
                                                          {"GiB", 1073741824.0},
                                                          {"TiB", 1099511627776.0}};
  bool known = false;
  for (const auto& [name, s] : kUnits) {
    if (unit == name) {
      scale = s;
      known = true;
    }
  }
  if (!known) return bad();
  const double bytes = value * scale;
  if (!std::isfinite(bytes) || bytes < 0 || bytes > 9.2e18) return bad();
  return static_cast<int64_t>(std::llround(bytes));
}

}  // namespace riskkv
