#include "daemon/detect/eval/trace_io.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
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
  for (const DomainSample& d : s.domains) {
    v1::DomainLoss* dl = r.add_domain_losses();
    dl->set_domain(d.domain);
    dl->set_loss(d.loss);
    dl->set_tokens(d.tokens);
  }
  return r;
}

namespace {

// Python's json.dumps writes NaN, Infinity and -Infinity as bare tokens (not
// JSON); proto JSON spells them as the strings "NaN", "Infinity",
// "-Infinity". Quotes the bare tokens outside strings; everything else is
// copied as is.
std::string QuoteNonFiniteTokens(absl::string_view line) {
  std::string out;
  out.reserve(line.size() + 8);
  bool in_string = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (in_string) {
      out.push_back(c);
      if (c == '\\' && i + 1 < line.size()) {
        out.push_back(line[++i]);
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
      out.push_back(c);
      continue;
    }
    bool replaced = false;
    for (absl::string_view tok : {"-Infinity", "Infinity", "NaN"}) {
      if (line.substr(i, tok.size()) == tok) {
        absl::StrAppend(&out, "\"", tok, "\"");
        i += tok.size() - 1;
        replaced = true;
        break;
      }
    }
    if (!replaced) out.push_back(c);
  }
  return out;
}

// Every key of `obj` must be a field of `d` (proto or JSON name), checked
// down into the repeated messages (layers, domain_losses); a LayerStats
// without its "layer" index is refused (it would land on layer 0).
// Keys spikeguard's PyTorch trainer (worker/examples/torch_gpt, through
// spikeguard.torch.report_json) writes beside the StepReport fields of each
// line: annotations, not telemetry.
bool TrainerAnnotation(const std::string& key) {
  return key == "rank" || key == "generation" || key == "max_attn_logit_kind";
}

absl::Status CheckFields(const pb::Struct& obj, const pb::Descriptor* d, const std::string& path) {
  for (const auto& [key, value] : obj.fields()) {
    if (path.empty() && TrainerAnnotation(key)) continue;
    const pb::FieldDescriptor* f = d->FindFieldByName(key);
    for (int i = 0; f == nullptr && i < d->field_count(); ++i) {
      if (d->field(i)->json_name() == key) f = d->field(i);
    }
    if (f == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown field \"", path, key, "\" (", d->name(),
                                                     " has no such field)"));
    }
    const pb::Descriptor* sub = f->message_type();
    if (sub == nullptr) continue;
    auto check = [&](const pb::Value& v, const std::string& where) -> absl::Status {
      if (!v.has_struct_value()) return absl::OkStatus();  // the typed parse reports it
      if (sub->name() == "LayerStats" && !v.struct_value().fields().count("layer")) {
        return absl::InvalidArgumentError(absl::StrCat(
            "field \"", where, "\" has no \"layer\" index (per-layer stats need their global layer "
            "index; without it every layer would be read as layer 0)"));
      }
      return CheckFields(v.struct_value(), sub, where + ".");
    };
    if (value.has_list_value()) {
      int i = 0;
      for (const pb::Value& v : value.list_value().values()) {
        if (absl::Status st = check(v, absl::StrCat(path, key, "[", i++, "]")); !st.ok()) return st;
      }
    } else if (absl::Status st = check(value, absl::StrCat(path, key)); !st.ok()) {
      return st;
    }
  }
  return absl::OkStatus();
}

void AppendStep(std::vector<StepSample>* out, StepSample s) {
  // A resumed run appended to the same file: the later timeline wins.
  while (!out->empty() && out->back().step >= s.step) out->pop_back();
  out->push_back(std::move(s));
}

}  // namespace

absl::StatusOr<std::vector<StepSample>> ParseTraceJsonl(std::string_view text) {
  std::vector<StepSample> out;
  pb::util::JsonParseOptions opts;
  // CheckFields below refuses every unknown key but the trainer's
  // annotations, which the typed parse then skips.
  opts.ignore_unknown_fields = true;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    const std::string json = QuoteNonFiniteTokens(line);
    pb::Struct obj;
    if (auto st = pb::util::JsonStringToMessage(json, &obj); !st.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_no, ": not a JSON object: ", st.ToString()));
    }
    if (absl::Status st = CheckFields(obj, v1::StepReport::descriptor(), ""); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line_no, ": ", st.message()));
    }
    v1::StepReport r;
    if (auto st = pb::util::JsonStringToMessage(json, &r, opts); !st.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_no, ": not a StepReport: ", st.ToString()));
    }
    std::vector<bool> seen;
    for (const v1::LayerStats& l : r.layers()) {
      if (l.layer() >= (1u << 16)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "line ", line_no, ": field \"layers\": layer index ", l.layer(), " is out of range"));
      }
      if (l.layer() >= seen.size()) seen.resize(l.layer() + 1, false);
      if (seen[l.layer()]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "line ", line_no, ": field \"layers\": layer ", l.layer(), " appears twice"));
      }
      seen[l.layer()] = true;
    }
    AppendStep(&out, FromStepReport(r));
  }
  return out;
}

namespace {

// One CSV record: fields split at commas outside double quotes; "" inside
// quotes is a quote.
absl::StatusOr<std::vector<std::string>> SplitCsv(absl::string_view line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"') {
        if (i + 1 < line.size() && line[i + 1] == '"') {
          out.back().push_back('"');
          ++i;
        } else {
          quoted = false;
        }
      } else {
        out.back().push_back(c);
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      out.emplace_back();
    } else if (c != '\r') {
      out.back().push_back(c);
    }
  }
  if (quoted) return absl::InvalidArgumentError("unterminated quoted field");
  for (std::string& f : out) f = std::string(absl::StripAsciiWhitespace(f));
  return out;
}

enum class CsvField {
  kIgnore, kStep, kLoss, kGradNorm, kLseMean, kLseMax, kClipped, kNonfinite,
  kAttn, kLayerGrad, kUpdateRatio, kActRms, kParamNorm,
};

struct CsvColumn {
  CsvField field = CsvField::kIgnore;
  int layer = -1;
};

bool AllDigits(absl::string_view s) {
  if (s.empty() || s.size() > 5) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

// Maps an export's column name to a field. W&B names columns "RUN - metric"
// (plus "metric__MIN"/"__MAX" companions), TensorBoard "Step"/"Wall time";
// metrics may carry a "train/" style prefix. Per-layer stats need an index:
// "layers/3/max_attn_logit", "layer3.max_attn_logit", "max_attn_logit/3".
absl::StatusOr<CsvColumn> MapColumn(const std::string& raw) {
  std::string name = absl::AsciiStrToLower(raw);
  if (size_t dash = name.rfind(" - "); dash != std::string::npos) name = name.substr(dash + 3);
  CsvColumn c;
  if (absl::EndsWith(name, "__min") || absl::EndsWith(name, "__max") || name == "wall time" ||
      name == "wall_time" || name == "_runtime" || name == "_timestamp" || name == "timestamp" ||
      name == "relative time (process)" || name == "relative time (wall)") {
    return c;
  }
  if (name == "step" || name == "_step" || name == "global_step" ||
      absl::EndsWith(name, "/global_step") || absl::EndsWith(name, "/step")) {
    c.field = CsvField::kStep;
    return c;
  }
  std::vector<std::string> parts = absl::StrSplit(name, absl::ByAnyChar("/."), absl::SkipEmpty());
  if (parts.empty()) return absl::InvalidArgumentError("empty column name");
  static const std::pair<const char*, CsvField> kLayer[] = {
      {"max_attn_logit", CsvField::kAttn},         {"update_ratio", CsvField::kUpdateRatio},
      {"act_rms", CsvField::kActRms},              {"param_norm", CsvField::kParamNorm},
      {"grad_norm", CsvField::kLayerGrad}};
  static const std::pair<const char*, CsvField> kScalar[] = {
      {"loss", CsvField::kLoss},           {"train_loss", CsvField::kLoss},
      {"grad_norm", CsvField::kGradNorm},  {"lse_mean", CsvField::kLseMean},
      {"lse_max", CsvField::kLseMax},      {"clipped", CsvField::kClipped},
      {"nonfinite_count", CsvField::kNonfinite}, {"nonfinite", CsvField::kNonfinite},
      // StepReport fields the detectors do not read.
      {"lr", CsvField::kIgnore},           {"loss_scale", CsvField::kIgnore},
      {"tokens", CsvField::kIgnore},       {"step_time_s", CsvField::kIgnore},
      {"data_position", CsvField::kIgnore}, {"unix_ms", CsvField::kIgnore},
      {"loss_hash", CsvField::kIgnore}};
  int index = -1;
  bool layer_word = false;
  std::string stat;
  for (const std::string& p : parts) {
    if (AllDigits(p)) {
      index = std::stoi(p);
    } else if (absl::StartsWith(p, "layers") || absl::StartsWith(p, "layer")) {
      layer_word = true;
      absl::string_view rest = absl::StripPrefix(absl::StripPrefix(p, "layers"), "layer");
      rest = absl::StripPrefix(rest, "_");
      if (AllDigits(rest)) index = std::stoi(std::string(rest));
    } else {
      stat = p;
    }
  }
  const bool per_layer = layer_word || index >= 0;
  if (per_layer) {
    for (const auto& [n, f] : kLayer) {
      if (stat == n) {
        if (index < 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "per-layer metric \"", raw,
              "\" has no layer index (name it like layers/3/", n, ")"));
        }
        c.field = f;
        c.layer = index;
        return c;
      }
    }
  } else {
    for (const auto& [n, f] : kScalar) {
      if (stat == n) {
        c.field = f;
        return c;
      }
    }
    for (const auto& [n, f] : kLayer) {
      if (stat == n) {
        return absl::InvalidArgumentError(absl::StrCat(
            "per-layer metric \"", raw, "\" has no layer index (name it like layers/3/", n, ")"));
      }
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown field \"", raw,
      "\" (known: step, loss, grad_norm, lse_mean, lse_max, clipped, nonfinite_count, lr, "
      "tokens, ..., and layers/<i>/{max_attn_logit,grad_norm,update_ratio,act_rms,param_norm})"));
}

absl::StatusOr<double> CsvNumber(const std::string& cell) {
  const std::string v = absl::AsciiStrToLower(cell);
  if (v == "nan" || v == "-nan") return std::numeric_limits<double>::quiet_NaN();
  if (v == "inf" || v == "+inf" || v == "infinity" || v == "+infinity") return INFINITY;
  if (v == "-inf" || v == "-infinity") return -INFINITY;
  if (v == "true") return 1.0;
  if (v == "false") return 0.0;
  double d = 0;
  if (!absl::SimpleAtod(v, &d)) return absl::InvalidArgumentError("not a number");
  return d;
}

}  // namespace

absl::StatusOr<std::vector<StepSample>> ParseTraceCsv(std::string_view text) {
  std::vector<StepSample> out;
  std::vector<CsvColumn> columns;
  int step_col = -1, loss_col = -1;
  int max_layer = -1;
  // The last value of every column: an empty cell repeats it (a metric not
  // logged at that step), and is 0 before the first.
  std::vector<double> last;
  std::vector<bool> have;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
    ++line_no;
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    auto cells = SplitCsv(line);
    if (!cells.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line_no, ": ", cells.status().message()));
    }
    if (columns.empty()) {
      for (size_t i = 0; i < cells->size(); ++i) {
        auto c = MapColumn((*cells)[i]);
        if (!c.ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat("line ", line_no, ", column ", i + 1, ": ", c.status().message()));
        }
        if (c->field == CsvField::kStep) {
          if (step_col >= 0) {
            return absl::InvalidArgumentError(
                absl::StrCat("line ", line_no, ", column ", i + 1, ": a second step column \"",
                             (*cells)[i], "\""));
          }
          step_col = static_cast<int>(i);
        }
        if (c->field == CsvField::kLoss) {
          if (loss_col >= 0) {
            return absl::InvalidArgumentError(absl::StrCat(
                "line ", line_no, ", column ", i + 1, ": a second loss column \"", (*cells)[i], "\""));
          }
          loss_col = static_cast<int>(i);
        }
        max_layer = std::max(max_layer, c->layer);
        columns.push_back(*c);
      }
      if (step_col < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "line ", line_no, ": no step column (step, _step, Step or global_step)"));
      }
      if (loss_col < 0) {
        return absl::InvalidArgumentError(absl::StrCat("line ", line_no, ": no loss column"));
      }
      last.assign(columns.size(), 0.0);
      have.assign(columns.size(), false);
      continue;
    }
    if (cells->size() != columns.size()) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line_no, ": ", cells->size(),
                                                     " fields, the header has ", columns.size()));
    }
    bool any_metric = false;
    for (size_t i = 0; i < columns.size(); ++i) {
      if (columns[i].field == CsvField::kIgnore || (*cells)[i].empty()) continue;
      auto v = CsvNumber((*cells)[i]);
      if (!v.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("line ", line_no, ", field \"",
                                                       (i < columns.size() ? (*cells)[i] : ""),
                                                       "\" in column ", i + 1, ": not a number"));
      }
      last[i] = *v;
      have[i] = true;
      if (columns[i].field != CsvField::kStep) any_metric = true;
    }
    if ((*cells)[step_col].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line_no, ": the step is empty"));
    }
    const double step = last[step_col];
    if (!(step >= 0 && step < 0x1p62) || step != std::floor(step)) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_no, ": step ", (*cells)[step_col], " is not a step number"));
    }
    // Rows before the first loss (or with nothing but a step) carry no step.
    if (!any_metric || !have[loss_col]) continue;
    StepSample s;
    s.step = static_cast<int64_t>(step);
    if (max_layer >= 0) s.layers.resize(max_layer + 1);
    for (size_t i = 0; i < columns.size(); ++i) {
      const double v = last[i];
      const int l = columns[i].layer;
      switch (columns[i].field) {
        case CsvField::kIgnore:
        case CsvField::kStep:
          break;
        case CsvField::kLoss: s.loss = v; break;
        case CsvField::kGradNorm: s.grad_norm = v; break;
        case CsvField::kLseMean: s.lse_mean = v; break;
        case CsvField::kLseMax: s.lse_max = v; break;
        case CsvField::kClipped: s.clipped = v != 0; break;
        case CsvField::kNonfinite:
          s.nonfinite = std::isfinite(v) && v >= 0 && v < 0x1p62 ? static_cast<int64_t>(v) : 1;
          break;
        case CsvField::kAttn: s.layers[l].max_attn_logit = v; break;
        case CsvField::kLayerGrad: s.layers[l].grad_norm = v; break;
        case CsvField::kUpdateRatio: s.layers[l].update_ratio = v; break;
        case CsvField::kActRms: s.layers[l].act_rms = v; break;
        case CsvField::kParamNorm: s.layers[l].param_norm = v; break;
      }
    }
    AppendStep(&out, std::move(s));
  }
  if (columns.empty()) return absl::InvalidArgumentError("no header row");
  return out;
}

absl::StatusOr<std::vector<StepSample>> ParseTrace(std::string_view text) {
  const absl::string_view t = absl::StripLeadingAsciiWhitespace(absl::string_view(text.data(), text.size()));
  if (t.empty() || t.front() == '{') return ParseTraceJsonl(text);
  return ParseTraceCsv(text);
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

absl::StatusOr<std::vector<StepSample>> ReadTrace(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  auto steps = absl::EndsWith(path, ".csv") ? ParseTraceCsv(*text) : ParseTrace(*text);
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
