#include "cli/format.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/table.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "proto/state_names.h"

namespace spikeguard::cli {
namespace {

namespace v1 = ::spikeguard::v1;

// "MODE_OBSERVE" -> "observe"; the UNSPECIFIED value -> "-".
std::string EnumText(const std::string& name, absl::string_view prefix, int number) {
  if (name.empty()) return absl::StrCat(number);  // a value newer than this binary
  if (absl::EndsWith(name, "UNSPECIFIED")) return "-";
  absl::string_view text = name;
  absl::ConsumePrefix(&text, prefix);
  return absl::AsciiStrToLower(text);
}

std::string OrDash(const std::string& s) { return s.empty() ? "-" : s; }

std::string StepOrDash(int64_t step) { return step == 0 ? "-" : absl::StrCat(step); }

std::string FormatHParams(const v1::HParams& h) {
  std::vector<std::string> parts;
  if (h.has_lr_scale()) parts.push_back(absl::StrCat("lr_scale=", FormatDouble(h.lr_scale())));
  if (h.has_extra_warmup_steps()) {
    parts.push_back(absl::StrCat("extra_warmup_steps=", h.extra_warmup_steps()));
  }
  if (h.has_clip_norm()) parts.push_back(absl::StrCat("clip_norm=", FormatDouble(h.clip_norm())));
  if (h.has_beta2()) parts.push_back(absl::StrCat("beta2=", FormatDouble(h.beta2())));
  if (h.has_eps()) parts.push_back(absl::StrCat("eps=", FormatDouble(h.eps())));
  return parts.empty() ? "-" : absl::StrJoin(parts, " ");
}

std::string DocumentText(const v1::DocumentRef& d) {
  return absl::StrCat(d.domain().empty() ? "" : absl::StrCat(d.domain(), ":"), d.document_id());
}

}  // namespace

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  // Only fails on malformed Any fields, which these messages do not have.
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  return json;
}

std::string ModeName(v1::Mode mode) { return EnumText(v1::Mode_Name(mode), "MODE_", mode); }

std::string IncidentStateName(v1::IncidentState state) {
  return EnumText(v1::IncidentState_Name(state), "", state);
}

std::string VerdictName(v1::Verdict verdict) {
  return EnumText(v1::Verdict_Name(verdict), "", verdict);
}

std::string FormatDataPlan(const v1::DataPlan& plan) {
  if (plan.ranges().empty()) return "[0,inf)";
  std::vector<std::string> ranges;
  for (const v1::DataRange& r : plan.ranges()) {
    ranges.push_back(absl::StrCat("[", r.begin(), ",", r.end() < 0 ? "inf" : absl::StrCat(r.end()),
                                  ")"));
  }
  for (const v1::SampleMask& m : plan.masks()) {
    ranges.push_back(absl::StrCat("(batch ", m.position(), " without sample(s) ",
                                  absl::StrJoin(m.slots(), ","), ")"));
  }
  return absl::StrJoin(ranges, " ");
}

std::string FormatStatus(const v1::ServerStatus& s) {
  KeyValueBlock b;
  b.Add("version", OrDash(s.version()));
  b.Add("uptime", absl::StrCat(s.uptime_s(), " s"));
  b.Add("catalog", absl::StrCat(OrDash(s.catalog_path()), " (schema ", s.schema_version(), ")"));
  b.Add("runs", absl::StrCat(s.runs()));
  b.Add("connected ranks", absl::StrCat(s.connected_ranks()));
  b.Add("open incidents", absl::StrCat(s.open_incidents()));
  b.Add("reports accepted", absl::StrCat(s.reports_accepted()));
  b.Add("reports duplicate", absl::StrCat(s.reports_duplicate()));
  b.Add("reports rejected", absl::StrCat(s.reports_rejected()));
  b.Add("reports dropped", absl::StrCat(s.reports_dropped()));
  b.Add("tls", s.tls() ? "on" : "off");
  b.Add("authentication", s.authentication() ? "on" : "off");
  if (!s.principal().empty()) b.Add("principal", s.principal());
  if (!s.role().empty()) b.Add("role", s.role());
  return b.Render();
}

std::string FormatRunList(const v1::ListRunsResponse& runs) {
  if (runs.runs().empty()) return "No runs.\n";
  Table t({"NAME", "ID", "MODE", "STATE", "WORLD", "GEN", "LAST STEP", "CREATED"});
  for (size_t c : {1, 4, 5, 6}) t.AlignRight(c);
  for (const v1::Run& r : runs.runs()) {
    t.AddRow({r.name(), absl::StrCat(r.id()), ModeName(r.mode()), OrDash(std::string(RunStateName(r.state()))),
              absl::StrCat(r.world_size()), absl::StrCat(r.current_generation()),
              absl::StrCat(r.last_step()), FormatUnixMillis(r.created_unix_ms())});
  }
  return t.Render();
}

std::string FormatRun(const v1::Run& r) {
  KeyValueBlock b;
  b.Add("run", r.name());
  b.Add("id", absl::StrCat(r.id()));
  b.Add("state", OrDash(std::string(RunStateName(r.state()))));
  b.Add("mode", ModeName(r.mode()));
  b.Add("world size", absl::StrCat(r.world_size()));
  b.Add("generation", absl::StrCat(r.current_generation()));
  b.Add("last step", absl::StrCat(r.last_step()));
  b.Add("created", FormatUnixMillis(r.created_unix_ms()));
  if (r.has_spec()) {
    const v1::RunSpec& spec = r.spec();
    if (!spec.command().empty()) b.Add("command", absl::StrJoin(spec.command(), " "));
    if (!spec.launcher().empty()) b.Add("launcher", spec.launcher());
    if (!spec.workdir().empty()) b.Add("workdir", spec.workdir());
    if (spec.has_manifest()) {
      const v1::Manifest& m = spec.manifest();
      b.Add("manifest", absl::StrCat("v", m.version(), " dataset ", OrDash(m.dataset_fingerprint()),
                                     " seed ", m.seed(), " batch ", m.global_batch_size(), "x",
                                     m.sequence_length()));
    }
  }
  std::string out = b.Render();

  out += "\nRanks:\n";
  if (r.ranks().empty()) {
    out += "  (none)\n";
  } else {
    Table t({"RANK", "HOST", "CONNECTED", "GEN", "LAST STEP", "LAST SEEN"});
    for (size_t c : {0, 3, 4}) t.AlignRight(c);
    for (const v1::RankState& k : r.ranks()) {
      t.AddRow({absl::StrCat(k.rank()), OrDash(k.host()), FormatBool(k.connected()),
                absl::StrCat(k.generation()), absl::StrCat(k.last_step()),
                FormatUnixMillis(k.last_seen_unix_ms())});
    }
    out += t.Render();
  }

  out += "\nGenerations:\n";
  if (r.generations().empty()) {
    out += "  (none)\n";
  } else {
    Table t({"GEN", "PARENT", "FROM CKPT", "DATA PLAN", "HPARAMS", "CREATED", "REASON"});
    for (size_t c : {0, 1, 2}) t.AlignRight(c);
    for (const v1::Generation& g : r.generations()) {
      // The first generation has no parent (-1).
      t.AddRow({absl::StrCat(g.generation()), g.parent() < 0 ? "-" : absl::StrCat(g.parent()),
                absl::StrCat(g.from_checkpoint_step()), FormatDataPlan(g.data_plan()),
                FormatHParams(g.hparams()), FormatUnixMillis(g.created_unix_ms()),
                OrDash(g.reason())});
    }
    out += t.Render();
  }
  return out;
}

std::string FormatCheckpoints(const v1::ListCheckpointsResponse& response) {
  if (response.checkpoints().empty()) return "No checkpoints.\n";
  // REWIND TARGET: whether a rewind of the run's current generation may
  // start there; when not, why (another timeline, incomplete); "-" when the
  // daemon did not say.
  Table t({"STEP", "GEN", "DATA POS", "COMPLETE", "PINNED", "REWIND TARGET", "SIZE", "CHECKSUM",
           "CREATED", "URI"});
  for (size_t c : {0, 1, 2, 6}) t.AlignRight(c);
  for (const v1::Checkpoint& c : response.checkpoints()) {
    t.AddRow({absl::StrCat(c.step()), absl::StrCat(c.generation()), absl::StrCat(c.data_position()),
              FormatBool(c.complete()),
              c.rolling_pin() ? "yes (rolling)" : FormatBool(c.pinned()),
              c.rewind_target()         ? std::string("yes")
              : c.rewind_note().empty() ? std::string("-")
                                        : absl::StrCat("no: ", c.rewind_note()),
              FormatBytes(c.bytes()), OrDash(c.checksum().substr(0, 16)),
              FormatUnixMillis(c.created_unix_ms()), c.uri()});
  }
  return t.Render();
}

std::string FormatTelemetry(const v1::QueryTelemetryResponse& response,
                            absl::Span<const TelemetryMetric> metrics) {
  if (response.records().empty()) return "No telemetry for these steps.\n";
  std::vector<std::string> headers = {"STEP", "GEN", "RANKS"};
  for (const TelemetryMetric& m : metrics) headers.push_back(m.name());
  Table t(std::move(headers));
  for (size_t c = 0; c < 3 + metrics.size(); ++c) t.AlignRight(c);
  for (const v1::StepRecord& r : response.records()) {
    std::vector<std::string> row = {absl::StrCat(r.step()), absl::StrCat(r.generation()),
                                    absl::StrCat(r.ranks_reported())};
    for (const TelemetryMetric& m : metrics) row.push_back(m.Format(r));
    t.AddRow(std::move(row));
  }
  std::string out = t.Render();
  if (response.truncated()) {
    absl::StrAppend(&out, "(truncated after ", response.records_size(),
                    " records; narrow --from/--to or raise --limit)\n");
  }
  return out;
}

std::string FormatIncidentList(const v1::ListIncidentsResponse& response) {
  if (response.incidents().empty()) return "No incidents.\n";
  Table t({"ID", "RUN", "STATE", "VERDICT", "TRIGGER", "ONSET", "PEAK", "PROBES", "OPENED"});
  for (size_t c : {0, 5, 6, 7}) t.AlignRight(c);
  for (const v1::Incident& i : response.incidents()) {
    t.AddRow({absl::StrCat(i.id()), i.run(), IncidentStateName(i.state()), VerdictName(i.verdict()),
              OrDash(i.trigger()), absl::StrCat(i.onset_step()), absl::StrCat(i.peak_step()),
              absl::StrCat(i.probes_size()), FormatUnixMillis(i.opened_unix_ms())});
  }
  return t.Render();
}

std::string FormatIncident(const v1::Incident& i) {
  KeyValueBlock b;
  b.Add("incident", absl::StrCat(i.id()));
  b.Add("run", i.run());
  b.Add("generation", absl::StrCat(i.generation()));
  b.Add("state", IncidentStateName(i.state()));
  b.Add("verdict", absl::StrCat(VerdictName(i.verdict()), " (confidence ",
                                FormatDouble(i.confidence()), ")"));
  b.Add("trigger", OrDash(i.trigger()));
  b.Add("onset step", absl::StrCat(i.onset_step()));
  b.Add("peak", absl::StrCat("step ", i.peak_step(), " value ", FormatDouble(i.peak_value()),
                             " (baseline ", FormatDouble(i.baseline_value()), ")"));
  b.Add("precursor", i.precursor().empty()
                         ? "-"
                         : absl::StrCat(i.precursor(), " from step ", i.precursor_onset_step()));
  b.Add("opened", FormatUnixMillis(i.opened_unix_ms()));
  b.Add("closed", FormatUnixMillis(i.closed_unix_ms()));
  if (!i.note().empty()) b.Add("note", i.note());
  if (i.has_localization()) {
    const v1::Localization& l = i.localization();
    b.Add("localization", absl::StrCat(OrDash(l.signal()), " layer ", l.layer(), " from step ",
                                       l.start_step()));
    if (!l.ordered().empty()) b.Add("layer order", absl::StrJoin(l.ordered(), ", "));
  }
  std::string out = b.Render();

  out += "\nEvidence:\n";
  if (i.probes().empty()) {
    out += "  (no probes)\n";
  } else {
    Table t({"KIND", "GEN", "CKPT STEP", "DATA PLAN", "HORIZON", "OUTCOME", "STEPS", "DETAIL"});
    for (size_t c : {1, 2, 4, 6}) t.AlignRight(c);
    for (const v1::Probe& p : i.probes()) {
      t.AddRow({p.kind(), absl::StrCat(p.generation()), absl::StrCat(p.checkpoint_step()),
                FormatDataPlan(p.data_plan()), StepOrDash(p.horizon_step()), OrDash(p.outcome()),
                absl::StrCat(p.steps_executed()), OrDash(p.detail())});
    }
    out += t.Render();
  }

  if (!i.culprit_positions().empty()) {
    absl::StrAppend(&out, "\nCulprit data positions: ", absl::StrJoin(i.culprit_positions(), ", "),
                    "\n");
  }
  out += "\nDocuments:\n";
  if (i.documents().empty()) {
    out += "  (none)\n";
  } else {
    Table t({"STEP", "DATA POS", "DOMAIN", "DOCUMENT"});
    for (size_t c : {0, 1, 3}) t.AlignRight(c);
    for (const v1::DocumentRef& d : i.documents()) {
      t.AddRow({absl::StrCat(d.step()), absl::StrCat(d.data_position()), OrDash(d.domain()),
                absl::StrCat(d.document_id())});
    }
    out += t.Render();
  }

  if (!i.suspects().empty()) {
    std::vector<std::string> names;
    for (const v1::DocumentRef& d : i.suspects()) names.push_back(DocumentText(d));
    absl::StrAppend(&out, "\nSuspects (the rest of the skip window, fed without a spike): ",
                    absl::StrJoin(names, " "), "\n");
  }
  if (!i.near_duplicates().empty()) {
    out += "\nNear-duplicates elsewhere in the corpus (candidates for filtering):\n";
    Table t({"DOMAIN", "DOCUMENT", "SIMILARITY", "LIKE"});
    for (size_t c : {1, 2}) t.AlignRight(c);
    for (const v1::NearDuplicate& d : i.near_duplicates()) {
      t.AddRow({OrDash(d.domain()), absl::StrCat(d.document_id()),
                absl::StrFormat("%.2f", d.similarity()),
                absl::StrCat(d.similar_to_domain(), ":", d.similar_to_document_id())});
    }
    out += t.Render();
  }

  absl::StrAppend(&out, "\nFix: ", OrDash(i.fix()), "\n");
  out += "\nRecommendations:\n";
  if (i.recommendations().empty()) out += "  (none)\n";
  for (const std::string& r : i.recommendations()) absl::StrAppend(&out, "  - ", r, "\n");

  const v1::Cost& c = i.cost();
  absl::StrAppend(&out, "\nCost: ", c.probes(), " probes, ", c.steps_reexecuted(),
                  " steps re-executed, ", FormatDouble(c.wall_time_s()), " s wall, ",
                  FormatDouble(c.gpu_hours()), " rank-hours\n");

  if (!i.events().empty()) {
    out += "\nEvents:\n";
    Table t({"SEQ", "TIME", "KIND", "DETAIL"});
    t.AlignRight(0);
    for (const v1::IncidentEvent& e : i.events()) {
      t.AddRow({absl::StrCat(e.seq()), FormatUnixMillis(e.unix_ms()), e.kind(), e.detail()});
    }
    out += t.Render();
  }
  return out;
}

namespace {

std::string WarningStateText(const v1::PrecursorWarning& w) {
  switch (w.state()) {
    case v1::WARNING_ACTIVE:
      return "ACTIVE";
    case v1::WARNING_CLEARED:
      return "cleared";
    case v1::WARNING_PRECEDED_INCIDENT:
      return absl::StrCat("preceded incident ", w.incident_id());
    default:
      return EnumText(v1::WarningState_Name(w.state()), "WARNING_", w.state());
  }
}

std::string LayerText(int layer) { return layer >= 0 ? absl::StrCat(layer) : "-"; }

// To the last step seen, or to the incident it preceded.
std::string LeadText(const v1::PrecursorWarning& w) {
  if (w.state() == v1::WARNING_PRECEDED_INCIDENT) {
    return absl::StrCat(w.incident_lead_steps(), " (to incident)");
  }
  return absl::StrCat(w.lead_steps());
}

}  // namespace

std::string FormatWarningList(const v1::ListWarningsResponse& response) {
  if (response.warnings().empty()) return "No precursor warnings.\n";
  Table t({"ID", "RUN", "GEN", "STATE", "SIGNAL", "LAYER", "ONSET", "LAST STEP", "PEAK",
           "THRESHOLD", "LEAD STEPS"});
  for (size_t c : {0, 2, 5, 6, 7, 8, 9}) t.AlignRight(c);
  for (const v1::PrecursorWarning& w : response.warnings()) {
    t.AddRow({absl::StrCat(w.id()), w.run(), absl::StrCat(w.generation()), WarningStateText(w),
              w.signal(), LayerText(w.layer()), absl::StrCat(w.onset_step()),
              absl::StrCat(w.last_step()), FormatDouble(w.peak_value()),
              FormatDouble(w.threshold()), LeadText(w)});
  }
  return t.Render();
}

std::string FormatActiveWarnings(const v1::ListWarningsResponse& response) {
  if (response.warnings().empty()) return "";
  Table t({"RUN", "SIGNAL", "LAYER", "ONSET", "LAST STEP", "PEAK", "LEAD STEPS", "WARNING"});
  for (size_t c : {2, 3, 4, 5, 6, 7}) t.AlignRight(c);
  for (const v1::PrecursorWarning& w : response.warnings()) {
    t.AddRow({w.run(), w.signal(), LayerText(w.layer()), absl::StrCat(w.onset_step()),
              absl::StrCat(w.last_step()), FormatDouble(w.peak_value()), LeadText(w),
              absl::StrCat(w.id())});
  }
  return "\nActive precursor warnings:\n" + t.Render();
}

std::string FormatWarningSummary(const v1::ListWarningsResponse& response) {
  if (response.warnings().empty()) return "";
  int active = 0, cleared = 0, preceded = 0;
  for (const v1::PrecursorWarning& w : response.warnings()) {
    active += w.state() == v1::WARNING_ACTIVE;
    cleared += w.state() == v1::WARNING_CLEARED;
    preceded += w.state() == v1::WARNING_PRECEDED_INCIDENT;
  }
  return absl::StrCat("\nPrecursor warnings (not incidents): ", active, " active, ", cleared,
                      " cleared, ", preceded,
                      " preceded an incident; see spikectl warnings list\n");
}

std::string FormatIncidentUpdate(const v1::IncidentUpdate& u) {
  if (u.has_warning()) {
    const v1::PrecursorWarning& w = u.warning();
    std::string line = absl::StrCat(FormatUnixMillis(u.event().unix_ms()), "  warning ", w.id(),
                                    "  run ", OrDash(w.run()), "  ", WarningStateText(w), "  ",
                                    u.event().kind());
    if (!u.event().detail().empty()) absl::StrAppend(&line, ": ", u.event().detail());
    return line + "\n";
  }
  const v1::Incident& i = u.incident();
  const int64_t unix_ms = u.has_event() ? u.event().unix_ms() : 0;
  std::string line = absl::StrCat(FormatUnixMillis(unix_ms), "  incident ", i.id(), "  run ",
                                  OrDash(i.run()), "  ", IncidentStateName(i.state()));
  if (i.verdict() != v1::VERDICT_UNSPECIFIED) absl::StrAppend(&line, "  verdict ", VerdictName(i.verdict()));
  if (u.has_event()) {
    absl::StrAppend(&line, "  ", u.event().kind());
    if (!u.event().detail().empty()) absl::StrAppend(&line, ": ", u.event().detail());
  }
  return line + "\n";
}

std::string FormatAction(const v1::ActionResponse& a) {
  KeyValueBlock b;
  b.Add("accepted", FormatBool(a.accepted()));
  if (!a.message().empty()) b.Add("message", a.message());
  if (a.generation() != 0) b.Add("generation", absl::StrCat(a.generation()));
  if (!a.command_id().empty()) b.Add("command", a.command_id());
  return b.Render();
}

std::string FormatPolicy(const v1::Policy& policy) {
  std::string text;
  google::protobuf::TextFormat::PrintToString(policy, &text);
  return text;
}

std::string FormatManifest(const v1::ResolveManifestResponse& response) {
  if (response.steps().empty()) return "No steps.\n";
  Table t({"STEP", "DATA POS", "DOCUMENTS"});
  t.AlignRight(0);
  t.AlignRight(1);
  for (const v1::ResolvedStep& s : response.steps()) {
    std::vector<std::string> docs;
    for (const v1::DocumentRef& d : s.documents()) docs.push_back(DocumentText(d));
    t.AddRow({absl::StrCat(s.step()), absl::StrCat(s.data_position()),
              docs.empty() ? "-" : absl::StrJoin(docs, " ")});
  }
  return t.Render();
}

std::string FormatQuarantine(const v1::ListQuarantineResponse& response) {
  if (response.entries().empty()) return "No quarantined documents.\n";
  Table t({"DOMAIN", "DOCUMENT", "INCIDENT", "CREATED", "REASON"});
  t.AlignRight(1);
  t.AlignRight(2);
  for (const v1::QuarantineEntry& e : response.entries()) {
    t.AddRow({OrDash(e.domain()), absl::StrCat(e.document_id()),
              e.incident_id() == 0 ? "-" : absl::StrCat(e.incident_id()),
              FormatUnixMillis(e.created_unix_ms()), OrDash(e.reason())});
  }
  return t.Render();
}

std::string FormatAudit(const v1::ListAuditResponse& response) {
  if (response.entries().empty()) return "No audit entries.\n";
  Table t({"ID", "TIME", "PRINCIPAL", "ROLE", "RPC", "RUN", "OUTCOME", "PEER", "DETAIL"});
  t.AlignRight(0);
  for (const v1::AuditEntry& e : response.entries()) {
    absl::string_view rpc = e.rpc();
    absl::ConsumePrefix(&rpc, "SupervisorService/");
    t.AddRow({absl::StrCat(e.id()), FormatUnixMillis(e.unix_ms()), OrDash(e.principal()),
              OrDash(e.role()), OrDash(std::string(rpc)), OrDash(e.run()), OrDash(e.outcome()),
              OrDash(e.peer()), OrDash(e.detail())});
  }
  return t.Render();
}

}  // namespace spikeguard::cli
