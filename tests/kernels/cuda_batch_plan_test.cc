// The GPU engine's micro-batch plan for a batched forward pass (kernels/cuda/batch_plan.h): every
// token of every item once and in order, each item cut exactly where it is cut alone (so its
// attention calls are the ones it makes alone), micro-batches within bounds and holding a
// session at most once, and the logit rows each item asked for going where they belong. Runs
// without a GPU.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "kernels/cuda/batch_plan.h"

namespace riskkv {
namespace {

using cuda::MicroBatchPlan;
using cuda::PlanItem;
using cuda::PlanMicroBatches;
using cuda::PlanPiece;

std::vector<MicroBatchPlan> Plan(const std::vector<PlanItem>& items, int64_t max_rows) {
  return PlanMicroBatches(items.data(), static_cast<int>(items.size()), max_rows);
}

// (start, count) of an item's pieces in the order they run.
using Cuts = std::vector<std::pair<int64_t, int64_t>>;

// Checks every property the engine relies on and returns each item's cuts.
std::vector<Cuts> CheckPlan(const std::vector<PlanItem>& items, int64_t max_rows) {
  const std::vector<MicroBatchPlan> plan = Plan(items, max_rows);
  std::vector<Cuts> cuts(items.size());
  std::vector<std::vector<int>> logit_hits(items.size());  // per item, per logits row
  for (size_t i = 0; i < items.size(); ++i) {
    const int64_t rows = items[i].all_logits ? items[i].n : 1;
    logit_hits[i].assign(items[i].logits ? rows : 0, 0);
  }
  int last_item = -1;
  for (const MicroBatchPlan& batch : plan) {
    EXPECT_FALSE(batch.pieces.empty());
    EXPECT_LE(batch.rows, max_rows);
    int64_t row = 0, logit_rows = 0;
    std::set<int> seen;
    for (const PlanPiece& p : batch.pieces) {
      EXPECT_EQ(p.row, row) << "rows consecutive from 0";
      EXPECT_TRUE(seen.insert(p.item).second) << "item " << p.item << " twice in a micro-batch";
      EXPECT_GE(p.item, last_item) << "items in order";
      last_item = p.item;
      EXPECT_GT(p.count, 0);
      Cuts& c = cuts[p.item];
      EXPECT_EQ(p.start, c.empty() ? 0 : c.back().first + c.back().second) << "tokens in order";
      c.emplace_back(p.start, p.count);
      EXPECT_GE(p.logit_rows, 0);
      EXPECT_LE(p.logit_rows, p.count);
      for (int64_t r = 0; r < p.logit_rows; ++r) {
        const int64_t dest = p.logit_dest + r;
        if (dest >= static_cast<int64_t>(logit_hits[p.item].size())) {
          ADD_FAILURE() << "item " << p.item << ": logits row " << dest << " out of range";
          continue;
        }
        ++logit_hits[p.item][dest];
        // The row's token is the one whose logits belong there.
        const int64_t token = p.start + p.count - p.logit_rows + r;
        EXPECT_EQ(token, items[p.item].all_logits ? dest : items[p.item].n - 1);
      }
      row += p.count;
      logit_rows += p.logit_rows;
    }
    EXPECT_EQ(batch.rows, row);
    EXPECT_EQ(batch.logit_rows, logit_rows);
  }
  for (size_t i = 0; i < items.size(); ++i) {
    int64_t covered = 0;
    for (const auto& [start, count] : cuts[i]) covered += count;
    EXPECT_EQ(covered, items[i].n) << "item " << i;
    for (int hits : logit_hits[i]) EXPECT_EQ(hits, 1) << "item " << i << " logits";
  }
  return cuts;
}

TEST(BatchPlan, MixedStepPacksInOrderAndCutsWhereAloneWould) {
  // A 1,500-token scoring segment, a decode, a full 1,024-token prefill chunk, three tokens.
  const std::vector<PlanItem> items = {
      {1500, true, true}, {1, false, true}, {1024, false, false}, {3, false, true}};
  const auto plan = Plan(items, 1024);
  ASSERT_EQ(plan.size(), 4u);
  using Row = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t>;
  auto rows = [](const MicroBatchPlan& b) {
    std::vector<Row> out;
    for (const PlanPiece& p : b.pieces) {
      out.emplace_back(p.item, p.start, p.count, p.row, p.logit_rows, p.logit_dest);
    }
    return out;
  };
  EXPECT_EQ(rows(plan[0]), (std::vector<Row>{{0, 0, 1024, 0, 1024, 0}}));
  EXPECT_EQ(rows(plan[1]), (std::vector<Row>{{0, 1024, 476, 0, 476, 1024}, {1, 0, 1, 476, 1, 0}}));
  EXPECT_EQ(rows(plan[2]), (std::vector<Row>{{2, 0, 1024, 0, 0, 0}}));
  EXPECT_EQ(rows(plan[3]), (std::vector<Row>{{3, 0, 3, 0, 1, 0}}));
  CheckPlan(items, 1024);
}

TEST(BatchPlan, DecodesShareOneMicroBatch) {
  const std::vector<PlanItem> items(64, PlanItem{1, false, true});
  const auto plan = Plan(items, 1024);
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].rows, 64);
  EXPECT_EQ(plan[0].logit_rows, 64);
  CheckPlan(items, 1024);
}

TEST(BatchPlan, NoLogitsNoLogitRows) {
  const std::vector<PlanItem> items = {{5, true, false}, {7, false, false}};
  for (const MicroBatchPlan& b : Plan(items, 4)) EXPECT_EQ(b.logit_rows, 0);
  CheckPlan(items, 4);
}

TEST(BatchPlan, RandomMixesKeepEveryItemsAloneCuts) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    const int64_t max_rows = std::uniform_int_distribution<int64_t>(1, 40)(rng);
    const int n_items = std::uniform_int_distribution<int>(1, 12)(rng);
    std::vector<PlanItem> items(n_items);
    for (PlanItem& it : items) {
      it.n = std::uniform_int_distribution<int64_t>(1, 3 * max_rows + 2)(rng);
      it.all_logits = rng() % 2 == 0;
      it.logits = rng() % 3 != 0;
    }
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " max_rows " << max_rows);
    const std::vector<Cuts> together = CheckPlan(items, max_rows);
    for (int i = 0; i < n_items; ++i) {
      const std::vector<Cuts> alone = CheckPlan({items[i]}, max_rows);
      EXPECT_EQ(together[i], alone[0]) << "item " << i;
    }
  }
}

}  // namespace
}  // namespace riskkv
