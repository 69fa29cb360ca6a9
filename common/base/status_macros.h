// Status propagation helpers for absl::Status / absl::StatusOr.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define RISKKV_CONCAT_INNER(a, b) a##b
#define RISKKV_CONCAT(a, b) RISKKV_CONCAT_INNER(a, b)

// Returns from the enclosing function if `expr` yields a non-OK status.
#define RETURN_IF_ERROR(expr)                        \
  do {                                               \
    ::absl::Status riskkv_status_ = (expr);          \
    if (!riskkv_status_.ok()) return riskkv_status_; \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, MakeX());` declares x from a StatusOr or returns its error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  RISKKV_ASSIGN_OR_RETURN_IMPL(RISKKV_CONCAT(riskkv_statusor_, __LINE__), lhs, expr)
#define RISKKV_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return std::move(tmp).status();     \
  lhs = std::move(tmp).value()
