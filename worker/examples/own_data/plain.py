#!/usr/bin/python3
"""A DDP training loop on the user's own dataset (common.py): plain.py is the
starting point, supervised.py the same loop under spikeguard (a test counts
the lines it adds)."""
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ByteDocuments, TinyLM, parse_args, setup  # noqa: E402

args = parse_args()
rank, world, device = setup(args)
dataset = ByteDocuments(args.documents, args.seq_len, args.data_seed, args.garbage)
model = TinyLM(context=args.seq_len).to(device)
ddp = DDP(model) if world > 1 else model
opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
sampler = DistributedSampler(dataset, world, rank, seed=args.data_seed) if world > 1 else None
loader = DataLoader(dataset, batch_size=args.batch_size // world, sampler=sampler, drop_last=True)
step, epoch, t0, c0 = 0, 0, time.perf_counter(), time.process_time()
while step < args.steps:
    if sampler is not None:
        sampler.set_epoch(epoch)
    epoch += 1
    for x, y in loader:
        if step >= args.steps:
            break
        x, y = x.to(device), y.to(device)
        logits = ddp(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
print(f"done: rank {rank}, step {step}, {step / (time.perf_counter() - t0):.2f} steps/s, "
      f"{1000 * (time.process_time() - c0) / max(1, step):.2f} cpu ms/step", flush=True)
