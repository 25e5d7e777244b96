// spikeguard._corpus: the C++ corpus library (storage/corpus) for Python.
//
// The Python trainer must consume exactly the step → position → samples →
// documents order the daemon resolves, so this module binds the very code the
// daemon and the reference worker run instead of rewriting it:
//
//   Corpus.open(dir)                       Corpus::Open + corpus.meta
//   DataOrder(corpus, fingerprint, seed, global_batch_size, sequence_length,
//             blend, plan_text)            DataPlan::Parse + DataOrder::Create
//   order.position_for_step(step)          DataOrder::PositionForStep
//   order.materialize(position)            DataOrder::Materialize (GIL released)
//   order.documents_at(position)           DataOrder::DocumentsAt
//   order.resolve(position)                DataOrder::Resolve
//
// spikeguard/data.py is the public API over it; nothing here re-derives rows.
//
// Errors: absl status codes become Python exceptions carrying the message:
// INVALID_ARGUMENT, FAILED_PRECONDITION, DATA_LOSS → ValueError; NOT_FOUND →
// FileNotFoundError; OUT_OF_RANGE → IndexError; anything else → OSError.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/corpus/corpus.h"
#include "storage/corpus/corpus_tools.h"
#include "storage/corpus/data_order.h"
#include "storage/corpus/data_plan.h"

namespace py = pybind11;
namespace st = spikeguard::storage;

namespace {

[[noreturn]] void Raise(const absl::Status& s) {
  const std::string msg(s.message());
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kDataLoss:
      throw py::value_error(msg);
    case absl::StatusCode::kNotFound:
      PyErr_SetString(PyExc_FileNotFoundError, msg.c_str());
      throw py::error_already_set();
    case absl::StatusCode::kOutOfRange:
      throw py::index_error(msg);
    default:
      PyErr_SetString(PyExc_OSError, msg.c_str());
      throw py::error_already_set();
  }
}

template <typename T>
T Check(absl::StatusOr<T> v) {
  if (!v.ok()) Raise(v.status());
  return *std::move(v);
}

// A numpy array that owns `v` (no copy).
template <typename T>
py::array_t<T> OwningArray(std::vector<T>&& v, std::vector<py::ssize_t> shape) {
  auto* owned = new std::vector<T>(std::move(v));
  py::capsule free_when_done(owned, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>(shape, owned->data(), free_when_done);
}

// The slot of the global batch each row of `b` fills. Batches of a plan
// without masks hold every slot in order; Batch::sample_slots (when this
// build's library has it) says which slots a masked batch kept.
template <typename B>
std::vector<int32_t> SlotsOf(const B& b) {
  if constexpr (requires { b.sample_slots; }) {
    if (static_cast<int32_t>(b.sample_slots.size()) == b.batch_size) {
      return std::vector<int32_t>(b.sample_slots.begin(), b.sample_slots.end());
    }
  }
  std::vector<int32_t> slots(b.batch_size);
  for (int32_t i = 0; i < b.batch_size; ++i) slots[i] = i;
  return slots;
}

// DataPlan from ranges and sample masks (the proto DataPlan's content), as
// the reference worker builds it from a REWIND command: FromRanges, then
// WithMask per mask. Masks need a library that has them.
template <typename Plan = st::DataPlan>
std::string PlanFromParts(const std::vector<std::pair<int64_t, int64_t>>& ranges,
                          const std::vector<std::pair<int64_t, std::vector<int32_t>>>& masks) {
  std::vector<st::PositionRange> rs;
  for (const auto& [b, e] : ranges) rs.push_back(st::PositionRange{b, e});
  Plan plan = Check(Plan::FromRanges(rs));
  if constexpr (requires(Plan p) { p.WithMask(int64_t{0}, std::vector<int32_t>{}); }) {
    for (const auto& [position, slots] : masks) plan = Check(plan.WithMask(position, slots));
  } else {
    if (!masks.empty()) throw py::value_error("this build's data plan has no sample masks");
  }
  return plan.ToString();
}

class PyCorpus {
 public:
  static std::shared_ptr<PyCorpus> Open(const std::string& dir) {
    absl::StatusOr<std::unique_ptr<st::Corpus>> c;
    {
      py::gil_scoped_release release;  // the fingerprint reads every byte once
      c = st::Corpus::Open(dir);
    }
    if (!c.ok()) Raise(c.status());
    auto out = std::make_shared<PyCorpus>();
    out->dir = dir;
    out->corpus = *std::move(c);
    return out;
  }

  std::string dir;
  std::unique_ptr<st::Corpus> corpus;
};

py::dict ManifestDict(const st::Manifest& m) {
  py::dict d;
  d["dataset_fingerprint"] = m.dataset_fingerprint;
  d["seed"] = m.seed;
  d["global_batch_size"] = m.global_batch_size;
  d["sequence_length"] = m.sequence_length;
  d["blend"] = m.blend;
  d["plan"] = m.plan.ToString();
  return d;
}

py::dict ReadMetadata(const std::string& dir) {
  st::CorpusMetadata meta = Check(st::ReadCorpusMetadata(dir));
  py::dict d;
  d["fingerprint"] = meta.fingerprint;
  d["default_manifest"] = ManifestDict(meta.default_manifest);
  py::list domains;
  for (const auto& dom : meta.domains) {
    py::dict x;
    x["name"] = dom.name;
    x["documents"] = dom.documents;
    x["tokens"] = dom.tokens;
    x["weight"] = dom.weight;
    domains.append(x);
  }
  d["domains"] = domains;
  py::list poisons;
  for (const auto& p : meta.poisons) {
    py::dict x;
    x["kind"] = std::string(st::PoisonKindName(p.kind));
    x["position"] = p.position;
    py::list docs, echoes;
    for (const auto& id : p.documents) docs.append(py::make_tuple(id.domain, id.document));
    for (const auto& id : p.echoes) echoes.append(py::make_tuple(id.domain, id.document));
    x["documents"] = docs;
    x["echoes"] = echoes;
    poisons.append(x);
  }
  d["poisons"] = poisons;
  return d;
}

class PyDataOrder {
 public:
  PyDataOrder(std::shared_ptr<PyCorpus> corpus, const std::string& fingerprint, uint64_t seed,
              int32_t global_batch_size, int32_t sequence_length,
              const std::map<std::string, double>& blend, const std::string& plan_text)
      : corpus_(std::move(corpus)) {
    st::Manifest m;
    m.dataset_fingerprint = fingerprint;
    m.seed = seed;
    m.global_batch_size = global_batch_size;
    m.sequence_length = sequence_length;
    m.blend = blend;
    m.plan = Check(st::DataPlan::Parse(plan_text));
    order_ = Check(st::DataOrder::Create(*corpus_->corpus, std::move(m)));
  }

  int64_t PositionForStep(int64_t step) const { return Check(order_->PositionForStep(step)); }

  // (position, rows, sample_tokens, tokens [rows, T+1] uint8, domains [rows]
  // int32, slots [rows] int32)
  py::tuple Materialize(int64_t position) const {
    absl::StatusOr<st::Batch> b;
    {
      py::gil_scoped_release release;
      b = order_->Materialize(position);
    }
    if (!b.ok()) Raise(b.status());
    std::vector<int32_t> slots = SlotsOf(*b);
    const py::ssize_t rows = b->batch_size, cols = b->sample_tokens;
    if (b->tokens.size() != static_cast<size_t>(rows * cols) ||
        b->sample_domain.size() != static_cast<size_t>(rows)) {
      throw std::runtime_error("spikeguard._corpus: Materialize returned a malformed batch");
    }
    return py::make_tuple(b->position, b->batch_size, b->sample_tokens,
                          OwningArray(std::move(b->tokens), {rows, cols}),
                          OwningArray(std::move(b->sample_domain), {rows}),
                          OwningArray(std::move(slots), {rows}));
  }

  std::vector<std::pair<std::string, int64_t>> DocumentsAt(int64_t position) const {
    absl::StatusOr<std::vector<st::DocumentId>> docs;
    {
      py::gil_scoped_release release;
      docs = order_->DocumentsAt(position);
    }
    if (!docs.ok()) Raise(docs.status());
    std::vector<std::pair<std::string, int64_t>> out;
    out.reserve(docs->size());
    for (const auto& d : *docs) out.emplace_back(d.domain, d.document);
    return out;
  }

  // Per sample slot: (domain index, domain sample k, [(domain index,
  // document, offset, length, epoch), ...]).
  py::list Resolve(int64_t position) const {
    absl::StatusOr<st::BatchRef> ref;
    {
      py::gil_scoped_release release;
      ref = order_->Resolve(position);
    }
    if (!ref.ok()) Raise(ref.status());
    py::list samples;
    for (const auto& s : ref->samples) {
      py::list spans;
      for (const auto& sp : s.spans) {
        spans.append(py::make_tuple(sp.domain, sp.document, sp.offset, sp.length, sp.epoch));
      }
      samples.append(py::make_tuple(s.domain, s.domain_sample, spans));
    }
    return samples;
  }

  std::string Plan() const { return order_->manifest().plan.ToString(); }
  int64_t StepCount() const { return order_->manifest().plan.StepCount(); }
  py::dict Manifest() const { return ManifestDict(order_->manifest()); }
  std::vector<int32_t> Slots() const { return order_->slots_per_domain(); }

 private:
  std::shared_ptr<PyCorpus> corpus_;  // outlives order_
  std::unique_ptr<st::DataOrder> order_;
};

}  // namespace

PYBIND11_MODULE(_corpus, m) {
  m.doc() = "spikeguard's C++ corpus library (storage/corpus): corpus, data plan, data order";

  py::class_<PyCorpus, std::shared_ptr<PyCorpus>>(m, "Corpus")
      .def_static("open", &PyCorpus::Open, py::arg("dir"),
                  "Opens every <domain>.idx/.bin pair of a directory (Corpus::Open).")
      .def_readonly("dir", &PyCorpus::dir)
      .def_property_readonly("domain_names",
                             [](const PyCorpus& c) { return c.corpus->domain_names(); })
      .def_property_readonly("fingerprint",
                             [](const PyCorpus& c) { return c.corpus->fingerprint(); })
      .def("num_documents",
           [](const PyCorpus& c, int d) {
             if (d < 0 || d >= c.corpus->num_domains()) throw py::index_error("no such domain");
             return c.corpus->domain(d).num_documents();
           })
      .def("num_tokens",
           [](const PyCorpus& c, int d) {
             if (d < 0 || d >= c.corpus->num_domains()) throw py::index_error("no such domain");
             return c.corpus->domain(d).num_tokens();
           })
      .def("domain_index",
           [](const PyCorpus& c, const std::string& name) {
             return Check(c.corpus->DomainIndex(name));
           })
      .def("document_bytes", [](const PyCorpus& c, const std::string& domain, int64_t doc) {
        const int d = Check(c.corpus->DomainIndex(domain));
        const st::IndexedDataset& ds = c.corpus->domain(d);
        if (doc < 0 || doc >= ds.num_documents()) {
          throw py::index_error("domain '" + domain + "' has no document " + std::to_string(doc));
        }
        return py::bytes(Check(ds.DocumentBytes(doc)));
      });

  py::class_<PyDataOrder>(m, "DataOrder")
      .def(py::init<std::shared_ptr<PyCorpus>, const std::string&, uint64_t, int32_t, int32_t,
                    const std::map<std::string, double>&, const std::string&>(),
           py::arg("corpus"), py::arg("fingerprint"), py::arg("seed"),
           py::arg("global_batch_size"), py::arg("sequence_length"), py::arg("blend"),
           py::arg("plan"))
      .def("position_for_step", &PyDataOrder::PositionForStep, py::arg("step"))
      .def("materialize", &PyDataOrder::Materialize, py::arg("position"))
      .def("documents_at", &PyDataOrder::DocumentsAt, py::arg("position"))
      .def("resolve", &PyDataOrder::Resolve, py::arg("position"))
      .def_property_readonly("plan", &PyDataOrder::Plan)
      .def_property_readonly("step_count", &PyDataOrder::StepCount)
      .def_property_readonly("manifest", &PyDataOrder::Manifest)
      .def_property_readonly("slots_per_domain", &PyDataOrder::Slots);

  m.def("read_metadata", &ReadMetadata, py::arg("dir"),
        "corpus.meta of a corpus directory (ReadCorpusMetadata) as a dict.");
  m.def(
      "normalize_plan",
      [](const std::string& text) { return Check(st::DataPlan::Parse(text)).ToString(); },
      py::arg("text"), "DataPlan::Parse(text).ToString(); ValueError for a bad plan.");
  m.def("plan_from_parts", &PlanFromParts<>, py::arg("ranges"), py::arg("masks"),
        "Text form of the plan with `ranges` [(begin, end)], end -1 = unbounded, and sample "
        "`masks` [(position, [slot, ...])]; ValueError for a bad plan.");
  m.attr("METADATA_FILE") = std::string(st::kCorpusMetadataFile);
}
