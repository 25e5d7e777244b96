#include "daemon/control/catalog_adapters.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "daemon/detect/nonfinite_detector.h"
#include "daemon/detect/step_message.h"
#include "daemon/incident/plan_proto.h"
#include "daemon/incident/policy.h"
#include "storage/corpus/corpus_tools.h"
#include "storage/corpus/data_plan.h"

namespace spikeguard::daemon {

namespace v1 = spikeguard::v1;

v1::Policy EffectivePolicy(storage::Catalog* catalog, const std::string& run) {
  v1::Policy policy = incident::DefaultPolicy();
  const v1::Mode built_in_mode = policy.mode();
  // The mode comes from the run's own policy, else the run (spikectl runs
  // create --mode), else the daemon-wide policy, else the built-in default.
  policy.set_mode(v1::MODE_UNSPECIFIED);
  v1::Mode daemon_mode = v1::MODE_UNSPECIFIED;
  if (auto daemon_default = catalog->GetPolicy(""); daemon_default.ok()) {
    daemon_mode = daemon_default->mode();
    v1::Policy knobs = *daemon_default;
    knobs.set_mode(v1::MODE_UNSPECIFIED);
    policy = incident::MergePolicy(policy, knobs);
  }
  v1::Mode run_mode = v1::MODE_UNSPECIFIED;
  if (!run.empty()) {
    if (auto own = catalog->GetPolicy(run); own.ok()) policy = incident::MergePolicy(policy, *own);
    if (auto r = catalog->GetRunWithoutRanks(run); r.ok()) run_mode = r->mode();
  }
  if (policy.mode() == v1::MODE_UNSPECIFIED) policy.set_mode(run_mode);
  if (policy.mode() == v1::MODE_UNSPECIFIED) policy.set_mode(daemon_mode);
  if (policy.mode() == v1::MODE_UNSPECIFIED) policy.set_mode(built_in_mode);
  return policy;
}

incident::StepObservation ToObservation(const v1::StepRecord& r) {
  incident::StepObservation o;
  o.generation = r.generation();
  o.step = r.step();
  o.data_position = r.data_position();
  o.loss = r.loss();
  o.grad_norm = r.grad_norm();
  o.nonfinite_count = r.nonfinite_count();
  o.loss_hash = r.loss_hash();
  o.step_time_s = r.step_time_s();
  o.max_loss_rank = r.max_loss().rank();
  // The layer is named by the detectors' one rule (forward values from the
  // lowest layer, then gradients from the last), so an incident's detection
  // and its verdict name the same layer. Converted only for a record that has
  // a non-finite layer value at all.
  const bool any_layer_nonfinite = std::any_of(
      r.layers().begin(), r.layers().end(), [](const v1::LayerStats& l) {
        return !std::isfinite(l.max_attn_logit()) || !std::isfinite(l.act_rms()) ||
               !std::isfinite(l.param_norm()) || !std::isfinite(l.grad_norm()) ||
               !std::isfinite(l.update_ratio());
      });
  if (any_layer_nonfinite) {
    o.first_nonfinite_layer = detect::FirstNonFiniteLayer(detect::FromStepMessage(r), nullptr);
  }
  return o;
}

absl::StatusOr<std::vector<incident::CheckpointInfo>> CatalogRunView::Checkpoints(
    const std::string& run) {
  SG_ASSIGN_OR_RETURN(std::vector<v1::Checkpoint> list, catalog_->ListCheckpoints(run));
  std::vector<incident::CheckpointInfo> out;
  for (const auto& c : list) {
    if (guard_ != nullptr && c.complete()) {
      if (auto verified = guard_->Verify(c); !verified.ok()) {
        SG_LOG(WARNING) << "run " << run << ": skipped: " << verified.status().message();
        continue;
      }
    }
    incident::CheckpointInfo info;
    info.generation = c.generation();
    info.step = c.step();
    info.uri = c.uri();
    info.checksum = c.checksum();
    info.complete = c.complete();
    out.push_back(std::move(info));
  }
  return out;
}

absl::StatusOr<std::vector<incident::StepObservation>> CatalogRunView::Steps(const std::string& run,
                                                                            int64_t generation,
                                                                            int64_t from,
                                                                            int64_t to) {
  SG_ASSIGN_OR_RETURN(std::vector<v1::StepRecord> records,
                      catalog_->QueryTelemetry(run, generation, std::max<int64_t>(0, from), to,
                                               storage::Catalog::kMaxQueryLimit));
  std::vector<incident::StepObservation> out;
  out.reserve(records.size());
  for (const auto& r : records) out.push_back(ToObservation(r));
  return out;
}

absl::StatusOr<v1::DataPlan> CatalogRunView::Plan(const std::string& run, int64_t generation) {
  SG_ASSIGN_OR_RETURN(std::vector<v1::Generation> gens, catalog_->ListGenerations(run));
  for (const auto& g : gens) {
    if (g.generation() != generation) continue;
    v1::DataPlan plan = g.data_plan();
    if (plan.ranges_size() == 0) {
      auto* r = plan.add_ranges();
      r->set_begin(0);
      r->set_end(-1);
    }
    return plan;
  }
  return absl::NotFoundError(absl::StrCat("run '", run, "' has no generation ", generation));
}

absl::StatusOr<const storage::Corpus*> CatalogRunView::CorpusFor(const std::string& run,
                                                                 storage::Manifest* manifest) {
  SG_ASSIGN_OR_RETURN(v1::Run r, catalog_->GetRun(run));
  const v1::Manifest& m = r.spec().manifest();
  if (m.corpus_dir().empty()) {
    return absl::NotFoundError(absl::StrCat("run '", run, "' has no manifest with a corpus"));
  }
  std::string dir = m.corpus_dir();
  if (profiles_ != nullptr) {
    SG_ASSIGN_OR_RETURN(dir, profiles_->CorpusDir(run, r.spec()));
  }
  absl::MutexLock lock(&mu_);
  auto it = corpora_.find(run);
  if (it == corpora_.end()) {
    SG_ASSIGN_OR_RETURN(std::unique_ptr<storage::Corpus> corpus, storage::Corpus::Open(dir));
    it = corpora_.emplace(run, std::move(corpus)).first;
  }
  // Fields the spec leaves unset come from the data order the workers
  // reported training with (their hello), then the corpus's default manifest.
  SG_ASSIGN_OR_RETURN(storage::CorpusMetadata meta, storage::ReadCorpusMetadata(dir));
  *manifest = meta.default_manifest;
  manifest->dataset_fingerprint = it->second->fingerprint();
  if (r.has_data_order()) {
    const v1::DataOrder& w = r.data_order();
    if (!w.dataset_fingerprint().empty() &&
        w.dataset_fingerprint() != manifest->dataset_fingerprint) {
      // Resolving with this corpus would name documents the workers never read.
      return absl::FailedPreconditionError(absl::StrCat(
          "run '", run, "': its workers train on corpus '", w.dataset_fingerprint(), "', but ",
          m.corpus_dir(), " is '", manifest->dataset_fingerprint, "'"));
    }
    manifest->seed = w.seed();
    if (w.global_batch_size() > 0) manifest->global_batch_size = w.global_batch_size();
    if (w.sequence_length() > 0) manifest->sequence_length = w.sequence_length();
    manifest->blend = {w.blend().begin(), w.blend().end()};
  }
  if (m.seed() != 0) manifest->seed = m.seed();
  if (m.global_batch_size() > 0) manifest->global_batch_size = m.global_batch_size();
  if (m.sequence_length() > 0) manifest->sequence_length = m.sequence_length();
  if (!m.blend().empty()) manifest->blend = {m.blend().begin(), m.blend().end()};
  return it->second.get();
}

absl::StatusOr<std::vector<v1::ResolvedStep>> CatalogRunView::Resolve(const std::string& run,
                                                                      int64_t generation,
                                                                      int64_t from, int64_t to) {
  storage::Manifest manifest;
  absl::StatusOr<const storage::Corpus*> found = CorpusFor(run, &manifest);
  if (absl::IsNotFound(found.status())) {
    // No manifest: the documents the trainer reported with each step (a
    // dataset not in spikeguard's format); NOT_FOUND when it reported none.
    SG_ASSIGN_OR_RETURN(std::vector<v1::StepRecord> records,
                        catalog_->QueryTelemetry(run, generation, std::max<int64_t>(0, from), to,
                                                 storage::Catalog::kMaxQueryLimit));
    std::vector<v1::ResolvedStep> out;
    bool any = false;
    for (const auto& r : records) {
      v1::ResolvedStep& rs = out.emplace_back();
      rs.set_step(r.step());
      rs.set_data_position(r.data_position());
      for (const auto& d : r.documents()) {
        any = true;
        auto* ref = rs.add_documents();
        ref->set_domain(d.domain());
        ref->set_document_id(d.id());
        ref->set_data_position(r.data_position());
        ref->set_step(r.step());
      }
    }
    if (!any) return found.status();
    return out;
  }
  if (!found.ok()) return found.status();
  const storage::Corpus* corpus = *found;
  SG_ASSIGN_OR_RETURN(v1::DataPlan plan, Plan(run, generation));
  SG_ASSIGN_OR_RETURN(manifest.plan, incident::PlanFromProto(plan));
  SG_ASSIGN_OR_RETURN(std::unique_ptr<storage::DataOrder> order,
                      storage::DataOrder::Create(*corpus, manifest));
  std::vector<v1::ResolvedStep> out;
  for (int64_t step = std::max<int64_t>(0, from); step <= to; ++step) {
    auto position = order->PositionForStep(step);
    if (!position.ok()) break;
    SG_ASSIGN_OR_RETURN(std::vector<storage::DocumentId> docs, order->DocumentsAt(*position));
    v1::ResolvedStep& rs = out.emplace_back();
    rs.set_step(step);
    rs.set_data_position(*position);
    for (const auto& d : docs) {
      auto* ref = rs.add_documents();
      ref->set_domain(d.domain);
      ref->set_document_id(d.document);
      ref->set_data_position(*position);
      ref->set_step(step);
    }
  }
  return out;
}

absl::StatusOr<std::vector<v1::DocumentRef>> CatalogRunView::Documents(const std::string& run,
                                                                       int64_t generation,
                                                                       int64_t from, int64_t to) {
  auto resolved = Resolve(run, generation, from, to);
  if (absl::IsNotFound(resolved.status())) return std::vector<v1::DocumentRef>{};
  if (!resolved.ok()) return resolved.status();
  // A document that spans several batches is listed at each position it
  // contributes tokens to.
  std::vector<v1::DocumentRef> out;
  std::set<std::tuple<std::string, int64_t, int64_t>> seen;
  for (const auto& rs : *resolved) {
    for (const auto& d : rs.documents()) {
      if (seen.insert({d.domain(), d.document_id(), d.data_position()}).second) out.push_back(d);
    }
  }
  return out;
}

// Without a manifest: the samples as the trainer reported them with the
// step that fed `position` (each document with its sample slot). Empty when
// the step is not recorded or any of its documents lacks a sample: then the
// batch's samples cannot be told apart.
absl::StatusOr<std::vector<incident::SampleContent>> CatalogRunView::ReportedSamples(
    const std::string& run, int64_t generation, int64_t position) {
  SG_ASSIGN_OR_RETURN(v1::DataPlan plan, Plan(run, generation));
  const int64_t step = incident::StepOfPosition(plan, position);
  if (step < 0) return std::vector<incident::SampleContent>{};
  SG_ASSIGN_OR_RETURN(std::vector<v1::StepRecord> records,
                      catalog_->QueryTelemetry(run, generation, step, step, 1));
  std::vector<incident::SampleContent> out;
  if (records.empty() || records.front().data_position() != position) return out;
  for (const auto& d : records.front().documents()) {
    if (!d.has_sample()) return std::vector<incident::SampleContent>{};
    if (static_cast<size_t>(d.sample()) >= out.size()) out.resize(d.sample() + 1);
    v1::DocumentRef& ref = out[d.sample()].documents.emplace_back();
    ref.set_domain(d.domain());
    ref.set_document_id(d.id());
    ref.set_data_position(position);
  }
  return out;
}

absl::StatusOr<std::vector<incident::SampleContent>> CatalogRunView::Samples(
    const std::string& run, int64_t generation, int64_t position) {
  storage::Manifest manifest;
  auto corpus = CorpusFor(run, &manifest);
  if (absl::IsNotFound(corpus.status())) return ReportedSamples(run, generation, position);
  if (!corpus.ok()) return corpus.status();
  SG_ASSIGN_OR_RETURN(std::unique_ptr<storage::DataOrder> order,
                      storage::DataOrder::Create(**corpus, manifest));
  SG_ASSIGN_OR_RETURN(storage::BatchRef batch, order->Resolve(position));
  std::vector<incident::SampleContent> out;
  for (const storage::SampleRef& sample : batch.samples) {
    incident::SampleContent& row = out.emplace_back();
    for (const storage::DocumentSpan& span : sample.spans) {
      const std::string& domain = (*corpus)->domain_name(span.domain);
      const bool listed = std::any_of(
          row.documents.begin(), row.documents.end(), [&](const v1::DocumentRef& d) {
            return d.domain() == domain && d.document_id() == span.document;
          });
      if (listed) continue;  // a sample wrapping into the next epoch
      v1::DocumentRef& ref = row.documents.emplace_back();
      ref.set_domain(domain);
      ref.set_document_id(span.document);
      ref.set_data_position(position);
    }
  }
  return out;
}

absl::StatusOr<std::vector<incident::Carrier>> CatalogRunView::Carriers(
    const std::string& run, const std::vector<v1::DocumentRef>& documents, int64_t from,
    int64_t to) {
  storage::Manifest manifest;
  auto corpus = CorpusFor(run, &manifest);
  if (absl::IsNotFound(corpus.status())) {
    return absl::FailedPreconditionError(
        "the run has no corpus manifest, so the later batches that carry them are unknown");
  }
  if (!corpus.ok()) return corpus.status();
  // The documents by (domain index, id); a domain the corpus lacks matches
  // nothing.
  std::set<std::pair<int32_t, int64_t>> wanted;
  for (const auto& d : documents) {
    for (int32_t k = 0; k < static_cast<int32_t>((*corpus)->domain_names().size()); ++k) {
      if ((*corpus)->domain_name(k) == d.domain()) wanted.insert({k, d.document_id()});
    }
  }
  std::vector<incident::Carrier> out;
  if (wanted.empty()) return out;
  SG_ASSIGN_OR_RETURN(std::unique_ptr<storage::DataOrder> order,
                      storage::DataOrder::Create(**corpus, manifest));
  for (int64_t position = std::max<int64_t>(0, from); position < to; ++position) {
    SG_ASSIGN_OR_RETURN(storage::BatchRef batch, order->Resolve(position));
    incident::Carrier c;
    c.position = position;
    c.samples = static_cast<int32_t>(batch.samples.size());
    for (size_t j = 0; j < batch.samples.size(); ++j) {
      for (const storage::DocumentSpan& span : batch.samples[j].spans) {
        if (wanted.count({span.domain, span.document})) {
          c.slots.push_back(static_cast<int32_t>(j));
          break;
        }
      }
    }
    if (!c.slots.empty()) out.push_back(std::move(c));
  }
  return out;
}

absl::StatusOr<v1::HParams> CatalogRunView::HParams(const std::string& run, int64_t generation) {
  SG_ASSIGN_OR_RETURN(std::vector<v1::Generation> gens, catalog_->ListGenerations(run));
  for (const auto& g : gens) {
    if (g.generation() == generation) return g.hparams();
  }
  // Generation 0 of a run started by its workers has no record: no overrides.
  return v1::HParams();
}

std::optional<int64_t> CatalogRunView::FinalStep(const std::string& run) {
  auto r = catalog_->GetRun(run);
  if (!r.ok() || r->total_steps() <= 0) return std::nullopt;
  return r->total_steps() - 1;
}

absl::StatusOr<std::vector<v1::NearDuplicate>> CatalogRunView::NearDuplicates(
    const std::string& run, const std::vector<v1::DocumentRef>& documents) {
  storage::Manifest manifest;
  auto corpus = CorpusFor(run, &manifest);
  if (absl::IsNotFound(corpus.status())) return std::vector<v1::NearDuplicate>{};
  if (!corpus.ok()) return corpus.status();
  storage::NearDuplicateIndex* index = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = near_duplicates_.find(run);
    if (it == near_duplicates_.end()) {
      SG_ASSIGN_OR_RETURN(std::unique_ptr<storage::NearDuplicateIndex> built,
                          storage::NearDuplicateIndex::Build(**corpus));
      it = near_duplicates_.emplace(run, std::move(built)).first;
    }
    index = it->second.get();
  }
  // The culprits themselves are no news: exclude them from every answer.
  std::vector<storage::DocumentId> culprits;
  for (const auto& d : documents) culprits.push_back({d.domain(), d.document_id()});
  std::sort(culprits.begin(), culprits.end());
  culprits.erase(std::unique(culprits.begin(), culprits.end()), culprits.end());
  std::vector<v1::NearDuplicate> out;
  std::set<std::pair<std::string, int64_t>> listed;
  for (const auto& c : culprits) {
    SG_ASSIGN_OR_RETURN(std::vector<storage::SimilarDocument> similar,
                        index->Similar(c, culprits));
    for (const auto& s : similar) {
      if (!listed.insert({s.domain, s.document_id}).second) continue;
      v1::NearDuplicate& n = out.emplace_back();
      n.set_domain(s.domain);
      n.set_document_id(s.document_id);
      n.set_similarity(s.similarity);
      n.set_similar_to_domain(c.domain);
      n.set_similar_to_document_id(c.document);
    }
  }
  return out;
}

CatalogRunView::RunConfig CatalogRunView::ConfigOf(const std::string& run) {
  // Read before the catalog: a write that lands meanwhile bumps the
  // version past this one, and the next call reads again.
  const int64_t version = catalog_->config_version();
  {
    absl::MutexLock lock(&config_mu_);
    auto it = configs_.find(run);
    if (it != configs_.end() && it->second.version == version) return it->second;
  }
  RunConfig config;
  config.version = version;
  config.policy = EffectivePolicy(catalog_, run);
  auto r = catalog_->GetRunWithoutRanks(run);
  config.world_size = r.ok() ? std::max<uint32_t>(1, r->world_size()) : 1;
  absl::MutexLock lock(&config_mu_);
  // Bounded: runs come and go over a daemon's life.
  if (configs_.size() >= 4096) configs_.clear();
  configs_[run] = config;
  return config;
}

uint32_t CatalogRunView::WorldSize(const std::string& run) { return ConfigOf(run).world_size; }

v1::Policy CatalogRunView::PolicyFor(const std::string& run) { return ConfigOf(run).policy; }

absl::StatusOr<int64_t> CatalogIncidentStore::CreateIncident(const std::string& run,
                                                             const v1::Incident& incident) {
  return catalog_->CreateIncident(run, incident);
}

absl::Status CatalogIncidentStore::SaveIncident(const v1::Incident& incident) {
  return catalog_->UpdateIncident(incident);
}

absl::StatusOr<int64_t> CatalogIncidentStore::AppendEvent(int64_t incident_id,
                                                          const std::string& kind,
                                                          const std::string& payload) {
  return catalog_->AppendIncidentEvent(incident_id, kind, payload);
}

// Each in one transaction of its own; `durable` runs once it committed.
absl::StatusOr<int64_t> CatalogIncidentStore::AppendAndSave(int64_t incident_id,
                                                            const std::string& kind,
                                                            const std::string& payload,
                                                            const ApplyFn& apply,
                                                            const DurableFn& durable) {
  absl::StatusOr<int64_t> seq =
      catalog_->AppendIncidentEventAndUpdate(incident_id, kind, payload, apply);
  if (seq.ok() && durable) durable();
  return seq;
}

absl::StatusOr<int64_t> CatalogIncidentStore::CreateWithEvent(const std::string& run,
                                                              const v1::Incident& initial,
                                                              const std::string& kind,
                                                              const std::string& payload,
                                                              const OpenFn& apply,
                                                              const DurableFn& durable) {
  absl::StatusOr<int64_t> id = catalog_->CreateIncidentWithEvent(run, initial, kind, payload, apply);
  if (id.ok() && durable) durable();
  return id;
}

absl::StatusOr<std::vector<incident::IncidentStore::StoredEvent>> CatalogIncidentStore::Events(
    int64_t incident_id) {
  SG_ASSIGN_OR_RETURN(std::vector<storage::StoredEvent> events,
                      catalog_->ListIncidentEvents(incident_id));
  std::vector<StoredEvent> out;
  for (auto& e : events) out.push_back({e.seq, e.unix_ms, std::move(e.kind), std::move(e.payload)});
  return out;
}

absl::StatusOr<std::vector<v1::Incident>> CatalogIncidentStore::OpenIncidents() {
  SG_ASSIGN_OR_RETURN(std::vector<v1::Incident> all, catalog_->ListIncidents({}));
  std::vector<v1::Incident> open;
  for (auto& i : all) {
    if (i.state() != v1::CLOSED && i.state() != v1::ABORTED) open.push_back(std::move(i));
  }
  return open;
}

absl::StatusOr<std::vector<v1::Incident>> CatalogIncidentStore::RunIncidents(const std::string& run) {
  storage::IncidentFilter filter;
  filter.run = run;
  return catalog_->ListIncidents(filter);
}

absl::Status CatalogIncidentStore::Quarantine(const v1::QuarantineEntry& entry) {
  return catalog_->AddQuarantine(entry).status();
}

absl::Status CatalogIncidentStore::PinCheckpoint(const std::string& run, int64_t step,
                                                 bool pinned) {
  absl::StatusOr<v1::Checkpoint> c = catalog_->PinCheckpoint(run, step, pinned);
  // A checkpoint the catalog no longer has needs no pin.
  if (absl::IsNotFound(c.status())) return absl::OkStatus();
  return c.status();
}

}  // namespace spikeguard::daemon
