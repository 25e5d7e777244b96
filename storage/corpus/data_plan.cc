#include "storage/corpus/data_plan.h"

#include <algorithm>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"

namespace spikeguard::storage {

DataPlan DataPlan::Default() { return DataPlan({PositionRange{0, PositionRange::kUnbounded}}); }

absl::Status DataPlan::Validate(const std::vector<PositionRange>& ranges) {
  int64_t steps = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const PositionRange& r = ranges[i];
    const std::string name =
        absl::StrCat("data plan range ", i, " [", r.begin, ", ",
                     r.unbounded() ? std::string("inf") : absl::StrCat(r.end), ")");
    if (r.begin < 0) return absl::InvalidArgumentError(absl::StrCat(name, ": negative begin"));
    if (r.end < 0 && !r.unbounded()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": negative end (use -1 only for unbounded)"));
    }
    if (!r.unbounded() && r.end <= r.begin) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": empty or reversed"));
    }
    if (r.unbounded() && i + 1 != ranges.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": only the last range may be unbounded; later ranges are unreachable"));
    }
    // Step numbers are int64: the bounded ranges together must fit, so that
    // no step arithmetic on the plan overflows.
    if (!r.unbounded()) {
      if (r.end - r.begin > std::numeric_limits<int64_t>::max() - steps) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": the plan would have more than 2^63-1 steps"));
      }
      steps += r.end - r.begin;
    }
  }
  return absl::OkStatus();
}

std::vector<PositionRange> DataPlan::Normalize(std::vector<PositionRange> ranges) {
  std::vector<PositionRange> out;
  for (const PositionRange& r : ranges) {
    if (!out.empty() && !out.back().unbounded() && out.back().end == r.begin) {
      out.back().end = r.end;
    } else {
      out.push_back(r);
    }
  }
  return out;
}

absl::StatusOr<DataPlan> DataPlan::FromRanges(std::vector<PositionRange> ranges) {
  SG_RETURN_IF_ERROR(Validate(ranges));
  return DataPlan(Normalize(std::move(ranges)));
}

absl::StatusOr<DataPlan> DataPlan::Parse(absl::string_view text) {
  std::string compact;
  for (char c : text) {
    if (!absl::ascii_isspace(static_cast<unsigned char>(c))) compact.push_back(c);
  }
  if (compact.empty()) return DataPlan({});
  std::vector<absl::string_view> sections = absl::StrSplit(compact, ';');
  const absl::string_view range_text = sections.front();
  std::vector<std::pair<int64_t, std::vector<int32_t>>> masks;
  for (size_t i = 1; i < sections.size(); ++i) {
    absl::string_view m = sections[i];
    const std::string what = absl::StrCat("data plan mask '", m, "'");
    if (!absl::ConsumePrefix(&m, "drop=")) {
      return absl::InvalidArgumentError(absl::StrCat(what, " is not drop=POSITION:SLOT.SLOT..."));
    }
    std::vector<absl::string_view> parts = absl::StrSplit(m, absl::MaxSplits(':', 1));
    int64_t position = 0;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &position) || parts[1].empty()) {
      return absl::InvalidArgumentError(absl::StrCat(what, " is not drop=POSITION:SLOT.SLOT..."));
    }
    std::vector<int32_t> slots;
    for (absl::string_view slot : absl::StrSplit(parts[1], '.')) {
      int32_t v = 0;
      if (!absl::SimpleAtoi(slot, &v)) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": slot '", slot, "' is not a number"));
      }
      slots.push_back(v);
    }
    masks.emplace_back(position, std::move(slots));
  }
  DataPlan plan({});
  if (!range_text.empty()) {
    SG_ASSIGN_OR_RETURN(plan, ParseRanges(range_text));
  }
  for (auto& [position, slots] : masks) {
    if (plan.MaskAt(position) != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("data plan masks batch ", position, " twice"));
    }
    SG_ASSIGN_OR_RETURN(plan, plan.WithMask(position, std::move(slots)));
  }
  return plan;
}

absl::StatusOr<DataPlan> DataPlan::ParseRanges(absl::string_view compact) {
  std::vector<PositionRange> ranges;
  for (absl::string_view part : absl::StrSplit(compact, ',')) {
    std::vector<absl::string_view> ends = absl::StrSplit(part, absl::MaxSplits('-', 1));
    PositionRange r;
    if (ends.size() != 2 || !absl::SimpleAtoi(ends[0], &r.begin) ||
        (!ends[1].empty() && !absl::SimpleAtoi(ends[1], &r.end))) {
      return absl::InvalidArgumentError(
          absl::StrCat("data plan range '", part, "' is not BEGIN-END or BEGIN-"));
    }
    if (ends[1].empty()) r.end = PositionRange::kUnbounded;
    ranges.push_back(r);
  }
  return FromRanges(std::move(ranges));
}

std::string DataPlan::ToString() const {
  std::string out;
  for (const PositionRange& r : ranges_) {
    if (!out.empty()) out.push_back(',');
    absl::StrAppend(&out, r.begin, "-");
    if (!r.unbounded()) absl::StrAppend(&out, r.end);
  }
  for (const SampleMask& m : masks_) {
    absl::StrAppend(&out, ";drop=", m.position, ":", absl::StrJoin(m.slots, "."));
  }
  return out;
}

const SampleMask* DataPlan::MaskAt(int64_t position) const {
  for (const SampleMask& m : masks_) {
    if (m.position == position) return &m;
  }
  return nullptr;
}

absl::StatusOr<DataPlan> DataPlan::WithMask(int64_t position, std::vector<int32_t> slots) const {
  if (position < 0) {
    return absl::InvalidArgumentError(absl::StrCat("sample mask: negative position ", position));
  }
  for (int32_t slot : slots) {
    if (slot < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("sample mask of batch ", position, ": negative slot ", slot));
    }
  }
  std::sort(slots.begin(), slots.end());
  slots.erase(std::unique(slots.begin(), slots.end()), slots.end());
  DataPlan out = *this;
  out.masks_.erase(std::remove_if(out.masks_.begin(), out.masks_.end(),
                                  [&](const SampleMask& m) { return m.position == position; }),
                   out.masks_.end());
  if (!slots.empty()) {
    out.masks_.push_back({position, std::move(slots)});
    std::sort(out.masks_.begin(), out.masks_.end(),
              [](const SampleMask& a, const SampleMask& b) { return a.position < b.position; });
  }
  return out;
}

DataPlan DataPlan::WithRangesOf(std::vector<PositionRange> ranges) const {
  DataPlan out(std::move(ranges));
  out.masks_ = masks_;
  return out;
}

int64_t DataPlan::StepCount() const {
  int64_t n = 0;
  for (const PositionRange& r : ranges_) {
    if (r.unbounded()) return -1;
    n += r.end - r.begin;
  }
  return n;
}

absl::StatusOr<int64_t> DataPlan::PositionForStep(int64_t step) const {
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("negative step ", step));
  int64_t left = step;
  for (const PositionRange& r : ranges_) {
    if (r.unbounded()) {
      if (left > std::numeric_limits<int64_t>::max() - r.begin) break;  // no int64 position
      return r.begin + left;
    }
    if (left < r.end - r.begin) return r.begin + left;
    left -= r.end - r.begin;
  }
  return absl::OutOfRangeError(absl::StrCat("step ", step, " is past the end of data plan '",
                                            ToString(), "' (", StepCount(), " steps)"));
}

absl::StatusOr<int64_t> DataPlan::FirstStepForPosition(int64_t position) const {
  int64_t step = 0;
  for (const PositionRange& r : ranges_) {
    if (position >= r.begin && (r.unbounded() || position < r.end)) {
      if (position - r.begin > std::numeric_limits<int64_t>::max() - step) break;  // no int64 step
      return step + (position - r.begin);
    }
    if (r.unbounded()) break;
    step += r.end - r.begin;
  }
  return absl::NotFoundError(
      absl::StrCat("no step of data plan '", ToString(), "' consumes position ", position));
}

absl::StatusOr<DataPlan> DataPlan::WithHole(int64_t begin, int64_t end) const {
  if (begin < 0 || end <= begin) {
    return absl::InvalidArgumentError(
        absl::StrCat("hole [", begin, ", ", end, ") must be non-empty and non-negative"));
  }
  std::vector<PositionRange> out;
  for (const PositionRange& r : ranges_) {
    const bool ends_before = !r.unbounded() && r.end <= begin;
    if (ends_before || r.begin >= end) {
      out.push_back(r);
      continue;
    }
    if (r.begin < begin) out.push_back({r.begin, begin});
    if (r.unbounded() || r.end > end) out.push_back({end, r.end});
  }
  SG_ASSIGN_OR_RETURN(DataPlan plan, FromRanges(std::move(out)));
  return WithRangesOf(plan.ranges_);
}

absl::StatusOr<DataPlan> DataPlan::WithSplice(int64_t at_step, PositionRange inserted) const {
  if (inserted.unbounded()) {
    return absl::InvalidArgumentError("a spliced range must be bounded");
  }
  SG_RETURN_IF_ERROR(Validate({inserted}));
  if (at_step < 0) return absl::InvalidArgumentError(absl::StrCat("negative step ", at_step));
  const int64_t count = StepCount();
  if (count >= 0 && at_step > count) {
    return absl::OutOfRangeError(absl::StrCat("splice step ", at_step, " is past the end of plan '",
                                              ToString(), "' (", count, " steps)"));
  }
  std::vector<PositionRange> out;
  int64_t left = at_step;
  bool placed = false;
  for (const PositionRange& r : ranges_) {
    if (placed) {
      out.push_back(r);
      continue;
    }
    const int64_t len = r.unbounded() ? INT64_MAX : r.end - r.begin;
    if (left >= len) {
      out.push_back(r);
      left -= len;
      continue;
    }
    if (r.unbounded() && left > std::numeric_limits<int64_t>::max() - r.begin) {
      // The splice point's position would not fit in an int64.
      return absl::OutOfRangeError(absl::StrCat("splice step ", at_step,
                                                " has no int64 data position in plan '",
                                                ToString(), "'"));
    }
    if (left > 0) out.push_back({r.begin, r.begin + left});
    out.push_back(inserted);
    out.push_back({r.begin + left, r.end});
    placed = true;
  }
  if (!placed) out.push_back(inserted);
  SG_ASSIGN_OR_RETURN(DataPlan plan, FromRanges(std::move(out)));
  return WithRangesOf(plan.ranges_);
}

absl::StatusOr<DataPlan> DataPlan::WithInsertBeforePosition(int64_t position,
                                                            PositionRange inserted) const {
  SG_ASSIGN_OR_RETURN(const int64_t step, FirstStepForPosition(position));
  return WithSplice(step, inserted);
}

}  // namespace spikeguard::storage
