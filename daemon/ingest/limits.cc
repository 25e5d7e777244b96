#include "daemon/ingest/limits.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/str_format.h"

namespace spikeguard::daemon {
namespace {

bool IsValidUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int extra = 0;
    if (c < 0x80) extra = 0;
    else if ((c >> 5) == 0x6) extra = 1;
    else if ((c >> 4) == 0xe) extra = 2;
    else if ((c >> 3) == 0x1e) extra = 3;
    else return false;
    for (int k = 1; k <= extra; ++k) {
      if (i + k >= s.size()) return false;
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return false;
    }
    i += extra + 1;
  }
  return true;
}

}  // namespace

absl::Status ValidateRunName(absl::string_view name, const Limits& limits) {
  if (name.empty()) return absl::InvalidArgumentError("run: name is empty");
  if (name.size() > static_cast<size_t>(limits.max_name_length)) {
    return absl::InvalidArgumentError(absl::StrFormat("run: name is %d bytes, longer than %d",
                                                      name.size(), limits.max_name_length));
  }
  if (name[0] == '.') return absl::InvalidArgumentError("run: name must not start with '.'");
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("run: name may hold only letters, digits, '.', '_' and '-'; got a byte 0x",
                       absl::Hex(static_cast<unsigned char>(c))));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateText(absl::string_view field, absl::string_view value, size_t max_len) {
  if (value.size() > max_len) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %d bytes, longer than %d", field, value.size(), max_len));
  }
  if (!IsValidUtf8(value)) return absl::InvalidArgumentError(absl::StrCat(field, ": not valid UTF-8"));
  for (char c : value) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 && c != '\t') {
      return absl::InvalidArgumentError(absl::StrCat(field, ": contains control character 0x",
                                                     absl::Hex(u)));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateHello(const spikeguard::v1::Hello& hello, const Limits& limits) {
  if (auto s = ValidateRunName(hello.run(), limits); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("hello.", s.message()));
  }
  if (hello.world_size() == 0 || hello.world_size() > limits.max_world_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("hello.world_size: %d is out of range [1, %d]", hello.world_size(),
                        limits.max_world_size));
  }
  if (hello.rank() >= hello.world_size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "hello.rank: %d is not below world_size %d", hello.rank(), hello.world_size()));
  }
  if (hello.generation() < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("hello.generation: %d is negative", hello.generation()));
  }
  if (!hello.protocol().empty() && hello.protocol() != "spikeguard.v1") {
    return absl::InvalidArgumentError(absl::StrCat(
        "hello.protocol: '", hello.protocol().substr(0, 64), "' is not spikeguard.v1"));
  }
  if (auto s = ValidateText("hello.host", hello.host(), limits.max_name_length); !s.ok()) return s;
  if (hello.total_steps() < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("hello.total_steps: %d is negative", hello.total_steps()));
  }
  if (hello.has_data_order()) {
    const spikeguard::v1::DataOrder& d = hello.data_order();
    if (auto s = ValidateText("hello.data_order.dataset_fingerprint", d.dataset_fingerprint(),
                              limits.max_string_length);
        !s.ok()) {
      return s;
    }
    if (d.global_batch_size() < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "hello.data_order.global_batch_size: %d is negative", d.global_batch_size()));
    }
    if (d.sequence_length() < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "hello.data_order.sequence_length: %d is negative", d.sequence_length()));
    }
    if (d.blend_size() > limits.max_domains_per_report) {
      return absl::InvalidArgumentError(
          absl::StrFormat("hello.data_order.blend: %d domains, more than %d", d.blend_size(),
                          limits.max_domains_per_report));
    }
    for (const auto& [domain, weight] : d.blend()) {
      if (auto s = ValidateText("hello.data_order.blend domain", domain, limits.max_name_length);
          !s.ok()) {
        return s;
      }
      if (!std::isfinite(weight) || weight < 0) {
        return absl::InvalidArgumentError(absl::StrCat("hello.data_order.blend['", domain,
                                                       "']: weight ", weight,
                                                       " is not a finite number >= 0"));
      }
    }
  }
  return ValidateText("hello.config_fingerprint", hello.config_fingerprint(),
                      limits.max_string_length);
}

absl::Status ValidateStepReport(const spikeguard::v1::StepReport& r, absl::string_view field,
                                const Limits& limits) {
  if (r.step() < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("%s.step: %d is negative", field, r.step()));
  }
  if (r.data_position() < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s.data_position: %d is negative", field, r.data_position()));
  }
  if (r.tokens() < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("%s.tokens: %d is negative", field, r.tokens()));
  }
  if (r.nonfinite_count() < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s.nonfinite_count: %d is negative", field, r.nonfinite_count()));
  }
  if (r.layers_size() > limits.max_layers_per_report) {
    return absl::InvalidArgumentError(absl::StrFormat("%s.layers: %d layers, more than the limit %d",
                                                      field, r.layers_size(),
                                                      limits.max_layers_per_report));
  }
  for (int i = 0; i < r.layers_size(); ++i) {
    if (r.layers(i).layer() >= limits.max_layer_index) {
      return absl::InvalidArgumentError(absl::StrFormat("%s.layers[%d].layer: %d is not below %d",
                                                        field, i, r.layers(i).layer(),
                                                        limits.max_layer_index));
    }
  }
  if (r.domain_losses_size() > limits.max_domains_per_report) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s.domain_losses: %d domains, more than the limit %d", field,
                        r.domain_losses_size(), limits.max_domains_per_report));
  }
  for (int i = 0; i < r.domain_losses_size(); ++i) {
    const auto& d = r.domain_losses(i);
    if (d.domain().empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s.domain_losses[%d].domain: empty name", field, i));
    }
    if (auto s = ValidateText(absl::StrFormat("%s.domain_losses[%d].domain", field, i), d.domain(),
                              limits.max_name_length);
        !s.ok()) {
      return s;
    }
    if (d.tokens() < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s.domain_losses[%d].tokens: negative", field, i));
    }
  }
  if (r.documents_size() > limits.max_documents_per_report) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s.documents: %d documents, more than the limit %d", field,
                        r.documents_size(), limits.max_documents_per_report));
  }
  for (int i = 0; i < r.documents_size(); ++i) {
    const auto& d = r.documents(i);
    if (d.domain().empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s.documents[%d].domain: empty name", field, i));
    }
    if (auto s = ValidateText(absl::StrFormat("%s.documents[%d].domain", field, i), d.domain(),
                              limits.max_name_length);
        !s.ok()) {
      return s;
    }
    if (d.id() < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s.documents[%d].id: %d is negative", field, i, d.id()));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateBatch(const spikeguard::v1::StepReportBatch& batch, const Limits& limits) {
  if (batch.reports_size() > limits.max_reports_per_batch) {
    return absl::InvalidArgumentError(
        absl::StrFormat("reports: %d reports in one batch, more than the limit %d",
                        batch.reports_size(), limits.max_reports_per_batch));
  }
  if (batch.has_generation() && batch.generation() < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("reports.generation: %d is negative", batch.generation()));
  }
  for (int i = 0; i < batch.reports_size(); ++i) {
    const std::string field = absl::StrFormat("reports[%d]", i);
    if (auto s = ValidateStepReport(batch.reports(i), field, limits); !s.ok()) return s;
    if (i > 0 && batch.reports(i).step() <= batch.reports(i - 1).step()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s.step: %d is out of order (after step %d in the same batch)", field,
          batch.reports(i).step(), batch.reports(i - 1).step()));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateGenerationEnded(const spikeguard::v1::GenerationEnded& e,
                                     const Limits& limits) {
  if (e.generation() < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("generation_ended.generation: %d is negative", e.generation()));
  }
  if (e.last_step() < -1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("generation_ended.last_step: %d is below -1", e.last_step()));
  }
  return ValidateText("generation_ended.reason", e.reason(), limits.max_string_length);
}

absl::Status ValidateCheckpointDeleted(const spikeguard::v1::CheckpointDeleted& d,
                                       const Limits& limits) {
  if (d.step() < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("checkpoint_deleted.step: %d is negative", d.step()));
  }
  if (d.uri().empty()) return absl::InvalidArgumentError("checkpoint_deleted.uri: empty");
  return ValidateText("checkpoint_deleted.uri", d.uri(), limits.max_string_length);
}

absl::Status ValidateCheckpointSaved(const spikeguard::v1::CheckpointSaved& c,
                                     const Limits& limits) {
  if (c.step() < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("checkpoint.step: %d is negative", c.step()));
  }
  if (c.data_position() < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("checkpoint.data_position: %d is negative", c.data_position()));
  }
  if (c.uri().empty()) return absl::InvalidArgumentError("checkpoint.uri: empty");
  if (c.bytes() < 0) return absl::InvalidArgumentError("checkpoint.bytes: negative");
  if (auto s = ValidateText("checkpoint.uri", c.uri(), limits.max_string_length); !s.ok()) return s;
  return ValidateText("checkpoint.checksum", c.checksum(), limits.max_name_length);
}

}  // namespace spikeguard::daemon
