// Trains the reference model on synthetic ASCII text (prose, code-like lines,
// number tables; bytes >= 128 never occur) and prints the telemetry that the
// detectors watch, to find configurations that spike or overflow. Not a test.
//
//   spikeguard_kernels_experiment lr=0.015 warmup=100 beta2=0.999 steps=2000
//   spikeguard_kernels_experiment lr=0.015 warmup=100 beta2=0.999 qk_norm=1
//   spikeguard_kernels_experiment fp16=1 lr=0.03 init_std=0.2
//
// Keys: lr warmup beta2 eps clip qk_norm fp16 init_std steps every threads
// batch seq layers width heads seed z_loss.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "base/splitmix64.h"
#include "kernels/trainer.h"

namespace spikeguard::kernels {
namespace {

uint64_t Mix(uint64_t x) { return SplitMix64Hash(x); }

// About `bytes` of text mixing three styles, the same on every run.
std::string SyntheticText(size_t bytes, uint64_t seed) {
  static const char* kWords[] = {
      "the",    "of",     "and",      "to",         "in",     "is",     "that",      "for",        "it",     "as",
      "was",    "with",   "be",       "by",         "on",     "not",    "he",        "this",       "are",    "or",
      "his",    "from",   "at",       "which",      "but",    "have",   "an",        "had",        "they",   "you",
      "were",   "their",  "one",      "all",        "we",     "can",    "her",       "has",        "there",  "been",
      "if",     "more",   "when",     "will",       "would",  "who",    "so",        "no",         "model",  "training",
      "loss",   "spike",  "gradient", "checkpoint", "batch",  "layer",  "attention", "supervisor", "replay", "data",
      "order",  "step",   "river",    "mountain",   "window", "garden", "history",   "question",   "answer", "number",
      "system", "people", "water",    "light",      "music",  "paper"};
  static const char* kIdents[] = {"x",    "y",     "i",      "n",     "count", "total", "buf", "len",
                                  "node", "value", "result", "index", "size",  "ptr",   "key"};
  static const char* kTypes[] = {"int", "float", "double", "size_t", "auto", "char*"};
  std::string out;
  uint64_t s = seed;
  auto next = [&](uint64_t n) { return Mix(s++) % n; };
  const size_t nw = sizeof(kWords) / sizeof(kWords[0]), ni = sizeof(kIdents) / sizeof(kIdents[0]);
  while (out.size() < bytes) {
    switch (next(3)) {
      case 0: {  // a paragraph of prose
        const int sentences = 2 + static_cast<int>(next(4));
        for (int k = 0; k < sentences; ++k) {
          const int words = 5 + static_cast<int>(next(10));
          for (int w = 0; w < words; ++w) {
            std::string word = kWords[next(nw)];
            if (w == 0) word[0] = static_cast<char>(word[0] - 'a' + 'A');
            out += word;
            out += w + 1 == words ? (next(5) == 0 ? "? " : ". ") : (next(9) == 0 ? ", " : " ");
          }
        }
        out += "\n\n";
        break;
      }
      case 1: {  // a small function
        out += std::string(kTypes[next(6)]) + " " + kIdents[next(ni)] + "_" + std::to_string(next(100)) + "(" +
               kTypes[next(6)] + " " + kIdents[next(ni)] + ") {\n";
        const int lines = 2 + static_cast<int>(next(5));
        for (int l = 0; l < lines; ++l) {
          out += "  ";
          switch (next(3)) {
            case 0:
              out += std::string(kIdents[next(ni)]) + " += " + kIdents[next(ni)] + " * " + std::to_string(next(16)) +
                     ";\n";
              break;
            case 1:
              out += std::string("if (") + kIdents[next(ni)] + " > " + std::to_string(next(1000)) + ") return " +
                     kIdents[next(ni)] + ";\n";
              break;
            default:
              out += std::string("for (int i = 0; i < ") + kIdents[next(ni)] + "; ++i) " + kIdents[next(ni)] +
                     "[i] = 0;\n";
              break;
          }
        }
        out += "}\n\n";
        break;
      }
      default: {  // a table of numbers
        const int rows = 2 + static_cast<int>(next(5));
        for (int r = 0; r < rows; ++r) {
          out += std::to_string(next(10000)) + "\t" + std::to_string(next(100)) + "." + std::to_string(next(100)) +
                 "\t" + std::to_string(static_cast<int64_t>(next(2000000)) - 1000000) + "\n";
        }
        out += "\n";
        break;
      }
    }
  }
  out.resize(bytes);
  return out;
}

Batch MakeBatch(const std::string& text, int batch, int seq, int64_t step) {
  Batch b;
  b.batch_size = batch;
  b.seq_len = seq;
  for (int i = 0; i < batch; ++i) {
    const size_t start = Mix(static_cast<uint64_t>(step) * 1000 + i) % (text.size() - seq - 1);
    for (int t = 0; t <= seq; ++t) b.tokens.push_back(static_cast<uint8_t>(text[start + t]));
  }
  return b;
}

double Median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

struct RobustStats {
  double median, scale;  // scale = 1.4826·MAD, floored
};

// Median and MAD of the last `w` values of `x`.
RobustStats Robust(const std::vector<double>& x, size_t w) {
  std::vector<double> tail(x.end() - static_cast<std::ptrdiff_t>(w), x.end());
  const double med = Median(tail);
  for (double& v : tail) v = std::fabs(v - med);
  return {med, std::max(1.4826 * Median(tail), 1e-9)};
}

int Run(std::map<std::string, double> a) {
  auto get = [&](const char* k, double d) { return a.count(k) ? a[k] : d; };
  ModelConfig model;
  model.layers = static_cast<int>(get("layers", 4));
  model.width = static_cast<int>(get("width", 128));
  model.heads = static_cast<int>(get("heads", 4));
  model.context = static_cast<int>(get("seq", 64));
  model.qk_norm = get("qk_norm", 0) != 0;
  model.fp16_emulation = get("fp16", 0) != 0;
  model.init_std = static_cast<float>(get("init_std", 0.02));
  model.z_loss = static_cast<float>(get("z_loss", 0));
  model.seed = static_cast<uint64_t>(get("seed", 1));
  OptimConfig optim;
  optim.peak_lr = static_cast<float>(get("lr", 1.5e-2));
  optim.warmup_steps = static_cast<int64_t>(get("warmup", 100));
  optim.beta2 = static_cast<float>(get("beta2", 0.999));
  optim.eps = static_cast<float>(get("eps", 1e-8));
  optim.clip_norm = static_cast<float>(get("clip", 0));
  const int64_t steps = static_cast<int64_t>(get("steps", 2000));
  const int every = static_cast<int>(get("every", 50));
  const int batch = static_cast<int>(get("batch", 16));
  Trainer trainer(model, optim, static_cast<int>(get("threads", 2)));
  const std::string text = SyntheticText(4 << 20, 12345);
  std::printf("# %s lr=%g warmup=%lld beta2=%g clip=%g\n", model.Fingerprint().c_str(), optim.peak_lr,
              static_cast<long long>(optim.warmup_steps), optim.beta2, optim.clip_norm);
  std::printf("# step loss grad_norm max_attn_logit(max over layers) lse_max nonfinite ms/step\n");
  std::vector<double> losses, norms;
  int spikes = 0, grad_spikes = 0;
  int64_t first_nonfinite = -1;
  double worst_logit = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t s = 0; s < steps; ++s) {
    const StepTelemetry t = trainer.Step(MakeBatch(text, batch, model.context, s), s);
    double logit = 0;
    for (const LayerTelemetry& l : t.layers) logit = std::max(logit, l.max_attn_logit);
    worst_logit = std::max(worst_logit, logit);
    if (t.nonfinite_count > 0 && first_nonfinite < 0) first_nonfinite = s;
    // Spike as the daemon sees it (spike_detector.h): robust z-score against the
    // trailing 128 steps (median, MAD), threshold 6, and at least 5 % above
    // the median; the same on the grad norm.
    const bool finite = std::isfinite(t.loss) && std::isfinite(t.grad_norm);
    if (finite && losses.size() >= 64) {
      const size_t w = std::min<size_t>(128, losses.size());
      const RobustStats l = Robust(losses, w), g = Robust(norms, w);
      const double zl = (t.loss - l.median) / l.scale, zg = (t.grad_norm - g.median) / g.scale;
      if (zl > 6 && t.loss > 1.05 * l.median) {
        ++spikes;
        std::printf("SPIKE step %lld loss %.4f median %.4f (+%.0f %%, z %.1f) max_logit %.4g\n",
                    static_cast<long long>(s), t.loss, l.median, 100 * (t.loss / l.median - 1), zl, logit);
      }
      if (zg > 6 && t.grad_norm > 1.05 * g.median) {
        ++grad_spikes;
        if (zg > 20) {
          std::printf("GRAD-SPIKE step %lld grad_norm %.3g median %.3g (x%.1f, z %.0f)\n", static_cast<long long>(s),
                      t.grad_norm, g.median, t.grad_norm / g.median, zg);
        }
      }
    }
    if (finite) {  // a non-finite step is counted above, not put in the windows
      losses.push_back(t.loss);
      norms.push_back(t.grad_norm);
    }
    if (s % every == 0 || s + 1 == steps) {
      const double ms = 1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / (s + 1);
      std::printf("%6lld %8.4f %10.4g %10.4g %8.3f %6lld %6.1f\n", static_cast<long long>(s), t.loss, t.grad_norm,
                  logit, t.lse_max, static_cast<long long>(t.nonfinite_count), ms);
      std::fflush(stdout);
    }
  }
  const double final_median =
      losses.empty() ? std::nan("") : Robust(losses, std::min<size_t>(128, losses.size())).median;
  std::printf(
      "# summary: median loss of the last 128 steps %.4f, worst max_attn_logit %.4g, loss spikes %d, grad-norm "
      "spikes %d, first non-finite step %lld\n",
      final_median, worst_logit, spikes, grad_spikes, static_cast<long long>(first_nonfinite));
  return 0;
}

}  // namespace
}  // namespace spikeguard::kernels

int main(int argc, char** argv) {
  std::map<std::string, double> args;
  for (int i = 1; i < argc; ++i) {
    const char* eq = std::strchr(argv[i], '=');
    if (eq == nullptr) {
      std::fprintf(stderr, "usage: %s key=value ...\n", argv[0]);
      return 2;
    }
    args[std::string(argv[i], static_cast<size_t>(eq - argv[i]))] = std::atof(eq + 1);
  }
  return spikeguard::kernels::Run(args);
}
