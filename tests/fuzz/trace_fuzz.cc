// Fuzz target: the trace reader (daemon/detect/eval/trace_io.h), i.e. JSONL
// telemetry files (`spikeguard-detect`, `--telemetry-out`) and their labels
// sidecar. The input is read as both. Whatever parses must be usable: the
// steps come out strictly increasing and convert back to reports.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#define SPIKEGUARD_FUZZ_PROTOBUF
#include "tests/fuzz/fuzz_common.h"
#include "daemon/detect/eval/trace_io.h"

namespace {

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace detect = spikeguard::detect;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto steps = detect::ParseTraceJsonl(text);
  if (steps.ok()) {
    for (size_t i = 0; i < steps->size(); ++i) {
      if (i > 0) FUZZ_CHECK((*steps)[i].step > (*steps)[i - 1].step);
      FUZZ_CHECK((*steps)[i].layers.size() <= (1u << 16));
      (void)detect::ToStepReport((*steps)[i]);
    }
  } else {
    FUZZ_CHECK(steps.status().code() == absl::StatusCode::kInvalidArgument);
  }
  // The same bytes as a CSV export (W&B / TensorBoard).
  auto csv = detect::ParseTraceCsv(text);
  if (csv.ok()) {
    for (size_t i = 0; i < csv->size(); ++i) {
      if (i > 0) FUZZ_CHECK((*csv)[i].step > (*csv)[i - 1].step);
      FUZZ_CHECK((*csv)[i].layers.size() <= 100000);
      (void)detect::ToStepReport((*csv)[i]);
    }
  } else {
    FUZZ_CHECK(csv.status().code() == absl::StatusCode::kInvalidArgument);
  }
  auto labels = detect::LabelsFromJson(text);
  if (labels.ok()) {
    const std::string json = detect::LabelsToJson("fuzz", 0, *labels);
    auto back = detect::LabelsFromJson(json);
    FUZZ_CHECK(back.ok() && back->size() == labels->size());
  } else {
    FUZZ_CHECK(labels.status().code() == absl::StatusCode::kInvalidArgument);
  }
  return 0;
}
