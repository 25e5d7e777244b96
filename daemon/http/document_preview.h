// document_preview.h
// -----------------------------------------------------------------------------
// The first bytes of an incident's culprit documents, read from the run's
// corpus (its manifest's corpus_dir, one indexed dataset per domain), for the
// incident report's preview column. GetIncident calls it on its answer with
// the dir as LaunchProfiles::CorpusDir confined it just now:
//
//   AttachDocumentPreviews(*profiles->CorpusDir(run, spec), &incident);
//
// Best effort: a run without a corpus dir, a domain that is not a plain file
// name (documents reported by a trainer may name anything), a missing file or
// document leaves that preview empty. Bounded: kMaxPreviewBytes per document,
// kMaxPreviews documents.
#pragma once

#include <cstddef>
#include <string>

#include "spikeguard/v1/supervisor.pb.h"

namespace spikeguard::daemon {

inline constexpr size_t kMaxPreviewBytes = 256;
inline constexpr int kMaxPreviews = 64;

void AttachDocumentPreviews(const std::string& corpus_dir, spikeguard::v1::Incident* incident);

}  // namespace spikeguard::daemon
