#!/usr/bin/python3
"""spikeguard's fixed cost per step, measured where the model costs next to
nothing (run by bench_torch_overhead.py, one process): the own_data
example's model (common.TinyLM: the same layers, parameters and hooks) at a
negligible size (width 8, 4 tokens, 2 samples), its plain loop against its
supervised loop on two copies, alternating in blocks of --block-steps
(plain first in even pairs). What a step under the Supervisor costs beyond
the model's arithmetic (the calls per step, the looks for commands, the
reports and, with SPIKEGUARD_ADDR set, the client and the daemon's answers)
then stands out of a 3-4 ms step instead of drowning in the noise of a
60 ms one: per pair, the difference of the blocks' training-thread CPU and
wall time per step. No checkpoints: their cost grows with the model and is
in the example-size figures.

Prints one JSON line: plain and supervised ms/step (thread CPU and wall,
medians over the pairs) and the medians and quartiles of the per-pair
differences.
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "worker" / "examples" / "own_data"))
from common import ByteDocuments, TinyLM  # noqa: E402
from spikeguard.supervise import Supervisor  # noqa: E402

WIDTH, SEQ, BATCH = 8, 4, 2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=30)
    ap.add_argument("--block-steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=40)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dataset = ByteDocuments(8000, SEQ, 0)

    def model_and_optimizer():
        m = TinyLM(width=WIDTH, heads=2, context=SEQ)
        return m, torch.optim.AdamW(m.parameters(), lr=1e-3)

    model_p, opt_p = model_and_optimizer()
    model_s, opt_s = model_and_optimizer()
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, drop_last=True)

    def batches():
        while True:
            yield from loader

    plain_batches = batches()

    def plain(n):
        for _ in range(n):
            x, y = next(plain_batches)
            loss = F.cross_entropy(model_p(x).flatten(0, 1), y.flatten())
            opt_p.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model_p.parameters(), 1.0)
            opt_p.step()

    total = args.warmup + args.pairs * args.block_steps
    sg = Supervisor(model_s, opt_s, dataset, global_batch_size=BATCH, steps=total, seed=0,
                    clip_norm=1.0)
    steps = sg.steps()

    def supervised(n):
        for _ in range(n):
            _, (x, y) = next(steps)
            loss = sg.cross_entropy(model_s(x), y)
            opt_s.zero_grad()
            loss.backward()
            opt_s.step()

    plain(args.warmup)
    supervised(args.warmup)
    cpu = {"plain": [], "supervised": []}
    wall = {"plain": [], "supervised": []}
    for i in range(args.pairs):
        for which in (("plain", "supervised") if i % 2 == 0 else ("supervised", "plain")):
            c, w = time.thread_time(), time.perf_counter()
            (plain if which == "plain" else supervised)(args.block_steps)
            cpu[which].append(1000.0 * (time.thread_time() - c) / args.block_steps)
            wall[which].append(1000.0 * (time.perf_counter() - w) / args.block_steps)
    for _ in steps:  # the schedule's end: its last reports, GenerationEnded
        pass
    sg.close()

    def diffs(d):
        return [s - p for p, s in zip(d["plain"], d["supervised"])]

    out = {"pairs": args.pairs, "block_steps": args.block_steps,
           "daemon": bool(os.environ.get("SPIKEGUARD_ADDR")),
           "model": {"width": WIDTH, "seq_len": SEQ, "batch": BATCH}}
    for name, d in (("thread_cpu", cpu), ("wall", wall)):
        dd = diffs(d)
        out[name] = {"plain_ms_per_step": statistics.median(d["plain"]),
                     "supervised_ms_per_step": statistics.median(d["supervised"]),
                     "extra_ms_per_step": statistics.median(dd),
                     "extra_ms_per_step_quartiles": statistics.quantiles(dd, n=4)}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
