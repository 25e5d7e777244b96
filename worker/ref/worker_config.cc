#include "worker/ref/worker_config.h"

#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace spikeguard::worker {
namespace {

using Setter = std::function<bool(absl::string_view, WorkerConfig*)>;

bool ParseBool(absl::string_view v, bool* out) {
  if (v == "true" || v == "1" || v == "on" || v == "yes") {
    *out = true;
    return true;
  }
  if (v == "false" || v == "0" || v == "off" || v == "no") {
    *out = false;
    return true;
  }
  return false;
}

template <typename T>
Setter Int(T WorkerConfig::*field) {
  return [field](absl::string_view v, WorkerConfig* c) {
    int64_t x;
    if (!absl::SimpleAtoi(v, &x)) return false;
    c->*field = static_cast<T>(x);
    return true;
  };
}

const std::map<std::string, Setter>& Setters() {
  static const auto* setters = new std::map<std::string, Setter>{
      {"layers", [](auto v, auto* c) { return absl::SimpleAtoi(v, &c->model.layers); }},
      {"heads", [](auto v, auto* c) { return absl::SimpleAtoi(v, &c->model.heads); }},
      {"width", [](auto v, auto* c) { return absl::SimpleAtoi(v, &c->model.width); }},
      {"context", [](auto v, auto* c) { return absl::SimpleAtoi(v, &c->model.context); }},
      {"qk_norm", [](auto v, auto* c) { return ParseBool(v, &c->model.qk_norm); }},
      {"bias", [](auto v, auto* c) { return ParseBool(v, &c->model.bias); }},
      {"tie_embeddings", [](auto v, auto* c) { return ParseBool(v, &c->model.tie_embeddings); }},
      {"fp16_emulation", [](auto v, auto* c) { return ParseBool(v, &c->model.fp16_emulation); }},
      {"z_loss", [](auto v, auto* c) { return absl::SimpleAtof(v, &c->model.z_loss); }},
      {"attn_softcap", [](auto v, auto* c) { return absl::SimpleAtof(v, &c->model.attn_softcap); }},
      {"logit_softcap", [](auto v, auto* c) { return absl::SimpleAtof(v, &c->model.logit_softcap); }},
      {"init_std", [](auto v, auto* c) { return absl::SimpleAtof(v, &c->model.init_std); }},
      {"model_seed", [](auto v, auto* c) { return absl::SimpleAtoi(v, &c->model.seed); }},
      {"peak_lr", [](auto v, auto* c) { return absl::SimpleAtof(v, &c->optim.peak_lr); }},
      {"warmup_steps", [](auto v, auto* c) { return absl::SimpleAtoi(v, &c->optim.warmup_steps); }},
      {"schedule",
       [](auto v, auto* c) {
         if (v == "constant") c->optim.schedule = kernels::OptimConfig::Schedule::kConstant;
         else if (v == "cosine") c->optim.schedule = kernels::OptimConfig::Schedule::kCosine;
         else return false;
         return true;
       }},
      {"total_steps", [](auto v, auto* c) { return absl::SimpleAtoi(v, &c->optim.total_steps); }},
      {"min_lr_ratio", [](auto v, auto* c) { return absl::SimpleAtof(v, &c->optim.min_lr_ratio); }},
      {"beta1", [](auto v, auto* c) { return absl::SimpleAtof(v, &c->optim.beta1); }},
      {"beta2", [](auto v, auto* c) { return absl::SimpleAtof(v, &c->optim.beta2); }},
      {"eps", [](auto v, auto* c) { return absl::SimpleAtof(v, &c->optim.eps); }},
      {"weight_decay", [](auto v, auto* c) { return absl::SimpleAtof(v, &c->optim.weight_decay); }},
      {"clip_norm", [](auto v, auto* c) { return absl::SimpleAtof(v, &c->optim.clip_norm); }},
      {"steps", Int(&WorkerConfig::steps)},
      {"checkpoint_every", Int(&WorkerConfig::checkpoint_every)},
      {"keep_checkpoints", Int(&WorkerConfig::keep_checkpoints)},
      {"threads", Int(&WorkerConfig::threads)},
      {"batch_size", Int(&WorkerConfig::batch_size)},
      {"seq_len", Int(&WorkerConfig::seq_len)},
      {"data_seed",
       [](auto v, auto* c) {
         c->data_seed_set = absl::SimpleAtoi(v, &c->data_seed);
         return c->data_seed_set;
       }},
  };
  return *setters;
}

}  // namespace

absl::Status ApplyConfigLine(absl::string_view key, absl::string_view value, WorkerConfig* config) {
  auto it = Setters().find(std::string(key));
  if (it == Setters().end()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown config key '", key, "'"));
  }
  if (!it->second(value, config)) {
    return absl::InvalidArgumentError(absl::StrCat("config key '", key, "': bad value '", value, "'"));
  }
  return absl::OkStatus();
}

absl::Status ApplyConfigAssignment(absl::string_view assignment, WorkerConfig* config) {
  std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(assignment, absl::MaxSplits('=', 1));
  if (kv.first.empty() || assignment.find('=') == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("expected key=value, got '", assignment, "'"));
  }
  return ApplyConfigLine(absl::StripAsciiWhitespace(kv.first), absl::StripAsciiWhitespace(kv.second),
                         config);
}

absl::Status ApplyConfigFile(const std::string& path, WorkerConfig* config) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("config file ", path, ": cannot open"));
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    absl::string_view l = line;
    if (auto hash = l.find('#'); hash != absl::string_view::npos) l = l.substr(0, hash);
    l = absl::StripAsciiWhitespace(l);
    if (l.empty()) continue;
    std::vector<absl::string_view> parts = absl::StrSplit(l, absl::ByAnyChar(" \t="), absl::SkipEmpty());
    if (parts.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": expected 'key value'"));
    }
    if (auto s = ApplyConfigLine(parts[0], parts[1], config); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

std::string DescribeConfig(const WorkerConfig& c) {
  std::ostringstream out;
  out << "model " << c.model.Fingerprint() << "\n"
      << "peak_lr " << c.optim.peak_lr << " warmup_steps " << c.optim.warmup_steps << " beta1 "
      << c.optim.beta1 << " beta2 " << c.optim.beta2 << " eps " << c.optim.eps << " clip_norm "
      << c.optim.clip_norm << " weight_decay " << c.optim.weight_decay << "\n"
      << "steps " << c.steps << " checkpoint_every " << c.checkpoint_every << " threads "
      << c.threads << "\n";
  return out.str();
}

}  // namespace spikeguard::worker
