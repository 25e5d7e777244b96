#!/usr/bin/python3
"""One rank of the interleaved overhead measurement (run by
bench_torch_overhead.py on 2 gloo ranks): the own_data example's plain loop
and its supervised loop (worker/examples/own_data/plain.py, supervised.py:
the same model, data, optimizer and clipping) in one process, on two
copies of the model, alternating in blocks of --block-steps steps: plain,
supervised, supervised, plain, ... (ABBA), so the drift of a shared
machine's pace cancels within each pair of blocks.

What the supervised blocks carry, so that none of their work lands in a
plain block: each ends with its pending reports sent (the all-gather the
Supervisor makes before a checkpoint) and handed to the client, which waits
for the daemon to take them, and with the checkpoint written in the
background finished. Both cost the supervised blocks more than a
continuous run pays (it overlaps them with training), so the figure leans
against spikeguard, not for it. The checkpoints fall inside the blocks
(every 50 steps, blocks of 25 after a 10-step warm-up).

Prints one JSON line: per block pair the plain and supervised seconds per
step (this rank's clock; the ranks step together through DDP), and the
supervised rank's Supervisor.timings().
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "worker" / "examples" / "own_data"))
from common import ByteDocuments, TinyLM, parse_args, setup  # noqa: E402
from spikeguard.supervise import Supervisor  # noqa: E402

WARMUP = 10


def main():
    extra = argparse.ArgumentParser()
    extra.add_argument("--pairs", type=int, default=20)
    extra.add_argument("--block-steps", type=int, default=25)
    mine, rest = extra.parse_known_args()
    args = parse_args(rest)
    rank, world, device = setup(args)
    dataset = ByteDocuments(args.documents, args.seq_len, args.data_seed, args.garbage)
    total = WARMUP + mine.pairs * mine.block_steps  # the supervised loop's steps

    # plain.py's loop, as an iterator of steps.
    model_p = TinyLM(context=args.seq_len).to(device)
    ddp_p = DDP(model_p) if world > 1 else model_p
    opt_p = torch.optim.AdamW(model_p.parameters(), lr=args.lr)
    sampler = DistributedSampler(dataset, world, rank, seed=args.data_seed) if world > 1 else None
    loader = DataLoader(dataset, batch_size=args.batch_size // world, sampler=sampler,
                        drop_last=True)

    def plain_batches():
        epoch = 0
        while True:
            if sampler is not None:
                sampler.set_epoch(epoch)
            epoch += 1
            yield from loader

    batches = plain_batches()
    clip_s = [0.0]  # what the plain loop's clip_grad_norm_ takes (the Supervisor's replaces it)

    def plain(n):
        for _ in range(n):
            x, y = next(batches)
            x, y = x.to(device), y.to(device)
            logits = ddp_p(x)
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
            opt_p.zero_grad()
            loss.backward()
            t = time.perf_counter()
            torch.nn.utils.clip_grad_norm_(model_p.parameters(), args.clip)
            clip_s[0] += time.perf_counter() - t
            opt_p.step()

    # supervised.py's loop, on its own copy of the model.
    model_s = TinyLM(context=args.seq_len).to(device)
    ddp_s = DDP(model_s) if world > 1 else model_s
    opt_s = torch.optim.AdamW(model_s.parameters(), lr=args.lr)
    sg = Supervisor(ddp_s, opt_s, dataset, global_batch_size=args.batch_size, steps=total,
                    seed=args.data_seed, checkpoint_every=50, clip_norm=args.clip)
    steps = sg.steps()

    def supervised(n):
        for _ in range(n):
            _, (x, y) = next(steps)
            x, y = x.to(device), y.to(device)
            logits = ddp_s(x)
            loss = sg.cross_entropy(logits, y)
            opt_s.zero_grad()
            loss.backward()
            opt_s.step()
        sg._flush_reports()
        if sg.client is not None:
            sg.client.flush(timeout=60.0)
        sg.wait_checkpoints()

    plain(WARMUP)
    supervised(WARMUP)
    clock = time.perf_counter
    pairs = []
    for i in range(mine.pairs):
        spent = {}
        for which in (("plain", "supervised") if i % 2 == 0 else ("supervised", "plain")):
            t = clock()
            plain(mine.block_steps) if which == "plain" else supervised(mine.block_steps)
            spent[which] = (clock() - t) / mine.block_steps
        pairs.append(spent)
    for _ in steps:  # the schedule's end: its last flush and GenerationEnded
        pass
    timings = sg.timings()
    sg.close()
    plain_clip_ms = 1000.0 * clip_s[0] / (WARMUP + mine.pairs * mine.block_steps)
    print(json.dumps({"rank": rank, "pairs": pairs, "timings": timings,
                      "plain_clip_ms_per_step": plain_clip_ms}), flush=True)


if __name__ == "__main__":
    main()
