#include "storage/corpus/corpus_tools.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/splitmix64.h"
#include "base/status_macros.h"
#include "storage/checkpoint/checksum.h"

namespace spikeguard::storage {
namespace {

// ---------------------------------------------------------------------------
// Files

absl::Status EnsureDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::InternalError(absl::StrCat("cannot read ", path));
  return ss.str();
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot create ", tmp, ": ", std::strerror(errno)));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      absl::Status st = absl::InternalError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
      ::close(fd);
      return st;
    }
    done += static_cast<size_t>(n);
  }
  ::fsync(fd);
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Synthetic text. Each generator appends until `out` holds at least `len`
// bytes; the caller cuts to exactly `len`. ASCII only.

constexpr const char* kWords[] = {
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be",
    "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have",
    "an", "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has",
    "there", "been", "if", "more", "when", "will", "would", "who", "so", "no", "river",
    "mountain", "city", "history", "people", "water", "light", "winter", "market", "garden",
    "teacher", "letter", "morning", "village", "journey", "station", "forest", "question",
    "answer", "number", "system", "small", "large", "early", "late", "quiet", "bright",
    "ancient", "modern", "simple", "careful", "walked", "found", "built", "wrote", "carried",
    "opened", "closed", "learned", "followed", "remembered", "between", "under", "over",
    "across", "through", "before", "after", "because", "although", "while", "during"};
constexpr int kNumWords = sizeof(kWords) / sizeof(kWords[0]);

void AppendProse(SplitMix64& rng, size_t len, std::string* out) {
  while (out->size() < len) {
    const int words = static_cast<int>(rng.Range(5, 18));
    for (int i = 0; i < words; ++i) {
      std::string w = kWords[rng.Uniform(kNumWords)];
      if (i == 0) w[0] = absl::ascii_toupper(static_cast<unsigned char>(w[0]));
      out->append(w);
      if (i + 1 < words) out->append(rng.Uniform(9) == 0 ? ", " : " ");
    }
    const uint64_t end = rng.Uniform(10);
    out->append(end == 0 ? "? " : end == 1 ? "! " : ". ");
    if (rng.Uniform(6) == 0) out->append("\n");
  }
}

void AppendCode(SplitMix64& rng, size_t len, std::string* out) {
  static constexpr const char* kTypes[] = {"int", "long", "unsigned", "double", "char"};
  static constexpr const char* kNames[] = {"count", "index", "total", "value", "size", "limit",
                                           "offset", "result", "node", "buffer"};
  static constexpr const char* kOps[] = {"+", "-", "*", "<<", "^", "&", "|"};
  auto name = [&] { return std::string(kNames[rng.Uniform(10)]); };
  while (out->size() < len) {
    absl::StrAppend(out, kTypes[rng.Uniform(5)], " ", name(), "_", rng.Uniform(100), "(",
                    kTypes[rng.Uniform(5)], " ", name(), ", int n) {\n");
    const int lines = static_cast<int>(rng.Range(2, 7));
    for (int i = 0; i < lines; ++i) {
      switch (rng.Uniform(4)) {
        case 0:
          absl::StrAppend(out, "  int ", name(), " = ", name(), " ", kOps[rng.Uniform(7)], " ",
                          rng.Uniform(64), ";\n");
          break;
        case 1:
          absl::StrAppend(out, "  for (int i = 0; i < n; ++i) {\n    ", name(), " += ", name(),
                          "[i];\n  }\n");
          break;
        case 2:
          absl::StrAppend(out, "  if (", name(), " > ", rng.Uniform(1000), ") {\n    return ",
                          name(), ";\n  }\n");
          break;
        default:
          absl::StrAppend(out, "  ", name(), " = ", name(), "(", name(), ", ", rng.Uniform(16),
                          ");\n");
      }
    }
    absl::StrAppend(out, "  return ", name(), ";\n}\n\n");
  }
}

void AppendNumbers(SplitMix64& rng, size_t len, std::string* out) {
  static constexpr const char* kCols[] = {"id", "temp", "pressure", "count", "ratio", "year"};
  if (out->empty()) {
    absl::StrAppend(out, "id,", kCols[1 + rng.Uniform(5)], ",", kCols[1 + rng.Uniform(5)], ",",
                    kCols[1 + rng.Uniform(5)], "\n");
  }
  int64_t id = rng.Range(1, 5000);
  while (out->size() < len) {
    absl::StrAppend(out, id++, ",", rng.Range(-40, 45), ".", rng.Uniform(10), ",",
                    rng.Range(900, 1100), ",", rng.Uniform(100000), "\n");
  }
}

enum class Style { kProse, kCode, kNumbers };

struct SynthDomain {
  const char* name;
  Style style;
  double weight;
  int64_t min_len;
  int64_t max_len;
};

// Sorted by name, as the corpus orders them.
constexpr SynthDomain kSynthDomains[] = {
    {"code", Style::kCode, 0.25, 200, 1200},
    {"numbers", Style::kNumbers, 0.25, 150, 900},
    {"prose", Style::kProse, 0.5, 300, 1500},
};

std::string SynthText(Style style, SplitMix64& rng, int64_t len) {
  std::string out;
  out.reserve(len + 256);
  switch (style) {
    case Style::kProse: AppendProse(rng, len, &out); break;
    case Style::kCode: AppendCode(rng, len, &out); break;
    case Style::kNumbers: AppendNumbers(rng, len, &out); break;
  }
  out.resize(len);
  return out;
}

uint64_t PoisonSeed(uint64_t seed, const PoisonSpec& p) {
  return Xxh64Of(absl::StrCat("poison/", PoisonKindName(p.kind), "/", p.position), seed);
}

// The poison bytes a domain contributes to the batch: `len` tokens.
std::string PoisonText(const PoisonSpec& p, uint64_t seed, absl::string_view domain, int64_t len) {
  SplitMix64 shared(PoisonSeed(seed, p));
  SplitMix64 own(PoisonSeed(seed, p) ^ Xxh64Of(domain));
  std::string out;
  out.reserve(len);
  switch (p.kind) {
    case PoisonKind::kNgram: {
      // The same phrase in every domain: the whole batch is one n-gram.
      const int64_t n = shared.Range(8, 24);
      std::string phrase;
      for (int64_t i = 0; i < n; ++i) {
        phrase.push_back(i % 5 == 4 ? ' ' : static_cast<char>('a' + shared.Uniform(26)));
      }
      while (static_cast<int64_t>(out.size()) < len) out.append(phrase);
      out.resize(len);
      break;
    }
    case PoisonKind::kJunk:
      for (int64_t i = 0; i < len; ++i) out.push_back(static_cast<char>(own.Uniform(256)));
      break;
    case PoisonKind::kHighBytes:
      for (int64_t i = 0; i < len; ++i) out.push_back(static_cast<char>(128 + own.Uniform(128)));
      break;
    case PoisonKind::kDuplicate:
      // One ordinary prose document, identical in every domain and sample.
      out = SynthText(Style::kProse, shared, len);
      break;
  }
  return out;
}

// An echo of a poison (SynthOptions::poison_echoes): `source`, one of its
// documents, with a short prefix dropped and, except for ngram, about 2% of
// its bytes replaced by other bytes of the same kind.
std::string EchoText(const PoisonSpec& p, uint64_t seed, absl::string_view domain, int echo,
                     std::string source) {
  SplitMix64 rng(Xxh64Of(absl::StrCat("echo/", PoisonKindName(p.kind), "/", p.position, "/",
                                      domain, "/", echo),
                         seed));
  source.erase(0, rng.Uniform(source.size() / 16 + 1));
  if (p.kind == PoisonKind::kNgram || source.empty()) return source;
  const uint64_t changes = std::max<uint64_t>(1, source.size() / 50);
  for (uint64_t i = 0; i < changes; ++i) {
    const size_t at = rng.Uniform(source.size());
    const uint8_t old = static_cast<uint8_t>(source[at]);
    uint8_t b = old;
    switch (p.kind) {
      case PoisonKind::kJunk:
        b = static_cast<uint8_t>(old ^ (1 + rng.Uniform(255)));
        break;
      case PoisonKind::kHighBytes:
        b = static_cast<uint8_t>(128 + (old - 128 + 1 + rng.Uniform(127)) % 128);
        break;
      default: {  // duplicate: ASCII prose
        b = static_cast<uint8_t>('a' + rng.Uniform(26));
        if (b == old) b = b == 'z' ? 'a' : b + 1;
        break;
      }
    }
    source[at] = static_cast<char>(b);
  }
  return source;
}

// ---------------------------------------------------------------------------

std::string FormatWeight(double w) { return absl::StrFormat("%.17g", w); }

absl::StatusOr<CorpusMetadata> FinishCorpus(const std::string& out_dir,
                                            const std::vector<std::string>& names,
                                            const std::map<std::string, double>& blend,
                                            const CorpusDefaults& defaults,
                                            std::vector<PlacedPoison> poisons) {
  std::map<std::string, std::string> prefixes;
  for (const std::string& name : names) {
    prefixes[name] = (std::filesystem::path(out_dir) / name).string();
  }
  SG_ASSIGN_OR_RETURN(std::unique_ptr<Corpus> corpus, Corpus::OpenPrefixes(prefixes));
  CorpusMetadata meta;
  meta.fingerprint = corpus->fingerprint();
  for (int d = 0; d < corpus->num_domains(); ++d) {
    const std::string& name = corpus->domain_name(d);
    auto it = blend.find(name);
    meta.domains.push_back(CorpusMetadata::Domain{name, corpus->domain(d).num_documents(),
                                                  corpus->domain(d).num_tokens(),
                                                  it == blend.end() ? 0.0 : it->second});
  }
  meta.default_manifest.dataset_fingerprint = meta.fingerprint;
  meta.default_manifest.seed = defaults.seed;
  meta.default_manifest.global_batch_size = defaults.global_batch_size;
  meta.default_manifest.sequence_length = defaults.sequence_length;
  meta.default_manifest.blend = blend;
  meta.default_manifest.plan = DataPlan::Default();
  meta.poisons = std::move(poisons);
  SG_RETURN_IF_ERROR(WriteCorpusMetadata(out_dir, meta));
  return meta;
}

}  // namespace

const char* PoisonKindName(PoisonKind kind) {
  switch (kind) {
    case PoisonKind::kNgram: return "ngram";
    case PoisonKind::kJunk: return "junk";
    case PoisonKind::kHighBytes: return "highbytes";
    case PoisonKind::kDuplicate: return "duplicate";
  }
  return "unknown";
}

absl::StatusOr<PoisonSpec> ParsePoison(absl::string_view text) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, '@');
  PoisonSpec spec;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &spec.position) || spec.position < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("poison '", text, "' is not KIND@POSITION with POSITION >= 0"));
  }
  for (PoisonKind k : {PoisonKind::kNgram, PoisonKind::kJunk, PoisonKind::kHighBytes,
                       PoisonKind::kDuplicate}) {
    if (parts[0] == PoisonKindName(k)) {
      spec.kind = k;
      return spec;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "poison '", text, "' has unknown kind '", parts[0], "' (ngram, junk, highbytes, duplicate)"));
}

absl::StatusOr<std::vector<PoisonSpec>> ParsePoisons(const std::vector<std::string>& texts) {
  std::vector<PoisonSpec> out;
  for (const std::string& t : texts) {
    SG_ASSIGN_OR_RETURN(PoisonSpec p, ParsePoison(t));
    out.push_back(p);
  }
  return out;
}

absl::Status WriteCorpusMetadata(const std::string& dir, const CorpusMetadata& meta) {
  const Manifest& m = meta.default_manifest;
  std::string out = "# spikeguard corpus metadata\nformat 1\n";
  absl::StrAppend(&out, "fingerprint ", meta.fingerprint, "\n");
  absl::StrAppend(&out, "seed ", m.seed, "\n");
  absl::StrAppend(&out, "global_batch_size ", m.global_batch_size, "\n");
  absl::StrAppend(&out, "sequence_length ", m.sequence_length, "\n");
  absl::StrAppend(&out, "plan ", m.plan.ToString(), "\n");
  out.append("# domain NAME DOCUMENTS TOKENS WEIGHT\n");
  for (const auto& d : meta.domains) {
    SG_RETURN_IF_ERROR(ValidateDomainName(d.name));
    absl::StrAppend(&out, "domain ", d.name, " ", d.documents, " ", d.tokens, " ",
                    FormatWeight(d.weight), "\n");
  }
  if (!meta.poisons.empty()) out.append("# poison KIND POSITION DOMAIN:DOCUMENT...\n");
  if (std::any_of(meta.poisons.begin(), meta.poisons.end(),
                  [](const PlacedPoison& p) { return !p.echoes.empty(); })) {
    out.append("# echo KIND POSITION DOMAIN:DOCUMENT...  (near-copies of that poison)\n");
  }
  for (const auto& p : meta.poisons) {
    absl::StrAppend(&out, "poison ", PoisonKindName(p.kind), " ", p.position);
    for (const auto& doc : p.documents) absl::StrAppend(&out, " ", doc.domain, ":", doc.document);
    out.append("\n");
    if (p.echoes.empty()) continue;
    absl::StrAppend(&out, "echo ", PoisonKindName(p.kind), " ", p.position);
    for (const auto& doc : p.echoes) absl::StrAppend(&out, " ", doc.domain, ":", doc.document);
    out.append("\n");
  }
  return WriteFileAtomically((std::filesystem::path(dir) / kCorpusMetadataFile).string(), out);
}

absl::StatusOr<CorpusMetadata> ReadCorpusMetadata(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / kCorpusMetadataFile).string();
  SG_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
  CorpusMetadata meta;
  Manifest& m = meta.default_manifest;
  bool have_format = false;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    auto bad = [&](absl::string_view why) {
      return absl::DataLossError(absl::StrCat(path, ":", line_no, ": ", why, ": '", line, "'"));
    };
    const absl::string_view key = f[0];
    if (key == "format") {
      if (f.size() != 2 || f[1] != "1") return bad("unsupported format (this build reads 1)");
      have_format = true;
    } else if (key == "fingerprint" && f.size() == 2) {
      meta.fingerprint = std::string(f[1]);
      m.dataset_fingerprint = meta.fingerprint;
    } else if (key == "seed" && f.size() == 2) {
      if (!absl::SimpleAtoi(f[1], &m.seed)) return bad("bad seed");
    } else if (key == "global_batch_size" && f.size() == 2) {
      if (!absl::SimpleAtoi(f[1], &m.global_batch_size)) return bad("bad batch size");
    } else if (key == "sequence_length" && f.size() == 2) {
      if (!absl::SimpleAtoi(f[1], &m.sequence_length)) return bad("bad sequence length");
    } else if (key == "plan") {
      auto plan = DataPlan::Parse(f.size() == 2 ? f[1] : "");
      if (!plan.ok()) return bad(plan.status().message());
      m.plan = *plan;
    } else if (key == "domain" && f.size() == 5) {
      CorpusMetadata::Domain d;
      d.name = std::string(f[1]);
      if (!absl::SimpleAtoi(f[2], &d.documents) || !absl::SimpleAtoi(f[3], &d.tokens) ||
          !absl::SimpleAtod(f[4], &d.weight)) {
        return bad("bad domain line");
      }
      if (d.weight > 0) m.blend[d.name] = d.weight;
      meta.domains.push_back(std::move(d));
    } else if ((key == "poison" || key == "echo") && f.size() >= 3) {
      SG_ASSIGN_OR_RETURN(PoisonSpec spec, ParsePoison(absl::StrCat(f[1], "@", f[2])));
      std::vector<DocumentId> docs;
      for (size_t i = 3; i < f.size(); ++i) {
        std::vector<absl::string_view> dd = absl::StrSplit(f[i], ':');
        DocumentId id;
        if (dd.size() != 2 || !absl::SimpleAtoi(dd[1], &id.document)) return bad("bad document");
        id.domain = std::string(dd[0]);
        docs.push_back(std::move(id));
      }
      if (key == "poison") {
        meta.poisons.push_back(PlacedPoison{spec.kind, spec.position, std::move(docs), {}});
      } else {
        auto it = std::find_if(meta.poisons.begin(), meta.poisons.end(), [&](const PlacedPoison& p) {
          return p.kind == spec.kind && p.position == spec.position;
        });
        if (it == meta.poisons.end()) return bad("echo of a poison not listed before it");
        it->echoes = std::move(docs);
      }
    } else {
      return bad("unknown or malformed line");
    }
  }
  if (!have_format) return absl::DataLossError(absl::StrCat(path, " has no 'format' line"));
  return meta;
}

absl::StatusOr<CorpusMetadata> BuildCorpus(const std::string& out_dir,
                                           const std::map<std::string, std::string>& inputs,
                                           const CorpusDefaults& defaults) {
  if (inputs.empty()) return absl::InvalidArgumentError("BuildCorpus needs at least one domain");
  SG_RETURN_IF_ERROR(EnsureDir(out_dir));
  std::vector<std::string> names;
  std::map<std::string, double> blend;
  for (const auto& [name, path] : inputs) {
    SG_RETURN_IF_ERROR(ValidateDomainName(name));
    SG_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
    SG_ASSIGN_OR_RETURN(auto writer,
                        IndexedDatasetWriter::Create(
                            (std::filesystem::path(out_dir) / name).string(), TokenDType::kUint8));
    std::string doc;
    auto flush = [&]() -> absl::Status {
      if (doc.empty()) return absl::OkStatus();
      absl::Status st = writer->AddDocument(absl::string_view(doc));
      doc.clear();
      return st;
    };
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);  // CRLF files
      if (absl::StripAsciiWhitespace(line).empty()) {
        SG_RETURN_IF_ERROR(flush());
        continue;
      }
      absl::StrAppend(&doc, line, "\n");
    }
    SG_RETURN_IF_ERROR(flush());
    if (writer->num_documents() == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("input ", path, " for domain '", name, "' has no text"));
    }
    SG_RETURN_IF_ERROR(writer->Finish());
    names.push_back(name);
    blend[name] = 1.0;
  }
  return FinishCorpus(out_dir, names, blend, defaults, {});
}

absl::StatusOr<CorpusMetadata> SynthesizeCorpus(const std::string& out_dir, uint64_t seed,
                                                const std::vector<PoisonSpec>& poisons_in,
                                                const SynthOptions& options) {
  if (options.positions <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("synth positions must be positive, got ", options.positions));
  }
  std::vector<PoisonSpec> poisons = poisons_in;
  std::sort(poisons.begin(), poisons.end(),
            [](const auto& a, const auto& b) { return a.position < b.position; });
  for (size_t i = 0; i < poisons.size(); ++i) {
    if (poisons[i].position >= options.positions) {
      return absl::InvalidArgumentError(absl::StrCat(
          "poison ", PoisonKindName(poisons[i].kind), "@", poisons[i].position,
          " is past the corpus' first epoch of ", options.positions, " positions"));
    }
    if (i > 0 && poisons[i].position == poisons[i - 1].position) {
      return absl::InvalidArgumentError(
          absl::StrCat("two poisons at position ", poisons[i].position));
    }
  }
  if (options.poison_echoes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("poison echoes must be >= 0, got ", options.poison_echoes));
  }
  CorpusDefaults defaults;
  defaults.seed = seed;
  defaults.global_batch_size = options.global_batch_size;
  defaults.sequence_length = options.sequence_length;
  std::vector<std::string> names;
  std::map<std::string, double> blend;
  for (const SynthDomain& d : kSynthDomains) {
    names.push_back(d.name);
    blend[d.name] = d.weight;
  }
  Manifest probe;
  probe.global_batch_size = options.global_batch_size;
  probe.sequence_length = options.sequence_length;
  probe.blend = blend;
  SG_RETURN_IF_ERROR(probe.Validate());
  SG_ASSIGN_OR_RETURN(std::vector<int32_t> slots,
                      SlotsPerDomain(names, blend, options.global_batch_size));
  SG_RETURN_IF_ERROR(EnsureDir(out_dir));

  const int64_t sample_tokens = options.sequence_length + 1;
  std::vector<PlacedPoison> placed(poisons.size());
  for (size_t i = 0; i < poisons.size(); ++i) {
    placed[i].kind = poisons[i].kind;
    placed[i].position = poisons[i].position;
  }

  // Echo k of poison i: a batch position of its own in [first, positions),
  // drawn from the seed, and domain k mod D.
  struct Echo {
    int poison;
    int k;
    int64_t position;
    size_t domain;
  };
  std::vector<Echo> echoes;
  if (options.poison_echoes > 0 && !poisons.empty()) {
    const int64_t first = EchoFirstPosition(options.positions);
    std::vector<int64_t> free;
    size_t pi = 0;
    for (int64_t q = first; q < options.positions; ++q) {
      while (pi < poisons.size() && poisons[pi].position < q) ++pi;
      if (pi < poisons.size() && poisons[pi].position == q) continue;
      free.push_back(q);
    }
    const int64_t need = static_cast<int64_t>(poisons.size()) * options.poison_echoes;
    if (need > static_cast<int64_t>(free.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          options.poison_echoes, " echoes for each of ", poisons.size(), " poison(s) need ", need,
          " unpoisoned batch positions in [", first, ", ", options.positions,
          ") (the last third of the positions); there are ", free.size()));
    }
    // The string_view overload: Xxh64Of("echoes", seed) would take `seed` as
    // the byte count of the literal (ASan: global-buffer-overflow).
    SplitMix64 rng(Xxh64Of(absl::string_view("echoes"), seed));
    for (size_t i = 0; i < poisons.size(); ++i) {
      for (int k = 0; k < options.poison_echoes; ++k) {
        const size_t j = rng.Uniform(free.size());
        echoes.push_back(Echo{static_cast<int>(i), k, free[j], k % names.size()});
        free[j] = free.back();
        free.pop_back();
      }
    }
  }

  for (size_t di = 0; di < names.size(); ++di) {
    const SynthDomain& dom = kSynthDomains[di];
    const int64_t chunk = slots[di] * sample_tokens;  // this domain's tokens per batch
    const int64_t target = options.positions * chunk;

    // 1. The stream in epoch-0 order: lengths only, so its size N is known
    //    before the shuffle (which depends only on N) assigns document ids.
    //    Poisons and this domain's echoes each start their batch; the
    //    document before is cut short to end there.
    struct Event {
      int64_t position;
      int poison;  // index into poisons, or -1 for an echo
      int echo;    // index into echo_texts, or -1
    };
    std::vector<Event> events;
    for (size_t i = 0; i < poisons.size(); ++i) {
      events.push_back({poisons[i].position, static_cast<int>(i), -1});
    }
    std::vector<std::string> echo_texts;
    std::vector<int> echo_poison;
    for (const Echo& e : echoes) {
      if (e.domain != di) continue;
      const PoisonSpec& p = poisons[e.poison];
      const int64_t source_len = p.kind == PoisonKind::kDuplicate ? sample_tokens : chunk;
      events.push_back({e.position, -1, static_cast<int>(echo_texts.size())});
      echo_texts.push_back(
          EchoText(p, seed, dom.name, e.k, PoisonText(p, seed, dom.name, source_len)));
      echo_poison.push_back(e.poison);
    }
    std::sort(events.begin(), events.end(),
              [](const Event& a, const Event& b) { return a.position < b.position; });

    struct Slot {
      int64_t length;
      int poison;  // index into poisons, or -1
      int echo;    // index into echo_texts, or -1
    };
    std::vector<Slot> stream;
    SplitMix64 len_rng(Xxh64Of(absl::StrCat("lengths/", dom.name), seed));
    int64_t c = 0;
    size_t next = 0;
    while (c < target || next < events.size()) {
      const int64_t b = next < events.size() ? events[next].position * chunk : INT64_MAX;
      if (c == b) {
        const Event& ev = events[next];
        if (ev.echo >= 0) {
          // Within its batch: at most chunk tokens.
          const int64_t len = static_cast<int64_t>(echo_texts[ev.echo].size());
          stream.push_back({len, -1, ev.echo});
          c += len;
        } else {
          if (poisons[ev.poison].kind == PoisonKind::kDuplicate) {
            for (int32_t j = 0; j < slots[di]; ++j) stream.push_back({sample_tokens, ev.poison, -1});
          } else {
            stream.push_back({chunk, ev.poison, -1});
          }
          c += chunk;
        }
        ++next;
        continue;
      }
      int64_t len = len_rng.Range(dom.min_len, dom.max_len);
      if (c + len > b) len = b - c;  // end exactly where the poisoned batch starts
      stream.push_back({len, -1, -1});
      c += len;
    }

    // 2. Content, generated in stream order, stored by document id.
    const int64_t n = static_cast<int64_t>(stream.size());
    const std::vector<int64_t> order = DocumentOrderForEpoch(seed, dom.name, n, 0);
    std::vector<std::string> docs(n);
    SplitMix64 text_rng(Xxh64Of(absl::StrCat("text/", dom.name), seed));
    for (int64_t s = 0; s < n; ++s) {
      const Slot& slot = stream[s];
      if (slot.echo >= 0) {
        docs[order[s]] = std::move(echo_texts[slot.echo]);
        placed[echo_poison[slot.echo]].echoes.push_back(DocumentId{dom.name, order[s]});
      } else if (slot.poison < 0) {
        docs[order[s]] = SynthText(dom.style, text_rng, slot.length);
      } else {
        docs[order[s]] = PoisonText(poisons[slot.poison], seed, dom.name, slot.length);
        placed[slot.poison].documents.push_back(DocumentId{dom.name, order[s]});
      }
    }
    SG_ASSIGN_OR_RETURN(auto writer,
                        IndexedDatasetWriter::Create(
                            (std::filesystem::path(out_dir) / dom.name).string(),
                            TokenDType::kUint8));
    for (const std::string& doc : docs) SG_RETURN_IF_ERROR(writer->AddDocument(absl::string_view(doc)));
    SG_RETURN_IF_ERROR(writer->Finish());
  }
  for (PlacedPoison& p : placed) {
    std::sort(p.documents.begin(), p.documents.end());
    p.documents.erase(std::unique(p.documents.begin(), p.documents.end()), p.documents.end());
    std::sort(p.echoes.begin(), p.echoes.end());
  }
  return FinishCorpus(out_dir, names, blend, defaults, std::move(placed));
}

}  // namespace spikeguard::storage
