#!/usr/bin/python3
"""One rank of the interleaved overhead measurement (run by
bench_torch_overhead.py on 2 gloo ranks): the own_data example's plain loop
and its supervised loop (worker/examples/own_data/plain.py, supervised.py:
the same model, data, optimizer and clipping) in one process, on two
copies of the model, alternating in blocks of --block-steps steps: plain,
supervised, supervised, plain, ... (ABBA), so the drift of a shared
machine's pace cancels within each pair of blocks. Both save a checkpoint
every 50 steps: the plain loop as plain.py does (rank 0, torch.save of the
model and optimizer state into --checkpoint-dir, on the training thread),
the Supervisor its own (into SPIKEGUARD_CHECKPOINT_DIR).

What the supervised blocks carry, so that none of their work lands in a
plain block: each ends with its pending reports sent (the all-gather the
Supervisor makes before a checkpoint) and handed to the client, which waits
for the daemon to take them, and with the checkpoint written in the
background finished. Both cost the supervised blocks more than a
continuous run pays (it overlaps them with training), so the figure leans
against spikeguard, not for it. The checkpoints fall inside the blocks
(every 50 steps, blocks of 25 after a 10-step warm-up).

Prints one JSON line: per block pair the plain and supervised seconds per
step (this rank's clock; the ranks step together through DDP), what the
plain block's clip_grad_norm_ and checkpoint saves took of it and the
supervised block's settling at its end, and the
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
    # What the plain loop's clip_grad_norm_ and checkpoint saves take, per
    # block (the Supervisor's gradient norms and checkpoints replace them).
    clip_s, save_s, done = [0.0], [0.0], [0]
    settle_s = [0.0]  # the supervised blocks' settling at their end

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
            done[0] += 1
            if rank == 0 and args.checkpoint_dir and done[0] % args.checkpoint_every == 0:
                t = time.perf_counter()
                torch.save({"step": done[0], "model": model_p.state_dict(),
                            "optimizer": opt_p.state_dict()},
                           os.path.join(args.checkpoint_dir, f"step{done[0]}.pt"))
                save_s[0] += time.perf_counter() - t

    # supervised.py's loop, on its own copy of the model.
    model_s = TinyLM(context=args.seq_len).to(device)
    ddp_s = DDP(model_s) if world > 1 else model_s
    opt_s = torch.optim.AdamW(model_s.parameters(), lr=args.lr)
    sg = Supervisor(ddp_s, opt_s, dataset, global_batch_size=args.batch_size, steps=total,
                    seed=args.data_seed, checkpoint_every=args.checkpoint_every,
                    clip_norm=args.clip)
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
        t = time.perf_counter()
        sg._flush_reports()
        if sg.client is not None:
            sg.client.flush(timeout=60.0)
        sg.wait_checkpoints()
        settle_s[0] += time.perf_counter() - t

    plain(WARMUP)
    supervised(WARMUP)
    clock = time.perf_counter
    pairs = []
    for i in range(mine.pairs):
        spent = {}
        for which in (("plain", "supervised") if i % 2 == 0 else ("supervised", "plain")):
            t, clipped, saved, settled = clock(), clip_s[0], save_s[0], settle_s[0]
            c0, p0 = time.thread_time(), time.process_time()
            plain(mine.block_steps) if which == "plain" else supervised(mine.block_steps)
            spent[which] = (clock() - t) / mine.block_steps
            spent[which + "_thread_cpu"] = (time.thread_time() - c0) / mine.block_steps
            spent[which + "_process_cpu"] = (time.process_time() - p0) / mine.block_steps
            if which == "supervised":
                spent["supervised_settle"] = (settle_s[0] - settled) / mine.block_steps
            else:
                spent["plain_clip"] = (clip_s[0] - clipped) / mine.block_steps
                spent["plain_checkpoint"] = (save_s[0] - saved) / mine.block_steps
        pairs.append(spent)
    for _ in steps:  # the schedule's end: its last flush and GenerationEnded
        pass
    timings = sg.timings()
    sg.close()
    n = WARMUP + mine.pairs * mine.block_steps
    print(json.dumps({"rank": rank, "pairs": pairs, "timings": timings,
                      "plain_clip_ms_per_step": 1000.0 * clip_s[0] / n,
                      "plain_checkpoint_ms_per_step": 1000.0 * save_s[0] / n}), flush=True)


if __name__ == "__main__":
    main()
