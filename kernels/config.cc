#include "kernels/config.h"

#include "absl/strings/str_cat.h"

namespace spikeguard::kernels {

absl::Status ModelConfig::Validate() const {
  if (vocab < 1 || vocab > 256)
    return absl::InvalidArgumentError(absl::StrCat("vocab must be in [1, 256], got ", vocab));
  if (layers < 1) return absl::InvalidArgumentError(absl::StrCat("layers must be >= 1, got ", layers));
  if (heads < 1) return absl::InvalidArgumentError(absl::StrCat("heads must be >= 1, got ", heads));
  if (width < 1 || width % heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("width (", width, ") must be a positive multiple of heads (", heads, ")"));
  }
  if (context < 1) return absl::InvalidArgumentError(absl::StrCat("context must be >= 1, got ", context));
  if (z_loss < 0 || attn_softcap < 0 || logit_softcap < 0 || !(init_std > 0)) {
    return absl::InvalidArgumentError("z_loss and soft-caps must be >= 0 and init_std > 0");
  }
  return absl::OkStatus();
}

std::string ModelConfig::Fingerprint() const {
  return absl::StrCat("gpt:v", vocab, ":l", layers, ":h", heads, ":w", width, ":c", context, ":qk", qk_norm ? 1 : 0,
                      ":b", bias ? 1 : 0, ":tie", tie_embeddings ? 1 : 0, ":fp16_", fp16_emulation ? 1 : 0, ":z",
                      z_loss, ":ac", attn_softcap, ":lc", logit_softcap, ":init", init_std, ":seed", seed);
}

absl::Status OptimConfig::Validate() const {
  if (!(peak_lr >= 0)) return absl::InvalidArgumentError("peak_lr must be >= 0");
  if (warmup_steps < 0 || total_steps < 0)
    return absl::InvalidArgumentError("warmup_steps and total_steps must be >= 0");
  if (!(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1)) {
    return absl::InvalidArgumentError("beta1 and beta2 must be in [0, 1)");
  }
  if (!(eps > 0)) return absl::InvalidArgumentError("eps must be > 0");
  if (!(clip_norm >= 0) || !(weight_decay >= 0))
    return absl::InvalidArgumentError("clip_norm and weight_decay must be >= 0");
  return absl::OkStatus();
}

}  // namespace spikeguard::kernels
