// How the engine cuts a batched forward pass (Engine::ForwardMany) into micro-batches: which
// tokens of which session fill which rows, and which rows' logits go where. Plain C++ (the engine
// is built as C++17), tested on the host by tests/kernels/cuda_batch_plan_test.cc.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace riskkv::cuda {

// One session's share of a batched pass, as the planner sees it.
struct PlanItem {
  int64_t n = 0;            // tokens, >= 1
  bool all_logits = false;  // every position's logits instead of the last one's
  bool logits = false;      // logits wanted at all
};

// Tokens [start, start + count) of item `item`, in rows [row, row + count) of its micro-batch.
// The piece's last `logit_rows` rows have their logits wanted (0: none); they go to the item's
// logits from row `logit_dest` on ([n or 1, vocab] rows).
struct PlanPiece {
  int item = 0;
  int64_t start = 0, count = 0;
  int64_t row = 0;
  int64_t logit_rows = 0;
  int64_t logit_dest = 0;
};

struct MicroBatchPlan {
  std::vector<PlanPiece> pieces;  // in item order, rows consecutive from 0
  int64_t rows = 0;               // sum of the pieces' counts, <= max_rows
  int64_t logit_rows = 0;         // sum of the pieces' logit_rows
};

// Each item is cut into chunks of max_rows tokens counted from its own first token, where it
// would be cut if it ran alone, so every chunk's attention (a call per piece, whose kernel and
// GEMM shapes follow the piece's length and first position) is the call it makes alone. The
// chunks are packed in item order into micro-batches of at most max_rows rows, a new one begun
// when the next chunk does not fit; a session therefore appears at most once per micro-batch
// (only a full chunk is followed by another of its item, and it fills its micro-batch).
inline std::vector<MicroBatchPlan> PlanMicroBatches(const PlanItem* items, int n_items,
                                                    int64_t max_rows) {
  std::vector<MicroBatchPlan> plan;
  MicroBatchPlan current;
  for (int i = 0; i < n_items; ++i) {
    const PlanItem& item = items[i];
    for (int64_t start = 0; start < item.n; start += max_rows) {
      const int64_t count = std::min(max_rows, item.n - start);
      if (current.rows + count > max_rows) {
        plan.push_back(std::move(current));
        current = MicroBatchPlan{};
      }
      PlanPiece p;
      p.item = i;
      p.start = start;
      p.count = count;
      p.row = current.rows;
      if (item.logits && item.all_logits) {
        p.logit_rows = count;
        p.logit_dest = start;
      } else if (item.logits && start + count == item.n) {
        p.logit_rows = 1;
        p.logit_dest = 0;
      }
      current.pieces.push_back(p);
      current.rows += count;
      current.logit_rows += p.logit_rows;
    }
  }
  if (!current.pieces.empty()) plan.push_back(std::move(current));
  return plan;
}

}  // namespace riskkv::cuda
