// Figures for the reference model's kernels: step time with
// telemetry on and off, tokens per second, GEMM throughput. Prints; never fails
// on a time.
//
//   spikeguard_kernels_bench [steps=30] [threads=2]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <vector>

#include "kernels/backend.h"
#include "kernels/gemm.h"
#include "kernels/trainer.h"

namespace spikeguard::kernels {
namespace {

// CPU time of the whole process: on a shared machine it is a steadier measure
// of work than wall time, which also counts time spent waiting for a core.
double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Batch TextBatch(int batch, int seq, int64_t step) {
  static const char kText[] =
      "int main(int argc, char** argv) { return argc > 1 ? atoi(argv[1]) : 0; }\n"
      "The supervisor rewinds to a checkpoint, replays the batches and skips the window.\n"
      "3.14159 2.71828 1.41421 42 1024 65504\n";
  Batch b;
  b.batch_size = batch;
  b.seq_len = seq;
  const size_t n = sizeof(kText) - 1;
  for (int i = 0; i < batch; ++i) {
    const size_t start = static_cast<size_t>(step * 131 + i * 17) % n;
    for (int t = 0; t <= seq; ++t) b.tokens.push_back(static_cast<uint8_t>(kText[(start + t) % n]));
  }
  return b;
}

double MedianMs(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return 1e3 * v[v.size() / 2];
}

void BenchGemm() {
  struct Shape {
    int m, n, k;
    bool trans;
    const char* what;
  };
  const Shape shapes[] = {{1024, 384, 128, false, "qkv forward"},
                          {1024, 512, 128, false, "fc forward"},
                          {1024, 128, 512, false, "proj forward"},
                          {512, 128, 1024, true, "proj dW (Aᵀ·B)"},
                          {1024, 256, 128, false, "lm-head forward"}};
  std::printf("GEMM, one thread (FLOP = 2·m·n·k):\n");
  for (const Shape& s : shapes) {
    std::vector<float> a(static_cast<size_t>(s.m) * s.k, 0.5f), b(static_cast<size_t>(s.k) * s.n, 0.25f),
        c(static_cast<size_t>(s.m) * s.n);
    const GemmArgs g{.m = s.m,
                     .n = s.n,
                     .k = s.k,
                     .a = a.data(),
                     .lda = s.trans ? s.m : s.k,
                     .trans_a = s.trans,
                     .b = b.data(),
                     .ldb = s.n,
                     .c = c.data(),
                     .ldc = s.n};
    Gemm(g);
    std::vector<double> times;
    for (int r = 0; r < 7; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 10; ++i) Gemm(g);
      times.push_back(Seconds(t0) / 10);
    }
    std::sort(times.begin(), times.end());
    std::printf("  %-18s %4dx%4dx%4d  %7.1f GFLOP/s\n", s.what, s.m, s.n, s.k,
                2.0 * s.m * s.n * s.k / times[times.size() / 2] / 1e9);
  }
}

void BenchStep(int steps, int threads) {
  ModelConfig model;  // width 128, 4 layers, 4 heads, context 64
  OptimConfig optim;
  const int B = 16, T = 64;
  Trainer trainer(model, optim, threads);
  for (int s = 0; s < 3; ++s) trainer.Step(TextBatch(B, T, s), s);
  std::vector<double> on, off, cpu_on, cpu_off;
  for (int s = 3; s < 3 + 2 * steps; ++s) {
    const bool telemetry = s % 2 == 0;
    const Batch batch = TextBatch(B, T, s);
    const double c0 = ProcessCpuSeconds();
    const auto t0 = std::chrono::steady_clock::now();
    trainer.Step(batch, s, telemetry);
    (telemetry ? on : off).push_back(Seconds(t0));
    (telemetry ? cpu_on : cpu_off).push_back(ProcessCpuSeconds() - c0);
  }
  const double on_ms = MedianMs(on), off_ms = MedianMs(off);
  const double cpu_on_ms = MedianMs(cpu_on), cpu_off_ms = MedianMs(cpu_off);
  // Matmul FLOPs: 6 per parameter-token in the dense layers plus attention.
  const double C = model.width, L = model.layers, N = B * T;
  const double dense = 2.0 * N * (12 * C * C * L + C * model.vocab);
  const double attn = 2.0 * 2 * B * T * T * C * L;
  const double flops = 3 * (dense + attn);
  std::printf("step (width %d, %d layers, %d heads, context %d, batch %d, %d thread%s, %.2f M params):\n", model.width,
              model.layers, model.heads, T, B, threads, threads == 1 ? "" : "s", trainer.num_parameters() / 1e6);
  std::printf("  telemetry on   %7.2f ms/step (median of %d)\n", on_ms, steps);
  std::printf("  telemetry off  %7.2f ms/step\n", off_ms);
  std::printf("  on/off ratio   %7.4f  (overhead %+.2f %%)\n", on_ms / off_ms, 100 * (on_ms / off_ms - 1));
  std::printf("  CPU time       %7.2f ms/step on, %.2f off, ratio %.4f (overhead %+.2f %%)\n", cpu_on_ms, cpu_off_ms,
              cpu_on_ms / cpu_off_ms, 100 * (cpu_on_ms / cpu_off_ms - 1));
  std::printf("  tokens/s       %7.0f\n", N / (off_ms / 1e3));
  std::printf("  model GFLOP/s  %7.1f  (%.2f GFLOP/step)\n", flops / (off_ms / 1e3) / 1e9, flops / 1e9);
}

}  // namespace
}  // namespace spikeguard::kernels

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 30;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 2;
  spikeguard::kernels::BenchGemm();
  spikeguard::kernels::BenchStep(steps, threads);
  if (threads != 1) spikeguard::kernels::BenchStep(steps / 2 + 1, 1);
  return 0;
}
