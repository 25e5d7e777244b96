// corpus.h
// -----------------------------------------------------------------------------
// A Corpus is a directory of Megatron indexed datasets, one per domain:
// DIR/<domain>.bin + DIR/<domain>.idx. Domains are ordered by name; a domain's
// index in that order is how samples name their domain.
//
//   SG_ASSIGN_OR_RETURN(auto corpus, Corpus::Open("/data/corpus"));
//   for (int d = 0; d < corpus->num_domains(); ++d) {
//     SG_LOG(INFO) << corpus->domain_name(d) << ": "
//                  << corpus->domain(d).num_documents() << " documents";
//   }
//   std::string fp = corpus->fingerprint();   // goes into the Manifest
//
// The fingerprint is XXH64 over every domain's name, .idx and .bin bytes, in
// name order, so any change to the data or its split into documents changes
// it. Computing it reads the whole corpus once at Open, at memory speed
// (several GB/s once cached).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/corpus/indexed_dataset.h"

namespace spikeguard::storage {

class Corpus {
 public:
  // Opens every <name>.idx/<name>.bin pair in `dir`. NOT_FOUND when there is
  // none; an .idx without its .bin is an error naming it.
  static absl::StatusOr<std::unique_ptr<Corpus>> Open(const std::string& dir);
  // Opens explicit domain → path prefix pairs (e.g. data outside one folder).
  static absl::StatusOr<std::unique_ptr<Corpus>> OpenPrefixes(
      const std::map<std::string, std::string>& prefixes);

  int num_domains() const { return static_cast<int>(domains_.size()); }
  const std::string& domain_name(int d) const { return names_[d]; }
  const IndexedDataset& domain(int d) const { return *domains_[d]; }
  // The index of domain `name`; NOT_FOUND naming the known domains otherwise.
  absl::StatusOr<int> DomainIndex(absl::string_view name) const;
  const std::vector<std::string>& domain_names() const { return names_; }

  // 16 hex digits (see above).
  const std::string& fingerprint() const { return fingerprint_; }

 private:
  Corpus() = default;

  std::vector<std::string> names_;
  std::vector<std::unique_ptr<IndexedDataset>> domains_;
  std::string fingerprint_;
};

// Domain names are file stems: [A-Za-z0-9_.-]+, not starting with '.'.
absl::Status ValidateDomainName(absl::string_view name);

}  // namespace spikeguard::storage
