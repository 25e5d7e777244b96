// status_macros.h
// -----------------------------------------------------------------------------
// Abseil 20220623 ships no status macros; these are the project's own.
//
//   absl::Status Load() {
//     SG_RETURN_IF_ERROR(Open());
//     SG_ASSIGN_OR_RETURN(auto rows, Query());
//     ...
//   }
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SG_STATUS_CONCAT_INNER_(a, b) a##b
#define SG_STATUS_CONCAT_(a, b) SG_STATUS_CONCAT_INNER_(a, b)

#define SG_RETURN_IF_ERROR(expr)                       \
  do {                                                 \
    ::absl::Status sg_status_ = (expr);                \
    if (!sg_status_.ok()) return sg_status_;           \
  } while (0)

#define SG_ASSIGN_OR_RETURN(lhs, expr) \
  SG_ASSIGN_OR_RETURN_IMPL_(SG_STATUS_CONCAT_(sg_statusor_, __LINE__), lhs, expr)

#define SG_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()
