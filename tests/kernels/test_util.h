// Shared helpers for the kernels tests: small configs and deterministic batches.
#pragma once

#include <cstdint>
#include <string>

#include "base/splitmix64.h"
#include "kernels/trainer.h"

namespace spikeguard::kernels::testing {

inline uint64_t Mix(uint64_t x) { return SplitMix64Hash(x); }

// Uniformly random tokens in [0, vocab).
inline Batch RandomBatch(int batch, int seq, int vocab, uint64_t seed, int domains = 1) {
  Batch b;
  b.batch_size = batch;
  b.seq_len = seq;
  b.tokens.resize(static_cast<size_t>(batch) * (seq + 1));
  for (size_t i = 0; i < b.tokens.size(); ++i) b.tokens[i] = static_cast<uint8_t>(Mix(seed * 1000003 + i) % vocab);
  b.num_domains = domains;
  for (int i = 0; i < batch; ++i) b.domain.push_back(i % domains);
  return b;
}

// Windows of a repeated text, starting at offsets that depend on the step.
inline Batch PatternBatch(int batch, int seq, int64_t step, const std::string& text = "the quick brown fox. ") {
  Batch b;
  b.batch_size = batch;
  b.seq_len = seq;
  for (int i = 0; i < batch; ++i) {
    const uint64_t start = Mix(step * 7919 + i) % text.size();
    for (int t = 0; t <= seq; ++t) b.tokens.push_back(static_cast<uint8_t>(text[(start + t) % text.size()]));
  }
  return b;
}

inline ModelConfig SmallModel() {
  ModelConfig m;
  m.layers = 2;
  m.heads = 2;
  m.width = 32;
  m.context = 16;
  return m;
}

}  // namespace spikeguard::kernels::testing
