#include "daemon/ingest/limits.h"

#include <cmath>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "google/protobuf/unknown_field_set.h"

namespace spikeguard::daemon {
namespace {

// The length (1..4) of the valid UTF-8 sequence at s[i], or 0. Valid as
// protobuf checks string fields (RFC 3629): shortest form only, no UTF-16
// surrogates, nothing above U+10FFFF. Text accepted here is stored and sent
// back, and protobuf refuses to serialize anything else.
int Utf8SequenceAt(absl::string_view s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  const int extra = (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xe ? 2 : (c >> 3) == 0x1e ? 3 : -1;
  if (extra < 0 || i + extra >= s.size()) return 0;
  for (int k = 1; k <= extra; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return 0;
  }
  const unsigned char c1 = static_cast<unsigned char>(s[i + 1]);
  if (extra == 1 && c < 0xc2) return 0;
  if (extra == 2 && ((c == 0xe0 && c1 < 0xa0) || (c == 0xed && c1 >= 0xa0))) return 0;
  if (extra == 3 && ((c == 0xf0 && c1 < 0x90) || c > 0xf4 || (c == 0xf4 && c1 >= 0x90))) return 0;
  return extra + 1;
}

bool IsValidUtf8(absl::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const int n = Utf8SequenceAt(s, i);
    if (n == 0) return false;
    i += n;
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
    if (d.has_sample() && d.sample() < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s.documents[%d].sample: %d is negative", field, i, d.sample()));
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

namespace spikeguard::daemon {

std::string LogText(absl::string_view text, size_t max_len) {
  const absl::string_view kept = text.substr(0, max_len);
  std::string out;
  out.reserve(kept.size() + 16);
  size_t i = 0;
  while (i < kept.size()) {
    const unsigned char c = static_cast<unsigned char>(kept[i]);
    if (c >= 0x80) {
      // A valid multi-byte sequence is kept as it is; stray bytes escaped.
      if (const int n = Utf8SequenceAt(kept, i); n > 0) {
        out.append(kept.data() + i, n);
        i += n;
        continue;
      }
      absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
      ++i;
      continue;
    }
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\\': out += "\\\\"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
    ++i;
  }
  if (text.size() > max_len) absl::StrAppend(&out, "...(", text.size(), " bytes)");
  return out;
}

namespace {

// Walks `bytes` as a message of type `d` without checking UTF-8 (the
// unknown-field parser keeps length-delimited fields as raw bytes).
bool FindInvalidUtf8In(const google::protobuf::Descriptor* d, absl::string_view bytes,
                       const std::string& prefix, int depth, std::string* found) {
  if (depth > 32) return false;
  google::protobuf::UnknownFieldSet fields;
  if (!fields.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return false;
  std::map<int, int> seen;  // field number -> occurrences so far
  for (int i = 0; i < fields.field_count(); ++i) {
    const google::protobuf::UnknownField& u = fields.field(i);
    const int index = seen[u.number()]++;
    if (u.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) continue;
    const google::protobuf::FieldDescriptor* f = d->FindFieldByNumber(u.number());
    if (f == nullptr) continue;
    std::string path = prefix.empty() ? f->name() : absl::StrCat(prefix, ".", f->name());
    if (f->is_repeated() && !f->is_map()) absl::StrAppend(&path, "[", index, "]");
    if (f->type() == google::protobuf::FieldDescriptor::TYPE_STRING) {
      if (!IsValidUtf8(u.length_delimited())) {
        *found = path;
        return true;
      }
    } else if (f->type() == google::protobuf::FieldDescriptor::TYPE_MESSAGE) {
      if (f->is_map()) {
        // A map entry: name the key when it is readable.
        const auto* entry = f->message_type();
        google::protobuf::UnknownFieldSet kv;
        std::string key_text;
        if (kv.ParseFromString(u.length_delimited())) {
          for (int k = 0; k < kv.field_count(); ++k) {
            if (kv.field(k).number() == 1 &&
                kv.field(k).type() == google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED &&
                IsValidUtf8(kv.field(k).length_delimited())) {
              key_text = kv.field(k).length_delimited().substr(0, 64);
            }
          }
        }
        std::string inner;
        if (FindInvalidUtf8In(entry, u.length_delimited(), "", depth + 1, &inner)) {
          *found = inner == "key" ? absl::StrCat(path, " key")
                                  : absl::StrCat(path, "['", LogText(key_text, 64), "']");
          return true;
        }
      } else if (FindInvalidUtf8In(f->message_type(), u.length_delimited(), path, depth + 1,
                                   found)) {
        return true;
      }
    }
  }
  return false;
}

absl::Status Finite(absl::string_view field, double value) {
  if (!std::isfinite(value)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", value, " is not a finite number"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string FindInvalidUtf8Field(const google::protobuf::Descriptor* descriptor,
                                 absl::string_view bytes) {
  std::string found;
  if (descriptor == nullptr) return "";
  FindInvalidUtf8In(descriptor, bytes, "", 0, &found);
  return found;
}

absl::Status ValidateDataPlan(absl::string_view field, const spikeguard::v1::DataPlan& plan,
                              const Limits& limits) {
  constexpr int kMaxRanges = 4096;
  if (plan.ranges_size() > kMaxRanges) {
    return absl::InvalidArgumentError(absl::StrFormat("%s.ranges: %d ranges, more than %d", field,
                                                      plan.ranges_size(), kMaxRanges));
  }
  for (int i = 0; i < plan.ranges_size(); ++i) {
    const auto& r = plan.ranges(i);
    if (r.begin() < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s.ranges[%d].begin: %d is negative", field, i, r.begin()));
    }
    if (r.end() == -1) {
      if (i + 1 != plan.ranges_size()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s.ranges[%d].end: -1 (unbounded) is allowed only in the last range", field, i));
      }
      continue;
    }
    if (r.end() <= r.begin()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s.ranges[%d].end: %d is not after begin %d (use -1 for unbounded)",
                          field, i, r.end(), r.begin()));
    }
  }
  if (plan.masks_size() > limits.max_reports_per_batch * 16) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s.masks: %d masks, too many", field, plan.masks_size()));
  }
  for (int i = 0; i < plan.masks_size(); ++i) {
    if (plan.masks(i).position() < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s.masks[%d].position: %d is negative", field, i, plan.masks(i).position()));
    }
    for (int k = 0; k < plan.masks(i).slots_size(); ++k) {
      if (plan.masks(i).slots(k) < 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s.masks[%d].slots[%d]: %d is negative", field, i, k, plan.masks(i).slots(k)));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateCreateRunRequest(const spikeguard::v1::CreateRunRequest& req,
                                      const Limits& limits) {
  SG_RETURN_IF_ERROR(ValidateRunName(req.name(), limits));
  if (req.world_size() == 0 || req.world_size() > limits.max_world_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "world_size: %d is out of range [1, %d]", req.world_size(), limits.max_world_size));
  }
  if (!spikeguard::v1::Mode_IsValid(req.mode())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "mode: %d is not a mode (observe=1, propose=2, auto=3)", static_cast<int>(req.mode())));
  }
  const auto& spec = req.spec();
  const size_t spec_bytes = spec.ByteSizeLong();
  if (spec_bytes > static_cast<size_t>(limits.max_spec_bytes)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "spec: %d bytes, more than the limit %d", spec_bytes, limits.max_spec_bytes));
  }
  SG_RETURN_IF_ERROR(ValidateText("spec.launcher", spec.launcher(), limits.max_name_length));
  SG_RETURN_IF_ERROR(ValidateText("spec.profile", spec.profile(), limits.max_name_length));
  for (const auto& [key, value] : spec.params()) {
    SG_RETURN_IF_ERROR(ValidateText("spec.params key", key, limits.max_name_length));
    SG_RETURN_IF_ERROR(
        ValidateText(absl::StrCat("spec.params['", key, "']"), value, limits.max_string_length));
  }
  const auto& m = spec.manifest();
  if (m.version() < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("spec.manifest.version: %d is negative", m.version()));
  }
  SG_RETURN_IF_ERROR(ValidateText("spec.manifest.dataset_fingerprint", m.dataset_fingerprint(),
                                  limits.max_string_length));
  if (m.global_batch_size() < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "spec.manifest.global_batch_size: %d is negative", m.global_batch_size()));
  }
  if (m.sequence_length() < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("spec.manifest.sequence_length: %d is negative", m.sequence_length()));
  }
  if (m.blend_size() > limits.max_domains_per_report) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "spec.manifest.blend: %d domains, more than %d", m.blend_size(),
        limits.max_domains_per_report));
  }
  for (const auto& [domain, weight] : m.blend()) {
    if (domain.empty()) return absl::InvalidArgumentError("spec.manifest.blend: empty domain name");
    SG_RETURN_IF_ERROR(ValidateText("spec.manifest.blend domain", domain, limits.max_name_length));
    const std::string field = absl::StrCat("spec.manifest.blend['", domain, "']");
    SG_RETURN_IF_ERROR(Finite(field, weight));
    if (weight < 0) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": weight ", weight, " is negative"));
    }
  }
  SG_RETURN_IF_ERROR(ValidateDataPlan("spec.manifest.data_plan", m.data_plan(), limits));
  return ValidateText("spec.manifest.corpus_dir", m.corpus_dir(), limits.max_string_length);
}

absl::Status ValidateStepWindow(absl::string_view from_field, int64_t from,
                                absl::string_view to_field, int64_t to, const Limits& limits) {
  if (from < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: %d is negative", from_field, from));
  }
  if (to < from) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %d is before %s %d", to_field, to, from_field, from));
  }
  // from >= 0 and to >= from: the difference cannot overflow.
  if (to - from >= limits.max_step_ahead) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %d is too far: the window %d..%d spans more than %d steps (limits.max_step_ahead)",
        to_field, to, from, to, limits.max_step_ahead));
  }
  return absl::OkStatus();
}

absl::Status ValidateStepsAhead(const spikeguard::v1::StepReportBatch& batch, int64_t last_step,
                                const Limits& limits) {
  const int64_t base = last_step < 0 ? 0 : last_step;
  for (int i = 0; i < batch.reports_size(); ++i) {
    const int64_t step = batch.reports(i).step();
    // step >= 0 and base >= 0: the difference cannot overflow.
    if (step > base && step - base > limits.max_step_ahead) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "reports[%d].step: %d is more than %d steps (limits.max_step_ahead) past the run's "
          "last step %d",
          i, step, limits.max_step_ahead, last_step));
    }
  }
  return absl::OkStatus();
}

}  // namespace spikeguard::daemon
