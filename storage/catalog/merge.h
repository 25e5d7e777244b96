// merge.h
// -----------------------------------------------------------------------------
// Merging the per-rank `StepReport`s of one step into the run-level
// `StepRecord` the catalog keeps per (run, generation, step). The record's
// size depends on the number of layers, not on the world size, which is what
// keeps catalog growth at a few KB per step for any number of ranks.
//
//   v1::StepRecord record;            // empty: no rank has reported yet
//   record.set_generation(gen);
//   for (const auto& [rank, report] : reports_of_step) {
//     MergeReport(&record, rank, report);
//   }
//
// Rules (order of arrival does not matter except where noted):
//   ranks_reported    +1 per merged report
//   loss, lse_mean    mean over the merged reports; NaN and Inf propagate
//   grad_norm, step_time_s, lse_max
//                     max; a NaN wins (a NaN must never vanish in a max)
//   tokens, nonfinite_count
//                     sum
//   clipped           OR
//   step, data_position, lr, loss_scale
//                     from the first merged report (ranks agree on them)
//   unix_ms           max (the step is done when the last rank is)
//   loss_hash         sum mod 2^64 of LossHashContribution(rank, hash)
//   layers            by global layer index, sorted; where ranks overlap each
//                     field keeps the larger value (NaN wins)
//   domain_losses     per domain (sorted by name), loss is the token-weighted
//                     mean and tokens the sum
//   max_loss, slowest_step
//                     the largest value with its rank (NaN wins; ties go to
//                     the lowest rank)
//   first_nonfinite_rank
//                     lowest rank whose nonfinite_count > 0 or whose loss or
//                     grad_norm is not finite
//
// The caller sets `generation` and merges only reports of the record's step.
// A report is merged at most once per rank: deduplication is the catalog's
// job (the ingest stage's GroupCommitter, or Catalog::IngestReports).
#pragma once

#include <cstdint>

#include "spikeguard/v1/telemetry.pb.h"

namespace spikeguard::storage {

void MergeReport(v1::StepRecord* record, uint32_t rank, const v1::StepReport& report);

// splitmix64(hash ^ rank): a rank's share of the step's combined loss hash.
// Mixing in the rank keeps two ranks with equal losses from cancelling.
uint64_t LossHashContribution(uint32_t rank, uint64_t loss_hash);

}  // namespace spikeguard::storage
