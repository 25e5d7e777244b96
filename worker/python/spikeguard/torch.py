"""spikeguard.torch: fill a full StepReport from a PyTorch training step.

What a trainer adds to its loop (DDP or not):

    tel = Telemetry(model, optimizer=opt)            # finds the transformer blocks
    for step in ...:
        tel.before_step()
        logits = model(x)
        ce = tel.cross_entropy(logits, y)             # F.cross_entropy(reduction="none"), and
                                                      # the output log-sum-exp from its log-probs
        tel.losses(ce, domains=d)                     # per-token losses of this rank's rows
        (ce.sum() * world / global_tokens).backward()
        grad_norm = tel.after_backward(clip_norm=1.0) # pre-clip global norm; clips in place
        tel.before_optimizer_step()
        opt.step()
        tel.after_optimizer_step()
        client.report(tel.report(step, data_position, lr=lr))

A loop that computes its loss otherwise calls ``tel.logits(logits)`` instead
(the same statistics, at the cost of one more pass over the logits).

Per-layer statistics (LayerStats) come from the layers' own parameters and
forward hooks: residual-stream RMS leaving each layer, gradient norm
(pre-clip), update-to-weight ratio ||w_after - w_before|| / ||w_before||,
parameter norm after the update, and the max attention logit.

Max attention logit, three ways (``Telemetry.attention_kind`` says which one
a layer's number is; the wire field has no label, so the kind is also
written into the JSON lines a trainer logs):

- ``"explicit"``: the model computes attention scores itself and hands the
  scaled, masked pre-softmax scores to ``record_attention_logits(layer,
  scores)`` (or to ``attn.score_observer``, which Telemetry wires up when an
  attention module has that attribute). Exact.
- ``"exact"``: a fused-attention (SDPA) model calls ``record_qk(layer, q, k)``
  with q, k as [B, H, T, D]; Telemetry computes q·kᵀ/√D under the causal mask
  once more. Exact, at the cost of one extra score matmul per layer.
- ``"bound"``: the same ``record_qk`` call, but only an upper bound is
  computed: per head, max_i ‖q_i‖ · max_j ‖k_j‖ / √D (Cauchy-Schwarz), the
  max over heads and batch. Never below the true max; cheap (norms only).

Distributed: with an initialized process group, ``report`` makes one
all_gather of a small float64 vector per step, so the loss (and its hash),
the output log-sum-exp, the per-layer max attention logit and activation RMS
are global and bit-identical on every rank; gradient statistics are
identical because DDP already averaged the gradients. Token counts,
non-finite counts and per-domain losses stay per rank (the daemon sums and
token-weights them when it merges the ranks' reports).
"""
from __future__ import annotations

import dataclasses
import math
import struct
import time
from typing import Iterable, Optional, Sequence

import logging

import torch
import torch.distributed as dist

log = logging.getLogger("spikeguard.torch")

try:  # the generated stubs; absent only in a broken build
    from spikeguard.v1 import telemetry_pb2
except ImportError:  # pragma: no cover
    telemetry_pb2 = None

__all__ = ["Telemetry", "StagedStep", "loss_hash", "splitmix64", "discover_layers", "report_json"]

_MASK64 = (1 << 64) - 1
ATTENTION_KINDS = {
    "explicit": "exact (scores recorded by the model)",
    "exact": "exact (q·kᵀ/√d recomputed from q and k)",
    "bound": "upper bound (max‖q‖·max‖k‖/√d per head, Cauchy-Schwarz)",
    "off": "not measured",
}


@dataclasses.dataclass
class StagedStep:
    """One step's statistics kept on the device until ``Telemetry.resolve``.

    The step's tensors are kept as they are and put together only when the
    pending steps are reduced and resolved (a few operations for all of
    them instead of a few dozen per step): ``sums`` (0-d tensors) and
    ``counts`` (numbers) are summed/maxed over the ranks (``reduced``),
    ``mine`` (0-d tensors) and ``vectors`` (1-d tensors) are this rank's own
    (``local``)."""

    step: int
    position: int
    lr: float
    tokens: int
    step_time_s: float
    unix_ms: int
    documents: object
    sums: list
    counts: list
    mine: list
    vectors: list
    # The layers' activation norms (act_sq False: to be squared) or sums of
    # squares (act_sq True), summed over the ranks after `sums`.
    act: list = dataclasses.field(default_factory=list)
    act_sq: bool = True

    @property
    def reduced(self) -> "torch.Tensor":
        return _stack_steps([self], "sums", "counts")

    @property
    def local(self) -> "torch.Tensor":
        return _stack_steps([self], "mine", "vectors")


def _stack_steps(staged, scalars: str, rest: str) -> "torch.Tensor":
    """The staged steps' values as one float64 vector, step after step: each
    step's `scalars` (0-d tensors), then its `rest` (1-d tensors, or numbers
    for "counts")."""
    k = len(staged)
    f64 = torch.float64
    first = getattr(staged[0], scalars)
    head = torch.stack([x for st in staged for x in getattr(st, scalars)]).to(f64).view(k, -1)
    if rest == "counts":
        tail = torch.tensor([c for st in staged for c in st.counts], dtype=f64,
                            device=first[0].device).view(k, -1)
        if staged[0].act:
            if not any(st.act_sq for st in staged):  # the usual case: one operation
                act = torch.stack([x for st in staged for x in st.act]).to(f64).square()
            else:
                act = torch.cat([torch.stack(st.act).to(f64) if st.act_sq
                                 else torch.stack(st.act).to(f64).square() for st in staged])
            head = torch.cat([head, act.view(k, -1)], dim=1)
    else:
        parts = [x for st in staged for x in st.vectors]
        if not parts:
            return head.reshape(-1)
        tail = torch.cat(parts).to(f64).view(k, -1)
    return torch.cat([head, tail], dim=1).reshape(-1)


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def loss_hash(loss: float) -> int:
    """64-bit hash of the float64 bits of `loss` (the C++ trainer's LossHash)."""
    bits = struct.unpack("<Q", struct.pack("<d", float(loss)))[0]
    return splitmix64(bits)


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    while hasattr(model, "module") and isinstance(getattr(model, "module"), torch.nn.Module):
        model = model.module
    return model


def _attention_child(block: torch.nn.Module) -> Optional[torch.nn.Module]:
    for name, sub in block.named_modules():
        if sub is block:
            continue
        leaf = name.rsplit(".", 1)[-1].lower()
        cls = type(sub).__name__.lower()
        if leaf in ("attn", "attention", "self_attn", "self_attention") or "attention" in cls:
            return sub
    return None


def discover_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """Transformer blocks: children of a ModuleList/Sequential that hold an
    attention submodule; the container with the most such children wins."""
    model = _unwrap(model)
    best: list[tuple[str, torch.nn.Module]] = []
    for name, mod in model.named_modules():
        if not isinstance(mod, (torch.nn.ModuleList, torch.nn.Sequential)):
            continue
        found = [(f"{name}.{i}" if name else str(i), child)
                 for i, child in enumerate(mod.children()) if _attention_child(child) is not None]
        if len(found) > len(best):
            best = found
    return best


class Telemetry:
    """Per-step statistics of a PyTorch model for spikeguard's StepReport.

    model: the model (a DDP wrapper is unwrapped).
    layers: the transformer blocks, as modules or (name, module) pairs in
        order; None finds them (see ``discover_layers``).
    optimizer: unused today beyond validation; kept for the update statistics
        of optimizers that own parameters outside the model.
    attention: "explicit", "exact", "bound" or "off" (see the module doc).
    first_layer: global index of the first layer (pipeline stages own
        disjoint ranges).
    domain_names: names of the domain ids the batches carry (per-domain loss).
    group: the process group to reduce over (default: the world, when
        torch.distributed is initialized).
    update_every: the cadence of the update statistics (update-to-weight
        ratio and parameter norm of each layer), in steps: they are measured
        at the steps ``before_optimizer_step(step)`` is given a multiple of
        it (and at the first step after a start or ``forget_updates``), and
        the reports of the steps between repeat the last measurement.
        1 (the default): every step.
    """

    def __init__(self, model: torch.nn.Module, layers: Optional[Sequence] = None,
                 optimizer: Optional[torch.optim.Optimizer] = None, attention: str = "explicit",
                 *, first_layer: int = 0, domain_names: Optional[Sequence[str]] = None,
                 group=None, update_every: int = 1):
        if attention not in ATTENTION_KINDS:
            raise ValueError(f"attention={attention!r}: one of {sorted(ATTENTION_KINDS)}")
        self.model = _unwrap(model)
        self.optimizer = optimizer
        self.attention = attention
        self.attention_kind = ATTENTION_KINDS[attention]
        self.group = group
        if layers is None:
            pairs = discover_layers(self.model)
            if not pairs:
                raise ValueError("no transformer blocks found; pass layers=[...]")
        else:
            names = {id(m): n for n, m in self.model.named_modules()}
            pairs = []
            for item in layers:
                if isinstance(item, tuple):
                    pairs.append((str(item[0]), item[1]))
                else:
                    pairs.append((names.get(id(item), type(item).__name__), item))
        self.layer_names = [n for n, _ in pairs]
        self.layer_modules = [m for _, m in pairs]
        self.layer_indices = [first_layer + i for i in range(len(pairs))]
        self.domain_names = list(domain_names) if domain_names else []
        self._warned_domains = False
        self.update_every = max(1, int(update_every))
        # The last measured update statistics, repeated between measurements.
        self._held_ratio = None
        self._held_pnorm = None
        L = len(pairs)

        # Parameters: all of the model's (global grad norm) and each layer's.
        self._all_params = [p for p in self.model.parameters() if p.requires_grad]
        slot = {}
        for li, m in enumerate(self.layer_modules):
            for p in m.parameters():
                if p.requires_grad:
                    slot.setdefault(id(p), li)
        self._layer_params = [p for p in self._all_params if id(p) in slot]
        self._layer_of_layer_param = torch.tensor([slot[id(p)] for p in self._layer_params],
                                                  dtype=torch.long)
        # Bucket L collects the parameters outside the layers (embeddings, head).
        self._bucket_list = [slot.get(id(p), L) for p in self._all_params]
        self._bucket_of_param = torch.tensor(self._bucket_list,
                                             dtype=torch.long)
        self._hooks = []
        # Seconds the activation hooks took (Supervisor.timings counts them).
        self.hook_seconds = 0.0
        for li, m in enumerate(self.layer_modules):
            self._hooks.append(m.register_forward_hook(self._make_act_hook(li)))
            if attention == "explicit":
                attn = _attention_child(m)
                if attn is not None and hasattr(attn, "score_observer"):
                    attn.score_observer = self._make_score_observer(li)
        self._reset()

    # ---- lifecycle -------------------------------------------------------
    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        for m in self.layer_modules:
            attn = _attention_child(m)
            if attn is not None and getattr(attn, "score_observer", None) is not None:
                attn.score_observer = None

    def _reset(self) -> None:
        L = len(self.layer_modules)
        self._t0 = None
        self._attn_max = [None] * L        # 0-d tensors
        self._act_norms = [[] for _ in range(L)]  # L2 norm of each output (0-d)
        self._act_n = [0] * L
        self._loss_sum = None              # float64 0-d
        self._loss_tokens = 0
        self._loss_nonfinite = None
        self._dom_sum = None
        self._dom_tok = None
        self._lse_sum = None
        self._lse_n = 0
        self._lse_max = None
        self._logit_nonfinite = None
        self._grad_norm = 0.0
        self._clipped = False
        self._grad_nonfinite = 0
        self._grads = None
        self._grad_bad_t = None
        self._layer_grad_sq = None
        self._snap = None
        self._before_sq = None
        self._update_ratio = None
        self._param_norm = None

    def before_step(self) -> None:
        """Start of a training step: clears the previous step's numbers, starts the clock."""
        self._reset()
        self._t0 = time.perf_counter()

    # ---- forward ---------------------------------------------------------
    def _make_act_hook(self, li: int):
        def hook(_module, _inputs, output):
            out = output[0] if isinstance(output, (tuple, list)) else output
            if not torch.is_tensor(out) or out.numel() == 0:
                return
            t = time.perf_counter()
            # One fp32 pass (a float64 copy costs 5x as much); squared in
            # float64 with the other steps' when they are reported. Of the
            # detached output: no graph, without a no_grad context's cost.
            self._act_norms[li].append(torch.linalg.vector_norm(out.detach()))
            self._act_n[li] += out.numel()
            self.hook_seconds += time.perf_counter() - t
        return hook

    def _act_sq(self) -> list:
        """Per layer: the float64 sum of squares of this step's outputs
        (None: no output)."""
        return [None if not ns else ns[0].double().square() if len(ns) == 1
                else torch.stack(ns).double().square().sum() for ns in self._act_norms]

    def _make_score_observer(self, li: int):
        return lambda scores: self.record_attention_logits(self.layer_indices[li], scores)

    def _slot(self, layer_index: int) -> int:
        return layer_index - self.layer_indices[0]

    def _note_attn(self, li: int, value: torch.Tensor) -> None:
        prev = self._attn_max[li]
        self._attn_max[li] = value if prev is None else torch.maximum(prev, value)

    def record_attention_logits(self, layer_index: int, scores: torch.Tensor) -> None:
        """Exact max of the scaled pre-softmax scores of a layer (global index);
        masked entries must be -inf. Several calls in a step (micro-batches)
        keep the max."""
        if self.attention == "off" or scores.numel() == 0:
            return
        with torch.no_grad():
            self._note_attn(self._slot(layer_index), scores.detach().amax().float())

    def record_qk(self, layer_index: int, q: torch.Tensor, k: torch.Tensor, *,
                  scale: Optional[float] = None, causal: bool = True) -> None:
        """For fused attention: q, k as [B, H, T, D] (after any QK-norm/rotary).
        attention="exact" recomputes the scores; "bound" records the
        Cauchy-Schwarz bound max‖q‖·max‖k‖·scale per head (labelled a bound)."""
        if self.attention == "off" or q.numel() == 0:
            return
        scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
        with torch.no_grad():
            q = q.detach().float()
            k = k.detach().float()
            if self.attention == "bound":
                qn = q.norm(dim=-1).amax(dim=-1)      # [B, H]
                kn = k.norm(dim=-1).amax(dim=-1)
                value = (qn * kn).amax() * scale
            else:
                s = (q @ k.transpose(-2, -1)) * scale
                if causal:
                    Tq, Tk = s.shape[-2], s.shape[-1]
                    keep = torch.ones(Tq, Tk, dtype=torch.bool, device=s.device).tril(Tk - Tq)
                    s = s.masked_fill(~keep, float("-inf"))
                value = s.amax()
        self._note_attn(self._slot(layer_index), value)

    def logits(self, logits: torch.Tensor) -> None:
        """Output logits [..., V]: log-sum-exp mean/max and non-finite logits."""
        if logits.numel() == 0:
            return
        with torch.no_grad():
            x = logits.detach().reshape(-1, logits.size(-1)).float()
            self._note_lse(torch.logsumexp(x, dim=-1), x)

    def cross_entropy(self, logits: torch.Tensor, targets: torch.Tensor, *,
                      ignore_index: int = -100) -> torch.Tensor:
        """Per-token cross-entropy of logits [..., V] against targets [...]
        (``F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1),
        reduction="none")`` reshaped to targets' shape: the same two
        operations, log-softmax then NLL, so the same values and gradients),
        recording what ``logits`` records. The log-sum-exp comes from the
        log-probabilities the loss computes anyway: lse = logit[t] -
        log_prob[t] at each row's target t, a gather instead of a second
        pass over the logits with an exp per entry."""
        V = logits.size(-1)
        x = logits.reshape(-1, V)
        y = targets.reshape(-1)
        logp = torch.nn.functional.log_softmax(x, dim=-1)
        ce = torch.nn.functional.nll_loss(logp, y, reduction="none", ignore_index=ignore_index)
        self.log_probs(x, y, logp, ignore_index=ignore_index)
        return ce.view(targets.shape)

    def log_probs(self, logits: torch.Tensor, targets: torch.Tensor, log_probs: torch.Tensor,
                  *, ignore_index: int = -100) -> None:
        """What ``logits`` records, from log_softmax(logits) [rows, V] and
        the targets [rows] of logits [rows, V] (``cross_entropy``'s way)."""
        if not logits.numel():
            return
        if logits.dtype not in (torch.float32, torch.float64):
            # Log-probabilities in half precision would round the
            # log-sum-exp; the logits' own pass, in float32, does not.
            self.logits(logits)
            return
        with torch.no_grad():
            # An ignored row's target is no column; any column gives its
            # row's log-sum-exp. (Valid targets are columns, so with a
            # negative ignore_index every negative target is an ignored one.)
            y = targets
            col = (y.clamp_min(0) if ignore_index < 0 else
                   torch.where(y == ignore_index, torch.zeros_like(y), y)).unsqueeze(1)
            x = logits.detach()
            lse = (x.gather(1, col).float() - log_probs.detach().gather(1, col).float()).squeeze(1)
            self._note_lse(lse, x)

    def _note_lse(self, lse: torch.Tensor, x: torch.Tensor) -> None:
        """Adds the rows' log-sum-exp `lse` [rows] of logits `x` [rows, V]
        to the step's, and counts the non-finite logits."""
        s = lse.sum(dtype=torch.float64)
        m = lse.amax()
        if x.device.type == "cpu":
            # Reading a value costs no device round trip here, and a
            # temporary as large as the logits costs more than the
            # statistics themselves: count in full only when there is
            # something to count. A NaN or +inf logit makes its row's
            # log-sum-exp, and so their (float64) sum, non-finite; a -inf
            # logit leaves it finite but is the minimum (a NaN minimum
            # fails the test too).
            if math.isfinite(s.item()) and x.amin().item() > float("-inf"):
                bad = None
            else:
                bad = (~torch.isfinite(x)).sum()
        else:
            # Counted on the logits' device, without a host round trip.
            bad = (~torch.isfinite(x)).sum()
        self._lse_sum = s if self._lse_sum is None else self._lse_sum + s
        self._lse_max = m if self._lse_max is None else torch.maximum(self._lse_max, m)
        self._lse_n += lse.numel()
        if bad is not None:
            self._logit_nonfinite = (bad if self._logit_nonfinite is None
                                     else self._logit_nonfinite + bad)

    def losses(self, token_losses: torch.Tensor, domains: Optional[torch.Tensor] = None) -> None:
        """This rank's per-token losses [rows, T] (cross-entropy, not the
        objective) and optionally each row's domain id [rows]. The step's loss
        is their global mean (over all ranks' tokens)."""
        with torch.no_grad():
            tl = token_losses.detach()
            if tl.dim() > 1:
                rows = tl.flatten(1).sum(dim=1, dtype=torch.float64)
                per_row = tl[0].numel() if tl.size(0) else 0
            else:
                rows, per_row = tl.double(), 1
            s = rows.sum()
            self._loss_sum = s if self._loss_sum is None else self._loss_sum + s
            self._loss_tokens += tl.numel()
            # On the CPU (no round trip to read a value) the non-finite
            # losses are counted only when their float64 sum is not finite,
            # which it is exactly when one of them is not.
            if tl.device.type != "cpu" or not math.isfinite(s.item()):
                bad = (~torch.isfinite(tl)).sum()
                self._loss_nonfinite = (bad if self._loss_nonfinite is None
                                        else self._loss_nonfinite + bad)
            if domains is not None and not self.domain_names and not self._warned_domains:
                self._warned_domains = True
                log.warning("spikeguard: per-domain losses are not reported: the batch has "
                            "domain ids but Telemetry has no domain_names= (pass the names "
                            "the ids index)")
            if domains is not None and self.domain_names:
                D = len(self.domain_names)
                dev = rows.device
                d = domains.to(device=dev, dtype=torch.long).reshape(-1)
                ds = torch.zeros(D, dtype=torch.float64, device=dev).index_add_(0, d, rows)
                dt = torch.zeros(D, dtype=torch.float64, device=dev).index_add_(
                    0, d, torch.full((d.numel(),), float(per_row), dtype=torch.float64, device=dev))
                self._dom_sum = ds if self._dom_sum is None else self._dom_sum + ds
                self._dom_tok = dt if self._dom_tok is None else self._dom_tok + dt

    # ---- backward and optimizer -------------------------------------------
    def after_backward(self, clip_norm: Optional[float] = None, *, sync: bool = True):
        """Pre-clip global gradient norm (returned), per-layer gradient norms;
        with clip_norm > 0 the gradients are scaled in place to clip_norm when
        the norm exceeds it (and the norm is finite).

        sync=True returns a float (one host round trip); sync=False returns
        the norm as a 0-d tensor on the gradients' device and clips there
        (the report then reads everything in its one transfer)."""
        with torch.no_grad():
            grads = [p.grad for p in self._all_params]
            buckets = None  # the usual case: every parameter has a gradient
            if any(g is None for g in grads):
                buckets = tuple(b for g, b in zip(grads, self._bucket_list) if g is not None)
                grads = [g for g in grads if g is not None]
            if not grads:
                self._grad_norm = 0.0
                return 0.0
            dev = grads[0].device
            key = (dev, buckets)
            if getattr(self, "_bucket_key", None) != key:
                self._bucket_key = key
                self._buckets_dev = torch.tensor(
                    self._bucket_list if buckets is None else list(buckets), dtype=torch.long,
                    device=dev)
            norms = torch.stack(torch._foreach_norm(grads)).double()
            sq = norms.square()
            L = len(self.layer_modules)
            self._layer_grad_sq = torch.zeros(L + 1, dtype=torch.float64, device=dev).index_add_(
                0, self._buckets_dev, sq)[:L]
            total_t = sq.sum().sqrt()
            self._grads = grads
            if not sync:
                self._grad_norm = total_t
                # Gradient tensors holding a non-finite entry (their norm is
                # not finite): the staged report's count, without a host trip
                # (on the CPU, where reading costs none, only when the total
                # says there is one).
                cpu_total = total_t.item() if dev.type == "cpu" else None
                if cpu_total is None or not math.isfinite(cpu_total):
                    self._grad_bad_t = (~torch.isfinite(norms)).sum()
                if clip_norm is not None and clip_norm > 0 and cpu_total is not None:
                    # On the CPU: decided on the value read, one scaling of
                    # every gradient only when they are clipped.
                    self._clipped = math.isfinite(cpu_total) and cpu_total > clip_norm
                    if self._clipped:
                        torch._foreach_mul_(grads, clip_norm / cpu_total)
                elif clip_norm is not None and clip_norm > 0:
                    # clip/total where finite and above the limit, else 1.
                    ok = torch.isfinite(total_t) & (total_t > clip_norm)
                    coef = torch.where(ok, clip_norm / total_t.clamp_min(1e-30),
                                       torch.ones_like(total_t))
                    self._clipped = ok
                    c = coef.float()
                    for g in grads:
                        g.mul_(c.to(g.dtype))
                return total_t
            total = float(total_t)
            self._grad_norm = total
            if not math.isfinite(total):
                self._grad_nonfinite = int(sum(int((~torch.isfinite(g)).sum()) for g in grads))
            elif clip_norm is not None and clip_norm > 0 and total > clip_norm:
                torch._foreach_mul_(grads, clip_norm / total)
                self._clipped = True
        return total

    def before_optimizer_step(self, step: Optional[int] = None) -> None:
        """Snapshot the layers' weights (for the update-to-weight ratio), at
        the steps the cadence measures (``update_every``; `step`: the step
        the optimizer is about to take, None: measure)."""
        if not self._layer_params or not self.measures_updates(step):
            return
        with torch.no_grad():
            # One flat buffer, allocated once: the step path allocates no
            # copy of the weights.
            params = self._layer_params
            p0 = params[0]
            key = (p0.device, p0.dtype, tuple(p.numel() for p in params))
            if getattr(self, "_snap_key", None) != key:
                self._snap_key = key
                buf = torch.empty(sum(key[2]), dtype=p0.dtype, device=p0.device)
                self._snap_views = [v.view_as(p) for v, p in zip(buf.split(list(key[2])), params)]
                self._snap_flat = buf
            if all(p.dtype == p0.dtype and p.device == p0.device for p in params):
                torch.cat([p.reshape(-1) for p in params], out=self._snap_flat)
                self._snap = self._snap_views
            else:  # mixed dtypes or devices: a copy per parameter
                self._snap = torch._foreach_mul(params, 1.0)
            n = torch.stack(torch._foreach_norm(self._snap)).double()
            self._before_sq = self._layer_sums(n.square())

    def after_optimizer_step(self) -> None:
        """Update-to-weight ratio and parameter norm of each layer (at the
        steps ``before_optimizer_step`` took a snapshot)."""
        if self._snap is None:
            return
        with torch.no_grad():
            torch._foreach_sub_(self._snap, self._layer_params)  # before - after, in place
            dsq = self._layer_sums(torch.stack(torch._foreach_norm(self._snap)).double().square())
            psq = self._layer_sums(torch.stack(torch._foreach_norm(self._layer_params)).double().square())
            self._update_ratio = torch.where(self._before_sq > 0, (dsq / self._before_sq).sqrt(),
                                             torch.zeros_like(dsq))
            self._param_norm = psq.sqrt()
        self._held_ratio, self._held_pnorm = self._update_ratio, self._param_norm
        self._snap = None

    def measures_updates(self, step: Optional[int]) -> bool:
        """Whether the update statistics are measured at `step` (None: yes)."""
        return (step is None or self.update_every <= 1 or self._held_ratio is None
                or int(step) % self.update_every == 0)

    def forget_updates(self) -> None:
        """Drops the held update statistics (after a rewind or a load: they
        belong to another timeline); the next step measures them again."""
        self._held_ratio = self._held_pnorm = None

    def _update_stats(self):
        """(ratio, param norm) for this step's report: measured this step,
        else the last measurement (update_every > 1), else (None, the
        parameter norm now)."""
        if self._update_ratio is not None:
            return self._update_ratio, self._param_norm
        if self._held_ratio is not None and self.update_every > 1:
            return self._held_ratio, self._held_pnorm
        pnorm = self._param_norm
        if pnorm is None and self._layer_params:
            with torch.no_grad():
                pnorm = self._layer_sums(torch.stack(
                    torch._foreach_norm(self._layer_params)).double().square()).sqrt()
        return None, pnorm

    def _layer_sums(self, values: torch.Tensor) -> torch.Tensor:
        dev = values.device
        if self._layer_of_layer_param.device != dev:
            self._layer_of_layer_param = self._layer_of_layer_param.to(dev)
        return torch.zeros(len(self.layer_modules), dtype=torch.float64, device=dev).index_add_(
            0, self._layer_of_layer_param, values)

    # ---- the report --------------------------------------------------------
    def _world(self) -> int:
        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size(self.group)
        return 1

    def report(self, step: int, data_position: int, lr: float, *, loss: Optional[float] = None,
               tokens: Optional[int] = None, domain_losses: Optional[dict] = None,
               loss_scale: float = 1.0, extra_nonfinite: int = 0, reduce: bool = True,
               documents=None):
        """The step's StepReport. loss: pass it to override the recorded
        token losses (it is then taken as already global). domain_losses:
        {name: (loss, tokens)} to override the recorded per-domain losses.
        documents: (domain, id) pairs of this rank's part of the batch, or
        (domain, id, sample) triples naming the sample slot of the global
        batch that holds each, for a dataset not in spikeguard's format: the
        daemon names the documents of a culprit batch from them, and with
        samples it can feed the batch's samples apart (document bisect).
        One host transfer per step (after the reduction, when there is one).
        With reduce and a process group of more than one rank this is a
        collective: every rank must call it at every step."""
        L = len(self.layer_modules)
        D = len(self.domain_names)
        ninf = float("-inf")
        dev = self._device()
        f64 = torch.float64

        def t(x, default):
            if x is None:
                return torch.tensor(default, dtype=f64, device=dev)
            if torch.is_tensor(x):
                return x.detach().to(device=dev, dtype=f64).reshape(())
            return torch.tensor(float(x), dtype=f64, device=dev)

        # Everything the report needs goes to the host in one transfer: the
        # reduced statistics, then the per-rank ones.
        local = torch.stack(
            [t(self._loss_sum, 0.0), t(float(self._loss_tokens), 0.0), t(self._lse_sum, 0.0),
             t(float(self._lse_n), 0.0), t(self._lse_max, ninf)]
            + [t(a, ninf) for a in self._attn_max] + [t(a, 0.0) for a in self._act_sq()]
            + [t(float(n), 0.0) for n in self._act_n])
        world = self._world() if reduce else 1
        if world > 1:
            gathered = [torch.empty_like(local) for _ in range(world)]
            dist.all_gather(gathered, local, group=self.group)
            allv = torch.stack(gathered)          # [world, n], summed in rank order
            reduced = [allv.sum(dim=0), allv.amax(dim=0)]
        else:
            reduced = [local, local]
        n = local.numel()
        ratio_t, pnorm_t = self._update_stats()
        zeros_l = torch.zeros(L, dtype=f64, device=dev)
        per_rank = [
            t(self._grad_norm, 0.0), t(self._clipped, 0.0),
            t(self._loss_nonfinite, 0.0), t(self._logit_nonfinite, 0.0)]
        tail = [
            self._layer_grad_sq.to(dev) if self._layer_grad_sq is not None else zeros_l,
            ratio_t.to(dev) if ratio_t is not None else zeros_l,
            pnorm_t.to(dev) if pnorm_t is not None else zeros_l]
        if self._dom_sum is not None:
            tail += [self._dom_sum.to(dev), self._dom_tok.to(dev)]
        host = torch.cat(reduced + [torch.stack(per_rank)] + tail).tolist()
        sums, maxs = host[:n], host[n:2 * n]
        grad_norm, clipped, loss_bad, logit_bad = host[2 * n:2 * n + 4]
        rest = host[2 * n + 4:]
        grad_sq, ratio, pnorm = rest[:L], rest[L:2 * L], rest[2 * L:3 * L]
        dom = rest[3 * L:]
        if not math.isfinite(grad_norm) and self._grads is not None and torch.is_tensor(
                self._grad_norm):
            # The rare path: count the non-finite gradient entries.
            self._grad_nonfinite = int(sum(int((~torch.isfinite(g)).sum()) for g in self._grads))
        self._grads = None
        loss_sum, loss_tok, lse_sum, lse_n = sums[0], sums[1], sums[2], sums[3]
        lse_max = maxs[4]
        attn_g = maxs[5:5 + L]
        act_sq_g = sums[5 + L:5 + 2 * L]
        act_n_g = sums[5 + 2 * L:5 + 3 * L]

        if loss is None:
            loss = loss_sum / loss_tok if loss_tok > 0 else float("nan")
        nonfinite = int(extra_nonfinite) + self._grad_nonfinite + int(loss_bad) + int(logit_bad)
        if not math.isfinite(loss) and nonfinite == 0:
            nonfinite = 1

        r = telemetry_pb2.StepReport()
        r.step = int(step)
        r.data_position = int(data_position)
        r.loss = float(loss)
        r.grad_norm = float(grad_norm)
        r.clipped = bool(clipped)
        r.lr = float(lr)
        r.loss_scale = float(loss_scale)
        r.tokens = int(tokens if tokens is not None else self._loss_tokens)
        r.step_time_s = (time.perf_counter() - self._t0) if self._t0 is not None else 0.0
        r.lse_mean = lse_sum / lse_n if lse_n > 0 else 0.0
        r.lse_max = lse_max if lse_n > 0 else 0.0
        r.nonfinite_count = nonfinite
        r.loss_hash = loss_hash(loss)
        if domain_losses is not None:
            for name in sorted(domain_losses):
                value, ntok = domain_losses[name]
                d = r.domain_losses.add(domain=name, loss=float(value), tokens=int(ntok))
        elif dom:
            for i, name in enumerate(self.domain_names):
                ntok = dom[D + i]
                if ntok > 0:
                    r.domain_losses.add(domain=name, loss=dom[i] / ntok, tokens=int(ntok))
        for li in range(L):
            ls = r.layers.add()
            ls.layer = self.layer_indices[li]
            a = attn_g[li]
            ls.max_attn_logit = a if a != ninf else 0.0
            ls.grad_norm = math.sqrt(grad_sq[li])
            ls.update_ratio = ratio[li]
            ls.act_rms = math.sqrt(act_sq_g[li] / act_n_g[li]) if act_n_g[li] > 0 else 0.0
            ls.param_norm = pnorm[li]
        r.unix_ms = int(time.time() * 1000)
        for item in documents or ():
            d = r.documents.add()
            d.domain = str(item[0])
            d.id = int(item[1])
            if len(item) > 2 and item[2] is not None:
                d.sample = int(item[2])
        return r

    # ---- staged reports (one host transfer for several steps) ---------------
    def stage(self, step: int, data_position: int, lr: float, *, documents=None,
              tokens: Optional[int] = None) -> "StagedStep":
        """This step's statistics, still on the device, for ``resolve``:
        no host transfer and no collective here (unlike ``report``), and no
        computation either: the tensors are kept as they are. Call after the
        optimizer step (with ``after_backward(sync=False)``)."""
        dev = self._device()
        consts = getattr(self, "_consts", None)
        if consts is None or consts[0].device != dev:
            consts = (torch.zeros((), dtype=torch.float64, device=dev),
                      torch.full((), float("-inf"), dtype=torch.float64, device=dev),
                      torch.ones((), dtype=torch.float64, device=dev))
            self._consts = consts
            self._zeros_l = {}
        zero, ninf, one = consts
        L = len(self.layer_modules)
        D = len(self.domain_names)

        def v(x, default):
            return default if x is None else x

        def zeros(n):
            z = self._zeros_l.get(n)
            if z is None:
                z = self._zeros_l[n] = torch.zeros(n, dtype=torch.float64, device=dev)
            return z
        # The part summed or maxed over the ranks: tensors (the first one
        # float64, so the stack is), then counts.
        sums = ([v(self._loss_sum, zero), v(self._lse_sum, zero), v(self._lse_max, ninf)]
                + [v(a, ninf) for a in self._attn_max])
        # The activations' norms, squared (float64) when the steps are put
        # together; a layer called several times (micro-batches), or not
        # at all, gives its sum of squares now.
        norms = self._act_norms
        if all(len(ns) == 1 for ns in norms):
            act, act_sq = [ns[0] for ns in norms], False
        else:
            act, act_sq = [v(a, zero) for a in self._act_sq()], True
        counts = [float(self._loss_tokens), float(self._lse_n)] + [float(n) for n in self._act_n]
        grad_norm = self._grad_norm
        mine = [grad_norm if torch.is_tensor(grad_norm) else torch.tensor(
                    float(grad_norm), dtype=torch.float64, device=dev),
                self._clipped if torch.is_tensor(self._clipped) else
                (one if self._clipped else zero),
                v(self._loss_nonfinite, zero), v(self._logit_nonfinite, zero),
                v(self._grad_bad_t, zero)]
        ratio, pnorm = self._update_stats()
        vectors = [self._layer_grad_sq if self._layer_grad_sq is not None else zeros(L),
                   ratio if ratio is not None else zeros(L),
                   pnorm if pnorm is not None else zeros(L)]
        if D:
            vectors += [self._dom_sum if self._dom_sum is not None else zeros(D),
                        self._dom_tok if self._dom_tok is not None else zeros(D)]
        self._grads = None
        return StagedStep(step=int(step), position=int(data_position), lr=float(lr),
                          tokens=int(tokens if tokens is not None else self._loss_tokens),
                          step_time_s=(time.perf_counter() - self._t0) if self._t0 else 0.0,
                          unix_ms=int(time.time() * 1000), documents=documents,
                          sums=sums, counts=counts, mine=mine, vectors=vectors, act=act,
                          act_sq=act_sq)

    def resolve(self, staged: Sequence["StagedStep"], gathered: Optional[torch.Tensor] = None,
                host: Optional[list] = None) -> list:
        """StepReports of staged steps, in one host transfer. gathered: every
        rank's ``reduced`` vectors, [world, len(staged) * n] in rank order
        (``reduced_of(staged)`` gathered over the ranks); None: this rank's
        own (one process, or values that stay per rank)."""
        if not staged:
            return []
        k = len(staged)
        if host is None:
            mine = _stack_steps(staged, "mine", "vectors")
            if gathered is None:
                gathered = self.reduced_of(staged).unsqueeze(0)
            gathered = gathered.to(mine.device)
            if gathered.size(0) == 1:
                host = torch.cat([gathered[0], gathered[0], mine]).tolist()
            else:
                host = torch.cat([gathered.sum(dim=0), gathered.amax(dim=0), mine]).tolist()
        n = len(staged[0].sums) + len(staged[0].act) + len(staged[0].counts)
        m = (len(host) - 2 * k * n) // k
        sums, maxs, loc = host[:k * n], host[k * n:2 * k * n], host[2 * k * n:]
        return [self._build(st, sums[i * n:(i + 1) * n], maxs[i * n:(i + 1) * n],
                            loc[i * m:(i + 1) * m]) for i, st in enumerate(staged)]

    @staticmethod
    def reduced_of(staged: Sequence["StagedStep"]) -> torch.Tensor:
        """The staged steps' values to reduce over the ranks, one vector."""
        return _stack_steps(staged, "sums", "counts")

    def _build(self, st: "StagedStep", sums, maxs, loc):
        L = len(self.layer_modules)
        D = len(self.domain_names)
        ninf = float("-inf")
        # reduced = [loss_sum, lse_sum, lse_max, attn×L, act_sq×L, loss_tok, lse_n, act_n×L]
        loss_sum, lse_sum, lse_max = sums[0], sums[1], maxs[2]
        attn_g = maxs[3:3 + L]
        act_sq_g = sums[3 + L:3 + 2 * L]
        loss_tok, lse_n = sums[3 + 2 * L], sums[4 + 2 * L]
        act_n_g = sums[5 + 2 * L:5 + 3 * L]
        grad_norm, clipped, loss_bad, logit_bad, grad_bad = loc[:5]
        grad_sq, ratio, pnorm = loc[5:5 + L], loc[5 + L:5 + 2 * L], loc[5 + 2 * L:5 + 3 * L]
        dom = loc[5 + 3 * L:]
        loss = loss_sum / loss_tok if loss_tok > 0 else float("nan")
        nonfinite = int(grad_bad) + int(loss_bad) + int(logit_bad)
        if not math.isfinite(loss) and nonfinite == 0:
            nonfinite = 1
        r = telemetry_pb2.StepReport()
        r.step = st.step
        r.data_position = st.position
        r.loss = loss
        r.grad_norm = grad_norm
        r.clipped = bool(clipped)
        r.lr = st.lr
        r.loss_scale = 1.0
        r.tokens = st.tokens
        r.step_time_s = st.step_time_s
        r.lse_mean = lse_sum / lse_n if lse_n > 0 else 0.0
        r.lse_max = lse_max if lse_n > 0 else 0.0
        r.nonfinite_count = nonfinite
        r.loss_hash = loss_hash(loss)
        for i in range(D):
            ntok = dom[D + i]
            if ntok > 0:
                r.domain_losses.add(domain=self.domain_names[i], loss=dom[i] / ntok,
                                    tokens=int(ntok))
        for li in range(L):
            a = attn_g[li]
            r.layers.add(layer=self.layer_indices[li], max_attn_logit=a if a != ninf else 0.0,
                         grad_norm=math.sqrt(grad_sq[li]), update_ratio=ratio[li],
                         act_rms=math.sqrt(act_sq_g[li] / act_n_g[li]) if act_n_g[li] > 0 else 0.0,
                         param_norm=pnorm[li])
        r.unix_ms = st.unix_ms
        for item in st.documents or ():
            if len(item) > 2 and item[2] is not None:
                r.documents.add(domain=str(item[0]), id=int(item[1]), sample=int(item[2]))
            else:
                r.documents.add(domain=str(item[0]), id=int(item[1]))
        return r

    def _device(self) -> torch.device:
        for p in self._all_params:
            return p.device
        return torch.device("cpu")


def report_json(report, attention_kind: Optional[str] = None) -> dict:
    """A StepReport as a dict (proto field names, every field), with the
    attention measurement's kind when given."""
    from google.protobuf import json_format
    d = json_format.MessageToDict(report, preserving_proto_field_name=True,
                                  including_default_value_fields=True)
    if attention_kind is not None:
        d["max_attn_logit_kind"] = attention_kind
    return d
