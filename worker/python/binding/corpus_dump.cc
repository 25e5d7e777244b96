// spikeguard-corpus-dump: prints what the C++ data order feeds at given steps,
// for tests/python/test_data.py to compare the Python binding against a path
// that does not go through it. Test tool only; not installed.
//
//   spikeguard-corpus-dump DIR PLAN STEP...        (PLAN "" = corpus.meta's)
//
// The manifest is built exactly as the reference worker builds it: corpus.meta's
// default manifest, the corpus fingerprint, the plan parsed from its text.
// Per step:
//   step S position P rows R
//   docs DOMAIN:DOC ...
//   row DOMAIN_INDEX HEX_TOKENS              (R lines, in batch order)
#include <cstdio>
#include <iostream>
#include <string>

#include "absl/strings/numbers.h"
#include "storage/corpus/corpus.h"
#include "storage/corpus/corpus_tools.h"
#include "storage/corpus/data_order.h"

namespace st = spikeguard::storage;

namespace {

int Fail(const absl::Status& s) {
  std::cerr << "spikeguard-corpus-dump: " << s << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: spikeguard-corpus-dump DIR PLAN STEP...\n";
    return 2;
  }
  const std::string dir = argv[1], plan_text = argv[2];
  auto corpus = st::Corpus::Open(dir);
  if (!corpus.ok()) return Fail(corpus.status());
  auto meta = st::ReadCorpusMetadata(dir);
  if (!meta.ok()) return Fail(meta.status());
  st::Manifest m = meta->default_manifest;
  m.dataset_fingerprint = (*corpus)->fingerprint();
  if (!plan_text.empty()) {
    auto plan = st::DataPlan::Parse(plan_text);
    if (!plan.ok()) return Fail(plan.status());
    m.plan = *plan;
  }
  auto order = st::DataOrder::Create(**corpus, m);
  if (!order.ok()) return Fail(order.status());
  static const char kHex[] = "0123456789abcdef";
  for (int i = 3; i < argc; ++i) {
    int64_t step = 0;
    if (!absl::SimpleAtoi(argv[i], &step)) {
      std::cerr << "not a step: " << argv[i] << "\n";
      return 2;
    }
    auto pos = (*order)->PositionForStep(step);
    if (!pos.ok()) return Fail(pos.status());
    auto batch = (*order)->Materialize(*pos);
    if (!batch.ok()) return Fail(batch.status());
    auto docs = (*order)->DocumentsAt(*pos);
    if (!docs.ok()) return Fail(docs.status());
    std::cout << "step " << step << " position " << *pos << " rows " << batch->batch_size << "\n";
    std::cout << "docs";
    for (const auto& d : *docs) std::cout << " " << d.domain << ":" << d.document;
    std::cout << "\n";
    for (int32_t r = 0; r < batch->batch_size; ++r) {
      std::string hex;
      const uint8_t* row = batch->tokens.data() + static_cast<size_t>(r) * batch->sample_tokens;
      for (int32_t t = 0; t < batch->sample_tokens; ++t) {
        hex.push_back(kHex[row[t] >> 4]);
        hex.push_back(kHex[row[t] & 15]);
      }
      std::cout << "row " << batch->sample_domain[r] << " " << hex << "\n";
    }
  }
  return 0;
}
