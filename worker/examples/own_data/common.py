"""The user's own pieces for the own_data example: a dataset of byte
documents that is not in spikeguard's format, and a small causal transformer
built from torch.nn.TransformerEncoderLayer. Nothing here knows spikeguard.

ByteDocuments(n, seq_len, seed): document i is seq_len + 1 bytes of
lower-case pseudo-words (deterministic in seed and i); item i is (x, y) =
(bytes[:-1], bytes[1:]) as int64. garbage: indices whose bytes are random
high bytes (128..255) instead — the bad rows a data spike comes from.
"""
from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn as nn


class ByteDocuments(torch.utils.data.Dataset):
    def __init__(self, n: int, seq_len: int, seed: int = 0, garbage=()):
        self.n, self.seq_len, self.seed = int(n), int(seq_len), int(seed)
        self.garbage = set(int(i) for i in garbage)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + int(i))
        if int(i) in self.garbage:
            b = torch.randint(128, 256, (self.seq_len + 1,), generator=g)
        else:
            # Words of 2..7 letters from a small alphabet, space-separated.
            letters = torch.randint(0, 12, (self.seq_len + 1,), generator=g) + ord("a")
            spaces = torch.rand(self.seq_len + 1, generator=g) < 0.2
            b = torch.where(spaces, torch.full_like(letters, ord(" ")), letters)
        return b[:-1].long(), b[1:].long()


class TinyLM(nn.Module):
    def __init__(self, layers=4, width=128, heads=4, context=64, seed=1):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(256, width)
        self.pos = nn.Parameter(torch.zeros(context, width))
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True,
                                       norm_first=True) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 256)
        self.register_buffer("mask", torch.triu(torch.full((context, context), float("-inf")), 1))

    def forward(self, x):
        T = x.size(1)
        h = self.embed(x) + self.pos[:T]
        for block in self.blocks:
            h = block(h, src_mask=self.mask[:T, :T])
        return self.head(self.norm(h))


class Timer:
    """The loop's pace after its first `warmup` steps (which pay one-time
    costs): call step() at the top of each step, done() after the loop; it
    prints steps/s and CPU ms/step (all of the process's threads), and with
    EXAMPLE_STEP_TIMES=1 in the environment each step's wall time (for
    benchmarks that look at the steps around a checkpoint)."""

    def __init__(self, warmup: int = 10):
        self.warmup, self.n, self.t0, self.c0 = max(0, int(warmup)), 0, None, None
        self.times = [] if os.environ.get("EXAMPLE_STEP_TIMES") == "1" else None

    def step(self) -> None:
        if self.n == self.warmup:
            self.t0, self.c0 = time.perf_counter(), time.process_time()
        self.n += 1
        if self.times is not None:
            self.times.append(time.perf_counter())

    def done(self, rank: int, step: int) -> None:
        timed = self.n - self.warmup
        rate = timed / (time.perf_counter() - self.t0) if self.t0 is not None else 0.0
        cpu = 1000 * (time.process_time() - self.c0) / timed if self.c0 is not None else 0.0
        if self.times is not None:
            t = self.times + [time.perf_counter()]
            print("step ms: " + " ".join(f"{1000 * (b - a):.2f}" for a, b in zip(t, t[1:])),
                  flush=True)
        print(f"done: rank {rank}, step {step}, {rate:.2f} steps/s, {cpu:.2f} cpu ms/step "
              f"(after the first {self.warmup} steps)", flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=16, help="global batch (samples)")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--documents", type=int, default=8000)
    p.add_argument("--data-seed", type=int, default=0)
    p.add_argument("--garbage", default="", help="dataset indices holding garbage, e.g. 5,17")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--clip", type=float, default=1.0, help="gradient clipping (max global norm)")
    p.add_argument("--checkpoint-dir", default=None,
                   help="where rank 0 saves a checkpoint (model and optimizer) every "
                        "--checkpoint-every steps; none: no checkpoints")
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", default="gloo")
    args = p.parse_args(argv)
    args.garbage = [int(x) for x in args.garbage.split(",") if x]
    return args


def setup(args):
    """torch.distributed from the launcher's environment (RANK, WORLD_SIZE,
    MASTER_ADDR/PORT); one process without it; rank 0 creates --checkpoint-dir.
    Returns (rank, world, device)."""
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if world > 1 or args.backend == "nccl":
        torch.distributed.init_process_group(args.backend)
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    if rank == 0 and args.checkpoint_dir:
        os.makedirs(args.checkpoint_dir, exist_ok=True)
    return rank, world, device
