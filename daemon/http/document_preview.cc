#include "daemon/http/document_preview.h"

#include <map>
#include <memory>
#include <string>

#include "absl/strings/ascii.h"
#include "storage/corpus/indexed_dataset.h"

namespace spikeguard::daemon {
namespace {

// A domain names a file in the corpus dir: letters, digits, '_', '-', '.',
// not starting with '.'.
bool PlainName(const std::string& name) {
  if (name.empty() || name.size() > 128 || name[0] == '.') return false;
  for (unsigned char c : name) {
    if (!absl::ascii_isalnum(c) && c != '_' && c != '-' && c != '.') return false;
  }
  return true;
}

}  // namespace

void AttachDocumentPreviews(const std::string& dir, v1::Incident* incident) {
  if (dir.empty()) return;
  std::map<std::string, std::unique_ptr<storage::IndexedDataset>> open;
  int done = 0;
  for (v1::DocumentRef& doc : *incident->mutable_documents()) {
    if (done++ >= kMaxPreviews) break;
    if (!PlainName(doc.domain()) || doc.document_id() < 0) continue;
    auto it = open.find(doc.domain());
    if (it == open.end()) {
      auto ds = storage::IndexedDataset::Open(dir + "/" + doc.domain());
      it = open.emplace(doc.domain(), ds.ok() ? std::move(*ds) : nullptr).first;
    }
    if (it->second == nullptr || doc.document_id() >= it->second->num_documents()) continue;
    absl::StatusOr<std::string> bytes = it->second->DocumentBytes(doc.document_id());
    if (!bytes.ok()) continue;
    doc.set_preview(bytes->substr(0, kMaxPreviewBytes));
  }
}

}  // namespace spikeguard::daemon
