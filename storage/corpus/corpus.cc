#include "storage/corpus/corpus.h"

#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "storage/checkpoint/checksum.h"

namespace spikeguard::storage {

absl::Status ValidateDomainName(absl::string_view name) {
  bool ok = !name.empty() && name[0] != '.';
  for (char c : name) {
    ok = ok && (absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' ||
                c == '.');
  }
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("domain name '", name, "' must match [A-Za-z0-9_.-]+ and not start with '.'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Corpus>> Corpus::Open(const std::string& dir) {
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec);
  if (ec) {
    return absl::NotFoundError(absl::StrCat("cannot list corpus directory ", dir, ": ",
                                            ec.message()));
  }
  std::map<std::string, std::string> prefixes;
  for (const auto& entry : it) {
    const std::filesystem::path& p = entry.path();
    if (p.extension() != ".idx") continue;
    std::string name = p.stem().string();
    if (!ValidateDomainName(name).ok()) continue;  // hidden or foreign files
    prefixes[name] = (p.parent_path() / name).string();
  }
  if (prefixes.empty()) {
    return absl::NotFoundError(
        absl::StrCat("corpus directory ", dir, " holds no <domain>.idx/<domain>.bin pair"));
  }
  return OpenPrefixes(prefixes);
}

absl::StatusOr<std::unique_ptr<Corpus>> Corpus::OpenPrefixes(
    const std::map<std::string, std::string>& prefixes) {
  std::unique_ptr<Corpus> corpus(new Corpus());
  Xxh64 h;
  for (const auto& [name, prefix] : prefixes) {
    SG_RETURN_IF_ERROR(ValidateDomainName(name));
    SG_ASSIGN_OR_RETURN(std::unique_ptr<IndexedDataset> ds, IndexedDataset::Open(prefix));
    // Length-prefixed fields, so ("ab","c") and ("a","bc") hash differently.
    const uint64_t sizes[3] = {name.size(), ds->index_bytes().size(), ds->bin_size()};
    h.Update(sizes, sizeof(sizes));
    h.Update(name);
    h.Update(ds->index_bytes());
    h.Update(ds->bin_bytes());
    corpus->names_.push_back(name);
    corpus->domains_.push_back(std::move(ds));
  }
  corpus->fingerprint_ = ChecksumHex(h.Digest());
  return corpus;
}

absl::StatusOr<int> Corpus::DomainIndex(absl::string_view name) const {
  for (int d = 0; d < num_domains(); ++d) {
    if (names_[d] == name) return d;
  }
  return absl::NotFoundError(absl::StrCat("corpus has no domain '", name, "' (domains: ",
                                          absl::StrJoin(names_, ", "), ")"));
}

}  // namespace spikeguard::storage
