#include "daemon/detect/eval/trace_io.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace spikeguard::detect {
namespace {

namespace v1 = spikeguard::v1;
namespace pb = google::protobuf;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  out << text;
  out.flush();
  if (!out) return absl::UnavailableError(absl::StrCat("write failed: ", path));
  return absl::OkStatus();
}

}  // namespace

v1::StepReport ToStepReport(const StepSample& s) {
  v1::StepReport r;
  r.set_step(s.step);
  r.set_data_position(s.step);
  r.set_loss(s.loss);
  r.set_grad_norm(s.grad_norm);
  r.set_lse_mean(s.lse_mean);
  r.set_lse_max(s.lse_max);
  r.set_clipped(s.clipped);
  r.set_nonfinite_count(s.nonfinite);
  for (size_t i = 0; i < s.layers.size(); ++i) {
    v1::LayerStats* l = r.add_layers();
    l->set_layer(static_cast<uint32_t>(i));
    l->set_max_attn_logit(s.layers[i].max_attn_logit);
    l->set_grad_norm(s.layers[i].grad_norm);
    l->set_update_ratio(s.layers[i].update_ratio);
    l->set_act_rms(s.layers[i].act_rms);
    l->set_param_norm(s.layers[i].param_norm);
  }
  return r;
}

absl::StatusOr<std::vector<StepSample>> ParseTraceJsonl(std::string_view text) {
  std::vector<StepSample> out;
  pb::util::JsonParseOptions opts;
  opts.ignore_unknown_fields = true;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    v1::StepReport r;
    auto st = pb::util::JsonStringToMessage(pb::StringPiece(line.data(), line.size()), &r, opts);
    if (!st.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_no, ": not a StepReport: ", st.ToString()));
    }
    StepSample s = FromStepReport(r);
    // A resumed run appended to the same file: the later timeline wins.
    while (!out.empty() && out.back().step >= s.step) out.pop_back();
    out.push_back(std::move(s));
  }
  return out;
}

absl::StatusOr<std::vector<StepSample>> ReadTraceJsonl(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  auto steps = ParseTraceJsonl(*text);
  if (!steps.ok()) {
    return absl::Status(steps.status().code(), absl::StrCat(path, ": ", steps.status().message()));
  }
  return steps;
}

absl::Status WriteTraceJsonl(const std::string& path, const std::vector<StepSample>& steps) {
  // The same options as the reference worker's --telemetry-out.
  pb::util::JsonPrintOptions opts;
  opts.preserve_proto_field_names = true;
  opts.always_print_primitive_fields = true;
  std::string text;
  for (const StepSample& s : steps) {
    std::string line;
    auto st = pb::util::MessageToJsonString(ToStepReport(s), &line, opts);
    if (!st.ok()) return absl::InternalError(st.ToString());
    absl::StrAppend(&text, line, "\n");
  }
  return WriteFile(path, text);
}

std::string LabelsToJson(const std::string& trace_name, int64_t steps,
                         const std::vector<Label>& labels) {
  pb::Struct root;
  (*root.mutable_fields())["trace"].set_string_value(trace_name);
  (*root.mutable_fields())["steps"].set_number_value(static_cast<double>(steps));
  pb::ListValue* list = (*root.mutable_fields())["labels"].mutable_list_value();
  for (const Label& l : labels) {
    pb::Struct* o = list->add_values()->mutable_struct_value();
    auto& f = *o->mutable_fields();
    f["kind"].set_string_value(LabelKindName(l.kind));
    f["onset"].set_number_value(static_cast<double>(l.onset));
    f["peak"].set_number_value(static_cast<double>(l.peak));
    f["end"].set_number_value(static_cast<double>(l.end));
    if (!l.signal.empty()) f["signal"].set_string_value(l.signal);
    if (l.layer >= 0) f["layer"].set_number_value(l.layer);
  }
  std::string out;
  pb::util::JsonPrintOptions opts;
  (void)pb::util::MessageToJsonString(root, &out, opts);
  return out;
}

absl::StatusOr<std::vector<Label>> LabelsFromJson(std::string_view json) {
  pb::Struct root;
  auto st = pb::util::JsonStringToMessage(pb::StringPiece(json.data(), json.size()), &root);
  if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat("labels: ", st.ToString()));
  auto it = root.fields().find("labels");
  if (it == root.fields().end() || !it->second.has_list_value()) {
    return absl::InvalidArgumentError("labels: no \"labels\" list");
  }
  std::vector<Label> out;
  int i = 0;
  for (const pb::Value& v : it->second.list_value().values()) {
    if (!v.has_struct_value()) {
      return absl::InvalidArgumentError(absl::StrCat("labels[", i, "]: not an object"));
    }
    const auto& f = v.struct_value().fields();
    auto num = [&](const char* key, bool required, double dflt) -> absl::StatusOr<double> {
      auto k = f.find(key);
      if (k == f.end()) {
        if (required) {
          return absl::InvalidArgumentError(absl::StrCat("labels[", i, "]: missing \"", key, "\""));
        }
        return dflt;
      }
      if (k->second.kind_case() != pb::Value::kNumberValue) {
        return absl::InvalidArgumentError(absl::StrCat("labels[", i, "].", key, ": not a number"));
      }
      return k->second.number_value();
    };
    Label l;
    auto kind = f.find("kind");
    if (kind == f.end() || kind->second.kind_case() != pb::Value::kStringValue) {
      return absl::InvalidArgumentError(absl::StrCat("labels[", i, "]: missing \"kind\""));
    }
    auto k = ParseLabelKind(kind->second.string_value());
    if (!k.ok()) return absl::InvalidArgumentError(absl::StrCat("labels[", i, "]: ", k.status().message()));
    l.kind = *k;
    auto onset = num("onset", true, 0);
    if (!onset.ok()) return onset.status();
    auto peak = num("peak", false, *onset);
    if (!peak.ok()) return peak.status();
    auto end = num("end", false, *peak);
    if (!end.ok()) return end.status();
    auto layer = num("layer", false, -1);
    if (!layer.ok()) return layer.status();
    // JSON numbers are doubles: convert only what fits (a cast of NaN, an
    // infinity or 1e300 to an integer is undefined behaviour).
    for (const auto& [key, value, lo, hi] :
         {std::tuple<const char*, double, double, double>{"onset", *onset, -0x1p63, 0x1p63},
          {"peak", *peak, -0x1p63, 0x1p63},
          {"end", *end, -0x1p63, 0x1p63},
          {"layer", *layer, -0x1p31, 0x1p31}}) {
      if (!(value >= lo && value < hi)) {
        return absl::InvalidArgumentError(
            absl::StrCat("labels[", i, "].", key, ": ", value, " is out of range"));
      }
    }
    l.onset = static_cast<int64_t>(*onset);
    l.peak = static_cast<int64_t>(*peak);
    l.end = static_cast<int64_t>(*end);
    l.layer = static_cast<int>(*layer);
    if (auto s = f.find("signal"); s != f.end()) l.signal = s->second.string_value();
    out.push_back(std::move(l));
    ++i;
  }
  return out;
}

absl::StatusOr<std::vector<Label>> ReadLabels(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  auto labels = LabelsFromJson(*text);
  if (!labels.ok()) {
    return absl::Status(labels.status().code(), absl::StrCat(path, ": ", labels.status().message()));
  }
  return labels;
}

absl::Status WriteLabels(const std::string& path, const LabeledTrace& trace) {
  return WriteFile(path, LabelsToJson(trace.name, static_cast<int64_t>(trace.steps.size()),
                                      trace.labels) + "\n");
}

}  // namespace spikeguard::detect
