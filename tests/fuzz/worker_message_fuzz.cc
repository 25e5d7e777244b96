// Fuzz target: what a worker sends on WorkerService.Attach.
//
// The input is one serialized spikeguard.v1.WorkerMessage, exactly the bytes a
// hostile worker controls. Each body goes through the validator the worker
// service applies (daemon/ingest/limits.h); a batch that passes is then used
// the way the daemon uses it: merged into a step record (storage/catalog
// merge) and converted to a detector sample. Validation must never crash, and
// a message it accepts must be harmless downstream (checked by ASan/UBSan and
// the invariants below).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

#define SPIKEGUARD_FUZZ_PROTOBUF
#include "tests/fuzz/fuzz_common.h"
#include "daemon/detect/eval/trace_io.h"
#include "google/protobuf/stubs/common.h"
#include "daemon/ingest/limits.h"
#include "spikeguard/v1/worker.pb.h"
#include "storage/catalog/merge.h"

namespace {

namespace v1 = spikeguard::v1;
using spikeguard::daemon::Limits;

// A rejection must say which field is wrong.
void CheckRejection(const absl::Status& s) {
  if (s.ok()) return;
  FUZZ_CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  FUZZ_CHECK(!s.message().empty());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Limits limits;
  const absl::string_view raw(reinterpret_cast<const char*>(data), size);
  // The worker service's UTF-8 walk over the raw bytes (it names the bad
  // field before protobuf's parser refuses the message), and its log escaping.
  const std::string bad_field = spikeguard::daemon::FindInvalidUtf8Field(
      v1::WorkerMessage::descriptor(), raw);
  {
    const std::string logged = spikeguard::daemon::LogText(raw, 64);
    FUZZ_CHECK(google::protobuf::internal::IsStructurallyValidUTF8(
        logged.data(), static_cast<int>(logged.size())));
    for (char c : logged) FUZZ_CHECK(static_cast<unsigned char>(c) >= 0x20 && c != 0x7f);
  }
  v1::WorkerMessage msg;
  const bool parsed = msg.ParseFromArray(data, static_cast<int>(size));
  // A message protobuf accepts has no invalid UTF-8 to name.
  FUZZ_CHECK(!parsed || bad_field.empty());
  if (!parsed) {
    // Not a message: the bytes as a string field's value. Text the daemon
    // accepts must be text protobuf accepts too, or storing it and answering
    // with it later fails (gRPC: INTERNAL with an empty message).
    const absl::string_view text(reinterpret_cast<const char*>(data), size);
    if (spikeguard::daemon::ValidateText("fuzz", text, limits.max_string_length).ok()) {
      FUZZ_CHECK(google::protobuf::internal::IsStructurallyValidUTF8(text.data(),
                                                                static_cast<int>(text.size())));
    }
    absl::Status name = spikeguard::daemon::ValidateRunName(text, limits);
    CheckRejection(name);
    return 0;
  }
  using spikeguard::daemon::ValidateBatch;
  switch (msg.body_case()) {
    case v1::WorkerMessage::kHello: {
      absl::Status s = spikeguard::daemon::ValidateHello(msg.hello(), limits);
      CheckRejection(s);
      if (s.ok()) {
        FUZZ_CHECK(msg.hello().world_size() >= 1);
        FUZZ_CHECK(msg.hello().rank() < msg.hello().world_size());
        FUZZ_CHECK(spikeguard::daemon::ValidateRunName(msg.hello().run(), limits).ok());
      }
      break;
    }
    case v1::WorkerMessage::kReports: {
      const v1::StepReportBatch& batch = msg.reports();
      absl::Status s = ValidateBatch(batch, limits);
      CheckRejection(s);
      if (!s.ok()) break;
      for (int64_t last : {int64_t{-1}, int64_t{0}, int64_t{1} << 40,
                           std::numeric_limits<int64_t>::max()}) {
        CheckRejection(spikeguard::daemon::ValidateStepsAhead(batch, last, limits));
      }
      // Accepted: every report on its own is valid too, and steps increase.
      v1::StepRecord record;
      for (int i = 0; i < batch.reports_size(); ++i) {
        const v1::StepReport& r = batch.reports(i);
        FUZZ_CHECK(spikeguard::daemon::ValidateStepReport(r, "r", limits).ok());
        FUZZ_CHECK(r.step() >= 0);
        if (i > 0) FUZZ_CHECK(r.step() > batch.reports(i - 1).step());
        // The merge the catalog does per (run, generation, step): two ranks
        // report the same step.
        record.Clear();
        record.set_step(r.step());
        spikeguard::storage::MergeReport(&record, 0, r);
        spikeguard::storage::MergeReport(&record, 1, r);
        spikeguard::detect::StepSample sample = spikeguard::detect::FromStepMessage(record);
        FUZZ_CHECK(sample.layers.size() <= limits.max_layer_index);
        (void)spikeguard::detect::FromStepReport(r);
      }
      break;
    }
    case v1::WorkerMessage::kCheckpoint:
      CheckRejection(spikeguard::daemon::ValidateCheckpointSaved(msg.checkpoint(), limits));
      break;
    case v1::WorkerMessage::kGenerationEnded:
      CheckRejection(spikeguard::daemon::ValidateGenerationEnded(msg.generation_ended(), limits));
      break;
    case v1::WorkerMessage::kCheckpointDeleted:
      CheckRejection(
          spikeguard::daemon::ValidateCheckpointDeleted(msg.checkpoint_deleted(), limits));
      break;
    default:
      break;
  }
  return 0;
}
