#include "storage/catalog/merge.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "base/splitmix64.h"

namespace spikeguard::storage {
namespace {

// max() in which NaN wins; the first NaN seen keeps its bits.
double MaxNanWins(double current, double incoming) {
  if (std::isnan(current)) return current;
  if (std::isnan(incoming)) return incoming;
  return std::max(current, incoming);
}

// Counts summed over ranks (tokens, non-finite values): each rank's is
// validated non-negative, and the sum stops at INT64_MAX rather than wrap
// (two ranks at INT64_MAX made a negative count, and a real non-finite value
// beside one of them vanished).
int64_t CountAdd(int64_t a, int64_t b) {
  a = std::max<int64_t>(a, 0);
  b = std::max<int64_t>(b, 0);
  return a > std::numeric_limits<int64_t>::max() - b ? std::numeric_limits<int64_t>::max() : a + b;
}

// Running mean over n values so far. (mean*n + x)/(n+1) rather than
// mean + (x-mean)/(n+1): the latter turns Inf + Inf into NaN.
double MeanAdd(double mean, uint32_t n, double x) {
  if (n == 0) return x;
  return (mean * n + x) / (n + 1);
}

// Does `value` (from `rank`) beat the current extreme? NaN is the most
// extreme value; ties go to the lowest rank so arrival order does not matter.
bool Beats(double value, uint32_t rank, const v1::RankExtreme& current) {
  const bool value_nan = std::isnan(value);
  const bool current_nan = std::isnan(current.value());
  if (value_nan != current_nan) return value_nan;
  if (value_nan || value == current.value()) return rank < current.rank();
  return value > current.value();
}

void MergeExtreme(v1::RankExtreme* extreme, bool first, uint32_t rank, double value) {
  if (first || Beats(value, rank, *extreme)) {
    extreme->set_rank(rank);
    extreme->set_value(value);
  }
}

void MergeLayer(v1::LayerStats* into, const v1::LayerStats& from) {
  into->set_max_attn_logit(MaxNanWins(into->max_attn_logit(), from.max_attn_logit()));
  into->set_grad_norm(MaxNanWins(into->grad_norm(), from.grad_norm()));
  into->set_update_ratio(MaxNanWins(into->update_ratio(), from.update_ratio()));
  into->set_act_rms(MaxNanWins(into->act_rms(), from.act_rms()));
  into->set_param_norm(MaxNanWins(into->param_norm(), from.param_norm()));
}

void MergeLayers(v1::StepRecord* record, const v1::StepReport& report) {
  if (report.layers().empty()) return;
  auto* layers = record->mutable_layers();
  absl::flat_hash_map<uint32_t, int> index;
  index.reserve(layers->size() + report.layers_size());
  for (int i = 0; i < layers->size(); ++i) index.emplace(layers->Get(i).layer(), i);
  bool appended = false;
  for (const v1::LayerStats& in : report.layers()) {
    auto [it, inserted] = index.emplace(in.layer(), layers->size());
    if (inserted) {
      *layers->Add() = in;
      appended = true;
    } else {
      MergeLayer(layers->Mutable(it->second), in);
    }
  }
  if (appended) {
    std::sort(layers->begin(), layers->end(),
              [](const v1::LayerStats& a, const v1::LayerStats& b) { return a.layer() < b.layer(); });
  }
}

void MergeDomains(v1::StepRecord* record, const v1::StepReport& report) {
  auto* domains = record->mutable_domain_losses();
  bool appended = false;
  for (const v1::DomainLoss& in : report.domain_losses()) {
    v1::DomainLoss* found = nullptr;
    for (v1::DomainLoss& d : *domains) {
      if (d.domain() == in.domain()) {
        found = &d;
        break;
      }
    }
    if (found == nullptr) {
      *domains->Add() = in;
      appended = true;
      continue;
    }
    const int64_t total = CountAdd(found->tokens(), in.tokens());
    // Weighed in doubles: a saturated total is no weight.
    const double weight = static_cast<double>(found->tokens()) + static_cast<double>(in.tokens());
    if (total > 0) {
      found->set_loss((found->loss() * static_cast<double>(found->tokens()) +
                       in.loss() * static_cast<double>(in.tokens())) /
                      weight);
    } else if (std::isnan(in.loss())) {
      // No tokens to weigh by: keep the first value, but never hide a NaN.
      found->set_loss(in.loss());
    }
    found->set_tokens(total);
  }
  if (appended) {
    std::sort(domains->begin(), domains->end(),
              [](const v1::DomainLoss& a, const v1::DomainLoss& b) { return a.domain() < b.domain(); });
  }
}

void MergeDocuments(v1::StepRecord* record, const v1::StepReport& report) {
  if (report.documents().empty()) return;
  auto* docs = record->mutable_documents();
  for (const v1::ReportedDocument& d : report.documents()) *docs->Add() = d;
  // A document in two samples is listed once per sample.
  auto key = [](const v1::ReportedDocument& d) {
    return std::make_tuple(d.domain(), d.id(), d.has_sample() ? d.sample() : -1);
  };
  std::sort(docs->begin(), docs->end(),
            [&](const v1::ReportedDocument& a, const v1::ReportedDocument& b) { return key(a) < key(b); });
  auto end = std::unique(docs->begin(), docs->end(),
                         [&](const v1::ReportedDocument& a, const v1::ReportedDocument& b) {
                           return key(a) == key(b);
                         });
  docs->DeleteSubrange(static_cast<int>(end - docs->begin()),
                       static_cast<int>(docs->end() - end));
}

bool IsNonFinite(const v1::StepReport& report) {
  return report.nonfinite_count() > 0 || !std::isfinite(report.loss()) ||
         !std::isfinite(report.grad_norm());
}

}  // namespace

uint64_t LossHashContribution(uint32_t rank, uint64_t loss_hash) {
  return SplitMix64Hash(loss_hash ^ rank);
}

void MergeReport(v1::StepRecord* record, uint32_t rank, const v1::StepReport& report) {
  const uint32_t n = record->ranks_reported();
  const bool first = n == 0;
  if (first) {
    record->set_step(report.step());
    record->set_data_position(report.data_position());
    record->set_lr(report.lr());
    record->set_loss_scale(report.loss_scale());
    record->set_grad_norm(report.grad_norm());
    record->set_step_time_s(report.step_time_s());
    record->set_lse_max(report.lse_max());
    record->set_unix_ms(report.unix_ms());
  } else {
    record->set_grad_norm(MaxNanWins(record->grad_norm(), report.grad_norm()));
    record->set_step_time_s(MaxNanWins(record->step_time_s(), report.step_time_s()));
    record->set_lse_max(MaxNanWins(record->lse_max(), report.lse_max()));
    record->set_unix_ms(std::max(record->unix_ms(), report.unix_ms()));
  }
  record->set_loss(MeanAdd(record->loss(), n, report.loss()));
  record->set_lse_mean(MeanAdd(record->lse_mean(), n, report.lse_mean()));
  record->set_tokens(CountAdd(record->tokens(), report.tokens()));
  record->set_nonfinite_count(CountAdd(record->nonfinite_count(), report.nonfinite_count()));
  record->set_clipped(record->clipped() || report.clipped());
  // Unsigned addition wraps: the sum is mod 2^64 by definition.
  record->set_loss_hash(record->loss_hash() + LossHashContribution(rank, report.loss_hash()));

  MergeLayers(record, report);
  MergeDomains(record, report);
  MergeDocuments(record, report);
  MergeExtreme(record->mutable_max_loss(), first, rank, report.loss());
  MergeExtreme(record->mutable_slowest_step(), first, rank, report.step_time_s());
  if (IsNonFinite(report) &&
      (!record->has_first_nonfinite_rank() || rank < record->first_nonfinite_rank())) {
    record->set_first_nonfinite_rank(rank);
  }
  record->set_ranks_reported(n + 1);
}

}  // namespace spikeguard::storage
