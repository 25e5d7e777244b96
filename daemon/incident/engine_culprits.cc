// After a clean skip: which batches of the window (bisect) and which of their
// documents (document bisect) trigger the spike, and the DATA verdict that
// names them.
#include <algorithm>
#include <limits>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "daemon/incident/engine_internal.h"
#include "daemon/incident/fix_ladder.h"
#include "daemon/incident/plan_proto.h"

namespace spikeguard::incident {

namespace v1 = spikeguard::v1;

std::vector<int64_t> IncidentEngine::State::WindowPositions(const IncidentCase& s) {
  std::vector<int64_t> out;
  for (const auto& [b, e] : s.holes) {
    for (int64_t x = b; x < e; ++x) out.push_back(x);
  }
  return out;
}

bool IncidentEngine::State::InHoles(const IncidentCase& s, int64_t position) {
  for (const auto& [b, e] : s.holes) {
    if (position >= b && position < e) return true;
  }
  return false;
}

absl::StatusOr<std::vector<v1::DocumentRef>> IncidentEngine::State::DocumentsAt(
    const IncidentCase& s, const std::vector<int64_t>& positions) {
  std::vector<v1::DocumentRef> out;
  std::set<std::tuple<std::string, int64_t, int64_t>> seen;
  for (int64_t x : positions) {
    const int64_t step = StepOfPosition(s.chosen->plan(), x);
    if (step < 0) continue;
    SG_ASSIGN_OR_RETURN(std::vector<v1::DocumentRef> docs,
                        view->Documents(s.run(), s.opened.generation(), step, step));
    for (const auto& d : docs) {
      if (seen.insert({d.domain(), d.document_id(), d.data_position()}).second) {
        out.push_back(d);
      }
    }
  }
  return out;
}

absl::Status IncidentEngine::State::BisectStep(IncidentCase& s) {
  const v1::Policy& pol = s.policy;
  const std::vector<int64_t> window = WindowPositions(s);
  Bisection b = NextBisect(window, s.chosen->onset_position(), s.bisect_tests);
  if (b.need) {
    // One probe stays for the fix.
    if (s.probes + 2 <= pol.budget().max_probes() &&
        s.reexecuted < pol.budget().max_reexecuted_steps()) {
      std::vector<int64_t> skipped;
      for (int64_t x : window) {
        if (std::find(b.need->begin(), b.need->end(), x) == b.need->end()) skipped.push_back(x);
      }
      SG_ASSIGN_OR_RETURN(const v1::DataPlan plan,
                          PlanWithHoles(s.chosen->plan(), PositionRuns(skipped)));
      int64_t first = std::numeric_limits<int64_t>::max(), last = -1;
      for (int64_t x : *b.need) {
        const int64_t step = StepOfPosition(plan, x);
        if (step < 0) continue;
        first = std::min(first, step);
        last = std::max(last, step);
      }
      if (last < 0) first = last = s.onset();
      const v1::ProbePolicy& probe = pol.probe();
      const int64_t horizon = last + probe.skip_before() + probe.replay_steps_past_onset();
      std::vector<std::string> parts;
      for (const auto& [lo, hi] : PositionRuns(*b.need)) {
        parts.push_back(hi == lo + 1 ? absl::StrCat(lo) : absl::StrCat(lo, "–", hi - 1));
      }
      const CheckpointInfo start = DataProbeStart(s, window.front());
      return RequestRewind(s, ProbeKind::kBisect, start, plan, horizon, std::nullopt,
                           std::max(first, start.step), 0, 0, 0,
                           absl::StrCat("feed only position(s) ", absl::StrJoin(parts, ","),
                                        " of the window"),
                           *b.need, PositionRuns(skipped));
    }
    b.partial = true;
    b.need.reset();
  }
  if (!b.partial && !b.none_reproduced && !b.culprits.empty()) {
    if (pol.probe().bisect_documents()) return SampleBisectStep(s, b);
    SG_RETURN_IF_ERROR(EmitNote(s, "document bisect is off (probe.bisect_documents: false): "
                                   "every document of the culprit batch(es) is named"));
  } else if (b.partial && pol.probe().bisect_documents()) {
    SG_RETURN_IF_ERROR(EmitNote(s, "no document bisect: the probe budget ran out before bisect "
                                   "named a culprit batch"));
  }
  return CulpritsFound(s, b);
}

// Group testing over the documents of each culprit batch (NextBisect over
// them: the whole batch fed alone spiked). A probe feeds the batch alone, as
// the bisect probe that named it, with only the samples made entirely of the
// documents under test: the others are masked out. A set of documents
// without a sample of its own feeds nothing and counts as clean without a
// probe (it clears nobody).
absl::Status IncidentEngine::State::SampleBisectStep(IncidentCase& s, const Bisection& b) {
  const v1::Policy& pol = s.policy;
  const std::vector<int64_t> window = WindowPositions(s);
  std::map<int64_t, std::vector<v1::DocumentRef>> refined;
  std::vector<lg::SampleCulprit> results;
  // Why a culprit batch's documents could not be named exactly: said in the
  // incident, never left silent.
  std::vector<std::string> why_not;
  for (int64_t p : b.culprits) {
    SG_ASSIGN_OR_RETURN(std::vector<SampleContent> rows,
                        view->Samples(s.run(), s.opened.generation(), p));
    // The batch's documents in the order their samples come.
    std::vector<v1::DocumentRef> docs;
    std::map<std::pair<std::string, int64_t>, int64_t> index;
    std::vector<std::vector<int64_t>> row_docs(rows.size());
    for (size_t j = 0; j < rows.size(); ++j) {
      for (const auto& d : rows[j].documents) {
        auto [it, added] = index.emplace(std::make_pair(d.domain(), d.document_id()),
                                         static_cast<int64_t>(docs.size()));
        if (added) docs.push_back(d);
        row_docs[j].push_back(it->second);
      }
    }
    if (rows.empty()) {
      why_not.push_back(absl::StrCat(
          "batch ", p, ": no per-sample document map (no corpus manifest, and the trainer "
          "reported no documents per sample), so its documents cannot be bisected"));
      continue;
    }
    if (docs.size() < 2) continue;  // one document: named exactly already
    if (rows.size() < 2) {
      why_not.push_back(absl::StrCat("batch ", p, ": one sample holds all its ", docs.size(),
                                     " documents, so they cannot be fed apart"));
      continue;
    }
    auto kept_rows = [&](const std::vector<int64_t>& kept_docs) {
      std::vector<int64_t> out;
      for (size_t j = 0; j < rows.size(); ++j) {
        bool all = true;
        for (int64_t d : row_docs[j]) {
          all = all && std::find(kept_docs.begin(), kept_docs.end(), d) != kept_docs.end();
        }
        if (all) out.push_back(static_cast<int64_t>(j));
      }
      return out;
    };
    std::vector<int64_t> all(docs.size());
    for (size_t k = 0; k < docs.size(); ++k) all[k] = static_cast<int64_t>(k);
    const auto& probed = s.sample_tests[p];
    std::vector<std::pair<std::vector<int64_t>, bool>> tests = probed;
    Bisection r = NextBisect(all, -1, tests);
    while (r.need && kept_rows(*r.need).empty()) {
      tests.emplace_back(*r.need, false);  // feeds nothing: clean, no probe
      r = NextBisect(all, -1, tests);
    }
    bool partial = false;
    // The probes group testing needs for one culprit document among D:
    // ceil(log2 D) + 1 (the policy's cap is raised to that, so a large batch
    // is not cut short by a cap sized for a small one).
    int64_t planned = 1;
    while ((int64_t{1} << (planned - 1)) < static_cast<int64_t>(docs.size())) ++planned;
    const int64_t allowance = std::max<int64_t>(pol.probe().max_document_probes(), planned);
    if (r.need) {
      const bool probes_left = s.probes + 2 <= pol.budget().max_probes();
      const bool steps_left = s.reexecuted < pol.budget().max_reexecuted_steps();
      const bool doc_probes_left = static_cast<int64_t>(probed.size()) < allowance;
      if (probes_left && steps_left && doc_probes_left) {
        const std::vector<int64_t> keep = kept_rows(*r.need);
        std::vector<int64_t> skipped;
        for (int64_t x : window) {
          if (x != p) skipped.push_back(x);
        }
        SG_ASSIGN_OR_RETURN(v1::DataPlan plan,
                            PlanWithHoles(s.chosen->plan(), PositionRuns(skipped)));
        v1::SampleMask* mask = plan.add_masks();
        mask->set_position(p);
        for (size_t j = 0; j < rows.size(); ++j) {
          if (std::find(keep.begin(), keep.end(), static_cast<int64_t>(j)) == keep.end()) {
            mask->add_slots(static_cast<int32_t>(j));
          }
        }
        int64_t step = StepOfPosition(plan, p);
        if (step < 0) step = s.onset();
        const v1::ProbePolicy& probe = pol.probe();
        const int64_t horizon = step + probe.skip_before() + probe.replay_steps_past_onset();
        std::vector<std::string> names;
        for (int64_t k : *r.need) {
          names.push_back(absl::StrCat(docs[k].domain(), ":", docs[k].document_id()));
        }
        const CheckpointInfo start = DataProbeStart(s, window.front());
        return RequestRewind(
            s, ProbeKind::kSampleBisect, start, plan, horizon, std::nullopt,
            std::max(step, start.step), 0, 0, 0,
            absl::StrCat("feed batch ", p, " alone with only the sample(s) ",
                         absl::StrJoin(keep, ","), " of document(s) ", absl::StrJoin(names, " ")),
            {p}, PositionRuns(skipped), p, *r.need);
      }
      partial = true;
      why_not.push_back(absl::StrCat(
          "batch ", p, ": the document probes stopped before its documents were told apart (",
          !probes_left  ? absl::StrCat("budget.max_probes ", pol.budget().max_probes(), " spent")
          : !steps_left ? absl::StrCat("budget.max_reexecuted_steps ",
                                       pol.budget().max_reexecuted_steps(), " spent")
                        : absl::StrCat(allowance, " document probes run for its ", docs.size(),
                                       " documents"),
          "); the documents not cleared stay named"));
    }
    std::set<int64_t> named;
    if (r.none_reproduced) {
      named.insert(all.begin(), all.end());
    } else {
      named.insert(r.culprits.begin(), r.culprits.end());
      named.insert(r.group.begin(), r.group.end());
      if (partial) {
        // Every document a clean probe did not feed stays a culprit.
        std::set<int64_t> cleared;
        for (const auto& [set, spiked] : probed) {
          if (!spiked) cleared.insert(set.begin(), set.end());
        }
        for (int64_t k : all) {
          if (!cleared.count(k)) named.insert(k);
        }
      }
    }
    std::vector<v1::DocumentRef>& out = refined[p];
    lg::SampleCulprit sc;
    sc.set_position(p);
    std::set<int64_t> named_rows;
    for (int64_t k : named) {
      v1::DocumentRef d = docs[k];
      d.set_data_position(p);
      d.set_step(StepOfPosition(s.chosen->plan(), p));
      out.push_back(d);
    }
    for (size_t j = 0; j < rows.size(); ++j) {
      for (int64_t k : row_docs[j]) {
        if (named.count(k)) named_rows.insert(static_cast<int64_t>(j));
      }
    }
    for (int64_t j : named_rows) sc.add_slots(j);
    sc.set_batch_samples(static_cast<int32_t>(rows.size()));
    sc.set_partial(partial);
    sc.set_none_reproduced(r.none_reproduced);
    sc.set_documents(static_cast<int32_t>(docs.size()));
    sc.set_named_documents(static_cast<int32_t>(named.size()));
    results.push_back(sc);
  }
  if (!why_not.empty()) {
    SG_RETURN_IF_ERROR(EmitNote(s, absl::StrCat("documents not named exactly: ",
                                                absl::StrJoin(why_not, "; "))));
  }
  return CulpritsFound(s, b, refined, results);
}

// Logs the culprits (documents, suspects, near-duplicates), then the verdict
// they support. `refined`: for batches whose samples were bisected, the
// documents named there (the rest of those batches become suspects).
absl::Status IncidentEngine::State::CulpritsFound(
    IncidentCase& s, Bisection b, const std::map<int64_t, std::vector<v1::DocumentRef>>& refined,
    const std::vector<lg::SampleCulprit>& samples, bool after_escalation) {
  const std::vector<int64_t> window = WindowPositions(s);
  std::vector<int64_t> named = b.culprits;
  named.insert(named.end(), b.group.begin(), b.group.end());
  if (b.partial) named = window;  // the untested rest stays skipped too
  std::sort(named.begin(), named.end());
  std::vector<int64_t> others;
  for (int64_t x : window) {
    if (!std::binary_search(named.begin(), named.end(), x)) others.push_back(x);
  }
  SG_ASSIGN_OR_RETURN(std::vector<v1::DocumentRef> docs, DocumentsAt(s, named));
  SG_ASSIGN_OR_RETURN(std::vector<v1::DocumentRef> suspects, DocumentsAt(s, others));
  if (!refined.empty()) {
    std::vector<v1::DocumentRef> kept;
    std::set<std::pair<std::string, int64_t>> in_refined;
    for (const auto& [p, list] : refined) {
      for (const auto& d : list) in_refined.insert({d.domain(), d.document_id()});
    }
    for (const auto& d : docs) {
      const auto r = refined.find(d.data_position());
      if (r == refined.end() || in_refined.count({d.domain(), d.document_id()})) {
        kept.push_back(d);
      } else {
        suspects.push_back(d);  // cleared by the sample bisect
      }
    }
    docs = std::move(kept);
  }
  // A document that spans a culprit batch and another is a culprit.
  std::set<std::pair<std::string, int64_t>> culprit_ids;
  for (const auto& d : docs) culprit_ids.insert({d.domain(), d.document_id()});
  lg::EventPayload p;
  lg::Culprit* c = p.mutable_culprit();
  for (int64_t x : b.culprits) {
    c->add_positions(x);
    c->add_steps(StepOfPosition(s.chosen->plan(), x));
  }
  for (int64_t x : b.partial ? named : b.group) {
    if (std::find(b.culprits.begin(), b.culprits.end(), x) == b.culprits.end()) {
      c->add_group_positions(x);
    }
  }
  c->set_none_reproduced(b.none_reproduced);
  c->set_partial(b.partial);
  for (const auto& sc : samples) *c->add_samples() = sc;
  for (const auto& d : docs) *c->add_documents() = d;
  // Each suspect once (a document spanning batches appears at each).
  std::set<std::pair<std::string, int64_t>> listed = culprit_ids;
  for (const auto& d : suspects) {
    if (listed.insert({d.domain(), d.document_id()}).second) *c->add_suspects() = d;
  }
  if (!b.none_reproduced && !docs.empty()) {
    absl::StatusOr<std::vector<v1::NearDuplicate>> similar = view->NearDuplicates(s.run(), docs);
    if (similar.ok()) {
      for (const auto& d : *similar) *c->add_near_duplicates() = d;
    } else {
      SG_LOG(WARNING) << "incident " << s.id() << ": near-duplicate search: " << similar.status();
    }
  }
  std::vector<std::string> names;
  for (const auto& d : docs) names.push_back(absl::StrCat(d.domain(), ":", d.document_id()));
  auto list = [](const std::vector<int64_t>& v) { return absl::StrJoin(v, ","); };
  std::string note;
  if (b.none_reproduced) {
    note = absl::StrCat("bisect: no part of the window [", list(window),
                        "] reproduces the spike when fed without the rest");
  } else if (b.untested) {
    note = absl::StrCat("culprits: the skipped window, data positions ", list(named),
                        " (bisect off)");
  } else {
    note = absl::StrCat(
        "bisect: ",
        b.culprits.empty() ? std::string()
                           : absl::StrCat("culprit batch(es) at data position(s) ",
                                          list(b.culprits), " spike alone"),
        !b.culprits.empty() && !b.group.empty() ? "; " : "",
        b.group.empty() ? std::string()
                        : absl::StrCat("positions ", list(b.group),
                                       " spike only together"),
        b.partial ? absl::StrCat(b.culprits.empty() ? "" : "; ",
                                 "the probe budget ran out before the rest of the window was "
                                 "tested: the window [", list(named), "] is kept whole")
                  : "",
        names.empty() ? "" : "; documents ", absl::StrJoin(names, " "),
        suspects.empty() ? "" : absl::StrCat("; ", c->suspects_size(), " suspect document(s)"));
  }
  for (const lg::SampleCulprit& sc : samples) {
    absl::StrAppend(
        &note, "; batch ", sc.position(), ": ",
        sc.none_reproduced()
            ? absl::StrCat("no document of its ", sc.documents(),
                           " reproduces the spike in its own samples: all are named")
            : absl::StrCat(sc.named_documents(), " of its ", sc.documents(),
                           " documents spike in their own samples (",
                           absl::StrJoin(sc.slots(), ","), " of ", sc.batch_samples(), ")",
                           sc.partial() ? "; the document probes ran out: the documents not "
                                          "cleared are kept"
                                        : ""));
  }
  p.set_note(note);
  p.set_detail(note);
  SG_RETURN_IF_ERROR(Emit(s, EventKind::kBisectResult, p));

  if (b.none_reproduced) {
    return EmitVerdict(
        s, v1::FRAGILITY, Confidence(s, 0.6),
        "the spike reproduces with the full data and is gone with the window skipped, but no "
        "batch of the window reproduces it when fed without the others: not a data trigger; "
        "the model state is fragile",
        FragilityRecommendationsFor(s), kFragilityFix);
  }
  // Repeated DATA incidents: the incident's own evidence decides. A culprit
  // batch that spikes alone keeps it DATA; without one, escalate.
  std::string evidence;
  if (!after_escalation) {
    SG_ASSIGN_OR_RETURN(const bool escalate, EscalationDue(s));
    if (escalate) {
      if (b.untested || b.partial || b.culprits.empty()) {
        return Escalate(s, b.untested ? "bisect is off, so no culprit batch was named"
                                      : "bisect named no single culprit batch");
      }
      SG_ASSIGN_OR_RETURN(const int near, DataIncidentsNear(s));
      evidence = absl::StrCat("; not escalated to FRAGILITY although the run has ", near + 1,
                              " DATA incidents within ", s.policy.escalation().window_steps(),
                              " steps: this one's skip was clean and its culprit batch(es) ",
                              list(b.culprits), " spike alone");
    }
  }
  const double conf = b.untested || b.partial ? 0.85 : b.culprits.empty() ? 0.7 : 0.95;
  std::vector<std::string> holes;
  for (const auto& [lo, hi] : PositionRuns(named)) {
    holes.push_back(absl::StrCat("[", lo, ", ", hi, ")"));
  }
  return EmitVerdict(
      s, v1::DATA, Confidence(s, conf),
      absl::StrCat("skipping data position(s) ", list(window),
                   " removed the spike; the data there triggers it", evidence),
      {"filter the near-duplicates of the quarantined documents from the corpus"},
      absl::StrCat("keep the hole(s) ", absl::StrJoin(holes, " "),
                   " in the data plan; quarantine ", docs.size(), " document(s)"),
      docs);
}

}  // namespace spikeguard::incident
