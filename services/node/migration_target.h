// The target role's transport: one Receive stream fed through a MigrationReceiver, with the
// watchdog that cuts off a stalled source, the session limit, and the resumed session
// registered in the session table at the commit.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>

#include "common/engine/engine.h"
#include "common/engine/scheduler.h"
#include "riskkv/v1/node.grpc.pb.h"
#include "services/node/migration_outcomes.h"
#include "services/node/mode_planner.h"
#include "services/node/node_metrics.h"
#include "services/node/receive_watchdog.h"
#include "services/node/retention.h"
#include "services/node/session_table.h"

namespace riskkv {

// A receive's watchdog bounds, for the words of a cut-off.
struct ReceiveBounds {
  double deadline_seconds = 0, handshake_seconds = 0, idle_seconds = 0;
  double min_receive_bytes_per_second = 0;
};

struct TargetSide {
  Engine* engine = nullptr;
  std::string model_fingerprint;
  std::shared_ptr<const Retention> retention;  // a snapshot for this migration (may be null)
  int64_t capacity = 0;
  int64_t max_chunk_bytes = 0;     // the largest chunk payload accepted (0: no bound)
  Scheduler* scheduler = nullptr;  // runs the engine's work (null: straight on the engine)
  SessionTable* sessions = nullptr;
  KvBudget* budget = nullptr;  // charged with the rows the stream announces or writes (may be null)
  MigrationOutcomes* outcomes = nullptr;  // records each commit by migration id (may be null)
  ModePlanner* planner = nullptr;         // hears this node's rebuild and prefill speeds
  NodeMetrics* metrics = nullptr;         // may be null
  ReceiveBounds bounds;
};

// Why the watchdog cut a receive off, in words; it is recorded under the migration's id, where
// its source asks.
std::string CutOffMessage(const ReceiveBounds& bounds, const ReceiveWatchdog::Firing& fired);

// Runs one admitted Receive call to its end; `watchdog` hears of every frame and is disarmed
// before the session is registered.
grpc::Status ReceiveMigration(
    const TargetSide& side, grpc::ServerReaderWriter<v1::ReceiveReply, v1::MigrationFrame>* stream,
    ReceiveWatchdog& watchdog);

}  // namespace riskkv
