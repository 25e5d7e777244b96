// Each CPU kernel against a plain double-precision reference.
#include <atomic>
#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/thread_pool.h"

namespace spikeguard::kernels {
namespace {

std::vector<float> Fill(size_t n, float phase, float scale = 1.0f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * std::sin(0.61f * static_cast<float>(i) + phase);
  return v;
}

TEST(CpuBackendTest, AttentionForwardMatchesReference) {
  auto be = MakeCpuBackend(2);
  for (float cap : {0.0f, 1.5f}) {
    const AttentionShape s{.batch = 2, .heads = 3, .seq = 9, .head_dim = 5, .scale = 0.7f, .softcap = cap};
    const size_t n = 2 * 3 * 9 * 5;
    const std::vector<float> q = Fill(n, 0.1f, 2.0f), k = Fill(n, 0.5f, 2.0f), v = Fill(n, 0.9f);
    std::vector<float> out(n), logits(2 * 3 * 9 * 9), probs(logits.size()), row_max(2 * 3 * 9);
    be->AttentionForward(out.data(), logits.data(), probs.data(), row_max.data(), q.data(), k.data(), v.data(), s);
    for (int pair = 0; pair < 6; ++pair) {
      for (int t = 0; t < 9; ++t) {
        std::vector<double> z(t + 1);
        double mx = -1e300;
        for (int j = 0; j <= t; ++j) {
          double dot = 0;
          for (int d = 0; d < 5; ++d) dot += q[(pair * 9 + t) * 5 + d] * k[(pair * 9 + j) * 5 + d];
          z[j] = dot * 0.7;
          if (cap > 0) z[j] = cap * std::tanh(z[j] / cap);
          mx = std::max(mx, z[j]);
        }
        EXPECT_NEAR(row_max[pair * 9 + t], mx, 1e-5);
        double sum = 0;
        for (double& e : z) sum += (e = std::exp(e - mx));
        for (int d = 0; d < 5; ++d) {
          double o = 0;
          for (int j = 0; j <= t; ++j) o += z[j] / sum * v[(pair * 9 + j) * 5 + d];
          EXPECT_NEAR(out[(pair * 9 + t) * 5 + d], o, 1e-5) << "pair " << pair << " t " << t << " cap " << cap;
        }
      }
    }
  }
}

TEST(CpuBackendTest, CrossEntropyMatchesReference) {
  auto be = MakeCpuBackend(1);
  const int rows = 5, vocab = 37;
  const std::vector<float> logits = Fill(rows * vocab, 0.3f, 4.0f);
  const std::vector<int32_t> targets = {0, 36, 5, 17, 3};
  std::vector<float> loss(rows), lse(rows), dl(rows * vocab);
  be->SoftmaxCrossEntropy(dl.data(), loss.data(), lse.data(), logits.data(), targets.data(), rows, vocab, 0, 0, 1);
  for (int r = 0; r < rows; ++r) {
    double mx = -1e300, sum = 0;
    for (int i = 0; i < vocab; ++i) mx = std::max<double>(mx, logits[r * vocab + i]);
    for (int i = 0; i < vocab; ++i) sum += std::exp(logits[r * vocab + i] - mx);
    const double ref_lse = mx + std::log(sum);
    EXPECT_NEAR(lse[r], ref_lse, 1e-5);
    EXPECT_NEAR(loss[r], ref_lse - logits[r * vocab + targets[r]], 1e-5);
    for (int i = 0; i < vocab; ++i) {
      const double p = std::exp(logits[r * vocab + i] - ref_lse);
      EXPECT_NEAR(dl[r * vocab + i], p - (i == targets[r] ? 1 : 0), 1e-6);
    }
  }
}

TEST(CpuBackendTest, LayerNormAndGeluMatchReference) {
  auto be = MakeCpuBackend(2);
  const int rows = 4, dim = 37;
  const std::vector<float> x = Fill(rows * dim, 0.2f, 3.0f), g = Fill(dim, 1.0f), b = Fill(dim, 2.0f);
  std::vector<float> y(rows * dim), mean(rows), rstd(rows);
  be->LayerNormForward(y.data(), mean.data(), rstd.data(), x.data(), g.data(), b.data(), rows, dim);
  for (int r = 0; r < rows; ++r) {
    double mu = 0, var = 0;
    for (int i = 0; i < dim; ++i) mu += x[r * dim + i];
    mu /= dim;
    for (int i = 0; i < dim; ++i) var += (x[r * dim + i] - mu) * (x[r * dim + i] - mu);
    var /= dim;
    for (int i = 0; i < dim; ++i) {
      EXPECT_NEAR(y[r * dim + i], (x[r * dim + i] - mu) / std::sqrt(var + 1e-5) * g[i] + b[i], 1e-5);
    }
  }
  std::vector<float> gx(x.size());
  be->GeluForward(gx.data(), x.data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    EXPECT_NEAR(gx[i], 0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))), 1e-6);
  }
}

TEST(CpuBackendTest, Fp16OverflowTurnsLargeValuesIntoInfinity) {
  auto be = MakeCpuBackend(1);
  std::vector<float> x = {65504.0f, 65505.0f, -70000.0f, 1.0f, -65504.0f};
  be->Fp16Overflow(x.data(), x.size());
  EXPECT_EQ(x[0], 65504.0f);
  EXPECT_TRUE(std::isinf(x[1]) && x[1] > 0);
  EXPECT_TRUE(std::isinf(x[2]) && x[2] < 0);
  EXPECT_EQ(x[3], 1.0f);
  EXPECT_EQ(x[4], -65504.0f);
  EXPECT_EQ(be->CountNonFinite(x.data(), x.size()), 2);
}

}  // namespace
}  // namespace spikeguard::kernels

namespace spikeguard::kernels {
namespace {

TEST(ThreadPoolTest, RunsEveryTaskExactlyOnce) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t tasks : {0, 1, 7, 1000}) {
      std::vector<std::atomic<int>> hits(tasks);
      pool.ParallelFor(tasks, [&](int64_t t, int tid) {
        ASSERT_GE(tid, 0);
        ASSERT_LT(tid, threads);
        hits[t].fetch_add(1);
      });
      for (int64_t t = 0; t < tasks; ++t) EXPECT_EQ(hits[t].load(), 1) << "task " << t << " threads " << threads;
    }
  }
}

}  // namespace
}  // namespace spikeguard::kernels
