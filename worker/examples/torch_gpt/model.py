"""A small byte-level GPT in PyTorch for spikeguard's examples and tests.

The same shape as the C++ reference model (kernels/config.h): vocabulary 256,
learned positions, pre-LN blocks, GELU MLP, fp32. Attention is computed
explicitly (q·k/√d, causal mask, softmax, ·v) so the exact max attention
logit of every layer is available to telemetry; nothing here is fused or
nondeterministic, so under torch.use_deterministic_algorithms(True) a replay
on the same CPU is bit-exact.

    cfg = GPTConfig(qk_norm=False)
    model = GPT(cfg)
    logits = model(tokens[:, :-1])             # [B, T, 256]
    # telemetry: spikeguard.torch.Telemetry(model) finds model.blocks and
    # wires each block.attn.score_observer to record the max logit.
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclasses.dataclass
class GPTConfig:
    vocab: int = 256
    layers: int = 4
    heads: int = 4
    width: int = 128
    context: int = 64
    qk_norm: bool = False      # layernorm on q and k of each head
    z_loss: float = 0.0        # adds z_loss·(log Σ e^z)² per token to the objective
    init_std: float = 0.02     # residual projections get init_std/√(2·layers)
    seed: int = 1              # parameter initialization

    def fingerprint(self) -> str:
        """A stable description of every field, sent in Hello."""
        return (f"torchgpt:v{self.vocab}:l{self.layers}:h{self.heads}:w{self.width}:"
                f"c{self.context}:qk{int(self.qk_norm)}:z{self.z_loss:g}:"
                f"init{self.init_std:g}:seed{self.seed}")


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if cfg.width % cfg.heads:
            raise ValueError(f"width {cfg.width} is not a multiple of heads {cfg.heads}")
        self.heads = cfg.heads
        self.head_dim = cfg.width // cfg.heads
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width)
        self.proj = nn.Linear(cfg.width, cfg.width)
        self.q_norm = nn.LayerNorm(self.head_dim) if cfg.qk_norm else None
        self.k_norm = nn.LayerNorm(self.head_dim) if cfg.qk_norm else None
        # A plain attribute, not a buffer: DDP broadcasts buffers at start and
        # gloo has no bool type.
        self.mask = torch.ones(cfg.context, cfg.context, dtype=torch.bool).tril()
        # Set by spikeguard.torch.Telemetry: called with the scaled, masked
        # pre-softmax scores [B, H, T, T] (masked entries are -inf).
        self.score_observer = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.heads, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.heads, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:
            q = self.q_norm(q)
            k = self.k_norm(k)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        scores = scores.masked_fill(~self.mask[:T, :T], float("-inf"))
        if self.score_observer is not None:
            self.score_observer(scores)
        att = torch.softmax(scores, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.width, 4 * cfg.width)
        self.proj = nn.Linear(4 * cfg.width, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.width)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.width)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab, cfg.width)
        self.wpe = nn.Embedding(cfg.context, cfg.width)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.width)
        self.head = nn.Linear(cfg.width, cfg.vocab, bias=False)
        self._init(cfg)

    @torch.no_grad()
    def _init(self, cfg: GPTConfig) -> None:
        g = torch.Generator().manual_seed(cfg.seed)
        resid_std = cfg.init_std / math.sqrt(2 * cfg.layers)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif p.dim() == 1:  # layernorm gains
                p.fill_(1.0)
            else:
                std = resid_std if name.endswith("proj.weight") else cfg.init_std
                p.copy_(torch.randn(p.shape, generator=g) * std)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        if T > self.cfg.context:
            raise ValueError(f"sequence of {T} tokens is longer than the context {self.cfg.context}")
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def token_losses(logits: torch.Tensor, targets: torch.Tensor, z_loss: float = 0.0):
    """Per-token cross-entropy [B, T] and the per-token objective (with z-loss)."""
    flat = logits.reshape(-1, logits.size(-1))
    ce = F.cross_entropy(flat, targets.reshape(-1), reduction="none").view(targets.shape)
    if z_loss > 0:
        lse = torch.logsumexp(flat, dim=-1).view(targets.shape)
        return ce, ce + z_loss * lse.square()
    return ce, ce
